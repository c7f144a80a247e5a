"""Hypothesis: no server frame breaks the client, no client frame breaks the server."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.engine import SendText
from bridge.providers.base import AudioFormat
from bridge.providers.kova.server import PATHS, KovaServerSession
from bridge.providers.server_base import ServerOptions

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
SERVER_KEYS = [
    "context_started",
    "audio_chunk",
    "timestamps",
    "flush_completed",
    "context_closed",
    "error",
]
CLIENT_KEYS = ["start_context", "send_text", "flush", "close_context"]
CONTEXT_IDS = st.sampled_from(["c1", "c2", "zz"]) | VALUES


def frames_from(keys: list[str]) -> st.SearchStrategy[str]:
    frame = st.fixed_dictionaries(
        {},
        optional={
            **{k: VALUES for k in keys},
            "context_id": CONTEXT_IDS,
            "flush_id": st.sampled_from(["f1", "f2"]) | VALUES,
        },
    )
    raw = st.text(max_size=40)
    return frame.map(json.dumps) | raw


# ``kova`` is a stateless bag of helpers, so sharing it between examples is safe.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(frames_from(SERVER_KEYS), max_size=12))
def test_client_survives_any_server_frames(kova: Any, texts: list[str]) -> None:
    engine = kova.make_client()
    engine.connection_made(None, 0.0)
    engine.open_turn("t1", kova.turn(AudioFormat("pcm_s16le", 16000)), 0.0)
    engine.send_text("t1", "Hello. ", 0.0)
    engine.end_turn("t1", 0.0)
    for n, text in enumerate(texts):
        engine.receive_text(text, 0.1 * n)
        deadline = engine.next_deadline()
        if deadline is not None:
            engine.handle_timer(deadline)
    engine.actions_to_send()
    events = engine.events_received()
    assert kova.API_KEY not in repr(events)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames_from(CLIENT_KEYS), max_size=12))
def test_server_survives_any_client_frames(texts: list[str]) -> None:
    session = KovaServerSession(ServerOptions(voices=frozenset({"cal"})))
    session.connection_made(PATHS[0], {}, {}, 0.0)
    session.receive_text(
        json.dumps({"start_context": {"voice_id": "cal", "model_id": "m"}, "context_id": "c1"}), 0.0
    )
    for text in texts:
        session.receive_text(text, 0.0)
    for action in session.actions_to_send():
        if isinstance(action, SendText):
            assert isinstance(json.loads(action.text), dict)

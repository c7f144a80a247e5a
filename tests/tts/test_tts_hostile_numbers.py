"""Provider frames with hostile numbers never raise out of a client engine (issue 33).

Every inbound JSON frame of every recorded session, with each of its numbers
(and digit strings) replaced by a value a parser trips on: an integer too
large for a double (``float()`` raises ``OverflowError``), Unicode digits
(``"²"`` passes ``str.isdigit``, ``int("²")`` raises), negatives, 2**63. The
frame is fed to a client with a live turn; nothing may raise. The first run
found three (``OverflowError``): KugelAudio's ``sr`` and word times, Kletso's
numbers (``_opt_num``); the test fails for those two protocols without the fix.
The server sessions (``callbridge tts-server``) get the same treatment with
the client frames of the same sessions: Kletso's ``voice.played`` position
and KugelAudio's clamped numbers raised before.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.providers.base import AudioFormat, ProviderSettings, TurnSettings
from bridge.providers.server_base import ServerOptions

HERE = Path(__file__).parent
PROTOCOLS = ["coda", "kletso", "kova", "kugelaudio", "zwst"]
HOSTILE: list[object] = [10**400, -(10**400), 2**63, -1, 1e308, "²", "1²", "٣", "\u0660"]
CODA_READY = {"ready": {"protocol": 1, "languages": ["en"], "defaultLanguage": "en"}}


def replaced(obj: object, value: object) -> tuple[object, int]:
    """``obj`` with every number (and all-digit string) replaced by ``value``; how many."""
    if isinstance(obj, bool):
        return obj, 0
    if isinstance(obj, int | float):
        return value, 1
    if isinstance(obj, str) and obj.isascii() and obj.isdigit():
        return (value if isinstance(value, str) else obj), int(isinstance(value, str))
    if isinstance(obj, dict):
        pairs = [(k, replaced(v, value)) for k, v in obj.items()]
        return {k: v for k, (v, _) in pairs}, sum(n for _, (_, n) in pairs)
    if isinstance(obj, list):
        items = [replaced(v, value) for v in obj]
        return [v for v, _ in items], sum(n for _, n in items)
    return obj, 0


def inbound_frames(protocol: str, direction: str = "in") -> list[dict[str, Any]]:
    frames = []
    for path in sorted((HERE / protocol / "fixtures").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            msg = entry.get("msg")
            inbound = entry.get("dir") == direction and isinstance(msg, dict)
            if inbound and not {"b64", "raw", "close"} & set(msg):
                frames.append(msg)
    return frames


def client_with_a_live_turn(protocol: str) -> Any:
    engine = importlib.import_module(f"bridge.providers.{protocol}.client").ENGINE(
        ProviderSettings(
            name="p", protocol=protocol, url="wss://p.example/v1/stream", api_key="k", voice="v"
        )
    )
    if engine.session_request() is not None:
        engine.session_response(200, b'{"url": "wss://p.example/v1/stream?t=1"}', 0.0)
    engine.connection_made("rime.v1.json" if protocol == "coda" else None, 0.0)
    if protocol == "coda":
        engine.receive_text(json.dumps(CODA_READY), 0.0)
    fmt = AudioFormat("pcm_s16le", 16000)
    engine.open_turn("t1", TurnSettings(voice="v", audio_format=fmt, model="m"), 0.0)
    engine.send_text("t1", "Hello there. ", 0.0)
    engine.end_turn("t1", 0.0)
    return engine


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hostile_numbers_in_any_recorded_frame_never_raise(protocol: str) -> None:
    frames = inbound_frames(protocol)
    assert frames, protocol
    mutated = 0
    for frame in frames:
        for value in HOSTILE:
            hostile, n = replaced(frame, value)
            if n == 0:
                continue
            mutated += 1
            engine = client_with_a_live_turn(protocol)
            engine.receive_text(json.dumps(hostile), 1.0)
            engine.handle_timer(100.0)
            engine.actions_to_send()
            engine.events_received()
    assert mutated > 0


def server_session(protocol: str, opening: list[dict[str, Any]]) -> Any:
    module = importlib.import_module(f"bridge.providers.{protocol}.server")
    session = module.SESSION(ServerOptions(voices=frozenset({"v", "cal", "lyra"})))
    query = {"voice_id": "v", "format": "pcm_s16le", "sample_rate": "16000"}
    session.connection_made(
        module.PATHS[0], query if protocol == "zwst" else {}, {"authorization": "Bearer k"}, 0.0
    )
    for frame in opening:
        session.receive_text(json.dumps(frame), 0.0)
    return session


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hostile_numbers_in_any_client_frame_never_raise_out_of_the_server(protocol: str) -> None:
    frames = inbound_frames(protocol, "out")  # what clients sent, in the recorded sessions
    assert frames, protocol
    mutated = 0
    for frame in frames:
        for value in HOSTILE:
            hostile, n = replaced(frame, value)
            if n == 0:
                continue
            mutated += 1
            session = server_session(protocol, frames[:3])
            session.receive_text(json.dumps(hostile), 1.0)
            session.actions_to_send()
    assert mutated > 0

"""Kova's receive path: the same outcome for a frame however it is spaced, odd
base64 decided by the standard library, and the kept earliest deadline.

The reference server (and Kova) send ``{"audio_chunk":"<base64>","context_id":"c1"}``
with no whitespace. Every frame here is fed twice, to two engines in the same
state: once compact and once with whitespace; events, actions and the next
deadline must be the same (the audio's base64 goes through ``b64decode_fast``
when strictly valid, the standard library otherwise).
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import Action, Event
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    ProviderSettings,
    TurnSettings,
)
from bridge.providers.kova.client import KovaProtocol

PCM_24K = AudioFormat("pcm_s16le", 24000)


def compact(frame: dict[str, object]) -> str:
    return json.dumps(frame, separators=(",", ":"))


def spaced(frame: dict[str, object]) -> str:
    return json.dumps(frame, separators=(", ", ": "))


def streaming(kova: Any, fmt: AudioFormat, turns: int = 1) -> KovaProtocol:
    """An engine with ``turns`` started, flushed contexts (``c1``... for ``t1``...)."""
    engine: KovaProtocol = kova.make_client()
    engine.connection_made(None, 0.0)
    for i in range(1, turns + 1):
        engine.open_turn(f"t{i}", kova.turn(fmt), 0.0)
        engine.receive_text(compact({"context_started": {}, "context_id": f"c{i}"}), 0.01)
        engine.end_turn(f"t{i}", 0.02)
    engine.actions_to_send()
    engine.events_received()
    return engine


def outcome(engine: KovaProtocol) -> tuple[list[Action], list[Event], float | None]:
    return engine.actions_to_send(), engine.events_received(), engine.next_deadline()


def both(kova: Any, fmt: AudioFormat, frames: list[tuple[float, dict[str, object] | str]]) -> None:
    """Feed ``frames`` compact to one engine and spaced to another; compare after each."""
    fast, full = streaming(kova, fmt), streaming(kova, fmt)
    for now, frame in frames:
        if isinstance(frame, str):  # raw text: the same to both
            fast.receive_text(frame, now)
            full.receive_text(frame, now)
        else:
            fast.receive_text(compact(frame), now)
            full.receive_text(spaced(frame), now)
        assert outcome(fast) == outcome(full), frame


def audio(data: bytes, context_id: str = "c1") -> dict[str, object]:
    return {"audio_chunk": base64.b64encode(data).decode(), "context_id": context_id}


AUDIO_FRAME_CASES = [
    pytest.param([(1.0, audio(b"\xff\x00\x7f"))], id="mulaw"),
    pytest.param([(1.0, audio(b""))], id="empty"),
    pytest.param([(1.0, audio(b"\x01\x02\x03", "c9"))], id="unknown-context"),
    pytest.param([(1.0, {"audio_chunk": "AAA", "context_id": "c1"})], id="bad-padding"),
    pytest.param([(1.0, {"audio_chunk": "AA=A", "context_id": "c1"})], id="bad-base64"),
    pytest.param([(1.0, {"audio_chunk": "AAé=", "context_id": "c1"})], id="non-ascii"),
    pytest.param([(1.0, {"audio_chunk": 5, "context_id": "c1"})], id="not-a-string"),
    pytest.param([(1.0, {"context_id": "c1", "audio_chunk": "AAAA"})], id="keys-swapped"),
    pytest.param([(1.0, '{"audio_chunk":"AA\\/A","context_id":"c1"}')], id="escape"),
    pytest.param([(1.0, '{"audio_chunk":"AAAA","context_id":"c\\u0031"}')], id="escaped-id"),
    pytest.param([(1.0, '{"audio_chunk":"AAAA","context_id":"c1"')], id="truncated"),
    pytest.param([(1.0, '{"audio_chunk":"AAAA","context_id":"c1"}x')], id="trailing"),
    pytest.param([(1.0, '{"audio_chunk":"AAAA","context_id":"}')], id="no-id"),
    pytest.param([(1.0, '{"audio_chunk":"AAAA"}')], id="no-context"),
]


@pytest.mark.parametrize("frames", AUDIO_FRAME_CASES)
def test_compact_and_spaced_frames_give_the_same_outcome(
    kova: Any, frames: list[tuple[float, dict[str, object] | str]]
) -> None:
    both(kova, MULAW_8K, frames)


def test_pcm_chunks_cut_on_whole_samples_either_way(kova: Any) -> None:
    chunks = [b"\x01", b"\x02\x03\x04", b"\x05\x06", b"\x07", b"", b"\x08\x09\x0a"]
    both(kova, PCM_24K, [(1.0 + i, audio(c)) for i, c in enumerate(chunks)])


def test_audio_after_cancel_or_before_start_either_way(kova: Any) -> None:
    for engine_pair in range(2):
        fast: KovaProtocol = kova.make_client()
        full: KovaProtocol = kova.make_client()
        for engine in (fast, full):
            engine.connection_made(None, 0.0)
            engine.open_turn("t1", kova.turn(MULAW_8K), 0.0)
            if engine_pair:  # started, then cancelled: late audio is dropped
                engine.receive_text(compact({"context_started": {}, "context_id": "c1"}), 0.1)
                engine.cancel("t1", 0.2)
            engine.actions_to_send()
            engine.events_received()
        fast.receive_text(compact(audio(b"\x01")), 0.3)
        full.receive_text(spaced(audio(b"\x01")), 0.3)
        assert outcome(fast) == outcome(full)


def brute_force_deadline(engine: KovaProtocol) -> float | None:
    contexts = engine._contexts.values()  # the test checks the kept value
    return min((c.deadline_at for c in contexts if c.deadline_at is not None), default=None)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_the_kept_earliest_deadline_is_the_earliest(seed: int) -> None:
    """Random interleavings of opens, starts, audio, flushes, cancels, closes and timers."""
    rng = random.Random(seed)
    options = (("start_timeout_s", 3.0), ("reply_timeout_s", 2.0), ("close_timeout_s", 1.0))
    engine = KovaProtocol(ProviderSettings("k", "kova", "wss://kova.example", options=options))
    engine.connection_made(None, 0.0)
    now, serial = 0.0, 0
    for _ in range(60):
        now += rng.choice([0.0, 0.1, 0.5, 1.5])
        step = rng.randrange(7)
        cid = f"c{rng.randint(1, max(1, serial))}"
        turn = f"t{rng.randint(1, max(1, serial))}"
        if step == 0 and engine.open_turns() < 6:
            serial += 1
            engine.open_turn(f"t{serial}", TurnSettings("cal", MULAW_8K), now)
        elif step == 1:
            engine.receive_text(compact({"context_started": {}, "context_id": cid}), now)
        elif step == 2:
            engine.receive_text(compact(audio(b"\x01\x02", cid)), now)
        elif step == 3:
            engine.end_turn(turn, now)
        elif step == 4:
            engine.cancel(turn, now)
        elif step == 5:
            engine.receive_text(compact({"context_closed": True, "context_id": cid}), now)
        else:
            deadline = engine.next_deadline()
            if deadline is not None and deadline <= now:
                engine.handle_timer(now)
        engine.actions_to_send()
        engine.events_received()
        assert engine.next_deadline() == brute_force_deadline(engine)


def test_a_long_burst_on_one_context_keeps_the_deadline_heap_bounded(kova: Any) -> None:
    """One context streams thousands of frames while another waits: the heap of
    deadlines is rebuilt from the live ones instead of growing with every frame."""
    engine = streaming(kova, MULAW_8K, turns=2)  # both flushed at 0.02
    first = engine.next_deadline()
    for i in range(5000):
        engine.receive_text(compact(audio(b"\x01", "c2")), 1.0 + i * 0.001)
        assert engine.next_deadline() == first  # c1's reply timeout is still the earliest
    assert len(engine._deadlines) <= 4 * 2 + 64 + 1
    engine.receive_text(compact({"context_closed": True, "context_id": "c1"}), 6.5)
    assert engine.next_deadline() == brute_force_deadline(engine) == 1.0 + 4999 * 0.001 + 10.0


def test_a_reply_deadline_pushed_later_by_every_frame_adds_no_heap_entry(kova: Any) -> None:
    """The flushed context's entry stays where it is until it reaches the top."""
    engine = streaming(kova, MULAW_8K)
    size = len(engine._deadlines)
    for i in range(200):
        engine.receive_text(compact(audio(b"\x01")), 1.0 + i * 0.01)
        engine.events_received()
    assert len(engine._deadlines) == size
    assert engine.next_deadline() == 1.0 + 199 * 0.01 + 10.0
    assert len(engine._deadlines) == size  # the entry moved, none added

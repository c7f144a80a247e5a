"""The Exotel engine: recorded session and the outbound chunk rules."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bridge.engine import SendText
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.exotel import ExotelStreamProtocol

FRAME = bytes([0x10, 0x00]) * 160  # 320 B: 20 ms at 8 kHz


def test_call_with_chunking_mark_and_clear(kit: Any) -> None:
    engine = ExotelStreamProtocol()

    def speak(e: ExotelStreamProtocol, now: float) -> None:
        for _ in range(12):
            e.send_frame(FRAME, now)
        e.mark("e1", now)

    def then_cut(e: ExotelStreamProtocol, now: float) -> None:
        for _ in range(3):
            e.send_frame(FRAME, now)
        assert e.unsent_bytes == 960
        e.clear(now)
        assert e.unsent_bytes == 0

    events = kit.replay(engine, "exotel_call.jsonl", [(0.2, speak), (0.3, then_cut)])
    (started,) = kit.of_type(events, StreamStarted)
    assert (started.codec, started.sample_rate_hz, started.route) == ("pcm_s16le", 8000, "hindi")
    assert started.custom_parameters == {"route": "hindi", "token": "t-1"}
    assert len(kit.of_type(events, AudioReceived)) == 1
    assert kit.of_type(events, DtmfReceived) == [DtmfReceived("9", 240)]
    # e1 was pending when clear went out, so its echo counts as cleared
    assert kit.of_type(events, MarkPlayed) == [MarkPlayed("e1", True, 400)]
    assert engine.sent_ms == 400  # two 3200 B chunks (the second padded); the cut frames never left
    assert kit.of_type(events, StreamStopped) == [StreamStopped("stop")]


def _start(engine: ExotelStreamProtocol, rate_hz: int) -> None:
    start = {
        "stream_sid": "S",
        "call_sid": "C",
        "account_sid": "A",
        "media_format": {"encoding": "audio/x-raw", "sample_rate": str(rate_hz), "bit_rate": "16"},
    }
    engine.receive_text(json.dumps({"event": "start", "sequence_number": "1", "start": start}), 0.0)
    engine.events_received()


@pytest.mark.parametrize(
    ("rate_hz", "chunk_bytes"), [(8000, 3200), (16000, 3200), (16000, 6400), (24000, 9600)]
)
def test_every_chunk_obeys_exotel_rules(rate_hz: int, chunk_bytes: int) -> None:
    engine = ExotelStreamProtocol(chunk_bytes=chunk_bytes)
    _start(engine, rate_hz)
    frame = bytes(engine.frame_bytes)
    for i in range(97):
        engine.send_frame(frame, i * 0.02)
        if i % 41 == 40:
            engine.mark(f"m{i}", i * 0.02)
    engine.flush(2.0)
    sizes = []
    for action in engine.actions_to_send():
        assert isinstance(action, SendText)
        msg = json.loads(action.text)
        if msg["event"] == "media":
            sizes.append(len(base64.b64decode(msg["media"]["payload"])))
    assert sizes and all(s % 320 == 0 and 3200 <= s <= 100_000 for s in sizes)
    assert sum(sizes) >= 97 * engine.frame_bytes


@pytest.mark.parametrize("chunk_bytes", [0, 3000, 3520 + 1, 100_160])
def test_bad_chunk_size_is_refused(chunk_bytes: int) -> None:
    with pytest.raises(ValueError):
        ExotelStreamProtocol(chunk_bytes=chunk_bytes)

"""The Vonage engine: binary L16 frames, notify marks, clear (fixtures/vonage_call.jsonl)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.engine import CloseConnection, LocalProtocolError
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    ProtocolViolation,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.vonage import VonageStreamProtocol

FRAME = bytes([0x01, 0x00]) * 320  # 640 B: 20 ms at 16 kHz


def test_call_with_binary_audio_notify_and_clear(kit: Any) -> None:
    engine = VonageStreamProtocol()

    speak = kit.speak(FRAME, "v1", "v2")

    events = kit.replay(
        engine, "vonage_call.jsonl", [(0.06, speak), (0.11, lambda e, now: e.clear(now))]
    )
    (started,) = kit.of_type(events, StreamStarted)
    assert (started.codec, started.sample_rate_hz, started.route) == ("pcm_s16le", 16000, "english")
    assert started.call_id == "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"
    assert started.custom_parameters["tier"] == "3"  # non-string headers kept as JSON text
    audio = kit.of_type(events, AudioReceived)
    assert [(a.payload, a.sequence) for a in audio] == [(FRAME, 1), (FRAME, 2)]
    assert kit.of_type(events, DtmfReceived) == [DtmfReceived("3", 260)]
    assert kit.of_type(events, MarkPlayed) == [
        MarkPlayed("v1", False, 20),
        MarkPlayed("v2", True, 40),
    ]
    assert kit.of_type(events, StreamStopped) == [StreamStopped("connection_lost")]


def test_frames_must_be_exactly_one_20ms_frame() -> None:
    engine = VonageStreamProtocol()
    engine.receive_text('{"event":"websocket:connected","content-type":"audio/l16;rate=8000"}', 0.0)
    assert engine.frame_bytes == 320
    with pytest.raises(LocalProtocolError):
        engine.send_frame(bytes(640), 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_dtmf("1", 0.0)


@pytest.mark.parametrize(
    "content_type", ["audio/l16;rate=44100", "audio/pcmu;rate=8000", "audio/l16"]
)
def test_unsupported_content_type_is_refused(content_type: str) -> None:
    engine = VonageStreamProtocol()
    engine.receive_text(f'{{"event":"websocket:connected","content-type":"{content_type}"}}', 0.0)
    (close,) = engine.actions_to_send()
    assert isinstance(close, CloseConnection) and close.code == 1003


def test_binary_before_connected_and_odd_frames_are_violations() -> None:
    engine = VonageStreamProtocol()
    engine.receive_bytes(bytes(320), 0.0)
    assert engine.events_received()[0] == ProtocolViolation("binary audio before start")
    engine = VonageStreamProtocol()
    engine.receive_text('{"event":"websocket:connected","content-type":"audio/l16;rate=8000"}', 0.0)
    engine.receive_bytes(bytes(321), 0.0)
    events = engine.events_received()
    assert isinstance(events[1], ProtocolViolation) and "odd-length" in events[1].reason

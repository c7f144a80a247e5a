"""The Plivo engine replayed against a recorded session (fixtures/plivo_call.jsonl)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.engine import LocalProtocolError
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    ProtocolViolation,
    SequenceGap,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.plivo import PlivoStreamProtocol, parse_extra_headers

FRAME = bytes(range(160)) * 2  # 320 B: 20 ms of L16 at 8 kHz


def test_call_with_checkpoints_clear_audio_and_send_dtmf(kit: Any) -> None:
    engine = PlivoStreamProtocol()

    speak = kit.speak(FRAME, "c1", "c2", "c3")

    events = kit.replay(
        engine,
        "plivo_call.jsonl",
        [
            (0.05, speak),
            (0.09, lambda e, now: e.clear(now)),
            (0.12, lambda e, now: e.send_dtmf("12#", now)),
        ],
    )
    (started,) = kit.of_type(events, StreamStarted)
    assert started.custom_parameters == {"route": "billing", "token": "abc123"}
    assert (started.codec, started.sample_rate_hz, started.route) == ("pcm_s16le", 8000, "billing")
    assert [a.sequence for a in kit.of_type(events, AudioReceived)] == [1]
    assert kit.of_type(events, DtmfReceived) == [DtmfReceived("7")]
    # c2/c3 were pending at the clear: Plivo never answers them, clearedAudio releases both
    assert kit.of_type(events, MarkPlayed) == [
        MarkPlayed("c1", False, 20),
        MarkPlayed("c2", True, 40),
        MarkPlayed("c3", True, 60),
    ]
    assert engine.pending_marks() == []
    assert kit.of_type(events, SequenceGap) == []  # numeric sequence numbers
    assert kit.of_type(events, StreamStopped) == [StreamStopped("connection_lost")]
    assert kit.of_type(events, ProtocolViolation) == []


def test_send_dtmf_validates_digits() -> None:
    engine = PlivoStreamProtocol()
    engine.receive_text(
        '{"event":"start","sequenceNumber":1,"start":{"callId":"c","streamId":"s",'
        '"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000}}}',
        0.0,
    )
    assert engine.frame_bytes == 160
    with pytest.raises(LocalProtocolError):
        engine.send_dtmf("12x", 0.0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ("", {}),
        ("a=1,b=two", {"a": "1", "b": "two"}),
        ('{"a": "1"}', {"a": "1"}),
        ({"a": "1"}, {"a": "1"}),
        ("novalue,k=v", {"k": "v"}),
    ],
)
def test_extra_headers_shapes(raw: object, expected: dict[str, str]) -> None:
    assert parse_extra_headers(raw) == expected

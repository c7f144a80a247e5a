"""The Telnyx engine replayed against recorded sessions (fixtures/telnyx_*.jsonl)."""

from __future__ import annotations

import json
from typing import Any

from bridge.engine import CloseConnection
from bridge.streams.base import (
    AudioReceived,
    CarrierErrorReceived,
    DtmfReceived,
    MarkPlayed,
    ProtocolViolation,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.telnyx import TelnyxStreamProtocol

FRAME = b"\xff" * 160
FRAME16_LE = bytes(range(256)) * 2 + bytes(128)


def test_call_with_marks_clear_dtmf_and_error(kit: Any) -> None:
    engine = TelnyxStreamProtocol()

    speak = kit.speak(FRAME, "a", "b")

    events = kit.replay(
        engine, "telnyx_call.jsonl", [(0.05, speak), (0.09, lambda e, now: e.clear(now))]
    )
    (started,) = kit.of_type(events, StreamStarted)
    assert started.stream_id == "32de0dea-53cb-4b21-89a4-9e1819c043bc"
    assert started.call_id.startswith("v3:")
    assert started.custom_parameters == {"route": "support", "client_state": "aGVsbG8="}
    assert (started.route, started.codec, started.sample_rate_hz) == ("support", "mulaw", 8000)
    assert [a.sequence for a in kit.of_type(events, AudioReceived)] == [1]
    assert kit.of_type(events, DtmfReceived) == [DtmfReceived("#")]
    assert kit.of_type(events, MarkPlayed) == [
        MarkPlayed("a", False, 20),
        MarkPlayed("b", True, 40),
    ]
    assert kit.of_type(events, CarrierErrorReceived) == [
        CarrierErrorReceived(
            "100003", "malformed_frame", "The received frame was not formed correctly"
        )
    ]
    assert kit.of_type(events, StreamStopped) == [StreamStopped("stop")]
    assert kit.of_type(events, ProtocolViolation) == []


def test_l16_is_swapped_from_and_to_network_order(kit: Any) -> None:
    engine = TelnyxStreamProtocol()
    events = kit.replay(
        engine, "telnyx_l16.jsonl", [(0.05, lambda e, now: e.send_frame(FRAME16_LE, now))]
    )
    (started,) = kit.of_type(events, StreamStarted)
    assert (started.codec, started.sample_rate_hz, started.route) == ("pcm_s16le", 16000, "wide")
    assert engine.frame_bytes == 640
    (audio,) = kit.of_type(events, AudioReceived)
    assert audio.payload == bytes([0x01, 0x02, 0x03, 0x04])  # s16le after the swap
    assert kit.of_type(events, StreamStopped) == [StreamStopped("connection_lost")]


def test_unsupported_codec_is_refused_with_1003() -> None:
    engine = TelnyxStreamProtocol()
    start = {
        "event": "start",
        "sequence_number": "1",
        "stream_id": "s",
        "start": {
            "call_control_id": "c",
            "media_format": {"encoding": "OPUS", "sample_rate": 16000},
        },
    }
    engine.receive_text(json.dumps(start), 0.0)
    (close,) = engine.actions_to_send()
    assert isinstance(close, CloseConnection) and close.code == 1003
    assert isinstance(engine.events_received()[0], ProtocolViolation)

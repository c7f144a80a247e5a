"""The Twilio engine replayed against recorded sessions (fixtures/twilio_*.jsonl)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bridge.engine import CloseConnection, LocalProtocolError, SendText
from bridge.streams import DIALECTS, engine_for_path
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    ProtocolViolation,
    SequenceGap,
    StreamSettings,
    StreamStarted,
    StreamState,
    StreamStopped,
)
from bridge.streams.twilio import TwilioStreamProtocol

FRAME = b"\xff" * 160
FRAME2 = b"\x7f" * 160
ULAW_IN = bytes([0x7F, 0xFE, 0xFD, 0xFC, 0x7E, 0x7D, 0xFF, 0xFF])


def test_dialects_are_routed_by_path() -> None:
    assert set(DIALECTS) == {"/twilio", "/telnyx", "/plivo", "/exotel", "/vonage"}
    assert isinstance(engine_for_path("/twilio?x=1"), TwilioStreamProtocol)
    assert isinstance(engine_for_path("/twilio/"), TwilioStreamProtocol)
    assert engine_for_path("/nope") is None


def test_call_from_connect_to_stop(kit: Any) -> None:
    engine = TwilioStreamProtocol()
    sent: list[bool] = []
    events = kit.replay(
        engine,
        "twilio_call.jsonl",
        [
            (0.05, lambda e, now: e.send_frame(FRAME, now)),
            (0.05, lambda e, now: e.send_frame(FRAME2, now)),
            (0.05, lambda e, now: e.mark("turn-1", now)),
            (0.21, lambda e, now: sent.append(e.send_frame(FRAME, now))),
        ],
    )
    (started,) = kit.of_type(events, StreamStarted)
    assert started == StreamStarted(
        stream_id="MZ18ad3ab5a668481ce02b83e7395059f0",
        call_id="CA58f9c6b3d7a4e11f0a2b3c4d5e6f7a8b",
        account_id="AC25e16e9a716a4a1786a7c83f58e30482",
        tracks=("inbound",),
        custom_parameters={"route": "sales", "token": "v1.opaque"},
        codec="mulaw",
        sample_rate_hz=8000,
        route="sales",
    )
    audio = kit.of_type(events, AudioReceived)
    assert [(a.payload, a.sequence, a.timestamp_ms) for a in audio] == [
        (ULAW_IN, 1, 20),
        (ULAW_IN, 2, 40),
    ]
    assert kit.of_type(events, DtmfReceived) == [DtmfReceived("5")]
    assert kit.of_type(events, MarkPlayed) == [MarkPlayed("turn-1", False, 40)]
    assert kit.of_type(events, StreamStopped) == [StreamStopped("stop")]
    assert kit.of_type(events, SequenceGap) == []
    assert kit.of_type(events, ProtocolViolation) == []
    # stop arrived before the command at t=0.21: the frame is dropped, not an error
    assert sent == [False]
    assert engine.sent_ms == 40
    assert engine.played_position_ms() == 40
    assert engine.state is StreamState.CLOSED


def test_marks_echoed_after_clear_are_not_counted_as_played(kit: Any) -> None:
    engine = TwilioStreamProtocol()

    speak = kit.speak(FRAME, "s1", "s2", "s3")

    events = kit.replay(
        engine,
        "twilio_clear.jsonl",
        [
            (0.1, speak),
            (0.15, lambda e, now: e.clear(now)),
            (0.2, lambda e, now: (e.send_frame(FRAME2, now), e.mark("s4", now))),
        ],
    )
    marks = [(t, m) for t, m in events if isinstance(m, MarkPlayed)]
    assert marks == [
        (0.12, MarkPlayed("s1", False, 20)),
        (0.16, MarkPlayed("s2", True, 40)),
        (0.16, MarkPlayed("s3", True, 60)),
        (0.3, MarkPlayed("s4", False, 80)),
    ]
    assert engine.played_position_ms() == 80
    assert len(kit.of_type(events, AudioReceived)) == 1


def test_sequence_gaps_are_reported_not_fatal(kit: Any) -> None:
    events = kit.replay(TwilioStreamProtocol(), "twilio_gaps.jsonl")
    assert kit.of_type(events, SequenceGap) == [SequenceGap(3, 5), SequenceGap(7, 4)]
    assert [a.sequence for a in kit.of_type(events, AudioReceived)] == [1, 4, 5, 3]
    assert kit.of_type(events, StreamStopped) == [StreamStopped("stop")]


def test_stream_without_stop_ends_on_connection_lost(kit: Any) -> None:
    engine = TwilioStreamProtocol()
    events = kit.replay(engine, "twilio_no_stop.jsonl")
    assert kit.of_type(events, StreamStopped) == [StreamStopped("connection_lost")]
    assert engine.state is StreamState.CLOSED
    engine.receive_text('{"event": "media"}', 1.0)
    assert engine.events_received() == [] and engine.actions_to_send() == []


def _started(engine: TwilioStreamProtocol, params: dict[str, str] | None = None) -> None:
    start = {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ1",
        "start": {
            "streamSid": "MZ1",
            "callSid": "CA1",
            "accountSid": "AC1",
            "tracks": ["inbound"],
            "customParameters": params or {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }
    engine.connection_made(0.0)
    engine.receive_text(json.dumps(start), 0.0)
    engine.events_received()


def test_route_hint_is_used_when_start_has_no_route() -> None:
    engine = TwilioStreamProtocol(route="from-url")
    engine.connection_made(0.0)
    engine.receive_text(
        json.dumps({"event": "start", "start": {"streamSid": "MZ1", "callSid": "CA1"}}), 0.0
    )
    (started,) = engine.events_received()
    assert isinstance(started, StreamStarted)
    assert (
        started.route == "from-url" and started.codec == "mulaw" and started.tracks == ("inbound",)
    )


def test_outbound_messages_are_twilio_shaped() -> None:
    engine = TwilioStreamProtocol()
    _started(engine)
    engine.send_frame(FRAME, 1.0)
    engine.mark("m", 1.0)
    engine.clear(1.0)
    texts = [a.text for a in engine.actions_to_send() if isinstance(a, SendText)]
    msgs = [json.loads(t) for t in texts]
    assert msgs == [
        {
            "event": "media",
            "streamSid": "MZ1",
            "media": {"payload": base64.b64encode(FRAME).decode()},
        },
        {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m"}},
        {"event": "clear", "streamSid": "MZ1"},
    ]
    assert all("sequenceNumber" not in m for m in msgs)


def test_command_misuse_raises_local_errors() -> None:
    engine = TwilioStreamProtocol()
    with pytest.raises(LocalProtocolError):
        engine.send_frame(FRAME, 0.0)  # before start
    _started(engine)
    with pytest.raises(LocalProtocolError):
        engine.send_frame(FRAME[:100], 0.0)
    engine.mark("a", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.mark("a", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_dtmf("1", 0.0)


def test_start_timeout_closes_with_policy_violation() -> None:
    engine = TwilioStreamProtocol(StreamSettings(start_timeout_s=5.0))
    engine.connection_made(10.0)
    assert engine.next_deadline() == 15.0
    engine.receive_text('{"event": "connected", "protocol": "Call", "version": "1.0.0"}', 11.0)
    engine.handle_timer(14.9)
    assert engine.actions_to_send() == []
    engine.handle_timer(15.0)
    assert engine.actions_to_send() == [CloseConnection(1008, "no start within 5 s")]
    assert engine.events_received() == [
        ProtocolViolation("no start within 5 s"),
        StreamStopped("protocol_violation"),
    ]
    assert engine.next_deadline() is None


def test_start_disarms_the_timer_and_reject_closes_1008() -> None:
    engine = TwilioStreamProtocol()
    _started(engine, {"token": "bad"})
    assert engine.next_deadline() is None
    engine.reject("bad token", 1.0)
    assert engine.actions_to_send() == [CloseConnection(1008, "bad token")]
    assert engine.events_received() == [StreamStopped("rejected: bad token")]
    engine.hangup(2.0)  # already closed: nothing more
    assert engine.actions_to_send() == []


def test_hangup_closes_normally_once() -> None:
    engine = TwilioStreamProtocol()
    _started(engine)
    engine.hangup(1.0)
    engine.connection_lost(1.1)
    assert engine.actions_to_send() == [CloseConnection(1000, "hangup")]
    assert engine.events_received() == [StreamStopped("hangup")]


def test_outbound_track_media_is_ignored() -> None:
    engine = TwilioStreamProtocol()
    _started(engine)
    media = {"track": "outbound", "chunk": "1", "timestamp": "0", "payload": "AAAA"}
    engine.receive_text(json.dumps({"event": "media", "streamSid": "MZ1", "media": media}), 1.0)
    assert engine.events_received() == []
    assert engine.actions_to_send() == []

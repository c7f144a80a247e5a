"""The Twilio engine paired in-process with the Twilio emulator (the carrier side)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.engine import SendText
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    SequenceGap,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.twilio import TwilioStreamProtocol


class Pair:
    """Engine <-> emulator over an instant in-process link."""

    def __init__(self, kit: Any, **emu_kw: Any) -> None:
        self.emu = kit.emulator.TwilioEmulator(**emu_kw)
        self.engine = TwilioStreamProtocol()
        self.events: list[Any] = []

    def pump(self, now: float) -> None:
        for text in self.emu.frames_to_send(now):
            self.engine.receive_text(text, now)
        for action in self.engine.actions_to_send():
            assert isinstance(action, SendText), action
            self.emu.receive(action.text, now)
        self.events.extend(self.engine.events_received())

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


def frame(n: int) -> bytes:
    return bytes([n % 256]) * 160


@pytest.fixture
def pair(kit: Any) -> Pair:
    p = Pair(kit, custom_parameters={"route": "demo", "token": "tk"})
    p.emu.connect(0.0)
    p.pump(0.0)
    return p


def test_start_reaches_the_engine(pair: Pair) -> None:
    (started,) = pair.of(StreamStarted)
    assert started.route == "demo" and started.custom_parameters["token"] == "tk"
    assert started.stream_id == pair.emu.stream_sid and started.call_id == pair.emu.call_sid


def test_paced_turn_plays_in_order_and_marks_echo_when_played(pair: Pair) -> None:
    for n in range(50):
        now = 0.1 + n * 0.02
        pair.engine.send_frame(frame(n), now)
        if n in (24, 49):
            pair.engine.mark(f"m{n}", now)
        pair.pump(now)
    for now in (1.0, 1.1, 1.2):
        pair.pump(now)
    assert pair.emu.errors() == []
    assert pair.emu.played_audio() == b"".join(frame(n) for n in range(50))
    assert pair.emu.arrival_times() == pytest.approx([0.1 + n * 0.02 for n in range(50)])
    assert pair.emu.media_sizes() == [160] * 50
    assert pair.of(MarkPlayed) == [MarkPlayed("m24", False, 500), MarkPlayed("m49", False, 1000)]
    echoes = pair.emu.marks_echoed()
    assert [(e.name, e.cleared) for e in echoes] == [("m24", False), ("m49", False)]
    assert echoes[0].at_s == pytest.approx(0.6) and echoes[1].at_s == pytest.approx(1.1)
    assert pair.engine.played_position_ms() == 1000
    assert pair.emu.playout_gaps() == []


def test_clear_drops_the_buffer_and_cleared_marks_are_not_played(pair: Pair) -> None:
    for n in range(50):  # a 1 s burst: Twilio buffers it
        pair.engine.send_frame(frame(n), 0.1)
        if n in (9, 29, 49):
            pair.engine.mark(f"m{n}", 0.1)
    pair.pump(0.1)
    pair.pump(0.35)
    pair.engine.clear(0.35)
    pair.pump(0.35)
    pair.pump(0.5)
    assert pair.emu.errors() == []
    assert len(pair.emu.played_audio()) == 2000  # 0.25 s at 8000 B/s, then silence
    assert pair.emu.played_audio() == b"".join(frame(n) for n in range(50))[:2000]
    assert pair.of(MarkPlayed) == [
        MarkPlayed("m9", False, 200),
        MarkPlayed("m29", True, 600),
        MarkPlayed("m49", True, 1000),
    ]
    # the engine's view matches the carrier's record exactly
    assert [(e.name, e.cleared) for e in pair.emu.marks_echoed()] == [
        (m.name, m.cleared) for m in pair.of(MarkPlayed)
    ]
    assert pair.emu.buffered_ms(0.5) == 0
    assert pair.engine.played_position_ms() == 200


def test_mark_with_nothing_buffered_is_echoed_at_once(pair: Pair) -> None:
    pair.engine.mark("empty", 0.2)
    pair.pump(0.2)
    pair.pump(0.2)
    assert pair.of(MarkPlayed) == [MarkPlayed("empty", False, 0)]
    assert pair.emu.marks_echoed()[0].at_s == 0.2


def test_inbound_audio_dtmf_gap_and_stop(pair: Pair) -> None:
    pair.emu.send_audio(bytes(range(160)) * 10, 0.2)
    pair.emu.send_dtmf("7", 0.25)
    pair.emu.skip_sequence_numbers(2)
    pair.emu.send_audio(b"\xff" * 160, 0.3)
    pair.emu.send_stop(0.4)
    pair.pump(0.4)
    audio = pair.of(AudioReceived)
    assert [a.sequence for a in audio] == list(range(1, 12))
    assert [a.timestamp_ms for a in audio][:3] == [200, 220, 240]
    assert b"".join(a.payload for a in audio[:10]) == bytes(range(160)) * 10
    assert pair.of(DtmfReceived) == [DtmfReceived("7")]
    assert pair.of(SequenceGap) == [SequenceGap(13, 15)]
    assert pair.of(StreamStopped) == [StreamStopped("stop")]


def test_playout_gaps_show_a_pacer_that_fell_behind(pair: Pair) -> None:
    pair.engine.send_frame(frame(1), 0.1)
    pair.pump(0.1)
    pair.engine.send_frame(frame(2), 0.2)  # 80 ms late: the buffer ran dry at 0.12
    pair.pump(0.2)
    pair.pump(0.3)
    (gap,) = pair.emu.playout_gaps()
    assert gap[0] == pytest.approx(0.12) and gap[1] == pytest.approx(0.08)


def test_emulator_records_protocol_mistakes(kit: Any) -> None:
    emu = kit.emulator.TwilioEmulator()
    emu.connect(0.0)
    emu.receive("not json", 0.1)
    emu.receive(
        json.dumps({"event": "media", "streamSid": "MZ-wrong", "media": {"payload": "AA=="}}), 0.1
    )
    emu.receive(
        json.dumps(
            {
                "event": "media",
                "sequenceNumber": "3",
                "streamSid": emu.stream_sid,
                "media": {"payload": "AA=="},
            }
        ),
        0.1,
    )
    emu.receive(json.dumps({"event": "dance", "streamSid": emu.stream_sid}), 0.1)
    errors = emu.errors()
    assert errors[0] == "not JSON"
    assert "streamSid" in errors[1] and "sequenceNumber" in errors[2] and "dance" in errors[3]


def test_emulator_numbers_are_strings_and_sequence_starts_at_one(kit: Any) -> None:
    emu = kit.emulator.TwilioEmulator()
    emu.connect(0.0)
    emu.send_audio(b"\xff" * 160, 0.02)
    connected, start, media = (json.loads(t) for t in emu.frames_to_send(0.02))
    assert "sequenceNumber" not in connected and start["sequenceNumber"] == "1"
    assert media["sequenceNumber"] == "2" and media["media"]["chunk"] == "1"
    assert media["media"]["timestamp"] == "20"
    assert start["start"]["mediaFormat"] == {
        "encoding": "audio/x-mulaw",
        "sampleRate": 8000,
        "channels": 1,
    }

"""RFC 4733 receive and send, and the in-band fallback over telcodec."""

from __future__ import annotations

from typing import Literal

import pytest

from bridge.rtp.dtmf import (
    DtmfReceived,
    DtmfReceiver,
    DtmfSender,
    DtmfStarted,
    InbandDtmf,
    TelephoneEvent,
    TelephoneEventPacket,
)
from telcodec import dtmf as tone_dtmf
from telcodec import g711


def payload(event: int, duration: int, end: bool = False, volume: int = 10) -> bytes:
    return TelephoneEvent(event, end, volume, duration).serialize()


def feed(receiver: DtmfReceiver, packets: list[tuple[bytes, int, float]]) -> list[object]:
    events: list[object] = []
    for data, ts, now in packets:
        receiver.receive(data, ts, now)
        events.extend(receiver.events_received())
    return events


def test_payload_vector() -> None:
    # digit 5, E=1, volume 10, duration 800: 05 8a 03 20
    assert payload(5, 800, end=True) == bytes.fromhex("058a0320")
    assert TelephoneEvent.parse(bytes.fromhex("0b3f0140")) == TelephoneEvent(11, False, 63, 320)
    with pytest.raises(ValueError, match="too short: 3 bytes"):
        TelephoneEvent.parse(b"\x01\x02\x03")


def test_event_with_end_bit_and_three_end_copies_reported_once() -> None:
    receiver = DtmfReceiver()
    ts = 1000
    events = feed(
        receiver,
        [
            (payload(1, 160), ts, 0.00),
            (payload(1, 320), ts, 0.02),
            (payload(1, 480), ts, 0.04),
            (payload(1, 640, end=True), ts, 0.06),
            (payload(1, 640, end=True), ts, 0.08),
            (payload(1, 640, end=True), ts, 0.10),
        ],
    )
    assert events == [
        DtmfStarted("1", ts),
        DtmfReceived("1", duration_ms=80, volume_dbm0=10, timestamp=ts, ended=True),
    ]
    assert receiver.duplicates == 2
    assert receiver.next_deadline() is None


def test_same_digit_twice_is_two_events_by_timestamp_without_marker() -> None:
    """Carriers that never set M: a new timestamp alone starts a new event."""
    receiver = DtmfReceiver()
    packets = []
    for ts, t0 in ((8000, 0.0), (9600, 0.2)):
        packets += [(payload(9, 160), ts, t0), (payload(9, 320, end=True), ts, t0 + 0.02)]
        packets += [(payload(9, 320, end=True), ts, t0 + 0.04)]
    events = feed(receiver, packets)
    received = [e for e in events if isinstance(e, DtmfReceived)]
    assert [(e.digit, e.timestamp) for e in received] == [("9", 8000), ("9", 9600)]


def test_missing_end_reported_when_next_event_starts() -> None:
    receiver = DtmfReceiver()
    events = feed(
        receiver,
        [
            (payload(10, 160), 100, 0.0),
            (payload(10, 320), 100, 0.02),  # end packets lost
            (payload(11, 160), 900, 0.3),
        ],
    )
    assert events == [
        DtmfStarted("*", 100),
        DtmfReceived("*", 40, 10, 100, ended=False),
        DtmfStarted("#", 900),
    ]


def test_missing_end_reported_after_timeout() -> None:
    receiver = DtmfReceiver(end_timeout_s=0.5)
    feed(receiver, [(payload(12, 160), 5, 1.0), (payload(12, 480), 5, 1.06)])
    assert receiver.next_deadline() == pytest.approx(1.56)
    receiver.handle_timer(1.5)
    assert receiver.events_received() == []
    receiver.handle_timer(1.56)
    assert receiver.events_received() == [DtmfReceived("A", 60, 10, 5, ended=False)]
    assert receiver.next_deadline() is None
    # A straggler of the reported event is not a new key press.
    receiver.receive(payload(12, 640, end=True), 5, 1.7)
    assert receiver.events_received() == []


def test_end_packet_first_is_reported_immediately() -> None:
    receiver = DtmfReceiver()
    events = feed(receiver, [(payload(0, 800, end=True, volume=7), 42, 0.0)])
    assert events == [DtmfStarted("0", 42), DtmfReceived("0", 100, 7, 42, ended=True)]


def test_flash_short_and_reordered_updates() -> None:
    receiver = DtmfReceiver()
    events = feed(
        receiver,
        [
            (payload(16, 160), 1, 0.0),  # flash: ignored
            (b"\x01\x02", 2, 0.0),  # malformed
            (payload(3, 480), 3, 0.0),  # reordered: later update first
            (payload(3, 160), 3, 0.01),
            (payload(3, 640, end=True), 3, 0.02),
        ],
    )
    assert receiver.ignored_events == 1 and receiver.malformed == 1
    assert events[-1] == DtmfReceived("3", 80, 10, 3, ended=True)


def test_timestamp_wrap_is_just_a_new_timestamp() -> None:
    receiver = DtmfReceiver()
    events = feed(
        receiver,
        [(payload(4, 160, end=True), 2**32 - 160, 0.0), (payload(5, 160, end=True), 0, 0.2)],
    )
    assert [e.digit for e in events if isinstance(e, DtmfReceived)] == ["4", "5"]


def collect(sender: DtmfSender, ticks: int) -> list[TelephoneEventPacket | None]:
    return [sender.next_packet() for _ in range(ticks)]


def test_sender_sequence_for_one_digit() -> None:
    sender = DtmfSender(volume_dbm0=10)
    sender.send_digits("7", tone_ms=100)
    out = collect(sender, 8)
    packets = [p for p in out if p is not None]
    assert len(packets) == 7 and out[7] is None and sender.idle
    events = [TelephoneEvent.parse(p.payload) for p in packets]
    assert [p.marker for p in packets] == [True, False, False, False, False, False, False]
    assert [e.duration for e in events] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in events] == [False] * 4 + [True] * 3
    assert {e.event for e in events} == {7} and {e.volume for e in events} == {10}


def test_sender_gap_between_digits_and_one_tick_tone() -> None:
    sender = DtmfSender()
    sender.send_digits("#1", tone_ms=20, gap_ms=40)
    out = collect(sender, 9)
    kinds = [None if p is None else (p.marker, TelephoneEvent.parse(p.payload)) for p in out]
    assert kinds[0] == (True, TelephoneEvent(11, True, 10, 160))
    assert kinds[1] == kinds[2] == (False, TelephoneEvent(11, True, 10, 160))
    assert kinds[3:5] == [None, None]
    assert kinds[5] == (True, TelephoneEvent(1, True, 10, 160))
    assert kinds[8] is None


def test_sender_cancel_finishes_the_current_event_only() -> None:
    sender = DtmfSender()
    sender.send_digits("123", tone_ms=60)
    first = sender.next_packet()
    assert first is not None and first.marker
    sender.cancel()
    rest = collect(sender, 10)
    sent = [TelephoneEvent.parse(p.payload) for p in rest if p is not None]
    assert [e.event for e in sent] == [1, 1, 1, 1]
    assert [e.end for e in sent] == [False, True, True, True]
    sender.send_digits("4")
    sender.cancel()  # not started: dropped entirely
    assert sender.idle


def test_sender_rejects_bad_input() -> None:
    sender = DtmfSender()
    with pytest.raises(ValueError, match="not a DTMF digit"):
        sender.send_digits("1x")
    with pytest.raises(ValueError, match="tone of 9000 ms"):
        sender.send_digits("1", tone_ms=9000)
    with pytest.raises(ValueError, match="volume"):
        DtmfSender(volume_dbm0=64)


def test_sender_into_receiver_round_trip() -> None:
    sender = DtmfSender()
    sender.send_digits("*0#", tone_ms=80, gap_ms=60)
    receiver = DtmfReceiver()
    ts = 0
    events: list[object] = []
    for tick in range(60):
        packet = sender.next_packet()
        if packet is None:
            continue
        if packet.marker:
            ts = tick * 160
        receiver.receive(packet.payload, ts, tick * 0.02)
        events.extend(receiver.events_received())
    received = [e for e in events if isinstance(e, DtmfReceived)]
    assert [(e.digit, e.duration_ms, e.ended) for e in received] == [
        ("*", 80, True),
        ("0", 80, True),
        ("#", 80, True),
    ]


@pytest.mark.parametrize("encoding", ["ulaw", "alaw"])
def test_inband_dtmf_over_g711_frames(encoding: Literal["ulaw", "alaw"]) -> None:
    pcm = tone_dtmf.generate("159#", tone_ms=80, gap_ms=80)
    coded = g711.ulaw_encode(pcm) if encoding == "ulaw" else g711.alaw_encode(pcm)
    detector = InbandDtmf(encoding)
    digits: list[str] = []
    for i in range(0, len(coded), 160):
        digits += detector.process(coded[i : i + 160])
    assert digits == ["1", "5", "9", "#"]


def test_inband_dtmf_silence_gives_nothing() -> None:
    detector = InbandDtmf("ulaw")
    assert [d for _ in range(50) for d in detector.process(b"\xff" * 160)] == []

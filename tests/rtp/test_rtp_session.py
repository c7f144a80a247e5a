"""RtpSession: sending, latching, jitter buffer, RFC 3550 statistics, RTCP, timeout.

Time is a number each test passes in; randomness is pinned with FixedRandom.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.engine import LocalProtocolError, SendDatagram
from bridge.rtp.dtmf import DtmfReceived, DtmfSender, DtmfStarted, TelephoneEvent
from bridge.rtp.packet import (
    RtcpBye,
    RtcpReceiverReport,
    RtcpSenderReport,
    RtcpSourceDescription,
    RtpPacket,
    build_rtp,
    parse_rtcp,
    serialize_rtcp,
)
from bridge.rtp.session import (
    FrameLost,
    RemoteLatched,
    RtcpByeReceived,
    RtcpReportReceived,
    RtpFrame,
    RtpSession,
    RtpSessionConfig,
    RtpTimedOut,
    SsrcChanged,
    silence_frame,
)

REMOTE = ("192.0.2.10", 40000)
OTHER = ("198.51.100.66", 40000)
PEER_SSRC = 0x11223344
PCMU = b"\x7f" * 160


class FixedRandom(random.Random):
    """SSRC, ts0 and first sequence number as given; RTCP intervals exactly nominal."""

    def __init__(self, ssrc: int = 0xCAFE0001, ts0: int = 1000, seq: int = 500) -> None:
        super().__init__(0)
        self._bits = {32: [ssrc, ts0], 16: [seq]}

    def getrandbits(self, k: int) -> int:
        return self._bits[k].pop(0)

    def random(self) -> float:
        return 0.5


def make(
    config: RtpSessionConfig | None = None,
    remote: tuple[str, int] | None = REMOTE,
    rng: random.Random | None = None,
    now: float = 0.0,
) -> RtpSession:
    return RtpSession(config or RtpSessionConfig(), remote, now, rng or FixedRandom())


def rtp(
    seq: int, ts: int | None = None, *, ssrc: int = PEER_SSRC, pt: int = 0, **kw: object
) -> bytes:
    payload = kw.get("payload", PCMU)
    assert isinstance(payload, bytes)
    return build_rtp(
        pt,
        seq & 0xFFFF,
        (seq * 160 if ts is None else ts) & 0xFFFFFFFF,
        ssrc,
        payload,
        bool(kw.get("marker", False)),
    )


def sent(session: RtpSession) -> list[tuple[RtpPacket, tuple[str, int]]]:
    out = []
    for action in session.actions_to_send():
        assert isinstance(action, SendDatagram)
        out.append((RtpPacket.parse(action.data), action.addr))
    return out


def feed(
    session: RtpSession, seqs: list[int], t0: float = 0.0, src: tuple[str, int] = REMOTE
) -> None:
    for i, seq in enumerate(seqs):
        session.receive_datagram(rtp(seq), src, t0 + i * 0.02)


def pops(session: RtpSession, n: int, t0: float = 1.0) -> list[object]:
    out: list[object] = []
    for i in range(n):
        item = session.pop_frame(t0 + i * 0.02)
        out.append(item.sequence_number if isinstance(item, RtpFrame) else item)
    return out


# ---------------------------------------------------------------- sending


def test_send_sequence_timestamp_ssrc_marker() -> None:
    session = make()
    for n in range(3):
        session.send_frame(PCMU, 0, n * 0.02, n)
    packets = sent(session)
    assert [p.sequence_number for p, _ in packets] == [500, 501, 502]
    assert [p.timestamp for p, _ in packets] == [1000, 1160, 1320]
    assert [p.marker for p, _ in packets] == [True, False, False]
    assert {p.ssrc for p, _ in packets} == {0xCAFE0001} == {session.ssrc}
    assert {addr for _, addr in packets} == {REMOTE}
    assert packets[0][0].payload == PCMU and packets[0][0].payload_type == 0


def test_sequence_and_timestamp_wrap() -> None:
    session = make(rng=FixedRandom(ts0=2**32 - 160, seq=65535))
    session.send_frame(PCMU, 0, 0.0, 0)
    session.send_frame(PCMU, 0, 0.02, 1)
    session.send_frame(PCMU, 0, 0.04, 2)
    packets = [p for p, _ in sent(session)]
    assert [p.sequence_number for p in packets] == [65535, 0, 1]
    assert [p.timestamp for p in packets] == [2**32 - 160, 0, 160]
    assert session.timestamp_for(10) == 160 * 9


def test_timestamp_follows_frame_index_not_packet_count() -> None:
    """A skipped clock frame moves the timestamp; the sequence stays contiguous."""
    session = make()
    session.send_frame(PCMU, 0, 0.0, 0)
    session.send_frame(PCMU, 0, 0.1, 5)
    packets = [p for p, _ in sent(session)]
    assert [p.sequence_number for p in packets] == [500, 501]
    assert [p.timestamp for p in packets] == [1000, 1000 + 5 * 160]


def test_marker_on_each_talkspurt() -> None:
    session = make()
    for n in range(2):
        session.send_frame(PCMU, 0, n * 0.02, n)
    session.start_talkspurt()
    for n in range(2, 4):
        session.send_frame(PCMU, 0, n * 0.02, n)
    assert [p.marker for p, _ in sent(session)] == [True, False, True, False]


def test_silence_frames() -> None:
    assert silence_frame(0) == b"\xff" * 160
    assert silence_frame(8) == b"\xd5" * 160
    with pytest.raises(ValueError, match="payload type 9"):
        silence_frame(9)


def test_hold_stops_sending_and_resume_sets_marker() -> None:
    session = make()
    session.send_frame(PCMU, 0, 0.0, 0)
    session.set_direction("recvonly", 0.01)
    session.send_frame(PCMU, 0, 0.02, 1)
    session.set_direction("inactive", 0.03)
    session.send_frame(PCMU, 0, 0.04, 2)
    session.set_direction("sendrecv", 0.05)
    session.send_frame(PCMU, 0, 0.06, 3)
    session.send_frame(PCMU, 0, 0.08, 4)
    packets = [p for p, _ in sent(session)]
    assert [(p.sequence_number, p.timestamp, p.marker) for p in packets] == [
        (500, 1000, True),
        (501, 1000 + 3 * 160, True),
        (502, 1000 + 4 * 160, False),
    ]


def test_nothing_sent_without_remote_address() -> None:
    session = make(remote=None)
    session.send_frame(PCMU, 0, 0.0, 0)
    assert session.actions_to_send() == []
    session.set_remote(REMOTE)
    session.send_frame(PCMU, 0, 0.02, 1)
    assert [(p.sequence_number, p.marker) for p, _ in sent(session)] == [(500, True)]


def test_telephone_events_share_sequence_and_keep_event_timestamp() -> None:
    session = make(RtpSessionConfig(telephone_event_pt=101))
    dtmf = DtmfSender()
    dtmf.send_digits("5", tone_ms=60)
    session.send_frame(PCMU, 0, 0.0, 0)
    n = 1
    while (packet := dtmf.next_packet()) is not None:
        session.send_telephone_event(packet, n * 0.02, n)
        n += 1
    session.send_frame(PCMU, 0, n * 0.02, n)
    packets = [p for p, _ in sent(session)]
    assert [p.sequence_number for p in packets] == list(range(500, 507))
    events = packets[1:6]
    assert {p.payload_type for p in events} == {101}
    assert {p.timestamp for p in events} == {1160}
    assert [p.marker for p in events] == [True, False, False, False, False]
    assert [TelephoneEvent.parse(p.payload).duration for p in events] == [160, 320, 480, 480, 480]
    assert packets[6].timestamp == 1000 + 6 * 160 and packets[6].payload_type == 0


def test_telephone_event_without_negotiation_is_a_local_error() -> None:
    session = make()
    dtmf = DtmfSender()
    dtmf.send_digits("1")
    packet = dtmf.next_packet()
    assert packet is not None
    with pytest.raises(LocalProtocolError, match="not negotiated"):
        session.send_telephone_event(packet, 0.0, 0)


# ---------------------------------------------------------------- source checks


def test_strict_source_drops_other_addresses() -> None:
    session = make()
    session.receive_datagram(rtp(1), OTHER, 0.0)
    session.receive_datagram(rtp(1), (REMOTE[0], REMOTE[1] + 2), 0.0)  # same host, other port
    session.receive_datagram(rtp(1), REMOTE, 0.0)
    counters = session.counters()
    assert counters.dropped_wrong_source == 2 and counters.packets_received == 1
    assert session.events_received() == [SsrcChanged(None, PEER_SSRC)]


def test_latching_learns_first_source_and_locks() -> None:
    session = make(RtpSessionConfig(latch=True), remote=REMOTE)
    session.send_frame(PCMU, 0, 0.0, 0)
    assert [addr for _, addr in sent(session)] == [REMOTE]  # SDP address until latched
    nat = ("203.0.113.5", 61000)
    session.receive_datagram(rtp(1), nat, 0.01)
    assert session.events_received() == [RemoteLatched(nat), SsrcChanged(None, PEER_SSRC)]
    session.receive_datagram(rtp(2, ssrc=0x99), OTHER, 0.02)  # injection attempt
    session.receive_datagram(rtp(2), REMOTE, 0.03)  # even the SDP address, once locked
    assert session.counters().dropped_wrong_source == 2
    assert session.events_received() == []
    session.send_frame(PCMU, 0, 0.04, 2)
    assert [addr for _, addr in sent(session)] == [nat]
    assert session.remote_addr == nat


def test_latching_restricted_to_a_host_and_not_on_garbage() -> None:
    config = RtpSessionConfig(latch=True, latch_host="203.0.113.5")
    session = make(config)
    session.receive_datagram(rtp(1), OTHER, 0.0)  # wrong host: not learned
    session.receive_datagram(b"\x80\x00garbage", ("203.0.113.5", 1), 0.0)  # malformed
    session.receive_datagram(rtp(1, pt=18), ("203.0.113.5", 1), 0.0)  # PT not negotiated
    assert session.events_received() == []
    session.receive_datagram(rtp(1), ("203.0.113.5", 1), 0.0)
    assert RemoteLatched(("203.0.113.5", 1)) in session.events_received()
    counters = session.counters()
    assert (counters.dropped_wrong_source, counters.dropped_malformed) == (1, 1)
    assert counters.dropped_payload_type == 1


def test_set_remote_reopens_learning_only_then() -> None:
    session = make(RtpSessionConfig(latch=True))
    session.receive_datagram(rtp(1), ("203.0.113.5", 1), 0.0)
    session.receive_datagram(rtp(2), ("203.0.113.9", 2), 0.02)
    assert session.counters().dropped_wrong_source == 1
    session.set_remote(("203.0.113.9", 2))  # re-INVITE
    session.events_received()
    session.receive_datagram(rtp(3), ("203.0.113.9", 2), 0.04)
    assert session.events_received() == [RemoteLatched(("203.0.113.9", 2))]


def test_ssrc_change_from_locked_source_is_accepted_and_counted() -> None:
    session = make()
    feed(session, [10, 11, 12, 13])
    session.receive_datagram(rtp(7000, ssrc=0x55), REMOTE, 0.1)
    session.receive_datagram(rtp(7001, ssrc=0x55), REMOTE, 0.12)
    events = session.events_received()
    assert events == [SsrcChanged(None, PEER_SSRC), SsrcChanged(PEER_SSRC, 0x55)]
    assert session.counters().ssrc_changes == 1
    stats = session.reception_stats()
    assert (stats.ssrc, stats.expected, stats.received) == (0x55, 2, 2)
    # The old stream's frames were flushed: playout resumes with the new one.
    assert pops(session, 3) == [7000, 7001, None]


# ---------------------------------------------------------------- jitter buffer


def test_in_order_after_prefill() -> None:
    session = make()
    feed(session, [1, 2, 3, 4])
    assert pops(session, 5, t0=0.0) == [1, 2, 3, 4, None]


def test_prefill_waits_depth_frames_or_depth_periods() -> None:
    session = make()
    session.receive_datagram(rtp(1), REMOTE, 0.0)
    assert session.pop_frame(0.02) is None
    assert session.pop_frame(0.04) is None
    frame = session.pop_frame(0.06)  # waited 3 periods
    assert isinstance(frame, RtpFrame) and frame.sequence_number == 1
    assert frame.payload == PCMU and frame.timestamp == 160 and frame.payload_type == 0


def test_reorder() -> None:
    session = make()
    feed(session, [1, 3, 2, 5, 4, 6])
    assert pops(session, 6) == [1, 2, 3, 4, 5, 6]
    assert session.counters().frames_lost == 0


def test_loss_is_reported_once_per_missing_frame() -> None:
    session = make()
    feed(session, [1, 2, 4, 5, 7])
    assert pops(session, 6) == [1, 2, FrameLost(3), 4, 5, FrameLost(6)]
    assert session.counters().frames_lost == 2


def test_duplicates_and_too_late_packets_are_dropped() -> None:
    session = make()
    feed(session, [1, 2, 2, 3])
    assert pops(session, 2) == [1, 2]
    session.receive_datagram(rtp(1), REMOTE, 1.1)  # already played
    session.receive_datagram(rtp(3), REMOTE, 1.1)  # duplicate, still buffered
    counters = session.counters()
    assert (counters.dropped_duplicate, counters.dropped_late) == (2, 1)
    assert pops(session, 2, t0=2.0) == [3, None]


def test_late_packet_after_its_slot_was_concealed() -> None:
    session = make()
    feed(session, [1, 3, 4])
    assert pops(session, 2) == [1, FrameLost(2)]
    session.receive_datagram(rtp(2), REMOTE, 1.05)
    assert session.counters().dropped_late == 1
    assert pops(session, 2, t0=1.1) == [3, 4]


def test_sequence_wrap_on_receive() -> None:
    session = make()
    feed(session, [65534, 0, 65535, 1, 2])
    assert pops(session, 5) == [65534, 65535, 0, 1, 2]
    stats = session.reception_stats()
    assert stats.extended_highest_seq == 65536 + 2
    assert (stats.expected, stats.received, stats.lost) == (5, 5, 0)


def test_underrun_then_rebuffer() -> None:
    session = make()
    feed(session, [1, 2, 3])
    assert pops(session, 4) == [1, 2, 3, None]
    assert session.counters().underruns == 1
    # Talker resumes (silence suppression ended): buffer again before playing.
    session.receive_datagram(rtp(4, marker=True), REMOTE, 2.0)
    assert session.pop_frame(2.0) is None
    session.receive_datagram(rtp(5), REMOTE, 2.02)
    session.receive_datagram(rtp(6), REMOTE, 2.04)
    assert pops(session, 3, t0=2.04) == [4, 5, 6]


def test_burst_beyond_max_span_discards_oldest() -> None:
    session = make(RtpSessionConfig(jitter_depth_frames=3, jitter_max_frames=6))
    feed(session, list(range(1, 4)))
    assert pops(session, 1) == [1]
    feed(session, list(range(4, 13)), t0=0.5)  # a burst after a stall
    assert pops(session, 3, t0=1.0) == [10, 11, 12]
    assert session.counters().dropped_overflow == 8


def test_unnegotiated_payload_type_dropped() -> None:
    session = make(RtpSessionConfig(payload_types=frozenset({8})))
    session.receive_datagram(rtp(1, pt=0), REMOTE, 0.0)
    session.receive_datagram(rtp(2, pt=13), REMOTE, 0.0)
    session.receive_datagram(rtp(3, pt=8, payload=b"\xd5" * 160), REMOTE, 0.0)
    assert session.counters().dropped_payload_type == 2
    assert session.counters().packets_received == 1


def test_telephone_events_inbound_fill_their_slots_and_report_digits() -> None:
    session = make(RtpSessionConfig(telephone_event_pt=101))
    feed(session, [1, 2])
    ts = 3 * 160
    for i, (duration, end) in enumerate([(160, False), (320, True), (320, True), (320, True)]):
        payload = TelephoneEvent(8, end, 10, duration).serialize()
        packet = rtp(3 + i, ts, pt=101, payload=payload, marker=i == 0)
        session.receive_datagram(packet, REMOTE, 0.04 + i * 0.02)
    feed(session, [7, 8], t0=0.12)
    events = session.events_received()
    assert DtmfStarted("8", ts) in events
    assert [e for e in events if isinstance(e, DtmfReceived)] == [
        DtmfReceived("8", 40, 10, ts, ended=True)
    ]
    assert pops(session, 8) == [1, 2, None, None, None, None, 7, 8]
    assert session.counters().frames_lost == 0
    stats = session.reception_stats()
    assert (stats.expected, stats.received) == (8, 8)


def test_missing_dtmf_end_reported_by_timer() -> None:
    session = make(RtpSessionConfig(telephone_event_pt=101))
    payload = TelephoneEvent(1, False, 10, 160).serialize()
    session.receive_datagram(rtp(1, 800, pt=101, payload=payload), REMOTE, 1.0)
    session.events_received()
    assert session.next_deadline() == pytest.approx(1.5)
    session.handle_timer(1.5)
    assert DtmfReceived("1", 20, 10, 800, ended=False) in session.events_received()


# ---------------------------------------------------------------- RFC 3550 statistics


def rr_block(session: RtpSession, now: float) -> tuple[int, int, int, int]:
    session.handle_timer(now)
    datagrams = session.actions_to_send()
    assert len(datagrams) == 1 and isinstance(datagrams[0], SendDatagram)
    report = parse_rtcp(datagrams[0].data)[0]
    assert isinstance(report, RtcpReceiverReport | RtcpSenderReport)
    block = report.reports[0]
    return block.fraction_lost, block.cumulative_lost, block.highest_sequence, block.jitter


def test_loss_statistics_on_a_synthetic_pattern() -> None:
    session = make()
    # 100 packets from seq 65500 (wraps), every 10th lost: 90 received.
    seqs = [65500 + i for i in range(100) if i % 10 != 9]
    for seq in seqs:
        session.receive_datagram(rtp(seq), REMOTE, 0.02 * (seq - 65500))
    stats = session.reception_stats()
    assert (stats.expected, stats.received, stats.lost) == (99, 90, 9)  # highest is 65598
    assert stats.extended_highest_seq == 65500 + 98
    fraction, cumulative, highest, _ = rr_block(session, 2.5)
    assert (fraction, cumulative, highest) == ((9 << 8) // 99, 9, 65598)
    # Second interval: 20 more with 5 lost.
    seqs = [65599 + i for i in range(20) if i not in (2, 5, 8, 11, 14)]
    for seq in seqs:
        session.receive_datagram(rtp(seq), REMOTE, 3.0 + 0.02 * (seq - 65599))
    fraction, cumulative, highest, _ = rr_block(session, 7.5)
    assert (fraction, cumulative, highest) == ((5 << 8) // 20, 14, 65618)
    # Third interval: nothing new, nothing lost.
    assert rr_block(session, 12.5)[:2] == (0, 14)


def test_duplicates_make_cumulative_loss_negative_per_a3() -> None:
    session = make()
    feed(session, [1, 2, 2, 3])
    stats = session.reception_stats()
    assert (stats.expected, stats.received, stats.lost) == (3, 4, -1)


def test_interarrival_jitter() -> None:
    session = make()
    for seq in range(200):
        arrival = seq * 0.02 + (0.001 if seq % 2 else 0.0)  # 1 ms = 8 units, alternating
        session.receive_datagram(rtp(seq), REMOTE, 100.0 + arrival)
    assert session.reception_stats().jitter_ms == pytest.approx(1.0, abs=0.01)
    steady = make()
    for seq in range(50):
        steady.receive_datagram(rtp(seq), REMOTE, 100.0 + seq * 0.02)
    assert steady.reception_stats().jitter_ms == pytest.approx(0.0, abs=0.01)


def test_probation_and_resync_after_a_big_jump() -> None:
    session = make(RtpSessionConfig(min_sequential=2))
    feed(session, [100, 101, 102])
    assert session.counters().dropped_bad_sequence == 1  # probation ate the first
    session.receive_datagram(rtp(9000), REMOTE, 0.1)  # one stray jump: ignored
    assert session.counters().dropped_bad_sequence == 2
    session.receive_datagram(rtp(103), REMOTE, 0.12)
    session.receive_datagram(rtp(20000), REMOTE, 0.14)  # restart...
    session.receive_datagram(rtp(20001), REMOTE, 0.16)  # ...confirmed
    counters = session.counters()
    assert counters.sequence_resyncs == 1
    stats = session.reception_stats()
    assert (stats.expected, stats.received) == (1, 1)
    assert pops(session, 2) == [20001, None]  # the stale frames were flushed


# ---------------------------------------------------------------- RTCP


def test_first_report_at_half_interval_sr_with_sdes() -> None:
    session = make(RtpSessionConfig(cname="bot@callbridge", wallclock_offset_s=1000.0))
    assert session.next_deadline() == pytest.approx(2.5)
    for n in range(100):
        session.send_frame(PCMU, 0, n * 0.02, n)
    session.actions_to_send()
    session.handle_timer(2.5)
    (action,) = session.actions_to_send()
    assert isinstance(action, SendDatagram) and action.addr == (REMOTE[0], REMOTE[1] + 1)
    sr, sdes = parse_rtcp(action.data)
    assert isinstance(sr, RtcpSenderReport) and isinstance(sdes, RtcpSourceDescription)
    assert (sr.ssrc, sr.packet_count, sr.octet_count, sr.reports) == (0xCAFE0001, 100, 16000, ())
    # Last frame 99 went out at 1.98 s: 0.52 s later is 4160 units on.
    assert sr.rtp_timestamp == 1000 + 99 * 160 + 4160
    assert sr.ntp_timestamp >> 32 == 2_208_988_800 + 1002
    assert sdes.chunks[0].cname == "bot@callbridge" and sdes.chunks[0].ssrc == session.ssrc
    assert session.next_deadline() == pytest.approx(7.5)
    # Nothing sent since: the next report is an RR.
    session.handle_timer(7.5)
    (action,) = session.actions_to_send()
    assert isinstance(action, SendDatagram)
    assert isinstance(parse_rtcp(action.data)[0], RtcpReceiverReport)


def test_rtcp_mux_destination_and_demux() -> None:
    a = make(RtpSessionConfig(rtcp_mux=True))
    a.handle_timer(2.5)
    (action,) = a.actions_to_send()
    assert isinstance(action, SendDatagram) and action.addr == REMOTE
    rr = serialize_rtcp([RtcpReceiverReport(PEER_SSRC), RtcpBye((PEER_SSRC,), "done")])
    a.receive_datagram(rr, REMOTE, 3.0)
    assert a.events_received() == [RtcpByeReceived((PEER_SSRC,), "done")]
    assert a.counters().rtcp_received == 1 and a.counters().dropped_malformed == 0


def test_report_exchange_gives_loss_jitter_and_round_trip() -> None:
    """Two sessions facing each other over a fake link with 50 ms one-way delay."""
    a_addr, b_addr = ("10.0.0.1", 20000), ("10.0.0.2", 30000)
    a = RtpSession(RtpSessionConfig(), b_addr, 0.0, FixedRandom(ssrc=0xA))
    b = RtpSession(RtpSessionConfig(), a_addr, 0.0, FixedRandom(ssrc=0xB))
    for n in range(100):
        a.send_frame(PCMU, 0, n * 0.02, n)
    for i, action in enumerate(a.actions_to_send()):
        assert isinstance(action, SendDatagram)
        if i % 4 != 3:  # 25 % loss
            b.receive_datagram(action.data, a_addr, i * 0.02 + 0.05)
    a.handle_timer(2.5)  # A's SR
    (sr,) = a.actions_to_send()
    assert isinstance(sr, SendDatagram)
    b.receive_rtcp(sr.data, (a_addr[0], a_addr[1] + 1), 2.55)
    b.handle_timer(2.5 + 0.5)  # B's RR, 0.45 s after the SR arrived
    (rr,) = b.actions_to_send()
    assert isinstance(rr, SendDatagram) and rr.addr == (a_addr[0], a_addr[1] + 1)
    a.receive_rtcp(rr.data, (b_addr[0], b_addr[1] + 1), 3.05)
    (report,) = a.events_received()
    assert isinstance(report, RtcpReportReceived)
    assert report.fraction_lost == pytest.approx(24 / 99, abs=1 / 256)
    assert report.cumulative_lost == 24  # highest received is 98 (99 was lost)
    assert report.jitter_ms == pytest.approx(0.0, abs=0.2)
    assert report.round_trip_s == pytest.approx(0.1, abs=1e-4)


def test_rtcp_from_other_hosts_and_malformed_rtcp() -> None:
    session = make()
    session.receive_rtcp(serialize_rtcp([RtcpBye((1,))]), OTHER, 1.0)
    session.receive_rtcp(bytes.fromhex("81c9 0001 01020304"), (REMOTE[0], 1), 1.0)
    counters = session.counters()
    assert (counters.rtcp_wrong_source, counters.rtcp_malformed) == (1, 1)
    assert session.events_received() == []


def test_close_sends_bye_and_stops() -> None:
    session = make()
    session.send_frame(PCMU, 0, 0.0, 0)
    session.actions_to_send()
    session.close(1.0, "hangup")
    (action,) = session.actions_to_send()
    assert isinstance(action, SendDatagram)
    packets = parse_rtcp(action.data)
    assert isinstance(packets[0], RtcpSenderReport)
    assert packets[-1] == RtcpBye((session.ssrc,), "hangup")
    session.send_frame(PCMU, 0, 1.02, 1)
    assert session.actions_to_send() == [] and session.next_deadline() is None


# ---------------------------------------------------------------- timeout


def test_rtp_timeout_once_then_rearmed_by_traffic() -> None:
    config = RtpSessionConfig(timeout_s=30.0, rtcp_interval_s=1000.0)
    session = make(config)
    feed(session, [1, 2])
    session.events_received()
    assert session.next_deadline() == pytest.approx(30.02)
    session.handle_timer(30.0)
    assert session.events_received() == []
    session.handle_timer(30.02)
    (event,) = session.events_received()
    assert isinstance(event, RtpTimedOut) and event.idle_s == pytest.approx(30.0)
    session.handle_timer(45.0)
    assert session.events_received() == []
    session.receive_datagram(rtp(3), REMOTE, 50.0)
    assert session.next_deadline() == pytest.approx(80.0)


def test_hold_does_not_time_out() -> None:
    config = RtpSessionConfig(timeout_s=30.0, rtcp_interval_s=1000.0)
    session = make(config)
    session.set_direction("sendonly", 1.0)
    assert session.next_deadline() == pytest.approx(500.0)  # only RTCP
    session.handle_timer(100.0)
    assert not any(isinstance(e, RtpTimedOut) for e in session.events_received())
    session.set_direction("sendrecv", 200.0)  # unhold restarts the clock
    assert session.next_deadline() == pytest.approx(230.0)


def test_config_is_replaceable_and_defaults_sane() -> None:
    config = replace(RtpSessionConfig(), telephone_event_pt=101)
    assert config.timeout_s == 30.0 and config.jitter_depth_frames == 3
    assert config.telephone_event_pt == 101


# ---------------------------------------------------------------- robustness


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_garbage_never_raises_out_of_the_engine(datagrams: list[bytes]) -> None:
    session = make(RtpSessionConfig(latch=True, rtcp_mux=True, telephone_event_pt=101))
    for i, data in enumerate(datagrams):
        session.receive_datagram(data, OTHER if i % 2 else REMOTE, i * 0.02)
        session.receive_rtcp(data, REMOTE, i * 0.02)
        session.pop_frame(i * 0.02)
    session.handle_timer(100.0)
    session.events_received()
    counters = session.counters()
    assert counters.packets_received + counters.dropped_malformed <= 2 * len(datagrams)


@given(
    st.lists(st.tuples(st.integers(0, 65535), st.booleans()), min_size=1, max_size=20),
)
def test_any_arrival_order_plays_each_sequence_number_at_most_once(
    arrivals: list[tuple[int, bool]],
) -> None:
    # At most 20 packets of < 3000 steps each: no full sequence cycle, so no legitimate repeat.
    session = make(RtpSessionConfig(telephone_event_pt=101))
    played: list[int] = []
    for i, (seq, pop) in enumerate(arrivals):
        session.receive_datagram(rtp(seq), REMOTE, i * 0.02)
        if pop:
            frame = session.pop_frame(i * 0.02)
            if isinstance(frame, RtpFrame):
                played.append(frame.sequence_number)
    assert len(played) == len(set(played))


# ---------------------------------------------------------------- per-tick fast paths


def test_frame_packet_is_the_datagram_send_frame_queues() -> None:
    queued, direct = make(), make()
    for n, payload in enumerate([PCMU, PCMU, b"\x01" * 160]):
        if n == 2:
            queued.start_talkspurt()
            direct.start_talkspurt()
        queued.send_frame(payload, 0, n * 0.02, n)
        data = direct.frame_packet(payload, 0, n * 0.02, n)
        (action,) = queued.actions_to_send()
        assert isinstance(action, SendDatagram) and action.data == data
        assert action.addr == direct.remote_addr
    assert direct.actions_to_send() == []  # nothing queued: the shell sent it
    assert direct.counters() == queued.counters()
    direct.set_direction("recvonly", 1.0)
    assert direct.frame_packet(PCMU, 0, 1.0, 50) is None
    assert make(remote=None).frame_packet(PCMU, 0, 0.0, 0) is None


def test_receive_says_when_there_is_something_to_drain() -> None:
    session = make(RtpSessionConfig(latch=True, telephone_event_pt=101))
    assert session.receive_datagram(rtp(1), REMOTE, 0.0)  # latched + first SSRC
    session.events_received()
    assert not session.receive_datagram(rtp(2), REMOTE, 0.02)  # the common packet
    assert not session.receive_datagram(rtp(4), REMOTE, 0.04)  # a gap: still nothing
    assert not session.receive_datagram(rtp(3), REMOTE, 0.05)  # reordered
    assert not session.receive_datagram(rtp(5), OTHER, 0.06)  # dropped: other source
    assert not session.receive_datagram(b"\x00", REMOTE, 0.07)  # dropped: malformed
    assert session.events_received() == []
    assert session.receive_datagram(rtp(6, ssrc=0x55), REMOTE, 0.08)  # new SSRC
    (event,) = session.events_received()
    assert isinstance(event, SsrcChanged)
    end = TelephoneEvent(5, True, 10, 160).serialize()
    assert session.receive_datagram(rtp(7, pt=101, ssrc=0x55, payload=end), REMOTE, 0.1)
    assert any(isinstance(e, DtmfReceived) for e in session.events_received())


def test_in_order_fast_path_keeps_rfc3550_counts_across_a_wrap() -> None:
    session = make()
    feed(session, [65533, 65534, 65535, 0, 1, 2])
    stats = session.reception_stats()
    assert (stats.extended_highest_seq, stats.expected, stats.received) == (65536 + 2, 6, 6)
    assert pops(session, 6) == [65533, 65534, 65535, 0, 1, 2]


def test_poll_timer_runs_what_handle_timer_runs_when_due() -> None:
    config = RtpSessionConfig(timeout_s=30.0, telephone_event_pt=101)
    session = make(config)
    feed(session, [1, 2])
    session.events_received()
    assert not session.poll_timer(2.0)
    assert session.actions_to_send() == []
    assert session.poll_timer(2.5)  # the first RTCP report: half the 5 s interval
    (report,) = session.actions_to_send()
    assert isinstance(report, SendDatagram)
    assert not session.poll_timer(2.6)
    # a telephone-event packet arms its end timeout earlier than the next report
    start = TelephoneEvent(1, False, 10, 160).serialize()
    session.receive_datagram(rtp(3, 480, pt=101, payload=start), REMOTE, 3.0)
    session.events_received()
    assert not session.poll_timer(3.4)
    assert session.poll_timer(3.5)
    assert DtmfReceived("1", 20, 10, 480, ended=False) in session.events_received()


def test_poll_timer_sees_a_timeout_rearmed_by_traffic_or_unhold() -> None:
    config = RtpSessionConfig(timeout_s=3.0, rtcp_interval_s=1000.0)
    session = make(config)
    feed(session, [1])
    assert not session.poll_timer(1.0)
    assert session.poll_timer(3.0)
    assert any(isinstance(e, RtpTimedOut) for e in session.events_received())
    assert not session.poll_timer(4.0)  # timed out: only the far RTCP report is left
    session.receive_datagram(rtp(2), REMOTE, 5.0)  # traffic again: the timeout applies again
    assert not session.poll_timer(7.9)
    assert session.poll_timer(8.0)
    assert any(isinstance(e, RtpTimedOut) for e in session.events_received())
    session.set_direction("inactive", 9.0)
    assert not session.poll_timer(20.0)
    session.set_direction("sendrecv", 20.0)  # unhold restarts the timeout clock
    assert not session.poll_timer(22.9)
    assert session.poll_timer(23.0)
    assert any(isinstance(e, RtpTimedOut) for e in session.events_received())


@pytest.mark.parametrize(
    ("datagram", "payload"),
    [
        (bytes([0x80, 0]) + bytes(10) + PCMU, PCMU),  # the common header (fast path)
        (bytes([0x80, 0]) + bytes(10), b""),  # an empty payload is still a packet
        (bytes([0x81, 0]) + bytes(10) + b"\x00\x00\x00\x07" + PCMU, PCMU),  # one CSRC
        (bytes([0x90, 0]) + bytes(10) + b"\xbe\xde\x00\x01" + bytes(4) + PCMU, PCMU),  # ext.
        (bytes([0xA0, 0]) + bytes(10) + PCMU + b"\x00\x00\x03", PCMU),  # three padding bytes
        (bytes([0x80, 0]) + bytes(9), None),  # shorter than the fixed header
        (bytes([0x40, 0]) + bytes(10) + PCMU, None),  # version 1
        (bytes([0xC0, 0]) + bytes(10) + PCMU, None),  # version 3
        (bytes([0x82, 0]) + bytes(10) + b"\x00\x00\x00\x07", None),  # two CSRCs, one there
        (bytes([0xA0, 0]) + bytes(10) + PCMU[:-1] + b"\x00", None),  # a padding count of 0
    ],
)
def test_every_header_shape_is_parsed_as_the_packet_parser_does(
    datagram: bytes, payload: bytes | None
) -> None:
    session = make()
    session.receive_datagram(datagram, REMOTE, 0.0)
    counters = session.counters()
    if payload is None:
        assert (counters.dropped_malformed, counters.packets_received) == (1, 0)
        return
    assert (counters.dropped_malformed, counters.octets_received) == (0, len(payload))
    frame = session.pop_frame(1.0)
    assert isinstance(frame, RtpFrame) and frame.payload == payload

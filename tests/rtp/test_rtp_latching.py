"""Symmetric RTP for callers behind NAT: ``[sip] latching = "strict" | "learn"``.

Engine tests: time is a number each test passes in, packets are built here.
"""

from __future__ import annotations

import random

import pytest

from bridge.engine import SendDatagram
from bridge.rtp.packet import RtpPacket, build_rtp
from bridge.rtp.session import (
    LEARN_WINDOW_S,
    REBIND_PACKETS,
    LatchPolicy,
    RemoteLatched,
    RtpFrame,
    RtpSession,
    RtpSessionConfig,
    latch_policy,
    needs_learning,
)

PRIVATE_SDP = ("192.168.1.20", 4000)  # what the caller behind NAT wrote in its offer
NAT = ("203.0.113.7", 31000)  # where its packets really come from
REBOUND = ("203.0.113.7", 31544)  # the NAT's new mapping after a rebind
THIRD = ("198.51.100.66", 31000)  # somebody else
SIGNALLING = "203.0.113.7"
PEER_SSRC = 0x5EED0001
PCMU = b"\x7f" * 160


def rtp(seq: int, *, ssrc: int = PEER_SSRC, pt: int = 0) -> bytes:
    return build_rtp(pt, seq & 0xFFFF, (seq * 160) & 0xFFFFFFFF, ssrc, PCMU, False)


def session_for(mode: str, sdp: tuple[str, int] = PRIVATE_SDP, now: float = 0.0) -> RtpSession:
    policy = latch_policy(mode, sdp[0], SIGNALLING)  # type: ignore[arg-type]
    config = RtpSessionConfig(
        payload_types=frozenset({0}),
        telephone_event_pt=101,
        latch=True,
        latch_host=policy.latch_host,
        learn_window_s=policy.learn_window_s,
        rebind_packets=policy.rebind_packets,
        jitter_depth_frames=1,
    )
    return RtpSession(config, sdp, now, random.Random(5))


def latched(session: RtpSession) -> list[tuple[str, int]]:
    return [e.addr for e in session.events_received() if isinstance(e, RemoteLatched)]


def destinations(session: RtpSession, now: float, frame_index: int) -> list[tuple[str, int]]:
    session.send_frame(PCMU, 0, now, frame_index)
    out = []
    for action in session.actions_to_send():
        assert isinstance(action, SendDatagram)
        RtpPacket.parse(action.data)
        out.append(action.addr)
    return out


def test_policy_by_offer_and_signalling_source() -> None:
    assert needs_learning("192.168.1.20", SIGNALLING)
    assert needs_learning("10.0.0.1", None) and needs_learning("100.64.3.3", None)
    assert needs_learning("0.0.0.0", SIGNALLING) and needs_learning("::", None)
    assert needs_learning(None, SIGNALLING) and needs_learning("pbx.example.com", None)
    assert needs_learning("198.51.100.5", SIGNALLING)  # public, but not the signalling host
    assert not needs_learning(SIGNALLING, SIGNALLING)
    assert not needs_learning("198.51.100.5", None)
    assert latch_policy("strict", "192.168.1.20", SIGNALLING) == LatchPolicy("192.168.1.20", 0, 0)
    assert latch_policy("learn", "192.168.1.20", SIGNALLING) == LatchPolicy(
        "192.168.1.20", LEARN_WINDOW_S, REBIND_PACKETS
    )
    assert latch_policy("learn", SIGNALLING, SIGNALLING).learn_window_s == 0


def test_learn_mode_learns_the_nat_address_on_the_first_packet() -> None:
    session = session_for("learn")
    assert destinations(session, 0.0, 0) == [PRIVATE_SDP]  # the offer's address until then
    assert session.receive_datagram(rtp(1), NAT, 0.05)
    assert latched(session) == [NAT]
    assert destinations(session, 0.06, 1) == [NAT]  # our audio now reaches the caller
    session.receive_datagram(rtp(2), NAT, 0.07)
    frame = session.pop_frame(0.08)
    assert isinstance(frame, RtpFrame) and frame.sequence_number == 1
    assert session.counters().packets_received == 2


def test_strict_mode_never_learns_the_nat_address() -> None:
    session = session_for("strict")
    for seq in range(1, 6):
        session.receive_datagram(rtp(seq), NAT, 0.02 * seq)
    assert latched(session) == []
    assert session.counters().dropped_wrong_source == 5
    assert destinations(session, 0.2, 10) == [PRIVATE_SDP]


def test_learning_window_closes() -> None:
    session = session_for("learn")
    session.receive_datagram(rtp(1), NAT, LEARN_WINDOW_S)  # too late: only the SDP host now
    assert latched(session) == []
    assert session.counters().dropped_wrong_source == 1
    session.set_remote(PRIVATE_SDP, now=10.0)  # a new offer opens a new window
    session.receive_datagram(rtp(2), NAT, 10.5)
    assert latched(session) == [NAT]


def test_payload_type_mismatch_neither_learns_nor_counts_as_the_peer() -> None:
    session = session_for("learn")
    session.receive_datagram(rtp(1, pt=18), THIRD, 0.01)  # G.729: not negotiated
    session.receive_datagram(b"\x80\x00\x00", THIRD, 0.01)  # not RTP at all
    assert latched(session) == []
    session.receive_datagram(rtp(1), NAT, 0.02)
    assert latched(session) == [NAT]
    counters = session.counters()
    assert (counters.dropped_payload_type, counters.dropped_malformed) == (1, 1)


@pytest.mark.parametrize("mode", ["strict", "learn"])
def test_injection_from_a_third_address_is_refused(mode: str) -> None:
    session = session_for(mode, sdp=(SIGNALLING, 31000))
    session.receive_datagram(rtp(1), NAT, 0.0)
    assert latched(session) == [NAT]
    # the injector even knows the SSRC and the sequence, and the peer goes quiet
    for i in range(20):
        session.receive_datagram(rtp(2 + i), THIRD, 0.02 * (i + 1))
    assert latched(session) == []
    assert session.counters().dropped_wrong_source == 20
    assert destinations(session, 1.0, 50) == [NAT]


def test_nat_rebind_followed_after_five_packets_with_the_old_port_quiet() -> None:
    session = session_for("learn")
    for seq in range(1, 11):
        session.receive_datagram(rtp(seq), NAT, 0.02 * seq)
    assert latched(session) == [NAT]
    # the NAT moves the flow to a new port: same host, same SSRC, the sequence goes on
    first = 0.22
    for i in range(REBIND_PACKETS - 1):
        session.receive_datagram(rtp(11 + i), REBOUND, first + 0.02 * i)
        assert latched(session) == []
        assert destinations(session, first + 0.02 * i, 11 + i) == [NAT]
    at = first + 0.02 * (REBIND_PACKETS - 1)
    assert at - first < 0.1  # followed within 100 ms of the new port's first packet
    session.receive_datagram(rtp(11 + REBIND_PACKETS - 1), REBOUND, at)
    assert latched(session) == [REBOUND]
    assert destinations(session, at, 20) == [REBOUND]
    assert session.counters().source_rebinds == 1
    session.receive_datagram(rtp(30), NAT, at + 0.02)  # the old port is now the stranger
    assert session.counters().dropped_wrong_source == REBIND_PACKETS
    # strict mode never follows a rebind
    strict = session_for("strict", sdp=NAT)
    for seq in range(1, 11):
        strict.receive_datagram(rtp(seq), NAT, 0.02 * seq)
    for i in range(10):
        strict.receive_datagram(rtp(11 + i), REBOUND, 0.22 + 0.02 * i)
    assert latched(strict) == [NAT] and strict.counters().source_rebinds == 0


def test_rebind_refused_while_the_old_port_still_sends_or_the_stream_differs() -> None:
    session = session_for("learn")
    session.receive_datagram(rtp(1), NAT, 0.0)
    latched(session)
    now = 0.02
    seq = 2
    for _ in range(3 * REBIND_PACKETS):  # the peer keeps talking: a second flow is an intruder
        session.receive_datagram(rtp(seq), REBOUND, now)  # a copy of the stream, consecutive
        session.receive_datagram(rtp(seq), NAT, now + 0.01)
        seq += 1
        now += 0.02
    assert session.counters().packets_received == 1 + 3 * REBIND_PACKETS
    for i in range(2 * REBIND_PACKETS):  # another SSRC from the peer's host
        session.receive_datagram(rtp(seq + i, ssrc=0xBAD), REBOUND, now + 0.02 * i)
    now += 0.5
    for i in range(2 * REBIND_PACKETS):  # the right SSRC, but far off the sequence
        session.receive_datagram(rtp(seq + 20000 + i), REBOUND, now + 0.02 * i)
    now += 0.5
    for i in range(2 * REBIND_PACKETS):  # the right SSRC, sequence numbers not consecutive
        session.receive_datagram(rtp(seq + 2 * i), REBOUND, now + 0.02 * i)
    assert latched(session) == []
    assert session.counters().source_rebinds == 0
    assert destinations(session, now + 1, 99) == [NAT]

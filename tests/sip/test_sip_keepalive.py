"""RFC 5626 §4.4.1 CRLF keep-alive in the engine and the framer.

On every stream connection the shell opened itself (``flow_opened``) the user agent
sends a double-CRLF ping every ``keepalive_s`` times a jitter factor in 0.8-1.0 (from
the injected RNG), expects a single-CRLF pong within ``PONG_TIMEOUT_S`` and, when none
comes, asks for the connection to be dropped (``CloseStream(flow_failed=True)``). A ping
from the peer on any stream connection gets a pong. The framer counts both and never
takes them for garbage. Time is a number the test passes in.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bridge.engine import Action
from bridge.sip.events import CloseStream, RegistrationStateChanged, SendStream
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.settings import SipSettings
from bridge.sip.ua import REREGISTER_AFTER_DROP_S, SipUserAgent
from bridge.sip.ua_core import KEEPALIVE_JITTER, PING, PONG, PONG_TIMEOUT_S

TCP = SipSettings(local_host="192.0.2.10", local_port=5060, transport="TCP", session_expires_s=0)
PEER = ("198.51.100.5", 5060)
CONN = 4
INTERVAL_S = TCP.keepalive_s
LOW, HIGH = (INTERVAL_S * f for f in KEEPALIVE_JITTER)

OPTIONS = (
    b"OPTIONS sip:bot@192.0.2.10 SIP/2.0\r\n"
    b"Via: SIP/2.0/TCP 198.51.100.5:5060;branch=z9hG4bKka1;rport\r\n"
    b"Max-Forwards: 70\r\nFrom: <sip:peer@198.51.100.5>;tag=ka\r\n"
    b"To: <sip:bot@192.0.2.10>\r\nCall-ID: ka-1\r\nCSeq: 1 OPTIONS\r\n"
    b"Content-Length: 0\r\n\r\n"
)


def agent(settings: SipSettings = TCP, seed: int = 5) -> SipUserAgent:
    return SipUserAgent(settings, random.Random(seed))


def stream_bytes(actions: list[Action], conn_id: int = CONN) -> list[bytes]:
    out = []
    for action in actions:
        assert isinstance(action, SendStream) and action.conn_id == conn_id
        out.append(action.data)
    return out


def next_ping(ua: SipUserAgent, after: float) -> float:
    """Run the engine's timer until it sends a ping; the time it went out."""
    deadline = ua.next_deadline()
    assert deadline is not None and deadline > after
    ua.handle_timer(deadline)
    assert stream_bytes(ua.actions_to_send()) == [PING]
    return deadline


# --- the framer -----------------------------------------------------------------------


def test_framer_counts_pings_and_pongs_between_and_before_messages() -> None:
    framer = SipStreamFramer()
    data = PING + PONG + OPTIONS + PING + OPTIONS + PONG
    assert framer.feed(data) == [OPTIONS, OPTIONS]
    assert framer.take_keepalives() == (2, 2)
    assert framer.take_keepalives() == (0, 0)
    assert framer.buffered_bytes == 0


def test_framer_ping_split_across_reads_and_fed_one_byte_at_a_time() -> None:
    framer = SipStreamFramer()
    assert framer.feed(b"\r\n") == [] and framer.take_keepalives() == (0, 1)
    assert framer.feed(b"\r\n") == [] and framer.take_keepalives() == (1, 0)  # its other half
    data = PING + OPTIONS + PONG + PING + OPTIONS
    out: list[bytes] = []
    pings = pongs = 0
    for i in range(len(data)):
        out += framer.feed(data[i : i + 1])
        got = framer.take_keepalives()
        pings, pongs = pings + got[0], pongs + got[1]
    assert out == [OPTIONS, OPTIONS]
    # byte by byte every ping's first half looks like a pong until its second comes
    assert pings == 2 and pongs >= 1


def test_framer_after_our_ping_a_lone_crlf_is_its_pong() -> None:
    framer = SipStreamFramer()
    framer.feed(PONG)  # the pong to an earlier ping
    framer.expect_pong()  # we send another one
    framer.feed(PONG)
    assert framer.take_keepalives() == (0, 2)


def test_framer_stray_line_ends_are_not_garbage() -> None:
    framer = SipStreamFramer()
    assert framer.feed(b"\n\n\r" + b"\r\n" + OPTIONS) == [OPTIONS]


# --- pings on our connections -------------------------------------------------------------


def test_pings_go_out_with_jitter_and_a_pong_keeps_the_flow() -> None:
    ua = agent()
    ua.flow_opened(CONN, 0.0)
    assert ua.actions_to_send() == []
    sent = 0.0
    intervals = []
    for _ in range(20):
        at = next_ping(ua, sent)
        intervals.append(at - sent)
        assert ua.next_deadline() == at + PONG_TIMEOUT_S  # waiting for the pong
        ua.receive_stream(CONN, PONG, PEER, at + 0.05)
        assert ua.actions_to_send() == []
        sent = at
    assert all(LOW <= i <= HIGH for i in intervals), intervals
    assert len(set(intervals)) == len(intervals)  # drawn afresh each time
    assert ua.events_received() == []


def test_the_jitter_comes_from_the_injected_rng() -> None:
    def first_ping(seed: int) -> float | None:
        ua = agent(seed=seed)
        ua.flow_opened(CONN, 10.0)
        return ua.next_deadline()

    assert first_ping(1) == first_ping(1)
    assert first_ping(1) != first_ping(2)


def test_no_pong_fails_the_flow_and_its_registration_registers_again() -> None:
    ua = agent()
    rid = ua.register(PEER, "sip:198.51.100.5;transport=tcp", "sip:bot@198.51.100.5", 0.0,
                      conn_id=CONN)  # fmt: skip
    ua.flow_opened(CONN, 0.0)
    (data,) = stream_bytes(ua.actions_to_send())
    register = parse_message(data)
    assert isinstance(register, SipRequest)
    ok = build_response(register, 200, "OK", "reg")
    ok.add("Expires", "3600")
    ua.receive_stream(CONN, ok.to_bytes(), PEER, 0.1)
    assert ua.events_received() == [RegistrationStateChanged(rid, True, 200, 3600)]
    ua.handle_timer(0.1)  # Timer K
    at = next_ping(ua, 0.1)
    ua.handle_timer(at + PONG_TIMEOUT_S - 0.01)
    assert ua.actions_to_send() == []  # not yet
    ua.receive_stream(CONN, PING, PEER, at + 1.0)  # their ping is no pong to ours
    assert stream_bytes(ua.actions_to_send()) == [PONG]
    assert ua.next_deadline() == at + PONG_TIMEOUT_S
    ua.handle_timer(at + PONG_TIMEOUT_S)
    assert ua.actions_to_send() == [CloseStream(CONN, flow_failed=True)]
    # the shell drops the connection and reports it, as for any drop
    now = at + PONG_TIMEOUT_S
    ua.connection_lost(CONN)
    ua.connection_failed(CONN, now)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert ua.next_deadline() == now + REREGISTER_AFTER_DROP_S  # no ping on a lost flow
    ua.handle_timer(now + REREGISTER_AFTER_DROP_S)
    (again,) = stream_bytes(ua.actions_to_send())  # on the same conn_id: the shell reopens
    ua.flow_opened(CONN, now + 1.5)  # open again: pinged again
    register = parse_message(again)
    assert isinstance(register, SipRequest) and register.method == "REGISTER"
    ok = build_response(register, 200, "OK", "reg")
    ok.add("Expires", "3600")
    ua.receive_stream(CONN, ok.to_bytes(), PEER, now + 1.6)
    ua.handle_timer(now + 1.6)  # Timer K
    deadline = ua.next_deadline()
    assert deadline is not None and now + 1.5 + LOW <= deadline <= now + 1.5 + HIGH


def test_a_late_ping_waits_for_the_pong_and_an_interval_below_the_pong_timeout() -> None:
    ua = agent(replace(TCP, keepalive_s=2.0))
    ua.flow_opened(CONN, 0.0)
    at = next_ping(ua, 0.0)
    assert ua.next_deadline() == at + PONG_TIMEOUT_S  # no second ping while one waits
    ua.receive_stream(CONN, PONG, PEER, at + 5.0)
    deadline = ua.next_deadline()
    assert deadline is not None and deadline < at + 5.0  # overdue: it goes at once
    ua.handle_timer(at + 5.0)
    assert stream_bytes(ua.actions_to_send()) == [PING]


def test_no_pings_when_disabled_on_udp_or_on_connections_peers_opened() -> None:
    off = agent(replace(TCP, keepalive_s=0.0))
    off.flow_opened(CONN, 0.0)
    assert off.next_deadline() is None
    udp = agent(replace(TCP, transport="UDP"))
    udp.flow_opened(CONN, 0.0)
    assert udp.next_deadline() is None
    inbound = agent()
    inbound.receive_stream(9, OPTIONS, PEER, 0.0)  # a connection a peer opened to us
    answers = [parse_message(d) for d in stream_bytes(inbound.actions_to_send(), 9)]
    assert [type(m) for m in answers] == [SipResponse]
    for now in (0.0, 100.0, 1000.0, 10000.0):
        inbound.handle_timer(now)
        assert inbound.actions_to_send() == []
    assert inbound.next_deadline() is None


def test_a_ping_from_a_peer_gets_one_pong_on_any_stream_connection() -> None:
    ua = agent()
    ua.receive_stream(9, PING, PEER, 0.0)  # inbound: never pinged by us, answered still
    assert stream_bytes(ua.actions_to_send(), 9) == [PONG]
    ua.receive_stream(9, PING + PING + PING, PEER, 0.1)
    assert stream_bytes(ua.actions_to_send(), 9) == [PONG]  # two CRLFs would read as a ping
    ua.receive_stream(9, PONG, PEER, 0.2)  # a pong we did not ask for: nothing
    assert ua.actions_to_send() == []
    ua.receive_stream(9, PING + OPTIONS, PEER, 0.3)
    sent = stream_bytes(ua.actions_to_send(), 9)
    assert sent[0] == PONG and isinstance(parse_message(sent[1]), SipResponse)
    ua.flow_opened(CONN, 0.0)  # ours too
    ua.receive_stream(CONN, PING, PEER, 1.0)
    assert stream_bytes(ua.actions_to_send()) == [PONG]


def test_a_closed_connection_stops_its_pings() -> None:
    ua = agent()
    ua.flow_opened(CONN, 0.0)
    ua.flow_opened(CONN + 1, 0.0)
    ua.connection_lost(CONN)
    deadline = ua.next_deadline()
    assert deadline is not None
    ua.handle_timer(deadline)
    assert stream_bytes(ua.actions_to_send(), CONN + 1) == [PING]
    ua.receive_stream(CONN + 1, b"garbage\r\n\r\n", PEER, deadline + 0.1)  # broken framing
    assert ua.actions_to_send() == [CloseStream(CONN + 1)]
    assert ua.next_deadline() is None


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_a_pong_split_or_glued_to_a_message_still_counts(chunk: int) -> None:
    ua = agent()
    ua.flow_opened(CONN, 0.0)
    at = next_ping(ua, 0.0)
    data = PONG + OPTIONS
    for i in range(0, len(data), chunk):
        ua.receive_stream(CONN, data[i : i + chunk], PEER, at + 1.0)
    (answer,) = stream_bytes(ua.actions_to_send())
    assert isinstance(parse_message(answer), SipResponse)
    ua.handle_timer(at + PONG_TIMEOUT_S)
    assert ua.actions_to_send() == []  # the pong came: the flow lives

"""RFC 3263 §4.3 in the engine: a call out given further servers tries the next one when
the current one answers 503, its connection fails, or the INVITE times out (before any
early dialog), as a new transaction: CSeq+1, a new branch, the same Call-ID and From tag.
Time is a number; nothing sleeps."""

from __future__ import annotations

import random

from bridge.engine import SendDatagram
from bridge.sip.dialog import Peer
from bridge.sip.events import (
    OutboundCallFailed,
    OutboundCallRetried,
    SendStream,
)
from bridge.sip.message import SipRequest, build_response, parse_message
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

SETTINGS = SipSettings(local_host="127.0.0.1", session_expires_s=0)
TARGET = "sip:bob@service.example.com"
FIRST = ("192.0.2.1", 5070)
SECOND = ("192.0.2.2", 5080)
THIRD = ("192.0.2.3", 5090)


def _sent(ua: SipUserAgent) -> list[tuple[tuple[str, int], SipRequest]]:
    out = []
    for action in ua.actions_to_send():
        if isinstance(action, SendDatagram):
            message = parse_message(action.data)
            if isinstance(message, SipRequest):
                out.append((action.addr, message))
    return out


def _invites(ua: SipUserAgent) -> list[tuple[tuple[str, int], SipRequest]]:
    return [(a, r) for a, r in _sent(ua) if r.method == "INVITE"]


def test_a_503_sends_the_invite_to_the_next_server_then_the_call_fails_at_the_last() -> None:
    ua = SipUserAgent(SETTINGS, random.Random(1))
    call_id = ua.invite(TARGET, "sip:a@x", "", FIRST, 0.0, alternates=(Peer(SECOND), Peer(THIRD)))
    [(addr, first)] = _invites(ua)
    assert addr == FIRST
    ua.receive_datagram(
        build_response(first, 503, "Service Unavailable", "t1").to_bytes(), FIRST, 0.1
    )
    assert ua.events_received() == [OutboundCallRetried(call_id, 503, SECOND)]
    invites = _invites(ua)
    assert [a for a, _ in invites] == [SECOND]
    second = invites[0][1]
    assert second.call_id == first.call_id and second.from_().tag == first.from_().tag
    assert second.cseq().number == 2 and second.uri == TARGET
    assert second.top_via().branch != first.top_via().branch
    # the last server's 503 ends the call (after the third)
    ua.receive_datagram(build_response(second, 503, "Busy", "t2").to_bytes(), SECOND, 0.2)
    assert ua.events_received() == [OutboundCallRetried(call_id, 503, THIRD)]
    [(addr, third)] = _invites(ua)
    assert addr == THIRD
    ua.receive_datagram(build_response(third, 503, "Busy", "t3").to_bytes(), THIRD, 0.3)
    events = ua.events_received()
    assert [type(e) for e in events] == [OutboundCallFailed]
    assert isinstance(events[0], OutboundCallFailed) and events[0].status == 503


def test_a_timeout_tries_the_next_server_and_other_failures_do_not() -> None:
    ua = SipUserAgent(SETTINGS, random.Random(2))
    call_id = ua.invite(TARGET, "sip:a@x", "", FIRST, 0.0, alternates=(Peer(SECOND),))
    sent = _invites(ua)
    now = 0.0
    while not (events := ua.events_received()):  # Timer B (64*T1 = 32 s)
        deadline = ua.next_deadline()
        assert deadline is not None and deadline < 100.0
        now = deadline
        ua.handle_timer(now)
        sent += _invites(ua)
    assert events == [OutboundCallRetried(call_id, 408, SECOND)]
    assert 32.0 <= now < 33.0
    # retransmissions to the first server (Timer A), then one INVITE to the next
    assert {a for a, _ in sent[:-1]} == {FIRST} and len(sent) > 2
    addr, invite = sent[-1]
    assert addr == SECOND and invite.cseq().number == 2
    # a 486 is the callee's answer, not a server failure: the call ends
    ua.receive_datagram(build_response(invite, 486, "Busy Here", "t").to_bytes(), SECOND, now)
    events = ua.events_received()
    assert [type(e) for e in events] == [OutboundCallFailed]


def test_no_next_server_after_an_early_dialog() -> None:
    ua = SipUserAgent(SETTINGS, random.Random(3))
    ua.invite(TARGET, "sip:a@x", "", FIRST, 0.0, alternates=(Peer(SECOND),))
    [(_, invite)] = _invites(ua)
    ua.receive_datagram(build_response(invite, 180, "Ringing", "t").to_bytes(), FIRST, 0.1)
    ua.events_received()
    ua.receive_datagram(build_response(invite, 503, "Gone", "t").to_bytes(), FIRST, 0.2)
    assert [type(e) for e in ua.events_received()] == [OutboundCallFailed]
    assert _invites(ua) == []


def test_a_failed_connection_moves_the_call_to_the_next_servers_connection() -> None:
    settings = SipSettings(local_host="127.0.0.1", session_expires_s=0, transport="TCP")
    ua = SipUserAgent(settings, random.Random(4))
    call_id = ua.invite(
        "sip:bob@service.example.com;transport=tcp",
        "sip:a@x",
        "",
        FIRST,
        0.0,
        conn_id=1,
        alternates=(Peer(SECOND, 2),),
    )
    assert [a.conn_id for a in ua.actions_to_send() if isinstance(a, SendStream)] == [1]
    ua.connection_lost(1)
    ua.connection_failed(1, 0.5)
    assert ua.events_received() == [OutboundCallRetried(call_id, 503, SECOND)]
    sent = [a for a in ua.actions_to_send() if isinstance(a, SendStream)]
    assert [a.conn_id for a in sent] == [2]
    assert sent[0].data.startswith(b"INVITE ")
    ua.connection_lost(2)
    ua.connection_failed(2, 0.6)
    events = ua.events_received()
    assert [type(e) for e in events] == [OutboundCallFailed]

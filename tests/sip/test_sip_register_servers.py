"""A registrar with several servers (RFC 3263 §4.3) in the engine: a REGISTER that fails
at one server (503, a timeout, a connection that cannot be opened) goes at once to the
next; once every server has failed, the retry waits and starts from the first; a binding
that is up stays on its server until a refresh there fails. Time is a number the test
passes in.
"""

from __future__ import annotations

import random

from bridge.engine import SendDatagram
from bridge.sip.dialog import Peer
from bridge.sip.events import RegistrationRetried, RegistrationStateChanged
from bridge.sip.message import SipRequest, build_response, parse_message
from bridge.sip.registration import FAILURE_RETRY_S
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

SETTINGS = SipSettings(local_host="192.0.2.10", local_port=5060)
FIRST, SECOND, THIRD = ("198.51.100.5", 5060), ("198.51.100.6", 5060), ("198.51.100.7", 5070)


def sent(ua: SipUserAgent) -> list[tuple[tuple[str, int], SipRequest]]:
    """The REGISTERs sent since the last look, with where each went."""
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipRequest) and message.method == "REGISTER"
        out.append((action.addr, message))
    return out


def answer(request: SipRequest, status: int, expires: int = 600) -> bytes:
    response = build_response(request, status, "OK" if status < 300 else "Nope", "reg")
    if status < 300:
        response.add("Expires", str(expires))
    return response.to_bytes()


def registering() -> tuple[SipUserAgent, str, SipRequest]:
    ua = SipUserAgent(SETTINGS, random.Random(11))
    rid = ua.register(
        FIRST,
        "sip:carrier.test",
        "sip:bot@carrier.test",
        0.0,
        alternates=[Peer(SECOND), Peer(THIRD)],
    )
    ((addr, first),) = sent(ua)
    assert addr == FIRST
    return ua, rid, first


def test_a_503_moves_the_register_to_the_next_server_at_once_and_it_stays_there() -> None:
    ua, rid, first = registering()
    ua.receive_datagram(answer(first, 503), FIRST, 0.1)
    assert ua.events_received() == [RegistrationRetried(rid, 503, SECOND)]
    ((addr, second),) = sent(ua)
    assert addr == SECOND
    assert second.call_id == first.call_id and second.cseq().number == first.cseq().number + 1
    ua.receive_datagram(answer(second, 200), SECOND, 0.2)
    assert ua.events_received() == [RegistrationStateChanged(rid, True, 200, 600)]
    ua.handle_timer(300.2)  # the refresh, at half the granted time, to the same server
    ((addr, refresh),) = [s for s in sent(ua) if s[1].cseq().number > second.cseq().number]
    assert addr == SECOND and refresh.call_id == first.call_id


def test_every_server_failing_waits_the_retry_then_starts_from_the_first() -> None:
    ua, rid, first = registering()
    # no answer at all from the first: Timer F (64*T1) fails its transaction
    timer_f = SETTINGS.timers.timeout_s
    now, out = 0.0, []
    while now < timer_f:
        now = min(timer_f, ua.next_deadline() or timer_f)
        ua.handle_timer(now)
        out += sent(ua)
    assert ua.events_received() == [RegistrationRetried(rid, 408, SECOND)]
    *retransmissions, (addr, second) = out
    assert retransmissions and {a for a, _ in retransmissions} == {FIRST}
    assert addr == SECOND
    ua.receive_datagram(answer(second, 503), SECOND, now + 0.1)
    assert ua.events_received() == [RegistrationRetried(rid, 503, THIRD)]
    ((addr, third),) = sent(ua)
    assert addr == THIRD
    ua.receive_datagram(answer(third, 503), THIRD, now + 0.2)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert sent(ua) == []  # no loop round the servers
    retry_at = now + 0.2 + FAILURE_RETRY_S
    deadline = ua.next_deadline()
    assert deadline is not None and deadline <= retry_at
    while (deadline := ua.next_deadline()) is not None and deadline < retry_at:
        ua.handle_timer(deadline)  # the transactions' own timers (Timer K)
        assert sent(ua) == []
    ua.handle_timer(retry_at)
    ((addr, again),) = sent(ua)
    assert addr == FIRST and again.call_id == first.call_id


def test_a_refresh_that_fails_moves_an_up_binding_to_the_next_server() -> None:
    ua, rid, first = registering()
    ua.receive_datagram(answer(first, 200, expires=120), FIRST, 0.1)
    assert ua.events_received() == [RegistrationStateChanged(rid, True, 200, 120)]
    ua.handle_timer(60.1)
    ((addr, refresh),) = [s for s in sent(ua) if s[1].cseq().number > first.cseq().number]
    assert addr == FIRST
    ua.receive_datagram(answer(refresh, 503), FIRST, 60.2)
    assert ua.events_received() == [
        RegistrationStateChanged(rid, False, 503),
        RegistrationRetried(rid, 503, SECOND),
    ]
    ((addr, moved),) = sent(ua)
    assert addr == SECOND and moved.cseq().number == refresh.cseq().number + 1


def test_other_failures_and_removals_stay_on_the_server() -> None:
    ua, rid, first = registering()
    ua.receive_datagram(answer(first, 403), FIRST, 0.1)  # refused: another server says the same
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 403)]
    assert sent(ua) == []
    ua.handle_timer(0.1 + FAILURE_RETRY_S)
    ((addr, again),) = [s for s in sent(ua) if s[1].cseq().number > first.cseq().number]
    assert addr == FIRST
    ua.receive_datagram(answer(again, 200), FIRST, 61.0)
    ua.events_received()
    ua.unregister(rid, 62.0)
    ((addr, removal),) = [s for s in sent(ua) if s[1].get("expires") == "0"]
    ua.receive_datagram(answer(removal, 503), FIRST, 62.1)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert [a for a, _ in sent(ua)] == []  # a removal is not moved to another server


def test_a_connection_that_cannot_be_opened_moves_to_the_next_server() -> None:
    """Over TCP each server has its own connection (the shell reserved one for each)."""
    ua = SipUserAgent(SipSettings(local_host="192.0.2.10", local_port=5060, transport="TCP"))
    rid = ua.register(
        FIRST, "sip:carrier.test;transport=tcp", "sip:bot@carrier.test", 0.0, conn_id=1,
        alternates=[Peer(SECOND, 2)],
    )  # fmt: skip
    assert [a.conn_id for a in ua.actions_to_send()] == [1]  # type: ignore[attr-defined]
    ua.connection_failed(1, 0.5)
    assert ua.events_received() == [RegistrationRetried(rid, 503, SECOND)]
    assert [a.conn_id for a in ua.actions_to_send()] == [2]  # type: ignore[attr-defined]

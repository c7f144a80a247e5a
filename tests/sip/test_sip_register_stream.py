"""REGISTER over a stream connection (TCP, TLS) in the engine: every REGISTER of a
registration goes on its connection, and when the shell reports the connection lost
the registration registers again (soon if its binding was up, after the failure
retry if it never was). Time is a number the test passes in.
"""

from __future__ import annotations

import random
from dataclasses import replace

from bridge.sip.events import RegistrationStateChanged, SendStream
from bridge.sip.message import SipRequest, build_response, parse_message
from bridge.sip.registration import FAILURE_RETRY_S
from bridge.sip.settings import SipSettings
from bridge.sip.ua import REREGISTER_AFTER_DROP_S, SipUserAgent

SETTINGS = SipSettings(local_host="192.0.2.10", local_port=5061, transport="TLS")
REGISTRAR = ("198.51.100.5", 5061)
CONN = 3


def registers(ua: SipUserAgent) -> list[SipRequest]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendStream) and action.conn_id == CONN
        message = parse_message(action.data)
        assert isinstance(message, SipRequest) and message.method == "REGISTER"
        out.append(message)
    return out


def ok(request: SipRequest, expires: int = 600) -> bytes:
    response = build_response(request, 200, "OK", "reg")
    response.add("Expires", str(expires))
    return response.to_bytes()


def registered() -> tuple[SipUserAgent, str, SipRequest]:
    ua = SipUserAgent(SETTINGS, random.Random(7))
    rid = ua.register(REGISTRAR, "sips:198.51.100.5", "sip:bot@198.51.100.5", 0.0, conn_id=CONN)
    (first,) = registers(ua)
    assert first.get("contact") == "<sips:callbridge@192.0.2.10:5061>"
    assert (first.get("via") or "").startswith("SIP/2.0/TLS 192.0.2.10:5061;")
    ua.receive_stream(CONN, ok(first), REGISTRAR, 0.1)
    assert ua.events_received() == [RegistrationStateChanged(rid, True, 200, 600)]
    ua.handle_timer(0.1)  # Timer K (zero on a reliable transport) ends the transaction
    return ua, rid, first


def test_a_registration_refreshes_on_its_connection() -> None:
    ua, _, first = registered()
    assert ua.next_deadline() == 300.1  # half the granted 600 s
    ua.handle_timer(300.1)
    (refresh,) = registers(ua)
    assert refresh.cseq().number == first.cseq().number + 1
    assert refresh.call_id == first.call_id


def test_a_lost_connection_registers_again_soon_and_then_waits_if_it_fails_again() -> None:
    ua, rid, first = registered()
    ua.connection_failed(CONN, 10.0)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert ua.next_deadline() == 10.0 + REREGISTER_AFTER_DROP_S
    ua.handle_timer(10.0 + REREGISTER_AFTER_DROP_S)
    (again,) = registers(ua)  # on the same conn_id: the shell opens it again
    assert again.cseq().number == first.cseq().number + 1
    # the registrar cannot be reached now: the waiting REGISTER is abandoned and the
    # registration waits the failure retry (no loop of connection attempts)
    ua.connection_failed(CONN, 11.5)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert ua.unanswered_requests("register") == 0
    assert ua.next_deadline() == 11.5 + FAILURE_RETRY_S
    ua.receive_stream(CONN, ok(again), REGISTRAR, 12.0)  # an answer for it is stale now
    assert ua.events_received() == []


def test_another_connection_lost_leaves_the_registration_alone() -> None:
    ua, _, _ = registered()
    ua.connection_failed(CONN + 1, 10.0)
    assert ua.events_received() == [] and ua.next_deadline() == 300.1


def test_a_first_register_whose_connection_fails_retries_later() -> None:
    ua = SipUserAgent(replace(SETTINGS, transport="TCP"), random.Random(8))
    rid = ua.register(REGISTRAR, "sip:198.51.100.5;transport=tcp", "sip:bot@x", 0.0, conn_id=CONN)
    (first,) = registers(ua)
    assert first.get("contact") == "<sip:callbridge@192.0.2.10:5061;transport=tcp>"
    ua.connection_failed(CONN, 0.2)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    assert ua.next_deadline() == 0.2 + FAILURE_RETRY_S

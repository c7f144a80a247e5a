"""Transaction timers with plain numbers (RFC 3261 §17, RFC 6026)."""

from __future__ import annotations

import itertools

from bridge.engine import Action
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.settings import TimerSettings
from bridge.sip.transaction import (
    ClientTransaction,
    ResponseReceived,
    ServerTransaction,
    State,
    TransactionTerminated,
    TransactionTimedOut,
    TransmitMessage,
)

TIMERS = TimerSettings()


def request(method: str = "INVITE") -> SipRequest:
    text = (
        f"{method} sip:bob@192.0.2.2 SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKtx1;rport\r\n"
        "Route: <sip:proxy.example.com;lr>\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:alice@192.0.2.1>;tag=a1\r\n"
        "To: <sip:bob@192.0.2.2>\r\n"
        "Call-ID: tx-test-1\r\n"
        f"CSeq: 7 {method}\r\n"
        "Contact: <sip:alice@192.0.2.1>\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    message = parse_message(text.encode())
    assert isinstance(message, SipRequest)
    return message


def response(req: SipRequest, status: int) -> SipResponse:
    return build_response(req, status, "X", to_tag="b2" if status > 100 else None)


def sent(actions: list[Action]) -> list[str]:
    out = []
    for action in actions:
        assert isinstance(action, TransmitMessage)
        message = action.message
        out.append(message.method if isinstance(message, SipRequest) else str(status_of(message)))
    return out


def status_of(message: object) -> int:
    assert isinstance(message, SipResponse)
    return message.status


def state(tx: ClientTransaction | ServerTransaction) -> State:
    """Read the state through a call so that type narrowing does not stick."""
    return tx.state


def run_timers(tx: ClientTransaction | ServerTransaction, until: float) -> list[float]:
    """Advance time deadline by deadline; return the times something was sent."""
    times = []
    while (deadline := tx.next_deadline()) is not None and deadline <= until:
        tx.handle_timer(deadline)
        if tx.actions_to_send():
            times.append(deadline)
    return times


def test_invite_client_retransmits_at_a_and_times_out_at_b() -> None:
    tx = ClientTransaction(request(), TIMERS, reliable=False)
    tx.start(0.0)
    assert sent(tx.actions_to_send()) == ["INVITE"]
    assert tx.next_deadline() == 0.5
    times = run_timers(tx, until=100.0)
    assert times == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    events = tx.events_received()
    assert events == [TransactionTimedOut("B"), TransactionTerminated()]
    assert state(tx) is State.TERMINATED
    assert tx.next_deadline() is None


def test_invite_client_timer_b_is_64_t1_with_custom_t1() -> None:
    tx = ClientTransaction(request(), TimerSettings(t1_s=0.1), reliable=False)
    tx.start(10.0)
    tx.actions_to_send()
    run_timers(tx, until=100.0)
    assert tx.events_received()[0] == TransactionTimedOut("B")
    tx2 = ClientTransaction(request(), TimerSettings(t1_s=0.1), reliable=False)
    tx2.start(10.0)
    tx2.handle_timer(16.39)
    assert state(tx2) is State.CALLING
    tx2.handle_timer(16.4)
    assert state(tx2) is State.TERMINATED


def test_invite_client_provisional_stops_retransmits_then_non_2xx_acks() -> None:
    req = request()
    tx = ClientTransaction(req, TIMERS, reliable=False)
    tx.start(0.0)
    tx.actions_to_send()
    tx.handle_timer(0.5)
    assert sent(tx.actions_to_send()) == ["INVITE"]
    tx.receive_response(response(req, 180), 0.7)
    assert state(tx) is State.PROCEEDING and tx.next_deadline() is None
    assert [type(e) for e in tx.events_received()] == [ResponseReceived]
    tx.receive_response(response(req, 486), 2.0)
    assert sent(tx.actions_to_send()) == ["ACK"]
    ack = tx.last_ack
    assert ack is not None
    assert ack.uri == req.uri and ack.cseq().number == 7 and ack.cseq().method == "ACK"
    assert ack.top_via().branch == "z9hG4bKtx1" and ack.to().tag == "b2"
    assert ack.get("route") == "<sip:proxy.example.com;lr>"
    assert tx.next_deadline() == 34.0  # Timer D = 32 s on UDP
    # A retransmitted final is re-ACKed and not passed up again.
    tx.events_received()
    tx.receive_response(response(req, 486), 3.0)
    assert sent(tx.actions_to_send()) == ["ACK"]
    assert tx.events_received() == []
    tx.handle_timer(34.0)
    assert tx.events_received() == [TransactionTerminated()]


def test_invite_client_2xx_goes_to_accepted_and_passes_retransmissions() -> None:
    req = request()
    tx = ClientTransaction(req, TIMERS, reliable=False)
    tx.start(0.0)
    tx.receive_response(response(req, 200), 0.2)
    tx.receive_response(response(req, 200), 0.7)
    assert state(tx) is State.ACCEPTED
    assert sent(tx.actions_to_send()) == ["INVITE"]  # no ACK from the transaction for 2xx
    assert len([e for e in tx.events_received() if isinstance(e, ResponseReceived)]) == 2
    assert tx.next_deadline() == 0.2 + 32.0  # Timer M


def test_reliable_transport_never_retransmits_and_waits_zero() -> None:
    req = request()
    tx = ClientTransaction(req, TIMERS, reliable=True)
    tx.start(0.0)
    assert tx.next_deadline() == 32.0
    tx.receive_response(response(req, 404), 1.0)
    assert sent(tx.actions_to_send()) == ["INVITE", "ACK"]
    assert tx.next_deadline() == 1.0  # Timer D = 0
    nit = ClientTransaction(request("OPTIONS"), TIMERS, reliable=True)
    nit.start(0.0)
    nit.receive_response(response(nit.request, 200), 0.1)
    assert nit.next_deadline() == 0.1  # Timer K = 0


def test_non_invite_client_timer_e_caps_at_t2_and_f_times_out() -> None:
    tx = ClientTransaction(request("OPTIONS"), TIMERS, reliable=False)
    tx.start(0.0)
    tx.actions_to_send()
    times = run_timers(tx, until=100.0)
    assert times[:6] == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5]
    assert all(b - a == 4.0 for a, b in itertools.pairwise(times[4:]))
    assert tx.events_received()[0] == TransactionTimedOut("F")


def test_non_invite_client_proceeding_retransmits_every_t2_then_k() -> None:
    req = request("BYE")
    tx = ClientTransaction(req, TIMERS, reliable=False)
    tx.start(0.0)
    tx.receive_response(response(req, 100), 0.1)
    assert state(tx) is State.PROCEEDING
    tx.handle_timer(0.5)
    assert tx.next_deadline() == 4.5
    tx.receive_response(response(req, 200), 5.0)
    assert state(tx) is State.COMPLETED
    assert tx.next_deadline() == 10.0  # Timer K = T4


def test_invite_server_absorbs_retransmits_and_timer_g_caps_at_t2_until_h() -> None:
    req = request()
    tx = ServerTransaction(req, TIMERS, reliable=False)
    tx.respond(response(req, 100), 0.0)
    tx.receive_request(req, 0.3)  # retransmitted INVITE -> resend the 100
    assert sent(tx.actions_to_send()) == ["100", "100"]
    tx.respond(response(req, 486), 1.0)
    tx.actions_to_send()
    times = run_timers(tx, until=1000.0)
    assert times[:5] == [1.5, 2.5, 4.5, 8.5, 12.5]
    assert times[-1] < 33.0
    assert tx.events_received() == [TransactionTimedOut("H"), TransactionTerminated()]


def test_invite_server_ack_confirms_then_timer_i() -> None:
    req = request()
    tx = ServerTransaction(req, TIMERS, reliable=False)
    tx.respond(response(req, 603), 0.0)
    ack = request("ACK")
    assert tx.receive_request(ack, 0.2) is False
    assert state(tx) is State.CONFIRMED
    assert tx.next_deadline() == 5.2  # Timer I = T4
    tx.receive_request(ack, 0.3)  # absorbed
    tx.receive_request(req, 0.4)  # INVITE retransmission in CONFIRMED: absorbed
    assert sent(tx.actions_to_send()) == ["603"]
    tx.handle_timer(5.2)
    assert state(tx) is State.TERMINATED


def test_invite_server_2xx_goes_to_accepted_for_timer_l() -> None:
    req = request()
    tx = ServerTransaction(req, TIMERS, reliable=False)
    tx.respond(response(req, 200), 0.0)
    assert state(tx) is State.ACCEPTED and tx.next_deadline() == 32.0
    tx.receive_request(req, 0.5)  # INVITE retransmission absorbed, not resent
    assert sent(tx.actions_to_send()) == ["200"]
    tx.respond(response(req, 200), 0.5)  # the TU's 2xx retransmission passes through
    assert sent(tx.actions_to_send()) == ["200"]


def test_non_invite_server_resends_final_and_timer_j() -> None:
    req = request("OPTIONS")
    tx = ServerTransaction(req, TIMERS, reliable=False)
    tx.receive_request(req, 0.0)  # in TRYING: discarded
    assert tx.actions_to_send() == []
    tx.respond(response(req, 200), 0.1)
    tx.receive_request(req, 0.6)
    assert sent(tx.actions_to_send()) == ["200", "200"]
    assert tx.next_deadline() == 32.1
    tcp = ServerTransaction(req, TIMERS, reliable=True)
    tcp.respond(response(req, 200), 0.1)
    assert tcp.next_deadline() == 0.1

"""Floods of OPTIONS and other non-INVITE requests keep a bounded number of
server transactions (issue 33; the rule is in ``bridge.sip.ua_core``).

Time is a number passed in; each test sends the flood, then checks how many
transactions are kept, that every request was still answered, that the ones
kept absorb their retransmissions, and that a call from elsewhere is offered.
"""

from __future__ import annotations

import random

import pytest

from bridge.engine import SendDatagram
from bridge.sip import ua_core
from bridge.sip.events import CallOffered
from bridge.sip.message import SipResponse, parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent
from bridge.sip.ua_core import MAX_LINGERING_PER_SOURCE

FLOODER = ("198.51.100.7", 5060)
CALLER = ("192.0.2.10", 5070)
B_URI = "sip:bot@127.0.0.1:5060"
BASE = SipSettings(local_host="127.0.0.1", session_expires_s=0)


def request(
    method: str,
    branch: str,
    source: tuple[str, int],
    *,
    call_id: str | None = None,
    from_tag: str | None = None,
    to_tag: str = "",
    cseq: int = 1,
    body: str = "",
) -> bytes:
    host, port = source
    uri = f"sip:peer@{host}:{port}"
    to = f"<{B_URI}>" + (f";tag={to_tag}" if to_tag else "")
    content = "Content-Type: application/sdp\r\n" if body else ""
    return (
        f"{method} {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <{uri}>;tag={from_tag or 'f' + branch}\r\n"
        f"To: {to}\r\n"
        f"Call-ID: {call_id or 'c' + branch}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        f"Contact: <{uri}>\r\n"
        f"{content}"
        f"Content-Length: {len(body.encode())}\r\n\r\n{body}"
    ).encode()


def responses(ua: SipUserAgent) -> list[SipResponse]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipResponse)
        out.append(message)
    return out


def settle(ua: SipUserAgent, until: float) -> None:
    while (deadline := ua.next_deadline()) is not None and deadline <= until:
        ua.handle_timer(deadline)
    ua.actions_to_send()


def make() -> SipUserAgent:
    return SipUserAgent(BASE, random.Random(1))


def test_an_options_flood_from_one_source_keeps_at_most_the_bound_and_answers_every_one() -> None:
    ua = make()
    n = 10 * MAX_LINGERING_PER_SOURCE
    for i in range(n):
        ua.receive_datagram(request("OPTIONS", f"o{i}", FLOODER), FLOODER, i * 0.001)
    answered = responses(ua)
    assert [r.status for r in answered] == [200] * n
    assert len(ua._server_txs) == MAX_LINGERING_PER_SOURCE
    assert ua.released_early == n - MAX_LINGERING_PER_SOURCE
    # a legitimate INVITE from another source still gets its transaction and its call
    sdp = build_offer("192.0.2.10", 30000, 1, 1)
    ua.receive_datagram(request("INVITE", "inv", CALLER, body=sdp), CALLER, 1.0)
    assert [type(e) for e in ua.events_received()] == [CallOffered]
    assert [r.status for r in responses(ua)] == [100]
    assert len(ua._server_txs) == MAX_LINGERING_PER_SOURCE + 1


def test_kept_transactions_absorb_retransmissions_and_released_ones_are_answered_afresh() -> None:
    ua = make()
    n = MAX_LINGERING_PER_SOURCE + 5
    for i in range(n):
        ua.receive_datagram(request("OPTIONS", f"o{i}", FLOODER), FLOODER, 0.0)
    first = responses(ua)
    kept, released = first[0], first[-1]
    ua.receive_datagram(request("OPTIONS", "o0", FLOODER), FLOODER, 0.5)
    (again,) = responses(ua)
    assert again.to_bytes() == kept.to_bytes()  # the kept transaction resent its 200
    ua.receive_datagram(request("OPTIONS", f"o{n - 1}", FLOODER), FLOODER, 0.5)
    (fresh,) = responses(ua)
    assert fresh.status == 200 and fresh.to().tag != released.to().tag  # answered anew
    assert len(ua._server_txs) == MAX_LINGERING_PER_SOURCE


def test_other_out_of_dialog_non_invites_are_bounded_too() -> None:
    ua = make()
    n = 3 * MAX_LINGERING_PER_SOURCE
    for i in range(n):
        ua.receive_datagram(request("BYE", f"b{i}", FLOODER), FLOODER, 0.0)  # no such call
        ua.receive_datagram(request("REGISTER", f"r{i}", FLOODER), FLOODER, 0.0)
        ua.receive_datagram(request("FOO", f"x{i}", FLOODER), FLOODER, 0.0)
    statuses = [r.status for r in responses(ua)]
    assert statuses == [481, 405, 501] * n
    assert len(ua._server_txs) == MAX_LINGERING_PER_SOURCE


def test_the_bound_is_per_source_under_a_global_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ua_core, "MAX_LINGERING", 3 * MAX_LINGERING_PER_SOURCE + 7)
    ua = make()
    for s in range(10):
        source = (f"198.51.100.{s + 1}", 5060)
        for i in range(2 * MAX_LINGERING_PER_SOURCE):
            ua.receive_datagram(request("OPTIONS", f"o{s}x{i}", source), source, 0.0)
    assert len(responses(ua)) == 10 * 2 * MAX_LINGERING_PER_SOURCE
    assert len(ua._server_txs) == 3 * MAX_LINGERING_PER_SOURCE + 7
    hosts = {entry.peer.addr[0] for entry in ua._server_txs.values()}
    assert len(hosts) == 4  # three sources at their bound, the fourth cut by the cap


def test_the_bound_frees_up_once_timer_j_has_run() -> None:
    ua = make()
    for i in range(2 * MAX_LINGERING_PER_SOURCE):
        ua.receive_datagram(request("OPTIONS", f"o{i}", FLOODER), FLOODER, 0.0)
    responses(ua)
    settle(ua, 64.0)
    assert ua._server_txs == {} and ua._lingering == {} and ua._lingering_total == 0
    ua.receive_datagram(request("OPTIONS", "later", FLOODER), FLOODER, 65.0)
    responses(ua)
    assert len(ua._server_txs) == 1


def test_a_bye_with_effect_keeps_its_transaction_whatever_the_source_sent_before() -> None:
    ua = make()
    sdp = build_offer("198.51.100.7", 30000, 1, 1)
    ua.receive_datagram(request("INVITE", "inv", FLOODER, body=sdp), FLOODER, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    ua.answer(offered.call_id, build_offer("127.0.0.1", 40000, 2, 1, codecs=("PCMU",)), 0.01)
    ok = next(r for r in responses(ua) if r.status == 200)
    to_tag = ok.to().tag or ""
    ua.receive_datagram(
        request("ACK", "ack", FLOODER, call_id="cinv", from_tag="finv", to_tag=to_tag),
        FLOODER,
        0.02,
    )
    for i in range(2 * MAX_LINGERING_PER_SOURCE):
        ua.receive_datagram(request("OPTIONS", f"o{i}", FLOODER), FLOODER, 0.1)
    responses(ua)
    bye = request("BYE", "bye", FLOODER, call_id="cinv", from_tag="finv", to_tag=to_tag, cseq=2)
    ua.receive_datagram(bye, FLOODER, 1.0)
    ua.receive_datagram(bye, FLOODER, 1.5)  # its 200 was lost: the retransmission is absorbed
    assert [r.status for r in responses(ua)] == [200, 200]
    assert ua.active_calls == 0

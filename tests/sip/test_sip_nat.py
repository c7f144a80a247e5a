"""NAT and the flow back to a caller (RFC 3581 rport/received; bridge.sip.dialog's
"Where to send"): where responses and in-dialog requests go. Pure: the engine gets
datagrams and times, and the tests read the addresses of the actions it returns.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bridge.engine import SendDatagram
from bridge.sip.dialog import Dialog, Peer, sends_to_flow
from bridge.sip.events import CallOffered, SendStream
from bridge.sip.message import SipRequest, SipResponse, parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

BASE = SipSettings(local_host="192.0.2.10", local_port=5060, session_expires_s=0)
OUR_URI = "sip:bot@192.0.2.10:5060"


@pytest.mark.parametrize(
    ("target", "flow", "to_flow"),
    [
        ("10.0.0.1", "203.0.113.7", True),  # RFC 1918 Contact behind a NAT
        ("192.168.1.20", "198.51.100.3", True),
        ("172.16.5.5", "127.0.0.2", True),
        ("100.64.0.9", "203.0.113.7", True),  # CGNAT (RFC 6598)
        ("169.254.3.3", "203.0.113.7", True),  # link-local
        ("127.0.0.1", "203.0.113.7", True),  # loopback named from elsewhere
        ("0.0.0.0", "203.0.113.7", True),  # unspecified
        ("[fd00::5]", "2001:db8::1", True),  # ULA
        ("pbx.example.com", "203.0.113.7", True),  # a name: no engine resolves it
        ("10.0.0.1", "10.0.0.1", False),  # the flow's own host (no NAT between)
        ("127.0.0.1", "127.0.0.1", False),
        ("10.0.0.7", "10.20.0.1", False),  # the flow's own private network (a LAN)
        ("192.168.1.20", "192.168.7.1", False),
        ("127.0.0.5", "127.0.0.1", False),  # this machine
        ("192.168.1.20", "10.0.0.1", True),  # another private network: behind a NAT
        ("fd00::5", "fd12::1", False),
        ("fd00::5", "203.0.113.7", True),
        ("not-an-address", "203.0.113.7", True),
        ("8.8.8.8", "203.0.113.7", False),  # a public Contact: sent to as named
        ("2606:4700::1", "203.0.113.7", False),
    ],
)
def test_which_targets_go_along_the_flow(target: str, flow: str, to_flow: bool) -> None:
    assert sends_to_flow(target, flow) is to_flow


def dialog(contact: str, peer: Peer, routes: tuple[str, ...] = ()) -> Dialog:
    request = SipRequest(method="INVITE", uri=OUR_URI)
    request.add("From", "<sip:caller@example.com>;tag=f1")
    request.add("To", f"<{OUR_URI}>")
    request.add("Call-ID", "c1")
    request.add("CSeq", "1 INVITE")
    request.add("Contact", f"<{contact}>")
    for route in routes:
        request.add("Record-Route", route)
    return Dialog.from_request(request, "t1", peer)


FLOW = Peer(("203.0.113.7", 40001))


@pytest.mark.parametrize(
    ("contact", "peer", "routes", "hop"),
    [
        ("sip:caller@10.0.0.1:5060", FLOW, (), FLOW),
        ("sip:caller@10.0.0.1", FLOW, (), FLOW),
        ("sip:caller@203.0.113.7:5062", FLOW, (), Peer(("203.0.113.7", 5062))),
        ("sip:caller@198.51.100.20", FLOW, (), Peer(("198.51.100.20", 5060))),
        ("sip:caller@phone.example.com", FLOW, (), FLOW),
        # a proxy that record-routed: its route, public or not, as the rule says
        ("sip:caller@10.0.0.1", FLOW, ("<sip:198.51.100.50;lr>",), Peer(("198.51.100.50", 5060))),
        ("sip:caller@10.0.0.1", FLOW, ("<sip:10.9.9.9;lr>",), FLOW),
        # a stream transport: the dialog's connection, and where a new one may go if it
        # is gone (the Contact, if it can be reached: RFC 3261 §18.1.1)
        (
            "sip:c@198.51.100.20",
            Peer(FLOW.addr, 4),
            (),
            Peer(FLOW.addr, 4, ("198.51.100.20", 5060)),
        ),
        (
            "sips:c@198.51.100.20",
            Peer(FLOW.addr, 4),
            (),
            Peer(FLOW.addr, 4, ("198.51.100.20", 5061)),
        ),
        (
            "sip:c@8.8.8.8;transport=tls",
            Peer(FLOW.addr, 4),
            (),
            Peer(FLOW.addr, 4, ("8.8.8.8", 5061)),
        ),
        (
            "sip:c@8.8.8.8:7000;transport=tcp",
            Peer(FLOW.addr, 4),
            (),
            Peer(FLOW.addr, 4, ("8.8.8.8", 7000)),
        ),
        ("sip:caller@10.0.0.1", Peer(FLOW.addr, 4), (), Peer(FLOW.addr, 4)),
    ],
)
def test_next_hop_of_a_dialog(contact: str, peer: Peer, routes: tuple[str, ...], hop: Peer) -> None:
    assert dialog(contact, peer, routes).next_hop() == hop


def invite(call_id: str, contact_host: str, via: str, branch: str = "b1", body: str = "") -> bytes:
    sdp = body or build_offer(contact_host, 30000, 1, 1)
    return (
        f"INVITE {OUR_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {via};branch=z9hG4bK{branch}\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:caller@example.com>;tag=ftag\r\n"
        f"To: <{OUR_URI}>\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Contact: <sip:caller@{contact_host}:5060>\r\n"
        "Content-Type: application/sdp\r\n"
        f"Content-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def in_dialog(method: str, call_id: str, to_tag: str, cseq: int, branch: str) -> bytes:
    return (
        f"{method} {OUR_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:caller@example.com>;tag=ftag\r\n"
        f"To: <{OUR_URI}>;tag={to_tag}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def sent(ua: SipUserAgent) -> list[tuple[tuple[str, int], SipRequest | SipResponse]]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipRequest | SipResponse)
        out.append((action.addr, message))
    return out


def answered_call(
    contact_host: str, source: tuple[str, int], via: str
) -> tuple[SipUserAgent, str, str, list[tuple[tuple[str, int], SipRequest | SipResponse]]]:
    """An inbound call from ``source`` answered and ACKed: (ua, call id, our tag, what
    was sent up to the 200)."""
    ua = SipUserAgent(BASE, random.Random(3))
    ua.receive_datagram(invite("nat1", contact_host, via), source, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    assert offered.source == source
    ua.answer(offered.call_id, build_offer("192.0.2.10", 40000, 2, 1), 0.01)
    out = sent(ua)
    ok = out[-1][1]
    assert isinstance(ok, SipResponse) and ok.status == 200
    tag = ok.to().tag or ""
    ack = in_dialog("ACK", "nat1", tag, 1, "ack1")
    ua.receive_datagram(ack, source, 0.02)
    assert sent(ua) == []
    return ua, offered.call_id, tag, out


def test_a_caller_behind_nat_gets_responses_and_our_bye_at_its_source() -> None:
    source = ("203.0.113.7", 40001)
    ua, call_id, _, out = answered_call("10.0.0.1", source, "10.0.0.1:5060;rport")
    assert [addr for addr, _ in out] == [source, source]  # 100 and 200
    via = out[-1][1].top_via()
    assert (via.received, via.rport) == ("203.0.113.7", "40001")
    ua.hangup(call_id, 1.0)
    ((addr, bye),) = sent(ua)
    assert addr == source
    assert isinstance(bye, SipRequest) and bye.method == "BYE"
    assert bye.uri == "sip:caller@10.0.0.1:5060"  # the Request-URI is still the Contact
    assert (bye.top_via().rport, bye.top_via().host) == ("", "192.0.2.10")  # ours has ;rport


def test_a_caller_without_rport_gets_responses_at_its_via_port() -> None:
    source = ("203.0.113.7", 40001)
    _, _, _, out = answered_call("10.0.0.1", source, "10.0.0.1:5070")
    assert [addr for addr, _ in out] == [("203.0.113.7", 5070)] * 2
    assert out[-1][1].top_via().received == "203.0.113.7"


def test_a_public_contact_gets_our_bye_as_named() -> None:
    source = ("203.0.113.7", 40001)
    ua, call_id, _, _ = answered_call("198.51.100.20", source, "198.51.100.20:5060;rport")
    ua.hangup(call_id, 1.0)
    ((addr, bye),) = sent(ua)
    assert addr == ("198.51.100.20", 5060) and isinstance(bye, SipRequest)


def test_an_in_dialog_request_from_a_new_nat_port_moves_the_flow() -> None:
    source = ("203.0.113.7", 40001)
    ua, call_id, tag, _ = answered_call("10.0.0.1", source, "10.0.0.1:5060;rport")
    rebound = ("203.0.113.7", 40999)
    ua.receive_datagram(in_dialog("INFO", "nat1", tag, 2, "info2"), rebound, 1.0)
    ((addr, ok),) = sent(ua)
    assert addr == rebound and isinstance(ok, SipResponse) and ok.status == 200
    ua.hangup(call_id, 2.0)
    ((addr, bye),) = sent(ua)
    assert addr == rebound and isinstance(bye, SipRequest) and bye.method == "BYE"


def test_a_request_for_another_dialog_does_not_move_the_flow() -> None:
    source = ("203.0.113.7", 40001)
    ua, call_id, _, _ = answered_call("10.0.0.1", source, "10.0.0.1:5060;rport")
    stranger = ("198.51.100.66", 5060)
    ua.receive_datagram(in_dialog("INFO", "nat1", "wrongtag", 2, "x2"), stranger, 1.0)
    ((addr, refused),) = sent(ua)
    assert addr == stranger and isinstance(refused, SipResponse) and refused.status == 481
    ua.hangup(call_id, 2.0)
    ((addr, _),) = sent(ua)
    assert addr == source


def test_a_session_refresh_goes_along_the_flow() -> None:
    source = ("203.0.113.7", 40001)
    settings = replace(BASE, session_expires_s=1800)
    ua = SipUserAgent(settings, random.Random(4))
    data = invite("nat2", "10.0.0.1", "10.0.0.1:5060;rport").replace(
        b"CSeq: 1 INVITE\r\n", b"CSeq: 1 INVITE\r\nSession-Expires: 120;refresher=uas\r\n"
    )
    ua.receive_datagram(data, source, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    ua.answer(offered.call_id, build_offer("192.0.2.10", 40000, 2, 1), 0.0)
    tag = sent(ua)[-1][1].to().tag or ""
    ua.receive_datagram(in_dialog("ACK", "nat2", tag, 1, "ack2"), source, 0.0)
    deadline = ua.next_deadline()
    assert deadline is not None and deadline <= 60.0  # the refresh at half of 120 s
    ua.handle_timer(60.0)
    refreshes = [
        (addr, m) for addr, m in sent(ua) if isinstance(m, SipRequest) and m.method == "INVITE"
    ]
    assert [addr for addr, _ in refreshes] == [source]


def test_an_outbound_call_over_tcp_keeps_its_connection_for_the_ack_and_bye() -> None:
    ua = SipUserAgent(replace(BASE, transport="TCP"), random.Random(5))
    call_id = ua.invite(
        "sip:bob@10.0.0.1", "sip:bot@192.0.2.10", build_offer("192.0.2.10", 40000, 1, 1),
        ("198.51.100.20", 5060), 0.0, conn_id=9,
    )  # fmt: skip
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendStream) and action.conn_id == 9
    request = parse_message(action.data)
    assert isinstance(request, SipRequest)
    ok = (
        "SIP/2.0 200 OK\r\n"
        f"Via: {request.get('via')}\r\nFrom: {request.get('from')}\r\n"
        f"To: {request.get('to')};tag=bob\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\n"
        "Contact: <sip:bob@10.0.0.1:5060;transport=tcp>\r\n"
        "Content-Type: application/sdp\r\n"
    )
    body = build_offer("10.0.0.1", 30000, 1, 1)
    data = f"{ok}Content-Length: {len(body)}\r\n\r\n{body}".encode()
    ua.receive_stream(9, data, ("198.51.100.20", 5060), 0.1)
    ua.hangup(call_id, 1.0)
    methods = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendStream) and action.conn_id == 9
        message = parse_message(action.data)
        assert isinstance(message, SipRequest)
        methods.append(message.method)
    assert methods == ["ACK", "BYE"]

"""Outbound call targets: tel:+E164 numbers, TCP and TLS (bridge.sip.uri)."""

from __future__ import annotations

import random

import pytest

from bridge.sip.events import OutboundCallFailed, SendStream
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent
from bridge.sip.uri import OutboundTarget, TargetError, e164, outbound_target

PROXY = "sip:proxy.example.com:5070"


def test_e164_numbers_lose_their_visual_separators() -> None:
    assert e164("+1-555-123-0000") == "+15551230000"
    assert e164("+44.(20).7946.0000") == "+442079460000"
    for bad in ("5551230000", "+", "+1555abc", "+1234567890123456"):
        with pytest.raises(TargetError):
            e164(bad)


def test_tel_target_becomes_a_sip_uri_at_the_gateway() -> None:
    assert outbound_target("tel:+1-555-123-0000", PROXY) == OutboundTarget(
        "sip:+15551230000@proxy.example.com:5070;user=phone",
        "proxy.example.com",
        5070,
        "UDP",
        via_proxy=True,
        named_port=5070,
    )
    # no proxy: the registrar's host takes the number, and is the next hop
    target = outbound_target("tel:+15551230000", None, "sip:pbx.example.com;transport=tcp")
    assert target == OutboundTarget(
        "sip:+15551230000@pbx.example.com;user=phone",
        "pbx.example.com",
        5060,
        "TCP",
        named_transport="TCP",
    )
    with pytest.raises(TargetError, match="outbound_proxy or a registration"):
        outbound_target("tel:+15551230000")
    with pytest.raises(TargetError, match="not a global number"):
        outbound_target("tel:5551230000;phone-context=example.com", PROXY)


def test_targets_say_what_the_hop_uri_named_for_server_location() -> None:
    # RFC 3263: no port named lets SRV choose one; the scheme and transport= narrow it
    target = outbound_target("sips:bob@example.com")
    assert (target.port, target.named_port, target.scheme, target.named_transport) == (
        5061,
        None,
        "sips",
        None,
    )
    target = outbound_target("sip:bob@example.com:5099;transport=tcp")
    assert (target.named_port, target.scheme, target.named_transport) == (5099, "sip", "TCP")


def test_sip_targets_keep_their_uri_and_say_their_transport() -> None:
    assert outbound_target("<sip:bob@192.0.2.1:5080>") == OutboundTarget(
        "sip:bob@192.0.2.1:5080", "192.0.2.1", 5080, "UDP", named_port=5080
    )
    assert outbound_target("sip:bob@192.0.2.1;transport=TCP").transport == "TCP"
    via_proxy = outbound_target("sip:bob@192.0.2.1", PROXY)
    assert (via_proxy.request_uri, via_proxy.host, via_proxy.via_proxy) == (
        "sip:bob@192.0.2.1",
        "proxy.example.com",
        True,
    )


@pytest.mark.parametrize(
    ("target", "proxy", "host", "port"),
    [
        ("sips:bob@192.0.2.1", None, "192.0.2.1", 5061),
        ("sip:bob@192.0.2.1;transport=tls", None, "192.0.2.1", 5061),
        ("sips:bob@192.0.2.1:5071;transport=tls", None, "192.0.2.1", 5071),
        ("sip:bob@192.0.2.1", "sips:proxy.example.com", "proxy.example.com", 5061),
        ("tel:+15551230000", "sip:proxy.example.com;transport=tls", "proxy.example.com", 5061),
    ],
)
def test_tls_targets_go_over_tls_on_5061_by_default(
    target: str, proxy: str | None, host: str, port: int
) -> None:
    got = outbound_target(target, proxy)
    assert (got.transport, got.host, got.port) == ("TLS", host, port)


@pytest.mark.parametrize("target", ["sips:bob@192.0.2.1;transport=udp", "sips:b@h;transport=tcp"])
def test_a_sips_target_is_never_sent_over_a_weaker_transport(target: str) -> None:
    with pytest.raises(TargetError, match="sips: URI goes over TLS only"):
        outbound_target(target)


def test_other_targets_are_clear_errors() -> None:
    with pytest.raises(TargetError, match="cannot call a mailto: URI"):
        outbound_target("mailto:bob@example.com")
    with pytest.raises(TargetError, match="cannot parse"):
        outbound_target("bob@example.com")
    with pytest.raises(TargetError, match="transport 'sctp' not supported"):
        outbound_target("sip:bob@192.0.2.1;transport=sctp")


def test_an_invite_on_a_stream_connection_fails_at_once_when_it_cannot_connect() -> None:
    ua = SipUserAgent(SipSettings(transport="TCP", session_expires_s=0), random.Random(1))
    offer = build_offer("127.0.0.1", 30000, 1, 1)
    call_id = ua.invite("sip:bob@192.0.2.1;transport=tcp", "sip:a@x", offer, ("192.0.2.1", 5060),
                        0.0, conn_id=7)  # fmt: skip
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendStream) and action.conn_id == 7
    assert action.data.split(b"\r\n")[1].startswith(b"Via: SIP/2.0/TCP ")
    ua.connection_failed(8, 0.1)  # another connection: nothing
    assert ua.events_received() == []
    ua.connection_failed(7, 0.1)
    assert ua.events_received() == [OutboundCallFailed(call_id, 503, "Service Unavailable")]
    ua.handle_timer(100.0)  # the transaction's own end later reports nothing more
    assert ua.events_received() == []


def test_an_invite_over_tls_says_tls_in_its_via_and_its_contact() -> None:
    settings = SipSettings(transport="TLS", local_port=5061, session_expires_s=0)
    ua = SipUserAgent(settings, random.Random(1))
    offer = build_offer("127.0.0.1", 30000, 1, 1)
    ua.invite("sips:bob@192.0.2.1", "sip:a@x", offer, ("192.0.2.1", 5061), 0.0, conn_id=3)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendStream) and action.conn_id == 3
    lines = action.data.decode().split("\r\n")
    assert lines[0] == "INVITE sips:bob@192.0.2.1 SIP/2.0"
    assert lines[1].startswith("Via: SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bK")
    assert "Contact: <sips:callbridge@127.0.0.1:5061>" in lines
    # a sip: target over TLS: a sip: Contact that says TLS (what peers route)
    ua.invite(
        "sip:bob@192.0.2.1;transport=tls", "sip:a@x", offer, ("192.0.2.1", 5061), 0.0, conn_id=3
    )
    (action,) = ua.actions_to_send()
    assert b"\r\nContact: <sip:callbridge@127.0.0.1:5061;transport=tls>\r\n" in action.data

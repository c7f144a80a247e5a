"""``[sip]`` keys for carriers: ``external_address`` (replacing ``rtp_address``), ``latching``."""

from __future__ import annotations

import random

import pytest

from bridge.config import ConfigError, parse_config
from bridge.engine import SendDatagram
from bridge.sip.message import SipRequest, parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

ROUTE = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
api_key = "sk-inline-secret"
[[routes]]
match = "*"
provider = "p"
"""


def errors_of(sip: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config("[sip]\n" + sip + ROUTE)
    return info.value.errors


def test_defaults_keep_todays_behaviour() -> None:
    cfg = parse_config(ROUTE)
    assert (cfg.sip.external_address, cfg.sip.latching) == ("", "strict")


def test_external_address_and_learn_mode() -> None:
    cfg = parse_config('[sip]\nexternal_address = "198.51.100.4"\nlatching = "learn"\n' + ROUTE)
    assert (cfg.sip.external_address, cfg.sip.latching) == ("198.51.100.4", "learn")
    cfg = parse_config('[sip]\nexternal_address = "2001:db8::4"\n' + ROUTE)
    assert cfg.sip.external_address == "2001:db8::4"


def test_old_key_is_a_clear_error() -> None:
    assert errors_of('rtp_address = "198.51.100.4"\n') == [
        "sip.rtp_address: renamed to sip.external_address"
    ]


def test_bad_values_are_named() -> None:
    (error,) = errors_of('external_address = "nat.example.com"\n')
    assert error.startswith("sip.external_address: expected an IP address")
    (error,) = errors_of('latching = "loose"\n')
    assert error.startswith("sip.latching: unknown value 'loose'")


def test_a_registrar_needs_a_listener_of_its_transport_named_by_key() -> None:
    reg = '[sip.registrations.pbx]\nregistrar = "{}"\nuser = "u"\npassword = "p"\n'
    (error,) = errors_of(reg.format("sips:pbx.example.com"))
    assert error == (
        "sip.registrations.pbx.registrar: sips:pbx.example.com: REGISTER over TLS needs "
        "sip.tls_listen"
    )
    (error,) = errors_of('transports = ["udp"]\n' + reg.format("sip:pbx.example.com;transport=tcp"))
    assert error == (
        "sip.registrations.pbx.registrar: sip:pbx.example.com;transport=tcp: REGISTER over TCP "
        "needs 'tcp' in sip.transports"
    )
    cfg = parse_config("[sip]\n" + reg.format("sip:pbx.example.com;transport=tcp") + ROUTE)
    assert cfg.sip.registrations[0].registrar == "sip:pbx.example.com;transport=tcp"


def test_contact_carries_the_external_address() -> None:
    settings = SipSettings(local_host="10.0.0.5", contact_host="198.51.100.4", session_expires_s=0)
    ua = SipUserAgent(settings, random.Random(1))
    ua.invite("sip:bob@192.0.2.1", "sip:bot@example.com", build_offer("198.51.100.4", 30000, 1, 1),
              ("192.0.2.1", 5060), 0.0)  # fmt: skip
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram)
    request = parse_message(action.data)
    assert isinstance(request, SipRequest)
    assert request.get("contact") == "<sip:callbridge@198.51.100.4:5060>"
    assert "10.0.0.5" in (request.get("via") or "")  # Via stays local (rport finds us)

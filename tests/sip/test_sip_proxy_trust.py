"""Admission behind a trusted proxy, and the refusal counts (``UaCore.refusals``).

Time is a number passed in. A trusted proxy (Kamailio) reports the caller in
``X-Callbridge-Source``; the allowlist and the per-source INVITE rate apply to
that caller and are answered (403, 503 + Retry-After) instead of dropped, so
the proxy never takes a live node for a dead one.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bridge.engine import SendDatagram
from bridge.sip.digest import DigestVerifier
from bridge.sip.guard import REFUSAL_REASONS, InviteRateLimiter, TrustedProxies
from bridge.sip.message import SipResponse, parse_message
from bridge.sip.settings import SipAuthUser, SipSettings
from bridge.sip.ua import SipUserAgent
from bridge.sip.uas import RATE_LIMITED

PROXY = ("10.0.0.5", 5060)
CALLER = ("198.51.100.7", 5060)
BASE = SipSettings(
    local_host="127.0.0.1",
    session_expires_s=0,
    invite_rate_per_s=1.0,
    invite_burst=2,
    trusted_proxies=("10.0.0.5/32",),
    allowed_sources=("198.51.100.0/24",),
)


def invite(
    n: int, caller: str | None = None, *, headers: str = "", method: str = "INVITE"
) -> bytes:
    source = f"X-Callbridge-Source: {caller}\r\n" if caller is not None else ""
    return (
        f"{method} sip:bot@127.0.0.1:5060 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4bKp{n};rport\r\n"
        f"Via: SIP/2.0/UDP 198.51.100.7:5060;branch=z9hG4bKc{n}\r\n"
        "Max-Forwards: 69\r\n"
        f"From: <sip:carrier@198.51.100.7>;tag=f{n}\r\n"
        "To: <sip:bot@127.0.0.1:5060>\r\n"
        f"Call-ID: call-{n}\r\n"
        f"CSeq: 1 {method}\r\n"
        "Contact: <sip:carrier@198.51.100.7:5060>\r\n"
        f"{headers}{source}"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def responses(ua: SipUserAgent) -> list[SipResponse]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipResponse)
        out.append(message)
    return out


def statuses(ua: SipUserAgent) -> list[tuple[int, str]]:
    return [(r.status, r.reason) for r in responses(ua)]


def test_rate_limit_applies_to_each_caller_behind_the_proxy() -> None:
    ua = SipUserAgent(BASE, random.Random(1))
    # two callers behind one proxy: each has its own bucket of 2
    for n, caller in enumerate(["198.51.100.7", "198.51.100.7", "198.51.100.8", "198.51.100.8"]):
        ua.receive_datagram(invite(n, caller), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")] * 4
    assert ua.take_refusals() == {}


def test_over_limit_caller_behind_the_proxy_gets_503_with_retry_after() -> None:
    ua = SipUserAgent(replace(BASE, invite_rate_per_s=0.25), random.Random(2))
    for n in range(2):
        ua.receive_datagram(invite(n, "198.51.100.7"), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")] * 2
    ua.receive_datagram(invite(2, "198.51.100.7"), PROXY, 0.0)
    (refused,) = responses(ua)
    assert (refused.status, refused.reason) == (503, RATE_LIMITED)
    assert refused.get("retry-after") == "4"  # 1 token at 0.25/s
    assert refused.to().tag  # a final answer of the transaction, not a silent drop
    assert ua.take_refusals() == {"rate_limited": 1}
    assert ua.take_refusals() == {}  # taken once
    # the same caller again once its bucket has a token; another caller at once
    ua.receive_datagram(invite(3, "198.51.100.9"), PROXY, 0.5)
    ua.receive_datagram(invite(4, "198.51.100.7"), PROXY, 4.0)
    assert statuses(ua) == [(100, "Trying")] * 2
    assert ua.active_calls == 4


def test_the_proxys_own_requests_are_never_rate_limited() -> None:
    """A request from the trusted proxy without the header is the proxy's own:
    however many, none is refused (the proxy is never starved)."""
    ua = SipUserAgent(BASE, random.Random(3))
    for n in range(20):
        ua.receive_datagram(invite(n), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")] * 20
    for n in range(20, 25):
        ua.receive_datagram(invite(n, method="OPTIONS"), PROXY, 0.0)
    assert statuses(ua) == [(200, "OK")] * 5
    assert ua.take_refusals() == {}


def test_caller_behind_the_proxy_outside_the_allowlist_gets_403() -> None:
    ua = SipUserAgent(BASE, random.Random(4))
    ua.receive_datagram(invite(1, "203.0.113.9"), PROXY, 0.0)
    assert statuses(ua) == [(403, "Forbidden")]
    ua.receive_datagram(invite(2, "198.51.100.7"), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")]
    assert ua.take_refusals() == {"not_allowed": 1}


def test_the_header_from_an_untrusted_source_is_ignored() -> None:
    """A caller that sends the header itself gains nothing: its own address is
    checked (allowlist: silence), and its own bucket is charged."""
    ua = SipUserAgent(BASE, random.Random(5))
    ua.receive_datagram(invite(1, "198.51.100.7"), ("203.0.113.9", 5060), 0.0)
    assert responses(ua) == []
    assert ua.take_refusals() == {"not_allowed": 1}
    for n in range(2, 6):  # an allowed caller naming a different one each time
        ua.receive_datagram(invite(n, f"198.51.100.{n + 10}"), CALLER, 0.0)
    assert statuses(ua) == [(100, "Trying")] * 2  # its own bucket of 2
    assert ua.take_refusals() == {"rate_limited": 2}
    assert ua.dropped_messages == 3  # untrusted refusals stay silent


def test_the_nearest_proxys_copy_counts_and_garbage_is_the_proxys_own() -> None:
    ua = SipUserAgent(replace(BASE, invite_rate_per_s=0.25, invite_burst=1), random.Random(6))
    spoof = "X-Callbridge-Source: 198.51.100.200\r\n"
    # the caller's own copy comes first; the proxy's (appended) last
    ua.receive_datagram(invite(1, "198.51.100.7", headers=spoof), PROXY, 0.0)
    ua.receive_datagram(invite(2, "198.51.100.7", headers=spoof), PROXY, 0.0)
    assert [s for s, _ in statuses(ua)] == [100, 503]
    ua.receive_datagram(invite(3, "198.51.100.200"), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")], "the spoofed address was never charged"
    ua.receive_datagram(invite(4, "not-an-address"), PROXY, 0.0)
    assert statuses(ua) == [(100, "Trying")]


def test_the_proxy_passes_an_allowlist_that_does_not_name_it() -> None:
    ua = SipUserAgent(BASE, random.Random(7))
    assert not any(a for a in BASE.allowed_sources if a.startswith("10."))
    ua.receive_datagram(invite(1, method="OPTIONS"), PROXY, 0.0)
    assert statuses(ua) == [(200, "OK")]
    # no proxy is trusted by default: the same request from it is then dropped
    plain = SipUserAgent(replace(BASE, trusted_proxies=()), random.Random(7))
    plain.receive_datagram(invite(1, "198.51.100.7"), PROXY, 0.0)
    assert responses(plain) == []
    assert plain.take_refusals() == {"not_allowed": 1}


def test_drain_and_call_limit_refusals_are_counted() -> None:
    ua = SipUserAgent(replace(BASE, max_calls=1, trusted_proxies=()), random.Random(8))
    ua.receive_datagram(invite(1), CALLER, 0.0)
    ua.receive_datagram(invite(2), CALLER, 0.0)
    assert [s for s, _ in statuses(ua)] == [100, 503]
    assert ua.take_refusals() == {"max_calls": 1}
    ua.drain()
    ua.receive_datagram(invite(3), CALLER, 10.0)
    ua.receive_datagram(invite(4, method="OPTIONS"), CALLER, 10.0)
    assert [s for s, _ in statuses(ua)] == [503, 503]
    assert ua.take_refusals() == {"draining": 1}, "an OPTIONS probe is not a refused call"


def test_wrong_credentials_count_but_a_first_challenge_does_not() -> None:
    settings = replace(BASE, trusted_proxies=(), auth_users=(SipAuthUser("carrier", "secret"),))
    ua = SipUserAgent(settings, random.Random(9))
    ua.receive_datagram(invite(1), CALLER, 0.0)
    (challenge,) = responses(ua)
    assert challenge.status == 401
    assert ua.take_refusals() == {}
    verifier = DigestVerifier("callbridge", settings.auth_secret, {"carrier": "secret"}, 300.0)
    nonce = verifier.challenges(0.0, stale=False)[0].split('nonce="')[1].split('"')[0]
    wrong = (
        f'Authorization: Digest username="carrier", realm="callbridge", nonce="{nonce}", '
        'uri="sip:bot@127.0.0.1:5060", response="00000000000000000000000000000000", '
        "algorithm=MD5\r\n"
    )
    ua.receive_datagram(invite(2, headers=wrong), CALLER, 0.0)
    assert [r.status for r in responses(ua)] == [401]
    assert ua.take_refusals() == {"auth_failed": 1}


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("198.51.100.7", "198.51.100.7"),
        (" 2001:db8::1 ", "2001:db8::1"),
        ("198.51.100.7:5060", None),
        ("", None),
        ("example.com", None),
    ],
)
def test_caller_header_values(header: str | None, expected: str | None) -> None:
    assert TrustedProxies.caller(header) == expected


def test_trust_is_by_cidr_and_empty_trusts_nobody() -> None:
    assert not TrustedProxies(()).trusts("127.0.0.1")
    trusted = TrustedProxies(("10.0.0.0/24", "2001:db8::/32"))
    assert trusted.trusts("10.0.0.200") and trusted.trusts("2001:db8::5")
    assert not trusted.trusts("10.0.1.1") and not trusted.trusts("nonsense")


def test_retry_after_is_when_the_bucket_has_a_token() -> None:
    limiter = InviteRateLimiter(0.5, 1)
    assert limiter.retry_after_s("h", 0.0) == 1  # a full bucket: at least 1
    assert limiter.allow("h", 0.0) and not limiter.allow("h", 0.0)
    assert limiter.retry_after_s("h", 0.0) == 2
    assert limiter.retry_after_s("h", 1.5) == 1
    assert limiter.allow("h", 2.0)


def test_refusal_reasons_are_the_documented_set() -> None:
    assert set(REFUSAL_REASONS) == {
        "not_allowed",
        "rate_limited",
        "draining",
        "max_calls",
        "auth_failed",
        "no_codec",
        "srtp_mismatch",
    }


def test_config_key_names_a_bad_value() -> None:
    from bridge.config import ConfigError, parse_config

    base = '[providers.p]\nprotocol = "kova"\nurl = "ws://127.0.0.1:1/v1/ws/kova"\n'
    base += '[[routes]]\nmatch = "*"\nprovider = "p"\n'
    ok = parse_config('[sip]\ntrusted_proxies = ["10.0.0.5", "10.1.0.0/16"]\n' + base)
    assert ok.sip.trusted_proxies == ("10.0.0.5", "10.1.0.0/16")
    assert parse_config(base).sip.trusted_proxies == ()
    with pytest.raises(ConfigError) as info:
        parse_config('[sip]\ntrusted_proxies = ["kamailio.local"]\n' + base)
    assert any(e.startswith("sip.trusted_proxies: ") for e in info.value.errors)

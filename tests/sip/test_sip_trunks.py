"""The trunk choice and each trunk's limits (``bridge.sip.trunks``), time passed in, and
the user agent's view of inbound trunk calls (authentication, codecs, the trunk named)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bridge.engine import SendDatagram
from bridge.sip.digest import authorization, choose_challenge
from bridge.sip.events import CallOffered, RegistrationStateChanged, SendStream
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.settings import SipAuthUser, SipSettings, TrunkConfig
from bridge.sip.trunks import (
    TrunkError,
    TrunkLimiter,
    choose_trunk,
    inbound_trunk,
    trunk_credentials,
)
from bridge.sip.ua import REREGISTER_AFTER_DROP_S, SipUserAgent
from bridge.sip.uri import outbound_target

from .test_sip_sdes import _sdes_offer
from .test_sip_ua import A_URI as SIM_A_URI
from .test_sip_ua import B_ADDR as SIM_B_ADDR
from .test_sip_ua import B_URI as SIM_B_URI
from .test_sip_ua import BASE as SIM_BASE
from .test_sip_ua import make


def trunk(name: str, *sources: str) -> TrunkConfig:
    return TrunkConfig(name, f"sip:{name}.example.com", sources=sources)


A, B = trunk("a", "192.0.2.0/24"), trunk("b", "198.51.100.7/32", "2001:db8::/32")


def test_the_named_trunk_is_chosen_for_any_target() -> None:
    assert choose_trunk((A, B), "b", "sip:bob@example.org") is B
    assert choose_trunk((A, B), "a", "tel:+15551230000") is A


def test_an_unknown_name_is_an_error_listing_the_trunks() -> None:
    with pytest.raises(TrunkError, match=r"no trunk 'c' \(trunks: a, b\)"):
        choose_trunk((A, B), "c", "tel:+15551230000")
    with pytest.raises(TrunkError, match=r"no trunk 'c' \(trunks: none configured\)"):
        choose_trunk((), "c", "sip:bob@example.org")


def test_tel_targets_take_the_only_trunk_else_need_a_name() -> None:
    assert choose_trunk((A,), "", "tel:+15551230000") is A
    assert choose_trunk((A,), "", "<TEL:+15551230000>") is A
    with pytest.raises(TrunkError, match="a tel: target needs a trunk: name one in 'trunk'"):
        choose_trunk((A, B), "", "tel:+15551230000")
    assert choose_trunk((), "", "tel:+15551230000") is None  # [sip] outbound_proxy, as before


def test_sip_targets_without_a_name_use_no_trunk() -> None:
    assert choose_trunk((A,), "", "sip:bob@a.example.com") is None


def test_inbound_trunk_by_source_address() -> None:
    assert inbound_trunk((A, B), "192.0.2.44") is A
    assert inbound_trunk((A, B), "198.51.100.7") is B
    assert inbound_trunk((A, B), "198.51.100.8") is None
    assert inbound_trunk((A, B), "2001:db8::1") is B
    assert inbound_trunk((A, B), "[2001:db8::1]") is B
    assert inbound_trunk((A, B), "::ffff:192.0.2.44") is A  # a dual-stack socket's view
    assert inbound_trunk((A,), "2001:db8::1") is None  # another family: no match
    assert inbound_trunk((A, B), "not-an-address") is None
    assert inbound_trunk((trunk("none"),), "192.0.2.44") is None


def test_max_calls_refuses_one_more_until_a_call_ends() -> None:
    limiter = TrunkLimiter("a", max_calls=2, calls_per_second=0)
    for call in ("c1", "c2"):
        assert limiter.admit(0.0) is None
        limiter.started(call)
    refusal = limiter.admit(0.0)
    assert refusal is not None and refusal.reason == "max_calls"
    assert refusal.message == "trunk 'a' has max_calls = 2 calls up"
    assert limiter.admit(0.0, outbound=False) is not None  # inbound calls count too
    limiter.ended("c1")
    limiter.ended("c1")  # twice: no effect
    assert limiter.active == 1
    assert limiter.admit(0.0) is None


def test_calls_per_second_refuses_past_the_bucket_and_says_how_long_to_wait() -> None:
    limiter = TrunkLimiter("a", max_calls=0, calls_per_second=2)
    assert [limiter.admit(10.0) is None for _ in range(3)] == [True, True, False]
    refusal = limiter.admit(10.0)
    assert refusal is not None and refusal.reason == "calls_per_second"
    assert refusal.retry_after_s == pytest.approx(0.5)
    assert "calls_per_second = 2; try again in 0.5 s" in refusal.message
    assert limiter.admit(10.25) is not None  # half a token
    assert limiter.admit(10.5) is None  # one token back
    assert limiter.admit(10.5) is not None
    assert limiter.admit(12.0) is None and limiter.admit(12.0) is None  # full again: 2
    assert limiter.admit(12.0) is not None


def test_a_call_admitted_but_never_placed_gives_its_token_back() -> None:
    limiter = TrunkLimiter("a", max_calls=0, calls_per_second=1)
    assert limiter.admit(0.0) is None
    limiter.give_back()
    assert limiter.admit(0.0) is None  # the token was back
    assert limiter.admit(0.0) is not None
    limiter.give_back()
    limiter.give_back()
    assert limiter.tokens == 1.0  # never above the bucket's depth


def test_a_fractional_rate_paces_one_call_at_a_time() -> None:
    limiter = TrunkLimiter("a", max_calls=0, calls_per_second=0.5)
    assert limiter.admit(0.0) is None
    refusal = limiter.admit(1.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(1.0)
    assert limiter.admit(2.0) is None


def test_the_rate_applies_to_calls_out_only_and_a_refusal_takes_no_place() -> None:
    limiter = TrunkLimiter("a", max_calls=1, calls_per_second=1)
    assert limiter.admit(0.0, outbound=False) is None  # inbound: no token taken
    assert limiter.admit(0.0) is None  # the token is still there
    assert limiter.active == 0  # admit() alone holds no place: started() does


# ------------------------------------------------ inbound: the user agent engine

CARRIER = ("192.0.2.10", 5070)
ELSEWHERE = ("203.0.113.9", 5070)
B_URI = "sip:bot@127.0.0.1:5060"
OFFER = (
    "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"
)


def invite(call_id: str, source: tuple[str, int], extra: str = "", sdp: str = "") -> bytes:
    host, port = source
    return (
        f"INVITE {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{call_id};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:carrier@{host}>;tag=f{call_id}\r\n"
        f"To: <{B_URI}>\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\n"
        f"Contact: <sip:carrier@{host}:{port}>\r\n{extra}"
        + ("Content-Type: application/sdp\r\n" if sdp else "")
        + f"Content-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def statuses(ua: SipUserAgent) -> list[SipResponse]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipResponse)
        out.append(message)
    return out


def offered(ua: SipUserAgent) -> list[str]:
    """The trunk of each call offered since the last look."""
    return [e.trunk for e in ua.events_received() if isinstance(e, CallOffered)]


def agent(*trunks: TrunkConfig, users: tuple[SipAuthUser, ...] = ()) -> SipUserAgent:
    settings = SipSettings(
        local_host="127.0.0.1",
        session_expires_s=0,
        auth_users=users,
        auth_secret=b"k" * 32,
        trunks=trunks,
    )
    return SipUserAgent(settings, random.Random(3))


def answered(ua: SipUserAgent, call_id: str, source: tuple[str, int], user: str, pw: str) -> None:
    """Send an INVITE, take its 401, send it again answering as ``user`` (a second later:
    each call its own nonce)."""
    now = float(int(call_id[1:]) * 2)
    ua.receive_datagram(invite(f"{call_id}-0", source), source, now)
    (challenge,) = statuses(ua)
    assert challenge.status == 401
    found = choose_challenge(challenge.get_lines("www-authenticate"))
    assert found is not None
    header = authorization(
        found, username=user, password=pw, method="INVITE", uri=B_URI, cnonce="cn", nc=1
    )
    ua.receive_datagram(invite(call_id, source, f"Authorization: {header}\r\n"), source, now + 1)


IP_TRUNK = TrunkConfig("ip", "sip:carrier.example", sources=("192.0.2.0/24",))
SIP_USERS = (SipAuthUser("alice", "alice-pw"),)


def test_a_source_trunk_call_is_not_challenged_and_is_the_trunks() -> None:
    ua = agent(IP_TRUNK, users=SIP_USERS)
    ua.receive_datagram(invite("c1", CARRIER), CARRIER, 0.0)
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == ["ip"]
    ua.receive_datagram(invite("c2", ELSEWHERE), ELSEWHERE, 0.0)  # [sip.auth] still applies
    assert [r.status for r in statuses(ua)] == [401]
    assert offered(ua) == []


def test_without_trunks_or_auth_calls_are_offered_without_a_trunk() -> None:
    ua = agent(IP_TRUNK)
    ua.receive_datagram(invite("c1", ELSEWHERE), ELSEWHERE, 0.0)
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == [""]


BOTH = TrunkConfig(
    "both", "sip:c.example", user="tr", password="tr-pw", sources=("192.0.2.0/24",),
    inbound_auth="both",
)  # fmt: skip
DIGEST = TrunkConfig("dig", "sip:d.example", user="dg", password="dg-pw", inbound_auth="digest")


def test_both_needs_the_source_and_the_trunks_digest() -> None:
    ua = agent(BOTH, users=SIP_USERS)
    ua.receive_datagram(invite("c0", CARRIER), CARRIER, 0.0)
    assert [r.status for r in statuses(ua)] == [401]  # from its source, but no answer
    answered(ua, "c1", CARRIER, "tr", "tr-pw")
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == ["both"]
    answered(ua, "c2", CARRIER, "alice", "alice-pw")  # from its source as someone else
    assert [r.status for r in statuses(ua)] == [403]
    answered(ua, "c3", ELSEWHERE, "tr", "tr-pw")  # its user from elsewhere
    assert [r.status for r in statuses(ua)] == [403]
    answered(ua, "c4", ELSEWHERE, "alice", "alice-pw")  # [sip.auth]'s user: not a trunk call
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == [""]


def test_digest_trunk_calls_answer_as_its_user_from_anywhere() -> None:
    ua = agent(DIGEST)  # its user alone turns digest on
    ua.receive_datagram(invite("c0", ELSEWHERE), ELSEWHERE, 0.0)
    assert [r.status for r in statuses(ua)] == [401]
    answered(ua, "c1", ELSEWHERE, "dg", "dg-pw")
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == ["dig"]
    answered(ua, "c2", CARRIER, "dg", "wrong")
    assert [r.status for r in statuses(ua)] == [401]
    assert offered(ua) == []


def test_a_trunks_codecs_apply_to_its_calls_only() -> None:
    pcma_only = TrunkConfig("a", "sip:c.example", sources=("192.0.2.0/24",), codecs=("PCMA",))
    ua = agent(pcma_only)
    ua.receive_datagram(invite("c1", CARRIER, sdp=OFFER), CARRIER, 0.0)  # PCMU offered
    assert [r.status for r in statuses(ua)] == [488]
    ua.receive_datagram(invite("c2", ELSEWHERE, sdp=OFFER), ELSEWHERE, 0.0)
    assert [r.status for r in statuses(ua)] == [100]
    assert offered(ua) == [""]


@pytest.mark.parametrize(
    ("trunk_srtp", "proto", "keyed", "outcome"),
    [
        ("require", "RTP/SAVP", True, "secure"),  # [sip] srtp is off: the trunk's mode rules
        ("require", "RTP/AVP", False, "488"),
        ("off", "RTP/SAVP", True, "488"),
        (None, "RTP/SAVP", True, "488"),  # no trunk: [sip]'s off
    ],
)
def test_a_trunks_srtp_mode_applies_to_its_calls_over_tls(
    trunk_srtp: str | None, proto: str, keyed: bool, outcome: str
) -> None:
    trunks = (
        (TrunkConfig("secure", "sips:c.example", "tls", srtp=trunk_srtp, sources=("127.0.0.1",)),)
        if trunk_srtp is not None
        else ()
    )
    b = replace(SIM_BASE, local_port=5060, transport="TLS", trunks=trunks)
    sim, a, ua_b = make(b=b)
    a.invite(SIM_B_URI, SIM_A_URI, _sdes_offer(proto, keyed), SIM_B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    calls = [e.trunk for e in sim.take(SIM_B_ADDR) if isinstance(e, CallOffered)]
    finals = [m[:12] for m in sim.wire if m.startswith(b"SIP/2.0 4")]
    if outcome == "488":
        assert (calls, finals) == ([], [b"SIP/2.0 488 "])
        assert ua_b.take_refusals() == {"srtp_mismatch": 1}
    else:
        assert (calls, finals) == ([outcome], [])


@pytest.mark.parametrize(
    ("transport", "registrar", "hop"),
    [
        ("udp", "sip:r.example", ("r.example", 5060, "UDP")),
        ("tcp", "sip:r.example", ("r.example", 5060, "TCP")),
        ("tcp", "sip:r.example:5080;transport=tcp", ("r.example", 5080, "TCP")),
        ("tls", "sip:r.example", ("r.example", 5061, "TLS")),
        ("tls", "sips:r.example:5071", ("r.example", 5071, "TLS")),
    ],
)
def test_a_trunks_registrar_is_reached_over_the_trunks_transport(
    transport: str, registrar: str, hop: tuple[str, int, str]
) -> None:
    t = TrunkConfig("t", "sip:p.example", transport, registrar=registrar, user="u", password="p")
    target = outbound_target(t.registrar_hop)
    assert (target.host, target.port, target.transport) == hop
    assert TrunkConfig("t", "sip:p.example", transport).registrar_hop == ""


def test_a_trunks_tcp_register_answers_its_realm_on_its_connection_and_again_after_a_drop() -> None:
    """What the leg does with a TCP trunk's registrar (``registrar_hop``, the connection
    ``conn_id`` it shares with calls, ``trunk_credentials``): every REGISTER on that
    connection, the 401 of the trunk's realm answered, another realm's not, and a
    dropped connection registers again on it."""
    t = TrunkConfig(
        "t", "sip:p.example", "tcp", registrar="sip:192.0.2.8", user="u", password="pw",
        realm="carrier",
    )  # fmt: skip
    ua = SipUserAgent(SipSettings(local_host="127.0.0.1", transport="TCP"), random.Random(1))
    target = outbound_target(t.registrar_hop)
    rid = ua.register(
        (target.host, target.port), t.registrar, "sip:u@192.0.2.8", 0.0,
        credentials=trunk_credentials(t), conn_id=9,
    )  # fmt: skip

    def sent() -> SipRequest:
        (action,) = ua.actions_to_send()
        assert isinstance(action, SendStream) and action.conn_id == 9
        request = parse_message(action.data)
        assert isinstance(request, SipRequest) and request.method == "REGISTER"
        return request

    def challenge(request: SipRequest, realm: str) -> bytes:
        response = build_response(request, 401, "Unauthorized", "reg")
        response.add("WWW-Authenticate", f'Digest realm="{realm}", nonce="n1", qop="auth"')
        return response.to_bytes()

    first = sent()
    assert first.uri == "sip:192.0.2.8" and (first.get("via") or "").startswith("SIP/2.0/TCP ")
    assert first.get("contact") == "<sip:callbridge@127.0.0.1:5060;transport=tcp>"
    ua.receive_stream(9, challenge(first, "carrier"), ("192.0.2.8", 5060), 0.1)
    second = sent()
    assert 'username="u", realm="carrier"' in (second.get("authorization") or "")
    ok = build_response(second, 200, "OK", "reg")
    ok.add("Expires", "600")
    ua.receive_stream(9, ok.to_bytes(), ("192.0.2.8", 5060), 0.2)
    assert ua.events_received() == [RegistrationStateChanged(rid, True, 200, 600)]
    ua.handle_timer(0.2)
    ua.connection_failed(9, 1.0)
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 503)]
    ua.handle_timer(1.0 + REREGISTER_AFTER_DROP_S)
    again = sent()  # on the same conn_id: the shell opens the connection anew
    ua.receive_stream(9, challenge(again, "elsewhere"), ("192.0.2.8", 5060), 2.5)
    assert ua.actions_to_send() == []  # not the trunk's realm: not answered
    assert ua.events_received() == [RegistrationStateChanged(rid, False, 401)]

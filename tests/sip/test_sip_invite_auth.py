"""Outbound INVITEs answer 401/407 digest challenges once per challenge, never in a loop.

A scripted far end (a proxy that asks 407, a callee that asks 401) answers
the user agent's INVITEs; its checks are the server side's own
``DigestVerifier``, so a wrong digest fails the test. Time is a number.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from bridge.engine import SendDatagram
from bridge.sip.digest import (
    AuthResult,
    DigestClient,
    DigestCredentials,
    DigestVerifier,
    parse_auth_params,
)
from bridge.sip.events import OutboundCallAnswered, OutboundCallFailed
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

Address = tuple[str, int]
FAR: Address = ("127.0.0.1", 5090)
TARGET = "sip:+15551230000@trunk.example.com"
FROM = "sip:bot@callbridge.example.com"
SETTINGS = SipSettings(local_host="127.0.0.1", local_port=5070, session_expires_s=0)
OFFER = build_offer("127.0.0.1", 30000, 1, 1)

Responder = Callable[[SipRequest, float], SipResponse | None]


def challenge(
    request: SipRequest,
    status: int,
    verifier: DigestVerifier,
    now: float,
    *,
    stale: bool = False,
    nonce: str | None = None,
) -> SipResponse:
    reason = "Proxy Authentication Required" if status == 407 else "Unauthorized"
    response = build_response(request, status, reason, to_tag="far")
    header = "Proxy-Authenticate" if status == 407 else "WWW-Authenticate"
    for value in verifier.challenges(now, stale=stale):
        if nonce is not None:
            value = value.replace(verifier.nonce(now), nonce)
        response.add(header, value)
    return response


def ok(request: SipRequest) -> SipResponse:
    response = build_response(request, 200, "OK", to_tag="far")
    response.add("Contact", "<sip:far@127.0.0.1:5090>")
    response.add("Content-Type", "application/sdp")
    response.body = build_offer("127.0.0.1", 40000, 2, 1).encode()
    return response


@dataclass
class FarEnd:
    """Feeds the user agent's datagrams to ``respond`` and its answers back."""

    ua: SipUserAgent
    respond: Responder
    invites: list[SipRequest] = field(default_factory=list)
    acks: list[SipRequest] = field(default_factory=list)

    def run(self, now: float) -> list[object]:
        events: list[object] = []
        for _ in range(20):
            actions = self.ua.actions_to_send()
            events += self.ua.events_received()
            if not actions:
                return events
            for action in actions:
                assert isinstance(action, SendDatagram) and action.addr == FAR
                request = parse_message(action.data)
                assert isinstance(request, SipRequest)
                if request.method == "ACK":
                    if request.uri == TARGET:  # not the 2xx ACK (to the Contact)
                        self.acks.append(request)
                    continue
                assert request.method == "INVITE"
                self.invites.append(request)
                response = self.respond(request, now)
                if response is not None:
                    self.ua.receive_datagram(response.to_bytes(), FAR, now)
        raise AssertionError("the user agent kept sending: a loop")


def invite(
    respond: Responder, credentials: tuple[str, str] | DigestCredentials | None
) -> tuple[FarEnd, str, list[object]]:
    ua = SipUserAgent(SETTINGS, random.Random(7))
    far = FarEnd(ua, respond)
    call_id = ua.invite(TARGET, FROM, OFFER, FAR, 0.0, credentials=credentials)
    return far, call_id, far.run(0.0)


def check_sequence(far: FarEnd, acked: int) -> None:
    """Every retry: CSeq + 1, a new branch, the same Call-ID, From tag and Request-URI;
    and the first ``acked`` INVITEs (the challenged ones) were ACKed in their own
    transaction (same branch and CSeq number, RFC 3261 §17.1.1.3)."""
    first = far.invites[0]
    assert [r.cseq().number for r in far.invites] == list(range(1, len(far.invites) + 1))
    assert len({r.top_via().branch for r in far.invites}) == len(far.invites)
    for request in far.invites:
        assert request.call_id == first.call_id
        assert request.from_().tag == first.from_().tag
        assert request.uri == TARGET
    assert [(a.top_via().branch, a.cseq().number) for a in far.acks] == [
        (r.top_via().branch, r.cseq().number) for r in far.invites[:acked]
    ]


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
def test_proxy_407_then_callee_401_both_answered(algorithm: str) -> None:
    proxy = DigestVerifier("proxy.example.com", b"p", {"alice": "pw"}, algorithms=(algorithm,))
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"}, algorithms=(algorithm,))

    def respond(request: SipRequest, now: float) -> SipResponse:
        if proxy.verify(request.get("proxy-authorization"), "INVITE", now) != AuthResult.OK:
            return challenge(request, 407, proxy, now)
        if callee.verify(request.get("authorization"), "INVITE", now) != AuthResult.OK:
            return challenge(request, 401, callee, now)
        return ok(request)

    far, call_id, events = invite(respond, ("alice", "pw"))
    assert [type(e) for e in events] == [OutboundCallAnswered]
    assert len(far.invites) == 3
    assert [r.get("proxy-authorization") is not None for r in far.invites] == [False, True, True]
    assert [r.get("authorization") is not None for r in far.invites] == [False, False, True]
    # qop=auth with an incrementing nonce count for the proxy's (reused) nonce
    _, second = parse_auth_params(far.invites[1].get("proxy-authorization") or "")
    _, third = parse_auth_params(far.invites[2].get("proxy-authorization") or "")
    assert (second["qop"], second["nc"], third["nc"]) == ("auth", "00000001", "00000002")
    assert second["algorithm"] == algorithm and second["uri"] == TARGET
    check_sequence(far, acked=2)  # the 407 and the 401 (the 2xx ACK is the dialog's)
    assert far.invites[0].call_id == call_id


def test_refused_answer_fails_without_a_loop() -> None:
    """A fresh challenge (new nonce, stale=false) after our answer: the password is wrong."""
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"})

    def respond(request: SipRequest, now: float) -> SipResponse:
        if callee.verify(request.get("authorization"), "INVITE", now) != AuthResult.OK:
            return challenge(request, 401, callee, now)
        return ok(request)

    far, call_id, events = invite(respond, ("alice", "wrong"))
    assert events == [OutboundCallFailed(call_id, 401, "Unauthorized")]
    assert len(far.invites) == 2
    check_sequence(far, acked=2)


def test_same_nonce_again_fails() -> None:
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"})
    nonce = callee.nonce(0.0)

    def respond(request: SipRequest, now: float) -> SipResponse:
        return challenge(request, 407, callee, now, nonce=nonce)

    far, call_id, events = invite(respond, ("alice", "pw"))
    assert events == [OutboundCallFailed(call_id, 407, "Proxy Authentication Required")]
    assert len(far.invites) == 2
    assert nonce in (far.invites[1].get("proxy-authorization") or "")


def test_stale_nonce_answered_once_more_then_fails() -> None:
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"})

    def always_stale(request: SipRequest, now: float) -> SipResponse:
        stale = request.get("authorization") is not None
        return challenge(request, 401, callee, now + request.cseq().number, stale=stale)

    far, call_id, events = invite(always_stale, ("alice", "pw"))
    assert events == [OutboundCallFailed(call_id, 401, "Unauthorized")]
    assert len(far.invites) == 3  # first, answer, answer to the stale challenge; no more
    check_sequence(far, acked=3)

    answered: list[int] = []

    def stale_once(request: SipRequest, now: float) -> SipResponse:
        cseq = request.cseq().number
        answered.append(cseq)
        if cseq == 1:
            return challenge(request, 401, callee, 0.0)
        if cseq == 2:
            return challenge(request, 401, callee, 1.0, stale=True)
        assert callee.verify(request.get("authorization"), "INVITE", 1.0) == AuthResult.OK
        return ok(request)

    far, _, events = invite(stale_once, ("alice", "pw"))
    assert [type(e) for e in events] == [OutboundCallAnswered]
    assert answered == [1, 2, 3]


def test_no_credentials_or_other_realm_fails_at_the_first_challenge() -> None:
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"})

    def respond(request: SipRequest, now: float) -> SipResponse:
        return challenge(request, 401, callee, now)

    for credentials in (None, DigestCredentials("alice", "pw", realm="other.example.com")):
        far, call_id, events = invite(respond, credentials)
        assert events == [OutboundCallFailed(call_id, 401, "Unauthorized")]
        assert len(far.invites) == 1 and len(far.acks) == 1


def test_session_interval_retry_keeps_the_answer() -> None:
    """A 422 after an accepted digest answer: the Min-SE retry still carries it."""
    callee = DigestVerifier("callee.example.com", b"c", {"alice": "pw"})

    def respond(request: SipRequest, now: float) -> SipResponse:
        if callee.verify(request.get("authorization"), "INVITE", now) != AuthResult.OK:
            return challenge(request, 401, callee, now)
        if request.get("min-se") is None:
            response = build_response(request, 422, "Session Interval Too Small", to_tag="far")
            response.add("Min-SE", "1900")
            return response
        return ok(request)

    ua = SipUserAgent(replace(SETTINGS, session_expires_s=1800), random.Random(7))
    far = FarEnd(ua, respond)
    ua.invite(TARGET, FROM, OFFER, FAR, 0.0, credentials=("alice", "pw"))
    events = far.run(0.0)
    assert [type(e) for e in events] == [OutboundCallAnswered]
    assert [r.cseq().number for r in far.invites] == [1, 2, 3]
    assert far.invites[2].get("min-se") == "1900"


def test_credentials_never_show_the_password() -> None:
    credentials = DigestCredentials("alice", "hunter2-secret")
    client = DigestClient(credentials)
    assert "hunter2" not in repr(credentials) and "hunter2" not in repr(client)
    verifier = DigestVerifier("r", b"k", {"alice": "hunter2-secret"})
    assert client.on_challenge(401, verifier.challenges(0.0))
    ((name, value),) = client.headers("INVITE", TARGET, "cn")
    assert name == "Authorization" and "hunter2" not in value
    assert not client.on_challenge(401, verifier.challenges(1.0))  # refused: no second answer
    client.reset()
    assert client.on_challenge(401, verifier.challenges(2.0))

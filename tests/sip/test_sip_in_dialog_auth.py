"""Requests we send in a dialog (BYE, re-INVITE, REFER, INFO) answer a 401/407 once.

A scripted far end answers the user agent's datagrams: the dialog's INVITE with
200, and each in-dialog request with what the test's ``Script`` says (a challenge
from the server side's own ``DigestVerifier``, so a wrong digest fails the test,
or a final status). Time is a number; nothing sleeps.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from bridge.engine import SendDatagram
from bridge.sip.digest import (
    AuthResult,
    DigestCredentials,
    DigestVerifier,
    parse_auth_params,
)
from bridge.sip.events import CallEnded, CallOffered, TransferProgress
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings, TrunkConfig
from bridge.sip.ua import SipUserAgent

Address = tuple[str, int]
FAR: Address = ("127.0.0.1", 5090)
TARGET = "sip:+15551230000@trunk.example.com"
FROM = "sip:bot@callbridge.example.com"
PASSWORD = "in-dialog-Secret-93q"
USER = "alice"
REALM = "carrier.example"
SETTINGS = SipSettings(local_host="127.0.0.1", local_port=5070, session_expires_s=0)
OFFER = build_offer("127.0.0.1", 30000, 1, 1)

Reply = Callable[[SipRequest, float], SipResponse]


def challenge(
    request: SipRequest, status: int, verifier: DigestVerifier, now: float, *, stale: bool = False
) -> SipResponse:
    reason = "Proxy Authentication Required" if status == 407 else "Unauthorized"
    response = build_response(request, status, reason)
    header = "Proxy-Authenticate" if status == 407 else "WWW-Authenticate"
    for value in verifier.challenges(now, stale=stale):
        response.add(header, value)
    return response


def answer_of(request: SipRequest, status: int) -> str | None:
    return request.get("proxy-authorization" if status == 407 else "authorization")


@dataclass
class FarEnd:
    """The other end of the dialog: 200 to the INVITE that forms it (an outbound call),
    then each later request answered by the next reply in ``script`` (200 when empty).
    Notes every request but the ACKs, and the ACKs apart."""

    ua: SipUserAgent
    script: list[Reply] = field(default_factory=list)
    requests: list[SipRequest] = field(default_factory=list)
    acks: list[SipRequest] = field(default_factory=list)
    events: list[object] = field(default_factory=list)

    def run(self, now: float) -> None:
        for _ in range(20):
            actions = self.ua.actions_to_send()
            self.events += self.ua.events_received()
            if not actions:
                return
            for action in actions:
                assert isinstance(action, SendDatagram)
                message = parse_message(action.data)
                if isinstance(message, SipResponse):
                    continue  # our answers on an inbound call
                assert isinstance(message, SipRequest)
                if message.method == "ACK":
                    self.acks.append(message)
                    continue
                self.requests.append(message)
                if message.method == "INVITE" and message.to().tag is None:
                    response = build_response(message, 200, "OK", to_tag="far")
                    response.add("Contact", f"<sip:far@{FAR[0]}:{FAR[1]}>")
                    response.add("Content-Type", "application/sdp")
                    response.body = build_offer("127.0.0.1", 40000, 2, 1).encode()
                elif self.script:
                    response = self.script.pop(0)(message, now)
                else:
                    response = build_response(message, 200, "OK")
                self.ua.receive_datagram(response.to_bytes(), FAR, now)
        raise AssertionError("the user agent kept sending: a loop")

    def sent(self, method: str) -> list[SipRequest]:
        return [r for r in self.requests if r.method == method]


CREDENTIALS = DigestCredentials(USER, PASSWORD)


def call_out(credentials: DigestCredentials | None = CREDENTIALS) -> tuple[FarEnd, str]:
    ua = SipUserAgent(SETTINGS, random.Random(11))
    far = FarEnd(ua)
    call_id = ua.invite(TARGET, FROM, OFFER, FAR, 0.0, credentials=credentials)
    far.run(0.0)
    assert far.acks and not far.script
    far.requests.clear()
    far.acks.clear()
    far.events.clear()
    return far, call_id


def verifier_for(algorithm: str) -> DigestVerifier:
    return DigestVerifier(REALM, b"k" * 32, {USER: PASSWORD}, algorithms=(algorithm,))


def challenged(status: int, verifier: DigestVerifier, *, stale: bool = False) -> Reply:
    return lambda request, now: challenge(request, status, verifier, now, stale=stale)


def checked(status: int, verifier: DigestVerifier, final: int = 200) -> Reply:
    """The answer to a challenge: verified (OK, or the test fails), then ``final``."""

    def reply(request: SipRequest, now: float) -> SipResponse:
        header = answer_of(request, status)
        assert verifier.verify(header, request.method, now) is AuthResult.OK, header
        return build_response(request, final, "Accepted" if final == 202 else "OK")

    return reply


def check_retry(first: SipRequest, retry: SipRequest, status: int, algorithm: str) -> None:
    """A new request of the dialog: CSeq + 1, a new branch, the same Call-ID, tags,
    Request-URI, headers and body, with the answer (qop=auth) in the right header."""
    assert retry.cseq().number == first.cseq().number + 1
    assert retry.cseq().method == first.cseq().method == first.method
    assert retry.top_via().branch != first.top_via().branch
    assert (retry.call_id, retry.uri, retry.body) == (first.call_id, first.uri, first.body)
    assert retry.from_().tag == first.from_().tag and retry.to().tag == first.to().tag
    for name in ("contact", "refer-to", "content-type", "content-length"):
        assert retry.get(name) == first.get(name)
    assert answer_of(first, status) is None
    header = answer_of(retry, status)
    assert header is not None
    params = parse_auth_params(header)[1]
    assert (params["username"], params["realm"]) == (USER, REALM)
    assert (params["algorithm"], params["qop"], params["uri"]) == (algorithm, "auth", retry.uri)
    other = "authorization" if status == 407 else "proxy-authorization"
    assert retry.get(other) is None


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
@pytest.mark.parametrize("status", [401, 407])
def test_a_challenged_bye_is_answered_once_after_the_call_ended(
    status: int, algorithm: str
) -> None:
    far, call_id = call_out()
    verifier = verifier_for(algorithm)
    far.script = [challenged(status, verifier), checked(status, verifier)]
    far.ua.hangup(call_id, 10.0)
    far.run(10.0)
    first, retry = far.sent("BYE")
    check_retry(first, retry, status, algorithm)
    assert [type(e) for e in far.events] == [CallEnded]  # ended locally, once
    assert far.ua.active_calls == 0 and not far.ua._dialog_auth
    far.ua.handle_timer(100.0)
    far.run(100.0)
    assert len(far.sent("BYE")) == 2


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
@pytest.mark.parametrize("status", [401, 407])
def test_a_challenged_reinvite_is_answered_and_its_ack_carries_the_answer(
    status: int, algorithm: str
) -> None:
    far, call_id = call_out()
    verifier = verifier_for(algorithm)
    far.script = [challenged(status, verifier), checked(status, verifier)]
    hold = build_offer("127.0.0.1", 30000, 1, 2, direction="sendonly")
    far.ua.reinvite(call_id, hold, 10.0)
    far.run(10.0)
    first, retry = far.sent("INVITE")
    check_retry(first, retry, status, algorithm)
    assert retry.body == hold.encode()
    # the challenge's ACK (its transaction's, no credentials) and the 2xx's ACK (with them)
    challenge_ack, ok_ack = far.acks
    assert challenge_ack.cseq().number == first.cseq().number
    assert answer_of(challenge_ack, status) is None
    assert ok_ack.cseq().number == retry.cseq().number
    assert answer_of(ok_ack, status) == answer_of(retry, status)
    assert far.events == []
    far.ua.reinvite(call_id, OFFER, 20.0)  # no offer left pending: a new one may go
    far.run(20.0)
    assert len(far.sent("INVITE")) == 3


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
@pytest.mark.parametrize("status", [401, 407])
def test_a_challenged_refer_is_answered_and_only_its_real_result_is_reported(
    status: int, algorithm: str
) -> None:
    far, call_id = call_out()
    verifier = verifier_for(algorithm)
    far.script = [challenged(status, verifier), checked(status, verifier, final=202)]
    far.ua.refer(call_id, "sip:carol@example.org", 10.0)
    far.run(10.0)
    first, retry = far.sent("REFER")
    check_retry(first, retry, status, algorithm)
    assert far.events == [TransferProgress(call_id, 202, "Accepted", False)]


def test_a_challenged_info_is_answered_too() -> None:
    far, call_id = call_out()
    verifier = verifier_for("SHA-256")
    far.script = [challenged(401, verifier), checked(401, verifier)]
    far.ua.send_info(call_id, "Signal=5\r\nDuration=160\r\n", "application/dtmf-relay", 10.0)
    far.run(10.0)
    first, retry = far.sent("INFO")
    check_retry(first, retry, 401, "SHA-256")


@pytest.mark.parametrize("status", [401, 407])
def test_a_second_challenge_is_not_answered(status: int) -> None:
    far, call_id = call_out()
    verifier = verifier_for("MD5")
    refuse = challenged(status, verifier)
    far.script = [refuse, refuse, refuse, refuse]
    far.ua.refer(call_id, "sip:carol@example.org", 10.0)
    far.run(10.0)
    assert len(far.sent("REFER")) == 2
    reason = "Proxy Authentication Required" if status == 407 else "Unauthorized"
    assert far.events == [TransferProgress(call_id, status, reason, True)]
    far.ua.hangup(call_id, 20.0)
    far.run(20.0)
    assert len(far.sent("BYE")) == 2  # each request its own answer, once
    assert [type(e) for e in far.events[1:]] == [CallEnded]
    assert not far.ua._dialog_auth


def test_a_refused_reinvite_leaves_no_offer_pending() -> None:
    far, call_id = call_out()
    refuse = challenged(401, verifier_for("MD5"))
    far.script = [refuse, refuse]
    far.ua.reinvite(call_id, OFFER, 10.0)
    far.run(10.0)
    assert len(far.sent("INVITE")) == 2 and far.events == []
    far.ua.reinvite(call_id, OFFER, 20.0)  # the refusal ended the offer: not pending
    far.run(20.0)
    assert len(far.sent("INVITE")) == 3


def test_stale_is_answered_once_more_then_not() -> None:
    far, call_id = call_out()
    verifier = verifier_for("SHA-256")
    far.script = [
        challenged(401, verifier),
        challenged(401, verifier, stale=True),
        challenged(401, verifier, stale=True),
    ]
    far.ua.hangup(call_id, 10.0)
    far.run(10.0)
    assert [r.cseq().number for r in far.sent("BYE")] == [2, 3, 4]


@pytest.mark.parametrize("status", [401, 407])
def test_without_credentials_a_challenge_is_the_result(status: int) -> None:
    far, call_id = call_out(credentials=None)
    refuse = challenged(status, verifier_for("MD5"))
    far.script = [refuse, refuse]
    far.ua.refer(call_id, "sip:carol@example.org", 10.0)
    far.run(10.0)
    assert len(far.sent("REFER")) == 1
    assert [(e.status, e.final) for e in far.events if isinstance(e, TransferProgress)] == [
        (status, True)
    ]
    far.ua.hangup(call_id, 20.0)
    far.run(20.0)
    assert len(far.sent("BYE")) == 1 and not far.ua._dialog_auth


def test_a_realm_the_credentials_are_not_for_is_not_answered() -> None:
    far, call_id = call_out(DigestCredentials(USER, PASSWORD, realm="other.example"))
    far.script = [challenged(401, verifier_for("MD5"))]
    far.ua.hangup(call_id, 10.0)
    far.run(10.0)
    assert len(far.sent("BYE")) == 1


def test_a_timed_out_in_dialog_request_leaves_nothing_behind() -> None:
    far, call_id = call_out()
    far.ua.hangup(call_id, 10.0)
    far.ua.actions_to_send()  # the BYE is lost, and every retransmission of it
    assert far.ua._dialog_auth
    far.ua.handle_timer(10.0 + 64 * SETTINGS.timers.t1_s)
    far.ua.actions_to_send()
    assert not far.ua._dialog_auth


CARRIER: Address = ("192.0.2.10", 5060)
B_URI = "sip:bot@127.0.0.1:5070"


def inbound_invite(call_id: str) -> bytes:
    host, port = CARRIER
    return (
        f"INVITE {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{call_id};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:carrier@{host}>;tag=f{call_id}\r\n"
        f"To: <{B_URI}>\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\n"
        f"Contact: <sip:carrier@{host}:{port}>\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def inbound_call(trunk: TrunkConfig) -> tuple[FarEnd, str]:
    """An answered call in from the carrier's address (and its ACK)."""
    settings = SipSettings(local_host="127.0.0.1", local_port=5070, session_expires_s=0,
                           trunks=(trunk,))  # fmt: skip
    ua = SipUserAgent(settings, random.Random(5))
    far = FarEnd(ua)
    ua.receive_datagram(inbound_invite("in1"), CARRIER, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    ua.answer(offered.call_id, OFFER, 0.0)
    ua.actions_to_send()
    ack = (
        f"ACK {B_URI} SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKack1\r\n"
        "Max-Forwards: 70\r\nFrom: <sip:carrier@192.0.2.10>;tag=fin1\r\n"
        f"To: <{B_URI}>;tag={ua._calls['in1'].dialog.local_tag}\r\nCall-ID: in1\r\n"
        "CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
    )
    ua.receive_datagram(ack.encode(), CARRIER, 0.1)
    ua.events_received()
    return far, offered.call_id


def test_a_call_in_from_a_trunk_answers_with_the_trunks_credentials() -> None:
    trunk = TrunkConfig(
        "carrier", "sip:carrier.example", sources=("192.0.2.0/24",), user=USER, password=PASSWORD
    )
    far, call_id = inbound_call(trunk)
    verifier = verifier_for("SHA-256")
    far.script = [challenged(407, verifier), checked(407, verifier)]
    far.ua.hangup(call_id, 10.0)
    far.run(10.0)
    first, retry = far.sent("BYE")
    check_retry(first, retry, 407, "SHA-256")
    assert retry.uri == "sip:carrier@192.0.2.10:5060"


def test_a_call_in_from_a_trunk_without_credentials_does_not_answer() -> None:
    far, call_id = inbound_call(
        TrunkConfig("carrier", "sip:carrier.example", sources=("192.0.2.0/24",))
    )
    far.script = [challenged(401, verifier_for("MD5"))]
    far.ua.hangup(call_id, 10.0)
    far.run(10.0)
    assert len(far.sent("BYE")) == 1


def test_no_password_or_digest_response_reaches_a_log_or_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    far, call_id = call_out()
    verifier = verifier_for("SHA-256")
    far.script = [challenged(401, verifier), checked(401, verifier, final=202)]
    far.script += [challenged(407, verifier), checked(407, verifier)]
    far.ua.refer(call_id, "sip:carol@example.org", 10.0)
    far.run(10.0)
    far.ua.hangup(call_id, 11.0)
    far.run(11.0)
    responses = [
        parse_auth_params(value)[1]["response"]
        for r in far.requests
        for value in (r.get("authorization"), r.get("proxy-authorization"))
        if value is not None
    ]
    assert len(responses) == 2
    seen = caplog.text + repr(far.events) + repr(far.ua._calls) + repr(far.ua._dialog_auth)
    for secret in (PASSWORD, *responses):
        assert secret not in seen


@pytest.mark.parametrize("status", [401, 407])
def test_a_second_forks_2xx_is_acked_and_its_bye_answers_a_challenge(status: int) -> None:
    """A forking proxy: two phones answer the one INVITE (200s with two To tags). The
    call is the first one's; the second's 200 is ACKed and that dialog ended by a BYE
    (RFC 3261 §13.2.2.4), which answers a challenge with the call's credentials. A
    retransmitted 200 of the first is only ACKed again."""
    ua = SipUserAgent(SETTINGS, random.Random(12))
    call_id = ua.invite(TARGET, FROM, OFFER, FAR, 0.0, credentials=CREDENTIALS)

    def sent() -> list[SipRequest]:
        out = []
        for action in ua.actions_to_send():
            assert isinstance(action, SendDatagram)
            message = parse_message(action.data)
            assert isinstance(message, SipRequest)
            out.append(message)
        return out

    def answered(tag: str) -> bytes:
        ok = build_response(invite, 200, "OK", to_tag=tag)
        ok.add("Contact", f"<sip:{tag}@{FAR[0]}:{FAR[1]}>")
        ok.add("Content-Type", "application/sdp")
        ok.body = build_offer("127.0.0.1", 40000, 2, 1).encode()
        return ok.to_bytes()

    (invite,) = sent()
    ua.receive_datagram(answered("first"), FAR, 0.1)
    (ack,) = sent()
    assert ack.method == "ACK" and ack.to().tag == "first"
    ua.receive_datagram(answered("first"), FAR, 0.2)  # retransmitted: the same ACK again
    assert [(r.method, r.to().tag) for r in sent()] == [("ACK", "first")]
    ua.receive_datagram(answered("second"), FAR, 0.3)
    ack2, bye = sent()
    assert (ack2.method, ack2.to().tag) == ("ACK", "second")
    assert (bye.method, bye.to().tag, bye.call_id) == ("BYE", "second", call_id)
    assert answer_of(bye, status) is None
    verifier = verifier_for("MD5")
    ua.receive_datagram(challenge(bye, status, verifier, 0.4).to_bytes(), FAR, 0.4)
    (retry,) = sent()
    check_retry(bye, retry, status, "MD5")
    assert verifier.verify(answer_of(retry, status), "BYE", 0.4) is AuthResult.OK
    assert ua.active_calls == 1  # the first phone's call goes on
    assert [type(e).__name__ for e in ua.events_received()] == ["OutboundCallAnswered"]

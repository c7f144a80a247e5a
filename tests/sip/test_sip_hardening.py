"""Input that must not escape the SIP engine, and the digest checks a scanner meets (issue 33).

Regressions first (each a crash or hole found by reading or fuzzing), then
Hypothesis with Unicode, not only ASCII mutations: whatever a message, an SDP
body or an ``Authorization`` header holds, nothing raises out of the user
agent, every server transaction is answered and removed once its timers run,
and a normal INVITE placed afterwards still gets its call offered.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import SendDatagram
from bridge.sip.digest import (
    MAX_REPLAY_MEMORY,
    AuthResult,
    DigestVerifier,
    authorization,
    choose_challenge,
    parse_challenge,
)
from bridge.sip.errors import SipParseError
from bridge.sip.events import AuthFailed, CallEstablished, CallOffered
from bridge.sip.message import SipResponse, parse_content_length, parse_message
from bridge.sip.sdp import SdpError, parse_sdp
from bridge.sip.settings import SipAuthUser, SipSettings
from bridge.sip.ua import SipUserAgent
from bridge.sip.uri import ascii_digits

A_ADDR = ("192.0.2.10", 5070)
B_URI = "sip:bot@127.0.0.1:5060"
A_URI = "sip:carrier@192.0.2.10:5070"
BASE = SipSettings(local_host="127.0.0.1", session_expires_s=0)
AUTH = replace(BASE, auth_users=(SipAuthUser("carrier", "s3cret"),), auth_secret=b"k" * 32)
FUZZ = settings(max_examples=200, deadline=None, derandomize=True)

#: characters that pass ``str.isdigit`` (or look like syntax) but are not ASCII
TRICKY = "²³¹٣۴߄०৩๓໓０𝟘①\u00a0\u2028\u0085\ufeff\udcff"


def invite(
    call_id: str = "c1",
    branch: str = "b1",
    extra: str = "",
    length: str = "0",
    method: str = "INVITE",
) -> bytes:
    return (
        f"{method} {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5070;branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <{A_URI}>;tag=f{branch}\r\n"
        f"To: <{B_URI}>\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: 1 {method}\r\n"
        f"Contact: <{A_URI}>\r\n"
        f"{extra}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode("utf-8", "surrogatepass")


def responses(ua: SipUserAgent) -> list[SipResponse]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipResponse)
        out.append(message)
    return out


def settle(ua: SipUserAgent, now: float) -> None:
    """Run every timer up to ``now`` + 64 s: every transaction ends (Timer H/J/I)."""
    end = now + 64.0
    while (deadline := ua.next_deadline()) is not None and deadline <= end:
        ua.handle_timer(deadline)
    ua.actions_to_send()


def answer_to(ua_or_challenge: SipResponse, user: str, password: str, nc: int = 1) -> str:
    challenge = choose_challenge(ua_or_challenge.get_lines("www-authenticate"))
    assert challenge is not None
    return authorization(
        challenge, username=user, password=password, method="INVITE", uri=B_URI, cnonce="cn", nc=nc
    )


def assert_normal_call_still_offered(ua: SipUserAgent, now: float) -> None:
    ua.events_received()
    ua.receive_datagram(invite("after", "after"), A_ADDR, now)
    assert any(isinstance(e, CallOffered) for e in ua.events_received())
    assert [r.status for r in responses(ua)][:1] == [100]


# ------------------------------------------------------------- regressions


def test_ascii_digits_refuses_unicode_digits() -> None:
    assert ascii_digits("0123") and not ascii_digits("")
    for c in TRICKY[:12]:
        assert not ascii_digits(c) and not ascii_digits("1" + c)


@pytest.mark.parametrize("value", ["²", "1²", "٣", "０", "1\u00a0"])
def test_unicode_content_length_is_a_400_not_an_exception(value: str) -> None:
    with pytest.raises(SipParseError):
        parse_content_length(value)
    ua = SipUserAgent(BASE, random.Random(1))
    ua.receive_datagram(invite(length=value), A_ADDR, 0.0)  # raised ValueError before
    assert [r.status for r in responses(ua)] == [400]
    assert ua.events_received() == []
    settle(ua, 0.0)
    assert ua._server_txs == {}
    assert_normal_call_still_offered(ua, 100.0)


@pytest.mark.parametrize(
    "header",
    ["CSeq: ²", "Max-Forwards: ٣", "Expires: ０"],
)
def test_unicode_digits_in_other_numeric_headers_do_not_escape(header: str) -> None:
    ua = SipUserAgent(BASE, random.Random(2))
    data = invite().replace(b"Max-Forwards: 70\r\n", (header + "\r\n").encode())
    if header.startswith("CSeq"):
        data = data.replace(b"CSeq: 1 INVITE\r\n", b"")
    ua.receive_datagram(data, A_ADDR, 0.0)
    ua.actions_to_send()
    ua.events_received()
    settle(ua, 0.0)
    assert ua._server_txs == {}
    assert_normal_call_still_offered(ua, 100.0)


def test_non_ascii_digest_response_is_answered_and_the_transaction_removed() -> None:
    ua = SipUserAgent(AUTH, random.Random(3))
    ua.receive_datagram(invite("c0", "b0"), A_ADDR, 0.0)
    (challenge,) = responses(ua)
    assert challenge.status == 401
    header = answer_to(challenge, "carrier", "s3cret").replace('response="', 'response="é')
    ua.receive_datagram(invite("c1", "b1", f"Authorization: {header}\r\n"), A_ADDR, 1.0)
    # before: compare_digest raised TypeError, no answer, the transaction stayed forever
    assert [r.status for r in responses(ua)] == [401]
    settle(ua, 1.0)
    assert ua._server_txs == {} and ua._calls == {}


# -------------------------------------------------------------- digest


def fresh_answer(verifier: DigestVerifier, now: float, binding: str, nc: int = 1) -> str:
    challenge = parse_challenge(verifier.challenges(now, binding=binding)[0])
    assert challenge is not None
    return authorization(
        challenge, username="carrier", password="s3cret", method="INVITE", uri=B_URI,
        cnonce="cn", nc=nc,
    )  # fmt: skip


def test_nonce_is_bound_to_the_transport_and_source_it_was_issued_to() -> None:
    verifier = DigestVerifier("callbridge", b"k" * 32, {"carrier": "s3cret"})
    good = fresh_answer(verifier, 0.0, "UDP|192.0.2.10")
    assert verifier.verify(good, "INVITE", 1.0, "TCP|192.0.2.10") is AuthResult.FAILED
    good = fresh_answer(verifier, 0.0, "UDP|192.0.2.10")
    assert verifier.verify(good, "INVITE", 1.0, "UDP|198.51.100.7") is AuthResult.FAILED
    good = fresh_answer(verifier, 0.0, "UDP|192.0.2.10")
    assert verifier.verify(good, "INVITE", 1.0, "UDP|192.0.2.10") is AuthResult.OK


def test_nonce_count_must_increase_and_a_new_cnonce_does_not_reopen_a_nonce() -> None:
    verifier = DigestVerifier("callbridge", b"k" * 32, {"carrier": "s3cret"})
    challenge = parse_challenge(verifier.challenges(0.0)[0])
    assert challenge is not None

    def answer(nc: int, cnonce: str) -> str:
        return authorization(
            challenge, username="carrier", password="s3cret", method="INVITE", uri=B_URI,
            cnonce=cnonce, nc=nc,
        )  # fmt: skip

    assert verifier.verify(answer(1, "a"), "INVITE", 1.0) is AuthResult.OK
    assert verifier.verify(answer(1, "b"), "INVITE", 2.0) is AuthResult.FAILED  # same nc
    assert verifier.verify(answer(2, "b"), "INVITE", 2.0) is AuthResult.OK
    assert verifier.verify(answer(2, "c"), "INVITE", 3.0) is AuthResult.FAILED
    # the nonce's lifetime is short: 30 s by default, then stale
    assert verifier.verify(answer(3, "c"), "INVITE", 31.0) is AuthResult.STALE


def test_a_forgotten_nonce_reads_as_stale_never_as_fresh() -> None:
    verifier = DigestVerifier("callbridge", b"k" * 32, {"carrier": "s3cret"}, 1e9)
    first = fresh_answer(verifier, 0.0, "")
    assert verifier.verify(first, "INVITE", 0.5) is AuthResult.OK
    for i in range(MAX_REPLAY_MEMORY):
        assert verifier.verify(fresh_answer(verifier, 1.0 + i, ""), "INVITE", 1.0 + i) is (
            AuthResult.OK
        )
    # the first nonce was evicted from the replay memory: a replay gets stale, not OK
    assert verifier.verify(first, "INVITE", 1e6) is AuthResult.STALE


def test_repeated_failures_from_one_source_are_reported_then_blocked_without_a_challenge() -> None:
    ua = SipUserAgent(replace(AUTH, auth_max_failures=3), random.Random(4))
    ua.receive_datagram(invite("c0", "b0"), A_ADDR, 0.0)
    (challenge,) = responses(ua)
    statuses = []
    for i in range(1, 6):
        header = answer_to(challenge, "carrier", f"guess{i}")
        ua.receive_datagram(invite(f"c{i}", f"b{i}", f"Authorization: {header}\r\n"), A_ADDR, i)
        statuses += [r.status for r in responses(ua)]  # each guess burns its nonce too
    assert statuses == [401, 401, 403, 403, 403]
    events = ua.events_received()
    assert events == [
        AuthFailed("192.0.2.10", "UDP", "carrier", False),
        AuthFailed("192.0.2.10", "UDP", "carrier", False),
        AuthFailed("192.0.2.10", "UDP", "carrier", True),
    ]
    # another source is not affected; the blocked one is let back after the window
    other = ("198.51.100.7", 5070)
    ua.receive_datagram(invite("o1", "o1"), other, 6.0)
    assert [r.status for r in responses(ua)] == [401]
    ua.receive_datagram(invite("late", "late"), A_ADDR, 61.0)
    assert [r.status for r in responses(ua)] == [401]


def test_right_password_from_a_challenge_still_connects() -> None:
    ua = SipUserAgent(AUTH, random.Random(5))
    ua.receive_datagram(invite("c0", "b0"), A_ADDR, 0.0)
    (challenge,) = responses(ua)
    header = answer_to(challenge, "carrier", "s3cret")
    ua.receive_datagram(invite("c1", "b1", f"Authorization: {header}\r\n"), A_ADDR, 1.0)
    assert [r.status for r in responses(ua)] == [100]
    assert [type(e) for e in ua.events_received()] == [CallOffered]


# ------------------------------------------------------------ fuzzing

UNICODE = st.text(st.characters(codec=None, exclude_categories=("Cs",)), max_size=40)
WEIRD = st.one_of(UNICODE, st.text(TRICKY + '0123456789 :;=,"\\', max_size=20))
HEADERS = [
    "Content-Length", "CSeq", "Max-Forwards", "Expires", "Via", "From", "To", "Call-ID",
    "Contact", "Session-Expires", "Min-SE", "Require", "Content-Type", "Authorization",
    "Event", "Refer-To", "RSeq",
]  # fmt: skip


@FUZZ
@given(
    header=st.sampled_from(HEADERS),
    value=WEIRD,
    method=st.sampled_from(["INVITE", "OPTIONS", "BYE", "INFO", "CANCEL", "REGISTER", "ÍNVITE"]),
    auth=st.booleans(),
)
def test_unicode_in_any_header_never_escapes_and_state_returns_to_baseline(
    header: str, value: str, method: str, auth: bool
) -> None:
    ua = SipUserAgent(AUTH if auth else BASE, random.Random(6))
    data = invite(method=method)
    line = f"{header}: {value}\r\n".encode("utf-8", "surrogatepass")
    if header in ("Content-Length", "CSeq", "Max-Forwards", "Via", "From", "To", "Call-ID"):
        lines = data.split(b"\r\n")
        lines = [ln for ln in lines if not ln.lower().startswith(header.lower().encode() + b":")]
        data = b"\r\n".join(lines[:2]) + b"\r\n" + line + b"\r\n".join(lines[2:])
    else:
        data = data.replace(b"Max-Forwards", line + b"Max-Forwards", 1)
    ua.receive_datagram(data, A_ADDR, 0.0)
    ua.actions_to_send()
    for event in ua.events_received():
        if isinstance(event, CallOffered):
            ua.reject(event.call_id, 486, "Busy Here", 1.0)
    settle(ua, 1.0)
    assert ua._server_txs == {} and ua._calls == {}
    if not auth:
        assert_normal_call_still_offered(ua, 200.0)


@FUZZ
@given(st.binary(max_size=64), st.sampled_from(["utf-8", "latin-1", "utf-16"]), UNICODE)
def test_unicode_and_bytes_anywhere_in_a_datagram_never_escape(
    noise: bytes, encoding: str, text: str
) -> None:
    ua = SipUserAgent(BASE, random.Random(7))
    base = invite()
    cut = len(noise) % len(base)
    data = base[:cut] + text.encode(encoding, "replace") + noise + base[cut:]
    ua.receive_datagram(data, A_ADDR, 0.0)
    ua.actions_to_send()
    for event in ua.events_received():
        if isinstance(event, CallOffered):
            ua.reject(event.call_id, 486, "Busy Here", 1.0)
    ua.receive_stream(1, data, A_ADDR, 0.5)
    ua.receive_stream(1, data[::-1], A_ADDR, 0.6)
    ua.connection_lost(1)
    settle(ua, 1.0)
    assert ua._server_txs == {} and ua._calls == {} and ua._framers == {}
    assert_normal_call_still_offered(ua, 200.0)


SDP = (
    "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    "m=audio 4000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-15\r\na=ptime:20\r\na=sendrecv\r\n"
)


@FUZZ
@given(pos=st.integers(0, len(SDP)), text=WEIRD, cut=st.integers(0, 8))
def test_unicode_in_sdp_never_escapes_the_parser_or_the_user_agent(
    pos: int, text: str, cut: int
) -> None:
    body = SDP[:pos] + text + SDP[pos + cut :]
    with contextlib.suppress(SdpError):
        parse_sdp(body)
    ua = SipUserAgent(BASE, random.Random(8))
    raw = body.encode("utf-8", "surrogatepass")
    data = invite(extra="Content-Type: application/sdp\r\n", length=str(len(raw))) + raw
    ua.receive_datagram(data, A_ADDR, 0.0)
    ua.actions_to_send()
    for event in ua.events_received():
        if isinstance(event, CallOffered):
            ua.reject(event.call_id, 486, "Busy Here", 1.0)
    settle(ua, 1.0)
    assert ua._server_txs == {} and ua._calls == {}


DIGEST_FIELDS = [
    "username", "realm", "nonce", "uri", "response", "nc", "qop", "cnonce", "algorithm"
]  # fmt: skip


@FUZZ
@given(field=st.sampled_from(DIGEST_FIELDS), value=WEIRD, quoted=st.booleans())
def test_unicode_in_a_digest_answer_is_a_challenge_never_an_exception(
    field: str, value: str, quoted: bool
) -> None:
    ua = SipUserAgent(AUTH, random.Random(9))
    ua.receive_datagram(invite("c0", "b0"), A_ADDR, 0.0)
    (challenge,) = responses(ua)
    header = answer_to(challenge, "carrier", "s3cret")
    params = header[len("Digest ") :].split(", ")
    shown = f'"{value}"' if quoted else value
    params = [f"{field}={shown}" if p.startswith(field + "=") else p for p in params]
    data = invite("c1", "b1", f"Authorization: Digest {', '.join(params)}\r\n")
    ua.receive_datagram(data, A_ADDR, 1.0)
    statuses = [r.status for r in responses(ua)]
    # challenged, refused, dropped (not UTF-8: no answer is built), or (value unchanged) in
    assert statuses in ([401], [400], [], [100])
    ua.events_received()
    for call_id in list(ua._calls):
        ua.reject(call_id, 486, "Busy Here", 1.0)
    settle(ua, 1.0)
    assert ua._server_txs == {} and ua._calls == {}


def test_empty_via_is_a_400_not_an_exception() -> None:
    """Found by the fuzz above: ``Via:`` with no value passed the parser and
    ``top_via()`` raised out of ``receive_datagram``."""
    ua = SipUserAgent(BASE, random.Random(10))
    data = invite().replace(b"Via: SIP/2.0/UDP 192.0.2.10:5070;branch=z9hG4bKb1;rport", b"Via: ")
    ua.receive_datagram(data, A_ADDR, 0.0)
    assert ua.events_received() == []
    settle(ua, 0.0)
    assert ua._server_txs == {}
    assert_normal_call_still_offered(ua, 100.0)


def test_malformed_require_is_a_400_not_an_exception() -> None:
    """Found by the fuzz above: ``Require: "`` raised out of the handler (the
    header is split lazily) and left the INVITE's transaction unanswered."""
    ua = SipUserAgent(BASE, random.Random(11))
    ua.receive_datagram(invite(extra='Require: "\r\n'), A_ADDR, 0.0)
    assert [r.status for r in responses(ua)] == [400]
    assert ua.events_received() == []
    settle(ua, 0.0)
    assert ua._server_txs == {}
    assert_normal_call_still_offered(ua, 100.0)


ANSWER = (
    "v=0\r\no=- 2 2 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
)
BODIES = st.sampled_from(
    [
        ("application/dtmf-relay", "Signal={v}\r\nDuration={v}\r\n"),
        ("application/dtmf", "{v}"),
        ("application/sdp", SDP.replace("4000", "{v}")),
        ("application/sdp", SDP.replace("0 101", "{v}")),
        ("message/sipfrag", "SIP/2.0 {v} OK"),
        ("text/plain", "{v}"),
    ]
)
IN_DIALOG = st.sampled_from(["INFO", "UPDATE", "INVITE", "OPTIONS", "NOTIFY", "BYE", "REFER"])


def in_dialog(method: str, to_tag: str, cseq: int, extra: str = "", body: bytes = b"") -> bytes:
    head = (
        f"{method} sip:bot@127.0.0.1:5060 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5070;branch=z9hG4bKd{method}{cseq};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <{A_URI}>;tag=fd1\r\n"
        f"To: <{B_URI}>;tag={to_tag}\r\n"
        "Call-ID: d1\r\n"
        f"CSeq: {cseq} {method}\r\n"
        f"Contact: <{A_URI}>\r\n"
        f"{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("utf-8", "surrogatepass") + body


@FUZZ
@given(method=IN_DIALOG, header=st.sampled_from(HEADERS), value=WEIRD, body=BODIES)
def test_unicode_inside_a_dialog_never_escapes_and_the_call_still_ends_cleanly(
    method: str, header: str, value: str, body: tuple[str, str]
) -> None:
    ua = SipUserAgent(BASE, random.Random(12))
    offer = SDP.encode()
    opening = (
        invite("d1", "fd1", "Content-Type: application/sdp\r\n", str(len(offer))).replace(
            b"tag=ffd1", b"tag=fd1"
        )
        + offer
    )
    ua.receive_datagram(opening, A_ADDR, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    ua.answer(offered.call_id, ANSWER, 0.1)
    (ok,) = [r for r in responses(ua) if r.status == 200]
    to_tag = ok.to().tag
    assert to_tag
    ua.receive_datagram(in_dialog("ACK", to_tag, 1), A_ADDR, 0.2)
    assert [type(e) for e in ua.events_received()] == [CallEstablished]
    ctype, template = body
    raw_body = template.replace("{v}", value).encode("utf-8", "surrogatepass")
    extra = f"Content-Type: {ctype}\r\n"
    if header not in ("Content-Length", "CSeq", "Via", "From", "To", "Call-ID"):
        extra += f"{header}: {value}\r\n"
    ua.receive_datagram(in_dialog(method, to_tag, 2, extra, raw_body), A_ADDR, 1.0)
    ua.actions_to_send()
    ua.events_received()
    if ua._calls:
        ua.receive_datagram(in_dialog("BYE", to_tag, 3), A_ADDR, 2.0)
    ua.actions_to_send()
    ua.events_received()
    settle(ua, 2.0)
    for call_id in list(ua._calls):  # (a re-INVITE left waiting for its ACK, say)
        ua.hangup(call_id, 70.0)
    settle(ua, 70.0)
    assert ua._server_txs == {} and ua._calls == {}
    assert_normal_call_still_offered(ua, 200.0)

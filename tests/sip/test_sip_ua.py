"""Two SipUserAgent engines wired in-process by a tiny datagram simulator.

Time is a number: the simulator jumps to the next engine deadline. Loss is a
pattern: start-line prefixes whose next matching datagram is dropped.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import Event, SendDatagram
from bridge.sip.digest import DigestVerifier, authorization, choose_challenge
from bridge.sip.events import (
    AuthFailed,
    CallCancelled,
    CallEnded,
    CallEstablished,
    CallOffered,
    DtmfInfoReceived,
    HoldChanged,
    OutboundCallAnswered,
    OutboundCallFailed,
    RegistrationStateChanged,
    SendStream,
    TransferProgress,
)
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message
from bridge.sip.sdp import build_offer, parse_sdp
from bridge.sip.settings import SipAuthUser, SipSettings
from bridge.sip.ua import SipUserAgent

Address = tuple[str, int]
A_ADDR: Address = ("127.0.0.1", 5070)
B_ADDR: Address = ("127.0.0.1", 5060)
BASE = SipSettings(local_host="127.0.0.1", session_expires_s=0)
B_URI = "sip:bot@127.0.0.1:5060"
A_URI = "sip:carrier@127.0.0.1:5070"


@dataclass
class Sim:
    agents: dict[Address, SipUserAgent]
    now: float = 0.0
    drop: list[str] = field(default_factory=list)
    drop_always: list[str] = field(default_factory=list)
    log: list[tuple[float, Address, Address, str]] = field(default_factory=list)
    events: dict[Address, list[Event]] = field(default_factory=dict)
    raw_out: list[tuple[Address, bytes]] = field(default_factory=list)
    wire: list[bytes] = field(default_factory=list)

    def pump(self) -> None:
        moved = True
        while moved:
            moved = False
            for addr, agent in self.agents.items():
                self.events.setdefault(addr, []).extend(agent.events_received())
                for action in agent.actions_to_send():
                    assert isinstance(action, SendDatagram)
                    moved = True
                    self._deliver(addr, action)
        for agent in self.agents.values():
            assert agent.next_deadline() == scanned_deadline(agent)

    def _deliver(self, src: Address, action: SendDatagram) -> None:
        first = action.data.split(b"\r\n", 1)[0].decode()
        self.log.append((self.now, src, action.addr, first))
        self.wire.append(action.data)
        for prefix in self.drop:
            if first.startswith(prefix):
                self.drop.remove(prefix)
                return
        if any(first.startswith(prefix) for prefix in self.drop_always):
            return
        target = self.agents.get(action.addr)
        if target is None:
            self.raw_out.append((action.addr, action.data))
        else:
            target.receive_datagram(action.data, src, self.now)

    def run_until(self, until: float) -> None:
        self.pump()
        while True:
            deadlines = [
                (d, a) for a in self.agents.values() if (d := a.next_deadline()) is not None
            ]
            if not deadlines:
                break
            deadline, _ = min(deadlines, key=lambda item: item[0])
            if deadline > until:
                break
            self.now = max(self.now, deadline)
            for agent in self.agents.values():
                due = agent.next_deadline()
                if due is not None and due <= self.now:
                    agent.handle_timer(self.now)
            self.pump()
        self.now = max(self.now, until)

    def take(self, addr: Address) -> list[Event]:
        events, self.events[addr] = self.events.get(addr, []), []
        return events

    def sent(self, prefix: str) -> list[float]:
        return [round(t, 6) for t, _, _, first in self.log if first.startswith(prefix)]


def scanned_deadline(agent: SipUserAgent) -> float | None:
    """The earliest deadline of every transaction, call and registration, found by a full
    scan: the user agent's timer heap must agree after every step (a missed reschedule
    would fire a timer late)."""
    deadlines = [e.tx.next_deadline() for e in agent._server_txs.values()]
    deadlines += [e.tx.next_deadline() for e in agent._client_txs.values()]
    deadlines += [c.next_deadline() for c in agent._calls.values()]
    deadlines += [r.refresh_at for r in agent._registrations.values()]
    known = [d for d in deadlines if d is not None]
    return min(known) if known else None


def make(
    a: SipSettings | None = None, b: SipSettings | None = None
) -> tuple[Sim, SipUserAgent, SipUserAgent]:
    ua_a = SipUserAgent(a or replace(BASE, local_port=5070), random.Random(1))
    ua_b = SipUserAgent(b or replace(BASE, local_port=5060), random.Random(2))
    return Sim({A_ADDR: ua_a, B_ADDR: ua_b}), ua_a, ua_b


def offer(port: int = 30000, direction: str = "sendrecv") -> str:
    return build_offer("127.0.0.1", port, 11, 1, direction=direction)  # type: ignore[arg-type]


def answer_for(offered: CallOffered, port: int = 40000) -> str:
    return build_offer("127.0.0.1", port, 22, 1, codecs=("PCMU",))


def call(sim: Sim, a: SipUserAgent, b: SipUserAgent) -> tuple[str, CallOffered]:
    """Place a call from A to B and let B answer it."""
    call_id = a.invite(B_URI, A_URI, offer(), B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    (offered,) = [e for e in sim.take(B_ADDR) if isinstance(e, CallOffered)]
    b.answer(offered.call_id, answer_for(offered), sim.now)
    sim.run_until(sim.now + 0.01)
    return call_id, offered


def test_invite_trying_ok_ack_bye() -> None:
    sim, a, b = make()
    call_id = a.invite(B_URI, A_URI, offer(), B_ADDR, 0.0)
    sim.run_until(0.01)
    assert [first for *_, first in sim.log] == [f"INVITE {B_URI} SIP/2.0", "SIP/2.0 100 Trying"]
    (offered,) = sim.take(B_ADDR)
    assert isinstance(offered, CallOffered)
    assert offered.call_id == call_id and offered.from_uri == A_URI and offered.source == A_ADDR
    assert parse_sdp(offered.offer_sdp).media[0].port == 30000
    b.answer(call_id, answer_for(offered), 0.01)
    sim.run_until(0.02)
    (answered,) = sim.take(A_ADDR)
    assert isinstance(answered, OutboundCallAnswered)
    assert parse_sdp(answered.answer_sdp).media[0].port == 40000
    assert sim.take(B_ADDR) == [CallEstablished(call_id, "")]
    assert sim.sent("ACK") == [0.01]
    a.hangup(call_id, 5.0)
    sim.run_until(5.0)
    assert sim.take(A_ADDR) == [CallEnded(call_id, "local-hangup")]
    assert sim.take(B_ADDR) == [CallEnded(call_id, "remote-bye")]
    assert sim.log[-1][3] == "SIP/2.0 200 OK" and sim.log[-2][3].startswith("BYE sip:callbridge@")
    assert a.active_calls == b.active_calls == 0
    sim.run_until(100.0)  # every transaction winds down, nothing else is sent
    assert a.next_deadline() is None and b.next_deadline() is None


def test_cancel_before_answer_gets_487() -> None:
    sim, a, _b = make()
    call_id = a.invite(B_URI, A_URI, offer(), B_ADDR, 0.0)
    sim.run_until(0.01)
    sim.take(B_ADDR)
    a.hangup(call_id, 1.0)
    sim.run_until(1.0)
    firsts = [first for *_, first in sim.log]
    assert firsts[2:] == [
        f"CANCEL {B_URI} SIP/2.0",
        "SIP/2.0 200 OK",
        "SIP/2.0 487 Request Terminated",
        f"ACK {B_URI} SIP/2.0",
    ]
    assert sim.take(B_ADDR) == [CallCancelled(call_id)]
    assert sim.take(A_ADDR) == [OutboundCallFailed(call_id, 487, "Request Terminated")]


def test_lost_200_is_retransmitted_until_ack() -> None:
    sim, a, b = make()
    sim.drop = ["SIP/2.0 200", "SIP/2.0 200"]
    call_id, _ = call(sim, a, b)
    sim.run_until(5.0)
    assert sim.sent("SIP/2.0 200") == [0.01, 0.51, 1.51]  # T1, then 2*T1
    assert sim.sent("ACK") == [1.51]
    assert sim.take(B_ADDR) == [CallEstablished(call_id, "")]
    assert [type(e) for e in sim.take(A_ADDR)] == [OutboundCallAnswered]


def test_lost_ack_is_answered_again_and_no_ack_at_all_ends_with_bye() -> None:
    sim, a, b = make()
    sim.drop = ["ACK"]
    call_id, _ = call(sim, a, b)
    sim.run_until(1.0)
    assert sim.sent("ACK") == [0.01, 0.51]  # the retransmitted 200 is ACKed again
    assert sim.take(B_ADDR) == [CallEstablished(call_id, "")]

    sim, a, b = make()
    sim.drop_always = ["ACK"]
    call_id, _ = call(sim, a, b)
    sim.run_until(40.0)
    retransmits = sim.sent("SIP/2.0 200 OK")
    gaps = [round(y - x, 2) for x, y in itertools.pairwise(retransmits)]
    assert gaps[:4] == [0.5, 1.0, 2.0, 4.0] and max(gaps[:-1]) == 4.0  # capped at T2
    assert CallEnded(call_id, "ack-timeout") in sim.take(B_ADDR)
    assert sim.sent("BYE")[0] == 32.01


def test_reinvite_hold_and_resume() -> None:
    sim, a, b = make()
    call_id, _ = call(sim, a, b)
    sim.take(B_ADDR)
    a.reinvite(call_id, offer(30002, "sendonly"), sim.now)
    sim.run_until(sim.now + 0.01)
    assert sim.take(B_ADDR) == [HoldChanged(call_id, "sendonly", ("127.0.0.1", 30002))]
    ok = [first for *_, first in sim.log][-2:]
    assert ok == ["SIP/2.0 200 OK", "ACK sip:callbridge@127.0.0.1:5060 SIP/2.0"]
    a.reinvite(call_id, offer(30002, "sendrecv"), sim.now)
    sim.run_until(sim.now + 0.01)
    assert sim.take(B_ADDR) == [HoldChanged(call_id, "sendrecv", ("127.0.0.1", 30002))]


def test_reinvite_answer_mirrors_direction_and_bumps_version() -> None:
    sim, _a, b = make()
    ua_c = SipUserAgent(replace(BASE, local_port=5070), random.Random(1))
    sim.agents[A_ADDR] = ua_c
    call_id, _ = call(sim, ua_c, b)
    answers: list[str] = []
    original_send = b._send

    def spy(message: object, peer: object) -> None:
        if isinstance(message, SipResponse) and message.body:
            answers.append(message.body.decode())
        original_send(message, peer)  # type: ignore[arg-type]

    b._send = spy  # type: ignore[method-assign]
    ua_c.reinvite(call_id, offer(30000, "sendonly"), sim.now)
    sim.run_until(sim.now + 0.01)
    held = parse_sdp(answers[-1])
    assert held.media[0].direction == "recvonly" and held.origin.session_version == 2
    ua_c.reinvite(call_id, offer(30000, "inactive"), sim.now)
    sim.run_until(sim.now + 0.01)
    assert parse_sdp(answers[-1]).media[0].direction == "inactive"


def test_session_timer_refresh_and_expiry() -> None:
    a_settings = replace(BASE, local_port=5070, session_expires_s=1800)
    b_settings = replace(BASE, local_port=5060, session_expires_s=90, min_se_s=90)
    sim, a, b = make(a_settings, b_settings)
    call_id, _ = call(sim, a, b)
    sim.run_until(100.0)
    refreshes = sim.sent("INVITE sip:callbridge@")
    assert refreshes[:2] == [45.01, 90.01]  # the UAC refreshes at half the interval
    assert a.active_calls == b.active_calls == 1
    sim.drop_always = ["INVITE sip:callbridge@"]
    sim.run_until(200.0)
    # Last refresh at 90.01; without a refresh B hangs up at 90 - min(32, 30) = 60 s later.
    assert CallEnded(call_id, "session-expired") in sim.take(B_ADDR)
    assert sim.sent("BYE")[0] == 150.01
    assert CallEnded(call_id, "remote-bye") in sim.take(A_ADDR)


def test_session_interval_too_small_gets_422_and_uac_retries() -> None:
    a_settings = replace(BASE, local_port=5070, session_expires_s=30)
    b_settings = replace(BASE, local_port=5060, session_expires_s=1800, min_se_s=120)
    sim, a, _b = make(a_settings, b_settings)
    a.invite(B_URI, A_URI, offer(), B_ADDR, 0.0)
    sim.run_until(0.01)
    firsts = [first for *_, first in sim.log]
    assert "SIP/2.0 422 Session Interval Too Small" in firsts
    assert [type(e) for e in sim.take(B_ADDR)] == [CallOffered]


def test_digest_challenge_for_invite() -> None:
    b_settings = replace(BASE, auth_users=(SipAuthUser("carrier", "s3cret"),), auth_secret=b"k")
    sim, a, _b = make(b=b_settings)
    call_id = a.invite(B_URI, A_URI, offer(), B_ADDR, 0.0, credentials=("carrier", "s3cret"))
    sim.run_until(0.01)
    statuses = [first for *_, first in sim.log if first.startswith("SIP/2.0")]
    assert statuses == ["SIP/2.0 401 Unauthorized", "SIP/2.0 100 Trying"]
    (offered,) = sim.take(B_ADDR)
    assert isinstance(offered, CallOffered) and offered.call_id == call_id
    bad = a.invite(B_URI, A_URI, offer(), B_ADDR, 1.0, credentials=("carrier", "wrong"))
    sim.run_until(1.01)
    assert OutboundCallFailed(bad, 401, "Unauthorized") in sim.take(A_ADDR)


def test_unknown_user_and_wrong_password_get_identical_401() -> None:
    b_settings = replace(BASE, auth_users=(SipAuthUser("carrier", "s3cret"),), auth_secret=b"k")
    ua = SipUserAgent(b_settings, random.Random(13))
    ua.receive_datagram(raw_invite("u0", "b0"), A_ADDR, 0.0)
    (first,) = ua.actions_to_send()
    assert isinstance(first, SendDatagram)
    challenge_response = parse_message(first.data)
    challenge = choose_challenge(challenge_response.get_lines("www-authenticate"))
    assert challenge is not None and challenge.algorithm == "SHA-256"
    answers: list[SipResponse] = []
    for index, user in enumerate(("carrier", "no-such-user")):
        header = authorization(
            challenge, username=user, password="guess", method="INVITE", uri=B_URI, cnonce="c"
        )
        data = raw_invite(f"u{index + 1}", f"b{index + 1}").replace(
            b"Max-Forwards", f"Authorization: {header}\r\nMax-Forwards".encode()
        )
        ua.receive_datagram(data, A_ADDR, 1.0)
        (action,) = ua.actions_to_send()
        assert isinstance(action, SendDatagram)
        response = parse_message(action.data)
        assert isinstance(response, SipResponse)
        answers.append(response)
    dialog_keys = ("via", "from", "to", "call-id", "cseq")
    wrong_password, unknown_user = (
        [(k, v) for k, _, v in r.headers if k not in dialog_keys] for r in answers
    )
    assert answers[0].status == answers[1].status == 401
    assert wrong_password == unknown_user
    # no call is offered; each failure is reported alike for the log (sip.auth_failed)
    assert ua.events_received() == [
        AuthFailed("127.0.0.1", "UDP", "carrier", False),
        AuthFailed("127.0.0.1", "UDP", "no-such-user", False),
    ]


@dataclass
class Registrar:
    """A minimal registrar for the REGISTER tests (challenge, then 200 with expiry)."""

    verifier: DigestVerifier
    granted_s: int = 120
    seen: list[SipRequest] = field(default_factory=list)

    def handle(self, data: bytes, now: float) -> bytes:
        request = parse_message(data)
        assert isinstance(request, SipRequest)
        self.seen.append(request)
        result = self.verifier.verify(request.get("authorization"), "REGISTER", now)
        if result.value != "ok":
            response = build_response(request, 401, "Unauthorized", to_tag="r1")
            for value in self.verifier.challenges(now):
                response.add("WWW-Authenticate", value)
            return response.to_bytes()
        response = build_response(request, 200, "OK", to_tag="r1")
        contact = request.get("contact") or ""
        response.add("Contact", f"{contact};expires={self.granted_s}")
        return response.to_bytes()


def test_register_with_digest_and_refresh_before_expiry() -> None:
    registrar = Registrar(DigestVerifier("reg", b"k", {"bot": "pw"}))
    ua = SipUserAgent(replace(BASE, local_port=5070), random.Random(3))
    reg_addr: Address = ("127.0.0.1", 5080)
    reg_id = ua.register(
        reg_addr, "sip:reg.example.com", "sip:bot@reg.example.com", 0.0, credentials=("bot", "pw")
    )
    events: list[Event] = []
    now = 0.0

    def pump() -> None:
        for action in ua.actions_to_send():
            assert isinstance(action, SendDatagram) and action.addr == reg_addr
            ua.receive_datagram(registrar.handle(action.data, now), reg_addr, now)
        events.extend(ua.events_received())

    pump()
    pump()
    assert events == [RegistrationStateChanged(reg_id, True, 200, 120)]
    assert [r.get("authorization") is not None for r in registrar.seen] == [False, True]
    assert [r.cseq().number for r in registrar.seen] == [1, 2]
    while (deadline := ua.next_deadline()) is not None and deadline < 60.0:
        ua.handle_timer(deadline)  # only transaction wind-down (Timer K)
        assert ua.actions_to_send() == []
    assert ua.next_deadline() == 60.0  # refresh at half the granted expiry
    now = 60.0
    ua.handle_timer(now)
    pump()
    pump()
    assert events[-1] == RegistrationStateChanged(reg_id, True, 200, 120)
    assert len({r.call_id for r in registrar.seen}) == 1 and registrar.seen[-1].cseq().number == 4
    bad = SipUserAgent(replace(BASE, local_port=5070), random.Random(4))
    bad_id = bad.register(
        reg_addr, "sip:reg.example.com", "sip:bot@reg.example.com", 0.0, credentials=("bot", "nope")
    )
    for _ in range(3):
        for action in bad.actions_to_send():
            assert isinstance(action, SendDatagram)
            bad.receive_datagram(registrar.handle(action.data, 0.0), reg_addr, 0.0)
    assert bad.events_received() == [RegistrationStateChanged(bad_id, False, 401)]


def raw_invite(call_id: str, branch: str, method: str = "INVITE", to_tag: str = "") -> bytes:
    tag = f";tag={to_tag}" if to_tag else ""
    return (
        f"{method} {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <{A_URI}>;tag=f{branch}\r\n"
        f"To: <{B_URI}>{tag}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: 1 {method}\r\n"
        f"Contact: <{A_URI}>\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def replies(ua: SipUserAgent) -> list[str]:
    out = []
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        out.append(action.data.split(b"\r\n", 1)[0].decode())
    return out


def test_481_for_unknown_dialog_and_options_out_of_dialog() -> None:
    ua = SipUserAgent(BASE, random.Random(5))
    ua.receive_datagram(raw_invite("nope", "b1", "BYE", to_tag="x"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 481 Call/Transaction Does Not Exist"]
    ua.receive_datagram(raw_invite("opt", "b2", "OPTIONS"), A_ADDR, 0.0)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram) and action.addr == A_ADDR
    response = parse_message(action.data)
    assert isinstance(response, SipResponse) and response.status == 200
    assert "INVITE" in response.get_all("allow") and response.get("accept") == "application/sdp"
    ua.receive_datagram(raw_invite("sub", "b3", "SUBSCRIBE"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 405 Method Not Allowed"]
    ua.receive_datagram(raw_invite("foo", "b4", "FOO"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 501 Not Implemented"]


def test_503_past_the_call_limit_and_while_draining() -> None:
    ua = SipUserAgent(replace(BASE, max_calls=1, retry_after_s=7), random.Random(6))
    ua.receive_datagram(raw_invite("c1", "b1"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 100 Trying"]
    ua.receive_datagram(raw_invite("c2", "b2"), A_ADDR, 0.0)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram)
    busy = parse_message(action.data)
    assert isinstance(busy, SipResponse) and busy.status == 503 and busy.get("retry-after") == "7"
    ua.drain()
    ua.receive_datagram(raw_invite("c3", "b3"), A_ADDR, 0.0)
    ua.receive_datagram(raw_invite("o1", "b4", "OPTIONS"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 503 Service Unavailable"] * 2
    assert ua.active_calls == 1


def test_rate_limit_drops_excess_invites_per_source() -> None:
    ua = SipUserAgent(replace(BASE, invite_rate_per_s=1.0, invite_burst=2), random.Random(7))
    for i in range(3):
        ua.receive_datagram(raw_invite(f"r{i}", f"b{i}"), A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 100 Trying"] * 2
    assert ua.dropped_messages == 1
    ua.receive_datagram(raw_invite("other", "b9"), ("127.0.0.2", 5070), 0.0)
    assert replies(ua) == ["SIP/2.0 100 Trying"]  # another source has its own bucket
    ua.receive_datagram(raw_invite("r3", "b5"), A_ADDR, 1.0)
    assert replies(ua) == ["SIP/2.0 100 Trying"]  # refilled after one second


def test_allowlist_drops_other_sources_silently() -> None:
    ua = SipUserAgent(replace(BASE, allowed_sources=("10.0.0.0/8",)), random.Random(8))
    ua.receive_datagram(raw_invite("x1", "b1"), A_ADDR, 0.0)
    ua.receive_datagram(raw_invite("x2", "b2", "OPTIONS"), A_ADDR, 0.0)
    assert ua.actions_to_send() == [] and ua.events_received() == []
    ua.receive_datagram(raw_invite("x3", "b3"), ("10.1.2.3", 5060), 0.0)
    assert replies(ua) == ["SIP/2.0 100 Trying"]


def test_parse_errors_answered_statelessly_or_dropped() -> None:
    ua = SipUserAgent(BASE, random.Random(9))
    bad = raw_invite("p1", "b1").replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE")
    ua.receive_datagram(bad, A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 400 CSeq method does not match request method"]
    no_call_id = raw_invite("p2", "b2").replace(b"Call-ID: p2\r\n", b"")
    ua.receive_datagram(no_call_id, A_ADDR, 0.0)
    assert replies(ua) == [] and ua.dropped_messages == 1
    ua.receive_datagram(
        raw_invite("p3", "b3").replace(b" SIP/2.0\r\n", b" SIP/3.0\r\n", 1), A_ADDR, 0.0
    )
    assert replies(ua) == ["SIP/2.0 505 Version Not Supported"]
    ua.receive_datagram(
        raw_invite("p4", "").replace(b"branch=z9hG4bK;", b"branch=z9hG4bK;"), A_ADDR, 0.0
    )
    assert replies(ua) == ["SIP/2.0 400 Bad Branch"]
    required = raw_invite("p5", "b5").replace(
        b"Max-Forwards", b"Require: foo, timer\r\nMax-Forwards"
    )
    ua.receive_datagram(required, A_ADDR, 0.0)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram)
    ext = parse_message(action.data)
    assert isinstance(ext, SipResponse) and ext.status == 420 and ext.get("unsupported") == "foo"
    ua.receive_datagram(
        raw_invite("p6", "b6").replace(f"INVITE {B_URI}".encode(), b"INVITE im:bot@x"), A_ADDR, 0.0
    )
    assert replies(ua) == ["SIP/2.0 416 Unsupported URI Scheme"]


def test_retransmitted_invite_is_absorbed_and_488_without_codec() -> None:
    ua = SipUserAgent(BASE, random.Random(10))
    ua.receive_datagram(raw_invite("t1", "b1"), A_ADDR, 0.0)
    ua.receive_datagram(raw_invite("t1", "b1"), A_ADDR, 0.2)
    assert replies(ua) == ["SIP/2.0 100 Trying"] * 2
    assert len([e for e in ua.events_received() if isinstance(e, CallOffered)]) == 1
    g722 = build_offer("127.0.0.1", 4000, 1, 1).replace("RTP/AVP 0 8 101", "RTP/AVP 9")
    body = g722.encode()
    data = (
        raw_invite("t2", "b2").replace(
            b"Content-Length: 0\r\n\r\n",
            b"Content-Type: application/sdp\r\nContent-Length: %d\r\n\r\n" % len(body),
        )
        + body
    )
    ua.receive_datagram(data, A_ADDR, 0.0)
    assert replies(ua) == ["SIP/2.0 488 Not Acceptable Here"]


def test_rport_response_goes_to_source_port() -> None:
    ua = SipUserAgent(BASE, random.Random(11))
    ua.receive_datagram(raw_invite("n1", "b1", "OPTIONS"), ("198.51.100.9", 40123), 0.0)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram) and action.addr == ("198.51.100.9", 40123)
    response = parse_message(action.data)
    via = response.top_via()
    assert via.received == "198.51.100.9" and via.rport == "40123"
    no_rport = raw_invite("n2", "b2", "OPTIONS").replace(b";rport", b"")
    ua.receive_datagram(no_rport, ("198.51.100.9", 40123), 0.0)
    (action,) = ua.actions_to_send()
    assert isinstance(action, SendDatagram) and action.addr == ("198.51.100.9", 5070)


def test_info_dtmf_and_refer_progress() -> None:
    sim, a, b = make()
    call_id, _ = call(sim, a, b)
    sim.take(A_ADDR)
    sim.take(B_ADDR)
    a.send_info(call_id, "Signal=5\r\nDuration=160\r\n", "application/dtmf-relay", sim.now)
    a.send_info(call_id, "#", "application/dtmf", sim.now)
    sim.run_until(sim.now + 0.01)
    assert sim.take(B_ADDR) == [
        DtmfInfoReceived(call_id, "5", 160),
        DtmfInfoReceived(call_id, "#", 250),
    ]
    a.refer(call_id, "sip:agent@example.com", sim.now)
    sim.run_until(sim.now + 0.01)
    assert sim.take(A_ADDR) == [TransferProgress(call_id, 405, "Method Not Allowed", True)]


def test_tcp_stream_fed_one_byte_at_a_time() -> None:
    ua = SipUserAgent(replace(BASE, transport="TCP"), random.Random(12))
    data = raw_invite("tcp1", "b1", "OPTIONS") + b"\r\n\r\n" + raw_invite("tcp2", "b2", "OPTIONS")
    for i in range(len(data)):
        ua.receive_stream(7, data[i : i + 1], A_ADDR, 0.0)
    actions = ua.actions_to_send()
    assert [type(a) for a in actions] == [SendStream, SendStream, SendStream]
    assert all(isinstance(a, SendStream) and a.conn_id == 7 for a in actions)
    assert isinstance(actions[1], SendStream) and actions[1].data == b"\r\n"  # RFC 5626 pong
    assert ua.next_deadline() == 0.0  # Timer J is zero on TCP
    ua.receive_stream(
        8, b"OPTIONS sip:x SIP/2.0\r\nVia: SIP/2.0/TCP h;branch=z9hG4bK1\r\n\r\n", A_ADDR, 0.0
    )
    assert [type(a).__name__ for a in ua.actions_to_send()] == ["CloseStream"]


MUTATIONS = [b";", b",", b'"', b"<", b">", b" ", b"\r\n", b":", b"\x00", b"@", b"=", b"9"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_user_agent_never_raises_on_mutated_traffic(data: st.DataObject) -> None:
    """Record a real call, mutate any message of it, and replay into a fresh pair."""
    sim, a, b = make(
        replace(BASE, local_port=5070, session_expires_s=1800),
        replace(BASE, local_port=5060, session_expires_s=90),
    )
    call(sim, a, b)
    sim.run_until(50.0)
    a_reference = SipUserAgent(replace(BASE, local_port=5070), random.Random(1))
    a_reference.invite(B_URI, A_URI, offer(), B_ADDR, 0.0)  # so responses match a transaction
    fresh_b = SipUserAgent(replace(BASE, local_port=5060), random.Random(2))
    recorded = [entry for entry in sim.log]
    index = data.draw(st.integers(0, len(recorded) - 1))
    _, src, dst, _ = recorded[index]
    wire = _rebuild(sim, index)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(wire) - 1))
        wire[pos:pos] = data.draw(st.sampled_from(MUTATIONS))
    target = fresh_b if dst == B_ADDR else a_reference
    target.receive_datagram(bytes(wire), src, 1.0)
    target.handle_timer(100.0)
    target.actions_to_send()
    target.events_received()


def _rebuild(sim: Sim, index: int) -> bytearray:
    """The bytes of the index-th datagram of a replayed copy of the simulation."""
    return bytearray(sim.wire[index])

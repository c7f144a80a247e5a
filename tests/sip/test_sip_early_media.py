"""Early media in the SIP engine, both ways, on a fake clock (issue 34).

UAS: ``early_media`` sends 183 Session Progress with SDP, sends it again every
``refresh_s``, reports ``EarlyMediaExpired`` at the cap, and ends with a clean
200 (same SDP), a final error, or the caller's CANCEL (487). UAC: 180 and 183
are reported as ``OutboundCallProgress`` once each (retransmissions are not), a
183 with the far end's SDP for early media.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_sip_ua import A_ADDR, A_URI, B_ADDR, B_URI, Sim, answer_for, make, offer

from bridge.engine import LocalProtocolError
from bridge.sip.events import (
    CallCancelled,
    CallEstablished,
    CallOffered,
    EarlyMediaExpired,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgress,
)
from bridge.sip.message import SipRequest, build_response, parse_message
from bridge.sip.ua import SipUserAgent


def offered_call(sim: Sim, a: SipUserAgent) -> CallOffered:
    a.invite(B_URI, A_URI, offer(), B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    (offered,) = [e for e in sim.take(B_ADDR) if isinstance(e, CallOffered)]
    return offered


def firsts(sim: Sim) -> list[str]:
    return [first for *_, first in sim.log]


def test_183_is_refreshed_every_minute_until_the_cap() -> None:
    sim, a, b = make()
    offered = offered_call(sim, a)
    sdp = answer_for(offered)
    b.early_media(offered.call_id, sdp, sim.now, max_s=150.0, refresh_s=60.0)
    sim.run_until(200.0)
    assert sim.sent("SIP/2.0 183") == [0.01, 60.01, 120.01]
    assert sim.take(B_ADDR) == [EarlyMediaExpired(offered.call_id)]
    # the caller hears of early media once, with the SDP (the refreshes are not news)
    assert sim.take(A_ADDR) == [OutboundCallProgress(offered.call_id, 183, "Session Progress", sdp)]
    # the 183 carries the answer and our tag; the dialog is early, not answered
    wire = next(w for w in sim.wire if w.startswith(b"SIP/2.0 183"))
    response = parse_message(wire)
    assert response.get("content-type") == "application/sdp"
    assert response.body.decode() == sdp
    assert response.to().tag and response.get("contact")
    assert b.active_calls == 1 and not b._calls[offered.call_id].answered


ENDINGS = [
    # (what ends early media, the messages after the 183, what A hears, what B hears)
    (
        "answer",
        ["SIP/2.0 200 OK", "ACK sip:callbridge@127.0.0.1:5060 SIP/2.0"],
        [OutboundCallAnswered],
        [CallEstablished],
    ),
    (
        "reject",
        ["SIP/2.0 480 Temporarily Unavailable", f"ACK {B_URI} SIP/2.0"],
        [OutboundCallFailed],
        [],
    ),
    (
        "cancel",
        [
            f"CANCEL {B_URI} SIP/2.0",
            "SIP/2.0 200 OK",
            "SIP/2.0 487 Request Terminated",
            f"ACK {B_URI} SIP/2.0",
        ],
        [OutboundCallFailed],
        [CallCancelled],
    ),
]


@pytest.mark.parametrize(("ending", "after", "a_events", "b_events"), ENDINGS)
def test_early_media_ends_cleanly(
    ending: str, after: list[str], a_events: list[type], b_events: list[type]
) -> None:
    sim, a, b = make()
    offered = offered_call(sim, a)
    call_id = offered.call_id
    sdp = answer_for(offered)
    b.early_media(call_id, sdp, sim.now, max_s=150.0, refresh_s=60.0)
    sim.run_until(30.0)
    assert [type(e) for e in sim.take(A_ADDR)] == [OutboundCallProgress]
    before = len(sim.log)
    if ending == "answer":
        b.answer(call_id, sdp, sim.now)
    elif ending == "reject":
        b.reject(call_id, 480, "Temporarily Unavailable", sim.now)
    else:
        a.hangup(call_id, sim.now)
    sim.run_until(400.0)  # past every refresh and the cap: none of them may fire
    assert firsts(sim)[before:] == after
    a_heard = sim.take(A_ADDR)
    assert [type(e) for e in a_heard] == a_events
    assert [type(e) for e in sim.take(B_ADDR)] == b_events
    if ending == "answer":
        assert isinstance(a_heard[0], OutboundCallAnswered) and a_heard[0].answer_sdp == sdp
        assert b.active_calls == a.active_calls == 1
    else:
        status = 480 if ending == "reject" else 487
        assert isinstance(a_heard[0], OutboundCallFailed) and a_heard[0].status == status
        assert b.active_calls == a.active_calls == 0
    assert sim.sent("SIP/2.0 183") == [0.01]


def test_early_media_needs_an_offer_and_an_unanswered_call() -> None:
    sim, a, b = make()
    offered = offered_call(sim, a)
    b.answer(offered.call_id, answer_for(offered), sim.now)
    with pytest.raises(LocalProtocolError):
        b.early_media(offered.call_id, answer_for(offered), sim.now)
    # a delayed offer (INVITE without SDP) has no answer to put in a 183
    a.invite(B_URI, A_URI, "", B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    (late,) = [e for e in sim.take(B_ADDR) if isinstance(e, CallOffered)]
    with pytest.raises(LocalProtocolError):
        b.early_media(late.call_id, answer_for(late), sim.now)


FAR_SDP = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n" + (
    "m=audio 42000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)

# (status, reason, with SDP, what A reports): a far end that rings, then plays early media
PROGRESS = [
    (180, "Ringing", False, OutboundCallProgress("", 180, "Ringing", "")),
    (180, "Ringing", False, None),  # a retransmission
    (183, "Session Progress", True, OutboundCallProgress("", 183, "Session Progress", FAR_SDP)),
    (183, "Session Progress", True, None),
    (100, "Trying", False, None),
]


def test_uac_reports_ringing_and_early_media_once_each() -> None:
    ua = SipUserAgent(make()[1].settings)
    call_id = ua.invite(B_URI, A_URI, offer(), ("127.0.0.1", 5999), 0.0)
    (sent,) = ua.actions_to_send()
    invite = parse_message(sent.data)  # type: ignore[attr-defined]
    assert isinstance(invite, SipRequest)
    now = 0.0
    for status, reason, with_sdp, expected in PROGRESS:
        now += 0.5
        response = build_response(invite, status, reason, None if status == 100 else "far1")
        if with_sdp:
            response.add("Content-Type", "application/sdp")
            response.body = FAR_SDP.encode()
        ua.receive_datagram(response.to_bytes(), ("127.0.0.1", 5999), now)
        got = ua.events_received()
        want = [] if expected is None else [expected.__class__(call_id, *_tail(expected))]
        assert got == want, (status, with_sdp)
    ok = build_response(invite, 200, "OK", "far1")
    ok.add("Contact", "<sip:far@127.0.0.1:5999>")
    ok.add("Content-Type", "application/sdp")
    ok.body = FAR_SDP.encode()
    ua.receive_datagram(ok.to_bytes(), ("127.0.0.1", 5999), now + 1)
    assert ua.events_received() == [OutboundCallAnswered(call_id, FAR_SDP)]


def _tail(event: OutboundCallProgress) -> tuple[int, str, str]:
    return event.status, event.reason, event.early_sdp

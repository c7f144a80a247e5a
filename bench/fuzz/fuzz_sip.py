"""Fuzz SIP message parsing and the user agent's input (issue 33).

One input is one datagram (and the same bytes on a stream connection). It
goes through ``parse_message`` (only ``SipParseError`` may leave) and a fresh
``SipUserAgent``'s ``receive_datagram`` and ``receive_stream`` (nothing may
leave). Then every call offered is rejected, every timer runs out, and the
transactions, calls and framers must be back to none; a normal INVITE must
still be offered. Seeds: ``tests/sip/fixtures`` and a few well-formed requests.

    python -m bench.fuzz.fuzz_sip -atheris_runs=100000
"""

from __future__ import annotations

import contextlib
import random

from bench.fuzz.fuzz_common import FIXTURES, main
from bridge.sip.errors import SipParseError
from bridge.sip.events import CallOffered
from bridge.sip.message import parse_message
from bridge.sip.sdp import build_offer
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

SOURCE = ("192.0.2.10", 5070)
SETTINGS = SipSettings(local_host="127.0.0.1", session_expires_s=0)
B_URI = "sip:bot@127.0.0.1:5060"


def request(method: str, branch: str, body: str = "", extra: str = "") -> bytes:
    content = "Content-Type: application/sdp\r\n" if body else ""
    return (
        f"{method} {B_URI} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5070;branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:carrier@192.0.2.10:5070>;tag=f{branch}\r\n"
        f"To: <{B_URI}>\r\n"
        f"Call-ID: {branch}@192.0.2.10\r\n"
        f"CSeq: 1 {method}\r\n"
        "Contact: <sip:carrier@192.0.2.10:5070>\r\n"
        f"{extra}{content}"
        f"Content-Length: {len(body.encode())}\r\n\r\n{body}"
    ).encode()


def seeds() -> list[bytes]:
    out = [p.read_bytes() for p in sorted((FIXTURES / "sip" / "fixtures").glob("*.txt"))]
    sdp = build_offer("192.0.2.10", 4000, 1, 1)
    out += [
        request("INVITE", "s1", sdp, "Session-Expires: 1800\r\nSupported: timer\r\n"),
        request("OPTIONS", "s2"),
        request("BYE", "s3"),
        request("INFO", "s4", "", "Content-Type: application/dtmf-relay\r\n"),
        request("CANCEL", "s5"),
        request("ACK", "s6"),
    ]
    return out


def settle(ua: SipUserAgent, until: float) -> None:
    while (deadline := ua.next_deadline()) is not None and deadline <= until:
        ua.handle_timer(deadline)
    ua.actions_to_send()


def reject_offered(ua: SipUserAgent, now: float) -> None:
    ua.actions_to_send()
    for event in ua.events_received():
        if isinstance(event, CallOffered):
            ua.reject(event.call_id, 486, "Busy Here", now)


def test_one_input(data: bytes) -> None:
    with contextlib.suppress(SipParseError):
        parse_message(data)
    ua = SipUserAgent(SETTINGS, random.Random(1))
    ua.receive_datagram(data, SOURCE, 0.0)
    reject_offered(ua, 0.5)
    ua.receive_stream(1, data, SOURCE, 0.6)
    ua.receive_stream(1, data, SOURCE, 0.7)  # a second copy: the framer's state after the first
    reject_offered(ua, 0.8)
    ua.connection_lost(1)
    settle(ua, 100.0)
    assert not ua._server_txs, ua._server_txs
    assert not ua._client_txs, ua._client_txs
    assert not ua._calls, ua._calls
    assert not ua._framers, ua._framers
    sdp = build_offer("192.0.2.10", 4000, 1, 1)
    ua.receive_datagram(request("INVITE", "after", sdp), SOURCE, 200.0)
    offered = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    assert len(offered) == 1, "a normal INVITE after the input was not offered"


if __name__ == "__main__":
    main("sip", test_one_input, seeds())

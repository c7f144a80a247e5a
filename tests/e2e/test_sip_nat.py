"""A caller behind NAT in the real daemon: its Contact names a private address
(10.0.0.1) it cannot be reached at, its messages come from 127.0.0.3. The daemon's
responses (rport) and its BYE (the dialog's flow, ``bridge.sip.dialog``) reach the
caller's real source; nothing is sent towards the Contact.

All on loopback, sockets bound to port 0; each wait is for a datagram, bounded by
a timeout scaled by the suite's time factor.
"""

from __future__ import annotations

import asyncio
import os

from bridge.io.legs.sip import SipLeg
from bridge.sip.message import SipRequest, SipResponse, parse_message
from bridge.sip.sdp import build_offer

from .harness import FACTOR, stack

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from behind the NAT."
"""
WAIT_S = 10.0 * FACTOR
CALLER_HOST = "127.0.0.3"


class Queue(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.items: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.items.put_nowait((data, addr))

    async def message(self) -> SipRequest | SipResponse:
        data, _ = await asyncio.wait_for(self.items.get(), WAIT_S)
        message = parse_message(data)
        assert isinstance(message, SipRequest | SipResponse)
        return message

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])


def natted(
    method: str, dest: tuple[str, int], call_id: str, cseq: int, extra: str, body: str
) -> bytes:
    """A request as a phone behind NAT writes it: its private address in Via and Contact."""
    return (
        f"{method} sip:greet@{dest[0]}:{dest[1]} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK{call_id}{method}{cseq};rport\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:caller@10.0.0.1>;tag=natcaller\r\n"
        f"To: <sip:greet@{dest[0]}>{extra}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {method}\r\n"
        "Contact: <sip:caller@10.0.0.1:5060>\r\n"
        + ("Content-Type: application/sdp\r\n" if body else "")
        + f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def test_a_caller_behind_nat_gets_our_responses_and_bye_at_its_source() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with stack(ROUTES) as st:
            leg = next(leg for leg in st.daemon.legs if isinstance(leg, SipLeg))
            assert isinstance(leg, SipLeg)
            dest = ("127.0.0.1", st.sip_port)
            _, caller = await loop.create_datagram_endpoint(Queue, local_addr=(CALLER_HOST, 0))
            assert caller.transport is not None
            call_id = os.urandom(6).hex()
            offer = build_offer(CALLER_HOST, 30000, 1, 1, ("PCMU",))
            caller.transport.sendto(natted("INVITE", dest, call_id, 1, "", offer), dest)
            while True:  # 100 Trying, then the 200: both at our real source (rport)
                response = await caller.message()
                assert isinstance(response, SipResponse)
                via = response.top_via()
                assert (via.received, via.rport) == (CALLER_HOST, str(caller.port))
                if response.status >= 200:
                    break
            assert response.status == 200
            tag = f";tag={response.to().tag}"
            caller.transport.sendto(natted("ACK", dest, call_id, 1, tag, ""), dest)
            call = leg.calls[call_id]
            call.hangup("done")
            bye = await caller.message()  # the BYE comes back along the flow
            assert isinstance(bye, SipRequest) and bye.method == "BYE"
            assert bye.call_id == call_id and bye.uri == "sip:caller@10.0.0.1:5060"
            assert ";rport" in (bye.get("via") or "")
            ok = (
                "SIP/2.0 200 OK\r\n"
                f"Via: {bye.get('via')}\r\nFrom: {bye.get('from')}\r\nTo: {bye.get('to')}\r\n"
                f"Call-ID: {call_id}\r\nCSeq: {bye.get('cseq')}\r\nContent-Length: 0\r\n\r\n"
            )
            caller.transport.sendto(ok.encode(), dest)
            for _ in range(int(WAIT_S / 0.01)):
                if leg.runners[0].ua.unanswered_requests("bye") == 0:
                    break
                await asyncio.sleep(0.01)
            assert leg.runners[0].ua.unanswered_requests("bye") == 0  # our BYE was answered
            caller.transport.close()

    asyncio.run(main())

"""The shutdown BYE is retransmitted until answered, within the drain.

A real daemon in-process and a bare SIP caller on a UDP socket: the call is
up when the daemon drains; its drain deadline passes, the daemon sends BYE;
the caller ignores the first one, so the BYE must come again (its client
transaction retransmits it, RFC 3261 §17.1.2) before the drain ends; once
the caller answers, no BYE is left unanswered.
"""

from __future__ import annotations

import asyncio

from bridge.io.legs.sip import SipLeg
from bridge.sip.message import SipRequest, SipResponse, build_response, parse_message

from .harness import FACTOR, stack

GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from the bridge."
"""


class _Caller(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[SipRequest | SipResponse] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.got.put_nowait(parse_message(data))

    async def next(self) -> SipRequest | SipResponse:
        return await asyncio.wait_for(self.got.get(), 15 * FACTOR)


def test_the_shutdown_bye_is_retransmitted_until_answered() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        transport, caller = await loop.create_datagram_endpoint(
            _Caller, local_addr=("127.0.0.1", 0)
        )
        me = transport.get_extra_info("sockname")[1]
        try:
            async with stack(GREETING_ROUTE) as s:
                sip = s.sip_port
                sdp = (
                    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                    f"m=audio {me + 2} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
                )
                common = (
                    f"Via: SIP/2.0/UDP 127.0.0.1:{me};branch=z9hG4bK-inv1;rport\r\n"
                    "Max-Forwards: 70\r\n"
                    f"From: <sip:caller@127.0.0.1:{me}>;tag=c1\r\n"
                    f"To: <sip:demo@127.0.0.1:{sip}>\r\n"
                    "Call-ID: shutdown-bye-1\r\n"
                )
                invite = (
                    f"INVITE sip:demo@127.0.0.1:{sip} SIP/2.0\r\n{common}CSeq: 1 INVITE\r\n"
                    f"Contact: <sip:caller@127.0.0.1:{me}>\r\n"
                    f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
                )
                transport.sendto(invite.encode(), ("127.0.0.1", sip))
                while True:
                    msg = await caller.next()
                    if isinstance(msg, SipResponse) and msg.status >= 200:
                        break
                assert msg.status == 200, msg.status
                to = msg.get("to")
                ack = (
                    f"ACK sip:demo@127.0.0.1:{sip} SIP/2.0\r\n"
                    + common.replace("z9hG4bK-inv1", "z9hG4bK-ack1").replace(
                        f"To: <sip:demo@127.0.0.1:{sip}>", f"To: {to}"
                    )
                    + "CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
                )
                transport.sendto(ack.encode(), ("127.0.0.1", sip))
                leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
                assert len(leg.calls) == 1

                drain = asyncio.ensure_future(s.daemon.drain_and_stop())
                byes: list[SipRequest] = []
                while len(byes) < 2:  # the first is ignored: it must come again
                    msg = await caller.next()
                    if isinstance(msg, SipRequest) and msg.method == "BYE":
                        byes.append(msg)
                assert not drain.done(), "the drain ended with its BYE unanswered"
                assert byes[0].top_via().branch == byes[1].top_via().branch  # one transaction
                transport.sendto(build_response(byes[1], 200, "OK").to_bytes(), ("127.0.0.1", sip))
                await asyncio.wait_for(drain, 30 * FACTOR)
                assert sum(r.ua.unanswered_requests("bye") for r in leg.runners) == 0
        finally:
            transport.close()

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))

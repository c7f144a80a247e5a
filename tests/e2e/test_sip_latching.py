"""Symmetric RTP in the real daemon: a caller whose SDP names an address its RTP does
not come from (as behind NAT) gets the daemon's RTP (the greeting's stream) with
``latching = "learn"``; with ``strict`` the daemon keeps sending to the SDP address.

All on loopback: the SDP names 127.0.0.2 (a socket of this test is there), the
caller's RTP leaves from 127.0.0.1. Waits are for packets, bounded by scaled timeouts.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from bridge.rtp.packet import RtpPacket, build_rtp
from bridge.sip.message import SipResponse, parse_message
from bridge.sip.sdp import build_offer

from .harness import FACTOR, stack

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello there, this is a longer greeting."
"""
WAIT_S = 10.0 * FACTOR


class Queue(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.items: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.items.put_nowait((data, addr))

    async def next(self) -> tuple[bytes, tuple[str, int]]:
        return await asyncio.wait_for(self.items.get(), WAIT_S)

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])


async def bind(host: str) -> Queue:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_datagram_endpoint(Queue, local_addr=(host, 0))
    return proto


def invite(sip: tuple[str, int], local: Queue, sdp: str, call_id: str) -> bytes:
    body = sdp.encode()
    head = (
        f"INVITE sip:greet@{sip[0]}:{sip[1]} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{local.port};branch=z9hG4bK{call_id};rport\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:caller@127.0.0.1>;tag=nat1\r\n"
        f"To: <sip:greet@{sip[0]}>\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Contact: <sip:caller@127.0.0.1:{local.port}>\r\n"
        "Content-Type: application/sdp\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def answered(signalling: Queue) -> SipResponse:
    while True:
        data, _ = await signalling.next()
        message = parse_message(data)
        if isinstance(message, SipResponse) and message.status >= 200:
            assert message.status == 200, message.status
            return message


class Phone:
    """The caller's microphone: 20 ms PCMU silence packets, as a phone sends them, from
    ``sock``; the NAT may move the flow to another socket (port) mid-call."""

    def __init__(self, sock: Queue, dest: tuple[str, int]) -> None:
        self.sock = sock
        self.dest = dest

    async def run(self) -> None:
        seq = 0
        while True:
            assert self.sock.transport is not None
            packet = build_rtp(0, seq, seq * 160, 0xCA11, b"\xff" * 160, seq == 0)
            self.sock.transport.sendto(packet, self.dest)
            seq += 1
            await asyncio.sleep(0.02)  # the phone's packet clock, not a wait for an event


@pytest.mark.parametrize("mode", ["learn", "strict"])
def test_caller_behind_nat_gets_the_daemons_rtp_only_in_learn_mode(mode: str) -> None:
    async def main() -> None:
        async with stack(ROUTES, sip_extra=f'latching = "{mode}"') as st:
            sip = ("127.0.0.1", st.sip_port)
            signalling = await bind("127.0.0.1")
            caller_rtp = await bind("127.0.0.1")  # where the caller's RTP really comes from
            sdp_rtp = await bind("127.0.0.2")  # what its SDP says (a private address)
            assert signalling.transport and caller_rtp.transport and sdp_rtp.transport
            offer = build_offer("127.0.0.2", sdp_rtp.port, 1, 1, ("PCMU",))
            call_id = os.urandom(6).hex()
            signalling.transport.sendto(invite(sip, signalling, offer, call_id), sip)
            ok = await answered(signalling)
            media = [line for line in ok.body.decode().split("\r\n") if line.startswith("m=")]
            daemon_rtp = ("127.0.0.1", int(media[0].split()[1]))
            phone = Phone(caller_rtp, daemon_rtp)
            sender = asyncio.ensure_future(phone.run())
            rebound: Queue | None = None
            try:
                if mode == "learn":
                    data, source = await caller_rtp.next()  # the call's stream reaches the caller
                    assert source == daemon_rtp and RtpPacket.parse(data).payload_type == 0
                    # the NAT rebinds: the same stream now leaves from another port
                    rebound = await bind("127.0.0.1")
                    phone.sock = rebound
                    data, source = await rebound.next()  # the daemon followed it
                    assert source == daemon_rtp and RtpPacket.parse(data).payload_type == 0
                else:
                    for _ in range(25):  # half a second of the daemon's stream...
                        data, source = await sdp_rtp.next()
                        assert source == daemon_rtp
                    assert caller_rtp.items.empty()  # ...all of it to the SDP address
            finally:
                sender.cancel()
                for sock in (signalling, caller_rtp, sdp_rtp, rebound):
                    if sock is not None and sock.transport is not None:
                        sock.transport.close()

    asyncio.run(main())

"""Outbound calls from the real daemon: tel: targets through the outbound proxy with
digest, TCP when the target says so, and TLS targets refused before anything is sent.

The far ends are sockets of this test (bound to port 0); each wait is for an event,
bounded by a timeout scaled by the suite's time factor.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from bridge.config import ConfigError, parse_config
from bridge.io.legs.sip import SipLeg
from bridge.sip.digest import AuthResult, DigestVerifier
from bridge.sip.message import SipRequest, build_response, parse_message

from .harness import FACTOR, stack

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello."
"""
WAIT_S = 5.0 * FACTOR


def sip_leg(daemon: object) -> SipLeg:
    leg = next(leg for leg in daemon.legs if leg.name == "sip")  # type: ignore[attr-defined]
    assert isinstance(leg, SipLeg)
    return leg


class UdpPeer(asyncio.DatagramProtocol):
    """A UDP socket on port 0 that queues the requests it gets (REGISTERs set aside)."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[SipRequest, tuple[str, int]]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        message = parse_message(data)
        if isinstance(message, SipRequest) and message.method != "REGISTER":
            self.requests.put_nowait((message, addr))

    async def next(self) -> tuple[SipRequest, tuple[str, int]]:
        return await asyncio.wait_for(self.requests.get(), WAIT_S)

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])


def test_tel_target_goes_to_the_outbound_proxy_and_answers_its_407() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        _, proxy = await loop.create_datagram_endpoint(UdpPeer, local_addr=("127.0.0.1", 0))
        assert proxy.transport is not None
        verifier = DigestVerifier(
            "proxy.test", b"k", {"trunkuser": "trunkpass"}, algorithms=("MD5",)
        )
        sip_extra = f'outbound_proxy = "sip:127.0.0.1:{proxy.port}"'
        routes = (
            ROUTES
            + f"""
[sip.registrations.trunk]
registrar = "sip:127.0.0.1:{proxy.port}"
user = "trunkuser"
password = "trunkpass"
"""
        )
        async with stack(routes, sip_extra=sip_extra) as st:
            leg = sip_leg(st.daemon)
            call_id = leg.originate("tel:+1-555-123-0000", "sip:bot@127.0.0.1", "")
            invite, addr = await proxy.next()
            assert invite.method == "INVITE" and invite.call_id == call_id
            assert invite.uri == f"sip:+15551230000@127.0.0.1:{proxy.port};user=phone"
            assert invite.get("route") == f"<sip:127.0.0.1:{proxy.port};lr>"
            challenge = build_response(invite, 407, "Proxy Authentication Required", "p1")
            for value in verifier.challenges(loop.time()):
                challenge.add("Proxy-Authenticate", value)
            proxy.transport.sendto(challenge.to_bytes(), addr)
            ack, _ = await proxy.next()
            assert (ack.method, ack.cseq().number) == ("ACK", 1)
            retry, addr = await proxy.next()
            assert (retry.method, retry.cseq().number, retry.call_id) == ("INVITE", 2, call_id)
            assert retry.from_().tag == invite.from_().tag
            result = verifier.verify(retry.get("proxy-authorization"), "INVITE", loop.time())
            assert result == AuthResult.OK
            proxy.transport.sendto(build_response(retry, 486, "Busy Here", "p1").to_bytes(), addr)
            ack, _ = await proxy.next()
            assert (ack.method, ack.cseq().number) == ("ACK", 2)
            for _ in range(int(WAIT_S / 0.01)):
                if call_id not in leg.calls:
                    break
                await asyncio.sleep(0.01)
            assert call_id not in leg.calls and leg.ports.allocated_count == 0
        proxy.transport.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "target", ["sips:bob@127.0.0.1:5061", "sip:bob@127.0.0.1:5061;transport=tls"]
)
def test_tls_targets_without_a_tls_listener_are_refused_before_anything_is_sent(
    target: str,
) -> None:
    async def main() -> None:
        async with stack(ROUTES) as st:
            leg = sip_leg(st.daemon)
            with pytest.raises(ValueError, match="no TLS transport to call out on"):
                leg.originate(target, "sip:bot@127.0.0.1", "")
            assert not leg.calls and leg.ports.allocated_count == 0

    asyncio.run(main())


async def read_message(reader: asyncio.StreamReader) -> SipRequest:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() in (b"content-length", b"l"):
            length = int(value)
    body = await asyncio.wait_for(reader.readexactly(length), WAIT_S) if length else b""
    message = parse_message(head + body)
    assert isinstance(message, SipRequest)
    return message


def test_transport_tcp_target_is_called_over_tcp() -> None:
    async def main() -> None:
        accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        accepted = asyncio.Queue()

        async def on_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await accepted.put((r, w))

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with stack(ROUTES) as st:
            leg = sip_leg(st.daemon)
            call_id = leg.originate(f"sip:bob@127.0.0.1:{port};transport=tcp", "sip:bot@x", "")
            reader, writer = await asyncio.wait_for(accepted.get(), WAIT_S)
            invite = await read_message(reader)
            assert invite.method == "INVITE" and invite.call_id == call_id
            assert (invite.get("via") or "").startswith("SIP/2.0/TCP ")
            assert ";transport=tcp" in (invite.get("contact") or "")
            writer.write(build_response(invite, 603, "Decline", "t1").to_bytes())
            ack = await read_message(reader)  # the ACK comes back on the same connection
            assert (ack.method, ack.call_id) == ("ACK", call_id)
            writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_tcp_target_that_refuses_the_connection_fails_the_call_at_once() -> None:
    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            port = closed.getsockname()[1]
            async with stack(ROUTES) as st:
                leg = sip_leg(st.daemon)
                call_id = leg.originate(f"sip:bob@127.0.0.1:{port};transport=tcp", "sip:b@x", "")
                assert call_id in leg.calls
                for _ in range(int(WAIT_S / 0.01)):  # far less than Timer B's 32 s
                    if call_id not in leg.calls:
                        break
                    await asyncio.sleep(0.01)
                assert call_id not in leg.calls and leg.ports.allocated_count == 0

    asyncio.run(main())


def test_a_tls_proxy_without_a_tls_listener_is_refused_by_key() -> None:
    text = '[sip]\noutbound_proxy = "sips:proxy.example.com"\n' + ROUTES.replace(
        'provider = "main"', 'provider = "p"'
    )
    text += '[providers.p]\nprotocol = "kova"\nurl = "ws://127.0.0.1:1/x"\napi_key = "k"\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.errors == [
        "sip.outbound_proxy: sips:proxy.example.com: calling out over TLS needs sip.tls_listen"
    ]

"""RFC 3263 end to end: the real daemon calls and registers at host names that only a DNS
server on loopback knows (``[sip] dns_servers``), reaching the peer at the port its SRV
record names, never 5060. Nothing asks the system's resolver or leaves the machine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

from bridge.sip.message import SipRequest, build_response, parse_message

from .dnsserver import dns_server
from .harness import FACTOR, api_post, free_port, stack
from .test_sip_connections import Peer, wait_for

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello."
"""
WAIT_S = 10.0 * FACTOR


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))


class UdpPeer(asyncio.DatagramProtocol):
    """A UDP socket on port 0 that queues every request it gets."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[SipRequest, tuple[str, int]]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        message = parse_message(data)
        if isinstance(message, SipRequest):
            self.requests.put_nowait((message, addr))

    async def next(self) -> tuple[SipRequest, tuple[str, int]]:
        return await asyncio.wait_for(self.requests.get(), WAIT_S)

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])


async def _peer() -> UdpPeer:
    loop = asyncio.get_running_loop()
    _, peer = await loop.create_datagram_endpoint(UdpPeer, local_addr=("127.0.0.1", 0))
    return peer


def _zone(service: str, peer_port: int) -> dict[tuple[str, str], list[str]]:
    # the peer at priority 10; a port nothing listens on at priority 20 (never chosen)
    return {
        (f"_sip._udp.{service}", "SRV"): [
            f"10 0 {peer_port} peer.test.",
            f"20 0 {peer_port + 1 if peer_port < 65535 else 1} backup.test.",
        ],
        ("peer.test", "A"): ["127.0.0.1"],
        ("backup.test", "A"): ["127.0.0.1"],
    }


REGISTRATION = (
    '[sip.registrations.pbx]\nregistrar = "sip:registrar.test"\nuser = "bot"\npassword = "secret"\n'
)


@asynccontextmanager
async def _two_servers(service: str) -> AsyncIterator[tuple[UdpPeer, UdpPeer, str]]:
    """Two UDP peers as ``service``'s SRV targets (the first at the lower priority) on a
    DNS server of the test's: (first, second, the ``[sip]`` line that names it)."""
    first, second = await _peer(), await _peer()
    zone = {
        (f"_sip._udp.{service}", "SRV"): [
            f"10 0 {first.port} first.test.",
            f"20 0 {second.port} second.test.",
        ],
        ("first.test", "A"): ["127.0.0.1"],
        ("second.test", "A"): ["127.0.0.1"],
    }
    try:
        async with dns_server(zone) as (_, dns_port):
            yield first, second, f'dns_servers = ["127.0.0.1:{dns_port}"]'
    finally:
        for peer in (first, second):
            assert peer.transport is not None
            peer.transport.close()


def test_originate_to_a_name_reaches_the_peer_its_srv_record_names() -> None:
    async def body() -> None:
        peer = await _peer()
        try:
            async with dns_server(_zone("service.test", peer.port)) as (dns, dns_port):
                sip_extra = f'dns_servers = ["127.0.0.1:{dns_port}"]'
                async with stack(ROUTES, sip_extra=sip_extra) as s:
                    status, answer = await api_post(
                        s.api_port, "/v1/calls", {"to": "sip:bob@service.test"}
                    )
                    assert status == 201, answer
                    invite, addr = await peer.next()
                    assert invite.method == "INVITE" and invite.uri == "sip:bob@service.test"
                    assert invite.call_id == answer["call_id"]
                    assert ("_sip._udp.service.test", "SRV") in dns.asked
                    assert peer.transport is not None
                    busy = build_response(invite, 486, "Busy Here", "p1")
                    peer.transport.sendto(busy.to_bytes(), addr)
                    ack, _ = await peer.next()
                    assert ack.method == "ACK"
        finally:
            assert peer.transport is not None
            peer.transport.close()

    run(body())


def test_a_registrar_named_without_a_port_is_registered_at_its_srv_port() -> None:
    async def body() -> None:
        peer = await _peer()
        try:
            async with dns_server(_zone("registrar.test", peer.port)) as (dns, dns_port):
                sip_extra = f'dns_servers = ["127.0.0.1:{dns_port}"]'
                async with stack(ROUTES + REGISTRATION, sip_extra=sip_extra):
                    register, addr = await peer.next()
                    assert register.method == "REGISTER"
                    assert register.uri == "sip:registrar.test"
                    assert (register.get("to") or "").find("sip:bot@registrar.test") >= 0
                    assert peer.transport is not None
                    ok = build_response(register, 200, "OK", "r1")
                    ok.add("Contact", (register.get("contact") or "") + ";expires=300")
                    peer.transport.sendto(ok.to_bytes(), addr)
                    assert ("_sip._udp.registrar.test", "SRV") in dns.asked
        finally:
            assert peer.transport is not None
            peer.transport.close()

    run(body())


def test_a_503_from_the_first_srv_registrar_moves_the_register_to_the_next() -> None:
    """A registrar with two SRV targets: the first answers 503, and the REGISTER goes at
    once to the second (same Call-ID, next CSeq), which keeps the binding."""

    async def body() -> None:
        async with (
            _two_servers("registrar.test") as (first, second, sip_extra),
            stack(ROUTES + REGISTRATION, sip_extra=sip_extra),
        ):
            register, addr = await first.next()
            assert register.method == "REGISTER"
            assert first.transport is not None
            down = build_response(register, 503, "Service Unavailable", "f1")
            first.transport.sendto(down.to_bytes(), addr)
            again, addr = await second.next()
            assert again.method == "REGISTER" and again.call_id == register.call_id
            assert again.cseq().number == register.cseq().number + 1
            assert second.transport is not None
            ok = build_response(again, 200, "OK", "s1")
            ok.add("Contact", (again.get("contact") or "") + ";expires=300")
            second.transport.sendto(ok.to_bytes(), addr)

    run(body())


def test_a_503_from_the_first_srv_target_moves_the_call_to_the_next() -> None:
    async def body() -> None:
        async with (
            _two_servers("service.test") as (first, second, sip_extra),
            stack(ROUTES, sip_extra=sip_extra) as s,
        ):
            status, answer = await api_post(s.api_port, "/v1/calls", {"to": "sip:bob@service.test"})
            assert status == 201, answer
            invite, addr = await first.next()
            assert first.transport is not None
            down = build_response(invite, 503, "Service Unavailable", "f1")
            first.transport.sendto(down.to_bytes(), addr)
            again, addr = await second.next()
            assert again.method == "INVITE" and again.call_id == invite.call_id
            assert again.cseq().number == 2
            assert second.transport is not None
            busy = build_response(again, 486, "Busy Here", "s1")
            second.transport.sendto(busy.to_bytes(), addr)
            ack, _ = await second.next()
            assert ack.method == "ACK"

    run(body())


def test_a_refused_connection_to_the_first_srv_target_moves_the_call_to_the_next() -> None:
    async def body() -> None:
        peer = await Peer().start()
        closed = free_port()  # nothing listens there: the connection is refused
        zone = {
            ("_sip._tcp.service.test", "SRV"): [
                f"10 0 {closed} first.test.",
                f"20 0 {peer.port} second.test.",
            ],
            ("first.test", "A"): ["127.0.0.1"],
            ("second.test", "A"): ["127.0.0.1"],
        }
        try:
            async with dns_server(zone) as (_, dns_port):
                sip_extra = f'dns_servers = ["127.0.0.1:{dns_port}"]\ntransports = ["udp", "tcp"]'
                async with stack(ROUTES, sip_extra=sip_extra) as s:
                    status, answer = await api_post(
                        s.api_port, "/v1/calls", {"to": "sip:bob@service.test;transport=tcp"}
                    )
                    assert status == 201, answer
                    assert await wait_for(lambda: peer.methods("ACK")), peer.requests
                    invites = [r for _, r in peer.requests if r.method == "INVITE"]
                    assert len(invites) == 1 and invites[0].call_id == answer["call_id"]
                    assert invites[0].cseq().number == 2  # the first went to the closed port
        finally:
            peer.close()

    run(body())

"""RFC 3263 server location in the shell (``bridge.io.dns.SipLocator``), against a DNS
server on loopback (``dnsserver``): the resolver is given, so nothing reads
``/etc/resolv.conf`` or leaves the machine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from bridge.io.dns import DnsError, SipLocator, make_resolver
from bridge.sip.locate import Located

from .dnsserver import dns_server
from .harness import FACTOR

ZONE: dict[tuple[str, str], list[str]] = {
    ("_sip._udp.service.test", "SRV"): [
        "20 0 5090 backup.test.",
        "10 50 5070 one.test.",
        "10 50 5080 two.test.",
    ],
    ("one.test", "A"): ["192.0.2.1"],
    ("two.test", "A"): ["192.0.2.2", "192.0.2.3"],
    ("backup.test", "A"): ["192.0.2.9"],
    ("plain.test", "A"): ["192.0.2.50"],
    ("_sip._udp.tcponly.test", "SRV"): ["0 0 0 ."],
    ("_sip._tcp.tcponly.test", "SRV"): ["0 0 5071 one.test."],
    ("_sips._tcp.secure.test", "SRV"): ["0 0 5072 one.test."],
    ("_sip._udp.nowhere.test", "SRV"): ["0 0 5060 missing.test."],
}


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30 * FACTOR))


def _locator(port: int, draw: int = 0, timeout_s: float = 5.0) -> SipLocator:
    return SipLocator(
        make_resolver([f"127.0.0.1:{port}"]), timeout_s=timeout_s, randint=lambda a, b: draw
    )


def test_srv_targets_by_priority_then_weight_at_the_ports_they_name() -> None:
    async def body() -> None:
        async with dns_server(ZONE) as (server, port):
            first = await _locator(port, draw=0).locate("service.test", None)
            assert first[0] == Located("192.0.2.1", 5070, "UDP", "one.test")
            # two.test's two addresses (in the order of its answer), then the backup
            assert {x.address for x in first[1:3]} == {"192.0.2.2", "192.0.2.3"}
            assert {(x.port, x.name) for x in first[1:3]} == {(5080, "two.test")}
            assert first[3] == Located("192.0.2.9", 5090, "UDP", "backup.test")
            # a draw past the first weight takes two.test first
            other = await _locator(port, draw=51).locate("service.test", None)
            assert [(x.name, x.port) for x in other][:2] == [("two.test", 5080)] * 2
            # the first transport with records is used (UDP's SRV: ".", not offered)
            tcp = await _locator(port).locate("tcponly.test", None, supported=("UDP", "TCP"))
            assert tcp == [Located("192.0.2.1", 5071, "TCP", "one.test")]
            assert ("_sips._tcp.tcponly.test", "SRV") not in server.asked  # not supported

    run(body())


def test_sips_and_a_named_transport_ask_their_own_srv_only() -> None:
    async def body() -> None:
        async with dns_server(ZONE) as (server, port):
            got = await _locator(port).locate("secure.test", None, "sips")
            assert got == [Located("192.0.2.1", 5072, "TLS", "one.test")]
            srv = [name for name, kind in server.asked if kind == "SRV"]
            assert srv == ["_sips._tcp.secure.test"]
            server.asked.clear()
            got = await _locator(port).locate("tcponly.test", None, "sip", "tcp")
            assert got[0].port == 5071 and got[0].transport == "TCP"
            assert [n for n, k in server.asked if k == "SRV"] == ["_sip._tcp.tcponly.test"]

    run(body())


def test_no_srv_falls_back_to_the_host_at_the_default_port() -> None:
    async def body() -> None:
        async with dns_server(ZONE) as (server, port):
            got = await _locator(port).locate("plain.test", None)
            assert got == [Located("192.0.2.50", 5060, "UDP", "plain.test")]
            asked = [n for n, k in server.asked if k == "SRV"]
            assert asked == [
                "_sip._udp.plain.test",
                "_sip._tcp.plain.test",
                "_sips._tcp.plain.test",
            ]
            # an explicit port: no SRV question at all
            server.asked.clear()
            got = await _locator(port).locate("plain.test", 5099)
            assert got == [Located("192.0.2.50", 5099, "UDP", "plain.test")]
            assert server.asked == [("plain.test", "A")]

    run(body())


def test_answers_are_cached_for_their_ttl() -> None:
    async def body() -> None:
        async with dns_server(ZONE, ttl=300) as (server, port):
            locator = _locator(port)
            await locator.locate("service.test", None)
            asked = len(server.asked)
            again = await locator.locate("service.test", None)
            assert len(server.asked) == asked and again[0].port == 5070  # from the cache
        async with dns_server(ZONE, ttl=0) as (server, port):
            locator = _locator(port)
            await locator.locate("service.test", None)
            asked = len(server.asked)
            await locator.locate("service.test", None)
            assert len(server.asked) == 2 * asked  # a TTL of 0 is not kept

    run(body())


def test_failures_name_the_host() -> None:
    async def body() -> None:
        async with dns_server(ZONE) as (server, port):
            with pytest.raises(DnsError, match=r"nowhere\.test.*missing\.test"):
                await _locator(port).locate("nowhere.test", None)
            with pytest.raises(DnsError, match=r"no-such\.test"):
                await _locator(port).locate("no-such.test", None)
            server.silent = True
            with pytest.raises(DnsError, match=r"no answer for 'service\.test'"):
                await _locator(port, timeout_s=0.3).locate("service.test", None)

    run(body())

"""Host names in SIP destinations, and a UA pump that survives a failing action.

A real daemon in-process. An API ``originate`` to a name that does not
resolve answers 422 naming the host (and places nothing); one to a name
that does (``localhost``) sends its INVITE to the address. A batch of the
engine's actions in which one send fails (a name that does not resolve, a
``sendto`` that raises) still sends the others, and the engine's timer is
re-armed: the retransmission arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from bridge.io.dns import DnsCache, DnsError, is_ip_literal
from bridge.io.legs.sip import SipLeg, _UaRunner

from .harness import FACTOR, Stack, api_post, stack

GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from the bridge."
"""


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


class _Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.got.put_nowait(data)


async def _sink() -> tuple[_Sink, asyncio.DatagramTransport, int]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(_Sink, local_addr=("127.0.0.1", 0))
    return proto, transport, transport.get_extra_info("sockname")[1]


async def _next(sink: _Sink) -> bytes:
    return await asyncio.wait_for(sink.got.get(), 10 * FACTOR)


def _udp_runner(s: Stack) -> _UaRunner:
    leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
    return next(r for r in leg.runners if r.kind == "UDP")


def test_originate_to_a_name_that_does_not_resolve_is_refused_naming_it() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as s:
            status, answer = await api_post(
                s.api_port, "/v1/calls", {"to": "sip:bob@no-such-host.invalid:5060"}
            )
            assert status == 422, answer
            error = answer["error"]
            assert isinstance(error, dict)
            assert error["code"] == "cannot_resolve" and error["field"] == "to"
            assert "no-such-host.invalid" in str(error["message"])
            leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
            assert not leg.calls and leg.ports.allocated_count == 0

    run(body())


def test_originate_to_a_name_sends_the_invite_to_its_address() -> None:
    async def body() -> None:
        sink, transport, port = await _sink()
        try:
            async with stack(GREETING_ROUTE) as s:
                status, answer = await api_post(
                    s.api_port, "/v1/calls", {"to": f"sip:bob@localhost:{port}"}
                )
                assert status == 201, answer
                first = await _next(sink)
                assert first.startswith(b"INVITE sip:bob@localhost:"), first[:80]
        finally:
            transport.close()

    run(body())


def test_a_failing_action_does_not_stop_the_batch_nor_the_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        sink, transport, port = await _sink()
        broken, broken_transport, broken_port = await _sink()
        try:
            async with stack(GREETING_ROUTE) as s:
                runner = _udp_runner(s)
                assert runner.udp is not None
                real_sendto = runner.udp.sendto

                def sendto(data: bytes, addr: tuple[str, int]) -> None:
                    if addr[1] == broken_port:
                        raise OSError("sendto failed")
                    real_sendto(data, addr)

                monkeypatch.setattr(runner.udp, "sendto", sendto)
                now = runner.loop.time()
                # three REGISTERs in one batch: a raising send, a name that does not
                # resolve, and a good one, which must still leave
                for host, p in (
                    ("127.0.0.1", broken_port),
                    ("no-such-host.invalid", 5060),
                    ("127.0.0.1", port),
                ):
                    runner.ua.register((host, p), f"sip:{host}:{p}", f"sip:me@{host}", now)
                runner.pump()
                first = await _next(sink)
                assert first.startswith(b"REGISTER ")
                # the timer was re-armed: the unanswered REGISTER is retransmitted (Timer E)
                again = await _next(sink)
                assert again == first
                assert broken.got.empty()
        finally:
            transport.close()
            broken_transport.close()

    run(body())


def test_dns_cache_remembers_answers_and_failures() -> None:
    async def body() -> None:
        cache = DnsCache()
        assert await cache.lookup("localhost", 0.0) == "127.0.0.1"
        assert cache.get("localhost", 1.0) == ("127.0.0.1", "")
        with pytest.raises(DnsError, match=r"no-such-host\.invalid"):
            await cache.lookup("no-such-host.invalid", 0.0)
        cached = cache.get("no-such-host.invalid", 1.0)
        assert cached is not None and cached[0] is None  # remembered, no second lookup
        assert cache.get("no-such-host.invalid", 1000.0) is None  # expired
        assert is_ip_literal("192.0.2.1") and is_ip_literal("::1")
        assert not is_ip_literal("localhost") and not is_ip_literal("")

    run(body())

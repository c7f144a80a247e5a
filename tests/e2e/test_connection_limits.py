"""Listeners that cannot be exhausted: connection caps at accept, request timeouts, body bounds.

A real daemon in-process (``harness.stack``). Idle connections from one
source beyond ``max_connections_per_source`` are closed as they are
accepted while another source is still served and a call still connects; a
source outside ``[sip] allow`` is closed at accept on SIP over TCP; a
request dribbled a byte at a time (slowloris) is closed once
``header_timeout_s`` has passed; a body a route does not take gets 413
without being read. What is asserted is the close (or the answer), never
when it happened: waits are bounded by generous timeouts scaled by the
suite's time factor.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call
from bridge.io.legs.sip import SipLeg, _UaRunner

from .harness import FACTOR, Stack, stack

GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from the bridge."
"""

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 90 * FACTOR))  # type: ignore[arg-type]


async def _connect(port: int, source: str) -> Conn:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _closed_by_peer(conn: Conn, timeout_s: float) -> bool:
    """Whether the daemon closes ``conn`` (EOF or reset) within ``timeout_s`` x FACTOR,
    reading and discarding whatever it sends first."""
    reader = conn[0]
    try:
        async with asyncio.timeout(timeout_s * FACTOR):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True
    return True


async def _until(cond: Callable[[], bool], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while loop.time() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


def _tcp_runner(s: Stack) -> _UaRunner:
    leg = next(leg for leg in s.daemon.legs if leg.name == "sip")
    assert isinstance(leg, SipLeg)
    return next(r for r in leg.runners if r.kind == "TCP")


def _tcp_port(runner: _UaRunner) -> int:
    assert runner.tcp is not None
    return int(next(iter(runner.tcp.sockets)).getsockname()[1])


def _options(port: int, source: str, call_id: str) -> bytes:
    return (
        f"OPTIONS sip:demo@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/TCP {source}:5999;branch=z9hG4bK-{call_id}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:probe@{source}>;tag=1\r\n"
        f"To: <sip:demo@127.0.0.1:{port}>\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def _dribble(conn: Conn, data: bytes, every_s: float) -> None:
    """Send ``data`` a byte at a time, then keep sending header bytes, until closed."""
    writer = conn[1]
    try:
        for i in range(len(data) + 100_000):
            writer.write(data[i : i + 1] if i < len(data) else b"a")
            await writer.drain()
            await asyncio.sleep(every_s)
    except (ConnectionError, OSError):
        return


def _scrape(api_port: int) -> str:
    url = f"http://127.0.0.1:{api_port}/metrics"
    with urllib.request.urlopen(url, timeout=5 * FACTOR) as r:
        return str(r.read().decode())


def test_sip_tcp_caps_allowlist_and_slowloris_and_a_call_still_connects() -> None:
    cap = 3

    async def body() -> None:
        sip_extra = (
            f"max_connections_per_source = {cap}\n"
            f"header_timeout_s = {1.0 * FACTOR}\n"
            'allow = ["127.0.0.1/32", "127.0.0.2/32"]\n'
        )
        async with stack(GREETING_ROUTE, sip_extra=sip_extra) as s:
            sip = s.sip_port
            runner = _tcp_runner(s)
            port = _tcp_port(runner)
            held: list[Conn] = []
            try:
                # up to the cap from one source: admitted (each sends one message, then
                # idles: only idle_timeout_s, 30 min by default, would close it); one more:
                # closed at accept
                for i in range(cap):
                    conn = await _connect(port, "127.0.0.1")
                    held.append(conn)
                    conn[1].write(_options(port, "127.0.0.1", f"opt-{i}"))
                    line = await asyncio.wait_for(conn[0].readline(), 10 * FACTOR)
                    assert line.startswith(b"SIP/2.0 200"), line
                assert await _until(lambda: runner.gate.from_source("127.0.0.1") == cap, 10)
                extra = await _connect(port, "127.0.0.1")
                assert await _closed_by_peer(extra, 10), "a connection beyond the cap stays open"
                extra[1].close()
                assert runner.gate.refused_per_source == 1

                # another source still connects and is answered
                other = await _connect(port, "127.0.0.2")
                other[1].write(_options(port, "127.0.0.2", "opt-other"))
                line = await asyncio.wait_for(other[0].readline(), 10 * FACTOR)
                assert line.startswith(b"SIP/2.0 200"), line
                other[1].close()

                # a source outside [sip] allow: closed at accept, before it sends anything
                outside = await _connect(port, "127.0.0.3")
                assert await _closed_by_peer(outside, 10)
                outside[1].close()
                assert runner.refused_not_allowed == 1
                # both refusals reach the metric (read from the listeners at every scrape)
                text = await asyncio.to_thread(_scrape, s.api_port)
                assert 'callbridge_rejected_total{reason="connection_limit"} 1.0' in text
                assert 'callbridge_rejected_total{reason="not_allowed"} 1.0' in text

                # a call over UDP connects while the idle connections are held
                result = await place_call(
                    CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=1.0)
                )
                assert build_report(result.recording).answered
            finally:
                for _, w in held:
                    w.close()
            assert await _until(lambda: runner.gate.open == 0, 10)

            # a connection that never sends a message: closed at header_timeout_s
            silent = await _connect(port, "127.0.0.1")
            assert await _closed_by_peer(silent, 30), "a silent connection is never closed"
            silent[1].close()

            # a message dribbled a byte at a time never completes: closed at the timeout
            slow = await _connect(port, "127.0.0.2")
            before = runner.timed_out
            sender = asyncio.ensure_future(_dribble(slow, _options(port, "127.0.0.2", "x"), 0.05))
            try:
                assert await _closed_by_peer(slow, 30), "a dribbled SIP message is never closed"
            finally:
                sender.cancel()
                slow[1].close()
            assert runner.timed_out > before

    run(body())


def test_http_caps_slowloris_and_bodies_by_route() -> None:
    cap = 2

    async def body() -> None:
        # the held connections send nothing: the timeout must outlast accepting them
        api_extra = f"max_connections_per_source = {cap}\nheader_timeout_s = {3.0 * FACTOR}\n"
        async with stack(GREETING_ROUTE, api_extra=api_extra) as s:
            api = s.daemon.api
            assert api is not None and api.gate is not None
            port = api.port
            held = [await _connect(port, "127.0.0.1") for _ in range(cap)]
            try:
                assert await _until(lambda: api.gate.from_source("127.0.0.1") == cap, 10)  # type: ignore[union-attr]
                extra = await _connect(port, "127.0.0.1")
                assert await _closed_by_peer(extra, 10)
                extra[1].close()
                assert api.gate.refused_per_source == 1

                # another source is served
                other = await _connect(port, "127.0.0.2")
                other[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = await asyncio.wait_for(other[0].read(), 10 * FACTOR)
                assert reply.startswith(b"HTTP/1.1 200"), reply
                other[1].close()

                # a body on a route that takes none, and one over the bound: 413, unread
                for head in (
                    b"GET /healthz HTTP/1.1\r\nContent-Length: 10\r\n\r\n",
                    b"POST /v1/calls HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n",
                ):
                    c = await _connect(port, "127.0.0.2")
                    c[1].write(head)  # no body follows: the answer cannot wait for it
                    reply = await asyncio.wait_for(c[0].read(), 10 * FACTOR)
                    assert reply.startswith(b"HTTP/1.1 413"), reply
                    c[1].close()
            finally:
                for _, w in held:
                    w.close()

            # a request head dribbled a byte at a time: closed at the timeout, unanswered
            slow = await _connect(port, "127.0.0.2")
            sender = asyncio.ensure_future(
                _dribble(slow, b"GET /healthz HTTP/1.1\r\nX-Slow: ", 0.05)
            )
            got = b""
            try:
                async with asyncio.timeout(30 * FACTOR):
                    while chunk := await slow[0].read(4096):
                        got += chunk
            except (ConnectionError, OSError):
                pass
            finally:
                sender.cancel()
                slow[1].close()
            assert got == b"", got
            assert api.timed_out >= 1
            assert await _until(lambda: api.gate.open == 0, 10)  # type: ignore[union-attr]

    run(body())

"""Provider faults that used to hang a call: fake providers on loopback sockets.

* accept-then-1008 in a loop: reconnects back off, growing to the cap (the
  backoff no longer resets when a connection merely opens);
* a zwst session route that answers garbage, bad JSON, too much, or
  nothing: the turn fails and the pool tries again (the answer no longer
  escapes the connection's run loop);
* a turn whose provider trickles a frame now and then, or goes silent
  after starting it: the turn fails with ``kind="timeout"``.

Attempts and outcomes are counted; no interval is timed. Waits are bounded
by generous timeouts scaled by the suite's time factor.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable

import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from bridge.engine import Event
from bridge.io import session_http
from bridge.io.provider_pool import Backoff, ProviderPool
from bridge.providers.base import (
    MULAW_8K,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def _until(cond: Callable[[], bool], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while loop.time() < deadline and not cond():
        await asyncio.sleep(0.01)
    return cond()


class _Recorded(Backoff):
    """A Backoff that remembers every delay it gave."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        super().__init__(base_s=base_s, cap_s=cap_s, rng=random.Random(7))
        self.delays: list[float] = []

    def next_delay_s(self) -> float:
        delay = super().next_delay_s()
        self.delays.append(delay)
        return delay


def _kova(port: int) -> ProviderSettings:
    return ProviderSettings("fake", "kova", f"ws://127.0.0.1:{port}/v1/ws/kova", "k", "v")


def test_accept_then_1008_in_a_loop_backs_off_to_the_cap() -> None:
    accepted = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal accepted
        accepted += 1
        await ws.close(1008, "invalid api key")

    async def body() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            pool = ProviderPool(_kova(port), close_idle_after_s=None)
            backoff = pool.backoff = _Recorded(base_s=0.005, cap_s=0.04)
            await pool.start(timeout_s=5 * FACTOR)
            try:
                assert await _until(lambda: len(backoff.delays) >= 8, 30)
            finally:
                await pool.close()
        delays = backoff.delays
        assert accepted >= 8
        # never reset by a connection that only opened: the ceiling doubles to the cap
        assert backoff.attempt >= 8
        assert all(d <= 0.04 for d in delays)
        assert all(d >= 0.02 for d in delays[4:]), delays  # ceiling at the cap from the 4th on
        assert pool.errors, "the closes were counted as provider errors"

    run(body())


def test_a_connection_that_carried_a_turn_resets_the_backoff() -> None:
    async def handler(ws: ServerConnection) -> None:
        async for raw in ws:
            msg = json.loads(raw)
            cid = msg.get("context_id")
            if "start_context" in msg:
                await ws.send(json.dumps({"context_started": {}, "context_id": cid}))
            elif "flush" in msg:
                await ws.send(json.dumps({"audio_chunk": "////", "context_id": cid}))
                done = {"flush_completed": True, "flush_id": msg["flush_id"], "context_id": cid}
                await ws.send(json.dumps(done))

    async def body() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            pool = ProviderPool(_kova(server.sockets[0].getsockname()[1]), close_idle_after_s=None)
            pool.backoff.attempt = 5  # as after a run of failed connections
            assert await pool.start(timeout_s=10 * FACTOR)
            assert pool.backoff.attempt == 5  # opening alone proves nothing
            events: list[Event] = []
            handle = pool.open_turn("t", TurnSettings("v", MULAW_8K), events.append)
            handle.send_text("Hello.")
            handle.end()
            assert await _until(lambda: any(isinstance(e, TurnDone) for e in events), 10)
            assert pool.backoff.attempt == 0
            await pool.close()

    run(body())


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage with no status line\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{not json",
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (200 * 1024),
        None,  # accepts and never answers
    ],
    ids=["not-http", "bad-json", "too-large", "silent"],
)
def test_a_malformed_zwst_session_answer_fails_the_turn_and_the_pool_tries_again(
    answer: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_http, "SESSION_TIMEOUT_S", 0.5 * FACTOR)
    requests = 0
    held: list[asyncio.StreamWriter] = []

    async def on_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        requests += 1
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            held.append(writer)
            return
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def body() -> None:
        server = await asyncio.start_server(on_request, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = ProviderSettings("fake", "zwst", f"http://127.0.0.1:{port}", "k", "v")
        pool = ProviderPool(settings, close_idle_after_s=None)
        pool.backoff = Backoff(base_s=0.01, cap_s=0.05)
        try:
            assert not await pool.start(timeout_s=10 * FACTOR)  # never ready
            events: list[Event] = []
            handle = pool.open_turn("t", TurnSettings("v", MULAW_8K), events.append)
            handle.send_text("Hello.")
            handle.end()
            failed = (ProviderFailed, TurnFailed)
            assert await _until(lambda: any(isinstance(e, failed) for e in events), 20), events
            assert await _until(lambda: requests >= 3, 20), requests  # it keeps trying
        finally:
            await pool.close()
            for w in held:
                w.close()
            server.close()

    run(body())


def _kova_turn_server(
    trickle_every_s: float | None,
) -> Callable[[ServerConnection], Awaitable[None]]:
    """Starts contexts; then sends one small audio chunk every ``trickle_every_s`` (or
    nothing at all when None), never completing a flush."""

    async def handler(ws: ServerConnection) -> None:
        tasks: list[asyncio.Task[None]] = []

        async def trickle(cid: str) -> None:
            while trickle_every_s is not None:
                await ws.send(json.dumps({"audio_chunk": "////", "context_id": cid}))
                await asyncio.sleep(trickle_every_s)

        try:
            async for raw in ws:
                msg = json.loads(raw)
                cid = msg.get("context_id")
                if "start_context" in msg:
                    await ws.send(json.dumps({"context_started": {}, "context_id": cid}))
                    tasks.append(asyncio.ensure_future(trickle(cid)))
                elif "close_context" in msg:
                    await ws.send(json.dumps({"context_closed": True, "context_id": cid}))
        except websockets.ConnectionClosed:
            pass
        finally:
            for t in tasks:
                t.cancel()

    return handler


@pytest.mark.parametrize("trickle_every_s", [0.2, None], ids=["trickle", "silent"])
def test_a_turn_the_provider_does_not_deliver_fails_with_a_timeout(
    trickle_every_s: float | None,
) -> None:
    async def body() -> None:
        async with serve(_kova_turn_server(trickle_every_s), "127.0.0.1", 0) as server:
            pool = ProviderPool(_kova(server.sockets[0].getsockname()[1]), close_idle_after_s=None)
            # small deadlines for the test: the trickle (a frame every 0.2 s) keeps the
            # stall check quiet, only the bound on the whole turn can end it
            pool.turn_stall_s = 1.0 if trickle_every_s is None else 60.0
            pool.turn_base_s, pool.turn_s_per_char = 1.0, 0.01
            assert await pool.start(timeout_s=10 * FACTOR)
            events: list[Event] = []
            handle = pool.open_turn("t", TurnSettings("v", MULAW_8K), events.append)
            handle.send_text("Hello there.")
            handle.end()
            try:
                assert await _until(lambda: any(isinstance(e, TurnFailed) for e in events), 30)
            finally:
                await pool.close()
            (failed,) = [e for e in events if isinstance(e, TurnFailed)]
            assert failed.turn_id == "t" and failed.kind == "timeout" and failed.retryable
            assert not any(isinstance(e, TurnDone) for e in events)
            assert pool.errors.get("timeout") == 1
            conn = pool.connections[0] if pool.connections else None
            assert conn is None or not conn.watches  # nothing left behind

    run(body())

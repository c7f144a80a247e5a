"""The provider WebSocket (``bridge.io.ws_client``) against a real websockets server on
loopback: the opening handshake, a refused upgrade, the open timeout, keepalive pings
answered and unanswered, and the closing handshake both ways."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidStatus
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State

from bridge.io.ws_client import ProviderWebSocket, open_websocket
from tests.loopback.provider_socket import open_provider_socket

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def _run(body: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(body(), 30 * FACTOR)

    asyncio.run(main())


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _echo(ws: ServerConnection) -> None:
    async for msg in ws:
        await ws.send(msg)


def _port(server: Any) -> int:
    return int(server.sockets[0].getsockname()[1])


def test_messages_both_ways_and_a_closing_handshake_we_start() -> None:
    async def body() -> None:
        async with serve(_echo, "127.0.0.1", 0, subprotocols=["v1"]) as server:  # type: ignore[list-item]
            got: list[str | bytes] = []
            ws = await open_websocket(
                f"ws://127.0.0.1:{_port(server)}/x",
                got.append,
                headers=[("X-Test", "1")],
                subprotocols=["v1"],
            )
            assert ws.subprotocol == "v1" and ws.protocol.state is State.OPEN
            ws.send_message("héllo")
            ws.send_message(b"\x00\x01")
            await ws.drain()
            await _until(lambda: len(got) == 2, "the echoes")
            assert got == ["héllo", b"\x00\x01"]
            ws.ping_interval_s = 0.01 * FACTOR  # the server answers its pings
            ws.start_keepalive()
            await _until(lambda: ws.pongs >= 2, "two keepalive pings answered")
            assert ws.protocol.state is State.OPEN
            await ws.close(CloseCode.NORMAL_CLOSURE, "bye")
            assert ws.lost.done() and ws.close_code == CloseCode.NORMAL_CLOSURE
            ws.send_message("late")  # a closed socket sends nothing, and does not raise

    _run(body)


def test_a_closing_handshake_the_server_starts() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.close(4001, "go away")

    async def body() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            ws = await open_websocket(f"ws://127.0.0.1:{_port(server)}/", lambda m: None)
            await ws.wait_closed()
            assert ws.close_code == 4001 and ws.close_reason == "go away"

    _run(body)


def test_a_refused_upgrade_raises_its_status() -> None:
    def refuse(connection: ServerConnection, request: Request) -> Response:
        return connection.respond(403, "no\n")

    async def body() -> None:
        async with serve(_echo, "127.0.0.1", 0, process_request=refuse) as server:
            with pytest.raises(InvalidStatus) as refused:
                await open_websocket(f"ws://127.0.0.1:{_port(server)}/", lambda m: None)
            assert refused.value.response.status_code == 403

    _run(body)


def test_a_server_that_never_answers_the_handshake_times_out() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    async def body() -> None:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        async with server:
            with pytest.raises(TimeoutError):
                await open_websocket(
                    f"ws://127.0.0.1:{_port(server)}/", lambda m: None, open_timeout_s=0.2 * FACTOR
                )
            assert len(accepted) == 1
            for writer in accepted:
                writer.close()

    _run(body)


def test_keepalive_pings_answered_keep_it_open_and_one_unanswered_fails_it() -> None:
    async def body() -> None:
        ws = open_provider_socket(lambda m: None)
        written: list[bytes] = ws.transport.written  # type: ignore[attr-defined]
        ws.ping_interval_s, ws.ping_timeout_s = 0.01 * FACTOR, 0.2 * FACTOR
        ws.start_keepalive()
        await _until(lambda: ws.ping_data is not None, "a keepalive ping")
        ping = ws.ping_data
        assert ping is not None and written  # the ping frame went out
        pong = Frame(Opcode.PONG, ping).serialize(mask=False, extensions=[])
        ws.data_received(pong)
        assert ws.ping_data is None and ws.pongs == 1 and ws.protocol.state is State.OPEN
        await _until(lambda: ws.ping_data is not None, "the next ping")
        await _until(lambda: ws.protocol.state is not State.OPEN, "the pong timeout")
        assert ws.protocol.close_sent is not None
        assert ws.protocol.close_sent.code == CloseCode.INTERNAL_ERROR

    _run(body)


def test_unsolicited_pongs_are_ignored() -> None:
    async def body() -> None:
        ws: ProviderWebSocket = open_provider_socket(lambda m: None)
        ws.data_received(Frame(Opcode.PONG, b"nope").serialize(mask=False, extensions=[]))
        assert ws.ping_data is None and ws.pongs == 0 and ws.protocol.state is State.OPEN

    _run(body)

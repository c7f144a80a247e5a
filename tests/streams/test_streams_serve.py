"""``WsConnection.serve``: messages from the transport's callback, as ``recv`` gives them.

The media-stream leg reads its carrier socket through ``serve`` (no task
wake-up per message). These run a real listener (``serve_http_ws``) and a raw
socket client under both event loops the daemon can use, and check that
every way a connection ends still ends ``serve``: a close frame, EOF, a
reset, an exception in the callback; and that bytes sent right behind the
upgrade request, or many messages in one segment, are all delivered in order.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop
from websockets.frames import Close, Frame, Opcode

from bridge.io.httpws import HttpRequest, HttpResponse, WsConnection, serve_http_ws

LOOPS = ["asyncio", "uvloop"]
FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def _run(loop_kind: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if loop_kind == "uvloop":
        return uvloop.run(main())
    return asyncio.run(main())


def _upgrade() -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        "GET /twilio HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _client_text(text: str) -> bytes:
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=True)


def _client_close(code: int = 1000) -> bytes:
    return Frame(Opcode.CLOSE, Close(code, "bye").serialize()).serialize(mask=True)


class _Server:
    """A listener whose WebSocket handler runs ``serve`` and records what it got."""

    def __init__(self, fail_on: str | None = None, echo: bool = False) -> None:
        self.echo = echo
        self.got: list[str | bytes] = []
        self.received = asyncio.Event()
        self.ended: asyncio.Future[BaseException | None] | None = None
        self.conn: WsConnection | None = None
        self.fail_on = fail_on

    async def start(self) -> tuple[int, Any]:
        self.ended = asyncio.get_running_loop().create_future()

        async def http(request: HttpRequest) -> HttpResponse:
            return HttpResponse.text(404, "no")

        async def ws(request: HttpRequest) -> Any:
            return self.handle

        server = await serve_http_ws("127.0.0.1", 0, http=http, ws=ws)
        return server.port, server

    def on_message(self, msg: str | bytes) -> None:
        if msg == self.fail_on:
            raise RuntimeError("handler failed")
        self.got.append(msg)
        self.received.set()
        if self.echo:
            assert self.conn is not None
            self.conn.send_encoded_text_nowait(b"echo:" + str(msg).encode())

    async def handle(self, conn: WsConnection) -> None:
        self.conn = conn
        assert self.ended is not None
        try:
            await conn.serve(self.on_message)
        except Exception as exc:
            self.ended.set_result(exc)
            raise
        self.ended.set_result(None)


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return reader, writer


async def _read_101(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_messages_behind_the_upgrade_and_in_one_segment_arrive_in_order(loop_kind: str) -> None:
    async def main() -> None:
        srv = _Server()
        port, server = await srv.start()
        reader, writer = await _connect(port)
        # the first messages ride in the same segment as the upgrade request
        writer.write(_upgrade() + _client_text("m0") + _client_text("m1"))
        await _read_101(reader)
        writer.write(b"".join(_client_text(f"m{i}") for i in range(2, 50)))
        await writer.drain()
        for i in range(50, 60):  # and one at a time, split mid-frame
            frame = _client_text(f"m{i}")
            writer.write(frame[:3])
            await writer.drain()
            await asyncio.sleep(0.001)
            writer.write(frame[3:])
        writer.write(_client_close(1000))
        await writer.drain()
        assert srv.ended is not None
        assert await asyncio.wait_for(srv.ended, 5 * FACTOR) is None
        assert srv.got == [f"m{i}" for i in range(60)]
        assert srv.conn is not None and srv.conn.closed and srv.conn.close_code == 1000
        # the server answered the close
        rest = await asyncio.wait_for(reader.read(), 5 * FACTOR)
        assert rest[:1] == b"\x88"
        writer.close()
        await server.close()

    _run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("how", ["eof", "reset"])
def test_eof_or_reset_ends_serve(loop_kind: str, how: str) -> None:
    async def main() -> None:
        srv = _Server()
        port, server = await srv.start()
        reader, writer = await _connect(port)
        writer.write(_upgrade())
        await _read_101(reader)
        writer.write(_client_text("hello") + _client_text("binary?"))
        await writer.drain()
        while len(srv.got) < 2:  # both delivered before the EOF or reset
            srv.received.clear()
            await asyncio.wait_for(srv.received.wait(), 5 * FACTOR)
        if how == "eof":
            writer.write_eof()
        else:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # linger 0: an RST, not a FIN
        assert srv.ended is not None
        assert await asyncio.wait_for(srv.ended, 5 * FACTOR) is None
        assert srv.got == ["hello", "binary?"]
        assert srv.conn is not None and srv.conn.closed
        with contextlib.suppress(Exception):
            writer.close()
        await server.close()

    _run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_exception_in_the_callback_ends_serve_with_it(loop_kind: str) -> None:
    async def main() -> None:
        srv = _Server(fail_on="boom")
        port, server = await srv.start()
        reader, writer = await _connect(port)
        writer.write(_upgrade())
        await _read_101(reader)
        writer.write(_client_text("ok") + _client_text("boom") + _client_text("never"))
        await writer.drain()
        assert srv.ended is not None
        exc = await asyncio.wait_for(srv.ended, 5 * FACTOR)
        assert isinstance(exc, RuntimeError)
        assert srv.got == ["ok"]
        # the connection is closed normally afterwards (serve_http_ws closes it)
        rest = await asyncio.wait_for(reader.read(), 5 * FACTOR)
        assert rest[:1] == b"\x88"
        writer.close()
        await server.close()

    _run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_sending_while_serving_and_drain_still_work(loop_kind: str) -> None:
    async def main() -> None:
        srv = _Server(echo=True)
        port, server = await srv.start()
        reader, writer = await _connect(port)
        writer.write(_upgrade())
        await _read_101(reader)
        writer.write(_client_text("a") + _client_text("b"))
        await writer.drain()
        want = Frame(Opcode.TEXT, b"echo:a").serialize(mask=False)
        want += Frame(Opcode.TEXT, b"echo:b").serialize(mask=False)
        got = await asyncio.wait_for(reader.readexactly(len(want)), 5 * FACTOR)
        assert got == want
        assert srv.conn is not None
        await asyncio.wait_for(srv.conn.send_text("via drain"), 5 * FACTOR)  # StreamWriter.drain
        frame = Frame(Opcode.TEXT, b"via drain").serialize(mask=False)
        assert await asyncio.wait_for(reader.readexactly(len(frame)), 5 * FACTOR) == frame
        writer.write(_client_close())
        await writer.drain()
        assert srv.ended is not None
        assert await asyncio.wait_for(srv.ended, 5 * FACTOR) is None
        writer.close()
        await server.close()

    _run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_closing_the_server_with_a_connection_open_reports_no_error(loop_kind: str) -> None:
    """A server's close cancels its open connections: that is their end, not an error.

    Python 3.11's ``start_server`` callback logged the cancelled handler task as
    "Exception in callback ... CancelledError", with a traceback, at every stop
    of the embedded TTS server with a daemon connected.
    """

    async def main() -> list[dict[str, Any]]:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        srv = _Server()
        port, server = await srv.start()
        reader, writer = await _connect(port)
        writer.write(_upgrade() + _client_text("m0"))
        await _read_101(reader)
        await asyncio.wait_for(srv.received.wait(), 5 * FACTOR)
        await server.close()
        assert not server.connections
        await asyncio.sleep(0)  # the tasks' done callbacks run here
        writer.close()
        return reported

    assert _run(loop_kind, main) == []

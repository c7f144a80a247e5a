"""One asyncio listener for plain HTTP requests and WebSocket upgrades.

Why not ``websockets.asyncio.server``: it cannot read request bodies, and the
daemon needs ``POST`` on the same port as its WebSockets (zwst's session
route, Twilio's ``POST /twiml``, the HTTP API). So this shell reads the HTTP
head itself and hands WebSocket upgrades to websockets' sans-I/O
``ServerProtocol`` (the same core the library's own servers use).

The decision to accept an upgrade is made *before* it completes:
``route(request)`` returns either a ``WsHandler`` (accept) or an
``HttpResponse`` (for instance 403 for a bad ``X-Twilio-Signature``).

Compiled with mypyc (``bridge/native.py``): a carrier's media socket reads
and writes a frame here 50 times a second each way for every call. Types
declared here are checked at run time for builtins (a ``tuple`` must be a
tuple: uvloop's ``Server.sockets`` is a list), not for other libraries' classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

from websockets.frames import Frame, Opcode
from websockets.http11 import Request as WsRequest
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from bridge.config import ConnectionLimits
from bridge.io.connlimits import ConnectionGate
from bridge.logs import get_logger

__all__ = ["HttpRequest", "HttpResponse", "HttpWsServer", "WsConnection", "serve_http_ws"]

log = get_logger("callbridge.http")

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
"""Methods no route here takes a body with: a request of these with one gets 413 unread."""
READ_CHUNK_BYTES = 64 * 1024
CLOSE_TIMEOUT_S = 2.0
_FIN_TEXT = 0x80 | Opcode.TEXT.value  # FIN set, opcode 1 (RFC 6455 §5.2)
_HEAD16 = struct.Struct("!BBH")
_HEAD64 = struct.Struct("!BBQ")

_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    426: "Upgrade Required",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request (head and body). Header names are lower-case."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""
    peer: tuple[str, int] | None = None

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query, keep_blank_values=True))

    @property
    def is_websocket(self) -> bool:
        return (
            self.method == "GET"
            and "websocket" in self.headers.get("upgrade", "").lower()
            and "upgrade" in self.headers.get("connection", "").lower()
        )


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def text(cls, status: int, text: str) -> HttpResponse:
        return cls(status, (text + "\n").encode())

    @classmethod
    def json(cls, status: int, body: bytes) -> HttpResponse:
        return cls(status, body, "application/json")

    def serialize(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Status')}"]
        head.append(f"Content-Type: {self.content_type}")
        head.append(f"Content-Length: {len(self.body)}")
        head.append("Connection: close")
        head.extend(f"{k}: {v}" for k, v in self.headers)
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


class WsConnection:
    """An accepted WebSocket: whole messages in, messages and close out."""

    def __init__(
        self,
        request: HttpRequest,
        protocol: ServerProtocol,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.request = request
        self.subprotocol: str | None = protocol.subprotocol
        self._proto = protocol
        self._reader = reader
        self._writer = writer
        self._transport = writer.transport
        # server frames are unmasked; with no extension negotiated (we offer
        # none) a data frame is a bare header and the payload
        self._plain_frames = not protocol.extensions
        self._open = protocol.state is State.OPEN
        """``protocol.state is State.OPEN``, taken again after each call that can change it."""
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._pending: list[str | bytes] = []
        self.close_code: int | None = None
        self.close_reason = ""
        self.closed = False
        self._serving: tuple[Callable[[str | bytes], None], asyncio.Future[None]] | None = None
        self._head_for = -1
        self._head = b""
        """The header of the last text frame ``send_encoded_text_nowait`` wrote, and its size."""
        self.stall_s = 0.0
        """See ``guard_stall`` (0: no guard)."""
        self.stalled = False
        """The connection was aborted by ``guard_stall``: the peer stopped reading."""
        self._stall_timer: asyncio.TimerHandle | None = None

    def guard_stall(self, stall_s: float, high_bytes: int, sndbuf_bytes: int = 0) -> None:
        """Abort the connection if the peer reads nothing for about ``stall_s``.

        A peer that stops reading (hung, or its path gone without a reset) leaves
        what we send in the kernel's buffer and then in the transport's, growing
        for as long as we write. The transport pauses writing once it holds more
        than ``high_bytes``; if it has not resumed ``stall_s`` later, the
        connection is aborted (``stalled``), which ends ``serve``. The kernel's
        send buffer is capped at ``sndbuf_bytes`` (0: left to its autotuning, up
        to megabytes), which bounds what it holds and so how long a stall takes
        to show.
        """
        self.stall_s = stall_s
        if sndbuf_bytes:
            sock = self._transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf_bytes)
        self._transport.set_write_buffer_limits(high=high_bytes)

    def _writing_paused(self) -> None:
        if self.stall_s > 0 and self._stall_timer is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._stall_timer = loop.call_later(self.stall_s, self._stall)

    def _writing_resumed(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stall(self) -> None:
        self._stall_timer = None
        if not self._transport.is_closing():
            self.stalled = True
            log.warning(
                "ws.peer_stalled",
                path=self.request.path,
                unsent_bytes=self._transport.get_write_buffer_size(),
                stall_s=self.stall_s,
            )
            self._transport.abort()  # unsent bytes dropped; connection_lost ends serve()

    @property
    def write_buffer_bytes(self) -> int:
        transport = self._writer.transport
        return 0 if transport.is_closing() else transport.get_write_buffer_size()

    def _flush(self) -> None:
        for chunk in self._proto.data_to_send():
            if chunk:
                self._writer.write(chunk)
            else:  # websockets' signal that the server must half-close the TCP connection
                if self._writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        self._writer.write_eof()

    async def send_text(self, text: str) -> None:
        if self.closed:
            return
        self._proto.send_text(text.encode())
        self._flush()
        await self._writer.drain()

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            return
        self._proto.send_binary(data)
        self._flush()
        await self._writer.drain()

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark unsent (the
        peer is not reading); return at once otherwise, or once the connection is lost."""
        if self.closed or self._transport.is_closing():
            return
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    def send_text_nowait(self, text: str) -> None:
        """Queue a text message without waiting for the socket to drain (dropped once the
        connection is closing: websockets would refuse it)."""
        if not self.closed and self._proto.state is State.OPEN:
            self._proto.send_text(text.encode())
            self._flush()

    def send_encoded_text_nowait(self, data: bytes) -> None:
        """Queue a text message given as its UTF-8 bytes: one ``write`` of header + payload.

        The hot path of outbound media. The frame header is built here, the
        bytes websockets' ``send_text`` would write (FIN, opcode 1, unmasked,
        7/16/64-bit length; checked by a test); the protocol object is used
        whenever its state says a plain frame is not what it would write
        (not OPEN, a fragmented message in progress, an extension).
        """
        if self.closed:
            return
        proto = self._proto
        if self._plain_frames and self._open and not proto.expect_continuation_frame:
            n = len(data)
            if n == self._head_for:  # a stream's media messages are all one size
                head = self._head
            else:
                if n < 126:
                    head = bytes((_FIN_TEXT, n))
                elif n < 65536:
                    head = _HEAD16.pack(_FIN_TEXT, 126, n)
                else:
                    head = _HEAD64.pack(_FIN_TEXT, 127, n)
                self._head_for, self._head = n, head
            self._transport.write(head + data)
            return
        proto.send_text(data)
        self._flush()

    def send_bytes_nowait(self, data: bytes) -> None:
        if not self.closed and self._proto.state is State.OPEN:
            self._proto.send_binary(data)
            self._flush()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        self._open = False
        with contextlib.suppress(Exception):  # the peer may already be gone
            self._proto.send_close(code, reason)
            self._flush()
            await self._writer.drain()
        with contextlib.suppress(Exception):
            self._writer.close()
            await asyncio.wait_for(self._writer.wait_closed(), CLOSE_TIMEOUT_S)

    async def recv(self) -> str | bytes | None:
        """The next whole message, or ``None`` once the connection is closed."""
        while not self._pending:
            if self.closed and self._proto.state is State.CLOSED:
                return None
            try:
                data = await self._reader.read(READ_CHUNK_BYTES)
            except (ConnectionError, OSError):
                data = b""
            if not data:
                self._proto.receive_eof()
                self._open = self._proto.state is State.OPEN
                self._collect()
                self._flush()
                self.closed = True
                return self._pending.pop(0) if self._pending else None
            self._proto.receive_data(data)
            self._open = self._proto.state is State.OPEN
            self._collect()
            self._flush()
            if self._proto.state in (State.CLOSING, State.CLOSED) and not self._pending:
                self._note_close()
                self.closed = True
                with contextlib.suppress(Exception):
                    await self._writer.drain()
                    self._writer.close()
                return None
        return self._pending.pop(0)

    async def serve(self, on_message: Callable[[str | bytes], None]) -> None:
        """Hand every message to ``on_message`` as it arrives, until the connection ends.

        The per-message path of a long-lived stream (a carrier's media
        socket: 50 messages a second): after this call the transport's bytes
        go straight from its ``data_received`` into websockets' parser and
        each whole message to ``on_message``, in that callback, with no
        ``StreamReader`` future, task wake-up or ``recv`` coroutine per
        message. What ``recv`` does at a close frame, EOF or a lost
        connection happens here too; ``serve`` returns then. An exception
        from ``on_message`` ends the connection's reading and is raised here.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._serving = (on_message, done)
        reader = self._reader
        transport = cast(asyncio.Transport, self._writer.transport)  # uvloop's is no subclass
        # Bytes the reader already holds (sent right behind the upgrade
        # request, or not yet asked for by recv): StreamReader has no public
        # way to take them without waiting, so its buffer and its
        # flow-control flag (CPython 3.8-3.13) are read directly.
        held: bytearray = reader._buffer  # type: ignore[attr-defined]
        buffered = bytes(held)
        held.clear()
        at_eof = reader.at_eof()
        transport.set_protocol(_ServeProtocol(self, transport.get_protocol()))
        if reader._paused:  # type: ignore[attr-defined]
            reader._paused = False  # type: ignore[attr-defined]
            transport.resume_reading()
        self._deliver()
        if buffered and not done.done():
            self._serve_data(buffered)
        if at_eof and not done.done():
            self._serve_eof()
        try:
            await done
        finally:
            self._serving = None

    def _serve_data(self, data: bytes) -> None:
        """The transport's bytes while serving (the loop calls this as ``data_received``).

        Every byte goes through websockets' parser (the one parser of the
        carrier socket, as of the provider sockets: issue 32), which checks
        the frames (masking, sizes, reserved bits, fragments, control frames)
        and answers pings and a close; each whole message then goes to
        ``on_message`` in order. A text message that is not UTF-8 ends serving
        with its ``UnicodeDecodeError``, after the messages before it in the
        same read were delivered.
        """
        proto = self._proto
        try:
            proto.receive_data(data)
            self._open = proto.state is State.OPEN
            try:
                self._collect()
            finally:  # what came before a message that failed to decode still goes
                self._flush()
                self._deliver()
            if not self._open:  # CLOSING or CLOSED: an accepted connection is past CONNECTING
                self._note_close()
                self.closed = True
                self._serve_end()
                self._writer.close()  # the transport flushes its buffer first
        except Exception as exc:  # raised by serve() instead
            self._serve_end(exc)

    def _serve_eof(self) -> None:
        try:
            self._proto.receive_eof()
            self._open = self._proto.state is State.OPEN
            self._collect()
            self._flush()
            self.closed = True
            self._deliver()
            self._serve_end()
        except Exception as exc:  # raised by serve() instead
            self._serve_end(exc)

    def _deliver(self) -> None:
        serving = self._serving
        while serving is not None and self._pending and not serving[1].done():
            serving[0](self._pending.pop(0))

    def _serve_end(self, exc: BaseException | None = None) -> None:
        serving = self._serving
        if serving is not None and not serving[1].done():
            if exc is None:
                serving[1].set_result(None)
            else:
                serving[1].set_exception(exc)

    def _note_close(self) -> None:
        rcvd = self._proto.close_rcvd or self._proto.close_sent
        if rcvd is not None and self.close_code is None:
            self.close_code = int(rcvd.code)
            self.close_reason = rcvd.reason

    def _collect(self) -> None:
        for frame in self._proto.events_received():
            if not isinstance(frame, Frame):
                continue
            op = frame.opcode
            if op is Opcode.TEXT or op is Opcode.BINARY:
                if frame.fin:
                    data = bytes(frame.data)
                    self._pending.append(data.decode() if op is Opcode.TEXT else data)
                else:
                    self._fragments = [bytes(frame.data)]
                    self._fragment_text = op is Opcode.TEXT
            elif op is Opcode.CONT:
                self._fragments.append(bytes(frame.data))
                if frame.fin:
                    data = b"".join(self._fragments)
                    self._fragments = []
                    self._pending.append(data.decode() if self._fragment_text else data)
            elif op is Opcode.CLOSE:
                self._note_close()

    def __aiter__(self) -> WsConnection:
        return self

    async def __anext__(self) -> str | bytes:
        msg = await self.recv()
        if msg is None:
            raise StopAsyncIteration
        return msg


class _ServeProtocol(asyncio.Protocol):
    """The transport's protocol during ``WsConnection.serve``.

    Data and EOF go to the connection; flow control and the end of the
    connection also go to the ``StreamReaderProtocol`` it replaced, which
    ``StreamWriter.drain`` / ``wait_closed`` still rely on.
    """

    def __init__(self, conn: WsConnection, inner: asyncio.BaseProtocol) -> None:
        self._conn = conn
        self._inner = inner
        # the loop calls the connection's reader itself: no frame of ours per read
        self.data_received = conn._serve_data  # type: ignore[method-assign]

    def data_received(self, data: bytes) -> None:
        self._conn._serve_data(data)

    def eof_received(self) -> bool | None:
        self._conn._serve_eof()
        return True  # as StreamReaderProtocol: the writer closes the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)
        self._conn._writing_resumed()  # no stall timer outlives the connection
        self._conn._serve_eof()

    def pause_writing(self) -> None:
        self._inner.pause_writing()
        self._conn._writing_paused()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
        self._conn._writing_resumed()


WsHandler = Callable[[WsConnection], Awaitable[None]]
HttpHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]
WsRouter = Callable[[HttpRequest], Awaitable["WsHandler | HttpResponse"]]


@dataclass
class HttpWsServer:
    """What ``serve_http_ws`` returns: the asyncio server and live connections."""

    server: asyncio.Server
    connections: set[asyncio.Task[Any]]
    gate: ConnectionGate | None = None
    """The connection caps checked at accept, and their refusal counts."""
    timed_out: int = 0
    """Connections closed because their request was not complete within ``header_timeout_s``."""

    def set_limits(self, limits: ConnectionLimits) -> None:
        """New caps and timeout (a reload) for connections accepted from now on."""
        if self.gate is not None:
            self.gate.limits = limits

    @property
    def port(self) -> int:
        """The TCP port listened on (0 on a Unix socket)."""
        server: Any = self.server  # uvloop's ``sockets`` is a list, asyncio's a tuple
        name = server.sockets[0].getsockname()
        return 0 if isinstance(name, str | bytes) else int(name[1])

    async def close(self) -> None:
        self.server.close()
        for t in list(self.connections):
            t.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)


async def _read_request(
    reader: asyncio.StreamReader,
    peer: tuple[str, int] | None,
    max_body: Callable[[str, str], int] | None = None,
) -> tuple[HttpRequest, bytes] | HttpResponse | None:
    """The next request; or the response that refuses it (a body is measured against
    ``max_body(method, path)`` from its Content-Length, before any of it is read)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return HttpResponse.text(413, "request head too large")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(line)
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        raw_length = headers.get("content-length", "0")
        if not (raw_length.isascii() and raw_length.isdigit()):  # int() takes "+1", "1_0"
            raise ValueError(raw_length)
        length = int(raw_length)
    except ValueError:
        return HttpResponse.text(400, "malformed HTTP request")
    if length < 0:
        return HttpResponse.text(400, "malformed HTTP request")
    allowed = MAX_BODY_BYTES if max_body is None else max_body(method, urlsplit(target).path)
    if length > allowed:
        return HttpResponse.text(
            413, "this route takes no request body" if allowed == 0 else "request body too large"
        )
    try:
        body = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:  # the client stopped sending before its body's end
        return HttpResponse.text(400, "request body shorter than its Content-Length")
    except ConnectionError:
        return None
    return HttpRequest(method, target, headers, body, peer), head


async def serve_http_ws(
    host: str,
    port: int,
    *,
    http: HttpHandler,
    ws: WsRouter,
    subprotocols: Callable[[HttpRequest], Sequence[str]] | None = None,
    max_message_bytes: int = 1024 * 1024,
    limits: ConnectionLimits | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    unix_path: str = "",
) -> HttpWsServer:
    """Listen on ``host:port`` (or on the Unix socket ``unix_path``, mode 0600, replacing a
    stale one); plain requests go to ``http``, upgrades to ``ws``.

    ``subprotocols(request)`` names the subprotocols offered on that request's
    path (none by default: a client offering one then gets none back).

    ``limits``: connections beyond ``max_connections`` in all or
    ``max_connections_per_source`` from one address are closed as they are
    accepted, before anything is read; a request (head and body) not complete
    within ``header_timeout_s`` of the connection's start is closed unanswered.
    Without ``limits`` only the timeout applies, at its default.
    ``max_body_bytes``: the largest body a request may carry; a ``GET``
    (``HEAD``, ``DELETE``...) may carry none. A larger one gets 413 before
    its first byte is read.
    """
    tasks: set[asyncio.Task[Any]] = set()
    lim = limits if limits is not None else ConnectionLimits()
    gate = ConnectionGate(lim) if limits is not None else None
    result: list[HttpWsServer] = []

    def max_body(method: str, path: str) -> int:
        return 0 if method in _NO_BODY_METHODS else max_body_bytes

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        if gate is not None and gate.admit(source) is not None:
            writer.transport.abort()  # at once: nothing read, nothing buffered
            return
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await _serve_one(reader, writer)
        except asyncio.CancelledError:
            # the server's close cancels its connections: their end, not an error. This
            # task is the top of its own stack (start_server's), awaited by nothing that
            # needs the cancellation, and Python 3.11's stream callback would log it as an
            # "Exception in callback" with a traceback at every stop
            return
        except Exception:  # safety net: one connection's bug must not touch the others
            log.exception("http.connection_failed")
        finally:
            tasks.discard(task)
            if gate is not None:
                gate.release(source)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        timeout_s = gate.limits.header_timeout_s if gate is not None else lim.header_timeout_s
        try:
            got = await asyncio.wait_for(
                _read_request(reader, tuple(peer[:2]) if peer else None, max_body),
                timeout_s,
            )
        except TimeoutError:  # a slow or silent client (slowloris): no answer
            if result:
                result[0].timed_out += 1
            writer.transport.abort()
            return
        if got is None:
            return
        if isinstance(got, HttpResponse):
            writer.write(got.serialize())
            await writer.drain()
            return
        request, head = got
        if not request.is_websocket:
            response = await http(request)
            writer.write(response.serialize())
            await writer.drain()
            return
        decision = await ws(request)
        offered = subprotocols(request) if subprotocols is not None else ()
        proto = ServerProtocol(
            subprotocols=[Subprotocol(s) for s in offered] or None,
            max_size=max_message_bytes,
        )
        proto.receive_data(head)
        events = proto.events_received()
        if not events or not isinstance(events[0], WsRequest):
            writer.write(HttpResponse.text(400, "malformed WebSocket upgrade").serialize())
            await writer.drain()
            return
        if isinstance(decision, HttpResponse):
            writer.write(decision.serialize())
            await writer.drain()
            return
        handshake = proto.accept(events[0])
        proto.send_response(handshake)
        for chunk in proto.data_to_send():
            writer.write(chunk)
        await writer.drain()
        if handshake.status_code != 101:
            return
        conn = WsConnection(request, proto, reader, writer)
        try:
            await decision(conn)
        finally:
            await conn.close(1000, "")

    if unix_path:
        server = await asyncio.start_unix_server(on_connection, unix_path, limit=MAX_HEAD_BYTES)
        os.chmod(unix_path, 0o600)
    else:
        server = await asyncio.start_server(on_connection, host, port, limit=MAX_HEAD_BYTES)
    result.append(HttpWsServer(server, tasks, gate))
    return result[0]

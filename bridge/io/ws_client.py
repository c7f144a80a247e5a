"""A provider's WebSocket: a small ``asyncio.Protocol`` over websockets' sans-I/O
``ClientProtocol``.

websockets parses and builds every frame, checks the handshake, answers pings
and runs the closing handshake's state; this module owns what it leaves to
the I/O layer: the transport, the opening handshake's timeout, keepalive
pings with a pong timeout, the close timeout, and write flow control. A
complete text or binary message goes to ``on_message`` as it comes out of the
parser (no queue, future or coroutine step per message); a text message is
decoded as UTF-8 once, and invalid UTF-8 fails the connection with 1007.

It also counts offsets in the byte stream for the underrun verdict
(``Connection.watch_dry`` in ``provider_ws``): the handshake response ends
at its blank line, and each frame's length on the wire follows from its
payload (a server's frames are unmasked).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake
from websockets.frames import CloseCode, Opcode
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

__all__ = [
    "CLOSE_TIMEOUT_S",
    "OPEN_TIMEOUT_S",
    "PING_INTERVAL_S",
    "PING_TIMEOUT_S",
    "InvalidHandshake",
    "ProviderWebSocket",
    "open_websocket",
]

OPEN_TIMEOUT_S = 10.0
"""The TCP (and TLS) connect and the opening handshake must be done within this time."""
PING_INTERVAL_S = 20.0
"""A keepalive ping this long after the last one was answered."""
PING_TIMEOUT_S = 20.0
"""A ping unanswered this long fails the connection (1011)."""
CLOSE_TIMEOUT_S = 10.0
"""Once the closing handshake is under way, the peer has this long to close the socket."""
WRITE_LIMIT_BYTES = 32 * 1024
"""Above this much in the transport's buffer, ``drain`` waits (websockets' default)."""


class ProviderWebSocket(asyncio.Protocol):
    """One client WebSocket handing each data message to ``on_message``."""

    def __init__(
        self,
        protocol: ClientProtocol,
        *,
        on_message: Callable[[str | bytes], None],
        ping_interval_s: float | None = PING_INTERVAL_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        self.protocol = protocol
        self.on_message = on_message
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.response: Response | None = None
        self.connection_exc: BaseException | None = None
        """What broke the connection from our side (invalid UTF-8, a failed write)."""
        self.opened: asyncio.Future[None] = self.loop.create_future()
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.close_timeout_s = close_timeout_s
        self.ping_data: bytes | None = None
        """The keepalive ping awaiting its pong (None: none)."""
        self.pongs = 0
        """Keepalive pings answered."""
        self._ping_timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None
        """Set while the transport is above its write-buffer limit (``drain``)."""
        self._fragments: list[bytes] = []
        self._fragmented_text = False
        self._fragments_start = 0
        self._head: bytearray | None = bytearray()
        """The stream until the handshake response's blank line (then None)."""
        self._parsed = 0
        """Where the last frame the parser gave us ends."""
        self.after_read: Callable[[], None] | None = None
        """Called once a read's messages are all handed over (``Connection._after_read``)."""
        # Offsets in the byte stream read from the socket (``Connection.watch_dry``):
        self.received = 0
        """Bytes read so far."""
        self.consumed = 0
        """Every message before this offset has been handed over."""
        self.msg_start = 0
        """Where the message being handed over begins."""

    # ------------------------------------------------------------ what the shell reads

    @property
    def subprotocol(self) -> str | None:
        return self.protocol.subprotocol

    @property
    def close_code(self) -> int | None:
        return self.protocol.close_code

    @property
    def close_reason(self) -> str | None:
        return self.protocol.close_reason

    async def wait_closed(self) -> None:
        await asyncio.shield(self.lost)

    # ------------------------------------------------------------ sending

    def send_message(self, data: str | bytes) -> None:
        """One message now, if the connection is open (a failed write fails it)."""
        if self.protocol.state is not State.OPEN:
            return
        if isinstance(data, str):
            self.protocol.send_text(data.encode())
        else:
            self.protocol.send_binary(data)
        self.send_data()

    async def drain(self) -> None:
        """Wait until the transport is below its write-buffer limit (or the socket is gone)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def send_data(self) -> None:
        """Write what the protocol has to send; a write that fails aborts the socket."""
        try:
            for data in self.protocol.data_to_send():
                if data:
                    self.transport.write(data)
                elif self.transport.can_write_eof():  # the end of the stream (no TLS)
                    self.transport.write_eof()
                else:
                    self.transport.close()
        except Exception as exc:
            if self.connection_exc is None:
                self.connection_exc = exc
            self.transport.abort()
        if self._close_timer is None and self.protocol.close_expected():
            self._close_timer = self.loop.call_later(self.close_timeout_s, self._close_timed_out)

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """The closing handshake, then the socket's end (aborted after ``close_timeout_s``)."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self.send_data()
        elif self.protocol.state is State.CONNECTING:
            self.transport.abort()
        await self.wait_closed()

    def _close_timed_out(self) -> None:
        self._close_timer = None
        self.transport.abort()  # the peer did not close the socket after the handshake

    # ------------------------------------------------------------ keepalive

    def _send_ping(self) -> None:
        self._ping_timer = None
        if self.protocol.state is not State.OPEN:
            return
        self.ping_data = os.urandom(4)
        self.protocol.send_ping(self.ping_data)
        self.send_data()
        self._ping_timer = self.loop.call_later(self.ping_timeout_s, self._ping_timed_out)

    def _ping_timed_out(self) -> None:
        self._ping_timer = None
        if self.protocol.state is State.OPEN:
            self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            self.send_data()

    def _pong(self, data: bytes) -> None:
        if self.ping_data is None or data != self.ping_data:
            return  # unsolicited
        self.ping_data = None
        self.pongs += 1
        self.start_keepalive()

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(WRITE_LIMIT_BYTES)  # low: a quarter
        self.send_data()  # the handshake request

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        head = self._head
        if head is not None:  # the handshake response is not whole yet
            head += data
            end = head.find(b"\r\n\r\n")
            if end >= 0:
                self.consumed = self.msg_start = self._parsed = end + 4
                self._head = None
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        self.send_data()  # pongs, a close reply
        for event in events:
            self.process_event(event)
        after_read = self.after_read
        if after_read is not None:
            after_read()

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        events = self.protocol.events_received()
        self.send_data()
        for event in events:
            self.process_event(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED now
        if self.connection_exc is None:
            self.connection_exc = exc
        for timer in (self._ping_timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._close_timer = None
        self.resume_writing()
        if not self.opened.done():
            self.opened.set_exception(
                exc or self.protocol.handshake_exc or ConnectionError("closed during the handshake")
            )
            self.opened.exception()  # (retrieved: the opener may have gone)
        self.lost.set_result(None)

    # ------------------------------------------------------------ events

    def process_event(self, event: Any) -> None:
        if self.response is None:  # the handshake response
            if isinstance(event, Response):
                self.response = event
                self._opened()
            return
        data = event.data
        size = len(data)
        start = self._parsed
        end = self._parsed = start + size + (2 if size < 126 else 4 if size < 65_536 else 10)
        opcode = event.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if not event.fin:  # the first fragment; the protocol checks their order
                self._fragmented_text = opcode is Opcode.TEXT
                self._fragments = [bytes(data)]
                self._fragments_start = start
                return
            self.msg_start, self.consumed = start, end
            self._deliver(opcode is Opcode.TEXT, data)
        elif opcode is Opcode.CONT:
            self._fragments.append(bytes(data))
            if event.fin:
                whole, self._fragments = b"".join(self._fragments), []
                self.msg_start, self.consumed = self._fragments_start, end
                self._deliver(self._fragmented_text, whole)
        else:
            if opcode is Opcode.PONG:
                self._pong(bytes(data))
            if not self._fragments:  # (a fragmented message began before it)
                self.consumed = end

    def _opened(self) -> None:
        if self.opened.done():
            return
        exc = self.protocol.handshake_exc
        if exc is not None:
            self.opened.set_exception(exc)
            return
        self.opened.set_result(None)

    def start_keepalive(self) -> None:
        """Ping ``ping_interval_s`` from now (again), unless keepalive is off."""
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self.ping_interval_s is not None:
            self._ping_timer = self.loop.call_later(self.ping_interval_s, self._send_ping)

    def _deliver(self, text: bool, data: Any) -> None:
        if not text:
            self.on_message(bytes(data))
            return
        try:
            decoded = str(data, "utf-8")
        except UnicodeDecodeError as exc:
            if self.connection_exc is None:
                self.connection_exc = exc
            self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
            self.send_data()
            return
        self.on_message(decoded)


async def open_websocket(
    url: str,
    on_message: Callable[[str | bytes], None],
    *,
    headers: Sequence[tuple[str, str]] = (),
    subprotocols: Sequence[str] = (),
    max_size: int | None = None,
    unix_path: str = "",
    open_timeout_s: float = OPEN_TIMEOUT_S,
) -> ProviderWebSocket:
    """Connect to ``url`` (over the Unix socket ``unix_path`` if given), complete the
    opening handshake within ``open_timeout_s`` and start the keepalive; raises
    ``TimeoutError``, ``OSError`` or websockets' ``InvalidHandshake`` (``InvalidStatus``
    for a refused upgrade). No HTTP proxy and no redirect is followed: a provider's URL
    is its WebSocket endpoint."""
    uri = parse_uri(url)
    protocol = ClientProtocol(
        uri, subprotocols=[Subprotocol(s) for s in subprotocols] or None, max_size=max_size
    )
    request = protocol.connect()
    for name, value in headers:
        request.headers[name] = value
    request.headers.setdefault("User-Agent", USER_AGENT)
    protocol.send_request(request)
    loop = asyncio.get_running_loop()
    tls = ssl.create_default_context() if uri.secure else None
    server_hostname = uri.host if uri.secure else None

    def factory() -> ProviderWebSocket:
        return ProviderWebSocket(protocol, on_message=on_message)

    async with asyncio.timeout(open_timeout_s):
        if unix_path:
            _, ws = await loop.create_unix_connection(
                factory, unix_path, ssl=tls, server_hostname=server_hostname
            )
        else:
            _, ws = await loop.create_connection(
                factory, uri.host, uri.port, ssl=tls, server_hostname=server_hostname
            )
        try:
            await asyncio.shield(ws.opened)
        except BaseException:
            ws.transport.abort()
            raise
    ws.start_keepalive()
    return ws

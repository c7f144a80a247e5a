"""One provider connection: the socket, the timers and the pump.

The decisions are pure and live in ``bridge.providers``: which turn an event is
for and where it goes (``connection``), flow control (``flow``), turn deadlines
(``turn_deadlines``), underrun verdicts (``bridge.media.underrun``). This module
owns what they cannot. ``Connection`` is ``ProviderConnection`` pumped the
engine-contract way: messages in with ``loop.time()``, actions out, events
routed to the turn's sinks (``route_events``), one timer re-armed from
``next_deadline()``.

It sees its pool only as a ``ConnectionOwner``. The pool itself is
``bridge.io.provider_pool``, the turn handles and the voice-agent session are
``bridge.io.provider_turns``, and a session route's POST is
``bridge.io.session_http``: they import this module, never the reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import termios
from array import array
from collections import deque
from collections.abc import Callable
from typing import Protocol

import websockets
from websockets.protocol import State

from bridge.engine import CloseConnection, SendBytes, SendText
from bridge.io.session_http import SessionRouteError, http_request
from bridge.io.ws_client import ProviderWebSocket as _ProviderWebSocket
from bridge.io.ws_client import open_websocket
from bridge.logs import get_logger
from bridge.media.underrun import dry_verdict
from bridge.providers.base import ProviderSettings, TtsProtocol, TurnFailed
from bridge.providers.connection import PoolKey, PoolView, ProviderConnection
from bridge.providers.turn_deadlines import TURN_CHECK_S

__all__ = ["SEND_BUFFER_LIMIT_BYTES", "Connection", "ConnectionOwner"]

log = get_logger("callbridge.tts")
_INQ = array("i", [0])
"""``FIONREAD``'s answer (``Connection.unread_bytes``)."""

SEND_BUFFER_LIMIT_BYTES = 65_536
"""Above this much unsent data on a provider socket, messages wait for it to drain."""


class ConnectionOwner(PoolView, Protocol):
    """What a ``Connection`` reads and tells of its pool beyond ``PoolView``
    (``bridge.io.provider_pool.ProviderPool`` is one)."""

    settings: ProviderSettings
    preempt: Callable[[], None]
    """Called between two provider messages (``MediaTicker.run_if_due``)."""

    @property
    def name(self) -> str: ...

    def connection_ended(self, conn: Connection) -> None:
        """``conn`` has closed (its turns have failed): forget it, reconnect if due."""
        ...


def _ignore_message(msg: str | bytes) -> None:
    """``on_message`` of a connection whose ``Connection`` has finished."""


class Connection(ProviderConnection):
    """One WebSocket to the provider: ``bridge.providers.connection.ProviderConnection``
    (the engine, its turns' sinks, the routing) with the socket, the timers and the pump.

    Flow control (off unless the pool sets ``flow_high_s``: see ``FLOW_HIGH_S``):
    a read that leaves every turn on the connection more than
    ``pool.flow_high_s`` of audio ahead of its playout (``bridge.providers.flow``)
    stops the reading (``transport.pause_reading``), so what the provider sends
    beyond that waits in its socket buffers, not in ours, and a connection
    whose turns need audio gets the loop. Reading resumes when a turn is
    opened on it, when its neediest turn is down to ``pool.flow_low_s`` ahead,
    and in any case after ``FLOW_PAUSE_MAX_S``; it never pauses while a turn
    has no audio yet, while a keepalive ping awaits its pong, or once the
    connection is not open.
    """

    pool: ConnectionOwner

    def __init__(self, pool: ConnectionOwner, engine: TtsProtocol, key: PoolKey = None) -> None:
        super().__init__(pool, engine, key)
        self.loop = asyncio.get_running_loop()
        self.ws: _ProviderWebSocket | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0  # when ``timer`` fires (it may be before the engine's deadline)
        self.task: asyncio.Task[None] | None = None
        self.ready_event = asyncio.Event()
        self.changed = asyncio.Event()
        self.outbox: deque[str | bytes] = deque()
        self.writer: asyncio.Task[None] | None = None
        self.early: list[str | bytes] | None = []
        """Messages that came with the handshake, before the engine heard of the connection."""
        self.flow_timer: asyncio.TimerHandle | None = None
        self.watch_timer: asyncio.TimerHandle | None = None

    def now(self) -> float:
        return self.loop.time()

    def is_handshaking(self) -> bool:
        return not self.ready_event.is_set()

    def on_ready(self) -> None:
        self.ready_event.set()

    def watch_dry(self, wire_id: str, on_provider: Callable[[], None]) -> bool:
        """A turn on this connection ran dry: did the daemon hold its next audio unread?

        False: nothing waits unread, in the kernel or read and not yet handed
        over; the provider had not sent it. True: bytes wait, and the underrun
        is the daemon's unless they turn out not to hold the turn's audio
        (``bridge.media.underrun``: ``on_provider`` is called then).
        """
        ws = self.ws
        if not isinstance(ws, _ProviderWebSocket):
            return self.unread_bytes() > 0
        kernel = self.unread_bytes()
        unconsumed = ws.received - ws.consumed
        encrypted, window = False, None
        if kernel or unconsumed:
            transport = ws.transport
            encrypted = transport.get_extra_info("sslcontext") is not None
            if not encrypted:
                sock = transport.get_extra_info("socket")
                with contextlib.suppress(OSError, AttributeError):
                    window = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        verdict = dry_verdict(kernel, unconsumed, encrypted, window)
        if verdict == "watch":
            self.dry.add(wire_id, ws.received + kernel, on_provider)
        return verdict != "provider"

    def unread_bytes(self) -> int:
        """Bytes the kernel holds for this connection that the daemon has not read."""
        ws = self.ws
        transport = None if ws is None else ws.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, _INQ, True)
        except (OSError, ValueError):
            return 0
        return int(_INQ[0])

    def _after_read(self) -> None:
        """A read's messages are handed over: stop reading while every turn is well ahead."""
        if self.dry.watches:
            self._dry_settle()
        flow, pool = self.flow, self.pool
        if pool.flow_high_s is None or flow.paused or self.closed or not flow.clocks:
            return
        ws = self.ws
        can_pause = ws is not None and ws.protocol.state is State.OPEN and ws.ping_data is None
        now = self.loop.time()
        resume_at = flow.after_read(
            now, len(self.sinks), can_pause, pool.flow_high_s, pool.flow_low_s
        )
        if resume_at is not None and ws is not None:
            ws.transport.pause_reading()
            self.flow_timer = self.loop.call_at(resume_at, self.resume)

    def _dry_settle(self) -> None:
        ws = self.ws
        self.dry.settle(ws.consumed if isinstance(ws, _ProviderWebSocket) else 0)

    def resume(self) -> None:
        """Read again (a turn needs audio, or the pause has lasted long enough)."""
        if self.flow_timer is not None:
            self.flow_timer.cancel()
            self.flow_timer = None
        if self.flow.resumed() and self.ws is not None:
            self.ws.transport.resume_reading()

    async def run(self) -> None:
        try:
            await self._connect()
            assert self.ws is not None
            early, self.early = self.early or [], None
            for msg in early:
                self._on_message(msg)
            await self.ws.wait_closed()  # messages arrive through _on_message meanwhile
            exc = self.ws.protocol.close_exc
            if isinstance(exc, websockets.ConnectionClosedOK):
                code, reason = self.ws.close_code, self.ws.close_reason or ""
            else:
                code, reason = None, f"{type(exc).__name__}: {exc}"
        except (TimeoutError, OSError, websockets.WebSocketException) as e:
            code, reason = None, f"{type(e).__name__}: {e}"
        except Exception as e:  # a malformed session answer, an engine's refusal: this
            # connection ends like any other (its turns fail, the pool reconnects)
            log.warning("tts.connect_failed", provider=self.pool.name, error=repr(e)[:200])
            code, reason = None, f"{type(e).__name__}: {e}"
        finally:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            if self.watch_timer is not None:
                self.watch_timer.cancel()
                self.watch_timer = None
            self.resume()
        self.ended(code, reason, self.now())
        self.ready_event.set()
        self.pool.connection_ended(self)
        ws = self.ws
        if isinstance(ws, _ProviderWebSocket):
            # it holds our bound methods and we hold it: let a closed one go by
            # reference counting, not at the next full collection
            ws.on_message = _ignore_message
            ws.after_read = None

    def _on_message(self, msg: str | bytes) -> None:
        """One provider message, as websockets parsed it (``_ProviderWebSocket``):
        through the engine's ``receive_*``, then pumped (a turn's audio and word
        timings go straight to its audio and words sinks, ``dispatch``)."""
        if self.early is not None:
            self.early.append(msg)
            return
        if self.closed:
            return
        now = self.loop.time()
        if isinstance(msg, str):
            self.engine.receive_text(msg, now)
        else:
            self.engine.receive_bytes(msg, now)
        self.pump()
        self._after_message()

    def _after_message(self) -> None:
        if self.dry.watches:
            self._dry_settle()
        # a burst (many turns' audio at once) is read in one data_received, without
        # a return to the loop: let frames due meanwhile leave on time
        self.pool.preempt()

    # ------------------------------------------------------------ turn deadlines

    def arm_watch_timer(self) -> None:
        if self.watch_timer is None:
            self.watch_timer = self.loop.call_later(TURN_CHECK_S, self._check_turns)

    def _check_turns(self) -> None:
        self.watch_timer = None
        for wire_id, message in self.late_turns(self.now()):
            self._fail_turn(wire_id, message)
        if self.watches and not self.closed:
            self.watch_timer = self.loop.call_later(TURN_CHECK_S, self._check_turns)

    def _fail_turn(self, wire_id: str, message: str) -> None:
        """End a turn the provider does not deliver: its cancel goes out, it fails."""
        now = self.now()
        sink = self.fail_turn(wire_id, now)
        self.pump(now)
        log.warning("tts.turn_timeout", provider=self.pool.name, detail=message)
        if sink is not None:
            sink(TurnFailed(wire_id, "timeout", message, retryable=True))

    async def _connect(self) -> None:
        req = self.engine.session_request()
        if req is not None:
            status, body = await http_request(req, self.pool.settings.unix_socket)
            self.engine.session_response(status, body, self.now())
            self.pump()
            if self.engine_failed:  # refused, or an answer with no usable URL: no connect
                raise SessionRouteError(f"session route answer not usable (HTTP {status})")
        params = self.engine.connect_params()
        self.ws = await open_websocket(
            params.url,
            self._on_message,
            headers=params.headers,
            subprotocols=params.subprotocols,
            max_size=params.max_message_bytes,
            unix_path=self.pool.settings.unix_socket,  # the embedded server's socket
        )
        self.ws.after_read = self._after_read
        self.engine.connection_made(self.ws.subprotocol, self.now())
        self.pump()

    def pump(self, now: float | None = None) -> None:
        """Send the engine's actions, route its events, re-arm the timer."""
        for action in self.engine.actions_to_send():
            if self.ws is None:
                break
            if isinstance(action, SendText):
                self._queue_send(action.text)
            elif isinstance(action, SendBytes):
                self._queue_send(action.data)
            elif isinstance(action, CloseConnection):
                self.loop.create_task(self.ws.close(action.code, action.reason))
        self.route_events(self.loop.time() if now is None else now)
        self.changed.set()
        # One timer, re-armed only when the deadline comes earlier: a deadline that
        # moves later with every message (a reply timeout) costs no timer churn; the
        # timer then fires early, finds nothing due and re-arms (``_on_timer``).
        deadline = self.engine.next_deadline()
        timer = self.timer
        if deadline is None or self.closed:
            if timer is not None:
                timer.cancel()
                self.timer = None
        elif timer is None or deadline < self.timer_at:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(deadline, self._on_timer)
            self.timer_at = deadline

    def _queue_send(self, data: str | bytes) -> None:
        """Send one message now, straight through the connection's sans-I/O protocol.

        The frame is built by ``ws.protocol`` and written to the transport at
        once: no task, no loop iteration per message. Only when the transport
        is above its write-buffer limit (the provider is not reading) or an
        earlier message still waits there do messages queue behind one
        writer task that awaits the connection's flow control, so the order
        is kept either way. A connection that is not open sends nothing.
        """
        ws = self.ws
        if ws is None:
            return
        if self.outbox or ws.transport.get_write_buffer_size() > SEND_BUFFER_LIMIT_BYTES:
            self.outbox.append(data)
            if self.writer is None or self.writer.done():
                self.writer = self.loop.create_task(self._write())
            return
        ws.send_message(data)  # a failed write aborts the socket

    async def _write(self) -> None:
        ws = self.ws
        while self.outbox and ws is not None and ws.protocol.state is State.OPEN:
            ws.send_message(self.outbox.popleft())
            await ws.drain()
        self.outbox.clear()

    def _on_timer(self) -> None:
        self.timer = None
        again = self.timer_due(self.now())
        if again is not None:  # armed for an earlier deadline that has since moved later
            self.timer = self.loop.call_at(again, self._on_timer)
            self.timer_at = again

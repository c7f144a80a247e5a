"""Provider connections: the asyncio shell around the provider engines.

The decisions are pure and live in ``bridge.providers``: turn placement,
reconnect backoff and idle closing (``pool``), flow control (``flow``), turn
deadlines (``turn_deadlines``), underrun verdicts (``bridge.media.underrun``), the
failover speaker with the prompt cache (``failover``, ``prompts``), which turn
an event is for and where it goes (``connection``) and the voice-agent
session (``agent``). This module owns what they cannot: the sockets, the
timers and the pump.

``ProviderPool`` (one per configured provider) owns the WebSocket connections
to that provider: a warm connection before the first call, turns multiplexed
where the protocol allows (``max_turns``), more connections where it does not,
reconnects after ``Backoff``. Each connection is pumped the engine-contract
way: messages in with ``loop.time()``, actions out, events routed to the
turn's sinks (``ProviderConnection.route_events``), one timer re-armed from
``next_deadline()``. ``Speaker`` is
``bridge.providers.failover.Speaker`` on the loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import termios
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import websockets
from websockets.protocol import State

from bridge.engine import CloseConnection, LocalProtocolError, SendBytes, SendText
from bridge.io.ws_client import ProviderWebSocket as _ProviderWebSocket
from bridge.io.ws_client import open_websocket
from bridge.logs import get_logger
from bridge.media.underrun import dry_verdict
from bridge.providers import failover, registry
from bridge.providers.agent import VoiceAgent
from bridge.providers.base import (
    MULAW_8K,
    HttpRequest,
    ProviderSettings,
    TtsProtocol,
    TurnFailed,
    TurnSettings,
)
from bridge.providers.connection import PoolKey, ProviderConnection, TurnCommands
from bridge.providers.failover import (
    AudioSink,
    Sink,
    WordsSink,
    pool_identity,
    prompt_key,
    render_prompt,
)
from bridge.providers.flow import (
    FLOW_HIGH_S,
    FLOW_LOW_S,
    FLOW_PAUSE_MAX_S,
    NO_FLOW_CONTROL,
)
from bridge.providers.pool import CLOSE_IDLE_AFTER_S, Backoff, Placement
from bridge.providers.prompts import (
    PromptCache,
    TurnFellBack,
)
from bridge.providers.turn_deadlines import (
    TURN_BASE_S,
    TURN_CHECK_S,
    TURN_S_PER_CHAR,
    TURN_STALL_S,
)

__all__ = [
    "FLOW_HIGH_S",
    "FLOW_PAUSE_MAX_S",
    "AgentSession",
    "Backoff",
    "PromptCache",
    "ProviderPool",
    "Speaker",
    "TurnFellBack",
    "engine_class",
    "pool_identity",
    "prompt_key",
    "render_prompt",
]

log = get_logger("callbridge.tts")
_INQ = array("i", [0])
"""``FIONREAD``'s answer (``_Connection.unread_bytes``)."""

SEND_BUFFER_LIMIT_BYTES = 65_536
"""Above this much unsent data on a provider socket, messages wait for it to drain."""
SESSION_TIMEOUT_S = 10.0
"""A session route's answer (zwst's POST) must be whole within this time."""
SESSION_REPLY_MAX_BYTES = 64 * 1024
"""And no larger than this (its JSON holds one URL)."""


def engine_class(protocol: str) -> type[TtsProtocol]:
    return registry.engine_class(protocol)


def _pooling(protocol: str) -> tuple[Any, Any] | None:
    """``(pool_key, settings_for)`` for protocols whose session properties are per connection.

    zwst fixes voice and format per socket (session route): such a protocol
    module exposes ``pool_key(settings, turn)`` and ``settings_for(settings,
    voice, format)``, and the pool keeps separate connections per key.
    """
    mod = registry.client_module(protocol)
    if hasattr(mod, "pool_key") and hasattr(mod, "settings_for"):
        return mod.pool_key, mod.settings_for
    return None


class SessionRouteError(Exception):
    """A session route's answer that is no HTTP response, or too large."""


async def _http_request(req: HttpRequest, unix_socket: str = "") -> tuple[int, bytes]:
    """A minimal HTTP/1.1 client for session routes (no dependency for one POST).

    Bounded: the whole exchange within ``SESSION_TIMEOUT_S`` (else
    ``TimeoutError``), the answer at most ``SESSION_REPLY_MAX_BYTES``; an
    answer that is not an HTTP status line raises ``SessionRouteError``.
    """
    u = urlsplit(req.url)
    secure = u.scheme in ("https", "wss")
    port = u.port or (443 if secure else 80)
    async with asyncio.timeout(SESSION_TIMEOUT_S):
        if unix_socket:  # the embedded server's (``ProviderSettings.unix_socket``)
            reader, writer = await asyncio.open_unix_connection(unix_socket)
        else:
            reader, writer = await asyncio.open_connection(u.hostname, port, ssl=secure or None)
        try:
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            head = [f"{req.method} {path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close"]
            head += [f"{k}: {v}" for k, v in req.headers]
            head.append(f"Content-Length: {len(req.body)}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + req.body)
            await writer.drain()
            raw = bytearray()
            while chunk := await reader.read(65536):
                raw += chunk
                if len(raw) > SESSION_REPLY_MAX_BYTES:
                    raise SessionRouteError(f"answer over {SESSION_REPLY_MAX_BYTES} bytes")
        finally:
            writer.close()
    status_line, _, rest = bytes(raw).partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise SessionRouteError(f"not an HTTP response: {status_line[:40]!r}")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(parts[1]), body


def _ignore_message(msg: str | bytes) -> None:
    """``on_message`` of a connection whose ``_Connection`` has finished."""


class _Connection(ProviderConnection):
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

    pool: ProviderPool

    def __init__(self, pool: ProviderPool, engine: TtsProtocol, key: PoolKey = None) -> None:
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
        self.pool._connection_ended(self)
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
            status, body = await _http_request(req, self.pool.settings.unix_socket)
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


class ProviderPool:
    """Every connection to one provider."""

    def __init__(
        self,
        settings: ProviderSettings,
        warm: int = 1,
        preempt: Callable[[], None] = lambda: None,
        turns_per_connection: int | None = None,
        flow_high_s: float | None = None,
        flow_low_s: float = FLOW_LOW_S,
        close_idle_after_s: float | None = CLOSE_IDLE_AFTER_S,
    ) -> None:
        self.settings = settings
        self.preempt = preempt
        """Called between two provider messages (``MediaTicker.run_if_due``)."""
        self.flow_high_s = None if settings.protocol in NO_FLOW_CONTROL else flow_high_s
        self.flow_low_s = flow_low_s
        """Flow control (``_Connection``): off while ``flow_high_s`` is None (the default)."""
        self.close_idle_after_s = close_idle_after_s
        """Close a connection idle this long (``CLOSE_IDLE_AFTER_S``; None: never)."""
        self.idle_closed = 0
        """Connections closed for being idle, ever."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self.engine_cls = engine_class(settings.protocol)
        self.pooling = _pooling(settings.protocol)
        self.warm = warm
        self.connections: list[_Connection] = []
        self.placement: Placement[_Connection] = Placement(
            turns_per_connection, self.engine_cls.max_turns
        )
        """Where turns go and which idle connections close (``bridge.providers.pool``)."""
        self.idle = self.placement.idle
        self.backoff = Backoff()
        self.turn_stall_s = TURN_STALL_S
        self.turn_base_s = TURN_BASE_S
        self.turn_s_per_char = TURN_S_PER_CHAR
        """A turn's deadlines (``_Connection._check_turns``)."""
        self.errors: dict[str, int] = {}
        self.reconnects = 0
        self._closing = False
        self._reconnect_task: asyncio.Task[None] | None = None
        self._turn_serial = 0

    prompt_identity: str | None = None
    """The provider's part of its prompts' cache key: ``provider_identity`` of its
    settings unless set (the daemon sets it: an embedded provider's names its engine)."""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def turns_per_connection(self) -> int | None:
        """Above this many turns on every connection a new turn opens another connection
        (None: only when every one is at the protocol's ``max_turns``)."""
        return self.placement.turns_per_connection

    def unread_bytes(self) -> int:
        """Bytes waiting unread on the pool's connections (an underrun's cause)."""
        return sum(conn.unread_bytes() for conn in self.connections)

    def note_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _key(self, turn: TurnSettings | None) -> PoolKey:
        if self.pooling is None:
            return None
        pool_key, _ = self.pooling
        default = TurnSettings(self.settings.voice, MULAW_8K)
        return tuple(pool_key(self.settings, turn or default))

    def _open(self, key: PoolKey = None) -> _Connection:
        settings = self.settings
        if self.pooling is not None:
            key = key if key is not None else self._key(None)
            settings = self.pooling[1](self.settings, *(key or ()))
        conn = _Connection(self, self.engine_cls(settings), key)
        self.connections.append(conn)
        conn.note_idle(conn.now())
        conn.task = asyncio.get_running_loop().create_task(conn.run())
        return conn

    def arm_idle_close(self, at: float | None = None) -> None:
        """Look for connections idle too long at ``at`` (default: one timeout from now)."""
        after = self.close_idle_after_s
        if after is None or self._closing or self._idle_timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_at(loop.time() + after if at is None else at, self._close_idle)

    def _close_idle(self) -> None:
        """Close the connections idle for ``close_idle_after_s`` or more.

        Kept: the newest idle connection of each kind (the spare the next
        turn takes: ``_keep_spare`` would only open another), one still
        handshaking, and as many as it takes to stay at ``warm`` open
        connections. The engine says goodbye as at shutdown (``close``); a
        turn placed meanwhile cannot land on it (``has_room``).
        """
        self._idle_timer = None
        after = self.close_idle_after_s
        if after is None or self._closing:
            return
        now = asyncio.get_running_loop().time()
        closing, again_at = self.placement.idle_to_close(now, after, self.connections, self.warm)
        for conn in closing:
            conn.retiring = True
            conn.engine.close(now)
            conn.pump()
        if closing:
            self.idle_closed += len(closing)
            open_now = sum(1 for c in self.connections if c.is_open())
            log.info("tts.idle_closed", provider=self.name, connections=len(closing), open=open_now)
        if again_at is not None:
            self.arm_idle_close(again_at)

    async def start(self, timeout_s: float = 10.0) -> bool:
        """Open the warm connection(s); True once one is ready."""
        conns = [self._open() for _ in range(self.warm)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.wait([asyncio.ensure_future(c.ready_event.wait()) for c in conns]),
                timeout_s,
            )
        return any(c.engine.ready for c in self.connections)

    def _connection_ended(self, conn: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self.connections.remove(conn)
        if conn.catch_all is not None:
            return  # a voice agent connection belongs to its call, not to the pool
        live = sum(1 for c in self.connections if not c.closed and c.catch_all is None)
        if not self._closing and live < self.warm and self._reconnect_task is None:
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = self.backoff.next_delay_s()
        log.info("tts.reconnect", provider=self.name, delay_s=round(delay, 3))
        await asyncio.sleep(delay)
        self._reconnect_task = None
        if not self._closing:
            self.reconnects += 1
            self._open()

    def _connection_for_turn(self, turn: TurnSettings) -> _Connection:
        """The connection a new turn's first audio waits least on (``Placement.choose``),
        or a new one."""
        key = self._key(turn)
        return self.placement.choose(key, self.connections) or self._open(key)

    def open_turn(
        self,
        turn_id: str,
        settings: TurnSettings,
        sink: Sink,
        audio_sink: AudioSink | None = None,
        words_sink: WordsSink | None = None,
    ) -> _TurnHandle:
        """Open ``turn_id`` on a connection with room; its events go to ``sink``.

        Calls share connections and every call numbers its own turns
        (``greeting``, ``flow-talk-1``...), so on the wire the turn gets an id
        unique in this pool; events come back to ``sink`` under ``turn_id``.
        Its audio goes to ``audio_sink`` when one is given (as ``(audio,
        format)``, the bulk of a turn without an event object), else to
        ``sink`` as ``AudioReceived`` like every other event; its word
        timings to ``words_sink`` (as the tuple of words) likewise.
        """
        conn = self._connection_for_turn(settings)
        self._turn_serial += 1
        wire_id = f"{turn_id}~{self._turn_serial}"
        conn.bind_turn(wire_id, turn_id, sink, audio_sink, words_sink)
        handle = _TurnHandle(conn, wire_id)
        try:
            handle.open(settings)
        except LocalProtocolError:
            conn.drop_turn(wire_id, conn.now())  # refused: the turn holds no room
            raise
        self._keep_spare(conn.key)
        return handle

    def _keep_spare(self, key: PoolKey) -> None:
        """Open a connection in the background if none of ``key`` has room for another
        turn, so the next turn goes to one already open instead of waiting for a handshake."""
        if not self._closing and self.placement.needs_spare(key, self.connections):
            self._open(key)

    async def open_agent(self, sink: Sink, timeout_s: float = 10.0) -> AgentSession:
        """A dedicated connection for one call's voice-agent session (Kletso)."""
        conn = _Connection(self, self.engine_cls(self.settings))
        conn.catch_all = sink
        self.connections.append(conn)
        conn.task = asyncio.get_running_loop().create_task(conn.run())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(conn.ready_event.wait(), timeout_s)
        return AgentSession(conn)

    async def close(self) -> None:
        self._closing = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for conn in list(self.connections):
            if conn.ws is not None:
                with contextlib.suppress(Exception):
                    conn.engine.close(conn.now())
                    conn.pump()
                    await conn.ws.close()
            if conn.task is not None:
                conn.task.cancel()
        await asyncio.gather(
            *(c.task for c in self.connections if c.task is not None), return_exceptions=True
        )


class _TurnHandle:
    """``bridge.providers.connection.TurnCommands`` on the loop's clock, waiting for its
    connection (a handshake, a one-turn protocol's previous turn) when it must."""

    def __init__(self, conn: _Connection, wire_id: str) -> None:
        self.conn = conn
        self.commands = TurnCommands(conn, wire_id)
        self._flushing: asyncio.Task[None] | None = None

    @property
    def turn_id(self) -> str:
        return self.commands.turn_id

    def _wait_if(self, must_wait: bool) -> None:
        if must_wait:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_when_ready())

    async def _flush_when_ready(self) -> None:
        conn = self.conn
        await conn.ready_event.wait()
        while not conn.engine.ready and not conn.closed:
            conn.changed.clear()
            await conn.changed.wait()  # e.g. a one-turn protocol finishing its last turn
        self.commands.ready_or_failed(conn.now())

    def open(self, settings: TurnSettings) -> None:
        self._wait_if(self.commands.open(settings, self.conn.now()))

    def send_text(self, text: str) -> None:
        self._wait_if(self.commands.send_text(text, self.conn.now()))

    def end(self) -> None:
        self._wait_if(self.commands.end(self.conn.now()))

    def cancel(self) -> None:
        self._wait_if(self.commands.cancel(self.conn.now()))

    def watch_dry(self, on_provider: Callable[[], None]) -> bool:
        return self.conn.watch_dry(self.commands.turn_id, on_provider)


class AgentSession:
    """One call's voice-agent session (``bridge.providers.agent.VoiceAgent``) on the
    loop's clock, over its own connection.

    Every event of the connection goes to the sink given to ``open_agent``:
    ``AudioReceived`` for the agent's replies, the protocol's voice events
    (``VoiceStarted``, ``VoiceInterrupted``, ``VoiceEnded``...), and
    ``ProviderFailed`` if the connection drops.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.agent = VoiceAgent(conn)

    @property
    def ready(self) -> bool:
        return self.agent.ready

    def start(self, mode: str = "vad", client_id: str = "callbridge") -> None:
        self.agent.start(mode, client_id, self.conn.now())

    def send_audio(self, pcm_s16le_24k: bytes) -> None:
        self.agent.send_audio(pcm_s16le_24k, self.conn.now())

    def commit(self) -> None:
        self.agent.commit(self.conn.now())

    def stop(self, reason: str = "user") -> None:
        self.agent.stop(reason, self.conn.now())

    def played(self, item_id: str, ms: int) -> None:
        self.agent.played(item_id, ms, self.conn.now())

    def set_played_position(self, item_id: str, ms: int) -> None:
        self.agent.set_played_position(item_id, ms)

    def say(self, turn_id: str, text: str, settings: TurnSettings, sink: Sink) -> None:
        self.agent.say(turn_id, text, settings, sink, self.conn.now())

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Sink) -> None:
        self.agent.open_turn(turn_id, settings, sink, self.conn.now())

    def send_text(self, turn_id: str, text: str) -> None:
        self.agent.send_text(turn_id, text, self.conn.now())

    def end_turn(self, turn_id: str) -> None:
        self.agent.end_turn(turn_id, self.conn.now())

    def cancel(self, turn_id: str) -> None:
        self.agent.cancel(turn_id, self.conn.now())

    async def close(self) -> None:
        conn = self.conn
        if conn.ws is not None and not conn.closed:
            self.agent.goodbye(conn.now())
            with contextlib.suppress(Exception):
                await conn.ws.close()
        if conn.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(conn.task, 2)


class Speaker(failover.Speaker):
    """``bridge.providers.failover.Speaker`` on the running loop's clock and timers
    unless ``clock`` and ``call_at`` are given."""

    def __init__(
        self,
        pools: Sequence[failover.Pool],
        cache: PromptCache | None = None,
        fallback_prompt: str = "",
        fallback_voice: str = "",
        first_audio_timeouts: Sequence[float] = (),
        clock: Callable[[], float] | None = None,
        call_at: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        super().__init__(
            pools,
            cache,
            fallback_prompt,
            fallback_voice,
            first_audio_timeouts,
            clock=clock or _loop_time,
            call_at=call_at or _loop_call_at,
        )


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _loop_call_at(when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
    return asyncio.get_running_loop().call_at(when, callback)

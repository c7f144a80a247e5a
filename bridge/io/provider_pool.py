"""Provider pools: every connection to one provider, on the loop's clock and timers.

``ProviderPool`` (one per configured provider) owns the WebSocket connections
to that provider (``bridge.io.provider_ws.Connection``): a warm connection
before the first call, turns multiplexed where the protocol allows
(``max_turns``), more connections where it does not, reconnects after
``Backoff``, idle connections closed. Its decisions are pure and live in
``bridge.providers``: turn placement, reconnect backoff and idle closing
(``pool``), the failover speaker with the prompt cache (``failover``,
``prompts``). A turn comes back as a ``bridge.io.provider_turns.TurnHandle``, a
call's voice-agent session as an ``AgentSession``. ``Speaker`` is
``bridge.providers.failover.Speaker`` on the loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from bridge.engine import LocalProtocolError
from bridge.io.provider_turns import AgentSession, TurnHandle
from bridge.io.provider_ws import Connection
from bridge.logs import get_logger
from bridge.providers import failover, registry
from bridge.providers.base import MULAW_8K, ProviderSettings, TtsProtocol, TurnSettings
from bridge.providers.connection import PoolKey
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
from bridge.providers.prompts import PromptCache, TurnFellBack
from bridge.providers.turn_deadlines import TURN_BASE_S, TURN_S_PER_CHAR, TURN_STALL_S

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
        """Flow control (``Connection``): off while ``flow_high_s`` is None (the default)."""
        self.close_idle_after_s = close_idle_after_s
        """Close a connection idle this long (``CLOSE_IDLE_AFTER_S``; None: never)."""
        self.idle_closed = 0
        """Connections closed for being idle, ever."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self.engine_cls = engine_class(settings.protocol)
        self.pooling = _pooling(settings.protocol)
        self.warm = warm
        self.connections: list[Connection] = []
        self.placement: Placement[Connection] = Placement(
            turns_per_connection, self.engine_cls.max_turns
        )
        """Where turns go and which idle connections close (``bridge.providers.pool``)."""
        self.idle = self.placement.idle
        self.backoff = Backoff()
        self.turn_stall_s = TURN_STALL_S
        self.turn_base_s = TURN_BASE_S
        self.turn_s_per_char = TURN_S_PER_CHAR
        """A turn's deadlines (``Connection._check_turns``)."""
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

    def _open(self, key: PoolKey = None) -> Connection:
        settings = self.settings
        if self.pooling is not None:
            key = key if key is not None else self._key(None)
            settings = self.pooling[1](self.settings, *(key or ()))
        conn = Connection(self, self.engine_cls(settings), key)
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

    def connection_ended(self, conn: Connection) -> None:
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

    def _connection_for_turn(self, turn: TurnSettings) -> Connection:
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
    ) -> TurnHandle:
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
        handle = TurnHandle(conn, wire_id)
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
        conn = Connection(self, self.engine_cls(self.settings))
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

"""A turn's handle and a call's voice-agent session, on the loop's clock.

``TurnHandle`` is ``bridge.providers.connection.TurnCommands`` for one turn the
pool placed on a connection (``ProviderPool.open_turn``); ``AgentSession`` is
``bridge.providers.agent.VoiceAgent`` over a connection of its own
(``ProviderPool.open_agent``). Both pass ``loop.time()`` to the pure parts and
wait for their connection (``bridge.io.provider_ws.Connection``) when they must.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from bridge.io.provider_ws import Connection
from bridge.providers.agent import VoiceAgent
from bridge.providers.base import TurnSettings
from bridge.providers.connection import TurnCommands
from bridge.providers.failover import Sink

__all__ = ["AgentSession", "TurnHandle"]


class TurnHandle:
    """``bridge.providers.connection.TurnCommands`` on the loop's clock, waiting for its
    connection (a handshake, a one-turn protocol's previous turn) when it must."""

    def __init__(self, conn: Connection, wire_id: str) -> None:
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

    def __init__(self, conn: Connection) -> None:
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

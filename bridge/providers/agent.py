"""One call's voice-agent session (Kletso), the pure part.

A voice agent gets a connection of its own (``ProviderConnection`` with a
``catch_all`` sink): every event of it goes to the call's sink (the agent's
replies as ``AudioReceived``, the protocol's voice events, ``ProviderFailed``
if the connection drops) unless a text turn the call opened takes it. The
session starts and stops the agent's voice session, streams the caller's
audio, reports what was played, and carries the call's text turns while the
agent is on (the agent answers each aloud; one at a time: a turn it cannot
take fails to its sink instead of raising). Every method takes ``now``; the
shell (``bridge.io.provider_turns.AgentSession``) passes the loop's time and
owns the socket.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bridge.engine import LocalProtocolError
from bridge.providers.base import TurnFailed, TurnSettings
from bridge.providers.connection import ProviderConnection
from bridge.providers.failover import Sink

__all__ = ["VoiceAgent"]


class VoiceAgent:
    """One call's voice-agent session on its own connection."""

    def __init__(self, conn: ProviderConnection) -> None:
        self.conn = conn
        self.started = False
        self.failed_turns: set[str] = set()
        """Text turns the agent refused: their later commands are dropped."""

    @property
    def ready(self) -> bool:
        return self.conn.engine.ready and not self.conn.closed

    def _do(self, method: str, now: float, *args: Any) -> None:
        if self.conn.closed:
            return
        getattr(self.conn.engine, method)(*args, now)
        self.conn.pump(now)

    def start(self, mode: str, client_id: str, now: float) -> None:
        self._do("start_voice", now, mode, client_id)
        self.started = True

    def send_audio(self, pcm_s16le_24k: bytes, now: float) -> None:
        self._do("send_audio", now, pcm_s16le_24k)

    def commit(self, now: float) -> None:
        self._do("commit", now)

    def stop(self, reason: str, now: float) -> None:
        """End the voice session; the agent answers with its end-of-session event."""
        if self.started:
            self.started = False
            self._do("stop_voice", now, reason)

    def played(self, item_id: str, ms: int, now: float) -> None:
        self._do("played", now, item_id, ms)

    def set_played_position(self, item_id: str, ms: int) -> None:
        self.conn.engine.set_played_position(item_id, ms)  # type: ignore[attr-defined]

    def say(self, turn_id: str, text: str, settings: TurnSettings, sink: Sink, now: float) -> None:
        """Typed text the agent answers aloud (``voice.text``)."""
        self.open_turn(turn_id, settings, sink, now)
        self.send_text(turn_id, text, now)
        self.end_turn(turn_id, now)

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Sink, now: float) -> None:
        self.conn.sinks[turn_id] = sink
        self._turn_do(turn_id, "open_turn", now, settings)

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        self._turn_do(turn_id, "send_text", now, text)

    def end_turn(self, turn_id: str, now: float) -> None:
        self._turn_do(turn_id, "end_turn", now)

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in or cancel: the engine reports the played position (Kletso
        ``voice.played``) and drops the rest; an unknown turn is a no-op."""
        self._turn_do(turn_id, "cancel", now)

    def _turn_do(self, turn_id: str, method: str, now: float, *args: Any) -> None:
        if turn_id in self.failed_turns:
            return
        try:
            self._do(method, now, turn_id, *args)
        except LocalProtocolError as e:
            if method == "cancel":
                return
            self.failed_turns.add(turn_id)
            sink = self.conn.sinks.pop(turn_id, None) or self.conn.catch_all
            if sink is not None:
                sink(TurnFailed(turn_id, "agent_busy", str(e), True))

    def goodbye(self, now: float) -> None:
        """Before the socket closes: stop the voice session if it is on (an agent that
        already ended it refuses, which is fine)."""
        if self.started:
            with contextlib.suppress(LocalProtocolError):
                self._do("stop_voice", now, "user")

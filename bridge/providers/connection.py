"""One provider connection's routing, the pure part: which turn an event is for.

Calls share a pool's connections and every call numbers its own turns, so a
turn travels under a wire id unique in its pool (``greeting~7``) and its
events go back to the turn's owner under the owner's id (``retag``). A
``ProviderConnection`` holds one connection's engine and, per wire id, the
turn's sinks: its event sink, and the audio and words sinks that take the
bulk of a turn without an event object. ``dispatch`` routes each event the
engine drains: to its turn (noting its progress for the turn deadlines and
flow control), to the pool's counters (errors, backoff), or to a dedicated
voice-agent connection's catch-all sink. ``TurnCommands`` holds a turn's
commands until the turn is open on its connection.

Everything takes ``now``; nothing here reads a clock or touches a socket. The
shell (``bridge.io.provider_ws``) subclasses ``ProviderConnection`` and
overrides its hooks: ``pump`` (send the engine's actions, then
``route_events``), ``resume`` (read the socket again), ``on_ready`` and
``arm_watch_timer``. Tests drive it with a real engine and numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from bridge.engine import Event, LocalProtocolError
from bridge.media.underrun import DryWatch, DryWatches
from bridge.providers.base import (
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    TtsProtocol,
    TurnDone,
    TurnFailed,
    TurnSettings,
    WordsTimed,
    WordTiming,
)
from bridge.providers.failover import AudioSink, Sink, WordsSink
from bridge.providers.flow import FlowControl
from bridge.providers.pool import BACKOFF_STABLE_S, Backoff, Placement
from bridge.providers.turn_deadlines import TurnDeadlines, TurnWatch

__all__ = ["Command", "PoolKey", "PoolView", "ProviderConnection", "TurnCommands", "retag"]

PoolKey = tuple[Any, ...] | None
Command = Callable[[TtsProtocol, float], None]
"""One call on a turn's engine, with ``now``."""


class PoolView(Protocol):
    """What a connection reads and tells of its pool."""

    backoff: Backoff
    flow_high_s: float | None
    flow_low_s: float
    turn_stall_s: float
    turn_base_s: float
    turn_s_per_char: float

    @property
    def placement(self) -> Placement[Any]: ...

    def note_error(self, kind: str) -> None: ...

    def arm_idle_close(self, at: float | None = None) -> None: ...


def retag(event: Event, turn_id: str) -> Event:
    """``event`` as seen by the turn's owner (its own turn id, not the wire id)."""
    cls = type(event)
    if cls is AudioReceived:  # the bulk of a turn: built directly, not by ``replace``
        audio: AudioReceived = event  # type: ignore[assignment]
        return AudioReceived(turn_id, audio.audio, audio.audio_format)
    if cls is WordsTimed:
        timed: WordsTimed = event  # type: ignore[assignment]
        return WordsTimed(turn_id, timed.words)
    if isinstance(event, ProviderFailed):
        return replace(event, turn_ids=(turn_id,))
    if isinstance(getattr(event, "turn_id", None), str):
        return replace(event, turn_id=turn_id)  # type: ignore[type-var]
    return event


class ProviderConnection:
    """One connection's engine, its turns' sinks and the routing of its events."""

    def __init__(self, pool: PoolView, engine: TtsProtocol, key: PoolKey = None) -> None:
        self.pool = pool
        self.engine = engine
        self.key = key
        self.catch_all: Sink | None = None
        """A dedicated (voice agent) connection's sink: every event no turn takes."""
        self.sinks: dict[str, Sink] = {}
        """Each turn's event sink, by wire id."""
        self.audio_sinks: dict[str, AudioSink] = {}
        """Where a turn's audio goes when the engine returns it; a turn without one (a
        voice agent's) gets ``AudioReceived`` through its event sink."""
        self.words_sinks: dict[str, WordsSink] = {}
        """Where a turn's word timings go when the engine returns them, likewise."""
        self.closed = False
        self.flow = FlowControl()
        self.clocks = self.flow.clocks
        """Each turn's audio ahead of its playout (only with flow control on)."""
        self.dry = DryWatches()
        """Underruns waiting for their verdict (the shell's ``watch_dry``)."""
        self.listed_idle = False
        """On the pool's ``idle`` list (``Placement.list_idle``)."""
        self.idle_since = 0.0
        """When it last became idle (``note_idle``): what the pool's idle closing reads."""
        self.retiring = False
        """Closed by the pool for being idle: takes no turn."""
        self.deadlines = TurnDeadlines()
        self.watches = self.deadlines.watches
        """Turns in progress and their deadlines (``late_turns``)."""
        self.ready_at: float | None = None
        """When the engine said ready (``BACKOFF_STABLE_S``)."""
        self.engine_failed = False
        """The engine reported ``ProviderFailed``: this connection is done."""

    # ------------------------------------------------------------ the shell's hooks

    def pump(self, now: float) -> None:
        """Carry out the engine's actions (the shell sends them; here they stay in the
        engine for a test to read) and route its events."""
        self.route_events(now)

    def resume(self) -> None:
        """Read again (the shell resumes its transport when flow control had paused it)."""
        self.flow.resumed()

    def on_ready(self) -> None:
        """The engine said ready."""

    def arm_watch_timer(self) -> None:
        """The first turn deadline is watched: the shell calls ``late_turns`` from now on."""

    # ------------------------------------------------------------ state

    @property
    def paused(self) -> bool:
        """Flow control stopped reading (``resume`` reads again)."""
        return self.flow.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.flow.paused = value

    @property
    def dry_watches(self) -> list[DryWatch]:
        """Underruns waiting for their verdict."""
        return self.dry.watches

    def is_ready(self) -> bool:
        return self.engine.ready

    def is_open(self) -> bool:
        return not self.closed and not self.retiring and self.catch_all is None

    def has_room(self) -> bool:
        """Whether one more turn fits: by our sinks (turns handed out, some perhaps not yet
        sent) and by the engine's own count, which still holds a cancelled turn until the
        server releases it (a Kova context is held until its ``context_closed``)."""
        limit = self.engine.max_turns
        return (
            self.catch_all is None
            and not self.closed
            and not self.retiring
            and len(self.sinks) < limit
            and self.engine.open_turns() < limit
        )

    def load(self) -> int:
        """Turns open on it (a cancelled one counts until the server releases it): what a
        new turn's first audio may wait behind on this one FIFO connection."""
        n = len(self.sinks)
        held = self.engine.open_turns()
        return held if held > n else n

    def is_idle(self) -> bool:
        """Open, the pool's to place turns on, and holding no turn (a cancelled turn the
        engine still holds counts until the server lets go: ``route_events``)."""
        return (
            not self.closed
            and not self.retiring
            and self.catch_all is None
            and not self.sinks
            and self.engine.open_turns() == 0
        )

    def note_idle(self, now: float) -> None:
        """Put this connection on the pool's ``idle`` list if it ``is_idle()``, and note
        since when it is."""
        if self.pool.placement.list_idle(self, now):
            self.pool.arm_idle_close()

    def timer_due(self, now: float) -> float | None:
        """The engine's timer fired at ``now``: handled (and pumped) if its deadline has
        come; else the deadline, moved later since the timer was armed (look again then)."""
        deadline = self.engine.next_deadline()
        if deadline is None or self.closed:
            return None
        if now < deadline:
            return deadline
        self.engine.handle_timer(now)
        self.pump(now)
        return None

    def ended(self, code: int | None, reason: str, now: float) -> None:
        """The socket is gone (``code`` None: not by a closing handshake): the engine
        hears of it (its turns fail to their owners); a connection that stayed up
        ``BACKOFF_STABLE_S`` resets the pool's backoff (the next drop is not a storm)."""
        self.closed = True
        if self.ready_at is not None and now - self.ready_at >= BACKOFF_STABLE_S:
            self.pool.backoff.reset()
        with contextlib.suppress(LocalProtocolError):  # an engine that failed itself already
            self.engine.connection_lost(code, reason, now)
        self.pump(now)

    # ------------------------------------------------------------ turns

    def bind_turn(
        self,
        wire_id: str,
        turn_id: str,
        sink: Sink,
        audio_sink: AudioSink | None = None,
        words_sink: WordsSink | None = None,
    ) -> None:
        """Route the events of ``wire_id`` to ``sink`` as ``turn_id``'s (``retag``), its
        audio to ``audio_sink`` as ``(audio, format)`` and its word timings to
        ``words_sink`` as the tuple of words (each else to ``sink`` as an event)."""
        self.sinks[wire_id] = lambda e: sink(retag(e, turn_id))
        if audio_sink is None:

            def audio_sink(audio: bytes, audio_format: AudioFormat) -> None:
                sink(AudioReceived(turn_id, audio, audio_format))

        self.audio_sinks[wire_id] = audio_sink
        if words_sink is None:

            def words_sink(words: tuple[WordTiming, ...]) -> None:
                sink(WordsTimed(turn_id, words))

        self.words_sinks[wire_id] = words_sink
        if self.pool.flow_high_s is not None:
            self.flow.open_turn(wire_id)
            self.resume()  # the new turn needs its first audio

    def drop_turn(self, wire_id: str, now: float) -> Sink | None:
        """Forget a turn's sinks (it ended, failed or was cancelled); its event sink."""
        self.audio_sinks.pop(wire_id, None)
        self.words_sinks.pop(wire_id, None)
        self.watches.pop(wire_id, None)
        sink = self.sinks.pop(wire_id, None)
        if self.flow.drop_turn(wire_id):
            # no turn left to hold back: read what is left of the dropped one (a
            # cancelled turn's audio, the server's release of it) now, not at the timer
            self.resume()
        if not self.sinks:
            self.note_idle(now)
        return sink

    # ------------------------------------------------------------ turn deadlines

    def _watch(self, wire_id: str, now: float) -> TurnWatch | None:
        if wire_id not in self.sinks or self.closed:
            return None
        watch, first = self.deadlines.watch(wire_id, now)
        if first:
            self.arm_watch_timer()
        return watch

    def note_text(self, wire_id: str, chars: int, now: float) -> None:
        """The turn was given ``chars`` characters of text: the provider owes audio."""
        watch = self._watch(wire_id, now)
        if watch is not None:
            watch.text(chars, now)

    def note_end(self, wire_id: str, now: float) -> None:
        """The turn's text is complete: the provider owes the rest and its end."""
        watch = self._watch(wire_id, now)
        if watch is not None:
            watch.end(now)

    def late_turns(self, now: float) -> list[tuple[str, str]]:
        """The turns the provider does not deliver in time: ``(wire_id, why)``."""
        if self.closed:
            return []
        pool = self.pool
        return self.deadlines.late(now, pool.turn_stall_s, pool.turn_base_s, pool.turn_s_per_char)

    def fail_turn(self, wire_id: str, now: float) -> Sink | None:
        """End a turn the provider does not deliver: forgotten, its cancel queued, the
        timeout counted; its event sink (the shell pumps, then tells it)."""
        sink = self.drop_turn(wire_id, now)
        with contextlib.suppress(LocalProtocolError):
            self.engine.cancel(wire_id, now)
        self.pool.note_error("timeout")
        return sink

    # ------------------------------------------------------------ routing

    def route_events(self, now: float) -> None:
        """Every event the engine has, to where it belongs (``dispatch``)."""
        for event in self.engine.events_received():
            self.dispatch(event, now)
        if not self.sinks and not self.listed_idle:
            self.note_idle(now)  # e.g. the server let go of a cancelled turn

    def dispatch(self, event: Event, now: float) -> None:
        """One event of the engine to its turn, the pool, or the catch-all sink."""
        cls = type(event)
        if cls is AudioReceived or cls is WordsTimed:  # the bulk of a turn: to its sink
            self._route_bulk(event, cls is AudioReceived, now)
            return
        if isinstance(event, ConnectionReady):
            self.ready_at = now  # the backoff resets only once it proves stable
            self.on_ready()
            return
        if isinstance(event, ProviderFailed):
            self.engine_failed = True
            self.pool.note_error(event.kind)
            if self.catch_all is not None:
                self.catch_all(event)
            for failed_id in event.turn_ids or tuple(self.sinks):
                failed_sink = self.drop_turn(failed_id, now)
                if failed_sink is not None:
                    failed_sink(replace(event, turn_ids=(failed_id,)))
            return
        turn_id = getattr(event, "turn_id", None)
        sink = self.sinks.get(turn_id) if isinstance(turn_id, str) else None
        if sink is None or turn_id is None:
            if self.catch_all is not None:
                self.catch_all(event)
            return
        if isinstance(event, TurnFailed):
            self.pool.note_error(event.kind)
        if isinstance(event, TurnDone | TurnFailed):
            if isinstance(event, TurnDone) and not event.cancelled:
                self.pool.backoff.reset()  # it carried a turn to its end
            self.drop_turn(turn_id, now)
        else:
            watch = self.watches.get(turn_id) if self.watches else None
            if watch is not None:
                watch.progress(now, None, None)
        sink(event)

    def _route_bulk(self, event: Event, is_audio: bool, now: float) -> None:
        """A turn's audio or word timings: noted for its deadlines, flow control and
        underrun verdicts, then to its audio or words sink (or its event sink)."""
        wire_id: str = event.turn_id  # type: ignore[attr-defined]
        if is_audio:
            got: AudioReceived = event  # type: ignore[assignment]
            if self.dry.watches:
                self.dry.audio(wire_id)
            watch = self.watches.get(wire_id) if self.watches else None
            if watch is not None:
                watch.progress(now, got.audio, got.audio_format)
            if self.clocks:  # flow control on
                clock = self.clocks.get(wire_id)
                if clock is not None:
                    clock.add(len(got.audio), got.audio_format, now)
            audio_sink = self.audio_sinks.get(wire_id)
            if audio_sink is not None:
                audio_sink(got.audio, got.audio_format)
                return
        else:
            watch = self.watches.get(wire_id) if self.watches else None
            if watch is not None:
                watch.progress(now, None, None)
            words_sink = self.words_sinks.get(wire_id)
            if words_sink is not None:
                words_sink(event.words)  # type: ignore[attr-defined]
                return
        sink = self.sinks.get(wire_id)
        if sink is not None:
            sink(event)
        elif self.catch_all is not None:
            self.catch_all(event)


class TurnCommands:
    """Commands for one turn on one connection.

    Until the turn is open on its connection (the connection may still be
    handshaking, or busy with the previous turn of a one-turn protocol),
    commands are held; after that they go straight to the engine. A command
    method returns True when the shell must wait for the connection and then
    call ``ready_or_failed``.
    """

    def __init__(self, conn: ProviderConnection, wire_id: str) -> None:
        self.conn = conn
        self.turn_id = wire_id
        self.live = False
        self.waiting = False
        self._queued: list[Command] = []

    def call(self, fn: Command, now: float) -> bool:
        conn = self.conn
        if self.live:
            if not conn.closed:
                fn(conn.engine, now)
                conn.pump(now)
            return False
        self._queued.append(fn)
        if self.waiting:
            return False
        if conn.engine.ready:
            self._flush(now)
            return False
        self.waiting = True
        return True

    def _flush(self, now: float) -> None:
        self.live = True
        for fn in self._queued:
            fn(self.conn.engine, now)
        self._queued.clear()
        self.conn.pump(now)

    def ready_or_failed(self, now: float) -> None:
        """The connection took its turn (ready) or will not (closed): go or fail."""
        if self.conn.engine.ready:
            self._flush(now)
            return
        sink = self.conn.drop_turn(self.turn_id, now)
        if sink is not None:
            sink(ProviderFailed("connect_failed", "provider unreachable", (self.turn_id,)))

    def open(self, settings: TurnSettings, now: float) -> bool:
        wire_id = self.turn_id
        return self.call(lambda e, t: e.open_turn(wire_id, settings, t), now)

    def send_text(self, text: str, now: float) -> bool:
        wire_id = self.turn_id
        self.conn.note_text(wire_id, len(text), now)
        return self.call(lambda e, t: e.send_text(wire_id, text, t), now)

    def end(self, now: float) -> bool:
        wire_id = self.turn_id
        self.conn.note_end(wire_id, now)
        return self.call(lambda e, t: e.end_turn(wire_id, t), now)

    def cancel(self, now: float) -> bool:
        wire_id = self.turn_id
        self.conn.drop_turn(wire_id, now)
        return self.call(lambda e, t: e.cancel(wire_id, t), now)

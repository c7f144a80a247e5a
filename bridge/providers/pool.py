"""Provider pools, the pure part: where a turn goes, when to reconnect, what to close.

A pool holds connections to one provider (the shell's ``bridge.io.provider_pool``
owns the sockets). What it decides needs no socket and no clock of its own:

* ``Backoff``: capped exponential reconnect delays with full jitter;
* ``Placement.choose``: the connection a new turn's first audio waits least
  on (a connection is one FIFO: a turn's first audio comes after whatever the
  provider queued on it for the turns already open there);
* ``Placement.needs_spare``: whether to open a connection ahead of the next turn;
* ``Placement.idle_to_close``: which idle connections to close at ``now``.

A connection is seen through ``Slot``: its key (zwst pools per voice and
format), whether it is ready, handshaking or paused, its load and since when
it is idle. Tests drive it with plain objects and numbers.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = [
    "BACKOFF_STABLE_S",
    "CLOSE_IDLE_AFTER_S",
    "PAUSED_LOAD",
    "Backoff",
    "Placement",
    "Slot",
]

PAUSED_LOAD = 1 << 20
"""Placement: what a paused connection adds to its count of turns (more than any has)."""
CLOSE_IDLE_AFTER_S = 60.0
"""A pool closes a connection that has held no turn for this long (``ProviderPool(
close_idle_after_s=...)``; provider key ``close_idle_after_s``), keeping the newest idle
one of each kind as the spare and never going below ``warm``. With one turn per
connection a pool opens one per call in progress; this hands them back after a peak."""
BACKOFF_STABLE_S = 30.0
"""A connection that stayed up this long resets the pool's reconnect backoff, as does one
that carried a turn to its end; merely opening does not (a provider that accepts and then
closes, 1008 for a bad key, would otherwise be reconnected to at the base delay forever)."""


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter (``random`` is injectable for tests)."""

    base_s: float = 0.25
    cap_s: float = 30.0
    attempt: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay_s(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Slot(Protocol):
    """What placement reads of one connection."""

    @property
    def key(self) -> Hashable: ...

    @property
    def paused(self) -> bool: ...

    listed_idle: bool
    """On the pool's idle list (``Placement.idle``)."""
    idle_since: float
    """When it last became idle."""

    def is_ready(self) -> bool:
        """The engine is open and takes turns now."""
        ...

    def is_handshaking(self) -> bool:
        """Still connecting (neither ready nor failed yet)."""
        ...

    def is_open(self) -> bool:
        """Not closed, not being retired, not a dedicated (voice agent) connection."""
        ...

    def is_idle(self) -> bool: ...

    def has_room(self) -> bool: ...

    def load(self) -> int: ...


S = TypeVar("S", bound=Slot)


class Placement(Generic[S]):
    """Turn placement and idle closing over a pool's connections (``Slot``)."""

    def __init__(self, turns_per_connection: int | None, max_turns: int) -> None:
        self.turns_per_connection = turns_per_connection
        """Above this many turns on every connection a new turn opens another connection
        (None: only when every one is at the protocol's ``max_turns``)."""
        self.max_turns = max_turns
        self.idle: list[S] = []
        """Connections that held no turn when last seen (oldest first; some may since
        have closed or taken a turn): where a new turn is placed without a scan of every
        connection, which at one turn per connection means every call's."""

    def list_idle(self, conn: S, now: float) -> bool:
        """Note that ``conn`` is idle since ``now`` if it ``is_idle()``; True when it was
        not listed yet (the shell then arms its idle check)."""
        if not conn.is_idle():
            return False
        conn.idle_since = now
        if conn.listed_idle:
            return False
        conn.listed_idle = True
        self.idle.append(conn)
        return True

    def idle_connection(self, key: Hashable) -> S | None:
        """A connection of ``key`` holding no turn, ready and reading if one is listed, else
        one still handshaking; None if the list has none (the caller then scans).

        The list is pruned as it is read: a connection that closed or holds a turn
        leaves it (``list_idle`` lists it again once it holds none).
        """
        idle = self.idle
        handshaking: S | None = None
        i = 0
        while i < len(idle):
            conn = idle[i]
            if not conn.is_idle():
                conn.listed_idle = False
                del idle[i]
                continue
            if conn.key == key:
                if conn.is_ready() and not conn.paused:
                    return conn
                if handshaking is None and conn.is_handshaking():
                    handshaking = conn
            i += 1
        return handshaking

    def choose(self, key: Hashable, connections: Iterable[S]) -> S | None:
        """The connection a new turn's first audio waits least on; None: open another.

        The ready connection with the fewest turns open (one that flow control
        paused only if every one is paused), else one still handshaking, else
        one busy finishing a cancelled turn (one-turn protocols); None when every
        one is full, or holds ``turns_per_connection`` turns or more.

        A connection with no turn, from the ``idle`` list, is taken without
        looking at the others: none can be better when it is ready, nor when
        it is still handshaking and a connection carries one turn at most.
        Only without one are all connections scanned.
        """
        soft = self.turns_per_connection
        conn = self.idle_connection(key)
        if conn is not None and (conn.is_ready() or soft == 1 or self.max_turns == 1):
            return conn
        best: S | None = None
        best_load = 0
        connecting: S | None = None
        busy: S | None = None
        for conn in connections:
            if conn.key != key or not conn.has_room():
                continue
            if conn.is_ready():
                # a paused connection (flow control) holds its turns' audio in front of a
                # new turn's: it goes after every reading one
                load = conn.load() + (PAUSED_LOAD if conn.paused else 0)
                if best is None or load < best_load:
                    best, best_load = conn, load
            elif conn.is_handshaking():
                if connecting is None or conn.load() < connecting.load():
                    connecting = conn
            elif busy is None:
                busy = conn
        if soft is not None:
            if best is not None and best_load % PAUSED_LOAD >= soft:
                best = None
            if connecting is not None and connecting.load() >= soft:
                connecting = None
            if best is None and connecting is None:
                return None
        return best or connecting or busy

    def needs_spare(self, key: Hashable, connections: Iterable[S]) -> bool:
        """Whether no connection of ``key`` has room for another turn (under
        ``turns_per_connection`` and the protocol's ``max_turns``): then the shell opens
        one in the background, so the next turn does not wait for a handshake."""
        if self.idle_connection(key) is not None:
            return False
        soft = self.turns_per_connection
        return not any(
            conn.key == key and conn.has_room() and (soft is None or conn.load() < soft)
            for conn in connections
        )

    def idle_to_close(
        self, now: float, after_s: float, connections: Iterable[S], warm: int
    ) -> tuple[list[S], float | None]:
        """The idle connections to close at ``now``, and when to look again (None: no need).

        Kept: the newest idle connection of each kind (the spare the next
        turn takes: ``needs_spare`` would only open another), one still
        handshaking, and as many as it takes to stay at ``warm`` open
        connections. The ones returned have left the idle list.
        """
        listed: list[S] = []
        for conn in self.idle:
            if not conn.is_idle():
                conn.listed_idle = False  # pruned as ``idle_connection`` would
            else:
                listed.append(conn)
        spares: dict[Hashable, S] = {}
        for conn in listed:
            spare = spares.get(conn.key)
            if spare is None or conn.idle_since > spare.idle_since:
                spares[conn.key] = conn
        open_now = sum(1 for c in connections if c.is_open())
        kept: list[S] = []
        closing: list[S] = []
        for conn in listed:
            if (
                conn is spares[conn.key]
                or now - conn.idle_since < after_s
                or not conn.is_ready()
                or open_now <= warm
            ):
                kept.append(conn)
                continue
            conn.listed_idle = False
            open_now -= 1
            closing.append(conn)
        self.idle[:] = kept
        # the next look: when the first of the others is due (one kept past its time,
        # handshaking or for ``warm``, is looked at again one timeout from now)
        due = [
            c.idle_since + after_s if now - c.idle_since < after_s else now + after_s
            for c in kept
            if c is not spares[c.key]
        ]
        return closing, (min(due) if due else None)

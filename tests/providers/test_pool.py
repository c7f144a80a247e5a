"""Pool placement, reconnect backoff and idle closing (``bridge.providers.pool``): plain
objects for connections and numbers for time, no socket and no sleep."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

from bridge.providers.pool import PAUSED_LOAD, Backoff, Placement


@dataclass(eq=False)
class Conn:
    """A connection as placement sees it."""

    name: str
    key: Hashable = None
    ready: bool = True
    handshaking: bool = False
    paused: bool = False
    turns: int = 0
    max_turns: int = 64
    closed: bool = False
    listed_idle: bool = False
    idle_since: float = 0.0

    def is_ready(self) -> bool:
        return self.ready and not self.closed

    def is_handshaking(self) -> bool:
        return self.handshaking

    def is_open(self) -> bool:
        return not self.closed

    def is_idle(self) -> bool:
        return not self.closed and self.turns == 0

    def has_room(self) -> bool:
        return not self.closed and self.turns < self.max_turns

    def load(self) -> int:
        return self.turns


def _names(conns: list[Conn]) -> list[str]:
    return [c.name for c in conns]


# ------------------------------------------------------------------ backoff


def test_backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(base_s=0.25, cap_s=2.0, rng=random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(8)]
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert backoff.attempt == 8
    backoff.reset()
    assert backoff.attempt == 0 and backoff.next_delay_s() <= 0.25


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    a = Backoff(rng=random.Random(1))
    b = Backoff(rng=random.Random(1))
    assert [a.next_delay_s() for _ in range(5)] == [b.next_delay_s() for _ in range(5)]


# ---------------------------------------------------------------- placement


def test_an_idle_ready_connection_is_taken_without_a_scan() -> None:
    placement: Placement[Conn] = Placement(None, 64)
    busy, idle = Conn("busy", turns=1), Conn("idle")
    assert placement.list_idle(busy, now=5.0) is False  # holds a turn: not listed
    assert placement.list_idle(idle, now=5.0) is True
    assert placement.list_idle(idle, now=6.0) is False  # listed once; idle_since moves
    assert idle.idle_since == 6.0
    assert placement.choose(None, [busy]) is idle  # not in the scan: taken from the list


def test_the_list_is_pruned_of_connections_that_took_a_turn_or_closed() -> None:
    placement: Placement[Conn] = Placement(None, 64)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for conn in (a, b, c):
        placement.list_idle(conn, 0.0)
    a.turns, b.closed = 1, True
    assert placement.idle_connection(None) is c
    assert _names(placement.idle) == ["c"] and not a.listed_idle and not b.listed_idle
    assert placement.list_idle(b, 1.0) is False  # closed: not idle, not listed
    a.turns = 0
    assert placement.list_idle(a, 2.0) is True and _names(placement.idle) == ["c", "a"]


def test_a_new_turn_goes_to_the_least_loaded_reading_connection() -> None:
    placement: Placement[Conn] = Placement(None, 64)
    conns = [Conn("a", turns=3), Conn("b", turns=1), Conn("c", turns=2)]
    assert placement.choose(None, conns).name == "b"  # type: ignore[union-attr]
    conns[1].paused = True  # paused: after every reading one, whatever its load
    assert placement.choose(None, conns).name == "c"  # type: ignore[union-attr]
    for conn in conns:
        conn.paused = True
    assert placement.choose(None, conns).name == "b"  # type: ignore[union-attr]


def test_ready_before_handshaking_before_busy_and_none_when_full() -> None:
    placement: Placement[Conn] = Placement(None, 1)
    busy = Conn("busy", ready=False, max_turns=1)  # finishing a cancelled turn
    shaking = Conn("shaking", ready=False, handshaking=True, max_turns=1)
    full = Conn("full", turns=1, max_turns=1)
    assert placement.choose(None, [full, busy, shaking]) is shaking
    assert placement.choose(None, [full, busy]) is busy
    assert placement.choose(None, [full]) is None  # the shell opens another


def test_turns_per_connection_opens_another_above_the_soft_limit() -> None:
    placement: Placement[Conn] = Placement(2, 64)
    a = Conn("a", turns=2)
    assert placement.choose(None, [a]) is None
    a.turns = 1
    assert placement.choose(None, [a]) is a
    a.paused = True  # the paused penalty does not count against the soft limit
    assert placement.choose(None, [a]) is a and PAUSED_LOAD > 64
    shaking = Conn("shaking", ready=False, handshaking=True, turns=2)
    assert placement.choose(None, [shaking]) is None


def test_connections_of_another_key_are_never_chosen() -> None:
    placement: Placement[Conn] = Placement(None, 64)
    a, b = Conn("a", key=("v1", "pcmu")), Conn("b", key=("v2", "pcmu"), turns=5)
    placement.list_idle(a, 0.0)
    assert placement.choose(("v2", "pcmu"), [a, b]) is b
    assert placement.choose(("v3", "pcmu"), [a, b]) is None


def test_a_spare_is_wanted_only_when_no_connection_has_room() -> None:
    placement: Placement[Conn] = Placement(1, 64)
    a = Conn("a", turns=1)
    assert placement.needs_spare(None, [a]) is True
    b = Conn("b")
    assert placement.needs_spare(None, [a, b]) is False  # b has room under the soft limit
    placement.list_idle(b, 0.0)
    assert placement.needs_spare(None, []) is False  # an idle one is listed


# ------------------------------------------------------------- idle closing


def test_idle_connections_are_closed_down_to_the_newest_spare() -> None:
    """What ``test_idle_connections_are_closed_down_to_a_spare`` waited for over sockets."""
    placement: Placement[Conn] = Placement(1, 64)
    conns = [Conn(f"c{i}") for i in range(5)]
    for i, conn in enumerate(conns):
        placement.list_idle(conn, now=10.0 + i)
    closing, again = placement.idle_to_close(30.0, 60.0, conns, warm=1)
    assert closing == [] and again == 70.0  # none idle long enough: look when c0 is due
    closing, again = placement.idle_to_close(73.5, 60.0, conns, warm=1)
    assert _names(closing) == ["c0", "c1", "c2", "c3"] and again is None
    assert _names(placement.idle) == ["c4"]  # the newest idle one stays as the spare
    assert not any(c.listed_idle for c in closing)


def test_a_busy_or_recently_idle_connection_is_not_closed() -> None:
    """What ``test_a_connection_with_a_turn_or_recently_idle_is_not_closed`` slept for."""
    placement: Placement[Conn] = Placement(1, 64)
    long_turn, old, recent, spare = Conn("long"), Conn("old"), Conn("recent"), Conn("spare")
    conns = [long_turn, old, recent, spare]
    placement.list_idle(long_turn, 0.0)
    placement.list_idle(old, 0.0)
    placement.list_idle(recent, 50.0)
    placement.list_idle(spare, 55.0)
    long_turn.turns = 1  # took a turn that outlasts the timeout
    closing, again = placement.idle_to_close(61.0, 60.0, conns, warm=1)
    assert _names(closing) == ["old"]
    assert again == 110.0  # recent's turn; the spare is not waited for
    long_turn.turns = 0
    placement.list_idle(long_turn, 100.0)  # ended: idle from now, the newest
    closing, again = placement.idle_to_close(110.0, 60.0, conns, warm=1)
    assert _names(closing) == ["recent"] and again == 115.0  # spare: idle 55 s of 60
    assert _names(placement.idle) == ["spare", "long"]
    closing, again = placement.idle_to_close(115.0, 60.0, conns, warm=1)
    assert _names(closing) == ["spare"] and again is None
    assert _names(placement.idle) == ["long"]


def test_idle_closing_keeps_warm_and_handshaking_connections() -> None:
    placement: Placement[Conn] = Placement(None, 64)
    a, b, c = Conn("a"), Conn("b", ready=False, handshaking=True), Conn("c")
    for i, conn in enumerate((a, b, c)):
        placement.list_idle(conn, float(i))
    closing, again = placement.idle_to_close(100.0, 60.0, [a, b, c], warm=3)
    assert closing == [] and again == 160.0  # kept for warm: looked at again a timeout on
    closing, again = placement.idle_to_close(100.0, 60.0, [a, b, c], warm=2)
    assert _names(closing) == ["a"] and again == 160.0  # b is handshaking, c the spare
    assert _names(placement.idle) == ["b", "c"]

"""When the cyclic garbage collector may walk the heap: never all of it while calls are up.

A full (generation 2) collection walks every object the collector tracks and
stops the loop while it does: every call's frames wait. With a few hundred
calls up that is tens of milliseconds (measured in the daemon at 300 calls:
15-56 ms of CPU per pass, a pass every ~8 s), far past the 2 ms pacing bar.
Reference counting frees almost everything a call creates the moment it is
dropped (``tests/e2e/test_call_release.py`` checks an ended call is freed
with the collector off); the collector is only there for reference cycles.

So while calls are up the daemon moves everything out of the collector's
sight every tenth of a second (``gc.freeze()``: O(1), it only relinks a
list). Every two seconds was not enough: the containers of turns that had
just started were walked by each young pass until then, 5-15 ms of CPU per
generation-1 pass at 100 calls. Frozen objects are
still freed by reference counting when dropped; what the collector no longer
does is look at them, so a full pass walks only what was created since the
last freeze. A cycle that became garbage after it was frozen is not
reclaimed until the next *thaw*: ``gc.unfreeze()`` followed by a full
collection, which runs when no call is up (cheap: the calls' objects are
gone) or, with calls up, every ``thaw_every_s`` (one long pass; the objects
it found are counted, so a cycle that should not exist shows up in the
metrics).

That long pass is the one pause the daemon still makes on purpose: 20-40 ms
at 100 calls (``bench/diag_excursions.py --daemon-option "gc_thaw_s = 40"``:
the only packets over 7 ms in 90 s were at the two thaws). So the interval
adapts to what the thaws find: a thaw (idle or busy) that found fewer than
``SMALL_FIND`` unreachable objects doubles the interval of the next busy
thaw, up to ``MAX_THAW_EVERY_S``; one that found more sets it back to
``thaw_every_s``. A daemon whose calls leave no cycles (the design, and what
the benchmarks' thaws find) soon thaws with calls up about once a day; one
that leaks keeps the safety net at ``thaw_every_s``.

An idle thaw also says *what* it found (``thaw_described``): the
collection keeps its garbage (``gc.DEBUG_SAVEALL``), the types are counted,
and only if there was any does a second pass free it (it is cheap with no
call up). The daemon logs the commonest types with ``gc.thaw``, so a cycle
left by some rare path names itself in the log instead of a count alone.

The policy is pure: ``tick(now, active_calls)`` says what to do; the shell
(``Daemon``) calls it from its status loop and does it.
"""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_THAW_EVERY_S",
    "SMALL_FIND",
    "GcPolicy",
    "GcStep",
    "apply",
    "collect_named",
    "thaw_described",
]

SMALL_FIND = 1000
"""Unreachable objects a thaw may find and still count as "no leak": a stray cycle or
two (an exception kept with its traceback) is not worth a pass over every call's objects;
a leaking call type leaves thousands per call."""

MAX_THAW_EVERY_S = 86400.0
"""The longest the busy-time thaw interval grows to (``GcPolicy.thawed``)."""

DESCRIBED_TYPES = 8
"""How many of the commonest types ``thaw_described`` names."""

GcStep = Literal["freeze", "thaw"]


@dataclass(slots=True)
class GcPolicy:
    """Freeze every ``freeze_every_s`` while calls are up; thaw when idle or every ``thaw_every_s``.

    ``freeze_every_s = 0`` switches the policy off (the collector's own
    thresholds alone, as in a plain CPython process).
    """

    freeze_every_s: float = 0.1
    thaw_every_s: float = 600.0
    _thaw_interval_s: float = 0.0
    """The busy-time interval now (``thawed`` adapts it); 0: ``thaw_every_s``."""
    _last_freeze: float | None = None
    _last_thaw: float | None = None
    _frozen: bool = False
    """Something was frozen since the last thaw."""

    def tick(self, now: float, active_calls: int) -> GcStep | None:
        if self.freeze_every_s <= 0:
            return None
        if self._last_freeze is None or self._last_thaw is None:
            self._last_freeze = self._last_thaw = now
            return None
        interval = self._thaw_interval_s or self.thaw_every_s
        if self._frozen and (active_calls == 0 or now - self._last_thaw >= interval):
            # idle: the calls' objects are gone and the pass is cheap; busy: one long pass
            self._last_thaw = self._last_freeze = now
            self._frozen = False
            return "thaw"
        if active_calls > 0 and now - self._last_freeze >= self.freeze_every_s:
            self._last_freeze = now
            self._frozen = True
            return "freeze"
        return None

    def thawed(self, unreachable: int) -> float:
        """What a thaw's full collection found; returns the next busy-time interval (s).

        Fewer than ``SMALL_FIND`` objects doubles it (up to ``MAX_THAW_EVERY_S``,
        or ``thaw_every_s`` if that is longer); more sets it back to ``thaw_every_s``.
        """
        current = self._thaw_interval_s or self.thaw_every_s
        if unreachable >= SMALL_FIND:
            self._thaw_interval_s = self.thaw_every_s
        else:
            self._thaw_interval_s = min(2 * current, max(MAX_THAW_EVERY_S, self.thaw_every_s))
        return self._thaw_interval_s


def apply(step: GcStep | None) -> int:
    """Do ``step``; returns the objects a thaw's full collection found unreachable."""
    if step == "freeze":
        gc.freeze()
    elif step == "thaw":
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()  # what is left lives as long as the daemon (listeners, pools, caches)
        return found
    return 0


def collect_named() -> list[str]:
    """A full collection that names what it found: the unreachable objects' types
    (``module.qualname``, one entry per object), then frees them.

    The garbage is kept by the first pass (``gc.DEBUG_SAVEALL``) to be named
    and freed by a second, which runs only when there was some; the objects'
    finalizers and weak reference callbacks run in the first pass, as in a
    plain collection.
    """
    gc.set_debug(gc.get_debug() | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        names = [f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage]
    finally:
        gc.set_debug(gc.get_debug() & ~gc.DEBUG_SAVEALL)
        gc.garbage.clear()
    if names:
        gc.collect()  # what was kept is still in its cycles: free it now
    return names


def thaw_described() -> tuple[int, list[tuple[str, int]]]:
    """A thaw that also says what it found: (unreachable objects, the commonest types).

    Types are ``module.qualname`` with their counts, most common first (at most
    ``DESCRIBED_TYPES``); see ``collect_named``.
    """
    gc.unfreeze()
    names = collect_named()
    gc.freeze()
    return len(names), Counter(names).most_common(DESCRIBED_TYPES)

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
gone) or, with calls up, on evidence (below; one long pass). The objects it
found are counted, so a cycle that should not exist shows up in the metrics.

That long pass is the one pause the daemon still makes on purpose: 20-40 ms
at 100 calls (``bench/diag_excursions.py --daemon-option "gc_thaw_s = 40"``:
the only packets over 7 ms in 90 s were at the two thaws). So with calls up
it runs only when there is evidence that the frozen objects hold garbage
(``GcPolicy.tick``'s ``evidence``), at most every ``thaw_every_s``:

* an ended call was not released (``ReleaseWatch``): each call's runner
  holds a ``Canary`` that nothing else holds; ``RELEASE_GRACE_S`` after the
  call ended it must be gone (reference counting frees a call the moment it
  ends, ``tests/e2e/test_call_release.py``). Alive, the call is in a
  reference cycle (a thaw frees it) or held by something live (a thaw cannot;
  the daemon names the call in its log either way);
* the collector's own passes over the young objects (``YoungFinds``) found
  ``SMALL_FIND`` or more unreachable objects since the last thaw: the daemon
  makes cycles, and those that became garbage after a freeze are in the frozen
  generation;
* the last thaw found ``SMALL_FIND`` or more.

With none of these the busy thaw waits ``BLIND_THAW_S`` (a day), for
cycles that only ever die old and belong to no call. Whenever no call is up
the thaw runs at once, whatever the evidence: it is cheap then.

An idle thaw also says *what* it found (``thaw_described``): the
collection keeps its garbage (``gc.DEBUG_SAVEALL``), the types are counted,
and only if there was any does a second pass free it (it is cheap with no
call up). The daemon logs the commonest types with ``gc.thaw``, so a cycle
left by some rare path names itself in the log instead of a count alone.

The policy is pure: ``tick(now, active_calls, evidence)`` says what to do;
the shell (``Daemon``) gathers the evidence (``ReleaseWatch``,
``YoungFinds``), calls it every ``GC_TICK_S`` and does it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import weakref
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BLIND_THAW_S",
    "RELEASE_GRACE_S",
    "SMALL_FIND",
    "Canary",
    "GcPolicy",
    "GcStep",
    "ReleaseWatch",
    "YoungFinds",
    "apply",
    "collect_named",
    "release_free_heap",
    "thaw_described",
]

SMALL_FIND = 1000
"""Unreachable objects a thaw (or the young passes between two thaws) may find and still
count as "no leak": a stray cycle or two (an exception kept with its traceback) is not
worth a pass over every call's objects; a leaking call type leaves thousands per call."""

BLIND_THAW_S = 86400.0
"""With calls up and no evidence of garbage, the interval between busy thaws."""

RELEASE_GRACE_S = 30.0
"""How long after its end a call may still be held before ``ReleaseWatch`` counts it as not
released: longer than every close path that holds the runner (the application's WebSocket
closes 1 s after the end and waits up to 10 s for the peer's close frame; an agent
provider's session closes within its ``close_timeout_s``, 5 s by default)."""

DESCRIBED_TYPES = 8
"""How many of the commonest types ``thaw_described`` names."""

GcStep = Literal["freeze", "thaw"]


@dataclass(slots=True)
class GcPolicy:
    """Freeze every ``freeze_every_s`` while calls are up; thaw when idle, or busy on evidence.

    ``freeze_every_s = 0`` switches the policy off (the collector's own
    thresholds alone, as in a plain CPython process).
    """

    freeze_every_s: float = 0.1
    thaw_every_s: float = 600.0
    """With calls up and evidence of garbage, the interval between thaws."""
    _leaky: bool = False
    """The last thaw found ``SMALL_FIND`` or more (``thawed``)."""
    _last_freeze: float | None = None
    _last_thaw: float | None = None
    _frozen: bool = False
    """Something was frozen since the last thaw."""

    def evidence(self, unreleased_calls: int, young_found: int) -> bool:
        """Whether the frozen objects are likely to hold garbage: an ended call not freed
        (``ReleaseWatch``), or ``SMALL_FIND`` or more found by the young passes since the
        last thaw (``YoungFinds``). The last thaw's own find counts too (``thawed``)."""
        return unreleased_calls > 0 or young_found >= SMALL_FIND

    def busy_interval(self, evidence: bool) -> float:
        """How long after the last thaw a thaw with calls up is due."""
        if evidence or self._leaky:
            return self.thaw_every_s
        return max(BLIND_THAW_S, self.thaw_every_s)

    def tick(self, now: float, active_calls: int, evidence: bool = False) -> GcStep | None:
        """The step for now. ``evidence``: something says the frozen objects hold garbage
        (a call not released, the young passes finding cycles; see the module's doc)."""
        if self.freeze_every_s <= 0:
            return None
        if self._last_freeze is None or self._last_thaw is None:
            self._last_freeze = self._last_thaw = now
            return None
        if self._frozen and (
            active_calls == 0 or now - self._last_thaw >= self.busy_interval(evidence)
        ):
            # idle: the calls' objects are gone and the pass is cheap; busy: one long pass
            self._last_thaw = self._last_freeze = now
            self._frozen = False
            return "thaw"
        if active_calls > 0 and now - self._last_freeze >= self.freeze_every_s:
            self._last_freeze = now
            self._frozen = True
            return "freeze"
        return None

    def thawed(self, unreachable: int) -> None:
        """What a thaw's full collection found: ``SMALL_FIND`` or more keeps busy thaws
        at ``thaw_every_s`` until a thaw finds less."""
        self._leaky = unreachable >= SMALL_FIND


class Canary:
    """A call's stand-in for ``ReleaseWatch``: the call's runner holds it and nothing else
    does, so it lives exactly as long as the runner (which takes no weak reference itself
    when compiled with mypyc)."""

    __slots__ = ("__weakref__",)


@dataclass(slots=True)
class ReleaseWatch:
    """Which ended calls were not freed: their ``Canary`` is alive ``grace_s`` after the end.

    ``ended`` when a call ends, ``check(now)`` from the GC tick; a call found
    alive is a suspect until the next thaw, and ``after_thaw`` says which
    suspects the thaw freed (they were in reference cycles) and which are still
    held (by something live: a leak no collection can reclaim).
    """

    grace_s: float = RELEASE_GRACE_S
    _ending: deque[tuple[float, str, weakref.ref[Canary]]] = field(default_factory=deque)
    _suspects: dict[str, weakref.ref[Canary]] = field(default_factory=dict)

    def ended(self, call_id: str, canary: Canary, now: float) -> None:
        self._ending.append((now + self.grace_s, call_id, weakref.ref(canary)))

    def check(self, now: float) -> list[str]:
        """The calls newly found not released (ended ``grace_s`` ago or more, still alive)."""
        found: list[str] = []
        while self._ending and self._ending[0][0] <= now:
            _, call_id, ref = self._ending.popleft()
            if ref() is not None:
                self._suspects[call_id] = ref
                found.append(call_id)
        return found

    @property
    def suspects(self) -> int:
        """Calls found not released since the last thaw."""
        return len(self._suspects)

    def after_thaw(self) -> tuple[list[str], list[str]]:
        """(suspects the thaw freed, suspects still alive); forgets them all."""
        freed = [c for c, ref in self._suspects.items() if ref() is None]
        held = [c for c, ref in self._suspects.items() if ref() is not None]
        self._suspects.clear()
        return freed, held


class YoungFinds:
    """What the collector's own passes (over the objects not yet frozen) found unreachable.

    Read from ``gc.get_stats()``, where CPython counts every pass's finds per
    generation anyway: nothing runs on the collector's path (a ``gc.callbacks``
    hook would be a Python call per pass, hundreds a second at a few hundred
    calls). ``found`` is the count since the last ``take``; the daemon takes it
    at each thaw (the young passes' finds since the last one, then the
    thaw's own, discarded).
    """

    def __init__(self) -> None:
        self._base = _collected()

    @property
    def found(self) -> int:
        return _collected() - self._base

    def take(self) -> int:
        now = _collected()
        found, self._base = now - self._base, now
        return found


def _collected() -> int:
    return sum(gen["collected"] for gen in gc.get_stats())


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


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` (another C library: nothing to call)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_free_heap() -> int:
    """Give the C heap's free pages back to the system; the bytes of RSS that went (-1:
    not glibc). Run when no call is up (the idle thaw).

    A call's larger buffers (provider chunks, resampler and VAD state, SRTP contexts)
    come from ``malloc``, not from Python's small-object arenas; freed, glibc keeps
    them for reuse and returns only the free space at the top of its heap. Calls that
    start and end at different times leave that space fragmented, so without this the
    daemon's RSS grew by about 11 KB per call over a 10 000-call soak with every
    Python object freed (``tracemalloc`` flat) and fell back to within 2.4 MiB of
    its baseline when ``malloc_trim(0)`` ran at idle (``bench/bench_soak.py``).
    """
    if _TRIM is None:
        return -1
    before = _rss_bytes()
    _TRIM(0)
    return max(0, before - _rss_bytes())

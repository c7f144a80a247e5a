"""The media clock: when each outbound 20 ms frame is due, and its RTP timestamp.

Theory of operation
-------------------
Pacing is arithmetic, not sleeping. A stream's frame ``n`` is due at the
absolute time ``origin_s + n * ptime_s`` on the loop's monotonic clock, and
its RTP timestamp is ``(ts0 + n * samples_per_frame) mod 2**32``. Both are
computed from the frame index, never from elapsed time, so neither drifts: the
millionth frame is due exactly 20 000 s after the first.

``MediaClock`` (one per outbound stream) remembers the index of the next frame
to send. ``tick(now)`` answers "which frame goes out now?":

* ``now`` earlier than the next deadline minus ``early_tolerance_s``:
  ``None``, nothing is due yet.
* On time, or late by less than one period: the next frame, once.
* Late by ``1 .. max_late_frames`` whole periods: still the next frame, once
  per call. The deadline of the following frame is already past, so the
  shell's loop ``while (n := clock.tick(now)) is not None`` sends the backlog
  immediately: a bounded catch-up of at most ``max_late_frames + 1`` frames
  (counted in ``caught_up_frames``). A receive jitter buffer absorbs that and
  no audio is lost, where skipping would lose it. The default is
  ``max_late_frames=0``: the clock never bursts, and skips on any
  whole-period lateness instead (the design rule: "never bursts").
* Late by more than ``max_late_frames`` periods (a stall): skip ahead to the
  newest due frame and send only that one. The skipped indices are never sent
  but their timestamps are consumed, so the stream stays continuous in time
  (the receiver sees a gap the size of the stall, not a time warp). The wake
  is counted in ``late_wakeups`` and the frames in ``skipped_frames``.

Timer resolution. uvloop timers have 1 ms resolution and asyncio fires a
timer up to ``clock_resolution`` early, so the shell wakes up to about 1 ms on
either side of what it asked for. A frame counts as due once
``now >= deadline - early_tolerance_s``, and ``next_deadline()`` returns that
earlier instant (the *wake-up* time): a shell that arms its timer there and is
rounded up by up to 1 ms still lands close to the true deadline instead of a
whole millisecond after it.

``Ticker`` is the process-wide scheduler for many streams (pure data; the
shell in ``bridge.io`` owns the single timer). It gives each stream a phase
within the period, spreading streams over ``slots`` evenly spaced offsets
(the least-loaded slot wins), so one wake-up sends a fraction of the calls'
frames instead of all of them at once: at 300 calls a single burst per tick
made the last frames of the burst several milliseconds late (design notes,
"One media clock"). ``next_deadline()`` is the earliest
wake-up time over all streams; ``due(now)`` lists the streams whose next frame
is due, earliest first to the resolution of its 1 ms buckets (``bucket_s``:
streams wait in a bucket per millisecond of wake-up time, so a wake-up costs
O(due streams)). The shell then ticks each listed stream's clock (through its
call); the ticker re-reads that clock's next deadline on its next call, so a
stream that was not ticked stays due.

Talkspurt starts re-phase the stream (``MediaClock.start_talkspurt(now)``,
``Ticker.start_talkspurt(key, now)``). Between turns a stream sends comfort
silence on its grid; when a turn's first 20 ms of audio exist, waiting for
the next grid slot would add 0-20 ms (10 ms on average) to every turn's
latency. Instead the grid moves so that the next frame index is due *now*:
the origin shifts earlier by less than one period, the frame goes out at
once, and every later frame follows on the new grid. The RTP timestamp is
still ``ts0 + n * samples_per_frame``: consecutive packets stay exactly one
frame apart in timestamp (no overlap, no gap), only their departure moves up
by the shift, once, on the packet that carries the marker bit. That is the
case the marker bit exists for: the receiver's jitter buffer re-anchors its
playout point at a talkspurt start (RFC 3550 §5.1, RFC 3551 §4.1). Outside a
talkspurt start the grid never moves.

"Now" is not always the best instant, though: many turns start together (a
read from a provider connection carrying many turns' first audio), and each
re-phase to its own "now" piles those calls into the same 1 ms bucket, where
they stay for the rest of the turn (a bucket that overruns its millisecond
makes the next wake-up late). So ``Ticker.start_talkspurt`` puts the first
frame in the least-loaded of the next ``talkspurt_buckets`` buckets (ties to
the earliest): the bucket of "now" (then the frame is due now, as above), or
a later one, where it is due on the slot phase of that millisecond and the
grid is anchored there; the first frame leaves with that bucket's wake-up, at
most ``(talkspurt_buckets - 1) * bucket_s`` plus the phase (1.5 ms with the
defaults) after it was asked for. ``bench/bench_ticker.py`` measures the
occupancy and the added delay.

Nor are the "now"s of different calls independent: turn starts come at the
same phase of the period call after call (a load generator's calls at 25/s,
one every two periods; a flow's gather timeout, a whole number of periods
after the turn it follows; a cached prompt starting inside its own call's
wake-up), so a choice between two neighbouring buckets only ever moves calls
together, and they stay together: at 60 IVR calls seven of the twenty
buckets were empty and two held 18 and 17 (``bench/diag_ivr_ticks.py``).
So when both of those buckets are over their fair share
(``talkspurt_share`` times the streams per bucket, rounded up, plus one),
the first frame goes in the first bucket after them that is within it, or,
if none comes before the stream's own grid, the lightest one seen or that
grid, whichever is lighter (the frame never waits past its own grid: what
not re-phasing at all would cost). Calls stay spread, and the first frames
of well-spread calls still leave at once.

Rules that keep this module honest:

1. No clock reads: every method that needs the time takes ``now``.
2. Deadlines and timestamps are functions of the frame index only.
3. At most one frame index per ``tick()`` call.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from bridge.engine import LocalProtocolError

__all__ = [
    "PTIME_S",
    "RTP_TIMESTAMP_MODULUS",
    "ClockConfig",
    "ClockStats",
    "MediaClock",
    "Ticker",
    "TickerConfig",
]

PTIME_S = 0.020
RTP_TIMESTAMP_MODULUS = 2**32

# Absorbs float rounding in (now - origin_s) / ptime_s when now sits exactly
# on a deadline; far below any timer resolution.
_EPSILON_S = 1e-9
_floor = math.floor


@dataclass(frozen=True, slots=True)
class ClockConfig:
    """Pacing parameters of one outbound stream."""

    ptime_s: float = PTIME_S
    """Frame period in seconds (packetization time)."""
    samples_per_frame: int = 160
    """RTP timestamp increment per frame (160 = 20 ms at 8 kHz)."""
    max_late_frames: int = 0
    """Whole periods of lateness still caught up frame by frame; beyond it, skip ahead.

    0 (the default): never burst; a wake-up a whole period late skips ahead."""
    early_tolerance_s: float = 0.001
    """A frame is due once ``now >= deadline - early_tolerance_s`` (timer granularity)."""


@dataclass(frozen=True, slots=True)
class ClockStats:
    """Counters of one clock, for metrics and the end-of-call summary."""

    frames_sent: int
    """Frame indices handed out by ``tick()``."""
    late_wakeups: int
    """Wakes more than ``max_late_frames`` periods late (each caused a skip)."""
    skipped_frames: int
    """Frame indices never sent because of late wakeups."""
    caught_up_frames: int
    """Frames sent at least one whole period after their deadline."""
    rephased: int = 0
    """Talkspurt starts that moved the grid (``start_talkspurt``)."""


class MediaClock:
    """Frame deadlines and RTP timestamps of one outbound stream.

    Args:
        origin_s: Loop time at which frame 0 is due.
        ts0: RTP timestamp of frame 0 (random per RFC 3550 §5.1; the RTP
            session picks it).
        config: Pacing parameters.

    Calling contract: after a wake-up call ``tick(now)`` until it returns
    ``None``, sending one frame per returned index; then re-arm the timer at
    ``next_deadline()``.
    """

    __slots__ = (
        "_caught_up_frames",
        "_config",
        "_frames_sent",
        "_late_wakeups",
        "_max_late_frames",
        "_next_frame",
        "_ptime_s",
        "_rephased",
        "_skipped_frames",
        "_tolerance_s",
        "origin_s",
        "ts0",
    )

    def __init__(self, origin_s: float, ts0: int = 0, config: ClockConfig | None = None) -> None:
        self._config = config or ClockConfig()
        if self._config.ptime_s <= 0 or self._config.samples_per_frame <= 0:
            raise LocalProtocolError("ptime_s and samples_per_frame must be positive")
        if self._config.max_late_frames < 0 or self._config.early_tolerance_s < 0:
            raise LocalProtocolError("max_late_frames and early_tolerance_s must be >= 0")
        self.origin_s = origin_s
        self.ts0 = ts0 % RTP_TIMESTAMP_MODULUS
        # the config's floats, read on every tick
        self._ptime_s = self._config.ptime_s
        self._tolerance_s = self._config.early_tolerance_s
        self._max_late_frames = self._config.max_late_frames
        self._next_frame = 0
        self._frames_sent = 0
        self._late_wakeups = 0
        self._skipped_frames = 0
        self._caught_up_frames = 0
        self._rephased = 0

    @property
    def config(self) -> ClockConfig:
        return self._config

    @property
    def next_frame(self) -> int:
        """Index of the next frame ``tick()`` will hand out."""
        return self._next_frame

    def deadline(self, n: int) -> float:
        """Absolute loop time at which frame ``n`` is due."""
        return self.origin_s + n * self._config.ptime_s

    def rtp_timestamp(self, n: int) -> int:
        """RTP timestamp of frame ``n``: ``ts0 + n * samples_per_frame`` mod 2**32."""
        return (self.ts0 + n * self._config.samples_per_frame) % RTP_TIMESTAMP_MODULUS

    def next_deadline(self) -> float:
        """The wake-up time for the next frame: its deadline minus the early tolerance."""
        return self.origin_s + self._next_frame * self._ptime_s - self._tolerance_s

    def latest_due(self, now: float) -> int:
        """Index of the newest frame due at ``now`` (-1 before frame 0 is due)."""
        elapsed_s = now + self._tolerance_s - self.origin_s + _EPSILON_S
        return _floor(elapsed_s / self._ptime_s)

    def tick(self, now: float) -> int | None:
        """Hand out the frame index to send at ``now``, or ``None`` if none is due.

        Never returns more than one index per call and never returns an index
        twice; see the module docstring for the late-wake rules.
        """
        latest = _floor((now + self._tolerance_s - self.origin_s + _EPSILON_S) / self._ptime_s)
        if latest < self._next_frame:
            return None
        lag_frames = latest - self._next_frame
        if lag_frames > self._max_late_frames:
            self._late_wakeups += 1
            self._skipped_frames += lag_frames
            self._next_frame = latest
        elif lag_frames > 0:
            self._caught_up_frames += 1
        n = self._next_frame
        self._next_frame = n + 1
        self._frames_sent += 1
        return n

    def start_talkspurt(self, now: float, at_s: float | None = None) -> float:
        """Move the grid so the next frame is due at ``at_s`` (default: ``now``); return the shift.

        Only moves the grid earlier (a frame already due at ``now`` stays due,
        and an ``at_s`` at or after the grid's own next deadline changes
        nothing), and by less than one period. Timestamps are unchanged:
        frame ``n`` keeps ``ts0 + n * samples_per_frame``.
        """
        wake_s = self.next_deadline()
        if now >= wake_s:
            return 0.0
        if at_s is None or at_s < now:
            at_s = now
        shift_s = self.deadline(self._next_frame) - at_s
        if shift_s <= 0.0:
            return 0.0
        self.origin_s -= shift_s
        self._rephased += 1
        return shift_s

    def stats(self) -> ClockStats:
        """A snapshot of the counters."""
        return ClockStats(
            frames_sent=self._frames_sent,
            late_wakeups=self._late_wakeups,
            skipped_frames=self._skipped_frames,
            caught_up_frames=self._caught_up_frames,
            rephased=self._rephased,
        )


K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class TickerConfig:
    """Parameters of the process-wide ticker."""

    clock: ClockConfig = ClockConfig()
    """Pacing parameters given to every stream's clock."""
    slots: int = 20
    """Number of phases within one period (20 slots of 20 ms = 1 ms apart)."""
    epoch_s: float = 0.0
    """Loop time of the grid: slot ``k`` is due at ``epoch_s + (k / slots + m) * ptime_s``."""
    bucket_s: float = 0.001
    """Width of the wake-up buckets (see ``Ticker``): the shell's timer resolution."""
    talkspurt_buckets: int = 2
    """Buckets a talkspurt's first frame may choose from: the one of "now" and the next ones.

    ``Ticker.start_talkspurt`` puts the first frame in the least-loaded of
    them (ties: the earliest, so an idle ticker sends it at once). 1 is the
    old rule (always at once); each further bucket adds up to ``bucket_s``
    to a turn's first frame. 2: a frame is held at most 1.5 ms (on the slot
    phase of the next millisecond); see ``bench/bench_ticker.py``."""
    talkspurt_share: float = 1.25
    """A bucket that would hold more than ``ceil(talkspurt_share * streams / buckets per
    period) + 1`` streams with the new one is over its fair share: when the lightest of the
    ``talkspurt_buckets`` is, a talkspurt's first frame goes in the first bucket after them
    within its share, before the stream's own grid (module doc). 0: off (the
    ``talkspurt_buckets`` only)."""


class Ticker(Generic[K]):
    """Schedules the frames of many streams on one timer (pure data).

    Calling contract: arm one timer at ``next_deadline()``; when it fires call
    ``due(now)`` and, for each key returned, tick that stream's clock (via its
    call) until it returns ``None``; then ask ``next_deadline()`` again.

    Streams wait in buckets of ``bucket_s`` (1 ms) of wake-up time, a bucket
    per millisecond that has a stream, in a heap of bucket numbers: a
    wake-up walks only the buckets that are due and touches only their
    streams, so it costs O(due streams), not O(log n) heap operations and a
    tuple per stream. ``due`` returns streams bucket by bucket, earliest
    bucket first (within a bucket, in the order they were queued); the exact
    wake-up time of every stream still decides whether it is due.
    """

    __slots__ = (
        "_bucket_heap",
        "_bucket_min",
        "_bucket_s",
        "_buckets",
        "_clocks",
        "_config",
        "_period_buckets",
        "_phase_in_bucket_s",
        "_popped",
        "_slot_load",
        "_slot_of",
        "_where",
    )

    def __init__(self, config: TickerConfig | None = None) -> None:
        self._config = config or TickerConfig()
        if self._config.slots <= 0:
            raise LocalProtocolError("slots must be positive")
        if self._config.bucket_s <= 0:
            raise LocalProtocolError("bucket_s must be positive")
        if self._config.talkspurt_buckets < 1:
            raise LocalProtocolError("talkspurt_buckets must be >= 1")
        if not self._config.talkspurt_share >= 0:
            raise LocalProtocolError("talkspurt_share must be >= 0")
        self._clocks: dict[K, MediaClock] = {}
        self._slot_of: dict[K, int] = {}
        self._slot_load = [0] * self._config.slots
        self._bucket_s = self._config.bucket_s
        # bucket number (floor(wake-up time / bucket_s)) -> its streams; every
        # registered stream is in exactly one bucket (``_where``) or in
        # ``_popped`` (handed out by due(), queued again on the next call)
        self._buckets: dict[int, list[K]] = {}
        self._bucket_min: dict[int, float] = {}
        self._bucket_heap: list[int] = []  # bucket numbers; stale ones are skipped
        self._where: dict[K, int] = {}
        self._popped: list[K] = []
        # talkspurt placement: buckets per period (a stream's bucket recurs every
        # ``_period_buckets``), and where a held first frame sits in its bucket
        # (the slot phases' place in the millisecond)
        self._period_buckets = max(1, round(self._config.clock.ptime_s / self._bucket_s))
        self._phase_in_bucket_s = self._config.epoch_s % self._bucket_s

    def __len__(self) -> int:
        return len(self._clocks)

    @property
    def config(self) -> TickerConfig:
        return self._config

    def add(self, key: K, now: float, ts0: int = 0) -> MediaClock:
        """Register a stream and return its clock; frame 0 is due at its first slot >= ``now``."""
        if key in self._clocks:
            raise LocalProtocolError(f"stream {key!r} already registered")
        slot = self._slot_load.index(min(self._slot_load))
        clock = MediaClock(self._first_origin(slot, now), ts0, self._config.clock)
        self._clocks[key] = clock
        self._slot_of[key] = slot
        self._slot_load[slot] += 1
        self._push(key, clock)
        return clock

    def remove(self, key: K) -> None:
        """Forget a stream. Unknown keys are ignored."""
        if self._clocks.pop(key, None) is not None:
            self._slot_load[self._slot_of.pop(key)] -= 1
            self._unqueue(key)

    def clock(self, key: K) -> MediaClock:
        """The clock of a registered stream."""
        return self._clocks[key]

    def start_talkspurt(self, key: K, now: float) -> float:
        """Re-phase a stream for a talkspurt start; return when its next frame is due.

        The first frame goes in the least-loaded of ``talkspurt_buckets``
        wake-up buckets: the one a frame due ``now`` joins (then it is due at
        ``now``: the grid moves onto this instant, as it always did), or one
        of the next ones (then it is due on the slot phase of that bucket's
        millisecond, and the grid is anchored there). Ties go to the earliest.
        A stream whose own grid comes first in that window keeps its grid
        when its bucket is as light; one whose frame is already due is not
        moved. When the lightest of those buckets is over its fair share
        (``TickerConfig.talkspurt_share``), the first later bucket within it
        is taken, up to the stream's own grid (the lightest seen, or that grid,
        if none is). Load counts a bucket's streams in this period and the
        neighbouring ones (each stream recurs every period).
        """
        clock = self._clocks[key]
        if now >= clock.next_deadline():
            return clock.deadline(clock.next_frame)  # already due: nothing to move
        self._requeue_popped()  # every stream in its bucket, so that loads are whole
        self._unqueue(key)
        clock.start_talkspurt(now, self._talkspurt_at(clock, now))
        self._push(key, clock)
        return clock.deadline(clock.next_frame)

    def _talkspurt_at(self, clock: MediaClock, now: float) -> float:
        """When a re-phased stream's first frame should be due (see ``start_talkspurt``)."""
        width_s = self._bucket_s
        tolerance_s = clock._tolerance_s
        first = _floor((now - tolerance_s) / width_s)  # the bucket of a frame due now
        best_s = now
        best_load = self._bucket_load(first)
        config = self._config
        if best_load == 0 or config.talkspurt_buckets == 1:
            return now
        near = config.talkspurt_buckets
        # a bucket at or over ``fair`` is over its share: look on, to the stream's own grid
        fair = (
            math.ceil(config.talkspurt_share * len(self._clocks) / self._period_buckets) + 1
            if config.talkspurt_share > 0
            else 0
        )
        scan = max(near, self._period_buckets) if fair else near
        own_s = clock.deadline(clock.next_frame)
        for i in range(1, scan):
            if i >= near and best_load < fair:
                break  # the nearest buckets' lightest is within its share
            at_s = (first + i) * width_s + tolerance_s + self._phase_in_bucket_s
            if at_s >= own_s:  # the stream's own grid comes first: keep it, or go earlier
                if self._bucket_load(_floor((own_s - tolerance_s) / width_s)) < best_load:
                    best_s = own_s
                break
            load = self._bucket_load(_floor((at_s - tolerance_s) / width_s))
            if load < best_load:
                best_s, best_load = at_s, load
        return best_s

    def _bucket_load(self, b: int) -> int:
        """Streams whose wake-ups fall in bucket ``b``'s place in the period."""
        buckets = self._buckets
        period = self._period_buckets
        return (
            len(buckets.get(b - period, ()))
            + len(buckets.get(b, ()))
            + len(buckets.get(b + period, ()))
        )

    def phase_s(self, key: K) -> float:
        """Offset of the stream's deadlines within the period, in seconds."""
        return self._slot_of[key] * self._config.clock.ptime_s / self._config.slots

    def next_deadline(self) -> float | None:
        """The earliest wake-up time over all streams, or ``None`` with no streams."""
        self._requeue_popped()
        heap = self._bucket_heap
        while heap:
            earliest = self._bucket_min.get(heap[0])
            if earliest is not None:
                return earliest
            heapq.heappop(heap)
        return None

    def due(self, now: float) -> list[K]:
        """The streams whose next frame is due at ``now``, earliest bucket first."""
        self._requeue_popped()
        limit = now + _EPSILON_S
        clocks = self._clocks
        where = self._where
        keys: list[K] = []
        later: list[K] = []
        for bucket in self._pop_buckets(_floor(limit / self._bucket_s)):
            for key in bucket:
                del where[key]  # out of its bucket: handed out, or queued again below
                clock = clocks[key]  # next_deadline(), inlined (hot loop)
                wake_s = clock.origin_s + clock._next_frame * clock._ptime_s - clock._tolerance_s
                if wake_s <= limit:
                    keys.append(key)
                else:  # the tail of the current bucket, or ticked outside due()
                    later.append(key)
        for key in later:
            self._push(key, clocks[key])
        self._popped = keys
        return keys

    def _pop_buckets(self, last: int) -> list[list[K]]:
        """Take every bucket numbered ``last`` or earlier out of the schedule, earliest first."""
        heap = self._bucket_heap
        buckets = self._buckets
        bucket_min = self._bucket_min
        taken: list[list[K]] = []
        while heap and heap[0] <= last:
            b = heapq.heappop(heap)
            bucket = buckets.pop(b, None)
            if bucket is None:
                continue  # emptied by remove(), or a duplicate heap entry
            del bucket_min[b]
            taken.append(bucket)
        return taken

    def tick_due(self, now: float) -> tuple[list[K], list[int]]:
        """``due(now)`` and each due stream's ``tick(now)`` in one pass: the streams and frames.

        The same streams in the same order, and the same frame indices, as
        ``due(now)`` followed by ``clock(key).tick(now)`` for each key (a key
        whose tick hands out nothing is left out), with the clocks in the
        same state afterwards. The cheaper form for a shell that ticks every
        due stream once per wake-up: the ticked streams go straight back
        into the bucket of their next wake-up, instead of being listed,
        handed out and queued again by the next call.
        """
        self._requeue_popped()
        limit = now + _EPSILON_S
        last = _floor(limit / self._bucket_s)
        clocks = self._clocks
        keys: list[K] = []
        frames: list[int] = []
        later: list[K] = []
        popped: list[K] = []
        for bucket in self._pop_buckets(last):
            for key in bucket:
                clock = clocks[key]
                next_frame = clock._next_frame
                ptime_s = clock._ptime_s
                tolerance_s = clock._tolerance_s
                if clock.origin_s + next_frame * ptime_s - tolerance_s <= limit:
                    # MediaClock.tick(now), inlined (hot loop; same arithmetic)
                    latest = _floor((now + tolerance_s - clock.origin_s + _EPSILON_S) / ptime_s)
                    if latest >= next_frame:
                        lag_frames = latest - next_frame
                        if lag_frames > clock._max_late_frames:
                            clock._late_wakeups += 1
                            clock._skipped_frames += lag_frames
                            next_frame = latest
                        elif lag_frames > 0:
                            clock._caught_up_frames += 1
                        clock._next_frame = next_frame + 1
                        clock._frames_sent += 1
                        keys.append(key)
                        frames.append(next_frame)
                    popped.append(key)
                else:  # the tail of the current bucket, or ticked outside
                    later.append(key)
        # queued again after the walk (a wake-up still due goes to a bucket <= last), in
        # due()'s order: the streams not due first, then the due ones
        later += popped
        self._queue(later)
        return keys, frames

    def _first_origin(self, slot: int, now: float) -> float:
        ptime_s = self._config.clock.ptime_s
        phase_origin_s = self._config.epoch_s + slot * ptime_s / self._config.slots
        periods = max(0, math.ceil((now - phase_origin_s) / ptime_s - _EPSILON_S))
        return phase_origin_s + periods * ptime_s

    def _push(self, key: K, clock: MediaClock) -> None:
        wake_s = clock.next_deadline()
        b = _floor(wake_s / self._bucket_s)
        bucket = self._buckets.get(b)
        if bucket is None:
            self._buckets[b] = [key]
            self._bucket_min[b] = wake_s
            heapq.heappush(self._bucket_heap, b)
        else:
            bucket.append(key)
            if wake_s < self._bucket_min[b]:
                self._bucket_min[b] = wake_s
        self._where[key] = b

    def _unqueue(self, key: K) -> None:
        """Take a stream out of its bucket (rare: removal, talkspurt start)."""
        b = self._where.pop(key, None)
        if b is None:
            return  # handed out by due(): _requeue_popped() skips it if it is gone
        bucket = self._buckets[b]
        bucket.remove(key)
        if bucket:
            self._bucket_min[b] = min(self._clocks[k].next_deadline() for k in bucket)
        else:
            del self._buckets[b]
            del self._bucket_min[b]

    def _requeue_popped(self) -> None:
        popped = self._popped
        if not popped:
            return
        self._popped = []
        clocks = self._clocks
        where = self._where
        # not the ones removed (or removed and added again) since due()
        self._queue([key for key in popped if key in clocks and key not in where])

    def _queue(self, keys: list[K]) -> None:
        """``_push`` for each of ``keys``, in order, inlined: this runs for every stream on
        every tick."""
        clocks = self._clocks
        where = self._where
        buckets = self._buckets
        bucket_min = self._bucket_min
        heap = self._bucket_heap
        width_s = self._bucket_s
        for key in keys:
            clock = clocks[key]
            wake_s = clock.origin_s + clock._next_frame * clock._ptime_s - clock._tolerance_s
            b = _floor(wake_s / width_s)
            bucket = buckets.get(b)
            if bucket is None:
                buckets[b] = [key]
                bucket_min[b] = wake_s
                heapq.heappush(heap, b)
            else:
                bucket.append(key)
                if wake_s < bucket_min[b]:
                    bucket_min[b] = wake_s
            where[key] = b

"""The process-wide media ticker: one timer on the loop drives every call's frames.

The schedule is ``bridge.media.clock.Ticker`` (pure data: per-stream clocks
spread over phases of the 20 ms period, waiting in 1 ms buckets). This shell
owns the single timer handle: it wakes at ``next_deadline()``, asks
``tick_due(now)`` (the due streams, each clock ticked once: ``due(now)``
and ``tick(now)`` in one pass) and calls each due stream's frame callback
with its frame index. A callback that raises ends only its
own stream (its ``on_error`` runs); the others keep their pace.

Time. Deadlines are kept on ``time.monotonic()`` (the clock under both
asyncio's and uvloop's ``loop.time()``), read once per wake-up, not on
``loop.time()``: uvloop's is whole milliseconds, cached at the start of
the loop iteration, so frames timed with it were off by up to 1-2 ms in a
way the receiver sees (the first frame of a talkspurt and the later ones
landed on different sides of the millisecond).

Pacing against a 1 ms timer. uvloop rounds ``call_at`` to the nearest whole
millisecond ``T`` and fires somewhere in ``[T, T + 1)`` ms. Arming at
``deadline - ARM_BEFORE_S`` (0.5 ms before the frame's deadline) puts that
window around the deadline: each frame leaves within 1 ms of it, on either
side, never more than ``early_tolerance_s`` (1 ms) early, without spinning.
Slot phases sit half a millisecond into the millisecond (``epoch_s``), so a
stream on its slot grid leaves within 0.5 ms. A talkspurt start
(``start_talkspurt``) re-phases the stream in the next pass of the loop:
there the pure ticker chooses the lighter of this millisecond's bucket and
the next one (``TickerConfig.talkspurt_buckets``; a later one when both are
over their fair share, ``talkspurt_share``). In this millisecond's,
the first frame goes out in that pass and the grid is anchored on that
instant; in the next one, it is due on that millisecond's slot phase and
goes out with that bucket's timer, like every frame on the slot grid. Either
way the receiver's grid (anchored on that marker packet) and ours coincide.

Every stream whose wake-up falls in the same millisecond is served by one
wake-up and one timer handle.

Phases per wake-up. A frame callback builds its stream's outbound frame and
may queue the datagram on ``outbox`` instead of sending it; it may also
return a second callback, the stream's inbound read (its socket). Once every
due stream has built its frame, the outbox is sent in one tight loop; then
every second callback runs (the reads, back to back), and each may return a
third: the work on what it read (the caller's frame, VAD, barge-in), run
after all the reads. The frames of a wake-up leave before anyone's inbound
work instead of after everyone's before them, and the kernel's send and
receive paths run back to back while they are warm in the cache (in the
daemon at 300 calls a ``recvmsg`` interleaved with the calls' Python work
cost ~6 µs, three times one in a tight loop; a ``sendto`` about twice: measured with
``bench/bench_chain.py``).

Frames first. The third phase is most of a wake-up's work (at 500 calls a
millisecond's 25 calls take ~0.6 ms of it) and none of it is due on the
wire: a caller's frame processed a few milliseconds later changes nothing
the caller hears. So between two of them the ticker looks at the clock, and
once the next wake-up's timer would have fired it runs that wake-up's first
two phases there (frames out, sockets read) and queues its third phase
behind the rest, up to ``MAX_PASSES`` wake-ups before it returns to the
loop. A burst (turns starting together, a collection pass) then delays
inbound work, not departures. A frame callback can queue work of its own
for that phase too (``after_send``: the call's transcoding of its next
frames), so it runs once the wake-up's frames have left. A stream's third
phase still runs before its next frame is built, except where a talkspurt
start moves that frame into the window: a stream's second phase must then
keep whatever the first one read (``bridge.io.legs.sip_call``'s does).
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.engine import LocalProtocolError
from bridge.io.rtpsock import send_all
from bridge.logs import get_logger
from bridge.media.clock import ClockConfig, MediaClock, Ticker, TickerConfig

__all__ = ["ARM_BEFORE_S", "MediaTicker"]

log = get_logger("callbridge.ticker")

LAG_WINDOW_S = 0.5
"""Time constant of ``lag_s``: a passing hiccup does not shed calls, a saturated core does."""

MAX_PASSES = 4
"""Wake-ups one return to the loop may serve (its own and those run between its third phases)."""

ARM_BEFORE_S = 0.0005
"""The timer is armed this long before the earliest frame deadline (see the module docstring)."""

ProcessCallback = Callable[[float], None]
"""A stream's third phase: the inbound work itself (after every stream's socket was read)."""

InboundCallback = Callable[[float], ProcessCallback | None]
"""A stream's second phase, called with ``now`` after the wake-up's outbox was sent.

It should only read (a socket, back to back with the other streams' reads,
while the kernel's receive path is warm) and return the third phase, which
does the work on what was read; or do everything itself and return None.
"""

FrameCallback = Callable[[int, float], InboundCallback | None]
"""Called with (frame index, now) when a stream's frame is due; may return its second phase."""


@dataclass(eq=False, slots=True)
class _Stream:
    key: str
    on_frame: FrameCallback
    on_error: Callable[[BaseException], None]
    clock: MediaClock = field(init=False)
    live: bool = True
    held_s: float = -math.inf
    """When a talkspurt's first frame, held by the pass for a lighter millisecond, is due."""


class MediaTicker:
    """Drives every outbound stream of the process from one timer.

    Args:
        loop: The event loop whose timers wake the ticker.
        clock: The time source of every deadline (``time.monotonic``, the
            clock ``loop.time()`` reads, at full resolution).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop or asyncio.get_event_loop()
        self.now = clock
        # slot phases half a millisecond into the millisecond: see the module docstring
        config = TickerConfig(ClockConfig(), epoch_s=0.0005)
        self.ticker: Ticker[_Stream] = Ticker(config)
        self._arm_offset_s = config.clock.early_tolerance_s - ARM_BEFORE_S
        """From a stream's wake-up time (deadline - tolerance) to when its timer is armed."""
        self.streams: dict[str, _Stream] = {}
        self._handle: asyncio.Handle | None = None
        self._armed_at: float | None = None
        """The wake-up time (``next_deadline()``) the handle is armed for; -inf: the next pass."""
        self._talkspurts: list[_Stream] = []
        self.lag_s = 0.0
        """Smoothed lateness of the ticker's wake-ups (EWMA): how far behind the loop runs."""
        self._last_run = self.now()
        self.outbox: list[tuple[socket.socket, bytes, Any]] = []
        """Datagrams queued by this wake-up's frame callbacks: (socket, data, address)."""
        self.send_errors = 0
        """Datagrams the kernel refused (full buffer, closed socket): dropped, as RTP is."""
        self._inbound: list[tuple[_Stream, InboundCallback]] = []
        self._process: list[tuple[_Stream, ProcessCallback]] = []
        self._running = False
        """In ``_run``: a preemption point reached from a stream's callback does nothing."""
        self.preempted = 0
        """Times a wake-up's third phases made way for the next wake-up's frames."""
        self.real_to_mono = self.now() - time.time()
        """Added to a CLOCK_REALTIME reading (a kernel arrival stamp) to put it on ``now``'s clock.

        Taken again at every wake-up, so a step of the wall clock lasts one millisecond.
        """

    def add(
        self,
        key: str,
        on_frame: FrameCallback,
        on_error: Callable[[BaseException], None],
        ts0: int = 0,
    ) -> MediaClock:
        if key in self.streams:
            raise LocalProtocolError(f"stream {key!r} already registered")
        stream = _Stream(key, on_frame, on_error)
        stream.clock = self.ticker.add(stream, self.now(), ts0)
        self.streams[key] = stream
        self._arm()
        return stream.clock

    def after_send(self, key: str, work: ProcessCallback) -> None:
        """From a frame callback: run ``work(now)`` with this wake-up's third phases,
        once every due frame has left (nothing if the stream is gone)."""
        stream = self.streams.get(key)
        if stream is not None:
            self._process.append((stream, work))

    def overloaded(self, max_lag_s: float) -> bool:
        """Whether frames leave later than ``max_lag_s`` on average: take no new calls."""
        return max_lag_s > 0 and len(self.streams) > 0 and self.lag_s > max_lag_s

    def remove(self, key: str) -> None:
        stream = self.streams.pop(key, None)
        if stream is not None:
            stream.live = False
            self.ticker.remove(stream)

    def start_talkspurt(self, key: str) -> None:
        """A turn's first frame exists: send it on the loop's next pass, not at the next slot.

        The stream is re-phased in that pass: its first frame leaves there,
        or, if this millisecond's bucket holds more calls than the next one,
        with the next millisecond's wake-up (see the module docstring). Until
        a held frame leaves, the call (still idle) asks again with every
        piece of audio; those requests cost one clock read and no pass.
        """
        stream = self.streams.get(key)
        if stream is None or stream.held_s > self.now():
            return  # its first frame is already placed, within the next 1.5 ms
        self._talkspurts.append(stream)
        if self._armed_at != -math.inf:
            if self._handle is not None:
                self._handle.cancel()
            self._armed_at = -math.inf
            self._handle = self.loop.call_soon(self._run)

    def run_if_due(self) -> None:
        """A preemption point: run the wake-up now if its timer would have fired by now.

        A loop callback that works through a backlog without returning to
        the loop (the provider connection's reader, handed a burst of turns'
        audio at once, returns to the loop only when its queue is empty)
        calls this between items. The loop runs every ready callback of an
        iteration before it looks at its timers, so without it the frames due
        meanwhile wait for the whole backlog: at 100 calls whose turns all
        started in the same second the ticker ran 10-30 ms late
        (``bench/bench_pacing.py``). Not due: one clock read, nothing else.
        """
        armed_at = self._armed_at
        if armed_at is None or self._running or self.now() < armed_at + self._arm_offset_s:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._run()

    def _arm(self) -> None:
        deadline = self.ticker.next_deadline()
        if deadline is None:
            return
        if self._handle is not None:
            if self._armed_at is not None and self._armed_at <= deadline:
                return
            self._handle.cancel()
        self._armed_at = deadline
        self._handle = self.loop.call_at(deadline + self._arm_offset_s, self._run)

    def _run(self) -> None:
        now = self.now()
        armed_at = self._armed_at
        if armed_at is not None and armed_at != -math.inf:
            # how late the loop woke us: the lag every call's frames suffer,
            # averaged over about LAG_WINDOW_S whatever the number of wake-ups
            target = armed_at + self._arm_offset_s
            weight = min(1.0, max(0.0, now - self._last_run) / LAG_WINDOW_S)
            self.lag_s += weight * (max(0.0, now - target) - self.lag_s)
        self._last_run = now
        self.real_to_mono = now - time.time()
        self._handle = None
        self._armed_at = None
        self._running = True
        try:
            self._send_and_read(now)
            self._work(now)
        finally:
            self._running = False
        self._arm()

    def _work(self, now: float) -> None:
        """The queued third phases; the next wake-up's frames go first once they are due."""
        process = self._process
        if process:
            # the third phases, frames first: once the next wake-up is due, its
            # frames leave (and its sockets are read) before the rest of this work
            wake = self._next_wake()
            passes = 1
            i = 0
            while i < len(process):
                stream, third = process[i]
                i += 1
                if not stream.live:
                    continue
                try:
                    third(now)
                except Exception as e:  # one call's bug ends that call only
                    self._failed(stream, e)
                if wake is not None:
                    t = self.now()
                    if t >= wake:
                        now = t
                        self.real_to_mono = now - time.time()
                        self.preempted += 1
                        self._send_and_read(now)
                        passes += 1
                        # bounded: a core that cannot keep up must return to the
                        # loop (the timer's lateness is the lag that sheds calls)
                        wake = self._next_wake() if passes < MAX_PASSES else None
            process.clear()

    def _next_wake(self) -> float | None:
        """When the timer of the next wake-up would fire (``None``: no streams)."""
        deadline = self.ticker.next_deadline()
        return None if deadline is None else deadline + self._arm_offset_s

    def _send_and_read(self, now: float) -> None:
        """A wake-up's first two phases: the due frames out, then the sockets read.

        Each stream's third phase (the work on what it read) is queued on
        ``_process`` for the caller to run.
        """
        if self._talkspurts:
            for stream in self._talkspurts:
                if stream.live:
                    due_s = self.ticker.start_talkspurt(stream, now)
                    # held: the call's next audio asks again until the frame leaves; no new pass
                    stream.held_s = due_s if stream.clock.next_deadline() > now else -math.inf
            self._talkspurts = []
        inbound = self._inbound
        # the due streams, their clocks ticked (Ticker.tick_due: due() and tick() in one pass)
        streams, frames = self.ticker.tick_due(now)
        for i, stream in enumerate(streams):
            if not stream.live:
                continue  # removed by an earlier stream's callback in this wake-up
            try:
                second = stream.on_frame(frames[i], now)
            except Exception as e:  # one call's bug ends that call only
                self._failed(stream, e)
                continue
            if second is not None:
                inbound.append((stream, second))
        if self.outbox:
            self.flush()
        if inbound:
            process = self._process
            for stream, second in inbound:
                if not stream.live:
                    continue
                try:
                    third = second(now)
                except Exception as e:  # see above
                    self._failed(stream, e)
                    continue
                if third is not None:
                    process.append((stream, third))
            inbound.clear()

    def flush(self) -> None:
        """Send the queued datagrams, back to back; one that fails is dropped (counted).

        One call for the whole outbox (``bridge.io.rtpsock.send_all``).
        """
        outbox = self.outbox
        self.send_errors += send_all(outbox)
        outbox.clear()

    def _failed(self, stream: _Stream, exc: Exception) -> None:
        log.exception("ticker.stream_failed", stream=stream.key)
        self.remove(stream.key)
        stream.on_error(exc)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = None

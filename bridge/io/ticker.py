"""The process-wide media ticker: one timer on the loop drives every call's frames.

The schedule is ``bridge.media.clock.Ticker`` (pure data: per-stream clocks
spread over phases of the 20 ms period). This shell owns the single
``loop.call_at`` handle: it wakes at ``next_deadline()``, asks ``due(now)``,
ticks each due stream's clock once and calls that stream's frame callback
with the frame index. A callback that raises ends only its own stream (its
``on_error`` runs); the others keep their pace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from bridge.logs import get_logger
from bridge.media.clock import MediaClock, Ticker

__all__ = ["MediaTicker"]

log = get_logger("callbridge.ticker")

LAG_WINDOW_S = 0.5
"""Time constant of ``lag_s``: a passing hiccup does not shed calls, a saturated core does."""

FrameCallback = Callable[[int, float], None]
"""Called with (frame index, now) when a stream's frame is due."""


@dataclass
class _Stream:
    on_frame: FrameCallback
    on_error: Callable[[BaseException], None]
    clock: MediaClock


class MediaTicker:
    """Drives every outbound stream of the process from one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_event_loop()
        self.ticker: Ticker[str] = Ticker()
        self.streams: dict[str, _Stream] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self.lag_s = 0.0
        self._last_run = self.loop.time()
        """Smoothed lateness of the ticker's wake-ups (EWMA): how far behind the loop runs."""

    def add(
        self,
        key: str,
        on_frame: FrameCallback,
        on_error: Callable[[BaseException], None],
        ts0: int = 0,
    ) -> MediaClock:
        clock = self.ticker.add(key, self.loop.time(), ts0)
        self.streams[key] = _Stream(on_frame, on_error, clock)
        self._arm()
        return clock

    def overloaded(self, max_lag_s: float) -> bool:
        """Whether frames leave later than ``max_lag_s`` on average: take no new calls."""
        return max_lag_s > 0 and len(self.streams) > 0 and self.lag_s > max_lag_s

    def remove(self, key: str) -> None:
        self.ticker.remove(key)
        self.streams.pop(key, None)

    def start_talkspurt(self, key: str) -> None:
        """A turn's first frame exists: send it now rather than at the next grid slot."""
        if key in self.streams:
            self.ticker.start_talkspurt(key, self.loop.time())
            self._arm()

    def _arm(self) -> None:
        deadline = self.ticker.next_deadline()
        if deadline is None:
            return
        if self._handle is not None:
            if self._armed_at is not None and self._armed_at <= deadline:
                return
            self._handle.cancel()
        self._armed_at = deadline
        self._handle = self.loop.call_at(deadline, self._run)

    def _run(self) -> None:
        now = self.loop.time()
        if self._armed_at is not None:
            # how late the loop woke us: the lag every call's frames suffer,
            # averaged over about LAG_WINDOW_S whatever the number of wake-ups
            weight = min(1.0, max(0.0, now - self._last_run) / LAG_WINDOW_S)
            self.lag_s += weight * (max(0.0, now - self._armed_at) - self.lag_s)
        self._last_run = now
        self._handle = None
        self._armed_at = None
        for key in self.ticker.due(now):
            stream = self.streams.get(key)
            if stream is None:
                continue
            n = stream.clock.tick(now)
            if n is None:
                continue
            try:
                stream.on_frame(n, now)
            except Exception as e:  # one call's bug ends that call only
                log.exception("ticker.stream_failed", stream=key)
                self.remove(key)
                stream.on_error(e)
        self._arm()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

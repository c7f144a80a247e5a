"""The receive jitter buffer of an RTP session: reorder, conceal, bound latency.

Theory of operation
-------------------
Frames are keyed by *extended* sequence number (RFC 3550 A.1, computed by
the session), so wrap-around at 65535 needs no special case here. The
buffer has two states:

* buffering: nothing is played until ``depth_frames`` entries are held or
  the oldest has waited ``depth_frames`` frame periods (so the tail of a
  short burst is still played);
* playing: each ``pop(now)``, called on every 20 ms media tick, returns the
  entry with the next extended sequence number: an ``RtpFrame``, ``None``
  for a placeholder (a telephone-event packet, whose sequence number must
  not count as loss), or ``FrameLost`` when that entry is missing while
  later ones are held. An empty buffer is an underrun: ``pop`` returns
  ``None`` and the buffer goes back to buffering (a talker who stopped
  sending, silence suppression, hold).

Packets older than the next one to play are dropped as late (this includes
copies of frames already played); copies of a held one as duplicates. When
the held span exceeds ``max_frames`` (a burst after a network stall), the
oldest entries are discarded so that ``depth_frames`` remain: latency stays
bounded instead of growing with every stall.

Arrivals (``keep_arrivals``): every audio frame the buffer accepts is also
kept, in arrival order, until ``take_arrived()``. A consumer that must react
to the caller at once (the barge-in detector) reads those on the tick they
arrive, while playout still comes from ``pop`` a jitter delay later: on a
steady stream with the default depth that is two frame periods (40 ms)
sooner. At most ``max_frames`` are kept (the newest), so a burst after a
stall, or a peer that floods, costs the consumer no more than that per
tick. Off by default, since nobody would take them.

No clock is read: ``now`` is a parameter. Counters are public attributes.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["FrameLost", "JitterBuffer", "RtpFrame"]

_MISSING: Final = object()


class RtpFrame(NamedTuple):
    """One inbound frame, in playout order."""

    payload: bytes
    sequence_number: int
    timestamp: int
    payload_type: int
    marker: bool


_NOT_HELD: Final = RtpFrame(b"", -1, -1, -1, False)
"""``pop``'s sentinel for an entry not in the buffer (held entries are frames or None)."""


class FrameLost(NamedTuple):
    """The frame with this sequence number was due and never arrived (conceal it)."""

    sequence_number: int


class JitterBuffer:
    """Fixed-delay reorder buffer over extended sequence numbers (see module docstring).

    Args:
        depth_frames: Entries (or frame periods) buffered before playing.
        max_frames: Held span beyond which the oldest entries are discarded.
        frame_s: Frame period in seconds.
        keep_arrivals: Keep accepted audio frames for ``take_arrived`` (module docstring).
    """

    __slots__ = (
        "_arrived",
        "_buffer",
        "_depth_frames",
        "_frame_s",
        "_highest",
        "_keep_arrivals",
        "_max_frames",
        "_next",
        "_playing",
        "_prefill_since",
        "dropped_duplicate",
        "dropped_late",
        "dropped_overflow",
        "frames_lost",
        "underruns",
    )

    def __init__(
        self,
        depth_frames: int = 3,
        max_frames: int = 10,
        frame_s: float = 0.020,
        keep_arrivals: bool = False,
    ) -> None:
        if not 1 <= depth_frames <= max_frames:
            raise ValueError(
                f"need 1 <= depth_frames ({depth_frames}) <= max_frames ({max_frames})"
            )
        self._depth_frames = depth_frames
        self._max_frames = max_frames
        self._frame_s = frame_s
        self._buffer: dict[int, RtpFrame | None] = {}
        self._next: int | None = None
        self._highest = 0
        self._playing = False
        self._prefill_since: float | None = None
        self._keep_arrivals = keep_arrivals
        self._arrived: list[RtpFrame] = []
        self.dropped_late = 0
        """Packets older than the next frame to play (late, or a copy of one played)."""
        self.dropped_duplicate = 0
        """Copies of a frame still held."""
        self.dropped_overflow = 0
        """Frames discarded to bring the latency back to ``depth_frames``."""
        self.frames_lost = 0
        """``FrameLost`` returned: due, missing, later frames held."""
        self.underruns = 0
        """Pops that found the buffer empty while playing."""

    def insert(self, ext: int, frame: RtpFrame | None, now: float) -> None:
        """Hold ``frame`` (``None``: a placeholder) under extended sequence number ``ext``."""
        buffer = self._buffer
        if self._next is not None and ext < self._next:
            self.dropped_late += 1
            return
        if ext in buffer:
            self.dropped_duplicate += 1
            return
        buffer[ext] = frame
        if frame is not None and self._keep_arrivals:
            arrived = self._arrived
            arrived.append(frame)
            if len(arrived) > self._max_frames:  # a burst: only the newest are worth hearing
                del arrived[0]
        if ext > self._highest or len(buffer) == 1:
            self._highest = ext
        if not self._playing and self._prefill_since is None:
            self._prefill_since = now

    def pop(self, now: float) -> RtpFrame | FrameLost | None:
        """The entry due on this tick (see the module docstring)."""
        buffer = self._buffer
        if not self._playing and not self._start(now):
            return None
        ext = self._next
        assert ext is not None  # set by _start
        if self._highest - ext >= self._max_frames:
            ext = self._trim(buffer)
        frame = buffer.pop(ext, _NOT_HELD)  # one dict lookup for the common (held) case
        if frame is _NOT_HELD:
            if not buffer:
                self.underruns += 1
                self._playing = False
                return None
            self._next = ext + 1
            self.frames_lost += 1
            return FrameLost(ext & 0xFFFF)
        self._next = ext + 1
        return frame

    def take_arrived(self) -> list[RtpFrame]:
        """The audio frames accepted since the last call, in arrival order (late
        packets, duplicates and placeholders are not among them). Empty unless
        ``keep_arrivals``; the caller must not keep or change the empty list."""
        arrived = self._arrived
        if arrived:
            self._arrived = []
        return arrived

    def flush(self) -> None:
        """Forget everything (new SSRC, sequence resync); the extended numbering may restart."""
        self._buffer.clear()
        self._next = None
        self._playing = False
        self._prefill_since = None

    def _start(self, now: float) -> bool:
        buffer = self._buffer
        since = self._prefill_since
        if not buffer or since is None:
            return False
        waited_s = now - since + 1e-9
        if len(buffer) < self._depth_frames and waited_s < self._depth_frames * self._frame_s:
            return False
        self._playing = True
        self._prefill_since = None
        self._next = min(buffer)
        return True

    def _trim(self, buffer: dict[int, RtpFrame | None]) -> int:
        keep_from = self._highest - self._depth_frames + 1
        start = self._next if self._next is not None else keep_from
        if keep_from - start <= 2 * len(buffer):
            # the usual overflow: a short run of numbers below keep_from, no scan or list
            pop = buffer.pop
            for ext in range(start, keep_from):
                if pop(ext, _MISSING) is not _MISSING:
                    self.dropped_overflow += 1
        else:  # a long jump: scan the (short) buffer instead of the numbers
            for ext in [e for e in buffer if e < keep_from]:
                del buffer[ext]
                self.dropped_overflow += 1
        if keep_from in buffer:
            self._next = keep_from
        else:
            self._next = min(buffer) if buffer else keep_from
        return self._next

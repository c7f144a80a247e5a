"""Is this inbound frame the bot's own voice coming back? (echo, by correlation)

Theory of operation
-------------------
The level guard of the barge-in detector (caller louder than the bot's level
minus the echo return loss) cannot tell a loud echo from a quiet caller: an
echo returned only 10 dB down passes a 15 dB guard, and a caller 25 dB below
the bot is blocked. Echo has a property speech does not: it is a delayed,
attenuated copy of what we sent. ``EchoCorrelator`` keeps the last
``max_delay_ms`` of outbound audio and measures, for an inbound frame, the
best normalised cross-correlation with that history over every delay:

    ncc(d) = <x, r_d> / (|x| |r_d|)

An echo scores close to 1 (G.711 and attenuation do not change the shape);
independent caller speech scores low; double talk scores in between, falling
as the caller's share of the frame grows. A frame whose best ``ncc`` is at or
above ``threshold`` is echo: it must not count as the caller speaking.

Two things keep a caller from being taken for echo by chance (the best of
~2 400 correlations of a 160-sample frame is often high: voiced speech is
dominated by a few low harmonics, so a frame has few degrees of freedom).
Both signals are pre-emphasised (``y[n] = x[n] - preemphasis * x[n-1]``,
the same linear filter on both sides, so an echo still scores ~1) which
flattens the spectrum; and a delay only counts where the history is at most
``max_echo_gain_db`` quieter than the frame (an echo path attenuates: a frame
much louder than what we sent at that delay is not its echo). On the bench's
caller onsets this takes chance "echo" frames from 6 % to under 1 %.

Cost. The full search (every delay) is a dot product per delay
(``np.correlate``); it runs on the first suspect frame and then every
``refresh_frames`` while frames keep being echo. In between, only the delays
within ``track_samples`` of the last best delay are tried (the echo path of a
call does not jump), unless they stop matching: a tracked delay can sit on a
periodic alias of the true one (a tone, a held vowel), so a frame is only
called "not echo" after a full search. The decision is therefore always the
full search's (the tracked delays are a subset of all delays): tracking only
saves work, and it is only used after a frame found to be echo (after a "not
echo" frame, the caller is talking and the tracked delays would fail again).
The periodic full search only re-centres the tracked delay, hence a long
``refresh_frames`` (1 s: on a steady echo, 4 full searches in 200 frames
instead of 18 at 10 frames).
A full search only correlates the span of delays where the history is loud
enough for the frame to be its echo (the echo-gain bound rules out the others:
after the bot stops, the newest part of the history is silence).

``push_outbound`` runs for every frame the bot sends, whether anything is
checked or not: it only stores the frame's bytes and its time in a ring (no
numpy), as sent on the leg (``outbound_codec``: a G.711 leg's frames are not
decoded for it). The frames pushed since the last check are decoded, converted and
pre-emphasised (across frame joins) when a frame is checked, and the per-delay norms of the history
are updated for the new delays only, when a full search needs them.

The ring is also the barge-in detector's echo-guard window (one store per
outbound frame for both, not two): ``share_window(window_s, spill)`` makes
``bot_frames(now)`` give the frames sent within ``window_s`` of ``now``
(``BargeInDetector(..., bot_frames=...)`` reads them only when its guard
needs them). The ring holds ``max_delay_ms`` of frames; a frame it overwrites
while still inside the window (ticks closer than 20 ms: a burst of lead
frames) and a frame it cannot hold (wrong size) go to ``spill`` (the
detector's ``spill_sink()``: its ``record_bot_frame`` without a reference to
the detector, which holds ``bot_frames``), so the window is never short.

Pure: no clock, no I/O; inbound frames are 16-bit little-endian PCM, outbound
ones the same or G.711, at one rate.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import numpy as np

from telcodec import g711

__all__ = ["EchoCorrelator"]

_NEVER = -math.inf
"""Time of a ring slot no frame was pushed to with a time."""

_SILENT_RMS = 30.0
"""History quieter than this (about -61 dBFS) holds no echo to find."""


def _table(decode_array: Callable[[bytes], np.ndarray]) -> np.ndarray:
    table = decode_array(bytes(range(256))).astype(np.float32)
    table.setflags(write=False)
    return table


_DECODE_TABLES: dict[str, np.ndarray] = {
    "mulaw": _table(g711.ulaw_decode_array),
    "alaw": _table(g711.alaw_decode_array),
}
"""The float32 sample of every G.711 code (what decoding then converting gives)."""


class EchoCorrelator:
    """Tracks the outbound audio of one call and scores inbound frames as echo.

    Args:
        sample_rate_hz: rate of both directions (8000 on G.711 legs).
        frame_samples: samples per 20 ms frame.
        max_delay_ms: longest echo path looked for (network round trip,
            jitter buffers, the far end's own buffering).
        threshold: best correlation at or above which a frame is echo.
        refresh_frames: suspect frames between two full delay searches.
        track_samples: delays tried around the last best one in between.
        preemphasis: first-order pre-emphasis applied to both directions.
        max_echo_gain_db: loudest an echo may be relative to what we sent.
        outbound_codec: what ``push_outbound`` gets: ``"pcm_s16le"``, or the
            G.711 frames as sent (``"mulaw"``/``"alaw"``, decoded when checked).
    """

    __slots__ = (
        "_alpha",
        "_best_delay",
        "_decode",
        "_emph",
        "_emph_at",
        "_energies",
        "_frame",
        "_frame_bytes",
        "_guard_s",
        "_last_sample",
        "_len",
        "_loud",
        "_max_gain",
        "_n_delays",
        "_norms",
        "_norms_at",
        "_ones",
        "_pos",
        "_pushed",
        "_ring",
        "_since_search",
        "_spill",
        "_times",
        "_track",
        "_zero",
        "refresh_frames",
        "threshold",
    )

    def __init__(
        self,
        sample_rate_hz: int = 8000,
        frame_samples: int = 160,
        max_delay_ms: int = 300,
        threshold: float = 0.7,
        refresh_frames: int = 50,
        track_samples: int = 8,
        preemphasis: float = 0.5,
        max_echo_gain_db: float = 3.0,
        *,
        outbound_codec: str = "pcm_s16le",
    ) -> None:
        f = frame_samples
        self._frame = f
        self._decode = _DECODE_TABLES.get(outbound_codec)
        if self._decode is None and outbound_codec != "pcm_s16le":
            raise ValueError(f"unknown outbound codec {outbound_codec!r}")
        self._frame_bytes = f if self._decode is not None else 2 * f
        self._alpha = preemphasis
        self._max_gain = 10 ** (max_echo_gain_db / 20)
        delay_samples = sample_rate_hz * max_delay_ms // 1000
        self._len = delay_samples + f  # history samples
        self._n_delays = delay_samples + 1
        n_frames = -(-self._len // f)
        # outbound frames as sent, oldest at _pos (pushing is a list store)
        self._zero = bytes(2 * f)
        self._ring: list[bytes] = [self._zero] * n_frames
        # when each ring frame was sent (plain doubles: no float object kept per frame)
        self._times = array("d", [_NEVER]) * n_frames
        self._pos = 0
        # the barge-in detector's window (``share_window``): none until shared
        self._guard_s = _NEVER
        self._spill: Callable[[bytes, float], None] | None = None
        self._loud = 0  # ring frames that are not silence
        self._pushed = 0  # frames pushed, ever
        # the history pre-emphasised, brought up to date when a frame is checked; it and
        # the norms (about 20 KB between them at 8 kHz) are made at the first check: a
        # call whose caller never speaks over the bot never needs them
        self._emph: np.ndarray | None = None
        self._emph_at = 0  # value of _pushed that _emph reflects
        self._last_sample = 0.0  # newest raw sample in _emph (pre-emphasis across frames)
        self._energies = [0.0] * n_frames  # raw energy of each ring frame (as of _emph_at)
        self._norms: np.ndarray | None = None  # |r_d| per delay
        self._norms_at = 0
        self._ones = np.ones(f, dtype=np.float32)
        self.threshold = threshold
        self.refresh_frames = refresh_frames
        self._track = track_samples
        self._best_delay: int | None = None
        self._since_search = 0

    def share_window(self, window_s: float, spill: Callable[[bytes, float], None]) -> None:
        """Serve a barge-in detector's echo-guard window of ``window_s`` (``bot_frames``).

        ``spill(frame, sent_s)`` gets every frame sent that the window needs
        and the ring cannot give: a frame overwritten less than ``window_s``
        after it was sent, a frame of the wrong size.
        """
        self._guard_s = window_s
        self._spill = spill

    def push_outbound(self, pcm_s16le: bytes | None, now: float = _NEVER) -> None:
        """The frame just sent at ``now`` (``None``: silence), once per tick, in order.

        In ``outbound_codec`` (s16le unless the correlator was made for G.711).
        ``now`` matters only to ``bot_frames`` (``share_window``).
        """
        zero = self._zero
        if pcm_s16le is None or len(pcm_s16le) != self._frame_bytes:
            if pcm_s16le is not None and self._spill is not None:
                self._spill(pcm_s16le, now)  # sent, but not storable here: the guard keeps it
            if self._loud == 0:
                return  # idle: the history is already all silence
            pcm_s16le = zero
        ring = self._ring
        pos = self._pos
        old = ring[pos]
        if old is not zero:
            self._loud -= 1
            times = self._times
            if times[pos] >= now - self._guard_s and self._spill is not None:
                self._spill(old, times[pos])  # still inside the detector's window
        if pcm_s16le is not zero:
            self._loud += 1
        ring[pos] = pcm_s16le
        self._times[pos] = now
        self._pos = pos + 1 if pos + 1 < len(ring) else 0
        self._pushed += 1

    def bot_frames(self, now: float) -> list[tuple[int, float, bytes]]:
        """(push number, time, frame) of the frames in the ring sent within the window.

        The window (``share_window``) ends at ``now`` or at the newest frame
        sent, whichever is later, as a detector pruning on every frame and
        query would have it. Silence (``None`` pushes) is not a frame sent.
        """
        ring, times, zero = self._ring, self._times, self._zero
        newest = now
        for slot in range(len(ring)):
            if ring[slot] is not zero and times[slot] > newest:
                newest = times[slot]
        oldest_s = newest - self._guard_s
        n = len(ring)
        pos = self._pos
        out = []
        for back in range(1, n + 1):
            slot = (pos - back) % n
            frame = ring[slot]
            if frame is not zero and times[slot] >= oldest_s:
                out.append((self._pushed - back, times[slot], frame))
        return out

    def likelihood(self, pcm_s16le: bytes) -> float:
        """Best normalised correlation of an inbound frame with the outbound history (0..1)."""
        f = self._frame
        if len(pcm_s16le) != 2 * f:
            return 0.0
        if self._loud == 0:
            self._best_delay = None
            return 0.0
        self._sync_history()
        if sum(self._energies) < (_SILENT_RMS**2) * self._len:
            self._best_delay = None
            return 0.0
        x = np.frombuffer(pcm_s16le, "<i2").astype(np.float32)
        # pre-emphasised; the first sample has no predecessor here and is left
        # out (zero), keeping 160 taps (numpy's correlate is twice as slow at 159)
        x[1:] -= self._alpha * x[:-1]
        x[0] = 0.0
        x_norm = math.sqrt(float(np.dot(x, x)))
        if x_norm == 0.0:
            return 0.0
        if self._best_delay is not None and self._since_search < self.refresh_frames:
            self._since_search += 1
            score = self._tracked(x, x_norm, self._best_delay)
            if score >= self.threshold:
                return score
            # a tracked delay can lock on a periodic alias (a sustained vowel, a
            # tone): when it stops matching, look at every delay before deciding
        self._since_search = 0
        score = self._full(x, x_norm)
        if score < self.threshold:
            self._best_delay = None  # not echo: the next suspect frame searches everything
        return score

    def _tracked(self, x: np.ndarray, x_norm: float, around: int) -> float:
        """Best correlation over the delays within ``track_samples`` of ``around``."""
        f = self._frame
        lo = max(0, around - self._track)
        hi = min(self._n_delays, around + self._track + 1)
        segment = self._history()[lo : hi + f - 1]
        dots = np.correlate(segment, x, mode="valid")
        norms = self._window_norms(segment)
        ncc = np.abs(dots) / norms
        ncc[norms < x_norm / self._max_gain] = 0.0  # louder than what we sent: not its echo
        best = int(np.argmax(ncc))
        self._best_delay = lo + best
        return min(1.0, float(ncc[best]) / x_norm)

    def _full(self, x: np.ndarray, x_norm: float) -> float:
        """Best correlation over every delay (where an echo could be as loud as the frame)."""
        norms = self._sync_norms()
        # only delays where the history is loud enough for this frame to be its echo
        allowed = norms >= x_norm / self._max_gain
        where = np.flatnonzero(allowed)
        if len(where) == 0:
            self._best_delay = None
            return 0.0
        lo = int(where[0])
        hi = int(where[-1]) + 1
        dots = np.correlate(self._history()[lo : hi + self._frame - 1], x, mode="valid")
        ncc = np.abs(dots) / norms[lo:hi]
        if hi - lo != len(where):
            ncc *= allowed[lo:hi]  # louder than what we sent: not its echo
        best = int(np.argmax(ncc))
        self._best_delay = lo + best
        return min(1.0, float(ncc[best]) / x_norm)

    def _history(self) -> np.ndarray:
        """The pre-emphasised history (zeros until the first frame is checked)."""
        hist = self._emph
        if hist is None:
            hist = self._emph = np.zeros(self._len, dtype=np.float32)
        return hist

    def _sync_history(self) -> None:
        """Bring the pre-emphasised history and the frame energies up to the last push."""
        pending = self._pushed - self._emph_at
        if pending == 0:
            return
        f = self._frame
        ring = self._ring
        n_frames = len(ring)
        pending = min(pending, n_frames)
        hist = self._history()
        m = min(pending * f, self._len)  # history samples replaced
        if m < self._len:
            hist[:-m] = hist[m:]
        alpha = self._alpha
        last = self._last_sample
        decode = self._decode
        for k in range(pending):
            slot = (self._pos - pending + k) % n_frames
            frame = ring[slot]
            if decode is None or frame is self._zero:
                raw = np.frombuffer(frame, "<i2").astype(np.float32)
            else:  # G.711 as sent: the table holds every code's sample, exactly
                raw = decode[np.frombuffer(frame, np.uint8)]
            self._energies[slot] = float(np.dot(raw, raw))
            end = self._len - (pending - 1 - k) * f  # this frame's end in the history
            if end > 0:
                out = hist[max(0, end - f) : end]
                emph = out if end >= f else np.empty(f, dtype=np.float32)
                np.multiply(raw[:-1], -alpha, out=emph[1:])
                emph[0] = -alpha * last
                emph += raw  # raw[n] - alpha * raw[n-1], across the frame join too
                if emph is not out:
                    out[:] = emph[f - end :]
            last = float(raw[-1])
        self._last_sample = last
        self._emph_at = self._pushed

    def _sync_norms(self) -> np.ndarray:
        """Bring |r_d| (the history's norm at every delay) up to the history; returns it."""
        f = self._frame
        norms = self._norms
        if norms is None:
            norms = self._norms = np.zeros(self._n_delays, dtype=np.float32)
        shift = (self._emph_at - self._norms_at) * f
        if shift == 0:
            return norms
        n = self._n_delays
        if shift >= n:
            new_from = 0
        else:
            norms[:-shift] = norms[shift:]
            new_from = n - shift
        # the windows of the delays new_from.. cover the history from new_from on
        hist = self._history()
        if n - new_from <= 2 * f:  # a frame or two pushed since: a short sliding sum
            norms[new_from:] = self._window_norms(hist[new_from:])
        else:
            segment = hist[new_from:].astype(np.float64)
            sq = np.concatenate(([0.0], np.cumsum(segment * segment)))
            norms[new_from:] = np.sqrt(np.maximum(sq[f:] - sq[:-f], 1e-9))
        self._norms_at = self._emph_at
        return norms

    def _window_norms(self, segment: np.ndarray) -> np.ndarray:
        """|r_d| for every ``frame_samples`` window of a short ``segment`` (a sliding
        sum of squares; float32 is plenty, every term is >= 0 so nothing cancels)."""
        sums = np.correlate(segment * segment, self._ones, mode="valid")
        return np.sqrt(np.maximum(sums, 1e-9, out=sums), out=sums)

    def is_echo(self, pcm_s16le: bytes) -> bool:
        return self.threshold > 0.0 and self.likelihood(pcm_s16le) >= self.threshold

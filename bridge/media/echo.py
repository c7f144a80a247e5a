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

Cost. The full search (every delay) is a dot product per delay; it runs on
the first suspect frame and then every ``refresh_frames``. In between, only
the delays within ``track_samples`` of the last best delay are tried (the
echo path of a call does not jump), unless they stop matching: a tracked
delay can sit on a periodic alias of the true one (a tone, a held vowel),
so a frame is only called "not echo" after a full search. Nothing is computed while the history is
silent (the bot is not talking, so there is nothing to echo) or for frames
the VAD did not call speech (the caller calls ``likelihood`` only for those).

Pure: no clock, no I/O; frames are 16-bit little-endian PCM at one rate.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EchoCorrelator"]

_SILENT_RMS = 30.0
"""History quieter than this (about -61 dBFS) holds no echo to find."""


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
    """

    __slots__ = (
        "_alpha",
        "_best_delay",
        "_frame",
        "_hist",
        "_hist_energy",
        "_max_gain",
        "_since_search",
        "_track",
        "refresh_frames",
        "threshold",
    )

    def __init__(
        self,
        sample_rate_hz: int = 8000,
        frame_samples: int = 160,
        max_delay_ms: int = 300,
        threshold: float = 0.7,
        refresh_frames: int = 10,
        track_samples: int = 8,
        preemphasis: float = 0.5,
        max_echo_gain_db: float = 3.0,
    ) -> None:
        self._frame = frame_samples
        self._alpha = preemphasis
        self._max_gain = 10 ** (max_echo_gain_db / 20)
        delay_samples = sample_rate_hz * max_delay_ms // 1000
        self._hist = np.zeros(delay_samples + frame_samples, dtype=np.float32)
        self._hist_energy = 0.0
        self.threshold = threshold
        self.refresh_frames = refresh_frames
        self._track = track_samples
        self._best_delay: int | None = None
        self._since_search = 0

    def push_outbound(self, pcm_s16le: bytes | None) -> None:
        """The frame just sent (``None``: silence), once per tick, in order."""
        silent = pcm_s16le is None or len(pcm_s16le) != 2 * self._frame
        if silent and self._hist_energy == 0.0:
            return  # idle: the history is already all silence
        f = self._frame
        hist = self._hist
        leaving = hist[:f]
        self._hist_energy -= float(np.dot(leaving, leaving))
        hist[:-f] = hist[f:]
        if silent:
            hist[-f:] = 0.0
        else:
            hist[-f:] = np.frombuffer(pcm_s16le, "<i2")  # type: ignore[arg-type]
            tail = hist[-f:]
            self._hist_energy += float(np.dot(tail, tail))
        if self._hist_energy < 1.0:
            self._hist_energy = 0.0  # no float residue keeps an all-silent history "loud"

    def likelihood(self, pcm_s16le: bytes) -> float:
        """Best normalised correlation of an inbound frame with the outbound history (0..1)."""
        f = self._frame
        if len(pcm_s16le) != 2 * f:
            return 0.0
        hist = self._hist
        if self._hist_energy < (_SILENT_RMS**2) * len(hist):
            self._best_delay = None
            return 0.0
        x = np.frombuffer(pcm_s16le, "<i2").astype(np.float32)
        # pre-emphasised; the first sample has no predecessor here and is left
        # out (zero), keeping 160 taps (numpy's correlate is twice as slow at 159)
        x[1:] -= self._alpha * x[:-1]
        x[0] = 0.0
        x_norm = float(np.sqrt(np.dot(x, x)))
        if x_norm == 0.0:
            return 0.0
        n_delays = len(hist) - f + 1
        if self._best_delay is not None and self._since_search < self.refresh_frames:
            self._since_search += 1
            lo = max(0, self._best_delay - self._track)
            hi = min(n_delays, self._best_delay + self._track + 1)
            score = self._search(x, x_norm, lo, hi)
            if score >= self.threshold:
                return score
            # a tracked delay can lock on a periodic alias (a sustained vowel, a
            # tone): when it stops matching, look at every delay before deciding
        self._since_search = 0
        return self._search(x, x_norm, 0, n_delays)

    def _search(self, x: np.ndarray, x_norm: float, lo: int, hi: int) -> float:
        f = self._frame
        # the history is kept raw (pushing stays cheap) and pre-emphasised here,
        # over the part searched: one sample earlier for the first difference
        raw = self._hist[max(0, lo - 1) : hi + f - 1]
        segment = raw[1:] - self._alpha * raw[:-1]
        if lo == 0:
            segment = np.concatenate((raw[:1], segment))
        dots = np.correlate(segment, x, mode="valid")
        sq = np.concatenate(([0.0], np.cumsum(segment.astype(np.float64) ** 2)))
        norms = np.sqrt(np.maximum(sq[f:] - sq[:-f], 1e-9))
        ncc = np.abs(dots) / (norms * x_norm)
        ncc[norms * self._max_gain < x_norm] = 0.0  # louder than what we sent: not its echo
        best = int(np.argmax(ncc))
        self._best_delay = lo + best
        return float(min(1.0, ncc[best]))

    def is_echo(self, pcm_s16le: bytes) -> bool:
        return self.threshold > 0.0 and self.likelihood(pcm_s16le) >= self.threshold

"""Streaming sample-rate conversion of s16le audio over soxr.

Theory of operation
-------------------
One ``StreamResampler`` converts one utterance stream from ``in_rate_hz`` to
``out_rate_hz`` with libsoxr's band-limited filter (``soxr.ResampleStream``,
fed float32 holding the int16 values, rounded and clipped back to int16).
Going through float32 rather than soxr's int16 path matters: libsoxr applies
random TPDF dither to int16 output, which makes the output depend on how the
input was chunked. With float32 the output is bit-identical whatever the
chunking. TTS audio at 16/22.05/24/44.1/48 kHz must be low-pass
filtered before it is decimated to 8 kHz, or everything above 4 kHz folds
back into the telephone band; linear interpolation (``audioop.ratecv``) does
not filter and is banned for that reason.

* ``process(chunk)`` feeds any number of bytes. Filter state is kept across
  calls, so splitting the input differently does not change the output. A
  dangling odd byte (half a sample) is kept and joined to the next chunk.
* Output is bursty: the filter holds back up to its delay (hundreds of
  output samples) and releases audio in blocks, often returning nothing for
  a 20 ms input. Put it in a ``FrameCutter``.
* ``flush()`` ends the utterance: it drains the filter (soxr ``last=True``)
  and re-arms the resampler for the next utterance. A dangling odd byte at
  that point cannot be a sample and is dropped.
* ``reset()`` drops all state without output (barge-in).
* ``release()`` hands out what the filter holds back *without* ending the
  stream, for a caller about to run dry (a turn's audio is played as it
  arrives, and soxr's ``HQ`` filter releases output in blocks: it holds
  between 17 and 73 ms of 24 kHz input, so the first 120 ms chunk of a turn
  gives 61 ms). It drains the filter, keeps back the last ``_HOLD_S`` of that
  output (computed with zeros where the next input will be), and restarts the
  filter on the output grid, primed with the input of the last ``_HOLD_S`` +
  ``_PRIME_S``, whose output up to the kept-back point is dropped. The stream
  then goes on as if never released: the output equals the unreleased
  stream's within float rounding (a sample may round 1 LSB apart), with the
  same length. ``_HOLD_S`` is longer than half the filter (``HQ`` for
  24 -> 8 kHz is ~16 ms long).

With equal rates the resampler is a pass-through (only the odd-byte rule
applies). The numbers of samples out and in agree, after ``flush()``, to
``in * out_rate / in_rate`` within a sample or two.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import soxr

__all__ = ["QUALITIES", "StreamResampler"]

QUALITIES: Final = frozenset({"QQ", "LQ", "MQ", "HQ", "VHQ"})
"""soxr recipes: quick cubic, low, medium, high (20-bit, default), very high."""

_EMPTY: Final = np.zeros(0, dtype=np.float32)
_S16LE: Final = np.dtype("<i2")

_HOLD_S: Final = {"QQ": 0.012, "LQ": 0.012, "MQ": 0.012, "HQ": 0.012, "VHQ": 0.024}
"""Output ``release()`` keeps back, by quality: more than the filter's half length."""
_PRIME_S: Final = 0.03
"""Input history a restarted filter is primed with, beyond the kept-back output."""


class StreamResampler:
    """Resample a stream of s16le mono audio chunk by chunk.

    Args:
        in_rate_hz: sample rate of the input.
        out_rate_hz: sample rate wanted.
        quality: one of ``QUALITIES``.

    Raises:
        ValueError: a rate is not positive or the quality is unknown.
    """

    __slots__ = (
        "_dangling",
        "_grid_in",
        "_grid_out",
        "_hist",
        "_hist_n",
        "_hist_spare",
        "_hold",
        "_in_rate_hz",
        "_in_total",
        "_keep",
        "_out_rate_hz",
        "_out_total",
        "_quality",
        "_skip",
        "_stream",
    )

    def __init__(self, in_rate_hz: int, out_rate_hz: int, quality: str = "HQ") -> None:
        if in_rate_hz <= 0 or out_rate_hz <= 0:
            raise ValueError(f"rates must be positive, got {in_rate_hz} -> {out_rate_hz}")
        if quality.upper() not in QUALITIES:
            raise ValueError(f"unknown quality {quality!r}, expected one of {sorted(QUALITIES)}")
        self._in_rate_hz = in_rate_hz
        self._out_rate_hz = out_rate_hz
        self._quality = quality.upper()
        self._dangling = b""
        self._stream: soxr.ResampleStream | None = None
        grid = math.gcd(in_rate_hz, out_rate_hz)
        self._grid_in = in_rate_hz // grid
        self._grid_out = out_rate_hz // grid
        """Every ``_grid_in`` input samples an output sample falls on an input one."""
        hold_s = _HOLD_S[self._quality]
        self._hold = round(hold_s * out_rate_hz)
        self._keep = round((hold_s + _PRIME_S) * in_rate_hz) + 2 * self._grid_in
        """Input samples of history kept for ``release`` (its priming, and a grid step)."""
        self._hist = _EMPTY
        """The last ``_hist_n`` (at most ``_keep``) input samples, at the end of this array."""
        self._hist_spare = _EMPTY
        """The array the next chunk's history is written to (the two swap: no new array)."""
        self._hist_n = 0
        self._in_total = 0
        self._out_total = 0
        """Samples fed and handed out since the utterance began."""
        self._skip = 0
        """Output of a restarted filter still to drop (handed out before ``release``)."""
        if in_rate_hz != out_rate_hz:
            self._stream = soxr.ResampleStream(
                in_rate_hz, out_rate_hz, 1, dtype="float32", quality=self._quality
            )
            self._hist = np.zeros(self._keep, dtype=np.float32)
            self._hist_spare = np.zeros(self._keep, dtype=np.float32)

    @property
    def in_rate_hz(self) -> int:
        """Sample rate of the input."""
        return self._in_rate_hz

    @property
    def out_rate_hz(self) -> int:
        """Sample rate of the output."""
        return self._out_rate_hz

    @property
    def is_pass_through(self) -> bool:
        """True when both rates are equal and audio is not filtered at all."""
        return self._stream is None

    def process(self, pcm_s16le: bytes, table: EncodeTable | None = None) -> bytes:
        """Feed a chunk; return whatever output the filter releases (maybe nothing).

        ``table``: encode the output with it, one byte per sample (a G.711 table
        indexed by the int16 sample's bit pattern, ``telcodec.g711``), instead of
        returning s16le. Every method that returns output takes it.
        """
        if self._dangling:
            pcm_s16le = self._dangling + pcm_s16le
        if len(pcm_s16le) % 2:
            self._dangling = pcm_s16le[-1:]
            pcm_s16le = pcm_s16le[:-1]
        else:
            self._dangling = b""
        if self._stream is None:
            if table is None:
                return bytes(pcm_s16le)
            return _encode(np.frombuffer(pcm_s16le, dtype="<u2"), table)
        if not pcm_s16le:
            return b""
        ints = np.frombuffer(pcm_s16le, dtype=_S16LE)
        samples = _scratch("f32", np.float32, len(ints))  # soxr copies it: no new array
        np.copyto(samples, ints, casting="unsafe")
        return self._filter(samples, table)

    def _filter(self, samples: npt.NDArray[np.float32], table: EncodeTable | None) -> bytes:
        """The filter's output for ``samples`` (the next input, as float32), counted."""
        assert self._stream is not None
        self._in_total += len(samples)
        self._remember(samples)
        return _to_output(self._counted(self._stream.resample_chunk(samples)), table)

    def _remember(self, samples: npt.NDArray[np.float32]) -> None:
        """Keep the last ``_keep`` input samples for ``release``, in the two history arrays."""
        keep = self._keep
        m = len(samples)
        if m >= keep:
            np.copyto(self._hist, samples[m - keep :])
            self._hist_n = keep
            return
        old, new = self._hist, self._hist_spare
        kept = min(self._hist_n, keep - m)
        np.copyto(new[keep - m - kept : keep - m], old[keep - kept :])
        np.copyto(new[keep - m :], samples)
        self._hist, self._hist_spare = new, old
        self._hist_n = kept + m

    def process_parts(
        self, parts: Sequence[bytes | memoryview], table: EncodeTable | None = None
    ) -> bytes:
        """``process`` of the parts joined, without joining them.

        Each part's samples are converted straight into the filter's input
        array (a 500 ms piece of 24 kHz audio is 24 KB: a join allocates and
        copies it once more). Parts of an odd length, or a byte left over
        from before, take the joined path.
        """
        if self._stream is None or self._dangling or any(len(p) % 2 for p in parts):
            return self.process(b"".join(parts), table)
        n = sum(len(p) for p in parts) // 2
        if not n:
            return b""
        samples = _scratch("f32", np.float32, n)
        at = 0
        for part in parts:
            ints = np.frombuffer(part, dtype=_S16LE)
            np.copyto(samples[at : at + len(ints)], ints, casting="unsafe")
            at += len(ints)
        return self._filter(samples, table)

    def release(self, least: int = 0, table: EncodeTable | None = None) -> bytes:
        """What the filter holds back but the last ``_HOLD_S``; the stream goes on (see above).

        ``least`` > 0: the caller needs that many samples (to complete a frame
        it is about to play). When the filter holds that many but not that
        many beyond ``_HOLD_S``, it keeps back less, just what is left over:
        exactly ``least`` come out. The kept-back tail is what makes the join
        exact; a shorter one leaves the last output samples computed with
        zeros for the input still to come, off by a little near the join
        (under 1 % of the signal's RMS with 5 ms kept back, ``tests/codecs``),
        which is better for a caller than a frame of silence.

        Returns nothing and changes nothing when it holds less than ``least``
        samples, or (``least`` 0) less than 20 ms beyond ``_HOLD_S``, or for a
        pass-through.
        """
        stream = self._stream
        if stream is None:
            return b""
        held = self._in_total * self._grid_out // self._grid_in - self._out_total
        short = held - self._hold < (least or self._out_rate_hz // 50)
        if short and (least <= 0 or held < least):
            return b""
        tail = self._counted(stream.resample_chunk(_EMPTY, last=True), self._hold, least)
        # restart on the output grid, primed with the history from ``start`` on
        history = self._hist[self._keep - self._hist_n :]
        first = self._in_total - len(history)
        start = max(first, self._in_total - self._keep + 2 * self._grid_in)
        start += -start % self._grid_in
        stream.clear()
        self._skip = self._out_total - start // self._grid_in * self._grid_out
        out = self._counted(stream.resample_chunk(history[start - first :]))
        return _to_output(np.concatenate((tail, out)) if len(out) else tail, table)

    def _counted(
        self, out: npt.NDArray[np.float32], hold: int = 0, least: int = 0
    ) -> npt.NDArray[np.float32]:
        """Drop what a restarted filter repeats, keep back ``hold`` samples, count the rest.

        Less is kept back where that would leave fewer than ``least`` samples.
        """
        skip = self._skip
        if skip:
            taken = min(skip, len(out))
            out = out[taken:]
            self._skip = skip - taken
        if hold:
            out = out[: max(0, len(out) - hold, min(least, len(out)))]
        self._out_total += len(out)
        return out

    def flush(self, table: EncodeTable | None = None) -> bytes:
        """End the utterance: return the filter's remaining output and re-arm.

        After this the resampler is ready for a new, unrelated utterance.
        """
        self._dangling = b""
        if self._stream is None:
            return b""
        tail = self._counted(self._stream.resample_chunk(_EMPTY, last=True))
        self._stream.clear()
        self._rearm()
        return _to_output(tail, table)

    def reset(self) -> None:
        """Drop all buffered input and filter state without output (barge-in)."""
        self._dangling = b""
        if self._stream is not None:
            self._stream.clear()
        self._rearm()

    def _rearm(self) -> None:
        self._hist_n = 0
        self._in_total = self._out_total = self._skip = 0


def _to_output(samples: npt.NDArray[np.float32], table: EncodeTable | None = None) -> bytes:
    """Round and clip soxr's output (in place) to int16: s16le bytes, or encoded with
    ``table`` through scratch arrays (one new object: the bytes returned)."""
    np.rint(samples, out=samples)
    np.clip(samples, -32768.0, 32767.0, out=samples)
    if table is None:
        return samples.astype(_S16LE).tobytes()
    ints = _scratch("i16", np.int16, len(samples))
    np.copyto(ints, samples, casting="unsafe")  # what astype does, into the scratch
    return _encode(ints.view(np.uint16), table)


def _encode(patterns: npt.NDArray[np.uint16], table: EncodeTable) -> bytes:
    """The code bytes of samples given as their bit patterns, through scratch arrays."""
    n = len(patterns)
    index = _scratch("intp", np.intp, n)
    np.copyto(index, patterns)  # np.take casts other index types to intp in a new array
    codes = _scratch("u8", np.uint8, n)
    np.take(table, index, out=codes)
    return codes.tobytes()


EncodeTable: TypeAlias = npt.NDArray[np.uint8]
"""65 536 code bytes, indexed by an int16 sample's bit pattern (``telcodec.g711``)."""

_SCRATCH = threading.local()
"""Per thread: arrays reused from one chunk to the next instead of a new one each.

A 500 ms piece of 24 kHz audio made five arrays and byte strings of 4-48 KB;
at 500 calls the daemon's profile spent 12-14 % of its samples in glibc's
``_int_malloc`` under those conversions (a large, fragmented heap)."""


def _scratch(name: str, dtype: type[np.generic], n: int) -> npt.NDArray[Any]:
    """The first ``n`` items of this thread's scratch array ``name`` (grown as needed)."""
    buf: npt.NDArray[Any] | None = getattr(_SCRATCH, name, None)
    if buf is None or len(buf) < n:
        buf = np.empty(max(n, 1 << 14), dtype=dtype)
        setattr(_SCRATCH, name, buf)
    return buf[:n]

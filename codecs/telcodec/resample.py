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

With equal rates the resampler is a pass-through (only the odd-byte rule
applies). The numbers of samples out and in agree, after ``flush()``, to
``in * out_rate / in_rate`` within a sample or two.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import soxr

__all__ = ["QUALITIES", "StreamResampler"]

QUALITIES: Final = frozenset({"QQ", "LQ", "MQ", "HQ", "VHQ"})
"""soxr recipes: quick cubic, low, medium, high (20-bit, default), very high."""

_EMPTY: Final = np.zeros(0, dtype=np.float32)
_S16LE: Final = np.dtype("<i2")


class StreamResampler:
    """Resample a stream of s16le mono audio chunk by chunk.

    Args:
        in_rate_hz: sample rate of the input.
        out_rate_hz: sample rate wanted.
        quality: one of ``QUALITIES``.

    Raises:
        ValueError: a rate is not positive or the quality is unknown.
    """

    __slots__ = ("_dangling", "_in_rate_hz", "_out_rate_hz", "_quality", "_stream")

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
        if in_rate_hz != out_rate_hz:
            self._stream = soxr.ResampleStream(
                in_rate_hz, out_rate_hz, 1, dtype="float32", quality=self._quality
            )

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

    def process(self, pcm_s16le: bytes) -> bytes:
        """Feed a chunk; return whatever output the filter releases (maybe nothing)."""
        if self._dangling:
            pcm_s16le = self._dangling + pcm_s16le
        if len(pcm_s16le) % 2:
            self._dangling = pcm_s16le[-1:]
            pcm_s16le = pcm_s16le[:-1]
        else:
            self._dangling = b""
        if self._stream is None:
            return bytes(pcm_s16le)
        if not pcm_s16le:
            return b""
        samples = np.frombuffer(pcm_s16le, dtype=_S16LE).astype(np.float32)
        return _to_s16le(self._stream.resample_chunk(samples))

    def flush(self) -> bytes:
        """End the utterance: return the filter's remaining output and re-arm.

        After this the resampler is ready for a new, unrelated utterance.
        """
        self._dangling = b""
        if self._stream is None:
            return b""
        tail = self._stream.resample_chunk(_EMPTY, last=True)
        self._stream.clear()
        return _to_s16le(tail)

    def reset(self) -> None:
        """Drop all buffered input and filter state without output (barge-in)."""
        self._dangling = b""
        if self._stream is not None:
            self._stream.clear()


def _to_s16le(samples: npt.NDArray[np.float32]) -> bytes:
    np.rint(samples, out=samples)
    np.clip(samples, -32768.0, 32767.0, out=samples)
    return samples.astype(_S16LE).tobytes()

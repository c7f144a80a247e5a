"""Voice activity and level of one inbound 20 ms frame.

Theory of operation
-------------------
The barge-in detector needs two numbers per inbound frame: whether it sounds
like speech, and how loud it is. ``Vad`` wraps the WebRTC voice activity
detector (``webrtcvad``, a C library with no I/O; aggressiveness 0 = least
likely to call noise "not speech", 3 = most likely) and validates the frame
size instead of letting the C code raise on odd input. ``energy_dbfs`` is the
frame's RMS level relative to a full-scale square wave (a full-scale sine
reads -3.01 dBFS; ``audioop.rms`` truncates the RMS to an integer, a 0.1 dB
step at -50 dBFS); digital silence reads ``MIN_DBFS`` rather than -inf, so
the value is always a finite float. ``analyze`` reports the level without
the frame's DC offset (``ac_energy_dbfs``): a peer sending a constant sample
is silent, not a -8 dBFS caller.

Input is signed 16-bit little-endian mono PCM, the decoder's output. A frame
of the wrong length is never speech and raises nothing: inbound audio is
remote input.

Digital silence. A line that sends exact zeros (a muted phone, a media
stream's idle caller) needs no VAD: once the WebRTC VAD has been given
``SETTLED_ZERO_FRAMES`` all-zero frames in a row, its state no longer
changes with another one and it says "not speech" (its filters have decayed,
its hangover has run out, and it adapts its models only to frames with some
energy; ``tests/media/test_vad_silence.py`` reads the C state to check this).
``speech_and_level`` then answers ``(False, MIN_DBFS)`` for further zero
frames without calling it: the same answer, and the same state for the next
frame, as calling it. Anything else (``is_speech``, a frame with one non-zero
sample) starts the count again. Lines with noise, however quiet, run the VAD
on every frame: it adapts to them, so skipping a frame would change later
answers.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import webrtcvad

with warnings.catch_warnings():
    # audioop is deprecated in 3.11-3.12; from 3.13 it comes from audioop-lts.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = [
    "CLICK_CREST",
    "MIN_DBFS",
    "SETTLED_ZERO_FRAMES",
    "FrameAnalysis",
    "Vad",
    "ac_energy_dbfs",
    "energy_dbfs",
    "is_click",
]

MIN_DBFS = -100.0
SETTLED_ZERO_FRAMES = 20
"""All-zero frames after which the WebRTC VAD is at rest on digital silence (it
takes at most 10 from any state tried, every aggressiveness): twice that."""
_FULL_SCALE = 32768.0
_FULL_SCALE_2 = _FULL_SCALE**2
_NATIVE_IS_LE = sys.byteorder == "little"
_VALID_RATES_HZ = (8000, 16000, 32000, 48000)
_VALID_FRAME_MS = (10, 20, 30)
_VAD_PROCESS: Callable[[object, int, bytes, int], int] | None = getattr(
    getattr(webrtcvad, "_webrtcvad", None), "process", None
)
"""The C function behind ``webrtcvad.Vad.is_speech`` (``None``: use the wrapper)."""


def _no_process(handle: object, rate_hz: int, frame: bytes, samples: int) -> int:
    raise RuntimeError("webrtcvad has no C entry point here")  # never called: ``_direct``


def energy_dbfs(pcm_s16le: bytes) -> float:
    """RMS level of a frame in dBFS, floored at ``MIN_DBFS`` (empty or silent frames).

    ``audioop.rms`` (C) costs well under a microsecond per 20 ms frame, several
    times less than numpy on arrays this small. A trailing odd byte is ignored.
    """
    pcm = pcm_s16le if _NATIVE_IS_LE and not len(pcm_s16le) & 1 else _native(pcm_s16le)
    rms = audioop.rms(pcm, 2) if pcm else 0
    if rms <= 0:
        return MIN_DBFS
    return max(MIN_DBFS, 20.0 * math.log10(rms / _FULL_SCALE))


_DC_SAMPLES = 64
"""A frame whose mean is beyond this (-54 dBFS) carries a DC offset worth removing."""
_NO_DC_RMS = _DC_SAMPLES
"""Below this ``audioop.rms`` the mean needs no measuring: ``|mean| <= true RMS <
rms + 1 <= 64``, and ``audioop.avg`` (which floors) stays within ``_DC_SAMPLES``.
Most inbound frames (line noise between words) skip that second pass."""


def ac_energy_dbfs(pcm_s16le: bytes) -> float:
    """``energy_dbfs`` of the frame without its DC offset (its mean).

    A constant offset is no sound on a telephone line (the band starts at
    300 Hz), but it reads as a level: a "silent" peer that sends a constant
    sample (a codec mismatch, a DC-coupled source) would look like a loud
    caller. Frames with a negligible mean (all normal audio) cost the same as
    ``energy_dbfs``; only offset frames pay for the exact computation.
    """
    pcm = _native(pcm_s16le)
    return _ac_dbfs(pcm, audioop.rms(pcm, 2)) if pcm else MIN_DBFS


def _native(pcm_s16le: bytes) -> bytes:
    """Whole samples in native byte order (what ``audioop`` reads)."""
    pcm = pcm_s16le[: len(pcm_s16le) & ~1]
    return pcm if _NATIVE_IS_LE or not pcm else audioop.byteswap(pcm, 2)


def _dbfs(power: float) -> float:
    return max(MIN_DBFS, 10.0 * math.log10(power / _FULL_SCALE**2)) if power >= 1.0 else MIN_DBFS


def _ac_dbfs(pcm: bytes, rms: int) -> float:
    """Level without DC of native-order samples whose ``audioop.rms`` is ``rms``."""
    mean = audioop.avg(pcm, 2)
    if abs(mean) <= _DC_SAMPLES:
        return _dbfs(float(rms * rms))
    power = float(rms * rms - mean * mean)  # both truncated to integers
    if power > 200.0 * (rms + abs(mean) + 1):  # their error is under 1 % of it
        return _dbfs(power)
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)  # mostly offset: exactly
    ac = x - x.mean()
    return _dbfs(float(np.dot(ac, ac)) / len(ac))


CLICK_CREST = 7.0
"""Peak-to-RMS ratio (17 dB) above which a frame is a click, not speech."""


def is_click(pcm_s16le: bytes, crest: float = CLICK_CREST) -> bool:
    """Whether the frame's energy sits in a few samples (a click, a crackle, a tap).

    A 1-3 ms burst in a 20 ms frame has a peak 9-10 times its RMS; speech
    rarely passes 6 (the bench's onsets: median 3.0, 99.9th percentile 7.8),
    white noise about 4.
    """
    pcm = _native(pcm_s16le)
    if not pcm:
        return False
    rms = audioop.rms(pcm, 2)
    return rms > 0 and audioop.max(pcm, 2) > crest * rms


@dataclass(frozen=True, slots=True)
class FrameAnalysis:
    """What the barge-in detector observes about one inbound frame."""

    is_speech: bool
    energy_dbfs: float


class Vad:
    """WebRTC VAD for one call's inbound audio (it keeps state between frames).

    Args:
        aggressiveness: 0..3, see the module docstring.
        sample_rate_hz: 8000, 16000, 32000 or 48000.
        frame_ms: 10, 20 or 30.
    """

    __slots__ = (
        "_direct",
        "_frame_bytes",
        "_frame_samples",
        "_handle",
        "_process",
        "_sample_rate_hz",
        "_vad",
        "_zero",
        "_zero_run",
    )

    def __init__(self, aggressiveness: int = 2, sample_rate_hz: int = 8000, frame_ms: int = 20):
        if aggressiveness not in range(4):
            raise ValueError(f"aggressiveness must be 0..3, not {aggressiveness}")
        if sample_rate_hz not in _VALID_RATES_HZ or frame_ms not in _VALID_FRAME_MS:
            raise ValueError(f"unsupported VAD input: {sample_rate_hz} Hz, {frame_ms} ms")
        self._vad = webrtcvad.Vad(aggressiveness)
        self._sample_rate_hz = sample_rate_hz
        self._frame_bytes = 2 * sample_rate_hz * frame_ms // 1000
        self._frame_samples = self._frame_bytes // 2
        # The C handle, called directly (the Python wrapper's own checks cost
        # about half a microsecond a frame); ``None`` if the wrapper changes.
        self._handle: object | None = (
            getattr(self._vad, "_vad", None) if _VAD_PROCESS is not None else None
        )
        # Frames of the right size go straight to the C VAD (decided once, not per frame).
        self._direct = self._handle is not None and _VAD_PROCESS is not None and _NATIVE_IS_LE
        self._process: Callable[[object, int, bytes, int], int] = _VAD_PROCESS or _no_process
        self._zero = bytes(self._frame_bytes)
        self._zero_run = 0
        """All-zero frames the VAD was given in a row (see the module docstring)."""

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame this VAD accepts (320 for 20 ms at 8 kHz)."""
        return self._frame_bytes

    def is_speech(self, frame_s16le: bytes) -> bool:
        """Whether the frame sounds like speech; ``False`` for a frame of the wrong size."""
        if len(frame_s16le) != self._frame_bytes:
            return False
        self._zero_run = 0  # (counted on ``speech_and_level``'s own path only)
        return bool(self._vad.is_speech(frame_s16le, self._sample_rate_hz))

    def analyze(self, frame_s16le: bytes) -> FrameAnalysis:
        """Speech decision and level (without DC offset) of one frame, for the detector."""
        speech, level = self.speech_and_level(frame_s16le)
        return FrameAnalysis(speech, level)

    def speech_and_level(self, frame_s16le: bytes) -> tuple[bool, float]:
        """``analyze`` without the result object (the per-frame path of a call).

        A frame of the right size in native order (all little-endian hosts)
        goes straight to the C VAD and ``audioop``: one RMS pass shared by the
        click test and the level, no copies.
        """
        if self._direct and len(frame_s16le) == self._frame_bytes:
            if frame_s16le == self._zero:  # digital silence (a non-zero frame fails at once)
                if self._zero_run >= SETTLED_ZERO_FRAMES:
                    return False, MIN_DBFS  # what the VAD at rest says; its state stays
                self._zero_run += 1
            elif self._zero_run:
                self._zero_run = 0
            speech = bool(
                self._process(self._handle, self._sample_rate_hz, frame_s16le, self._frame_samples)
            )
            pcm = frame_s16le
        else:
            speech = self.is_speech(frame_s16le)  # False for a frame of the wrong size
            pcm = _native(frame_s16le)
            if not pcm:
                return False, MIN_DBFS
        rms = audioop.rms(pcm, 2)  # one pass shared by the click test and the level
        if speech and rms > 0 and audioop.max(pcm, 2) > CLICK_CREST * rms:
            speech = False  # a click
        # An RMS of 1 or more reads -90.3 dBFS or more: no ``max`` with ``MIN_DBFS`` needed.
        if rms < _NO_DC_RMS:  # a quiet frame cannot carry an offset worth removing
            if not rms:
                return speech, MIN_DBFS
            return speech, 10.0 * math.log10(float(rms * rms) / _FULL_SCALE_2)
        if abs(audioop.avg(pcm, 2)) <= _DC_SAMPLES:  # ``_ac_dbfs``'s common case
            return speech, 10.0 * math.log10(float(rms * rms) / _FULL_SCALE_2)
        return speech, _ac_dbfs(pcm, rms)

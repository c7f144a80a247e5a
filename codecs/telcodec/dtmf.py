"""DTMF (dual-tone multi-frequency) tone generation and in-band detection.

Theory of operation
-------------------
A key press is the sum of one low-group ("row") and one high-group
("column") tone (ITU-T Q.23)::

              1209 Hz  1336 Hz  1477 Hz  1633 Hz
     697 Hz     1        2        3        A
     770 Hz     4        5        6        B
     852 Hz     7        8        9        C
     941 Hz     *        0        #        D

``generate`` writes digits as tone / gap pairs of s16le audio.

``DtmfDetector`` looks at the stream in blocks of 102 samples at 8 kHz
(12.75 ms, scaled with the sample rate). For each block it measures the
energy at the eight DTMF frequencies with a single-bin DFT at the exact
frequency (the Goertzel filter, evaluated for all blocks of a chunk at once
as one matrix product instead of a per-sample loop). The bin spacing of a
102-sample block (78 Hz) puts the neighbouring DTMF frequencies near nulls of
each other's response. A block is a *hit* for a key when all of these hold:

1. level: the strongest row and column tones are each at least
   ``min_tone_level_dbfs``;
2. twist: the row tone is at most ``max_twist_db`` louder, and at most
   ``max_reverse_twist_db`` quieter, than the column tone;
3. relative peak: each of the two exceeds every other tone of its group by
   ``min_relative_peak_db``;
4. purity: the two tones hold at least ``min_tone_energy_ratio`` of the
   block's total energy (rejects noise, speech and music, whose energy is
   spread over many frequencies).

Press and release are debounced as in spandsp: the held key changes only
when two consecutive blocks agree on a new classification (a key, or no key).
A digit is reported once, when its key becomes held; the same digit is
reported again only after a release (two blocks without it). Consequences:
a tone is reported if it covers two whole blocks, so every tone of 40 ms or
more is detected whatever its alignment, and tones shorter than two blocks
(25.5 ms) never are; a gap of 40 ms always registers as a release.

State kept across ``process`` calls: the samples of the unfinished block
(and a dangling odd byte), the previous block's classification and the held
key. Input is s16le mono of any chunk length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DTMF_COL_HZ",
    "DTMF_DIGITS",
    "DTMF_ROW_HZ",
    "DtmfDetector",
    "DtmfDetectorConfig",
    "generate",
]

DTMF_ROW_HZ: Final = (697.0, 770.0, 852.0, 941.0)
DTMF_COL_HZ: Final = (1209.0, 1336.0, 1477.0, 1633.0)
_KEYPAD: Final = ("123A", "456B", "789C", "*0#D")
DTMF_DIGITS: Final = "".join(_KEYPAD)

_FULL_SCALE: Final = 32767.0
_BLOCK_SAMPLES_AT_8K: Final = 102


def _key_position(digit: str) -> tuple[int, int]:
    for row, keys in enumerate(_KEYPAD):
        col = keys.find(digit.upper())
        if col >= 0 and len(digit) == 1:
            return row, col
    raise ValueError(f"not a DTMF digit: {digit!r} (expected one of {DTMF_DIGITS})")


def generate(
    digits: str,
    sample_rate_hz: int = 8000,
    tone_ms: int = 80,
    gap_ms: int = 80,
    level_dbfs: float = -10.0,
) -> bytes:
    """Render ``digits`` as DTMF, each as ``tone_ms`` of tone then ``gap_ms`` of silence.

    Args:
        digits: characters from ``0-9 * # A-D`` (lower-case a-d accepted).
        sample_rate_hz: output sample rate.
        tone_ms: duration of each tone.
        gap_ms: silence after each tone (also after the last one).
        level_dbfs: peak level of *each* of the two tones relative to a
            full-scale sine; the sum peaks 6 dB higher and is clipped to 16 bits.

    Returns:
        s16le mono audio.

    Raises:
        ValueError: a character is not a DTMF digit or a duration is negative.
    """
    if tone_ms < 0 or gap_ms < 0 or sample_rate_hz <= 0:
        raise ValueError("durations must be >= 0 and the sample rate positive")
    tone_samples = round(sample_rate_hz * tone_ms / 1000)
    gap = np.zeros(round(sample_rate_hz * gap_ms / 1000))
    amplitude = _FULL_SCALE * 10 ** (level_dbfs / 20)
    t = np.arange(tone_samples) / sample_rate_hz
    pieces = []
    for digit in digits:
        row, col = _key_position(digit)
        pair = np.sin(2 * np.pi * DTMF_ROW_HZ[row] * t) + np.sin(2 * np.pi * DTMF_COL_HZ[col] * t)
        pieces += [amplitude * pair, gap]
    if not pieces:
        return b""
    signal = np.clip(np.rint(np.concatenate(pieces)), -32768, 32767)
    return signal.astype("<i2").tobytes()


@dataclass(frozen=True, slots=True)
class DtmfDetectorConfig:
    """Thresholds of the per-block test (see the module docstring)."""

    min_tone_level_dbfs: float = -36.0
    """Minimum peak level of each tone, dB relative to a full-scale sine."""
    max_twist_db: float = 8.0
    """How much louder the row tone may be than the column tone, dB."""
    max_reverse_twist_db: float = 4.0
    """How much louder the column tone may be than the row tone, dB."""
    min_relative_peak_db: float = 6.0
    """Margin of each tone over the other tones of its group, dB."""
    min_tone_energy_ratio: float = 0.85
    """Fraction of the block's energy that the two tones must hold (0..1)."""


class DtmfDetector:
    """Detect DTMF digits in a stream of s16le audio.

    Args:
        sample_rate_hz: sample rate of the audio fed to ``process``.
        config: detection thresholds.
    """

    __slots__ = (
        "_block_samples",
        "_config",
        "_cos",
        "_held",
        "_last_hit",
        "_min_energy",
        "_pending",
        "_sin",
    )

    def __init__(
        self, sample_rate_hz: int = 8000, config: DtmfDetectorConfig | None = None
    ) -> None:
        if sample_rate_hz < 4000:
            raise ValueError(f"sample rate too low for DTMF: {sample_rate_hz} Hz")
        self._config = config or DtmfDetectorConfig()
        n = round(_BLOCK_SAMPLES_AT_8K * sample_rate_hz / 8000)
        self._block_samples = n
        phase = 2 * np.pi * np.outer(np.arange(n), DTMF_ROW_HZ + DTMF_COL_HZ) / sample_rate_hz
        self._cos = np.cos(phase)
        self._sin = np.sin(phase)
        # Energy (sum of squares over a block) of a sine at the minimum level.
        min_amplitude = _FULL_SCALE * 10 ** (self._config.min_tone_level_dbfs / 20)
        self._min_energy = n * min_amplitude**2 / 2
        self._pending = bytearray()
        self._last_hit: str | None = None
        self._held: str | None = None

    @property
    def block_samples(self) -> int:
        """Samples per analysis block (102 at 8 kHz)."""
        return self._block_samples

    def process(self, pcm_s16le: bytes) -> list[str]:
        """Feed audio of any length; return the digits whose press completed in it."""
        self._pending += pcm_s16le
        block_bytes = 2 * self._block_samples
        blocks = len(self._pending) // block_bytes
        if blocks == 0:
            return []
        x = np.frombuffer(self._pending, "<i2", count=blocks * self._block_samples)
        x = x.astype(np.float64).reshape(blocks, self._block_samples)
        del self._pending[: blocks * block_bytes]
        digits = []
        for hit in self._classify(x):
            if hit == self._last_hit and hit != self._held:
                self._held = hit
                if hit is not None:
                    digits.append(hit)
            self._last_hit = hit
        return digits

    def reset(self) -> None:
        """Forget buffered audio and any held key."""
        self._pending.clear()
        self._last_hit = self._held = None

    def _classify(self, x: npt.NDArray[np.float64]) -> list[str | None]:
        """Return the key each block shows, or None."""
        cfg = self._config
        re, im = x @ self._cos, x @ self._sin
        # 2|X|^2/N is the energy (sum of squares) a sinusoid at that frequency has.
        tone_energy = 2 * (re * re + im * im) / self._block_samples
        total_energy = np.einsum("ij,ij->i", x, x)
        rows, cols = tone_energy[:, :4], tone_energy[:, 4:]
        r, c = rows.argmax(axis=1), cols.argmax(axis=1)
        idx = np.arange(len(x))
        row_e, col_e = rows[idx, r], cols[idx, c]
        ok = (row_e >= self._min_energy) & (col_e >= self._min_energy)
        ok &= row_e <= col_e * 10 ** (cfg.max_twist_db / 10)
        ok &= col_e <= row_e * 10 ** (cfg.max_reverse_twist_db / 10)
        peak = 10 ** (cfg.min_relative_peak_db / 10)
        ok &= (rows * peak <= row_e[:, None]).sum(axis=1) == 3
        ok &= (cols * peak <= col_e[:, None]).sum(axis=1) == 3
        ok &= row_e + col_e >= cfg.min_tone_energy_ratio * total_energy
        return [_KEYPAD[r[i]][c[i]] if ok[i] else None for i in range(len(x))]

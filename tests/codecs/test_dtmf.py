"""DTMF generation and detection: exact digit strings, noise, chunking, talk-off."""

from __future__ import annotations

import random
import subprocess
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from telcodec import dtmf
from telcodec.resample import StreamResampler

FS_HZ = 8000
ALL_DIGITS = "0123456789*#ABCD"


def as_float(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, "<i2").astype(np.float64)


def to_pcm(x: npt.NDArray[np.float64]) -> bytes:
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


def add_white_noise(pcm: bytes, level_dbfs: float, snr_db: float, seed: int) -> bytes:
    """Add white noise at ``snr_db`` below the power of a tone pair at ``level_dbfs``."""
    tone_amplitude = 32767 * 10 ** (level_dbfs / 20)
    pair_power = tone_amplitude**2  # two sines, each A^2 / 2
    sigma = np.sqrt(pair_power / 10 ** (snr_db / 10))
    noise = np.random.default_rng(seed).normal(0.0, sigma, len(pcm) // 2)
    return to_pcm(as_float(pcm) + noise)


def detect_in_random_chunks(pcm: bytes, seed: int, max_bytes: int = 700) -> list[str]:
    detector, rng, digits, i = dtmf.DtmfDetector(), random.Random(seed), [], 0
    while i < len(pcm):
        n = rng.randint(0, max_bytes)  # odd sizes and empty chunks included
        digits += detector.process(pcm[i : i + n])
        i += n
    return digits


def speech_like(seconds: float, formants_hz: tuple[float, ...], seed: int) -> bytes:
    """Voiced-speech stand-in: harmonics of a wandering pitch under a formant envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(FS_HZ * seconds)) / FS_HZ
    a, b = rng.uniform(0.3, 1.5, 2)
    f0 = 150 + 70 * np.sin(2 * np.pi * 0.7 * a * t) + 30 * np.sin(2 * np.pi * 2.3 * b * t)
    phase = 2 * np.pi * np.cumsum(f0) / FS_HZ
    y = np.zeros_like(t)
    for k in range(1, 40):
        fk = k * f0
        gain = k**-0.5 * (sum(1 / (1 + ((fk - f) / 120) ** 2) for f in formants_hz) + 0.05)
        y += np.where(fk < 3800, gain, 0.0) * np.sin(k * phase)
    y *= 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)  # syllables
    return to_pcm(y / np.abs(y).max() * 20000)


# --- generation --------------------------------------------------------------


def test_generate_layout_and_frequencies() -> None:
    pcm = dtmf.generate("5", tone_ms=100, gap_ms=50, level_dbfs=-10)
    x = as_float(pcm)
    assert len(x) == 1200  # 100 ms tone + 50 ms gap at 8 kHz
    assert not x[800:].any()
    spectrum = np.abs(np.fft.rfft(x[:800]))
    peaks_hz = sorted(np.argsort(spectrum)[-2:] * FS_HZ / 800)
    assert peaks_hz == [770, 1340]  # 10 Hz resolution: 770 and 1336 Hz
    # Each tone peaks at -10 dBFS: the pair's peak is about 2 * 0.316 of full scale.
    assert np.abs(x).max() == pytest.approx(2 * 32767 * 10 ** (-10 / 20), rel=0.02)


def test_generate_rejects_non_digits_and_accepts_lower_case() -> None:
    with pytest.raises(ValueError, match="not a DTMF digit"):
        dtmf.generate("12x")
    assert dtmf.generate("a") == dtmf.generate("A")
    assert dtmf.generate("") == b""


def test_generate_at_other_rates() -> None:
    pcm = dtmf.generate("1", sample_rate_hz=16000, tone_ms=50, gap_ms=0)
    assert len(pcm) == 2 * 800


# --- detection ---------------------------------------------------------------


def test_every_digit_detected_exactly_once() -> None:
    assert dtmf.DtmfDetector().process(dtmf.generate(ALL_DIGITS)) == list(ALL_DIGITS)


@pytest.mark.parametrize("seed", range(4))
def test_random_digit_strings_in_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    digits = "".join(rng.choice(ALL_DIGITS) for _ in range(20))
    pcm = dtmf.generate(digits, tone_ms=rng.randint(45, 120), gap_ms=rng.randint(45, 120))
    assert detect_in_random_chunks(pcm, seed) == list(digits)


def test_repeated_digit_needs_a_release_between_presses() -> None:
    assert dtmf.DtmfDetector().process(dtmf.generate("1111")) == ["1"] * 4
    # One long press is one digit.
    assert dtmf.DtmfDetector().process(dtmf.generate("7", tone_ms=1000)) == ["7"]


def test_quiet_digits_at_minus_25_dbfs() -> None:
    pcm = dtmf.generate(ALL_DIGITS, level_dbfs=-25)
    assert detect_in_random_chunks(pcm, seed=9) == list(ALL_DIGITS)


@pytest.mark.parametrize("snr_db", [20, 15])
@pytest.mark.parametrize("seed", range(3))
def test_digits_in_white_noise(snr_db: int, seed: int) -> None:
    pcm = add_white_noise(dtmf.generate(ALL_DIGITS, level_dbfs=-25), -25, snr_db, seed)
    assert detect_in_random_chunks(pcm, seed) == list(ALL_DIGITS)


@pytest.mark.parametrize("offset_samples", [0, 17, 51, 90, 101])
def test_40_ms_tones_detected_at_any_alignment(offset_samples: int) -> None:
    pcm = bytes(2 * offset_samples) + dtmf.generate("159#", tone_ms=40, gap_ms=40)
    assert dtmf.DtmfDetector().process(pcm) == list("159#")


@pytest.mark.parametrize("offset_samples", [0, 30, 70])
def test_tones_shorter_than_two_blocks_are_ignored(offset_samples: int) -> None:
    pcm = bytes(2 * offset_samples) + dtmf.generate("123", tone_ms=15, gap_ms=60)
    assert dtmf.DtmfDetector().process(pcm) == []


def test_twist_limits() -> None:
    t = np.arange(800) / FS_HZ
    amp = 32767 * 10 ** (-15 / 20)

    def pair(row_db: float, col_db: float) -> bytes:
        row = amp * 10 ** (row_db / 20) * np.sin(2 * np.pi * 852 * t)
        col = amp * 10 ** (col_db / 20) * np.sin(2 * np.pi * 1477 * t)
        return to_pcm(row + col)

    assert dtmf.DtmfDetector().process(pair(0, -6)) == ["9"]  # 6 dB twist: accepted
    assert dtmf.DtmfDetector().process(pair(0, -12)) == []  # 12 dB twist: rejected
    assert dtmf.DtmfDetector().process(pair(-3, 0)) == ["9"]  # 3 dB reverse: accepted
    assert dtmf.DtmfDetector().process(pair(-8, 0)) == []  # 8 dB reverse: rejected


def test_detector_at_16k() -> None:
    pcm = dtmf.generate("2580", sample_rate_hz=16000)
    detector = dtmf.DtmfDetector(sample_rate_hz=16000)
    assert detector.block_samples == 204
    assert detector.process(pcm) == list("2580")


def test_reset_forgets_partial_press() -> None:
    pcm = dtmf.generate("4", tone_ms=500, gap_ms=0)
    block_bytes = 2 * 102
    # Two whole blocks of tone make a press...
    assert dtmf.DtmfDetector().process(pcm[: 2 * block_bytes]) == ["4"]
    # ...but not when the detector is reset between them.
    detector = dtmf.DtmfDetector()
    assert detector.process(pcm[:block_bytes]) == []
    detector.reset()
    assert detector.process(pcm[block_bytes : 2 * block_bytes]) == []
    assert detector.process(pcm[2 * block_bytes : 3 * block_bytes]) == ["4"]


# --- no false digits ---------------------------------------------------------


def test_no_digits_in_silence() -> None:
    assert dtmf.DtmfDetector().process(bytes(2 * FS_HZ * 3)) == []


@pytest.mark.parametrize("level_dbfs", [-40, -20, -6])
def test_no_digits_in_white_noise(level_dbfs: float) -> None:
    sigma = 32767 * 10 ** (level_dbfs / 20)
    noise = np.random.default_rng(int(-level_dbfs)).normal(0, sigma, FS_HZ * 10)
    assert detect_in_random_chunks(to_pcm(noise), seed=1) == []


@pytest.mark.parametrize("freq_hz", [1000.0, 697.0, 1209.0])
def test_no_digits_in_a_single_tone(freq_hz: float) -> None:
    t = np.arange(FS_HZ * 2) / FS_HZ
    assert dtmf.DtmfDetector().process(to_pcm(16000 * np.sin(2 * np.pi * freq_hz * t))) == []


def test_no_digits_in_a_frequency_sweep() -> None:
    t = np.arange(FS_HZ * 5) / FS_HZ
    f_hz = 300 + (3400 - 300) * t / 5  # linear chirp 300 -> 3400 Hz
    sweep = 16000 * np.sin(2 * np.pi * np.cumsum(f_hz) / FS_HZ)
    assert dtmf.DtmfDetector().process(to_pcm(sweep)) == []


VOWEL_FORMANTS_HZ = {
    "a": (730.0, 1090.0, 2440.0),
    "i": (270.0, 2290.0, 3010.0),
    "u": (300.0, 870.0, 2240.0),
    "e": (530.0, 1840.0, 2480.0),
    "o": (570.0, 840.0, 2410.0),
    "ae": (660.0, 1720.0, 2410.0),
}


@pytest.mark.parametrize("vowel", sorted(VOWEL_FORMANTS_HZ))
@pytest.mark.parametrize("seed", range(3))
def test_no_digits_in_speech_like_audio(vowel: str, seed: int) -> None:
    pcm = speech_like(10.0, VOWEL_FORMANTS_HZ[vowel], seed)
    assert detect_in_random_chunks(pcm, seed) == []


def test_digit_still_detected_after_speech() -> None:
    pcm = speech_like(2.0, VOWEL_FORMANTS_HZ["a"], 0) + dtmf.generate("8")
    assert dtmf.DtmfDetector().process(pcm) == ["8"]


@pytest.mark.needs("espeak-ng")
def test_no_digits_in_synthesized_speech(tmp_path: Path) -> None:
    wav_path = tmp_path / "speech.wav"
    text = (
        "Thank you for calling. Please say or enter your account number, "
        "or press one for sales and two for support. Seven, eight, nine, zero."
    )
    subprocess.run(["espeak-ng", "-w", str(wav_path), text], check=True, capture_output=True)
    with wave.open(str(wav_path)) as wav:
        rate_hz = wav.getframerate()
        pcm = wav.readframes(wav.getnframes())
    resampler = StreamResampler(rate_hz, FS_HZ)
    speech = resampler.process(pcm) + resampler.flush()
    assert len(speech) > 2 * FS_HZ * 3  # several seconds of real speech
    assert detect_in_random_chunks(speech, seed=4) == []
    # And a digit after it is still found.
    assert dtmf.DtmfDetector().process(speech + dtmf.generate("3")) == ["3"]

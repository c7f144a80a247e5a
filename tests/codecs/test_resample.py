"""StreamResampler: anti-aliasing, continuity across chunks, lengths, state."""

from __future__ import annotations

import math
import random

import numpy as np
import numpy.typing as npt
import pytest

from telcodec.resample import StreamResampler

DOWN_RATES_HZ = [16000, 22050, 24000, 32000, 44100, 48000]


def tone(freq_hz: float, rate_hz: int, seconds: float, amplitude: float) -> bytes:
    n = round(rate_hz * seconds)
    t = np.arange(n) / rate_hz
    return np.round(amplitude * np.sin(2 * np.pi * freq_hz * t)).astype("<i2").tobytes()


def samples(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, "<i2").astype(np.float64)


def rms(x: npt.NDArray[np.float64]) -> float:
    return float(np.sqrt(np.mean(x * x)))


def run_chunked(rs: StreamResampler, pcm: bytes, rng: random.Random, max_bytes: int) -> bytes:
    out, i = [], 0
    while i < len(pcm):
        n = rng.randint(0, max_bytes)  # odd sizes and empty chunks included
        out.append(rs.process(pcm[i : i + n]))
        i += n
    out.append(rs.flush())
    return b"".join(out)


def test_6khz_tone_at_24k_is_at_least_50_db_down_at_8k() -> None:
    pcm = tone(6000, 24000, 1.0, 16000)
    rs = StreamResampler(24000, 8000)
    out = samples(run_chunked(rs, pcm, random.Random(1), 960))
    steady = out[400:-400]  # away from the onset and the tail
    attenuation_db = 20 * math.log10(rms(samples(pcm)) / max(rms(steady), 1e-9))
    assert attenuation_db >= 50


@pytest.mark.parametrize("in_rate_hz", DOWN_RATES_HZ)
def test_passband_tone_survives_downsampling(in_rate_hz: int) -> None:
    amplitude = 10000.0
    out = samples(StreamResampler(in_rate_hz, 8000).process(tone(1000, in_rate_hz, 0.5, amplitude)))
    steady = out[400:-400]
    assert rms(steady) == pytest.approx(amplitude / math.sqrt(2), rel=0.02)


@pytest.mark.parametrize(
    ("in_rate_hz", "out_rate_hz"),
    [(r, 8000) for r in DOWN_RATES_HZ] + [(8000, 16000), (8000, 24000)],
)
@pytest.mark.parametrize("seed", [7, 8])
def test_random_chunks_are_continuous_and_length_matches(
    in_rate_hz: int, out_rate_hz: int, seed: int
) -> None:
    amplitude, freq_hz, seconds = 12000.0, 1000.0, 1.0
    pcm = tone(freq_hz, in_rate_hz, seconds, amplitude)
    out_pcm = run_chunked(StreamResampler(in_rate_hz, out_rate_hz), pcm, random.Random(seed), 2001)
    out = samples(out_pcm)

    expected_samples = len(pcm) // 2 * out_rate_hz / in_rate_hz
    assert abs(len(out) - expected_samples) <= 2

    # Max step of a sampled sine: 2*pi*f/fs*A (a 5 % margin for filter ripple).
    max_step = 2 * math.pi * freq_hz / out_rate_hz * amplitude * 1.05
    guard = out_rate_hz // 100  # skip 10 ms at each end: onset / tail transients
    steps = np.abs(np.diff(out[guard:-guard]))
    assert steps.max() <= max_step
    # And it is still the same tone, not silence.
    assert rms(out[guard:-guard]) == pytest.approx(amplitude / math.sqrt(2), rel=0.02)


def test_chunking_does_not_change_the_output() -> None:
    pcm = tone(440, 22050, 0.5, 8000) + tone(3000, 22050, 0.3, 8000)
    whole = StreamResampler(22050, 8000)
    reference = whole.process(pcm) + whole.flush()
    chunked = run_chunked(StreamResampler(22050, 8000), pcm, random.Random(3), 777)
    assert chunked == reference


def test_odd_byte_is_kept_for_the_next_chunk() -> None:
    pcm = tone(500, 16000, 0.1, 5000)
    rs = StreamResampler(16000, 8000)
    split = rs.process(pcm[:101]) + rs.process(pcm[101:]) + rs.flush()
    ref = StreamResampler(16000, 8000)
    assert split == ref.process(pcm) + ref.flush()


def test_identity_rate_is_pass_through_with_odd_bytes() -> None:
    rs = StreamResampler(8000, 8000)
    assert rs.is_pass_through
    assert rs.process(b"\x01\x02\x03") == b"\x01\x02"
    assert rs.process(b"\x04") == b"\x03\x04"
    assert rs.process(b"\x05") == b""
    assert rs.flush() == b""  # a lone half sample is dropped
    assert rs.process(b"\x06\x07") == b"\x06\x07"


def test_flush_rearms_for_the_next_utterance() -> None:
    first = tone(700, 24000, 0.2, 9000)
    second = tone(1300, 24000, 0.2, 9000)
    rs = StreamResampler(24000, 8000)
    rs.process(first)
    rs.flush()
    again = rs.process(second) + rs.flush()
    fresh = StreamResampler(24000, 8000)
    assert again == fresh.process(second) + fresh.flush()


def test_reset_drops_pending_audio() -> None:
    rs = StreamResampler(24000, 8000)
    rs.process(tone(700, 24000, 0.05, 9000) + b"\x01")  # also a dangling byte
    rs.reset()
    assert rs.flush() == b""
    second = tone(1300, 24000, 0.2, 9000)
    fresh = StreamResampler(24000, 8000)
    assert rs.process(second) + rs.flush() == fresh.process(second) + fresh.flush()


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        StreamResampler(0, 8000)
    with pytest.raises(ValueError):
        StreamResampler(24000, 8000, quality="best")
    assert StreamResampler(24000, 8000, quality="qq").out_rate_hz == 8000


def _noise(rate_hz: int, seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return (
        np.clip(rng.normal(0, 4000, round(rate_hz * seconds)), -32768, 32767)
        .astype("<i2")
        .tobytes()
    )


@pytest.mark.parametrize("quality", ["LQ", "MQ", "HQ", "VHQ"])
@pytest.mark.parametrize(
    ("in_rate_hz", "out_rate_hz"), [(24000, 8000), (44100, 8000), (48000, 16000), (16000, 8000)]
)
@pytest.mark.parametrize("chunk_ms", [120, 10])
def test_release_hands_out_held_audio_and_the_stream_goes_on_unchanged(
    in_rate_hz: int, out_rate_hz: int, quality: str, chunk_ms: int
) -> None:
    """A turn about to run dry gets what the filter holds back; the rest of the
    stream is the unreleased stream's output, within rounding, and as long.

    120 ms pieces, as a provider sends words; 10 ms ones are shorter than the
    input history a release primes the restarted filter with (it is kept
    across several chunks then)."""
    pcm = _noise(in_rate_hz, 1.0, seed=in_rate_hz + len(quality))
    chunk = in_rate_hz * chunk_ms // 1000 * 2
    whole = StreamResampler(in_rate_hz, out_rate_hz, quality)
    reference = b"".join(whole.process(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk))
    reference += whole.flush()
    rs = StreamResampler(in_rate_hz, out_rate_hz, quality)
    out, released = [], 0
    for i in range(0, len(pcm), chunk):
        out.append(rs.process(pcm[i : i + chunk]))
        got = rs.release()
        released += len(got)
        out.append(got)
    out.append(rs.flush())
    joined = samples(b"".join(out))
    # (48 -> 16 kHz releases its blocks sooner: there it may hold no more than the 12 ms)
    assert released > 0 or out_rate_hz != 8000
    assert len(joined) == len(samples(reference))
    assert np.max(np.abs(joined - samples(reference))) <= 1.0


def test_release_gives_a_first_chunk_all_but_the_last_12_ms() -> None:
    rs = StreamResampler(24000, 8000, "HQ")
    first = rs.process(_noise(24000, 0.12, seed=1))  # a turn's first word, 120 ms
    assert len(first) // 2 < 8 * 80  # soxr's block latency: about half of it comes out
    more = rs.release()
    assert (len(first) + len(more)) // 2 == 8 * (120 - 12)
    assert rs.release() == b""  # nothing more held beyond the kept-back 12 ms
    assert StreamResampler(8000, 8000).release() == b""  # pass-through: nothing held


def test_flush_and_reset_forget_a_release() -> None:
    pcm = _noise(24000, 0.3, seed=2)
    fresh = StreamResampler(24000, 8000)
    expected = fresh.process(pcm) + fresh.flush()
    rs = StreamResampler(24000, 8000)
    rs.process(_noise(24000, 0.2, seed=3))
    rs.release()
    rs.flush()  # a new utterance: nothing of the release is left to drop or count
    assert rs.process(pcm) + rs.flush() == expected
    rs.process(_noise(24000, 0.2, seed=4))
    rs.release()
    rs.reset()
    assert rs.process(pcm) + rs.flush() == expected


def _tones(rate_hz: int, seconds: float) -> bytes:
    """A band-limited stand-in for speech: four tones inside the telephone band."""
    t = np.arange(round(rate_hz * seconds)) / rate_hz
    x = sum(3000 * np.sin(2 * np.pi * f * t + f) for f in (220, 470, 1130, 2300))
    return np.round(x).astype("<i2").tobytes()


@pytest.mark.parametrize("short_ms", [0, 2, 5])
def test_release_keeps_back_less_when_the_caller_needs_more(short_ms: int) -> None:
    """``release(least)``: a caller that needs more than the filter holds beyond its
    usual 12 ms gets exactly ``least`` (a shorter tail kept back), and the stream goes
    on as long as the unreleased one, off only near the joins: by under 20 % of the
    signal's RMS with nothing kept back (next to a join; a release every 40 ms, far
    more often than a turn runs dry), 1 % with 2 ms, 0.2 % with 5 ms (G.711's own
    error is ~2-3 %)."""
    pcm = _tones(24000, 1.0)
    whole = StreamResampler(24000, 8000)
    reference = samples(whole.process(pcm) + whole.flush())
    rs = StreamResampler(24000, 8000)
    out, step, shortened = [], 24000 // 25 * 2, 0
    for i in range(0, len(pcm), step):
        out.append(rs.process(pcm[i : i + step]))
        held = min(i + step, len(pcm)) // 2 // 3 - sum(len(x) for x in out) // 2
        least = held - 8 * short_ms
        if least <= 0:
            continue
        got = rs.release(least)
        out.append(got)
        if held - 96 < least:  # more than it hands out beyond its usual 12 ms
            assert len(got) // 2 == least
            shortened += 1
        else:
            assert len(got) // 2 == held - 96
    out.append(rs.flush())
    joined = samples(b"".join(out))
    assert shortened > 5
    assert len(joined) == len(reference)
    worst = np.max(np.abs(joined - reference)) / rms(reference)
    assert worst < {0: 0.2, 2: 0.01, 5: 0.002}[short_ms]


def test_release_gives_nothing_when_it_holds_less_than_the_caller_needs() -> None:
    rs = StreamResampler(24000, 8000)
    out = rs.process(_tones(24000, 0.05))
    held = 8 * 50 - len(out) // 2
    assert rs.release(held + 1) == b""
    got = rs.release(held)
    assert len(got) // 2 == held  # all of it: nothing kept back


@pytest.mark.parametrize("in_rate_hz", [24000, 44100])
def test_parts_give_what_the_joined_parts_give(in_rate_hz: int) -> None:
    """``process_parts``: the same output as ``process`` of the parts joined, views
    included; odd-sized parts (and a byte left over) take the joined path."""
    pcm = _noise(in_rate_hz, 1.0, seed=5)
    rng = random.Random(in_rate_hz)
    joined_rs = StreamResampler(in_rate_hz, 8000, "HQ")
    parts_rs = StreamResampler(in_rate_hz, 8000, "HQ")
    want, got = [], []
    i = 0
    while i < len(pcm):
        cuts = sorted(rng.randint(0, 4000) for _ in range(rng.randint(1, 4)))
        parts: list[bytes | memoryview] = []
        for a, b in zip([0, *cuts], [*cuts, cuts[-1] + rng.randint(0, 3000)], strict=True):
            piece = pcm[i + a : i + b]
            parts.append(memoryview(piece) if a % 3 else piece)
        i += sum(len(p) for p in parts)
        want.append(joined_rs.process(b"".join(parts)))
        got.append(parts_rs.process_parts(parts))
        if len(want) % 7 == 0:
            want.append(joined_rs.release())
            got.append(parts_rs.release())
    want.append(joined_rs.flush())
    got.append(parts_rs.flush())
    assert got == want
    assert sum(map(len, got)) > 0

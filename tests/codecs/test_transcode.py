"""ToTelephony / FromTelephony pipelines."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from telcodec import g711
from telcodec.transcode import Encoding, FromTelephony, ToTelephony


def _same(pcm: bytes) -> bytes:
    return pcm


DECODE: dict[str, Callable[[bytes], bytes]] = {
    "mulaw": g711.ulaw_decode,
    "alaw": g711.alaw_decode,
    "pcm_s16le": _same,
}
ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "mulaw": g711.ulaw_encode,
    "alaw": g711.alaw_encode,
    "pcm_s16le": _same,
}


def tone(freq_hz: float, rate_hz: int, seconds: float, amplitude: float) -> bytes:
    t = np.arange(round(rate_hz * seconds)) / rate_hz
    return np.round(amplitude * np.sin(2 * np.pi * freq_hz * t)).astype("<i2").tobytes()


def as_float(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, "<i2").astype(np.float64)


def peak_frequency_hz(x: npt.NDArray[np.float64], rate_hz: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate_hz / len(x))


def feed(pipe: ToTelephony, data: bytes, rng: random.Random, max_bytes: int) -> list[bytes]:
    frames, i = [], 0
    while i < len(data):
        n = rng.randint(0, max_bytes)
        frames += pipe.push(data[i : i + n])
        i += n
    return frames + pipe.flush()


@pytest.mark.parametrize(
    ("encoding", "silence"),
    [("mulaw", b"\xff"), ("alaw", b"\xd5"), ("pcm_s16le", b"\x00")],
)
def test_pass_through_only_cuts_frames_and_pads_with_silence(
    encoding: Encoding, silence: bytes
) -> None:
    rng = random.Random(11)
    data = rng.randbytes(5_000)
    pipe = ToTelephony(encoding, 8000, encoding)
    assert pipe.is_pass_through
    frame_bytes = 320 if encoding == "pcm_s16le" else 160
    assert pipe.frame_bytes == frame_bytes
    frames = feed(pipe, data, rng, 333)
    assert all(len(f) == frame_bytes for f in frames)
    assert len(frames) == math.ceil(len(data) / frame_bytes)
    padding = len(frames) * frame_bytes - len(data)
    assert b"".join(frames) == data + silence * padding


def test_mulaw_to_alaw_transcodes_at_8k() -> None:
    ulaw = g711.ulaw_encode(tone(1000, 8000, 0.1, 8000))  # 800 bytes = 5 frames
    pipe = ToTelephony("mulaw", 8000, "alaw")
    assert not pipe.is_pass_through
    frames = pipe.push(ulaw[:123]) + pipe.push(ulaw[123:]) + pipe.flush()
    assert frames == [g711.ulaw_to_alaw(ulaw[i : i + 160]) for i in range(0, 800, 160)]
    # The audio is the same tone within one A-law step.
    diff = as_float(g711.alaw_decode(b"".join(frames))) - as_float(g711.ulaw_decode(ulaw))
    assert np.abs(diff).max() <= 256


def test_alaw_to_mulaw_and_g711_to_linear_at_8k() -> None:
    alaw = g711.alaw_encode(tone(600, 8000, 0.04, 5000))  # 2 frames
    assert ToTelephony("alaw", 8000, "mulaw").push(alaw) == [
        g711.alaw_to_ulaw(alaw[:160]),
        g711.alaw_to_ulaw(alaw[160:]),
    ]
    linear = ToTelephony("alaw", 8000, "pcm_s16le").push(alaw)
    assert linear == [g711.alaw_decode(alaw[:160]), g711.alaw_decode(alaw[160:])]


def test_linear_8k_to_mulaw_handles_odd_chunks() -> None:
    pcm = tone(1000, 8000, 0.06, 9000)  # 3 frames
    pipe = ToTelephony("pcm_s16le", 8000, "mulaw")
    frames = pipe.push(pcm[:1]) + pipe.push(pcm[1:333]) + pipe.push(pcm[333:]) + pipe.flush()
    assert frames == [g711.ulaw_encode(pcm[i : i + 320]) for i in range(0, 960, 320)]


@pytest.mark.parametrize("in_rate_hz", [16000, 22050, 24000, 44100, 48000])
@pytest.mark.parametrize("out_encoding", ["mulaw", "alaw", "pcm_s16le"])
def test_provider_pcm_to_telephony_frames(in_rate_hz: int, out_encoding: Encoding) -> None:
    seconds = 0.7
    pcm = tone(1000, in_rate_hz, seconds, 10000)
    rng = random.Random(in_rate_hz)
    frames = feed(ToTelephony("pcm_s16le", in_rate_hz, out_encoding), pcm, rng, 1500)
    frame_bytes = 320 if out_encoding == "pcm_s16le" else 160
    assert all(len(f) == frame_bytes for f in frames)
    expected_samples = len(pcm) // 2 * 8000 / in_rate_hz
    # Output length is in_samples * ratio within 2 samples, padded to whole frames.
    assert math.ceil((expected_samples - 2) / 160) <= len(frames)
    assert len(frames) <= math.ceil((expected_samples + 2) / 160)
    decoded = as_float(DECODE[out_encoding](b"".join(frames)))
    steady = decoded[200:4000]
    assert peak_frequency_hz(steady, 8000) == pytest.approx(1000, abs=8000 / len(steady) + 1)
    assert np.sqrt(np.mean(steady**2)) == pytest.approx(10000 / math.sqrt(2), rel=0.03)


def test_chunking_does_not_change_frames() -> None:
    pcm = tone(700, 24000, 0.5, 7000) + tone(2500, 24000, 0.5, 7000)
    one = ToTelephony("pcm_s16le", 24000, "mulaw")
    reference = one.push(pcm) + one.flush()
    chunked = feed(ToTelephony("pcm_s16le", 24000, "mulaw"), pcm, random.Random(5), 999)
    assert chunked == reference


def test_aliasing_tone_is_removed_on_the_resampling_path() -> None:
    pipe = ToTelephony("pcm_s16le", 24000, "mulaw")
    pcm = tone(6000, 24000, 0.5, 16000)
    out = as_float(g711.ulaw_decode(b"".join(pipe.push(pcm) + pipe.flush())))
    in_rms = float(np.sqrt(np.mean(as_float(pcm) ** 2)))
    out_rms = float(np.sqrt(np.mean(out[200:-200] ** 2)))
    assert out_rms < in_rms * 10 ** (-50 / 20)


def test_mulaw_at_16k_is_decoded_resampled_and_reencoded() -> None:
    ulaw = g711.ulaw_encode(tone(1000, 16000, 0.5, 9000))
    frames = ToTelephony("mulaw", 16000, "mulaw").push(ulaw)
    decoded = as_float(g711.ulaw_decode(b"".join(frames)))[200:]
    assert peak_frequency_hz(decoded, 8000) == pytest.approx(1000, abs=10)


def test_reset_drops_buffered_audio_and_starts_clean() -> None:
    first = tone(500, 24000, 0.3, 9000)
    second = tone(1500, 24000, 0.3, 9000)
    pipe = ToTelephony("pcm_s16le", 24000, "alaw")
    pipe.push(first + b"\x01")
    pipe.reset()
    after = pipe.push(second) + pipe.flush()
    fresh = ToTelephony("pcm_s16le", 24000, "alaw")
    assert after == fresh.push(second) + fresh.flush()


def test_flush_rearms_for_the_next_utterance() -> None:
    utterance = tone(800, 16000, 0.25, 9000)
    pipe = ToTelephony("pcm_s16le", 16000, "mulaw")
    first = pipe.push(utterance) + pipe.flush()
    second = pipe.push(utterance) + pipe.flush()
    assert first == second
    assert pipe.flush() == []


def test_flush_pads_last_frame_with_encoding_silence() -> None:
    pipe = ToTelephony("mulaw", 8000, "alaw")
    assert pipe.push(b"\xff" * 10) == []
    assert pipe.flush() == [b"\xd5" * 160]


def test_unknown_encoding_rejected() -> None:
    with pytest.raises(ValueError, match="unknown encoding"):
        ToTelephony("opus", 48000, "mulaw")  # type: ignore[arg-type]


@pytest.mark.parametrize("out_rate_hz", [16000, 24000])
@pytest.mark.parametrize("in_encoding", ["mulaw", "alaw", "pcm_s16le"])
def test_from_telephony_upsamples_for_voice_backends(
    in_encoding: Encoding, out_rate_hz: int
) -> None:
    wire = ENCODE[in_encoding](tone(440, 8000, 0.5, 8000))
    pipe = FromTelephony(in_encoding, out_rate_hz)
    assert pipe.out_rate_hz == out_rate_hz
    out = b"".join(pipe.push(wire[i : i + 161]) for i in range(0, len(wire), 161)) + pipe.flush()
    samples = len(wire) // (2 if in_encoding == "pcm_s16le" else 1)
    assert abs(len(out) // 2 - samples * out_rate_hz / 8000) <= 2
    x = as_float(out)[out_rate_hz // 50 : -out_rate_hz // 50]
    assert peak_frequency_hz(x, out_rate_hz) == pytest.approx(440, abs=out_rate_hz / len(x) + 1)
    assert np.sqrt(np.mean(x**2)) == pytest.approx(8000 / math.sqrt(2), rel=0.03)


def test_from_telephony_reset() -> None:
    wire = g711.ulaw_encode(tone(440, 8000, 0.1, 8000))
    pipe = FromTelephony("mulaw", 16000)
    pipe.push(wire)
    pipe.reset()
    assert pipe.flush() == b""


@pytest.mark.parametrize(
    ("in_encoding", "in_rate_hz", "out_encoding"),
    [
        ("pcm_s16le", 24000, "mulaw"),
        ("pcm_s16le", 16000, "alaw"),
        ("mulaw", 16000, "mulaw"),
        ("mulaw", 8000, "mulaw"),
        ("alaw", 8000, "mulaw"),
    ],
)
def test_push_parts_gives_the_frames_of_the_joined_parts(
    in_encoding: Encoding, in_rate_hz: int, out_encoding: Encoding
) -> None:
    rng = random.Random(in_rate_hz)
    audio = bytes(rng.randrange(256) for _ in range(in_rate_hz))  # 0.5-1 s of any encoding
    joined = ToTelephony(in_encoding, in_rate_hz, out_encoding)
    parted = ToTelephony(in_encoding, in_rate_hz, out_encoding)
    want: list[bytes] = []
    got: list[bytes] = []
    for i in range(0, len(audio), 2400):
        piece = audio[i : i + 2400]
        parts: list[bytes | memoryview] = [piece[:1000], memoryview(piece)[1000:]]
        want += joined.push(piece)
        got += parted.push_parts(parts)
    want += joined.flush()
    got += parted.flush()
    assert got == want and len(got) > 10

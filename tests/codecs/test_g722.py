"""G.722 through PyAV: frame sizes, tones round-tripped, silence, per-stream state."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from telcodec import g722
from telcodec.resample import StreamResampler

DELAY_SAMPLES = 22
"""The codec's delay, end to end (QMF analysis and synthesis)."""


def _tone(hz: float, frames: int, amplitude: float = 8000.0) -> npt.NDArray[np.int16]:
    t = np.arange(frames * g722.FRAME_SAMPLES) / g722.SAMPLE_RATE_HZ
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def _round_trip(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    encoder, decoder = g722.G722Encoder(), g722.G722Decoder()
    data = pcm.astype("<i2").tobytes()
    out = b"".join(
        decoder.decode(encoder.encode(data[i : i + g722.FRAME_BYTES]))
        for i in range(0, len(data), g722.FRAME_BYTES)
    )
    return np.frombuffer(out, dtype="<i2")


def _rms(x: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def _peak_hz(x: npt.NDArray[np.int16]) -> float:
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / g722.SAMPLE_RATE_HZ)[int(spectrum.argmax())])


def _snr_db(sent: npt.NDArray[np.int16], heard: npt.NDArray[np.int16]) -> float:
    """Signal to error of ``heard`` against ``sent``, the codec's delay taken out,
    over the second half (the ADPCM predictors have converged)."""
    n = len(sent) - DELAY_SAMPLES
    a = sent[:n].astype(np.float64)[n // 2 :]
    b = heard[DELAY_SAMPLES:].astype(np.float64)[n // 2 :]
    return float(10 * np.log10(np.sum(a**2) / np.sum((a - b) ** 2)))


def test_frame_sizes() -> None:
    encoder, decoder = g722.G722Encoder(), g722.G722Decoder()
    assert (g722.FRAME_BYTES, g722.PAYLOAD_BYTES, g722.RTP_CLOCK_RATE_HZ) == (640, 160, 8000)
    payload = encoder.encode(bytes(640))
    assert len(payload) == 160
    assert len(decoder.decode(payload)) == 640
    three = encoder.encode(bytes(3 * 640))
    assert len(three) == 480
    assert len(decoder.decode(three)) == 3 * 640
    assert decoder.decode(b"") == b""
    assert encoder.encode(b"") == b""


@pytest.mark.parametrize("size", [1, 320, 639, 641, 1000])
def test_partial_frames_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match="640"):
        g722.G722Encoder().encode(bytes(size))


def test_1khz_tone_round_trip() -> None:
    sent = _tone(1000, 50)
    heard = _round_trip(sent)
    assert len(heard) == len(sent)
    assert _peak_hz(heard[1000:]) == pytest.approx(1000, abs=60)
    assert _rms(heard[1000:]) == pytest.approx(_rms(sent[1000:]), rel=0.1)
    assert _snr_db(sent, heard) > 20


def test_6khz_tone_is_wideband() -> None:
    """6 kHz is above the 4 kHz Nyquist limit of 8 kHz telephony: G.722 carries it,
    an 8 kHz pipeline (down to 8 kHz and back up) cannot."""
    sent = _tone(6000, 50)
    heard = _round_trip(sent)
    assert _peak_hz(heard[1000:]) == pytest.approx(6000, abs=60)
    assert _rms(heard[1000:]) == pytest.approx(_rms(sent[1000:]), rel=0.25)
    down, up = StreamResampler(16000, 8000), StreamResampler(8000, 16000)
    narrow = up.process(down.process(sent.tobytes()) + down.flush()) + up.flush()
    narrow_rms = _rms(np.frombuffer(narrow, dtype="<i2")[1000:-1000])
    assert narrow_rms < _rms(sent) / 100  # more than 40 dB down: gone
    assert _rms(heard[1000:]) > 50 * narrow_rms


def test_silence_stays_silent() -> None:
    encoder, decoder = g722.G722Encoder(), g722.G722Decoder()
    payloads = [encoder.encode_silence() for _ in range(10)]
    assert all(len(p) == 160 for p in payloads)
    heard = np.frombuffer(b"".join(decoder.decode(p) for p in payloads), dtype="<i2")
    assert int(np.abs(heard).max()) <= 8
    # and silence after a tone settles to an idle pattern more than 40 dB below it
    # (ADPCM's idle channel is not exact zeros: about -60 dBFS here)
    encoder.encode(_tone(1000, 5).tobytes())
    tail = b"".join(decoder.decode(encoder.encode_silence()) for _ in range(10))
    assert _rms(np.frombuffer(tail, dtype="<i2")[-320:]) < _rms(_tone(1000, 1)) / 100


def test_state_carries_across_frames() -> None:
    """Frame by frame is the same stream as all at once; a fresh codec per frame is not."""
    data = _tone(1000, 10).tobytes()
    whole = g722.G722Encoder().encode(data)
    encoder = g722.G722Encoder()
    by_frame = b"".join(encoder.encode(data[i : i + 640]) for i in range(0, len(data), 640))
    assert by_frame == whole
    fresh = b"".join(g722.G722Encoder().encode(data[i : i + 640]) for i in range(0, len(data), 640))
    assert fresh != whole  # ADPCM is stateful: each frame depends on the ones before
    assert fresh[:160] == whole[:160]

    decoded_whole = g722.G722Decoder().decode(whole)
    decoder = g722.G722Decoder()
    decoded = b"".join(decoder.decode(whole[i : i + 160]) for i in range(0, len(whole), 160))
    assert decoded == decoded_whole


def test_streams_are_independent_and_deterministic() -> None:
    """Two encoders interleaved give what each gives alone (no shared state)."""
    a, b = _tone(1000, 5).tobytes(), _tone(3000, 5).tobytes()
    alone_a, alone_b = g722.G722Encoder().encode(a), g722.G722Encoder().encode(b)
    ea, eb = g722.G722Encoder(), g722.G722Encoder()
    mixed_a = mixed_b = b""
    for i in range(0, len(a), 640):
        mixed_a += ea.encode(a[i : i + 640])
        mixed_b += eb.encode(b[i : i + 640])
    assert (mixed_a, mixed_b) == (alone_a, alone_b)

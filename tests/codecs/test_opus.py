"""Opus through PyAV's libopus: packet per frame, tones round-tripped, loss, per-stream state."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from telcodec import opus


def _tone(hz: float, frames: int, amplitude: float = 8000.0) -> npt.NDArray[np.int16]:
    t = np.arange(frames * opus.FRAME_SAMPLES) / opus.SAMPLE_RATE_HZ
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def _frames(pcm: npt.NDArray[np.int16]) -> list[bytes]:
    data = pcm.astype("<i2").tobytes()
    return [data[i : i + opus.FRAME_BYTES] for i in range(0, len(data), opus.FRAME_BYTES)]


def _packets(pcm: npt.NDArray[np.int16], encoder: opus.OpusEncoder | None = None) -> list[bytes]:
    encoder = encoder or opus.OpusEncoder()
    return [encoder.encode(frame) for frame in _frames(pcm)]


def _decode(packets: list[bytes | None]) -> npt.NDArray[np.int16]:
    decoder = opus.OpusDecoder()
    out = [bytes(opus.FRAME_BYTES) if p is None else decoder.decode(p) for p in packets]
    return np.frombuffer(b"".join(out), dtype="<i2")


def _rms(x: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def _peak_hz(x: npt.NDArray[np.int16]) -> float:
    spectrum = np.abs(np.fft.rfft(x.astype(np.float64) * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / opus.SAMPLE_RATE_HZ)[int(spectrum.argmax())])


def test_constants() -> None:
    assert opus.FRAME_BYTES == 640
    assert opus.RTP_CLOCK_RATE_HZ == 48000
    assert opus.RTP_FRAME_TICKS == opus.RTP_CLOCK_RATE_HZ // 50


def test_one_variable_size_packet_per_frame() -> None:
    packets = _packets(_tone(440, 25))
    assert len(packets) == 25
    assert all(0 < len(p) < 400 for p in packets)
    assert len({len(p) for p in packets}) > 1  # variable bit rate


def test_every_decode_is_a_whole_frame() -> None:
    decoder = opus.OpusDecoder()
    for packet in _packets(_tone(440, 10)):
        assert len(decoder.decode(packet)) == opus.FRAME_BYTES


@pytest.mark.parametrize("hz", [440.0, 1000.0, 3000.0])
def test_tone_round_trip_is_recognisable(hz: float) -> None:
    out = _decode(list(_packets(_tone(hz, 50))))
    steady = out[opus.FRAME_SAMPLES * 10 :]
    assert abs(_peak_hz(steady) - hz) < 30
    assert _rms(steady) > 0.5 * _rms(_tone(hz, 40))


def test_6khz_survives_at_16khz() -> None:
    """Wideband: a 6 kHz tone (gone in G.711's 4 kHz) comes back."""
    out = _decode(list(_packets(_tone(6000, 50))))
    steady = out[opus.FRAME_SAMPLES * 10 :]
    assert abs(_peak_hz(steady) - 6000) < 50
    assert _rms(steady) > 0.3 * _rms(_tone(6000, 40))


def test_narrowband_peer_gets_no_6khz() -> None:
    """A peer's maxplaybackrate=8000 makes the encoder code narrowband audio."""
    narrow = opus.OpusEncoder(max_playback_rate_hz=8000)
    out = _decode(list(_packets(_tone(6000, 50), narrow)))
    assert _rms(out[opus.FRAME_SAMPLES * 10 :]) < 0.1 * _rms(_tone(6000, 40))


def test_decoding_goes_on_after_a_lost_packet() -> None:
    packets: list[bytes | None] = list(_packets(_tone(1000, 50)))
    packets[20] = None  # lost: the leg plays a silence frame instead
    decoder = opus.OpusDecoder()
    out = []
    for p in packets:
        out.append(bytes(opus.FRAME_BYTES) if p is None else decoder.decode(p))
    assert all(len(frame) == opus.FRAME_BYTES for frame in out)
    after = np.frombuffer(b"".join(out[25:]), dtype="<i2")
    assert abs(_peak_hz(after) - 1000) < 30
    assert _rms(after) > 0.5 * _rms(_tone(1000, 25))


def test_a_corrupt_packet_decodes_to_nothing_and_decoding_goes_on() -> None:
    decoder = opus.OpusDecoder()
    packets = _packets(_tone(1000, 30))
    for p in packets[:10]:
        decoder.decode(p)
    decoder.decode(b"\xff\xff\xff")  # code 3, no frame count: invalid
    out = b"".join(decoder.decode(p) for p in packets[10:])
    assert len(out) == 20 * opus.FRAME_BYTES
    assert _rms(np.frombuffer(out[opus.FRAME_BYTES * 5 :], dtype="<i2")) > 2000
    assert decoder.decode(b"") == b""


def test_silence_is_silence() -> None:
    encoder, decoder = opus.OpusEncoder(), opus.OpusDecoder()
    out = b"".join(decoder.decode(encoder.encode_silence()) for _ in range(10))
    assert _rms(np.frombuffer(out, dtype="<i2")) < 10


def test_a_stereo_packet_decodes_to_mono() -> None:
    from fractions import Fraction

    from av import AudioFrame, CodecContext

    context = CodecContext.create("libopus", "w")
    context.format, context.layout, context.sample_rate = "s16", "stereo", 48000
    context.time_base = Fraction(1, 48000)
    t = np.arange(960) / 48000
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    decoder = opus.OpusDecoder()
    out = b""
    for n in range(10):
        frame = AudioFrame.from_ndarray(
            np.repeat(tone, 2).reshape(1, 1920), format="s16", layout="stereo"
        )
        frame.sample_rate, frame.pts = 48000, n * 960
        for packet in context.encode(frame):
            out += decoder.decode(bytes(packet))
    assert len(out) % opus.FRAME_BYTES == 0 and len(out) >= 8 * opus.FRAME_BYTES
    assert _rms(np.frombuffer(out[-4 * opus.FRAME_BYTES :], dtype="<i2")) > 2000


def test_encode_wants_one_whole_frame() -> None:
    encoder = opus.OpusEncoder()
    with pytest.raises(ValueError):
        encoder.encode(bytes(opus.FRAME_BYTES - 2))
    with pytest.raises(ValueError):
        encoder.encode(bytes(opus.FRAME_BYTES * 2))


def test_fec_option_still_encodes() -> None:
    out = _decode(list(_packets(_tone(1000, 30), opus.OpusEncoder(fec=True))))
    assert abs(_peak_hz(out[opus.FRAME_SAMPLES * 10 :]) - 1000) < 30


def test_a_silent_stretch_is_primed_through_the_encoder_then_repeated() -> None:
    encoder, decoder = opus.OpusEncoder(), opus.OpusDecoder()
    speech = _packets(_tone(440, 10), encoder)
    silence = [encoder.encode_silence() for _ in range(20)]
    # the first frames after the turn go through the encoder: its tail decays
    assert len(set(silence[: opus.SILENCE_PRIMING_FRAMES])) > 1
    assert all(
        p is silence[opus.SILENCE_PRIMING_FRAMES - 1]
        for p in silence[opus.SILENCE_PRIMING_FRAMES :]
    )
    after = _packets(_tone(440, 20), encoder)  # encode() starts a new stretch
    assert encoder.encode_silence() is not silence[-1]
    out = [decoder.decode(p) for p in speech + silence + after]
    assert _rms(np.frombuffer(b"".join(out[15:30]), dtype="<i2")) < 10  # silence decoded
    resumed = np.frombuffer(b"".join(out[35:]), dtype="<i2")
    assert abs(_peak_hz(resumed) - 440) < 30 and _rms(resumed) > 0.5 * _rms(_tone(440, 15))

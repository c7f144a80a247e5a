"""The caller's options: DTMF and --speak specs, WAV conversion, the uplink, bad targets."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import pytest

from bridge.cli import build_parser
from bridge.control.report import level_dbfs
from bridge.io.caller import (
    CallerError,
    SpeakClip,
    Uplink,
    load_wav_8k_mono,
    options_from_args,
    parse_dtmf,
    run_caller,
)


def write_tone_wav(
    path: Path, rate_hz: int, width: int, channels: int, seconds: float, amplitude: float = 0.5
) -> None:
    n = round(rate_hz * seconds)
    x = amplitude * np.sin(2 * math.pi * 440.0 * np.arange(n) / rate_hz)
    if width == 1:
        data = np.round(x * 127 + 128).astype(np.uint8).tobytes()
        frames = np.frombuffer(data, np.uint8).repeat(channels).tobytes()
    else:
        full = np.round(x * (2 ** (8 * width - 1) - 1)).astype(np.int64)
        samples = full.repeat(channels)
        data = b"".join(int(v).to_bytes(width, "little", signed=True) for v in samples)
        frames = data
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate_hz)
        wav.writeframes(frames)


@pytest.mark.parametrize(
    ("rate_hz", "width", "channels"),
    [(8000, 2, 1), (16000, 2, 2), (22050, 1, 1), (48000, 3, 2), (44100, 4, 1)],
)
def test_any_pcm_wav_becomes_8khz_mono_at_the_same_level(
    tmp_path: Path, rate_hz: int, width: int, channels: int
) -> None:
    path = tmp_path / "in.wav"
    write_tone_wav(path, rate_hz, width, channels, seconds=0.5)
    pcm = load_wav_8k_mono(str(path))
    assert abs(len(pcm) // 2 - 4000) <= 8  # 0.5 s at 8 kHz
    # A 0.5 full-scale sine: RMS 0.5/sqrt(2) = -9.0 dBFS, whatever the input format.
    assert level_dbfs(pcm[800:-800]) == pytest.approx(-9.03, abs=0.3)


def test_unreadable_wav_is_a_caller_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF nope")
    with pytest.raises(CallerError, match="cannot read"):
        load_wav_8k_mono(str(bad))
    with pytest.raises(CallerError, match="cannot read"):
        load_wav_8k_mono(str(tmp_path / "missing.wav"))


def test_dtmf_specs_expand_to_presses_300_ms_apart() -> None:
    assert parse_dtmf(["12#"]) == ((1.0, "1"), (1.3, "2"), (1.6, "#"))
    assert parse_dtmf(["9@2.5", "a@0.5"]) == ((0.5, "A"), (2.5, "9"))
    for bad in ("12x", "@1", "1@-1", "1@soon"):
        with pytest.raises(CallerError):
            parse_dtmf([bad])


def test_uplink_lays_clips_on_silence_and_finds_each_onset() -> None:
    quiet = bytes(320 * 4)
    loud = (np.full(160 * 3, 8000, dtype="<i2")).tobytes()
    uplink = Uplink([SpeakClip("a.wav", 1.0, quiet + loud + b"\x01\x00")])
    assert uplink.pcm(49) is None
    assert uplink.pcm(50) == bytes(320)
    assert uplink.pcm(54) == loud[:320]
    last = uplink.pcm(57)
    assert last is not None and last[:2] == b"\x01\x00" and len(last) == 320  # padded
    assert uplink.pcm(58) is None
    assert uplink.onset_frames == frozenset({54})


def test_inband_dtmf_replaces_audio_at_its_time() -> None:
    uplink = Uplink([])
    uplink.add_inband_dtmf([(0.2, "5")])
    frame = uplink.pcm(10)
    assert frame is not None and level_dbfs(frame) > -20
    assert uplink.pcm(15) is None  # 100 ms tone: frames 10-14


def test_cli_options_route_and_targets(tmp_path: Path) -> None:
    wav = tmp_path / "hello.wav"
    write_tone_wav(wav, 16000, 2, 1, seconds=0.2)
    args = build_parser().parse_args(
        ["call", "ws://127.0.0.1:1/twilio", "--route", "demo", "--speak", f"{wav}@2", "--json"]
    )
    opts = options_from_args(args)
    assert opts.route == "demo" and opts.as_json and opts.duration_s == 10.0
    (clip,) = opts.speak
    assert clip.at_s == 2.0 and abs(len(clip.pcm_s16le) - 3200) <= 16
    for target in ("http://x/twilio", "ws://127.0.0.1:1/telnyx", "bot@example.com"):
        with pytest.raises(CallerError):
            options_from_args(build_parser().parse_args(["call", target]))


def test_run_caller_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_caller(build_parser().parse_args(["call", "tel:+1555"])) == 2
    assert "unsupported target" in capsys.readouterr().err
    refused = build_parser().parse_args(["call", "ws://127.0.0.1:9/twilio", "--duration", "1"])
    assert run_caller(refused) == 1  # nothing listens on the discard port: not answered
    assert "answered:          no" in capsys.readouterr().out


def test_codecs_option_offers_g722_first_and_refuses_unknown_names() -> None:
    opts = options_from_args(build_parser().parse_args(["call", "sip:demo@127.0.0.1"]))
    assert opts.codecs == ("PCMU", "PCMA")
    args = build_parser().parse_args(["call", "sip:demo@127.0.0.1", "--codecs", "g722, PCMU"])
    assert options_from_args(args).codecs == ("G722", "PCMU")
    args = build_parser().parse_args(["call", "sip:demo@127.0.0.1", "--codecs", "opus,PCMU"])
    assert options_from_args(args).codecs == ("OPUS", "PCMU")
    args = build_parser().parse_args(["call", "sip:demo@127.0.0.1", "--codecs", "G729"])
    with pytest.raises(CallerError, match="unknown codec 'G729'"):
        options_from_args(args)

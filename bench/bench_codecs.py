"""Benchmark telcodec: cost per 20 ms frame, and alias suppression vs a naive path.

Usage: python -m bench.bench_codecs [--quick] [--out PATH]

Prints a table and writes JSON (default ``bench/results/codecs.json``) with the
machine it ran on. Every timing is the median over several repetitions of
the mean time per call over a batch of calls; one call handles one 20 ms
frame (160 samples at 8 kHz, or the provider-rate equivalent).

Alias suppression: a 6 kHz tone at 24 kHz is taken to 8 kHz mu-law by
(a) telcodec's soxr HQ path (``ToTelephony``) and (b) the naive baseline,
``audioop.ratecv`` (linear interpolation, no low-pass) then ``lin2ulaw``.
A perfect resampler removes the tone entirely (6 kHz is above the 4 kHz
Nyquist limit); the naive one folds it to 2 kHz. Suppression is
``20 log10(input RMS / output RMS)``, measured on the decoded output away
from the edges.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from bench.common import machine, print_us_per_frame, time_per_call_us, write_report
from telcodec import dtmf, g711
from telcodec.transcode import FromTelephony, ToTelephony

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ROOT = Path(__file__).resolve().parent.parent
FRAME_SAMPLES = 160
FRAMES_PER_S = 50


def tone_pcm(freq_hz: float, rate_hz: int, seconds: float, amplitude: float) -> bytes:
    t = np.arange(round(rate_hz * seconds)) / rate_hz
    return np.round(amplitude * np.sin(2 * np.pi * freq_hz * t)).astype("<i2").tobytes()


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data) - size + 1, size)]


def time_stream_us(
    make: Callable[[], Callable[[bytes], object]], inputs: list[bytes], repeats: int
) -> float:
    """Median over ``repeats`` of the mean time to push one chunk of a fresh stream."""
    samples = []
    for _ in range(repeats):
        push = make()
        start = time.perf_counter()
        for chunk in inputs:
            push(chunk)
        samples.append((time.perf_counter() - start) / len(inputs) * 1e6)
    return statistics.median(samples)


def pcm_to_ulaw_pipe(in_rate_hz: int) -> Callable[[], Callable[[bytes], object]]:
    return lambda: ToTelephony("pcm_s16le", in_rate_hz, "mulaw").push


def bench_timings(quick: bool) -> dict[str, float]:
    calls, repeats, seconds = (2_000, 5, 4.0) if quick else (20_000, 9, 20.0)
    frame_s16le = tone_pcm(440, 8000, 0.02, 8000)
    frame_ulaw = g711.ulaw_encode(frame_s16le)
    frame_alaw = g711.alaw_encode(frame_s16le)
    frame_array = np.frombuffer(frame_s16le, "<i2").astype(np.int16)
    results = {
        "ulaw_encode": time_per_call_us(lambda: g711.ulaw_encode(frame_s16le), calls, repeats),
        "ulaw_decode": time_per_call_us(lambda: g711.ulaw_decode(frame_ulaw), calls, repeats),
        "alaw_encode": time_per_call_us(lambda: g711.alaw_encode(frame_s16le), calls, repeats),
        "alaw_decode": time_per_call_us(lambda: g711.alaw_decode(frame_alaw), calls, repeats),
        "ulaw_encode_array": time_per_call_us(
            lambda: g711.ulaw_encode_array(frame_array), calls, repeats
        ),
        "ulaw_decode_array": time_per_call_us(
            lambda: g711.ulaw_decode_array(frame_ulaw), calls, repeats
        ),
        "ulaw_to_alaw": time_per_call_us(lambda: g711.ulaw_to_alaw(frame_ulaw), calls, repeats),
    }
    speech_like_24k = tone_pcm(440, 24000, seconds, 8000)
    for in_rate_hz in (24000, 16000, 22050):
        pcm = speech_like_24k if in_rate_hz == 24000 else tone_pcm(440, in_rate_hz, seconds, 8000)
        chunk_bytes = 2 * in_rate_hz // FRAMES_PER_S  # 20 ms of provider audio per push
        results[f"resample_{in_rate_hz // 1000}k_frame_ulaw"] = time_stream_us(
            pcm_to_ulaw_pipe(in_rate_hz),
            chunks(pcm, chunk_bytes),
            repeats,
        )
    ulaw_stream = g711.ulaw_encode(tone_pcm(440, 8000, seconds, 8000))
    results["pass_through_ulaw"] = time_stream_us(
        lambda: ToTelephony("mulaw", 8000, "mulaw").push, chunks(ulaw_stream, 160), repeats
    )
    results["pass_through_ulaw_to_alaw"] = time_stream_us(
        lambda: ToTelephony("mulaw", 8000, "alaw").push, chunks(ulaw_stream, 160), repeats
    )
    results["from_telephony_ulaw_to_16k"] = time_stream_us(
        lambda: FromTelephony("mulaw", 16000).push, chunks(ulaw_stream, 160), repeats
    )
    dtmf_audio = dtmf.generate("0123456789*#ABCD" * 4)
    results["dtmf_detect"] = time_stream_us(
        lambda: dtmf.DtmfDetector().process, chunks(dtmf_audio, 320), repeats
    )
    return results


def rms(x: np.ndarray[Any, Any]) -> float:
    return float(np.sqrt(np.mean(np.asarray(x, dtype=np.float64) ** 2)))


def suppression_db(in_rms: float, out_rms: float) -> float | None:
    return None if out_rms == 0 else 20 * math.log10(in_rms / out_rms)


def to_ulaw_ours(pcm: bytes, in_rate_hz: int) -> bytes:
    pipe = ToTelephony("pcm_s16le", in_rate_hz, "mulaw")
    return b"".join([f for c in chunks(pcm, 960) for f in pipe.push(c)] + pipe.flush())


def to_ulaw_naive(pcm: bytes, in_rate_hz: int) -> bytes:
    state = None
    out = []
    for c in chunks(pcm, 960):
        # The naive baseline being measured; banned in the codebase for this reason.
        linear, state = audioop.ratecv(c, 2, 1, in_rate_hz, 8000, state)  # noqa: TID251
        out.append(audioop.lin2ulaw(linear, 2))
    return b"".join(out)


def decoded_rms(ulaw: bytes, edge: int) -> float:
    return rms(np.frombuffer(g711.ulaw_decode(ulaw), "<i2")[edge:-edge])


def bench_alias_suppression() -> dict[str, Any]:
    in_rate_hz, freq_hz, amplitude = 24000, 6000.0, 16000.0
    edge = 800  # output samples skipped at each end (filter onset and tail)
    pcm = tone_pcm(freq_hz, in_rate_hz, 2.0, amplitude)
    in_rms = rms(np.frombuffer(pcm, "<i2"))
    ours_rms = decoded_rms(to_ulaw_ours(pcm, in_rate_hz), edge)
    naive_rms = decoded_rms(to_ulaw_naive(pcm, in_rate_hz), edge)
    ours_db = suppression_db(in_rms, ours_rms)
    naive_db = suppression_db(in_rms, naive_rms)
    # The smallest non-zero mu-law output magnitude is 8: an all-zero output means
    # the alias is below the codec's resolution, i.e. at least this far down.
    floor_db = 20 * math.log10(in_rms / 8)
    ours_at_least_db = floor_db if ours_db is None else ours_db

    # The same over a sweep of tones that must not survive (4.2 .. 11.8 kHz).
    sweep = []
    for sweep_hz in range(4200, 12000, 400):
        tone = tone_pcm(sweep_hz, in_rate_hz, 1.0, amplitude)
        # Filter alone on an unrounded sine (16-bit rounding noise would set the floor).
        x = amplitude * np.sin(2 * np.pi * sweep_hz * np.arange(in_rate_hz) / in_rate_hz)
        filtered = soxr.resample(x, in_rate_hz, 8000, quality="HQ")[edge:-edge]
        sweep.append(
            {
                "freq_hz": sweep_hz,
                "soxr_hq_filter_db": suppression_db(rms(x), rms(filtered)),
                "soxr_hq_ulaw_db": suppression_db(
                    rms(x), decoded_rms(to_ulaw_ours(tone, in_rate_hz), edge)
                ),
                "naive_ratecv_ulaw_db": suppression_db(
                    rms(x), decoded_rms(to_ulaw_naive(tone, in_rate_hz), edge)
                ),
            }
        )
    finite = [r["naive_ratecv_ulaw_db"] for r in sweep if r["naive_ratecv_ulaw_db"] is not None]
    ours_sweep = [r["soxr_hq_ulaw_db"] for r in sweep]
    return {
        "input": f"{freq_hz:g} Hz sine, RMS {in_rms:.0f}, {in_rate_hz} Hz -> 8000 Hz mu-law",
        "soxr_hq_ulaw_db": ours_db,
        "soxr_hq_ulaw_output_all_zero": ours_db is None,
        "soxr_hq_ulaw_at_least_db": ours_at_least_db,
        "naive_ratecv_ulaw_db": naive_db,
        "naive_output_rms": naive_rms,
        "improvement_at_least_db": None if naive_db is None else ours_at_least_db - naive_db,
        "alias_amplitude_ratio_naive_over_soxr_at_least": (
            None if naive_db is None else 10 ** ((ours_at_least_db - naive_db) / 20)
        ),
        "sweep_4k2_to_11k8": sweep,
        "sweep_worst_naive_db": min(finite) if finite else None,
        "sweep_worst_soxr_hq_ulaw_db": (
            None if None in ours_sweep else min(v for v in ours_sweep if v is not None)
        ),
        "sweep_soxr_hq_ulaw_all_zero_count": ours_sweep.count(None),
    }


def machine_info() -> dict[str, Any]:
    """The shared machine/commit record (bench/common.py)."""
    return {**machine(), "numpy": np.__version__, "soxr": soxr.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, shorter audio")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "codecs.json")
    args = parser.parse_args()

    timings = bench_timings(args.quick)
    alias = bench_alias_suppression()
    main_path_us = timings["resample_24k_frame_ulaw"]
    report = {
        "benchmark": "codecs",
        "quick": args.quick,
        "machine": machine_info(),
        "us_per_20ms_frame": timings,
        "calls_per_core_at_24k_resample_frame_ulaw": 1e6 / (FRAMES_PER_S * main_path_us),
        "alias_suppression": alias,
    }
    print_us_per_frame(timings, 34)
    print(
        f"\noutbound 24k->8k mu-law alone would allow "
        f"{report['calls_per_core_at_24k_resample_frame_ulaw']:.0f} calls per core"
    )
    print("\nalias suppression (6 kHz tone, 24 kHz -> 8 kHz mu-law):")
    for key, value in alias.items():
        if key == "sweep_4k2_to_11k8":
            continue
        print(f"  {key}: {value:.2f}" if isinstance(value, float) else f"  {key}: {value}")
    print("  sweep (dB down; None = output exactly zero):")
    for row in alias["sweep_4k2_to_11k8"]:
        print(f"    {row}")
    write_report(args.out, report)


if __name__ == "__main__":
    main()

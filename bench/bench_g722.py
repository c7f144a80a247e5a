"""Benchmark G.722 (telcodec.g722, libavcodec through PyAV): µs per 20 ms frame.

Usage: python -m bench.bench_g722 [--quick] [--out PATH]

Prints a table and writes JSON (default ``bench/results/g722.json``) with the
machine it ran on. Every timing is the median over several repetitions of
the mean time per call over a batch of calls; one call handles one 20 ms
frame (320 samples of s16le at 16 kHz in, 160 bytes out, or back). What a
G.722 SIP call adds per 20 ms: one encode (our frame or comfort silence)
and one decode of the caller's packet (``bridge.io.legs.sip_call``: decoded
as it arrives, the playout path reuses it). mu-law's encode and
decode are timed beside it for scale.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import av
import numpy as np

from bench.common import machine, print_us_per_frame, time_per_call_us, write_report
from telcodec import g711, g722

ROOT = Path(__file__).resolve().parent.parent
FRAMES_PER_S = 50


def speechlike_16k(frames: int) -> list[bytes]:
    """Voiced harmonics with a moving pitch, cut into 20 ms frames (not silence: ADPCM's
    work does not depend on the signal much, but the frames are realistic)."""
    t = np.arange(frames * g722.FRAME_SAMPLES) / g722.SAMPLE_RATE_HZ
    f0 = 140 + 30 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / g722.SAMPLE_RATE_HZ
    wave = sum(np.sin(k * phase) / k for k in range(1, 20))
    pcm = (wave / np.max(np.abs(wave)) * 8000).astype("<i2").tobytes()
    return [pcm[i : i + g722.FRAME_BYTES] for i in range(0, len(pcm), g722.FRAME_BYTES)]


def bench(quick: bool) -> dict[str, float]:
    calls, repeats = (500, 5) if quick else (3000, 9)
    frames = speechlike_16k(50)
    encoder = g722.G722Encoder()
    payloads = [encoder.encode(f) for f in frames]
    cycle = {"i": 0}

    def next_index() -> int:
        cycle["i"] = (cycle["i"] + 1) % len(frames)
        return cycle["i"]

    enc = g722.G722Encoder()
    dec = g722.G722Decoder()
    silence_enc = g722.G722Encoder()
    narrow = [f[::2] for f in frames]  # 320 bytes: an 8 kHz frame's size, for mu-law
    ulaw = [g711.ulaw_encode(f) for f in narrow]
    encode_us = time_per_call_us(lambda: enc.encode(frames[next_index()]), calls, repeats)
    decode_us = time_per_call_us(lambda: dec.decode(payloads[next_index()]), calls, repeats)
    return {
        "g722_encode": encode_us,
        "g722_decode": decode_us,
        "g722_encode_silence": time_per_call_us(silence_enc.encode_silence, calls, repeats),
        "g722_sip_call_per_tick": encode_us + decode_us,
        "ulaw_encode": time_per_call_us(
            lambda: g711.ulaw_encode(narrow[next_index()]), calls, repeats
        ),
        "ulaw_decode": time_per_call_us(
            lambda: g711.ulaw_decode(ulaw[next_index()]), calls, repeats
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "g722.json")
    args = parser.parse_args()
    timings = bench(args.quick)
    per_tick = timings["g722_sip_call_per_tick"]
    report: dict[str, Any] = {
        "benchmark": "g722",
        "quick": args.quick,
        "machine": {**machine(), "numpy": np.__version__, "av": av.__version__},
        "us_per_20ms_frame": timings,
        "share_of_a_core_at_500_calls": 500 * FRAMES_PER_S * per_tick / 1e6,
    }
    print_us_per_frame(timings, 26)
    print(
        f"\nG.722 codec work of one SIP call: {per_tick:.1f} us per 20 ms, "
        f"{report['share_of_a_core_at_500_calls']:.0%} of a core at 500 calls"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()

"""Benchmark Opus (telcodec.opus, libopus through PyAV): µs per 20 ms frame.

Usage: python -m bench.bench_opus [--quick] [--out PATH]

Prints a table and writes JSON (default ``bench/results/opus.json``) with the
machine it ran on and its load average. Every timing is the median over
several repetitions of the mean time per call over a batch of calls; one
call handles one 20 ms frame (320 samples of s16le at 16 kHz in, one
packet out; or a packet in, decoded at 48 kHz and resampled to 320 samples
at 16 kHz). What an Opus SIP call adds per 20 ms: one encode (our frame or
comfort silence) and one decode of the caller's packet
(``bridge.io.legs.sip_call``: decoded as it arrives, the playout path reuses
it). Between turns the encode is comfort silence, which after its first
``SILENCE_PRIMING_FRAMES`` frames repeats a packet instead of encoding
(``opus_encode_silence_settled``). The encoder is timed at the complexity the leg uses
(``telcodec.opus.COMPLEXITY``) and at libopus's default 10 and at 0 for
scale; G.722 (``bench_g722``) beside it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import av
import numpy as np

from bench.bench_g722 import speechlike_16k
from bench.common import machine, print_us_per_frame, time_per_call_us, write_report
from telcodec import g722, opus

ROOT = Path(__file__).resolve().parent.parent
FRAMES_PER_S = 50


def bench(quick: bool) -> dict[str, float]:
    calls, repeats = (300, 5) if quick else (2000, 7)
    frames = speechlike_16k(50)
    payloads = [opus.OpusEncoder().encode(f) for f in frames]
    cycle = {"i": 0}

    def next_index() -> int:
        cycle["i"] = (cycle["i"] + 1) % len(frames)
        return cycle["i"]

    def encode_us(complexity: int) -> float:
        enc = opus.OpusEncoder(complexity=complexity)
        return time_per_call_us(lambda: enc.encode(frames[next_index()]), calls, repeats)

    dec = opus.OpusDecoder()
    silence_enc = opus.OpusEncoder()
    g722_enc, g722_dec = g722.G722Encoder(), g722.G722Decoder()
    g722_payloads = [g722.G722Encoder().encode(f) for f in frames]
    encode = encode_us(opus.COMPLEXITY)
    for _ in range(opus.SILENCE_PRIMING_FRAMES):
        silence_enc.encode_silence()
    settled = time_per_call_us(silence_enc.encode_silence, calls, repeats)
    decode = time_per_call_us(lambda: dec.decode(payloads[next_index()]), calls, repeats)
    return {
        f"opus_encode_c{opus.COMPLEXITY}": encode,
        "opus_encode_c10": encode_us(10),
        "opus_encode_c0": encode_us(0),
        "opus_encode_silence_settled": settled,
        "opus_decode_to_16k": decode,
        "opus_sip_call_per_tick": encode + decode,
        "opus_sip_call_per_tick_between_turns": settled + decode,
        "g722_encode": time_per_call_us(
            lambda: g722_enc.encode(frames[next_index()]), calls, repeats
        ),
        "g722_decode": time_per_call_us(
            lambda: g722_dec.decode(g722_payloads[next_index()]), calls, repeats
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "opus.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    timings = bench(args.quick)
    per_tick = timings["opus_sip_call_per_tick"]
    payloads = [opus.OpusEncoder().encode(f) for f in speechlike_16k(50)]
    report: dict[str, Any] = {
        "benchmark": "opus",
        "quick": args.quick,
        "machine": {**machine(), "numpy": np.__version__, "av": av.__version__},
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "encoder": {"bit_rate": opus.BIT_RATE, "complexity": opus.COMPLEXITY},
        "mean_payload_bytes": sum(map(len, payloads)) / len(payloads),
        "us_per_20ms_frame": timings,
        "share_of_a_core_at_500_calls": 500 * FRAMES_PER_S * per_tick / 1e6,
    }
    print_us_per_frame(timings, 38)
    print(
        f"\nOpus codec work of one SIP call: {per_tick:.1f} us per 20 ms, "
        f"{report['share_of_a_core_at_500_calls']:.0%} of a core at 500 calls; "
        f"{report['mean_payload_bytes']:.0f} bytes a packet; load {load_before:.1f}"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()

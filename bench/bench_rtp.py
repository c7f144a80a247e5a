"""Benchmark the RTP hot path: microseconds per packet, in and out.

Usage: python bench/bench_rtp.py [--quick] [--out PATH]

Prints a table and writes JSON (default ``bench/results/rtp.json``) with the
machine and commit it ran on. Every figure is the median over several runs
of the mean time per packet over a batch of packets, each run on a fresh
session:

* ``receive_and_pop``: ``RtpSession.receive_datagram`` (parse, PT check,
  source check, SSRC, RFC 3550 A.1 sequence and A.8 jitter, jitter-buffer
  insert) followed by ``pop_frame`` (jitter-buffer out) for a 20 ms PCMU
  packet from the locked peer, as every inbound packet costs in a call;
* ``receive_and_pop_latched``: the same with symmetric-RTP latching on;
* ``receive_and_pop_reordered``: the same with every pair of packets swapped;
* ``send_frame``: ``RtpSession.send_frame`` (header pack, ``SendDatagram``)
  plus draining ``actions_to_send()``, as the ticker does per call per tick;
* ``parse_rtp_header`` / ``build_rtp`` / ``RtpPacket.parse``: the packet
  functions alone, for comparison.

``calls_per_core_rtp_only`` is 1 s divided by 50 x (receive_and_pop +
send_frame): the RTP engine's share of one call per 20 ms; sockets, the event
loop, codecs and VAD come on top (see bench_codecs and the design notes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import machine

from bridge.rtp.packet import RtpPacket, build_rtp, parse_rtp_header
from bridge.rtp.session import RtpSession, RtpSessionConfig

ROOT = Path(__file__).resolve().parent.parent
PEER = ("192.0.2.10", 40000)
PAYLOAD = b"\xff" * 160
PACKETS_PER_S = 50


def inbound_packets(count: int, swap_pairs: bool = False) -> list[bytes]:
    seqs = list(range(count))
    if swap_pairs:
        for i in range(0, count - 1, 2):
            seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
    return [build_rtp(0, s & 0xFFFF, (s * 160) & 0xFFFFFFFF, 0x1234, PAYLOAD, False) for s in seqs]


def median_us(run: Callable[[], float], repeats: int) -> float:
    run()  # warm-up: caches, allocator, first-use costs
    return statistics.median(run() for _ in range(repeats))


def bench_receive(packets: list[bytes], config: RtpSessionConfig) -> float:
    session = RtpSession(config, PEER, 0.0, random.Random(1))
    receive = session.receive_datagram
    pop = session.pop_frame
    peer = PEER
    now = 0.0
    start = time.perf_counter()
    for data in packets:
        receive(data, peer, now)
        pop(now)
        now += 0.02
    elapsed = time.perf_counter() - start
    session.events_received()
    return elapsed / len(packets) * 1e6


def bench_send(count: int) -> float:
    session = RtpSession(RtpSessionConfig(), PEER, 0.0, random.Random(1))
    send = session.send_frame
    drain = session.actions_to_send
    now = 0.0
    start = time.perf_counter()
    for n in range(count):
        send(PAYLOAD, 0, now, n)
        drain()
        now += 0.02
    return (time.perf_counter() - start) / count * 1e6


def bench_call(fn: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count * 1e6


def run(quick: bool) -> dict[str, float]:
    count = 5_000 if quick else 50_000
    repeats = 3 if quick else 9
    plain = inbound_packets(count)
    swapped = inbound_packets(count, swap_pairs=True)
    one = plain[7]
    return {
        "receive_and_pop": median_us(lambda: bench_receive(plain, RtpSessionConfig()), repeats),
        "receive_and_pop_latched": median_us(
            lambda: bench_receive(plain, RtpSessionConfig(latch=True)), repeats
        ),
        "receive_and_pop_reordered": median_us(
            lambda: bench_receive(swapped, RtpSessionConfig()), repeats
        ),
        "send_frame": median_us(lambda: bench_send(count), repeats),
        "parse_rtp_header": median_us(
            lambda: bench_call(lambda: parse_rtp_header(one), count), repeats
        ),
        "build_rtp": median_us(
            lambda: bench_call(lambda: build_rtp(0, 1, 160, 0x1234, PAYLOAD, False), count),
            repeats,
        ),
        "RtpPacket.parse": median_us(
            lambda: bench_call(lambda: RtpPacket.parse(one), count), repeats
        ),
    }


def machine_info() -> dict[str, Any]:
    """The shared machine/commit record (bench/common.py)."""
    return machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer packets and repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rtp.json")
    args = parser.parse_args()

    timings = run(args.quick)
    per_call_us = PACKETS_PER_S * (timings["receive_and_pop"] + timings["send_frame"])
    report = {
        "benchmark": "rtp",
        "quick": args.quick,
        "machine": machine_info(),
        "us_per_packet": timings,
        "us_per_call_per_second": per_call_us,
        "calls_per_core_rtp_only": 1e6 / per_call_us,
    }
    print(f"{'operation':28s} {'us / packet':>12s}")
    for name, us in timings.items():
        print(f"{name:28s} {us:12.3f}")
    print(
        f"\nRTP engine per call: {per_call_us:.0f} us per second of call "
        f"-> {report['calls_per_core_rtp_only']:.0f} calls per core (RTP engine only)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

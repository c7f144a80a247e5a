"""Benchmark SRTP: protect + unprotect of one 20 ms G.711 packet, with the Python call.

Usage: python -m bench.bench_srtp [--quick] [--out NAME_OR_PATH]

The budget (issue 34): protect + unprotect of a 160-byte G.711 payload (a
172-byte RTP packet) within 2 µs including the Python call; libsrtp itself
takes about 0.6-0.8 µs. Figures, in **CPU** microseconds per packet
(``time.process_time``, so that the other processes of a shared machine do not
enter them; median over the repetitions of the mean over a batch; each
repetition has fresh sessions, since libsrtp refuses a sequence number twice):

* ``context``: ``bridge.rtp.srtp.SrtpContext.protect`` then ``.unprotect`` on
  the receiving side's context: what the SIP leg calls per packet
  (``bridge/io/legs/sip_call.py``), libsrtp through its cffi binding on a
  preallocated buffer;
* ``pylibsrtp``: ``pylibsrtp.Session.protect`` / ``unprotect`` called
  directly, for comparison (``SrtpContext`` wrapped these until issue 34);
* each for ``AES_CM_128_HMAC_SHA1_80`` and ``_32``; ``protect`` and
  ``unprotect`` are also reported alone.

``--round-robin`` (diagnosis of the daemon's cost, issue 34) measures instead
many sessions in turn, as the daemon's ticker calls them: N call legs (1,
150, 500: ``--sessions``), each a sender and a receiver ``SrtpContext``; a
round protects one 172-byte packet on every leg then unprotects it on the
leg's receiver, leg after leg, and between rounds (``--pressure-mb``, 0 and
4) a few MB of memory are read, one byte per cache line, as the rest of the
daemon's tick would evict libsrtp's and OpenSSL's state and code. Only the
SRTP calls are timed (CPU time per round, the cost of the two clock reads
subtracted). Written as ``srtp_round_robin`` (``--out``).

Writes ``bench/results/srtp.json`` (``--out`` for another name) with the
machine and commit it ran on, and whether ``bridge.rtp.srtp`` ran compiled
(mypyc, ``bridge/native.py``) or as Python (``compiled`` in the settings).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import pylibsrtp

import bridge.rtp.srtp as srtp_module
from bench.common import write
from bridge.rtp.packet import build_rtp
from bridge.rtp.srtp import SrtpContext
from bridge.sip.sdp import SDES_SUITES, SdesCrypto

BUDGET_US = 2.0
PAYLOAD = b"\xd5" * 160  # 20 ms of G.711
PROFILES = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}


def packets(count: int) -> list[bytes]:
    return [
        build_rtp(0, seq & 0xFFFF, (seq * 160) & 0xFFFFFFFF, 0x5EED, PAYLOAD, seq == 0)
        for seq in range(count)
    ]


def keys(suite: str, seed: int) -> tuple[SdesCrypto, SdesCrypto]:
    rng = random.Random(seed)
    return SdesCrypto.generate(1, rng.randbytes, suite), SdesCrypto.generate(
        1, rng.randbytes, suite
    )


Pair = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]


def context_pair(suite: str, seed: int) -> Pair:
    ours, theirs = keys(suite, seed)
    sender, receiver = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
    return sender.protect, receiver.unprotect


def raw_pair(suite: str, seed: int) -> Pair:
    ours, _ = keys(suite, seed)
    out = pylibsrtp.Policy(
        key=ours.key_salt,
        ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
        srtp_profile=PROFILES[suite],
    )
    inbound = pylibsrtp.Policy(
        key=ours.key_salt,
        ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND,
        srtp_profile=PROFILES[suite],
    )
    return pylibsrtp.Session(policy=out).protect, pylibsrtp.Session(policy=inbound).unprotect


def one_run(
    make: Callable[[str, int], Pair], suite: str, batch: list[bytes], seed: int
) -> tuple[float, float]:
    """Mean CPU µs per packet of protect, and of unprotect, over ``batch``."""
    protect, unprotect = make(suite, seed)
    start = time.process_time()
    protected = [protect(p) for p in batch]
    middle = time.process_time()
    clear = [unprotect(p) for p in protected]
    end = time.process_time()
    if clear[-1] != batch[-1]:
        raise SystemExit(f"{suite}: the round trip changed the packet")
    n = len(batch)
    return (middle - start) / n * 1e6, (end - middle) / n * 1e6


def measure(
    make: Callable[[str, int], Pair], suite: str, count: int, repeats: int
) -> dict[str, float]:
    batch = packets(count)
    one_run(make, suite, batch[: min(count, 1000)], 0)  # warm-up
    runs = [one_run(make, suite, batch, seed) for seed in range(1, repeats + 1)]
    protect = statistics.median(r[0] for r in runs)
    unprotect = statistics.median(r[1] for r in runs)
    both = statistics.median(r[0] + r[1] for r in runs)
    return {
        "protect_us": round(protect, 3),
        "unprotect_us": round(unprotect, 3),
        "protect_plus_unprotect_us": round(both, 3),
    }


def _identity(packet: bytes) -> bytes:
    return packet


def round_robin(
    suite: str,
    sessions: int,
    evict_kb: int,
    rounds: int,
    seed: int,
    srtp: bool = True,
    batched: str = "none",
) -> tuple[float, float]:
    """µs per leg of a round: ``sessions`` legs served in turn, each reading
    ``evict_kb`` KB then protecting one packet, reading ``evict_kb`` KB again then
    unprotecting it (``srtp`` False: the same loop with the SRTP calls left out).

    ``batched`` "tx": every leg's first read, then the protects back to back, then
    each leg's second read and unprotect in turn (a ticker protecting its outbox in one
    pass before sending it); "both": the unprotects gathered in one pass too; "none":
    each leg's two reads and two calls in turn.

    Returns the CPU time of the whole loop per leg (mean) and the time of the SRTP calls
    alone per leg (``perf_counter_ns`` around each call, or each pass when batched;
    median over the rounds of the round's mean: a preempted round does not count)."""
    legs = [keys(suite, seed * 10_000 + i) for i in range(sessions)]
    if srtp:
        pairs = [(SrtpContext(a, b).protect, SrtpContext(b, a).unprotect) for a, b in legs]
    else:
        pairs = [(_identity, _identity) for _ in legs]
    batch = packets(rounds + 1)
    # one buffer per leg and direction, as each call's own objects (jitter buffer, encoder
    # state, queues) are touched between two of its packets
    chunk = evict_kb * 1024
    pool = bytearray(max(1, chunk * 2 * min(sessions, 64)))
    views = [memoryview(pool)[i * chunk : (i + 1) * chunk] for i in range(2 * min(sessions, 64))]
    work = [
        (views[(2 * i) % len(views)], views[(2 * i + 1) % len(views)], p)
        for i, p in enumerate(pairs)
    ]
    cpu = time.process_time_ns
    wall = time.perf_counter_ns
    spent = 0
    per_round: list[float] = []
    touched = 0
    for r in range(rounds + 1):
        packet = batch[r]
        start = cpu()
        timed = 0
        if batched == "none":
            for before_tx, before_rx, (protect, unprotect) in work:
                touched += sum(before_tx[::64])  # one byte per cache line
                t0 = wall()
                out = protect(packet)
                t1 = wall()
                touched += sum(before_rx[::64])
                t2 = wall()
                unprotect(out)
                timed += wall() - t2 + t1 - t0
        else:
            for before_tx, _, _ in work:
                touched += sum(before_tx[::64])
            t0 = wall()
            sent = [protect(packet) for _, _, (protect, _) in work]
            timed += wall() - t0
            if batched == "both":
                for _, before_rx, _ in work:
                    touched += sum(before_rx[::64])
                t0 = wall()
                for (_, _, (_, unprotect)), out in zip(work, sent, strict=True):
                    unprotect(out)
                timed += wall() - t0
            else:
                for (_, before_rx, (_, unprotect)), out in zip(work, sent, strict=True):
                    touched += sum(before_rx[::64])
                    t0 = wall()
                    unprotect(out)
                    timed += wall() - t0
        if r:  # round 0 warms up
            spent += cpu() - start
            per_round.append(timed / sessions)
    if touched:
        raise SystemExit("eviction buffer not zero")
    return spent / (rounds * sessions) / 1000, statistics.median(per_round) / 1000


def main_round_robin(args: argparse.Namespace) -> None:
    sessions = [int(x) for x in args.sessions.split(",")]
    evictions = [int(x) for x in args.evict_kb.split(",")]
    packets_per_cell = 20_000 if args.quick else 60_000
    repeats = 3 if args.quick else 5
    suite = SDES_SUITES[0]
    cells: list[dict[str, Any]] = []
    print(f"{suite}, protect + unprotect of a 172-byte packet, legs served in turn,")
    print(f"SRTP calls batched: {args.batched}; µs per leg, median of {repeats} runs;")
    print("cpu: CPU time of the loop with SRTP minus the same loop without;")
    print("timed: the SRTP calls timed alone, minus the same timing of no-op calls")
    print(f"{'legs':>6s} {'evict KB':>9s} {'loop cpu':>9s} {'cpu µs':>8s} {'timed µs':>9s}")
    for evict in evictions:
        for n in sessions:
            rounds = max(20, packets_per_cell // n)
            with_srtp, without = [], []
            for seed in range(1, repeats + 1):  # alternated, so drift weighs on both
                with_srtp.append(round_robin(suite, n, evict, rounds, seed, True, args.batched))
                without.append(round_robin(suite, n, evict, rounds, seed, False, args.batched))
            cpu_with = statistics.median(x[0] for x in with_srtp)
            cpu_without = statistics.median(x[0] for x in without)
            timed = statistics.median(x[1] for x in with_srtp) - statistics.median(
                x[1] for x in without
            )
            cells.append(
                {
                    "sessions": n,
                    "evict_kb": evict,
                    "batched": args.batched,
                    "loop_cpu_with_srtp_us": round(cpu_with, 3),
                    "loop_cpu_without_us": round(cpu_without, 3),
                    "srtp_cpu_us": round(cpu_with - cpu_without, 3),
                    "srtp_timed_us": round(timed, 3),
                }
            )
            print(f"{n:6d} {evict:9d} {cpu_with:9.3f} {cpu_with - cpu_without:8.3f} {timed:9.3f}")
    settings = {
        "quick": args.quick,
        "suite": suite,
        "batched": args.batched,
        "repeats": repeats,
        "packets_per_cell": packets_per_cell,
        "pylibsrtp": pylibsrtp.__version__,
        "compiled": not (srtp_module.__file__ or "").endswith(".py"),
        "load_before": os.getloadavg()[0],
    }
    out = args.out if args.out != "srtp" else f"srtp_round_robin_{args.batched}"
    print(f"wrote {write(out, {'cells': cells}, settings)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer packets and repetitions")
    parser.add_argument("--out", default="srtp")
    parser.add_argument(
        "--round-robin", action="store_true", help="many legs served in turn (see above)"
    )
    parser.add_argument("--sessions", default="1,150,500", help="legs, comma-separated")
    parser.add_argument(
        "--batched",
        choices=("none", "tx", "both"),
        default="none",
        help="round robin: SRTP calls gathered in one pass (tx: protects only)",
    )
    parser.add_argument(
        "--evict-kb", default="0,64,512", help="KB read before each protect and unprotect"
    )
    args = parser.parse_args()
    if args.round_robin:
        main_round_robin(args)
        return
    count = 5_000 if args.quick else 50_000
    repeats = 3 if args.quick else 9
    figures: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'suite':26s} {'path':10s} {'protect':>9s} {'unprotect':>10s} {'both µs':>9s}")
    for suite in SDES_SUITES:
        figures[suite] = {}
        for name, make in (("context", context_pair), ("pylibsrtp", raw_pair)):
            result = measure(make, suite, count, repeats)
            figures[suite][name] = result
            print(
                f"{suite:26s} {name:10s} {result['protect_us']:9.3f} "
                f"{result['unprotect_us']:10.3f} {result['protect_plus_unprotect_us']:9.3f}"
            )
    worst = max(f["context"]["protect_plus_unprotect_us"] for f in figures.values())
    verdict = "within" if worst <= BUDGET_US else "OVER"
    print(
        f"\nworst protect + unprotect through SrtpContext: {worst:.3f} µs, {verdict} {BUDGET_US} µs"
    )
    summary = {"suites": figures, "worst_context_us": worst, "budget_us": BUDGET_US}
    settings = {
        "quick": args.quick,
        "packets": count,
        "repeats": repeats,
        "payload_bytes": len(PAYLOAD),
        "pylibsrtp": pylibsrtp.__version__,
        "compiled": not (srtp_module.__file__ or "").endswith(".py"),
    }
    print(f"bridge.rtp.srtp {'compiled' if settings['compiled'] else 'pure Python'}")
    print(f"wrote {write(args.out, summary, settings)}")


if __name__ == "__main__":
    main()

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

Writes ``bench/results/srtp.json`` (``--out`` for another name) with the
machine and commit it ran on, and whether ``bridge.rtp.srtp`` ran compiled
(mypyc, ``bridge/native.py``) or as Python (``compiled`` in the settings).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer packets and repetitions")
    parser.add_argument("--out", default="srtp")
    args = parser.parse_args()
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

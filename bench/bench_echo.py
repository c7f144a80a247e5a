"""The echo correlator's CPU cost per 20 ms frame (issue 8: capacity).

``bridge.media.echo.EchoCorrelator`` is fed every outbound frame
(``push_outbound``) and checks the inbound frames the VAD calls speech while
the bot talks (``is_echo``). Measured, in CPU time (``time.process_time``,
median of ``--repeats`` runs of the mean over a 4-s signal, 200 frames),
µs per frame:

* ``push_talking``: ``push_outbound`` of the bot's audio, no check;
* ``push_idle``: ``push_outbound(None)`` with a silent history;
* for each inbound situation, ``push + check`` per frame and ``check`` alone
  (the difference with ``push_talking``):

  - ``echo``: the bot's audio back 15 dB down after 60 ms, through G.711;
  - ``double_talk``: that echo 20 dB down plus a caller 14 dB above it;
  - ``caller``: a caller alone over the bot (no echo);
  - ``quiet_line``: line noise at about -50 dBFS (the check is run anyway:
    what a frame the VAD wrongly calls speech costs).

The fraction of frames called echo in each situation is reported with a
digest of the per-frame decisions, so two versions of the correlator can be
compared for identical decisions.

    python -m bench.bench_echo [--repeats N] [--out NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from typing import Any

import numpy as np

from bench.common import write
from bridge.media.echo import EchoCorrelator
from telcodec import g711
from tests.media.test_echo import delayed, voiced  # the test suite's speech-like signals

RATE = 8000
FRAME = 160


def pcm_frames(x: np.ndarray, g711_path: bool = False) -> list[bytes]:
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2").tobytes()
    if g711_path:
        pcm = g711.ulaw_decode(g711.ulaw_encode(pcm))
    return [pcm[i : i + 2 * FRAME] for i in range(0, len(pcm) - 2 * FRAME + 1, 2 * FRAME)]


def per_frame_us(
    outbound: list[bytes | None], inbound: list[bytes] | None, repeats: int
) -> tuple[float, list[bool]]:
    runs = []
    decisions: list[bool] = []
    for _ in range(repeats):
        corr = EchoCorrelator()
        decisions = []
        start = time.process_time()
        if inbound is None:
            for o in outbound:
                corr.push_outbound(o)
        else:
            for o, i in zip(outbound, inbound, strict=True):
                corr.push_outbound(o)
                decisions.append(corr.is_echo(i))
        runs.append((time.process_time() - start) / len(outbound) * 1e6)
    return statistics.median(runs), decisions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default="echo")
    ap.add_argument("--quick", action="store_true", help="make bench-quick: 5 repeats")
    args = ap.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 5)

    seconds = 4.0
    bot_signal = voiced(seconds, 120, seed=1)
    bot = pcm_frames(bot_signal)
    caller_signal = voiced(seconds, 190, seed=7)
    noise = np.random.default_rng(5).normal(0, 0.003, int(RATE * seconds))
    situations = {
        "echo": pcm_frames(delayed(bot_signal, 60, -15), g711_path=True),
        "double_talk": pcm_frames(
            delayed(bot_signal, 60, -20) + caller_signal * 10 ** (-6 / 20), g711_path=True
        ),
        "caller": pcm_frames(caller_signal * 0.5, g711_path=True),
        "quiet_line": pcm_frames(noise, g711_path=True),
    }
    n = min(len(bot), *(len(v) for v in situations.values()))
    bot = bot[:n]

    figures: dict[str, Any] = {}
    push_talking, _ = per_frame_us(list(bot), None, args.repeats)
    push_idle, _ = per_frame_us([None] * n, None, args.repeats)
    figures["push_talking_us"] = round(push_talking, 2)
    figures["push_idle_us"] = round(push_idle, 2)
    print(f"push_outbound, bot talking   {push_talking:8.2f} us/frame")
    print(f"push_outbound, bot silent    {push_idle:8.2f} us/frame")
    for name, inbound in situations.items():
        total, decisions = per_frame_us(list(bot), inbound[:n], args.repeats)
        echo_share = sum(decisions) / len(decisions)
        digest = hashlib.sha256(bytes(decisions)).hexdigest()[:12]
        figures[name] = {
            "push_and_check_us": round(total, 2),
            "check_us": round(total - push_talking, 2),
            "echo_share": round(echo_share, 4),
            "decisions_sha256": digest,
        }
        print(
            f"{name:12s} push+check {total:8.2f}  check {total - push_talking:8.2f} us/frame"
            f"  echo {echo_share:6.1%}  decisions {digest}"
        )
    settings = {"frames": n, "repeats": args.repeats, "clock": "time.process_time"}
    print("wrote", write(args.out, figures, settings))


if __name__ == "__main__":
    main()

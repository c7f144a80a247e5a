"""Pacing: departure deviation of outbound frames from the 20 ms grid, seen by a separate receiver.

SIP/RTP: the load generator (its own process, core 1) is the UAC and the
receiver: every RTP packet is timestamped by the kernel on arrival
(``SO_TIMESTAMPNS``), the grid of each talkspurt is fitted from its first
packet (marker bit) and the RTP timestamp gives each packet's slot. Media
streams: arrival at the carrier (``time.monotonic_ns()`` in the load
generator), grid fitted per talkspurt after the lead frames. Calls as in
``bench_capacity`` (continuous TTS, inbound audio through the VAD, 8 kHz
mu-law pass-through). Call counts: 1, 100 and the last step that met the bar
in ``bench/results/capacity.json`` (200 when none). Full mode adds a
10-minute run at 100 calls for drift.

Not done yet: the baresip baseline in the same run (see docs/benchmarks.md).

    python bench/bench_pacing.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, write
from loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from loadgen.steps import sip_step, ws_step


def max_calls() -> int:
    try:
        cap = json.loads((RESULTS / "capacity.json").read_text())["figures"]
        best = int(cap["sip_mulaw"]["last_step_meeting_bar"])
    except (OSError, KeyError, ValueError):
        best = 0
    return best if best > 100 else 200


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    measure_s = 5.0 if args.quick else 30.0
    counts = sorted({1, 100, max_calls()})
    pin_self()
    figures: dict[str, Any] = {}
    print(f"{'leg':<7} {'calls':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'drift ppm':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        tts = TtsProcess.start(wd)
        d = DaemonUnderTest.start(wd, tts.port)
        try:
            for leg, step in (("sip", sip_step), ("twilio", ws_step)):
                for n in counts:
                    r = step(d, tts, n, measure_s)
                    figures[f"{leg}_{n}"] = r
                    p = r["pacing"]
                    print(
                        f"{leg:<7} {n:>5} {p.get('p50_ms')!s:>7} {p.get('p99_ms')!s:>7}"
                        f" {p.get('max_ms')!s:>7} {p.get('drift_ppm_median')!s:>9}",
                        flush=True,
                    )
            if not args.quick:
                r = sip_step(d, tts, 100, 600.0)
                figures["sip_100_10min"] = r
                print(f"sip 100 calls, 10 min: {r['pacing']}")
        finally:
            d.stop()
            tts.stop()
    figures["goal"] = {"p99_ms": 2.0, "max_ms": 10.0, "drift": "none over 10 minutes"}
    figures["baseline_baresip"] = "not measured yet"
    path = write(
        "pacing",
        figures,
        {
            "measure_s": measure_s,
            "counts": counts,
            "audio": "kova mulaw/8000 pass-through, continuous (route talk)",
            "receiver": "load generator process, core 1; RTP kernel timestamps",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

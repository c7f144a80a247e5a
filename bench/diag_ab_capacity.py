"""A/B of one capacity step in the daemon: two (or more) source trees, runs interleaved.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for
"did this change move the daemon's CPU per call-second", which per-path
benches (``bench_chain``, ``bench_call``, ``bench_tts --replay``) cannot
answer. One reference TTS server serves every run; the daemon is started
afresh for each run from one tree or the other (``loadgen.procs`` ``src``:
the tree's ``bridge`` and ``codecs`` first on the child's path, this venv's
packages), in the order A B B A A B B A ... (with three trees A B C C B A ...)
so that a drift of the machine over the runs weighs on every tree alike. Each run is one step of
``bench_capacity`` (``sip_step`` / ``ws_step``, mu-law); printed per run and
as medians, with the daemon's user and system CPU apart.

    git worktree add /tmp/base <commit>
    python -m bench.diag_ab_capacity --leg sip --calls 400 --reps 4 /tmp/base .
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loadgen.procs import CLK_TCK, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.steps import sip_step, ws_step


def _user_sys_s(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", type=Path, help="tree A, tree B, ...")
    ap.add_argument("--leg", choices=("sip", "twilio"), default="sip")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--measure-s", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=4, help="runs per tree")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    args = ap.parse_args()
    if len(args.trees) < 2:
        ap.error("trees: at least two")
    pin_self()
    trees = [t.resolve() for t in args.trees]
    results: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    step = sip_step if args.leg == "sip" else ws_step
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tts = TtsProcess.start(workdir)
        try:
            for r in range(args.reps):
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    d = DaemonUnderTest.start(workdir, tts.port, src=tree)
                    try:
                        u0, s0 = _user_sys_s(d.pid)
                        row: dict[str, Any] = step(d, tts, args.calls, args.measure_s)
                        u1, s1 = _user_sys_s(d.pid)  # includes set-up and hang-up: shares only
                    finally:
                        d.stop()
                    keep = (
                        "daemon_cpu_pct",
                        "cpu_us_per_call_s",
                        "underruns",
                        "underruns_daemon",
                        "late_wakeups",
                    )
                    run = {k: row.get(k) for k in (*keep, "core0_other_pct")}
                    run["pacing"] = {
                        k: row["pacing"].get(k) for k in ("p99_ms", "max_ms", "worst_call_p99_ms")
                    }
                    run["sys_share"] = round((s1 - s0) / max(1e-9, u1 - u0 + s1 - s0), 3)
                    run["loadavg_1m"] = os.getloadavg()[0]  # the rest of the host, roughly
                    results[str(tree)].append(run)
                    print(tree, json.dumps(run), flush=True)
                    time.sleep(2)
        finally:
            tts.stop()
    summary = {
        t: {
            "cpu_us_per_call_s_median": statistics.median(x["cpu_us_per_call_s"] for x in rs),
            "worst_call_p99_ms": [x["pacing"]["worst_call_p99_ms"] for x in rs],
            "underruns": [x["underruns"] for x in rs],
            "underruns_daemon": [x.get("underruns_daemon") for x in rs],
        }
        for t, rs in results.items()
    }
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.write_text(
            json.dumps({"leg": args.leg, "calls": args.calls, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()

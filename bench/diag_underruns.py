"""Whose underruns: the daemon's, or the provider's production falling behind real time.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for
the capacity steps' underrun counts. It runs ``n`` SIP calls of the capacity
workload (route ``talk``: a ~15 s turn said again and again, Kova from the
reference server's tone engine) for ``seconds``, hangs up, and prints the
calls' underruns (their CDRs) next to what the reference server noted for
every turn it finished (``bench/loadgen/ttsd_proc.py``): how far its
production of that turn fell behind real time, i.e. the largest
``(t_k - t_0) - audio before chunk k`` over the turn's chunks. A turn produced
more than a frame behind can run dry at the daemon whatever the daemon does.

    python bench/diag_underruns.py [--calls 400] [--seconds 25]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from loadgen.rtp import RtpLoad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=25.0)
    args = ap.parse_args()
    pin_self()
    with tempfile.TemporaryDirectory() as tmp:
        tts = TtsProcess.start(Path(tmp))
        d = DaemonUnderTest.start(Path(tmp), tts.port)
        try:
            load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
            load.place(args.calls, rate_per_s=150)
            load.wait_answered(20)
            load.run_for(args.seconds)
            ids = {c.call_id for c in load.calls}
            load.hangup_all(settle_s=1.5)
            load.close()
            cdrs = [c for c in d.cdr_lines() if c["call_id"] in ids]
        finally:
            d.stop()
            tts.stop()
        jobs_path = tts.record_path.with_suffix(".jobs.json")
        jobs = json.loads(jobs_path.read_text()) if jobs_path.exists() else []
    runs_dry = [int(c.get("underruns", 0)) for c in cdrs]
    behind = sorted(b for _, audio_s, b in jobs if audio_s > 1.0)
    frame = 0.02
    print(
        f"{len(cdrs)} calls: {sum(runs_dry)} underrun frames on {sum(1 for u in runs_dry if u)}"
        f" calls (most on one call: {max(runs_dry, default=0)})"
    )
    if behind:
        over = [b for b in behind if b > frame]
        print(
            f"{len(behind)} finished turns at the provider: {len(over)} produced more than one"
            f" frame behind real time; most behind {behind[-1] * 1000:.1f} ms,"
            f" p99 {behind[int(0.99 * (len(behind) - 1))] * 1000:.1f} ms,"
            f" median {behind[len(behind) // 2] * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()

"""Where the pacing excursions are: every RTP packet over a threshold, with its neighbours.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for a
figure the benchmarks report. It runs ``n`` SIP calls of the capacity
workload (route ``talk``: a ~15 s turn said again and again, Kova from the
reference server's tone engine), keeps every packet's kernel arrival time, RTP
timestamp and marker bit, and prints the packets whose deviation from their
talkspurt's grid exceeds the threshold, with the three packets either side:
arrival (ms into the window), gap to the previous packet (ms), RTP timestamp
step and marker. Contiguous timestamps with bunched arrivals mean the daemon
sent late; a timestamp step other than 160, or a grid move without a marker,
would mean a grid error.

    python bench/diag_excursions.py [--calls 100] [--seconds 90] [--threshold-ms 10] \
        [--daemon-option "gc_thaw_s = 60"]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen.analysis import rtp_deviations_ns
from loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from loadgen.rtp import RtpLoad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--threshold-ms", type=float, default=10.0)
    ap.add_argument("--show", type=int, default=12, help="excursion packets printed")
    ap.add_argument(
        "--daemon-option",
        action="append",
        default=[],
        help='a [daemon] config line for this run, e.g. "gc_thaw_s = 60" (repeatable)',
    )
    args = ap.parse_args()
    pin_self()
    with tempfile.TemporaryDirectory() as tmp:
        tts = TtsProcess.start(Path(tmp))
        d = DaemonUnderTest.start(Path(tmp), tts.port, daemon_extra="\n".join(args.daemon_option))
        try:
            load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
            load.place(args.calls, rate_per_s=150)
            load.wait_answered(20)
            load.run_for(2)
            load.recording = True
            load.run_for(args.seconds)
            load.recording = False
            calls = list(load.calls)
            load.hangup_all(settle_s=1.5)
            load.close()
        finally:
            d.stop()
            tts.stop()
    starts = [c.arrival_ns[0] for c in calls if c.arrival_ns]
    if not starts:
        print("no packets received")
        return
    t0 = min(starts)
    limit = args.threshold_ms * 1e6
    events: list[tuple[int, int, float, list[tuple[int, float, int, int]]]] = []
    for ci, c in enumerate(calls):
        a = np.asarray(c.arrival_ns, dtype=np.int64)
        ts = np.asarray(c.rtp_ts, dtype=np.int64)
        marker = np.asarray(c.marker)
        kept, dev = rtp_deviations_ns(c.arrival_ns, c.rtp_ts, c.marker)
        for b in np.flatnonzero(np.abs(dev) > limit):
            i = int(np.searchsorted(a, kept[b]))
            rows = [
                (
                    int((a[k] - t0) / 1e6),
                    round(float(a[k] - a[k - 1]) / 1e6, 1) if k else 0.0,
                    int((ts[k] - ts[k - 1]) % (1 << 32)) if k else 0,
                    int(marker[k]),
                )
                for k in range(max(0, i - 3), min(a.size, i + 4))
            ]
            events.append((int((kept[b] - t0) / 1e6), ci, round(float(dev[b]) / 1e6, 2), rows))
    events.sort()
    seconds = sorted({e[0] // 1000 for e in events})
    print(
        f"{len(events)} packets over {args.threshold_ms} ms on {len({e[1] for e in events})} of "
        f"{len(calls)} calls; seconds into the window with one: {seconds}"
    )
    for t, ci, dev_ms, rows in events[: args.show]:
        print(f"t={t} ms call={ci} deviation={dev_ms} ms  [t_ms, gap_ms, ts_step, marker]: {rows}")


if __name__ == "__main__":
    main()

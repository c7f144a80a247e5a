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

With ``--stalls`` the host's stalls of the daemon's core are watched over the
same window (``loadgen.hostspeed.watch``: a real-time thread on core 0, which
no process can delay), late packets are grouped into episodes (``episodes_of``)
and each episode says whether a stall ended within ``STALL_REACH_MS`` before
it: an excursion that follows a
stall of the core is the host's, one that does not is the daemon's (or the
kernel's) to explain.

    python -m bench.diag_excursions [--calls 100] [--seconds 90] [--threshold-ms 10] \
        [--daemon-option "gc_thaw_s = 60"] [--stalls] [--keep-log daemon.log]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bench.loadgen.analysis import rtp_deviations_ns
from bench.loadgen.hostspeed import (
    STALL_MS,
    STALL_REACH_MS,
    StallWatch,
    chance_pct,
    episodes_of,
    stalls_before,
)
from bench.loadgen.procs import DAEMON_CORE, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad


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
    ap.add_argument("--stalls", action="store_true", help="watch the core's host stalls too")
    ap.add_argument("--keep-log", type=Path, help="copy the daemon's JSON log here")
    args = ap.parse_args()
    watcher: StallWatch | None = None
    pin_self()
    with tempfile.TemporaryDirectory() as tmp:
        tts = TtsProcess.start(Path(tmp))
        d = DaemonUnderTest.start(Path(tmp), tts.port, daemon_extra="\n".join(args.daemon_option))
        try:
            load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
            load.place(args.calls, rate_per_s=150)
            load.wait_answered(20)
            load.run_for(2)
            if args.stalls:
                watcher = StallWatch(args.seconds + 1, DAEMON_CORE)
            load.recording = True
            load.run_for(args.seconds)
            load.recording = False
            calls = list(load.calls)
            load.hangup_all(settle_s=1.5)
            load.close()
        finally:
            d.stop()
            tts.stop()
            if args.keep_log is not None:
                shutil.copyfile(Path(tmp) / "daemon.log", args.keep_log)
    stalls = watcher.result() if watcher is not None else None
    starts = [c.arrival_ns[0] for c in calls if c.arrival_ns]
    if not starts:
        print("no packets received")
        return
    t0 = min(starts)
    limit = args.threshold_ms * 1e6
    events: list[tuple[int, int, float, list[tuple[int, float, int, int]]]] = []
    late_ns: list[int] = []  # every late packet's arrival (monotonic ns)
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
            late_ns.append(int(kept[b]))
    events.sort()
    seconds = sorted({e[0] // 1000 for e in events})
    print(
        f"{len(events)} packets over {args.threshold_ms} ms on {len({e[1] for e in events})} of "
        f"{len(calls)} calls; seconds into the window with one: {seconds}"
    )
    for t, ci, dev_ms, rows in events[: args.show]:
        print(f"t={t} ms call={ci} deviation={dev_ms} ms  [t_ms, gap_ms, ts_step, marker]: {rows}")
    if stalls is None:
        if args.stalls:
            print("host stalls: not watched (SCHED_FIFO needs root or CAP_SYS_NICE)")
        return
    in_window = [(end, ms) for end, ms in stalls if t0 / 1e9 <= end]
    episodes = episodes_of(late_ns)
    causes = stalls_before([first for first, _ in episodes], stalls)
    explained = sum(1 for c in causes if c is not None)
    print(
        f"host stalls over {STALL_MS} ms in the window: {len(in_window)} "
        f"(longest {max((ms for _, ms in in_window), default=0.0)} ms); episodes of late "
        f"packets: {len(episodes)}, of which {explained} began within {STALL_REACH_MS:g} ms "
        f"of a stall's end (by chance: about {chance_pct(in_window, args.seconds):.0f} %)"
    )
    for (first, n), cause in zip(episodes, causes, strict=True):
        after = f"after a {cause} ms stall" if cause else "no stall before it"
        print(f"  t={(first - t0) // 1_000_000} ms: {n} late packets, {after}")


if __name__ == "__main__":
    main()

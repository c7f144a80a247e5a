"""Host stalls on one core: times the guest's vCPU did not run, whatever ran inside the guest.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic to run
beside one (the daemon's core is ``loadgen.procs.DAEMON_CORE``, 0). A
``SCHED_FIFO`` thread pinned to the core sleeps 1 ms at a time and notes every
sleep that lasted longer than ``--threshold-ms``. At real-time priority it
preempts any ordinary process on that core the moment its timer fires, so a
busy daemon does not delay it; what does is the core itself not running:
the hypervisor running another guest's vCPU, or the guest kernel with
interrupts off. ``core0_other_pct`` in the capacity bench counts other
*processes* on the daemon's core; this sees what that cannot.

Cost: about 1 000 wake-ups a second on the core (a few microseconds each,
well under 1 % of it), each one preempting the daemon for that long.

Needs the right to use ``SCHED_FIFO`` (root, or ``CAP_SYS_NICE``).

    python -m bench.diag_host_stalls --seconds 60 --out /tmp/stalls.json

Prints the count and the longest, with their ``time.monotonic()`` (the
clock the daemon's log and ``bench_capacity``'s windows use), and writes
them as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.loadgen.hostspeed import watch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threshold-ms", type=float, default=2.5, help="a 1 ms sleep longer than this")
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stalls = watch(args.seconds, args.threshold_ms / 1e3, args.core)
    longest = sorted(stalls, key=lambda s: -s[1])[:10]
    print(f"{len(stalls)} sleeps of 1 ms lasted over {args.threshold_ms} ms; longest: {longest}")
    if args.out is not None:
        args.out.write_text(json.dumps({"core": args.core, "threshold_ms": args.threshold_ms,
                                        "seconds": args.seconds, "stalls": stalls}))  # fmt: skip


if __name__ == "__main__":
    main()

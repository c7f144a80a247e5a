"""Where an active call's memory goes: the daemon's Python heap with N calls up minus idle.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for
``bench_memory.py``'s RSS per active call, which cannot say what a call holds.
``callbridge serve`` (the capacity workload's config, route ``talk``, Kova
from the reference server's tone engine) runs with ``tracemalloc`` from its
first line (``bench/loadgen/traced/sitecustomize.py``). N calls are placed,
held 3 s and hung up once (so one-off caches are not counted per call), then
a snapshot is taken at idle, N calls are placed again and held 3 s, and a
second snapshot is taken. The difference, by allocating line (``--key
lineno``, or ``filename`` / ``traceback`` with ``--frames``), is divided by
N. Allocations in C code that does not report to ``tracemalloc`` (uvloop's
handles, libc's own buffers) are not seen, and neither is how the allocator
places blocks in memory: the traced total against the RSS per call tells
those apart from the Python heap.

Pure Python gives the clearest lines (mypyc-compiled code has no Python frames
of its own). For a tree before a change, run its daemon with its own
``bench.loadgen`` (the config's keys change between trees).

    python -m bench.diag_heap_per_call [--calls 100] [--key lineno] [--frames 1] [--top 30]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.loadgen.procs import LOADGEN_CORE, ROOT, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad

TRACED_SITE = ROOT / "bench" / "loadgen" / "traced"


def _snapshot(d: DaemonUnderTest, out: Path, k: int) -> tracemalloc.Snapshot:
    os.kill(d.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while not (out / f"done{k}").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon wrote no snapshot (was it started traced?)")
        time.sleep(0.2)
    return tracemalloc.Snapshot.load(str(out / f"snap{k}.tm"))


def _hold(d: DaemonUnderTest, calls: int) -> RtpLoad:
    load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
    load.place(calls, rate_per_s=150)
    load.wait_answered(30)
    load.run_for(3)
    return load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--key", default="lineno", choices=("lineno", "filename", "traceback"))
    ap.add_argument("--frames", type=int, default=1, help="frames kept per allocation")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    pin_self(LOADGEN_CORE)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out = work / "snapshots"
        out.mkdir()
        env = {
            "TM_DIR": str(out),
            "TM_FRAMES": str(a.frames),
            "PYTHONPATH": os.pathsep.join([str(TRACED_SITE), str(ROOT), str(ROOT / "codecs")]),
        }
        tts = TtsProcess.start(work)
        d = DaemonUnderTest.start(work, tts.port, env=env)
        try:
            warm = _hold(d, a.calls)
            warm.hangup_all(settle_s=2)
            warm.close()
            time.sleep(3)
            idle = _snapshot(d, out, 1)
            load = _hold(d, a.calls)
            active = _snapshot(d, out, 2)
            load.hangup_all(settle_s=2)
            load.close()
        finally:
            d.stop()
            tts.stop()
    stats = active.compare_to(idle, a.key)
    total = sum(s.size_diff for s in stats)
    n = a.calls
    print(f"{ROOT}: traced heap with {n} calls up minus idle: {total / 1024:.1f} KiB, ", end="")
    print(f"{total / n / 1024:.2f} KiB per call")
    for s in stats[: a.top]:
        print(f"{s.size_diff / n:9.0f} B/call {s.count_diff / n:7.1f} blocks/call  {s.traceback}")


if __name__ == "__main__":
    main()

"""Memory: RSS per active call, RSS growth per completed call, fds and threads after the run.

Against ``callbridge serve`` (uvloop, core 0) over SIP/RTP:

1. RSS per active call: RSS with N calls up (route ``talk``: continuous TTS
   and inbound audio, 2 s settled) minus RSS idle after a warm-up, over N.
   The turn's whole rendered audio is queued in the call (the provider sends
   faster than real time), so this includes one turn's audio.
2. Growth per completed call: short calls (greeting, hung up once answered)
   in batches of 50; RSS after a warm-up of 200 calls and after the rest,
   difference over the number of calls.
3. ``/proc/<pid>/fd`` count and threads: idle before vs idle after. The
   daemon's asyncio task count is not exported (no gauge yet).

    python bench/bench_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write
from loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from loadgen.rtp import RtpLoad


def churn(d: DaemonUnderTest, calls: int, batch: int = 50) -> int:
    load = RtpLoad(("127.0.0.1", d.sip_port), route="greet")
    done = 0
    while done < calls:
        n = min(batch, calls - done)
        load.place(n, rate_per_s=400)
        load.wait_answered(10)
        load.run_for(0.05)
        load.hangup_all(settle_s=0.2)
        load.forget_calls()
        done += n
    load.run_for(1.0)
    load.close()
    return done


def idle_state(d: DaemonUnderTest) -> dict[str, int]:
    time.sleep(1.0)
    return {"rss_bytes": d.rss_bytes(), "fds": d.fd_count(), "threads": d.thread_count()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    total = 1000 if args.quick else 10000
    active_n = 100 if args.quick else 300
    pin_self()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        tts = TtsProcess.start(wd)
        d = DaemonUnderTest.start(wd, tts.port)
        try:
            churn(d, 100)
            before = idle_state(d)
            load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
            load.place(active_n, rate_per_s=150)
            answered = load.wait_answered(20)
            load.run_for(2.0)
            rss_active = d.rss_bytes()
            load.hangup_all(settle_s=1.5)
            load.close()
            per_call = (rss_active - before["rss_bytes"]) / max(1, answered)
            figures["active"] = {
                "calls": answered,
                "rss_idle_mb": round(before["rss_bytes"] / 1e6, 2),
                "rss_active_mb": round(rss_active / 1e6, 2),
                "rss_per_active_call_kb": round(per_call / 1024, 1),
            }
            print(f"RSS per active call: {per_call / 1024:.1f} KB ({answered} calls)")
            churn(d, 200)
            warm = idle_state(d)
            t0 = time.monotonic()
            n = churn(d, total - 200)
            wall = time.monotonic() - t0
            after = idle_state(d)
            growth = (after["rss_bytes"] - warm["rss_bytes"]) / max(1, n)
            figures["churn"] = {
                "calls": n,
                "wall_s": round(wall, 1),
                "rss_after_warmup_mb": round(warm["rss_bytes"] / 1e6, 2),
                "rss_after_mb": round(after["rss_bytes"] / 1e6, 2),
                "rss_growth_per_call_bytes": round(growth, 1),
                "cdr_lines": len(d.cdr_lines()),
            }
            figures["baseline"] = {"before": before, "after_warmup": warm, "after": after}
            figures["fds_back_to_baseline"] = after["fds"] <= before["fds"]
            figures["threads_back_to_baseline"] = after["threads"] <= before["threads"]
            print(f"RSS growth per completed call: {growth:.1f} B over {n} calls")
            print(f"fds {before['fds']} -> {after['fds']}, threads {before['threads']} -> "
                  f"{after['threads']}")  # fmt: skip
        finally:
            d.stop()
            tts.stop()
    figures["goal"] = {"rss_per_active_call_kb": 200, "rss_growth_per_call_bytes": 1024}
    figures["tasks"] = "not measured: the daemon exports no task-count gauge"
    path = write(
        "memory",
        figures,
        {"calls": total, "active_calls": active_n, "leg": "sip", "daemon": "uvloop, core 0"},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

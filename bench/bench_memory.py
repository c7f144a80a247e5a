"""Memory: RSS per active call, RSS growth per completed call, fds and threads after the run.

Against ``callbridge serve`` (uvloop, core 0) over SIP/RTP:

1. RSS per active call: RSS with N calls up (route ``talk``: continuous TTS
   and inbound audio, 2 s settled) minus RSS idle after a warm-up, over N.
   The provider sends a turn faster than real time and the call holds what
   it has of the turn as the provider's audio (mu-law here; transcoded to
   frames only a few ticks ahead). The turn's text (six sentences, ~15 s)
   goes to the provider a sentence at a time, ``text_ahead_s`` (3 s, the
   default) ahead of playout, so a call holds a few seconds of it; the
   baseline in the same run is a daemon with ``text_ahead_s = 0`` (the text
   sent whole, the call holding most of the turn), measured first, on its
   own daemon. The calls stay up ``TASKS_REFRESH_S`` more for the task count.
2. Growth per completed call: short calls (greeting, hung up once answered)
   in batches of 50. A completed call's SIP transactions stay in memory for
   64 x T1 = 32 s after it ends (Timers J and L, RFC 3261 / RFC 6026), so
   RSS climbs for the first 32 s of calls at any rate and then levels off:
   that is the RFC's retention window, not a leak. Both RSS readings are
   taken after ``SIP_RETENTION_S`` idle, when every transaction has expired;
   growth is their difference over the calls in between.

   The warm-up is the same churn as the measured one (the same number of
   calls, batches and pace). RSS after a burst of calls stays at the Python
   heap's high-water mark: pymalloc hands a 1 MiB arena back only when every
   block in it is free, and the long-lived entries that bounded caches keep
   replacing (SIP parse memos, uvloop's sockaddr cache) end up in arenas all
   over the heap, so none is ever freed. The peak of a churn is about
   rate x 32 s of completed calls' SIP transactions (~8.5 KB each); a
   warm-up that runs slower than the measured churn (the first version of
   this bench: 35 s of calls at ~70/s against 10 000 at ~97/s) peaks lower,
   and the difference between the two peaks reads as growth per call (2.9
   KB per call, with the heap's live blocks flat). A leak grows with every
   call whatever the peak; after a twin warm-up that is all that is left.
3. ``/proc/<pid>/fd`` count, threads and asyncio tasks (the daemon's
   ``callbridge_tasks`` gauge on ``/metrics``): idle before vs idle after,
   and tasks with the active calls up. Provider connections opened for the
   active calls stay open until idle for ``close_idle_after_s`` (60 s; a
   churn's turns keep them busy until it ends), so the "after" count that is
   compared with the baseline is read once that has passed
   (``after_idle_close``).
4. With a call always up (``busy_churn``): short calls while one long call
   stays up, RSS before and 2 s after, and what the GC policy's thaw finds
   unreachable once the long call ends (ended calls must be freed by
   reference counting: ``tests/e2e/test_call_release.py``).
5. ``callbridge_pacing_deviation_seconds_count`` after the active calls: the
   daemon really observes its departure deviations (one frame in
   ``PACING_SAMPLE_EVERY``).

    python -m bench.bench_memory [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write
from bench.loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad


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


SIP_RETENTION_S = 33.0
"""64 x T1 (32 s) plus a margin: how long a completed call's transactions live."""

CLOSE_IDLE_AFTER_S = 60.0
"""The providers' default ``close_idle_after_s``: idle connections beyond a spare close then."""

TASKS_REFRESH_S = 5.5
"""The daemon refreshes ``callbridge_tasks`` with its status line, every 5 s."""


RELEASE_CHECK_S = 31.0
"""The daemon checks an ended call was freed 30 s after its end (``RELEASE_GRACE_S``)."""


def busy_churn(d: DaemonUnderTest, calls: int) -> dict[str, Any]:
    """``calls`` short calls while one long call stays up, as on a node that is never idle.

    The daemon's GC policy freezes what has lived 0.1 s while calls are up and
    only collects it at a thaw (no call up, or with calls up on evidence of
    cycles: a call not freed 30 s after its end, the collector's young passes
    finding them). Between the growth churn's batches no call is up, so it
    thaws then; here it cannot until the long call ends, and any reference
    cycle an ended call left behind is still in RSS (read 2 s after the churn,
    within the SIP retention window, so ~rate x 32 s of transactions are in it
    too) and is what the thaw at the end finds unreachable. The long call
    stays up until the daemon has checked every churned call was freed
    (``call.not_released`` lines, none expected) and any busy thaw that
    evidence brought is in the log.
    """
    talk = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
    talk.place(1, rate_per_s=10)
    talk.wait_answered(10)
    talk.run_for(0.5)
    thaws_before = len(d.log_events("gc.thaw"))
    unreleased_before = len(d.log_events("call.not_released"))
    rss0 = d.rss_bytes()
    t0 = time.monotonic()
    n = churn(d, calls)
    wall = time.monotonic() - t0
    time.sleep(2.0)
    rss1 = d.rss_bytes()
    talk.run_for(RELEASE_CHECK_S)
    unreleased = len(d.log_events("call.not_released")) - unreleased_before
    talk.hangup_all(settle_s=1.0)
    talk.close()
    time.sleep(3.0)  # the GC policy is asked every 0.1 s: a thaw with no call up
    thaws = d.log_events("gc.thaw")[thaws_before:]
    return {
        "calls": n,
        "calls_per_s": round(n / wall, 1),
        "rss_before_mb": round(rss0 / 1e6, 2),
        "rss_after_mb": round(rss1 / 1e6, 2),
        "rss_growth_per_call_bytes": round((rss1 - rss0) / max(1, n)),
        "thaw_unreachable": [t.get("unreachable") for t in thaws],
        "thaw_types": [t.get("types", {}) for t in thaws],  # an idle thaw names what it found
        "thaw_pass_ms": [t.get("pass_ms") for t in thaws],
        "thaws_with_calls_up": sum(1 for t in thaws if t.get("calls")),
        "young_found": [t.get("young_found") for t in thaws],
        "calls_not_released": unreleased,
    }


def tasks(d: DaemonUnderTest) -> int:
    """The daemon's asyncio task count (``callbridge_tasks``; wait ``TASKS_REFRESH_S`` first)."""
    samples = d.metric_samples("callbridge_tasks")
    return int(next(iter(samples.values()), -1))


def pacing_observations(d: DaemonUnderTest) -> int:
    samples = d.metric_samples("callbridge_pacing_deviation_seconds_count")
    return int(sum(samples.values()))


def idle_state(d: DaemonUnderTest) -> dict[str, int]:
    time.sleep(TASKS_REFRESH_S)
    return {
        "rss_bytes": d.rss_bytes(),
        "fds": d.fd_count(),
        "threads": d.thread_count(),
        "tasks": tasks(d),
    }


def active_calls(d: DaemonUnderTest, n: int) -> dict[str, Any]:
    """RSS per active call with ``n`` ``talk`` calls up (after a warm-up churn)."""
    churn(d, 100)
    before = idle_state(d)
    load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
    load.place(n, rate_per_s=150)
    answered = load.wait_answered(20)
    load.run_for(2.0)
    rss_active = d.rss_bytes()
    load.run_for(TASKS_REFRESH_S)
    tasks_active = tasks(d)
    load.hangup_all(settle_s=1.5)
    load.close()
    per_call = (rss_active - before["rss_bytes"]) / max(1, answered)
    return {
        "calls": answered,
        "rss_idle_mb": round(before["rss_bytes"] / 1e6, 2),
        "rss_active_mb": round(rss_active / 1e6, 2),
        "rss_per_active_call_kb": round(per_call / 1024, 1),
        "tasks_active": tasks_active,
        "pacing_deviation_observations": pacing_observations(d),
        "idle_before": before,
    }


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
        (wd / "whole").mkdir()
        whole = DaemonUnderTest.start(wd / "whole", tts.port, provider_extra="text_ahead_s = 0\n")
        try:
            figures["active_text_whole"] = active_calls(whole, active_n)
        finally:
            whole.stop()
        baseline_kb = figures["active_text_whole"]["rss_per_active_call_kb"]
        print(f"RSS per active call, text sent whole (baseline): {baseline_kb:.1f} KB")
        d = DaemonUnderTest.start(wd, tts.port)
        try:
            active = figures["active"] = active_calls(d, active_n)
            before = active.pop("idle_before")
            figures["active_text_whole"].pop("idle_before")
            per_call_kb = active["rss_per_active_call_kb"]
            answered = active["calls"]
            figures["active_ratio_whole_vs_paced"] = round(baseline_kb / per_call_kb, 2)
            print(f"RSS per active call: {per_call_kb:.1f} KB ({answered} calls; text paced)")
            print(
                f"tasks with {answered} calls up: {active['tasks_active']}; pacing deviations"
                f" observed: {active['pacing_deviation_observations']}"
            )
            t_warm = time.monotonic()
            warm_calls = churn(d, total)  # the measured churn's twin: the same peak
            warm_wall = time.monotonic() - t_warm
            time.sleep(SIP_RETENTION_S)
            warm = idle_state(d)
            t0 = time.monotonic()
            n = churn(d, total)
            wall = time.monotonic() - t0
            time.sleep(SIP_RETENTION_S)
            after = idle_state(d)
            # the connections the churn kept busy: closed once idle long enough
            time.sleep(max(0.0, CLOSE_IDLE_AFTER_S + 3.0 - (time.monotonic() - t0 - wall)))
            closed = idle_state(d)
            growth = (after["rss_bytes"] - warm["rss_bytes"]) / max(1, n)
            figures["churn"] = {
                "calls": n,
                "warmup_calls": warm_calls,
                "warmup_s": round(warm_wall, 1),
                "idle_before_readings_s": SIP_RETENTION_S,
                "wall_s": round(wall, 1),
                "calls_per_s": round(n / wall, 1),
                "warmup_calls_per_s": round(warm_calls / warm_wall, 1),
                "rss_after_warmup_mb": round(warm["rss_bytes"] / 1e6, 2),
                "rss_after_mb": round(after["rss_bytes"] / 1e6, 2),
                "rss_growth_per_call_bytes": round(growth, 1),
                "cdr_lines": len(d.cdr_lines()),
            }
            figures["baseline"] = {
                "before": before,
                "after_warmup": warm,
                "after": after,
                "after_idle_close": closed,
            }
            figures["fds_back_to_baseline"] = closed["fds"] <= before["fds"]
            figures["threads_back_to_baseline"] = closed["threads"] <= before["threads"]
            figures["tasks_back_to_baseline"] = closed["tasks"] <= before["tasks"]
            print(f"RSS growth per completed call: {growth:.1f} B over {n} calls")
            print(f"fds {before['fds']} -> {after['fds']} -> {closed['fds']} (idle connections"
                  f" closed), threads {before['threads']} -> {closed['threads']}, tasks"
                  f" {before['tasks']} -> {after['tasks']} -> {closed['tasks']}")  # fmt: skip
            figures["busy"] = busy_churn(d, 1000 if args.quick else 4000)
            print(f"with a call always up: {figures['busy']}")
            figures["calls_not_released"] = len(d.log_events("call.not_released"))
            figures["calls_held"] = len(d.log_events("call.held"))
            print(f"ended calls not freed 30 s later: {figures['calls_not_released']}")
        finally:
            d.stop()
            tts.stop()
    figures["goal"] = {"rss_per_active_call_kb": 200, "rss_growth_per_call_bytes": 1024}
    path = write(
        "memory",
        figures,
        {"calls": total, "active_calls": active_n, "leg": "sip", "daemon": "uvloop, core 0"},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

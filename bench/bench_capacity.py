"""Capacity: concurrent full-duplex calls one daemon process on one core holds at the pacing bar.

Each call: inbound PCMU every 20 ms (quiet noise: the VAD runs on every frame),
outbound TTS without pause (route ``talk``: a flow saying a ~15 s text again
and again, Kova protocol from the reference server's tone engine, prompt
cache off), either 8 kHz mu-law (pass-through) or 24 kHz PCM (resampled).
The daemon (uvloop) is pinned to core 0; the load generator and the TTS
server share core 1. The call count steps up; a step meets the bar when every
call was answered, every call's p99 departure deviation (seen by the
receiver, kernel timestamps) is <= 2 ms and the calls' CDRs count zero
underruns caused by the daemon (``underruns`` less ``underruns_provider``:
a frame is the provider's when it had not sent the frame's audio yet: the
daemon held none of it, and none of it was among the bytes waiting unread on
the turn's provider connection at that tick;
both counts are printed, ``undr`` as ``daemon/provider``). Reported per
step: daemon CPU, CPU microseconds per call-second
(``/proc/<pid>/stat``), pacing, late wake-ups, what else used core 0, and a
``py-spy`` profile of the daemon at the largest step.

Windows are 20 s, in both modes: every call of a step starts its first turn
within the few seconds the calls take to be placed, so ~15 s later all their
turns restart together, and the provider sends that many turns' audio at once
(far faster than real time). A window shorter than that misses the hardest
second of the workload (the third pass's 4 s windows did: docs/benchmarks.md,
section 3).

The host's own speed is measured on core 0 before and after the run and
recorded with it (``host_speed``: ``loadgen/hostspeed.py``, workloads no
project code moves), since the VM's host has run the same code 45 % slower
from one hour to the next: figures from runs whose host speeds differ are not
comparable.

    python -m bench.bench_capacity [--quick]
    python -m bench.bench_capacity --steps 200,300,400,500 --configs sip_mulaw,twilio_mulaw \
        --measure-s 20 --reps 3 --name capacity_extra_steps
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import write
from bench.loadgen.hostspeed import describe, host_speed
from bench.loadgen.procs import DAEMON_CORE, LOADGEN_CORE, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.steps import meets_bar, sip_step, summarize_profile, ws_step

CONFIGS = (("sip", False), ("sip", True), ("twilio", False), ("twilio", True))


def underruns_cell(step: dict[str, Any]) -> str:
    """``daemon/provider`` underrun frames of a step (``daemon`` alone from older CDRs)."""
    daemon = step.get("underruns_daemon", step["underruns"])
    return f"{daemon}/{step.get('underruns_provider', '-')}"


CAPACITY_PROVIDER_SETTINGS = "turns_per_connection = 1\nflow_control_ahead_s = 4\n"
"""Provider settings of the capacity runs (recorded in each result's settings): what
docs/providers.md recommends for a busy node, one turn per connection (thirteenth pass)
and flow control (fifteenth pass: with a provider faster than real time, a restarted
turn's first audio otherwise waits behind the bulk of every other call's turn)."""


def run_config(
    workdir: Path, leg: str, pcm24k: bool, steps: list[int], measure_s: float, reps: int
) -> dict[str, Any]:
    tts = TtsProcess.start(workdir)
    d = DaemonUnderTest.start(
        workdir, tts.port, pcm24k=pcm24k, provider_extra=CAPACITY_PROVIDER_SETTINGS
    )
    results: list[dict[str, Any]] = []
    best = 0
    failures = 0
    try:
        for i, n in enumerate(steps):
            runs = []
            for r in range(reps):
                prof = workdir / f"prof_{n}.txt" if r == 0 and i == len(steps) - 1 else None
                step = (sip_step if leg == "sip" else ws_step)(d, tts, n, measure_s, profile=prof)
                runs.append(step)
            ok = sum(meets_bar(s) for s in runs) > reps // 2
            worst = [s["pacing"].get("worst_call_p99_ms", float("nan")) for s in runs]
            cpu = [s["cpu_us_per_call_s"] for s in runs]
            row = {
                "calls": n,
                "meets_bar": ok,
                "worst_call_p99_ms_median": statistics.median(worst),
                "worst_call_p99_ms_spread": [min(worst), max(worst)],
                "cpu_us_per_call_s_median": statistics.median(cpu),
                "cpu_us_per_call_s_spread": [min(cpu), max(cpu)],
                "runs": runs,
            }
            results.append(row)
            s0 = runs[0]
            print(
                f"{leg:<7} {'pcm24k' if pcm24k else 'mulaw':<7} {n:>5} {ok!s:<6}"
                f" {s0['answered']:>5} {s0['daemon_cpu_pct']:>6}"
                f" {row['cpu_us_per_call_s_median']:>8}"
                f" {s0['pacing'].get('p50_ms', '-'):>7} {s0['pacing'].get('p99_ms', '-'):>7}"
                f" {row['worst_call_p99_ms_median']:>8} {s0['pacing'].get('max_ms', '-'):>7}"
                f" {underruns_cell(s0):>9} {s0['late_wakeups']:>6} {s0['core0_other_pct']:>6}",
                flush=True,
            )
            if ok:
                best = n
            else:
                failures += 1
                if failures >= 2:
                    break
        profiles = sorted(workdir.glob("prof_*.txt"))
        profile = summarize_profile(profiles[-1]) if profiles else {}
    finally:
        d.stop()
        tts.stop()
    return {"last_step_meeting_bar": best, "steps": results, "profile": profile}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", default="", help="call counts, e.g. 200,300,400 (default by mode)")
    ap.add_argument("--configs", default="", help="e.g. sip_mulaw,sip_pcm24k,twilio_mulaw")
    ap.add_argument("--measure-s", type=float, default=0.0, help="window per step, s")
    ap.add_argument("--reps", type=int, default=0, help="runs per step (default by mode)")
    ap.add_argument("--name", default="capacity", help="results file name (bench/results)")
    args = ap.parse_args()
    configs: tuple[tuple[str, bool], ...]
    if args.quick:
        steps, measure_s, reps, configs = [50, 100], 20.0, 1, CONFIGS[:3]
    else:
        steps, measure_s, reps, configs = [50, 100, 200, 300, 400, 500, 600], 20.0, 3, CONFIGS
    if args.steps:
        steps = [int(n) for n in args.steps.split(",")]
    if args.configs:
        by_name = {f"{leg}_{'pcm24k' if pcm else 'mulaw'}": (leg, pcm) for leg, pcm in CONFIGS}
        unknown = [c for c in args.configs.split(",") if c not in by_name]
        if unknown:
            ap.error(f"unknown config(s) {unknown}; choose from {sorted(by_name)}")
        configs = tuple(by_name[c] for c in args.configs.split(","))
    measure_s = args.measure_s or measure_s
    reps = args.reps or reps
    pin_self()
    speed_before = host_speed(DAEMON_CORE, LOADGEN_CORE)
    print(describe(speed_before), flush=True)
    print(
        f"{'leg':<7} {'audio':<7} {'calls':>5} {'bar':<6} {'ans':>5} {'cpu%':>6} {'us/c-s':>8}"
        f" {'p50ms':>7} {'p99ms':>7} {'worst99':>8} {'maxms':>7} {'undr':>9} {'late':>6}"
        f" {'core0+':>6}"
    )
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for leg, pcm24k in configs:
            wd = Path(tmp) / f"{leg}_{pcm24k}"
            wd.mkdir()
            key = f"{leg}_{'pcm24k' if pcm24k else 'mulaw'}"
            figures[key] = run_config(wd, leg, pcm24k, steps, measure_s, reps)
            print(f"{key}: last step meeting the bar: {figures[key]['last_step_meeting_bar']}")
    figures["goal"] = {"calls_per_core": 500, "p99_ms": 2.0, "underruns_daemon": 0}
    speed_after = host_speed(DAEMON_CORE, LOADGEN_CORE)
    print(describe(speed_after))
    figures["host_speed"] = {"before": speed_before, "after": speed_after}
    path = write(
        args.name,
        figures,
        {
            "steps": steps,
            "measure_s": measure_s,
            "repetitions": reps,
            "route": "talk (flow: ~15 s text said again and again), prompt cache off",
            "provider": "kova via ttsd tone engine (mulaw/8000 or pcm/24000 via provider options)",
            "provider_settings": CAPACITY_PROVIDER_SETTINGS.strip(),
            "inbound": "PCMU 20 ms, quiet noise (VAD on every frame, no barge-in)",
            "daemon": "callbridge serve, uvloop, pinned to core 0",
            "load_generator": "pinned to core 1 with the TTS server",
            "machine_note": "shared 2-core VM: core0_other_pct is CPU others used on core 0",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

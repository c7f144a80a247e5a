"""Simulate where talkspurt starts put the calls' frames: bucket occupancy and added delay.

Usage: python -m bench.bench_ticker [--quick] [--out PATH]

No sockets, no sleeping, no wall clock: the real pure-data
``bridge.media.clock.Ticker`` (configured as the daemon's shell configures it:
slot phases half a millisecond into the millisecond) is driven on a simulated
clock by a model of the shell ``bridge.io.ticker.MediaTicker``:

* the timer is armed 0.5 ms after ``next_deadline()`` (``ARM_BEFORE_S`` before
  the earliest frame deadline) and fires as uvloop's does: at the whole
  millisecond nearest to what was armed, here 0.3 ms into it (as in
  ``bench_rtp``); a wake-up ticks every stream ``due(now)`` returns;
* a talkspurt start (a turn's first audio is ready) is served by a pass of
  the loop at the moment it is asked for: ``Ticker.start_talkspurt(key, now)``,
  then ``due(now)``, as the shell's talkspurt pass does.

N streams (calls) are added over the first second (each on the least-loaded
slot, as the daemon does), then go through ``ROUNDS`` rounds of turn restarts
two seconds apart; in each round every stream starts one talkspurt, at times
drawn from one of two patterns:

* ``uniform``: uniformly over one second (turns restarting in the same second);
* ``clusters``: in clusters of 5-64 starts (uniform size) that fall in the
  same 100 us, the clusters uniformly over one second (one read from the
  provider connection carrying many turns' first audio);
* ``locked``: at the same phase of the period, spread over one second, within
  100 us of it (turns that start at correlated instants: calls placed at 25/s,
  one every two periods; a flow's gather timeout, a whole number of periods
  after the turn before; a cached prompt started inside its call's wake-up).

Figures, pooled over ``seeds`` seeds, for each rule (``once``:
``talkspurt_buckets`` = 1, every first frame at once; ``two``: the
least-loaded of the next two buckets, ``talkspurt_share`` = 0; ``share``: the
default, which goes on past those two to a bucket within its fair share
when both are over it). Scheduling only (no CPU model; 100-600 calls):

* ``bucket_occupancy``: calls per 1 ms phase of the 20 ms period, sampled
  every 20 ms from the first restart to 0.2 s after the last: p50, p99, max
  (the ideal is N / 20);
* ``frames_per_wakeup``: frames each timer wake-up sends: p99, max, and the
  share of wake-ups with more than 27 frames: the daemon's work per frame is
  ~37 us of CPU at 300 calls (SIP, mu-law; docs/benchmarks.md section 3), so
  those hold over 1 ms of work and make the next wake-up late;
* ``added_by_rule``: how long the rule holds a turn's first frame (its
  deadline minus the pass that chose it; 0 when it leaves in that pass):
  p50, p99, max, and the share held at all.

With a CPU model (300-500 calls; 600 calls x 37 us x 50 is over one core):
the core works through each wake-up's frames at 37 us a frame, and a
wake-up or a pass starts only once the core is free:

* ``pacing_deviation``: |frame sent - its deadline on the grid| for every
  frame: p50, p99, max, and the share over 2 ms;
* ``first_frame_delay``: request -> the turn's first frame sent, queueing
  included: p50, p99, max.

And ``start_talkspurt_cpu_us``: ``Ticker.start_talkspurt`` itself, CPU
microseconds per call (``time.process_time``, median of 5 repetitions of N
calls on a ticker of N streams).

A sweep of ``talkspurt_buckets`` = 1..4 at 400 calls shows the trade between
occupancy and delay that chose the default.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import machine, pct
from bridge.media.clock import ClockConfig, Ticker, TickerConfig

ROOT = Path(__file__).resolve().parent.parent
PTIME_S = 0.020
ARM_AFTER_WAKE_S = 0.0005  # the shell arms at next_deadline() + early_tolerance - ARM_BEFORE_S
FIRE_INTO_MS_S = 0.0003
ROUNDS = 3
ROUND_GAP_S = 2.0
US_PER_FRAME = 37.0
CPU_PER_FRAME_S = US_PER_FRAME * 1e-6
BUDGET_FRAMES = int(1000 / US_PER_FRAME)  # 27 frames = 1 ms of work
PATTERNS = ("uniform", "clusters", "locked")


def _config(buckets: int, share: float = 0.0) -> TickerConfig:
    return TickerConfig(
        ClockConfig(), epoch_s=0.0005, talkspurt_buckets=buckets, talkspurt_share=share
    )


def talkspurt_times(n: int, pattern: str, t0: float, rng: random.Random) -> list[tuple[float, int]]:
    """(time, stream) of one round: every stream starts one talkspurt."""
    keys = list(range(n))
    rng.shuffle(keys)
    starts: list[tuple[float, int]] = []
    if pattern == "uniform":
        starts = [(t0 + rng.random(), k) for k in keys]
    elif pattern == "locked":
        periods = round(1.0 / PTIME_S)
        starts = [(t0 + (j % periods) * PTIME_S + rng.random() * 100e-6, k)
                  for j, k in enumerate(keys)]  # fmt: skip
    else:
        i = 0
        while i < n:
            size = rng.randint(5, 64)
            at = t0 + rng.random()
            starts += [(at + rng.random() * 100e-6, k) for k in keys[i : i + size]]
            i += size
    starts.sort()
    return starts


def simulate(
    n: int, pattern: str, rule: tuple[int, float], seed: int, cpu_s: float
) -> dict[str, Any]:
    """One run; ``cpu_s`` is the CPU each frame costs the one core (0: scheduling only)."""
    rng = random.Random(seed)
    ticker: Ticker[int] = Ticker(_config(*rule))
    clocks = [ticker.add(k, rng.random()) for k in range(n)]  # calls placed over a second
    requests: list[tuple[float, int]] = []
    for r in range(ROUNDS):
        requests += talkspurt_times(n, pattern, 2.0 + r * ROUND_GAP_S, rng)
    measure_from_s = requests[0][0]
    end_s = requests[-1][0] + 0.2
    pending: dict[int, tuple[int, float]] = {}  # stream -> (first frame index, asked at)
    held: list[float] = []  # the first frame's deadline - the pass that chose it
    delays: list[float] = []  # request -> first frame sent
    deviation: list[float] = []  # every frame: |sent - its deadline on the grid|
    per_wakeup: list[int] = []  # frames sent by each timer wake-up
    occupancy: list[int] = []  # calls per 1 ms phase of the period, every 20 ms
    busy_until = 0.0  # the one core: a wake-up's frames are worked through in turn
    next_sample_s = measure_from_s

    def serve(now: float) -> tuple[float, int]:
        done = now
        sent = 0
        for key in ticker.due(now):
            clock = clocks[key]
            frame = clock.tick(now)
            if frame is None:
                continue
            sent += 1
            done += cpu_s
            if now >= measure_from_s:
                deviation.append(abs(done - clock.deadline(frame)))
            first = pending.get(key)
            if first is not None and frame >= first[0]:
                delays.append(done - first[1])
                del pending[key]
        return done, sent

    i = 0
    while True:
        wake_s = ticker.next_deadline()
        assert wake_s is not None
        fire_s = round((wake_s + ARM_AFTER_WAKE_S) * 1000) / 1000 + FIRE_INTO_MS_S
        now = max(fire_s, busy_until)
        while next_sample_s <= min(now, end_s):
            phases = [0] * 20
            for c in clocks:
                phases[int((c.next_deadline() % PTIME_S) * 1000) % 20] += 1
            occupancy += phases
            next_sample_s += PTIME_S
        if i < len(requests) and requests[i][0] <= now:
            at, key = requests[i]
            i += 1
            now = max(at, busy_until)  # the loop's next pass
            pending[key] = (clocks[key].next_frame, at)
            first_due_s = ticker.start_talkspurt(key, now)
            held.append(0.0 if clocks[key].next_deadline() <= now else first_due_s - now)
            busy_until, _ = serve(now)
            continue
        if now > end_s:
            break
        busy_until, sent = serve(now)
        if now >= measure_from_s:
            per_wakeup.append(sent)
    return {
        "held": held,
        "delays": delays,
        "deviation": deviation,
        "per_wakeup": per_wakeup,
        "occupancy": occupancy,
    }


def start_talkspurt_cpu_us(n: int, rule: tuple[int, float], repeats: int = 5) -> float:
    """CPU per ``Ticker.start_talkspurt`` call on a ticker of n streams (median of repeats)."""
    runs = []
    for r in range(repeats):
        rng = random.Random(r)
        ticker: Ticker[int] = Ticker(_config(*rule))
        for k in range(n):
            ticker.add(k, 0.0)
        order = list(range(n))
        rng.shuffle(order)
        times = [0.0213 + j * 18e-3 / n for j in range(n)]  # within one period, not yet due
        start = time.process_time()
        for key, now in zip(order, times, strict=True):
            ticker.start_talkspurt(key, now)
        runs.append((time.process_time() - start) / n * 1e6)
    return round(statistics.median(runs), 3)


def _ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3),
    }


def figures(
    n: int, pattern: str, rule: tuple[int, float], seeds: int, cpu_s: float
) -> dict[str, Any]:
    pooled: dict[str, list[Any]] = {}
    for seed in range(seeds):
        for name, values in simulate(n, pattern, rule, seed, cpu_s).items():
            pooled.setdefault(name, []).extend(values)
    if cpu_s:
        deviation = pooled["deviation"]
        return {
            "pacing_deviation": {
                **_ms(deviation),
                "over_2ms_share": round(sum(v > 0.002 for v in deviation) / len(deviation), 4),
            },
            "first_frame_delay": _ms(pooled["delays"]),
        }
    occupancy = [float(c) for c in pooled["occupancy"]]
    per_wakeup = [float(c) for c in pooled["per_wakeup"]]
    held = pooled["held"]
    return {
        "bucket_occupancy": {
            "p50": statistics.median(occupancy),
            "p99": pct(occupancy, 99),
            "max": max(occupancy),
            "ideal": n / 20,
        },
        "frames_per_wakeup": {
            "p99": pct(per_wakeup, 99),
            "max": max(per_wakeup),
            "over_budget_share": round(
                sum(c > BUDGET_FRAMES for c in per_wakeup) / len(per_wakeup), 4
            ),
        },
        "added_by_rule": {
            **_ms(held),
            "held_share": round(sum(h > 0 for h in held) / len(held), 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ticker.json")
    args = parser.parse_args()
    sizes = (100, 400, 600) if args.quick else (100, 200, 300, 400, 500, 600)
    seeds = 2 if args.quick else 5
    default = TickerConfig()
    rules = {
        "once": (1, 0.0),
        "two": (default.talkspurt_buckets, 0.0),
        "share": (default.talkspurt_buckets, default.talkspurt_share),
    }
    cpu_sizes = (300, 400) if args.quick else (300, 400, 500)
    results: dict[str, Any] = {
        "rules": rules,
        "runs": [],
        "sweep_400": [],
        "cpu_model": [],
        "cpu": [],
    }
    print(f"rules (talkspurt_buckets, talkspurt_share): {rules}; {seeds} seeds x {ROUNDS} rounds")
    header = (
        f"{'calls':>5} {'pattern':>8} {'rule':>6} | {'calls/bucket p99':>16} {'max':>4} |"
        f" {'frames/wake-up p99':>18} {'max':>4} {'>27':>6} |"
        f" {'held p50':>8} {'p99':>5} {'max':>5} {'share':>5}"
    )

    def row(n: int, pattern: str, label: str, f: dict[str, Any]) -> None:
        occ, fpw, held = f["bucket_occupancy"], f["frames_per_wakeup"], f["added_by_rule"]
        print(
            f"{n:>5} {pattern:>8} {label:>6} | {occ['p99']:>16.0f} {occ['max']:>4.0f} |"
            f" {fpw['p99']:>18.0f} {fpw['max']:>4.0f} {fpw['over_budget_share']:>6.3f} |"
            f" {held['p50_ms']:>8.2f} {held['p99_ms']:>5.2f} {held['max_ms']:>5.2f}"
            f" {held['held_share']:>5.2f}"
        )

    print("\nscheduling only (no CPU model): where the rule puts the calls")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for pattern in PATTERNS:
            for label, rule in rules.items():
                f = figures(n, pattern, rule, seeds, 0.0)
                results["runs"].append({"calls": n, "pattern": pattern, "rule": label, **f})
                row(n, pattern, label, f)
    print("\nsweep of talkspurt_buckets at 400 calls")
    print(header)
    print("-" * len(header))
    for pattern in PATTERNS:
        for k in (1, 2, 3, 4):
            f = figures(400, pattern, (k, 0.0), seeds, 0.0)
            results["sweep_400"].append({"pattern": pattern, "talkspurt_buckets": k, **f})
            row(400, pattern, f"k={k}", f)
    cpu_header = (
        f"{'calls':>5} {'pattern':>8} {'rule':>6} | {'|dev| p50':>9} {'p99':>6} {'max':>6}"
        f" {'>2ms':>6} | {'first frame p50':>15} {'p99':>6} {'max':>6}"
    )
    print(
        f"\nwith a CPU model: every frame costs the core {US_PER_FRAME:.0f} us (SIP at 300 calls)"
    )
    print(cpu_header)
    print("-" * len(cpu_header))
    for n in cpu_sizes:
        for pattern in PATTERNS:
            for label, rule in rules.items():
                f = figures(n, pattern, rule, seeds, CPU_PER_FRAME_S)
                results["cpu_model"].append({"calls": n, "pattern": pattern, "rule": label, **f})
                dev, first = f["pacing_deviation"], f["first_frame_delay"]
                print(
                    f"{n:>5} {pattern:>8} {label:>6} | {dev['p50_ms']:>9.3f} {dev['p99_ms']:>6.3f}"
                    f" {dev['max_ms']:>6.3f} {dev['over_2ms_share']:>6.3f} |"
                    f" {first['p50_ms']:>15.3f} {first['p99_ms']:>6.3f} {first['max_ms']:>6.3f}"
                )
    print("\nTicker.start_talkspurt, CPU us per call (median of 5)")
    for n in (100, 400):
        for label, rule in rules.items():
            us = start_talkspurt_cpu_us(n, rule)
            results["cpu"].append({"calls": n, "rule": label, "start_talkspurt_cpu_us": us})
            print(f"{n:>5} {label:>6}: {us:.3f}")
    settings = {
        "quick": args.quick,
        "sizes": sizes,
        "cpu_model_sizes": cpu_sizes,
        "seeds": seeds,
        "rounds": ROUNDS,
        "round_gap_s": ROUND_GAP_S,
        "us_per_frame": US_PER_FRAME,
        "budget_frames_per_wakeup": BUDGET_FRAMES,
        "timer": "armed next_deadline()+0.5 ms, fires at the nearest ms + 0.3 ms",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine(), "settings": settings, "figures": results}, indent=2)
        + "\n"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

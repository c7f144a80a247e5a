"""What the daemon's loop does per callback under the demo IVR: the work behind long ticks.

Not a benchmark (``run_all.py`` runs only ``bench_*.py``): a diagnostic for
``bench_ivr.py``'s pacing figure that does not trust wall-clock latency on a
shared host. It runs ``callbridge serve`` with the demo config (as
``bench_ivr.py`` does: embedded Piper voice, the demo flow; ``cache_dir`` of
the run's own, warmed by a first start unless ``--cold``) on the plain
asyncio loop, whose callbacks (``asyncio.events.Handle._run``) it times
in-process with ``time.thread_time`` (CPU time of the loop's thread: a
callback preempted by another process is not counted as long). Per callback
name (a task's coroutine, a timer's function) it keeps the count, the CPU
time, the longest, and how many took over 1, 2, 5 and 10 ms. With
``--profile`` a ``cProfile`` of the whole measured window is written too.

The window starts after every call is answered (``--with-ramp`` counts the
ramp as well), so the bench's own ramp is told apart from the steady state.
On a host other work keeps busy, ``--fifo 5`` (as root) runs the daemon
``SCHED_FIFO``, so other processes on its core cannot delay its wake-ups
(``--nice`` does not: a plain 1 ms timer loop at nice -15 woke 5-6 ms late at
p99 on a loaded 2-core host, at ``SCHED_FIFO`` 1.0 ms).

    python -m bench.diag_ivr_ticks [--calls 100] [--rate 25] [--hold-s 30] \
        [--profile /tmp/ivr.prof] [--with-ramp] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OVER_MS = (1.0, 2.0, 5.0, 10.0)
PROBES = (
    "bridge.io.ticker:MediaTicker._send_and_read",
    "bridge.io.ticker:MediaTicker._work",
    "bridge.io.legs.sip_call:_SipCall._process",
    "bridge.io.callrun:CallRunner._on_frame",
    "bridge.io.callrun:CallRunner.pump",
    "bridge.io.callrun:CallRunner._provider_sink",
    "bridge.providers.failover:Speaker.speak",
    "bridge.media.call:CallBridge.tick",
    "bridge.media.call:CallBridge.caller_audio",
    "bridge.media.call:CallBridge.provider_event",
    "bridge.media.call:CallBridge.execute",
)
"""Functions timed inside the loop's callbacks (nested ones count in both)."""
LONG_MS = 3.0
"""A callback longer than this has its anatomy kept: what the probes inside it did."""


def _child(cfg: str, out: str, profile: str, share: str) -> int:
    """The daemon, its loop's callbacks timed (SIGUSR1 starts the window, SIGUSR2 ends it)."""
    import asyncio.events
    import cProfile
    import dataclasses
    import functools

    from bridge.cli import main

    stats: dict[str, list[float]] = {}
    inside: dict[str, list[float]] = {}  # the current callback's probes: name -> [n, ms]
    long: list[dict[str, Any]] = []
    spread: list[list[int]] = []  # once a second: streams per millisecond of the period
    next_sample = [0.0]
    on = [False]
    prof = cProfile.Profile() if profile else None
    orig = asyncio.events.Handle._run

    from bridge.io.ticker import MediaTicker

    tickers: list[Any] = []

    def occupancy() -> list[int]:
        """The media ticker's streams per 1 ms bucket of the 20 ms period, now."""
        per = [0] * 20
        for t in tickers:
            for b, keys in t.ticker._buckets.items():
                per[b % 20] += len(keys)
        return per

    def describe(cb: Any) -> str:
        if isinstance(cb, functools.partial):
            cb = cb.func
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return "task " + getattr(coro, "__qualname__", type(coro).__name__)
        return getattr(cb, "__qualname__", type(cb).__name__)

    def timed(self: asyncio.events.Handle) -> None:
        callback = self._callback  # type: ignore[attr-defined]  # (asyncio's own attribute)
        if not tickers and isinstance(getattr(callback, "__self__", None), MediaTicker):
            ticker = callback.__self__  # (frozen at start-up: gc.get_objects() misses it)
            tickers.append(ticker)
            if share:  # the ticker's talkspurt_share from its first wake-up: an A/B of the rule
                config = ticker.ticker._config
                ticker.ticker._config = dataclasses.replace(config, talkspurt_share=float(share))
        if not on[0]:
            orig(self)
            return
        inside.clear()
        if tickers and time.monotonic() >= next_sample[0]:
            next_sample[0] = time.monotonic() + 1.0
            spread.append(occupancy())
        t0 = time.thread_time()
        orig(self)
        dt_ms = (time.thread_time() - t0) * 1e3
        name = describe(callback)
        record(name, dt_ms)
        if dt_ms > LONG_MS and len(long) < 500:
            parts = {k: [int(v[0]), round(v[1], 3)] for k, v in inside.items()}
            long.append({"callback": name, "ms": round(dt_ms, 3), "parts": parts})

    def start(*_: Any) -> None:
        stats.clear()
        long.clear()
        spread.clear()
        on[0] = True
        if prof is not None:
            prof.enable()

    def stop(*_: Any) -> None:
        on[0] = False
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)
        rows = {
            k: dict(
                zip(("n", "cpu_ms", "max_ms", *(f"over_{m:g}ms" for m in OVER_MS)), v, strict=True)
            )
            for k, v in stats.items()
        }
        Path(out).write_text(
            json.dumps({"callbacks": rows, "long": long, "spread": spread}, indent=1)
        )

    def record(name: str, dt_ms: float) -> None:
        s = stats.setdefault(name, [0, 0.0, 0.0, 0, 0, 0, 0])
        s[0] += 1
        s[1] += dt_ms
        s[2] = max(s[2], dt_ms)
        for i, limit in enumerate(OVER_MS):
            if dt_ms > limit:
                s[3 + i] += 1

    def probe(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            if not on[0]:
                return fn(*args, **kw)
            t0 = time.thread_time()
            try:
                return fn(*args, **kw)
            finally:
                dt_ms = (time.thread_time() - t0) * 1e3
                record("  " + name, dt_ms)
                part = inside.setdefault(name, [0, 0.0])
                part[0] += 1
                part[1] += dt_ms

        return wrapper

    import importlib

    for target in PROBES:
        mod_name, _, qual = target.partition(":")
        cls_name, _, meth = qual.partition(".")
        cls = getattr(importlib.import_module(mod_name), cls_name)
        setattr(cls, meth, probe(qual, getattr(cls, meth)))

    import gc

    gc_t0 = [0.0]

    def gc_cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_t0[0] = time.thread_time()
        elif on[0]:
            record(f"  gc generation {info['generation']}", (time.thread_time() - gc_t0[0]) * 1e3)

    gc.callbacks.append(gc_cb)
    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    return main(["serve", "--config", cfg])


def _run(a: argparse.Namespace, tmp: Path, cache_dir: Path) -> dict[str, Any]:
    from bench.bench_ivr import Daemon, demo_config
    from bench.loadgen.analysis import pacing_summary, rtp_deviations_ns
    from bench.loadgen.procs import DAEMON_CORE, LOADGEN_CORE, _pinned
    from bench.loadgen.rtp import RtpLoad

    out = tmp / "ticks.json"
    d = Daemon.__new__(Daemon)  # bench_ivr's, started with this file's child instead
    d.workdir, d.log = tmp, tmp / "daemon.log"
    from bench.loadgen.procs import free_port

    d.sip, d.ms, d.api = free_port(2), free_port(), free_port()
    cfg = tmp / "callbridge.toml"
    text = demo_config(d.sip, d.ms, d.api, cache_dir, a.rate)
    cfg.write_text(text.replace("[daemon]\n", '[daemon]\nevent_loop = "asyncio"\n', 1))
    pin = _pinned(DAEMON_CORE)

    def pre() -> None:
        pin()
        if a.nice:
            os.nice(a.nice)
        if a.fifo:  # (its children, the embedded voice among them, do not inherit it)
            policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
            os.sched_setscheduler(0, policy, os.sched_param(a.fifo))

    d.proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(cfg), str(out), a.profile, a.share],
        preexec_fn=pre,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(d.log, "ab"),  # noqa: SIM115 - the child owns it
    )
    try:
        d.wait_ready(300)
        for pid in d.children():
            os.sched_setaffinity(pid, {LOADGEN_CORE})
        load = RtpLoad(("127.0.0.1", d.sip), route="demo")
        if a.with_ramp:
            os.kill(d.proc.pid, signal.SIGUSR1)
        load.place(a.calls, rate_per_s=a.rate)
        answered = load.wait_answered(30)
        if not a.with_ramp:
            os.kill(d.proc.pid, signal.SIGUSR1)
        load.recording = True
        c0, t0 = d.cpu_s(), time.monotonic()
        load.run_for(a.hold_s)
        load.recording = False
        cpu = 100 * (d.cpu_s() - c0) / (time.monotonic() - t0)
        os.kill(d.proc.pid, signal.SIGUSR2)
        per = [rtp_deviations_ns(c.arrival_ns, c.rtp_ts, c.marker) for c in load.calls]
        load.hangup_all(settle_s=2.0)
        load.close()
        for _ in range(100):
            if out.exists():
                break
            time.sleep(0.1)
        got = json.loads(out.read_text())
        return {
            "answered": answered,
            "daemon_cpu_pct": round(cpu, 1),
            "pacing": pacing_summary(per),
            **got,
        }
    finally:
        d.stop()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _child(*sys.argv[2:6])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--hold-s", type=float, default=30.0)
    ap.add_argument("--profile", default="", help="write a cProfile of the window here")
    ap.add_argument("--with-ramp", action="store_true", help="count the calls' ramp too")
    ap.add_argument("--cold", action="store_true", help="no warming start: prompts render")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="the daemon's nice increment (negative, as root: ahead of a busy host)",
    )
    ap.add_argument(
        "--fifo",
        type=int,
        default=0,
        help="run the daemon SCHED_FIFO at this priority (as root: a busy host's "
        "other processes cannot delay its wake-ups)",
    )
    ap.add_argument("--share", default="", help="the ticker's talkspurt_share (default: its own)")
    ap.add_argument("--json", default="", help="write everything found here")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    from bench.loadgen.procs import LOADGEN_CORE, pin_self

    pin_self(LOADGEN_CORE)
    with tempfile.TemporaryDirectory(prefix="diag_ivr_") as tmp_s:
        tmp = Path(tmp_s)
        cache_dir = tmp / "cache"
        cache_dir.mkdir()
        if not a.cold:  # a first start renders every prompt into cache_dir
            warm = argparse.Namespace(
                **{**vars(a), "calls": 1, "hold_s": 1.0, "profile": "", "fifo": 0}
            )
            (tmp / "warm").mkdir()
            _run(warm, tmp / "warm", cache_dir)
        (tmp / "run").mkdir()
        r = _run(a, tmp / "run", cache_dir)
    pac = r["pacing"]
    print(
        f"answered {r['answered']}/{a.calls}, daemon CPU {r['daemon_cpu_pct']} %, pacing p50 "
        f"{pac.get('p50_ms')} / p99 {pac.get('p99_ms')} / max {pac.get('max_ms')} ms"
    )
    rows = sorted(r["callbacks"].items(), key=lambda kv: -kv[1]["cpu_ms"])
    print(f"{'callback':60} {'n':>7} {'cpu ms':>9} {'max ms':>7} >1ms >2ms >5ms >10ms")
    for name, s in rows[: a.top]:
        print(
            f"{name[:60]:60} {s['n']:7d} {s['cpu_ms']:9.1f} {s['max_ms']:7.2f} "
            f"{s['over_1ms']:4d} {s['over_2ms']:4d} {s['over_5ms']:4d} {s['over_10ms']:5d}"
        )
    longest = sorted(rows, key=lambda kv: -kv[1]["max_ms"])[:8]
    print("longest single callbacks:")
    for name, s in longest:
        print(f"  {s['max_ms']:7.2f} ms  {name}")
    long = r["long"]
    print(
        f"{len(long)} callbacks over {LONG_MS:g} ms; what the probes inside them did (mean "
        "count and ms per long callback):"
    )
    totals: dict[str, list[float]] = {}
    for item in long:
        for k, (n, ms) in item["parts"].items():
            t = totals.setdefault(k, [0.0, 0.0])
            t[0] += n / len(long)
            t[1] += ms / len(long)
    for k, (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:50} {n:8.1f} {ms:8.2f}")
    spread = r["spread"]
    if spread:
        print("streams per 1 ms bucket of the period (first, middle, last second of the window):")
        for row in (spread[0], spread[len(spread) // 2], spread[-1]):
            print("  " + " ".join(f"{n:3d}" for n in row))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

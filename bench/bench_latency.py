"""Added latency: first provider audio byte received -> first frame carrying it on the wire.

The daemon (``callbridge serve``, uvloop, core 0) greets every call; calls
are placed one after another on each leg (Twilio media stream, SIP/RTP) by
the load generator (core 1), with the reference TTS server (tone engine,
Kova protocol, mu-law 8 kHz pass-through) on core 1 too.

Two figures per turn:

* daemon: ``CallBridge.stats().added_latency_s`` from the CDR line
  (``call.ended`` ... ``added_latency_ms``), also on ``/metrics`` as
  ``callbridge_added_latency_seconds``. Under uvloop ``loop.time()`` has 1 ms
  resolution, so these are whole milliseconds.
* external: the TTS server's send time of the turn's first chunk -> the
  first ``media`` at the carrier (WS, ``time.monotonic_ns()`` in the load
  generator) or the first RTP packet of the talkspurt (kernel receive
  timestamp). Same host clock (CLOCK_MONOTONIC); this includes the provider
  WebSocket hop and JSON/base64 decoding, which the daemon figure does not.

    python -m bench.bench_latency [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import pct, write
from bench.loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad
from bench.loadgen.twilio import TwilioLoad

Candidates = list[tuple[float, list[float]]]


def _ext(first_chunks: list[float], calls: Candidates) -> list[float]:
    """Per call: the first talkspurt start on the wire after the call's first TTS chunk."""
    out = []
    for placed_at, starts in calls:
        chunk = next((c for c in first_chunks if c >= placed_at), None)
        wire = next((t for t in starts if chunk is not None and t >= chunk), None)
        if chunk is not None and wire is not None:
            out.append(wire - chunk)
    return out


async def ws_calls(d: DaemonUnderTest, n: int) -> Candidates:
    load = TwilioLoad(d.ms_port, route="greet")
    firsts: Candidates = []
    for _ in range(n):
        placed_at = time.monotonic()
        await load.place(1)
        call = load.calls[-1]
        end = time.monotonic() + 5
        while not call.first_media_s and time.monotonic() < end:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        firsts.append((placed_at, list(call.first_media_s)))
        await load.hangup_all(settle_s=0.05)
    await load.close()
    return firsts


def sip_calls(d: DaemonUnderTest, n: int) -> Candidates:
    load = RtpLoad(("127.0.0.1", d.sip_port), route="greet")
    load.recording = True
    firsts: Candidates = []
    for _ in range(n):
        placed_at = time.monotonic()
        load.place(1)
        call = load.calls[-1]
        end = time.monotonic() + 1.0  # the greeting's talkspurt: the second marker, usually
        while time.monotonic() < end and sum(call.marker) < 2:
            load.run_for(0.005)
        load.run_for(0.1)
        starts = [call.arrival_ns[i] / 1e9 for i, m in enumerate(call.marker) if m]
        firsts.append((placed_at, starts))
        load.hangup_all(settle_s=0.05)
        load.forget_calls()
    load.close()
    return firsts


def one_run(workdir: Path, n: int) -> dict[str, dict[str, list[float]]]:
    tts = TtsProcess.start(workdir)
    d = DaemonUnderTest.start(workdir, tts.port)
    try:
        asyncio.run(ws_calls(d, 3))  # warm-up: connections, code paths
        sip_calls(d, 3)
        t_ws = time.monotonic()
        ws_first = asyncio.run(ws_calls(d, n))
        t_sip = time.monotonic()
        sip_first = sip_calls(d, n)
        time.sleep(0.3)
        cdr = d.cdr_lines()
        hist = d.metric_samples("callbridge_added_latency_seconds_bucket")
    finally:
        d.stop()
        tts.stop()
    chunks = [t for _, t in tts.first_chunks()]
    daemon: dict[str, list[float]] = {"twilio": [], "sip": []}
    for line in cdr:
        leg = "sip" if "@" in line["call_id"] else "twilio"
        daemon[leg] += [v / 1000 for v in line.get("added_latency_ms", [])]
    warm = 3  # the warm-up calls' CDRs come first on each leg
    return {
        "daemon": {k: v[warm:] for k, v in daemon.items()},
        "external": {
            "twilio": _ext([c for c in chunks if c >= t_ws], ws_first),
            "sip": _ext([c for c in chunks if c >= t_sip], sip_first),
        },
        "histogram": {k: [v] for k, v in hist.items()},
    }


def _stats(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3) if ms else float("nan"),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs, n = (3, 15) if args.quick else (5, 60)
    pin_self()
    per_run: list[dict[str, dict[str, list[float]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(runs):
            wd = Path(tmp) / f"run{r}"
            wd.mkdir()
            per_run.append(one_run(wd, n))
    figures: dict[str, object] = {}
    print(f"{'figure':<22} {'leg':<7} {'p50 ms (runs)':<34} {'p99 ms (runs)':<34}")
    for source in ("daemon", "external"):
        for leg in ("twilio", "sip"):
            rs = [_stats(run[source][leg]) for run in per_run]
            p50s = [s["p50_ms"] for s in rs]
            p99s = [s["p99_ms"] for s in rs]
            pooled = _stats([v for run in per_run for v in run[source][leg]])
            figures[f"{source}_{leg}"] = {
                "p50_ms_median": statistics.median(p50s),
                "p50_ms_spread": [min(p50s), max(p50s)],
                "p99_ms_median": statistics.median(p99s),
                "p99_ms_spread": [min(p99s), max(p99s)],
                "pooled": pooled,
                "runs": rs,
            }
            print(
                f"{source:<22} {leg:<7} {statistics.median(p50s):>7} [{min(p50s)}..{max(p50s)}]"
                f"{'':<10} {statistics.median(p99s):>7} [{min(p99s)}..{max(p99s)}]"
            )
    figures["goal"] = {"p50_ms": 2.0, "p99_ms": 5.0}
    path = write(
        "latency",
        figures,
        {
            "runs": runs,
            "calls_per_leg_per_run": n,
            "provider": "kova via ttsd tone engine, mulaw/8000 pass-through, prompt cache off",
            "daemon": "callbridge serve, uvloop, pinned to core 0",
            "load_generator": "pinned to core 1 with the TTS server",
            "timestamps": "WS: monotonic_ns at the carrier; RTP: SO_TIMESTAMPNS (kernel)",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

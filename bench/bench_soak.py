"""Soak: 10 000 mixed calls with barge-ins, DTMF and provider failures; then back to baseline?

    python -m bench.bench_soak [--calls N] [--concurrency C] [--seed S]     (make soak)

The daemon (``bench/loadgen/soak_daemon.py``: ``callbridge serve`` plus a
task that writes its SIP transactions, RTP ports, calls and tasks to a file
every second) runs against two reference TTS servers (tone engine): ``fast``
and ``flaky``. Calls are placed by ``callbridge call``'s own code
(``place_call``), ``--concurrency`` at a time, in a seeded mix:

=====  ================================  ===========================================
share  leg and route                     what happens
=====  ================================  ===========================================
30 %   SIP, ``greet``                    greeting heard, caller hangs up
10 %   SIP, ``ivr``                      a key press answered by the flow
10 %   SIP, ``long``                     the caller talks over the greeting (barge-in)
10 %   SIP, ``flaky``                    provider chain ``flaky`` then ``fast``
20 %   Twilio media stream, ``greet``
10 %   Twilio media stream, ``ivr``      a key press (``dtmf`` message)
10 %   Twilio media stream, ``long``     the caller talks over the greeting
=====  ================================  ===========================================

Injected provider failures: the ``flaky`` TTS server is killed every
``--fault-every-s`` seconds and started again (on the same port)
``--fault-down-s`` later; ``flaky`` turns that fail before their first audio
go to ``fast`` (the route's failover chain).

Before the measured calls, a warm-up of the same mix (``--warmup`` calls);
baseline and end state are both read once the daemon is idle and the SIP
transactions of the last calls have expired (64 x T1 = 32 s) and idle
provider connections have closed (``close_idle_after_s = 5``). What must
hold: descriptors, asyncio tasks, SIP transactions and RTP port pairs equal
their baseline; RSS within ``--rss-tolerance-mib`` of it (the heap keeps its
high-water mark: bench_memory.py); no warning or error line in the daemon's
log that the injected faults do not explain (the list of every such event,
matched or not, is in the result). Figures go to ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import write
from bench.loadgen.procs import PAGE_BYTES, ROOT, free_port, terminate
from bridge.io.caller import CallerOptions, SpeakClip, place_call
from telcodec import g711

SIP_RETENTION_S = 33.0
"""64 x T1 (32 s) and a margin: how long a completed call's SIP transactions live."""
CLOSE_IDLE_AFTER_S = 5.0
LONG_GREETING = " ".join(f"word{i}" for i in range(40)) + "."

MIX: tuple[tuple[str, str, int], ...] = (
    # (leg, route, weight)
    ("sip", "greet", 30),
    ("sip", "ivr", 10),
    ("sip", "long", 10),
    ("sip", "flaky", 10),
    ("twilio", "greet", 20),
    ("twilio", "ivr", 10),
    ("twilio", "long", 10),
)

FAULTY = '"flaky"'
"""The injected faults explain a warning or error line that names the killed provider
(``provider``, ``route``...); anything else at warning or error is unexplained."""


def config_text(fast_port: int, flaky_port: int, sip_port: int) -> str:
    return f"""
[daemon]
log_format = "json"
log_level = "info"
event_loop = "uvloop"
drain_timeout_s = 2
max_loop_lag_ms = 0

[sip]
listen = ["127.0.0.1:{sip_port}"]
transports = ["udp"]
rtp_ports = "34000-35999"
max_calls = 2000
invite_rate_per_source = 100000
rtp_timeout_s = 30

[media_streams]
listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[providers.fast]
protocol = "kova"
url = "ws://127.0.0.1:{fast_port}/v1/ws/kova"
api_key = "k"
voice = "tone"
close_idle_after_s = {CLOSE_IDLE_AFTER_S}

[providers.flaky]
protocol = "kova"
url = "ws://127.0.0.1:{flaky_port}/v1/ws/kova"
api_key = "k"
voice = "tone"
close_idle_after_s = {CLOSE_IDLE_AFTER_S}

[flows.ivr]
start = "menu"

[flows.ivr.steps.menu]
say = "Press a key."
gather = {{ max_digits = 1, timeout_s = 5 }}
branch = {{ "1" = "one", default = "other", timeout = "other" }}

[flows.ivr.steps.one]
say = "You pressed one."
next = "menu"

[flows.ivr.steps.other]
say = "Something else."
next = "menu"

[[routes]]
match = "ivr"
provider = "fast"
flow = "ivr"

[[routes]]
match = "long"
provider = "fast"
greeting = "{LONG_GREETING}"

[[routes]]
match = "flaky"
provider = ["flaky", "fast"]
greeting = "Hello from the flaky voice."

[[routes]]
match = "*"
provider = "fast"
greeting = "Hello, and welcome."
"""


@dataclass
class Tts:
    """The reference TTS server (tone engine) as a process on a fixed port."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "tts-server", "--engine", "tone",
             "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"tts-server on {self.port} did not start; see {self.log}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 5)


class SoakDaemon:
    def __init__(self, workdir: Path, fast: int, flaky: int) -> None:
        self.workdir = workdir
        self.sip_port = free_port(socket.SOCK_DGRAM)
        self.config = workdir / "callbridge.toml"
        self.config.write_text(config_text(fast, flaky, self.sip_port))
        self.state_path = workdir / "state.json"
        self.log = workdir / "daemon.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen.soak_daemon", str(self.config),
             str(self.state_path)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("wb"), start_new_session=True,
            cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.state_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"daemon did not become ready:\n{tail}")
            time.sleep(0.1)
        self.ms_port = int(self.state()["ports"]["media_streams"])

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]

    def rss_bytes(self) -> int:
        return int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1]) * PAGE_BYTES

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log_events(self, event: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if event is not None and f'"{event}"' not in line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def speech_pcm(seconds: float) -> bytes:
    """A voiced, speech-like signal (harmonics with a moving pitch), 8 kHz s16le."""
    import numpy as np

    t = np.arange(int(8000 * seconds)) / 8000
    f0 = 140 + 30 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 8000
    wave = sum(np.sin(k * phase) / k for k in range(1, 8))
    pcm = (wave / np.max(np.abs(wave)) * 8000).astype("<i2").tobytes()
    return g711.ulaw_decode(g711.ulaw_encode(pcm))


SPEECH = speech_pcm(1.2)


def options(kind: tuple[str, str], d: SoakDaemon) -> CallerOptions:
    leg, route = kind
    if leg == "sip":
        target = f"sip:{route}@127.0.0.1:{d.sip_port}"
    else:
        target = f"ws://127.0.0.1:{d.ms_port}/twilio"
    dtmf = ((1.2, "1"),) if route == "ivr" else ()
    speak = (SpeakClip("speech", 0.8, SPEECH),) if route == "long" else ()
    return CallerOptions(
        target=target,
        dtmf=dtmf,
        speak=speak,
        duration_s=3.0 if route == "ivr" else 2.5,
        route=route if leg == "twilio" else None,
    )


async def run_calls(d: SoakDaemon, n: int, concurrency: int, rng: random.Random) -> dict[str, Any]:
    kinds = [(leg, route) for leg, route, w in MIX for _ in range(w)]
    plan = [rng.choice(kinds) for _ in range(n)]
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for k in plan:
        queue.put_nowait(k)
    outcomes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    placed: Counter[str] = Counter()

    async def worker() -> None:
        while True:
            try:
                kind = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            placed[f"{kind[0]}:{kind[1]}"] += 1
            try:
                result = await asyncio.wait_for(place_call(options(kind, d)), 30)
            except Exception as exc:
                failures[f"{kind[0]}:{kind[1]}: {type(exc).__name__}"] += 1
                continue
            rec = result.recording
            if rec.answered_at_s is None or rec.failure is not None:
                failures[f"{kind[0]}:{kind[1]}: {rec.failure}"] += 1
            elif not any(f.level_dbfs > -40 for f in (rec.heard_frames or rec.frames)):
                failures[f"{kind[0]}:{kind[1]}: heard nothing"] += 1
            else:
                outcomes[f"{kind[0]}:{kind[1]}"] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"placed": dict(placed), "ok": dict(outcomes), "failed": dict(failures)}


async def fault_injector(flaky: Tts, every_s: float, down_s: float, log: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        log.append(time.time())
        await loop.run_in_executor(None, flaky.kill)
        await asyncio.sleep(down_s)
        await loop.run_in_executor(None, flaky.start)


def idle_state(d: SoakDaemon) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while sum(d.state()["calls"].values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(max(SIP_RETENTION_S, CLOSE_IDLE_AFTER_S + 1))
    s = d.state()
    return {
        "rss_mib": round(d.rss_bytes() / 2**20, 2),
        "fds": d.fd_count(),
        "tasks": s["tasks"],
        "sip_transactions": s.get("sip_transactions"),
        "rtp_ports_allocated": s.get("rtp_ports_allocated"),
        "calls": s["calls"],
    }


def unexplained(events: list[dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    explained: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for e in events:
        if e.get("level") not in ("warning", "error", "critical"):
            continue
        name = str(e.get("event"))
        text = json.dumps(e)
        if FAULTY in text:
            explained[name] += 1
        else:
            other[name] += 1
    return explained, other


def cdr_figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    """From the daemon's ``call.started`` and ``call.ended`` lines: CDRs, barge-ins by
    route and reason, provider errors by route."""
    route_of = {
        e.get("call_id"): e.get("route") for e in events if e.get("event") == "call.started"
    }
    bargeins: dict[str, Counter[str]] = {}
    provider_errors: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    n = 0
    for e in events:
        if e.get("event") != "call.ended" or not e.get("cdr"):
            continue
        n += 1
        route = str(route_of.get(e.get("call_id"), "?"))
        reasons[str(e.get("reason"))] += 1
        for reason, count in dict(e.get("barge_ins") or {}).items():
            bargeins.setdefault(route, Counter())[reason] += int(count)
        provider_errors[route] += int(e.get("provider_errors") or 0)
    dtmf = Counter(
        str(route_of.get(e.get("call_id"), "?")) for e in events if e.get("event") == "call.dtmf"
    )
    return {
        "calls": n,
        "dtmf_by_route": dict(dtmf),
        "end_reasons": dict(reasons),
        "bargeins_by_route": {r: dict(c) for r, c in bargeins.items()},
        "provider_errors_by_route": dict(provider_errors),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--fault-every-s", type=float, default=20.0)
    ap.add_argument("--fault-down-s", type=float, default=5.0)
    ap.add_argument("--rss-tolerance-mib", type=float, default=16.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        fast = Tts(free_port(), work / "tts-fast.log")
        flaky = Tts(free_port(), work / "tts-flaky.log")
        fast.start()
        flaky.start()
        d = SoakDaemon(work, fast.port, flaky.port)
        try:
            print(f"warm-up: {args.warmup} calls", flush=True)
            warm = asyncio.run(run_calls(d, args.warmup, args.concurrency, rng))
            base = idle_state(d)
            print(f"baseline: {base}", flush=True)
            log_mark = len(d.log_events())
            kills: list[float] = []

            async def measured() -> dict[str, Any]:
                injector = asyncio.ensure_future(
                    fault_injector(flaky, args.fault_every_s, args.fault_down_s, kills)
                )
                try:
                    return await run_calls(d, args.calls, args.concurrency, rng)
                finally:
                    injector.cancel()

            t0 = time.monotonic()
            calls = asyncio.run(measured())
            wall_s = time.monotonic() - t0
            if flaky.proc is None or flaky.proc.poll() is not None:
                flaky.start()
            print(f"{args.calls} calls in {wall_s:.0f} s: {calls}", flush=True)
            peak_rss = round(d.rss_bytes() / 2**20, 2)
            end = idle_state(d)
            print(f"end: {end}", flush=True)
            events = d.log_events()[log_mark:]
            explained, other = unexplained(events)
            fault_effects = Counter(str(e.get("event")) for e in events if "flaky" in json.dumps(e))
            cdrs = cdr_figures(events)
        finally:
            d.stop()
            fast.stop()
            flaky.stop()
    checks = {
        "fds": end["fds"] == base["fds"],
        "tasks": end["tasks"] == base["tasks"],
        "sip_transactions": end["sip_transactions"] == base["sip_transactions"],
        "rtp_ports_allocated": end["rtp_ports_allocated"] == base["rtp_ports_allocated"] == 0,
        "rss": end["rss_mib"] - base["rss_mib"] <= args.rss_tolerance_mib,
        "no_unexplained_log_lines": not other,
        "every_call_ok": not calls["failed"],
        # every caller who talked over the long greeting interrupted it, once
        "speech_barge_in_per_long_call": cdrs["bargeins_by_route"].get("long", {}).get("speech", 0)
        == sum(n for k, n in calls["placed"].items() if k.endswith(":long")),
        "a_cdr_per_call": cdrs["calls"] == args.calls,
        # every key press reached the daemon, once
        "a_digit_per_ivr_call": cdrs["dtmf_by_route"].get("ivr", 0)
        == sum(n for k, n in calls["placed"].items() if k.endswith(":ivr")),
    }
    figures = {
        "calls": args.calls,
        "wall_s": round(wall_s, 1),
        "calls_per_s": round(args.calls / wall_s, 2),
        "projected_10000_calls_min": round(wall_s / args.calls * 10_000 / 60, 1),
        "warmup": warm,
        "measured": calls,
        "provider_kills": len(kills),
        "baseline": base,
        "end": end,
        "rss_peak_after_calls_mib": peak_rss,
        "rss_growth_mib": round(end["rss_mib"] - base["rss_mib"], 2),
        "flaky_provider_log_events": dict(fault_effects),
        "cdrs": cdrs,
        "log_warnings_explained_by_faults": dict(explained),
        "log_warnings_unexplained": dict(other),
        "checks": checks,
    }
    settings = {k: v for k, v in vars(args).items()}
    path = write("soak", figures, settings)
    print(json.dumps(figures, indent=1))
    print(f"written to {path}")
    failed = [k for k, ok in checks.items() if not ok]
    print("PASS" if not failed else f"FAIL: {', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the SIP/RTP leg with SIPp: call setup rate, and CPU per RTP packet.

Usage: python bench/bench_sip.py [--quick] [--rates 50,100,200,400] [--step-s 10]
                                 [--call-s 2] [--concurrent 100] [--out PATH]

The real daemon (``callbridge serve``, the embedded ``tone`` voice, a route
whose greeting is spoken on every call) runs as a process pinned to core 0
with ``taskset``; SIPp runs pinned to core 1 with the scenario
``tests/e2e/scenarios/bench_uac.xml``. Everything is on 127.0.0.1.

1. Setup rate. For each rate R of ``--rates`` SIPp places R calls/s for
   ``--step-s`` seconds; each call lasts ``--call-s`` seconds (the greeting,
   then comfort noise) and SIPp echoes the daemon's RTP back (``-rtp_echo``).
   Per step: calls placed, SIPp's successful/failed counts and failure
   causes (timeouts = ``FailedMaxUDPRetrans``), the 503s the daemon sent
   (calls that took the scenario's 503 branch = successful - answered; a full
   daemon refuses with 503 + Retry-After; also the 503 datagrams it sent,
   retransmissions included, from ``callbridge_sip_responses_total``), and
   INVITE -> 200 p50/p99 from SIPp's ``-trace_rtt`` file. "Sustained" = the
   highest rate with no failed call and no 503.
2. CPU per RTP packet. ``--concurrent`` N long calls are held; the daemon's
   own CPU time (``/proc/PID/stat`` utime + stime, the embedded TTS child
   excluded) is read over a steady window, first with SIPp not echoing (RTP
   out only: one packet per call per 20 ms), then with ``-rtp_echo`` (out +
   in). The idle daemon's CPU over the same window is subtracted. This part
   runs first, on a fresh daemon.
   ``out_us`` = CPU per packet sent; ``in_us`` = (echo run - out run) per
   packet received. Both include the event loop, the ticker, the bridge and
   the codecs, i.e. what one packet really costs this process.

This is a benchmark, not a test: it never runs under pytest.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import pct, write

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "e2e" / "scenarios" / "bench_uac.xml"
CALLBRIDGE = Path(sys.executable).with_name("callbridge")
GREETING = "Hello caller, welcome to the bridge."
MAX_CALLS = 500
FAST_SETUP_P99_MS = 200
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(core: int, argv: list[str]) -> list[str]:
    """``taskset -c core argv`` when taskset exists and the core does."""
    if shutil.which("taskset") and (os.cpu_count() or 1) > core:
        return ["taskset", "-c", str(core), *argv]
    return argv


class Daemon:
    """``callbridge serve`` with a generated config, as a process on core 0."""

    def __init__(self, workdir: Path) -> None:
        self.sip_port = free_port()
        self.api_port = free_port(socket.SOCK_STREAM)
        config = workdir / "callbridge.toml"
        config.write_text(f"""
[daemon]
log_level = "warning"
log_format = "json"
event_loop = "uvloop"
drain_timeout_s = 2

[sip]
listen = ["127.0.0.1:{self.sip_port}"]
transports = ["udp"]
rtp_ports = "20000-29999"
max_calls = {MAX_CALLS}
invite_rate_per_source = 100000
rtp_timeout_s = 60

[media_streams]
enabled = false

[api]
listen = "127.0.0.1:{self.api_port}"

[providers.local]
protocol = "kova"
url = "embedded"
engine = "tone"
voice = "tone"

[[routes]]
match = "*"
provider = ["local"]
greeting = "{GREETING}"
""")
        self.log = (workdir / "daemon.log").open("wb")
        self.proc = subprocess.Popen(
            pinned(0, [str(CALLBRIDGE), "serve", "--config", str(config)]),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/readyz") as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("daemon not ready in 60 s")

    def cpu_s(self) -> float:
        """utime + stime of the daemon process itself (children excluded)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def metric(self, name: str, labels: str = "") -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/metrics") as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and labels in line and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def active_calls(self) -> int:
        return int(self.metric("callbridge_calls_active{"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def sipp(
    workdir: Path, name: str, daemon: Daemon, extra: list[str], echo: bool = True
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start SIPp (core 1) against the daemon; returns the process and its stat file."""
    stat = workdir / f"{name}_stat.csv"
    argv = [
        "sipp",
        "-sf",
        str(SCENARIO),
        f"127.0.0.1:{daemon.sip_port}",
        "-s",
        "bench",
        "-i",
        "127.0.0.1",
        "-p",
        str(free_port()),
        "-mi",
        "127.0.0.1",
        "-mp",
        str(free_port() // 2 * 2),
        "-nostdin",
        "-trace_stat",
        "-stf",
        str(stat),
        "-trace_rtt",
        "-rtt_freq",
        "1",
        "-max_socket",
        "4096",
        *(["-rtp_echo"] if echo else []),
        *extra,
    ]
    proc = subprocess.Popen(
        pinned(1, argv), cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return proc, stat


def last_row(path: Path) -> dict[str, str]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    return dict(zip(rows[0], rows[-1], strict=False)) if len(rows) > 1 else {}


def rtt_ms(workdir: Path) -> list[float]:
    """Every INVITE -> 200 time SIPp wrote with -trace_rtt (rtd 1)."""
    values: list[float] = []
    for path in workdir.glob("bench_uac_*_rtt.csv"):
        for line in path.read_text().splitlines()[1:]:
            parts = line.split(";")
            if len(parts) >= 3 and parts[2].strip() in ("1", "rtd1"):
                values.append(float(parts[1]))
    return values


def setup_step(root: Path, daemon: Daemon, rate: int, step_s: int, call_s: int) -> dict[str, Any]:
    workdir = root / f"rate_{rate}"
    workdir.mkdir()
    calls = rate * step_s
    refused_before = daemon.metric("callbridge_sip_responses_total", 'code="503"')
    proc, stat = sipp(
        workdir,
        "setup",
        daemon,
        ["-r", str(rate), "-m", str(calls), "-d", str(call_s * 1000), "-timeout", "120s"],
    )
    try:
        _, err = proc.communicate(timeout=step_s + call_s + 150)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    row = last_row(stat) if stat.exists() else {}
    refused = daemon.metric("callbridge_sip_responses_total", 'code="503"') - refused_before
    rtts = rtt_ms(workdir)
    failed = int(row.get("FailedCall(C)", "0") or 0)
    wait_idle(daemon)
    return {
        "rate_cps": rate,
        "calls": calls,
        "sipp_rc": proc.returncode,
        "successful": int(row.get("SuccessfulCall(C)", "0") or 0),
        "failed": failed,
        "timeouts": int(row.get("FailedMaxUDPRetrans(C)", "0") or 0)
        + int(row.get("FailedCallTimedOut(C)", "0") or 0)
        if row
        else None,
        "unexpected": int(row.get("FailedUnexpectedMessage(C)", "0") or 0),
        "answered": len(rtts),
        # calls SIPp completed through the 503 branch of the scenario
        "refused_503": int(row.get("SuccessfulCall(C)", "0") or 0) - len(rtts) if row else None,
        # 503 datagrams the daemon sent, retransmissions (Timer G) included
        "sent_503_datagrams": int(refused),
        "invite_200_p50_ms": round(statistics.median(rtts), 2) if rtts else None,
        "invite_200_p99_ms": round(pct(rtts, 99), 2) if rtts else None,
        "invite_200_max_ms": round(max(rtts), 2) if rtts else None,
        "sipp_stderr": err.decode(errors="replace")[-300:] if proc.returncode else "",
    }


def wait_idle(daemon: Daemon, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while daemon.active_calls() and time.monotonic() < deadline:
        time.sleep(0.5)


def cpu_window(daemon: Daemon, window_s: float) -> float:
    start = daemon.cpu_s()
    time.sleep(window_s)
    return daemon.cpu_s() - start


def cpu_per_packet(root: Path, daemon: Daemon, concurrent: int, window_s: float) -> dict[str, Any]:
    idle_s = cpu_window(daemon, window_s)
    results: dict[str, Any] = {"concurrent_calls": concurrent, "window_s": window_s}
    for echo in (False, True):
        workdir = root / f"cpu_echo_{int(echo)}"
        workdir.mkdir()
        hold_ms = int((window_s + 30) * 1000)
        rate = str(min(100, concurrent))
        proc, _ = sipp(
            workdir,
            "cpu",
            daemon,
            ["-r", rate, "-m", str(concurrent), "-l", str(concurrent), "-d", str(hold_ms)],
            echo=echo,
        )
        deadline = time.monotonic() + 30
        while daemon.active_calls() < concurrent and time.monotonic() < deadline:
            time.sleep(0.2)
        active = daemon.active_calls()
        time.sleep(2.0)  # greetings done: steady comfort-noise RTP
        busy_s = cpu_window(daemon, window_s)
        proc.send_signal(signal.SIGUSR1)  # SIPp: stop placing calls, end the ones in progress
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wait_idle(daemon)
        packets = active * 50 * window_s
        results["echo" if echo else "out_only"] = {
            "active_calls": active,
            "cpu_s": round(busy_s, 3),
            "cpu_share_of_core": round(busy_s / window_s, 3),
            "us_per_call_per_20ms": round((busy_s - idle_s) / packets * 1e6, 1),
        }
    out_us = results["out_only"]["us_per_call_per_20ms"]
    both_us = results["echo"]["us_per_call_per_20ms"]
    results["idle_cpu_s"] = round(idle_s, 3)
    results["out_us_per_packet"] = out_us
    results["in_us_per_packet"] = round(both_us - out_us, 1)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="2 s steps, 50/100 cps, 20 calls")
    ap.add_argument("--rates", default="50,100,200,400")
    ap.add_argument("--step-s", type=int, default=10)
    ap.add_argument("--call-s", type=int, default=2)
    ap.add_argument("--concurrent", type=int, default=100)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--out", default="sip")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.step_s, args.concurrent, args.window_s = "50,100", 2, 20, 3.0
    if shutil.which("sipp") is None:
        print("bench_sip: sipp not installed (Debian package sip-tester); nothing measured")
        return 1
    rates = [int(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench_sip_") as tmp:
        root = Path(tmp)
        daemon = Daemon(root)
        try:
            # CPU first: after an overload step the idle daemon still has transactions and
            # dialogs winding down, which would inflate the idle baseline
            cpu = cpu_per_packet(root, daemon, args.concurrent, args.window_s)
            steps = [setup_step(root, daemon, r, args.step_s, args.call_s) for r in rates]
        finally:
            daemon.stop()
            log_tail = (root / "daemon.log").read_text(errors="replace")[-2000:]
    clean = [s["rate_cps"] for s in steps if s["failed"] == 0 and s["refused_503"] == 0]
    sustained = max(clean) if clean else 0
    fast = [
        s["rate_cps"]
        for s in steps
        if s["rate_cps"] in clean and (s["invite_200_p99_ms"] or 1e9) < FAST_SETUP_P99_MS
    ]
    sustained_fast = max(fast) if fast else 0
    load = os.getloadavg()
    print(f"\nSIP setup rate: calls of {args.call_s} s, {args.step_s} s per step")
    print(f"(max_calls {MAX_CALLS}: past it the daemon answers 503 + Retry-After)")
    print(f"{'cps':>5} {'calls':>6} {'ok':>6} {'failed':>6} {'timeouts':>8} {'503':>5} "
          f"{'p50 ms':>8} {'p99 ms':>8}")  # fmt: skip
    for s in steps:
        print(
            f"{s['rate_cps']:>5} {s['calls']:>6} {s['successful']:>6} {s['failed']:>6} "
            f"{s['timeouts']!s:>8} {s['refused_503']:>5} {s['invite_200_p50_ms']!s:>8} "
            f"{s['invite_200_p99_ms']!s:>8}"
        )
    print(f"sustained with 0 failures and 0 refusals: {sustained} calls/s")
    print(f"... and INVITE->200 p99 under {FAST_SETUP_P99_MS} ms: {sustained_fast} calls/s")
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"\nCPU of the daemon process, {cpu['concurrent_calls']} calls, {cpu['window_s']} s window"
    )
    print(f"  out only: {cpu['out_only']}")
    print(f"  echo:     {cpu['echo']}")
    print(f"  per packet: out {cpu['out_us_per_packet']} us, in {cpu['in_us_per_packet']} us")
    sipp_version = subprocess.run(["sipp", "-v"], capture_output=True, text=True).stdout
    m = re.search(r"SIPp v\S+", sipp_version)
    path = write(
        args.out,
        {
            "setup_steps": steps,
            "sustained_cps": sustained,
            "sustained_fast_setup_cps": sustained_fast,
            "load_average_at_end": [round(v, 2) for v in load],
            "cpu": cpu,
            "daemon_log_tail": log_tail if any(s["failed"] for s in steps) else "",
        },
        {
            "rates_cps": rates,
            "step_s": args.step_s,
            "call_s": args.call_s,
            "max_calls": MAX_CALLS,
            "event_loop": "uvloop",
            "daemon_core": 0,
            "sipp_core": 1,
            "sipp": m.group(0) if m else "unknown",
            "quick": args.quick,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

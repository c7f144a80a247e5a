"""Benchmark the SIP/RTP leg with SIPp: call setup rate, and CPU per RTP packet.

Usage: python -m bench.bench_sip [--quick] [--rates 50,100,150,200,300] [--step-s 10]
                                 [--call-s 2] [--repeat 2] [--shedding on,off]
                                 [--concurrent 100] [--profile] [--out PATH]

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
   Each rate runs ``--repeat`` times on each daemon of ``--shedding``: "on"
   is the default ``[daemon] max_loop_lag_ms`` (20 ms: new calls get 503 +
   Retry-After once the media ticker runs late), "off" sets it to 0 (calls
   are admitted until ``max_calls``). The table shows the median of the
   repetitions; every run is in the JSON.
2. CPU per RTP packet. ``--concurrent`` N long calls are held; the daemon's
   own CPU time (``/proc/PID/stat`` utime + stime, the embedded TTS child
   excluded) is read over a steady window, first with SIPp not echoing (RTP
   out only: one packet per call per 20 ms), then with ``-rtp_echo`` (out +
   in). The idle daemon's CPU over the same window is subtracted. This part
   runs first, on a fresh daemon.
   ``out_us`` = CPU per packet sent; ``in_us`` = (echo run - out run) per
   packet received. Both include the event loop, the ticker, the bridge and
   the codecs, i.e. what one packet really costs this process.
3. CPU per call setup, two ways, both stable on a shared machine:
   * ``sip_engine``: the SIP engine alone, in this process: ``SipUserAgent``
     fed SIPp's INVITE, ACK and BYE (a different SDP o= line per call) at
     200 calls/s of simulated time for 10 s, answered as the shell does,
     with ``next_deadline()`` after every message and timers fired when due;
     ``time.process_time()`` per call, median of 5 runs.
   * ``daemon``: calls with no hold time (``-d 0``: INVITE, 200, ACK, BYE
     at once; the greeting turn starts and is cut) at ``--setup-rate``
     calls/s; the daemon's CPU from the first INVITE until no call is left,
     idle CPU subtracted, per call: the whole setup and teardown (SIP, RTP
     port pair and sockets, CallRunner, greeting turn start, logs, metrics)
     without the media of a held call. With ``--profile``, py-spy samples the
     daemon during that step and the samples are split by where the
     innermost callbridge frame is (SIP parse/serialize, transactions and
     dialogs, SDP, the SIP shell, the call runner, media, TTS client, event
     loop).

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

from bench.common import pct, write

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "e2e" / "scenarios" / "bench_uac.xml"
CALLBRIDGE = Path(sys.executable).with_name("callbridge")
GREETING = "Hello caller, welcome to the bridge."
MAX_CALLS = 500
FAST_SETUP_P99_MS = 200
CLK_TCK = os.sysconf("SC_CLK_TCK")
VENV_BIN = Path(sys.executable).parent


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

    def __init__(self, workdir: Path, max_loop_lag_ms: float = 20.0) -> None:
        self.sip_port = free_port()
        self.api_port = free_port(socket.SOCK_STREAM)
        config = workdir / "callbridge.toml"
        config.write_text(f"""
[daemon]
log_level = "warning"
log_format = "json"
event_loop = "uvloop"
drain_timeout_s = 2
max_loop_lag_ms = {max_loop_lag_ms}

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
        self.log = (workdir / "daemon.log").open("ab")
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

    def children_cpu_s(self) -> float:
        """utime + stime of the daemon's child processes (the embedded TTS server), which
        ``taskset`` keeps on the daemon's core."""
        total = 0.0
        try:
            pids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return 0.0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        return total

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


def setup_step(
    root: Path, daemon: Daemon, rate: int, step_s: int, call_s: int, name: str = ""
) -> dict[str, Any]:
    workdir = root / f"rate_{rate}{name}"
    workdir.mkdir()
    calls = rate * step_s
    refused_before = daemon.metric("callbridge_sip_responses_total", 'code="503"')
    log_path = Path(daemon.log.name)
    log_at = log_path.stat().st_size
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
    with log_path.open("rb") as log:
        log.seek(log_at)
        shed = log.read().count(b"sip.overloaded")  # one warning per call refused by shedding
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
        # 503s the loop-lag shedding decided (the rest: max_calls, or no RTP port)
        "refused_by_shedding": shed,
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


# --- CPU per call setup ---------------------------------------------------------------------

_SETUP_SDP = (
    "v=0\r\no=sipp {o} 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\n"
    "t=0 0\r\nm=audio 6000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=ptime:20\r\n"
)


def _sipp_request(method: str, i: int, to: str, cseq: int, body: str = "") -> bytes:
    """What the scenario's SIPp sends (``bench_uac.xml``), for call number ``i``."""
    uri = "sip:bench@127.0.0.1:5060" if method == "INVITE" else "sip:callbridge@127.0.0.1:5060"
    head = (
        f"{method} {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1-{i}-{cseq}\r\n"
        f'From: "sipp" <sip:sipp@127.0.0.1:5061>;tag=1SIPpTag00{i}\r\n'
        f"{to}\r\nCall-ID: {i}-1@127.0.0.1\r\nCSeq: {cseq} {method}\r\n"
        f"Contact: <sip:sipp@127.0.0.1:5061>\r\nMax-Forwards: 70\r\n"
        + ("Content-Type: application/sdp\r\n" if body else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode()


def _engine_run(rate: float, seconds: float, hold_s: float) -> float:
    """CPU us per call of SipUserAgent driven like the shell drives it (see the docstring)."""
    import random

    from bridge.sip.events import CallOffered
    from bridge.sip.sdp import build_answer, negotiate, parse_sdp
    from bridge.sip.settings import SipSettings
    from bridge.sip.ua import SipUserAgent

    offer = parse_sdp(_SETUP_SDP.format(o=1))
    audio = negotiate(offer, ("PCMU", "PCMA"))
    assert audio is not None
    answer = build_answer(offer, audio, "127.0.0.1", 20000, 12345, 1)
    ua = SipUserAgent(SipSettings(local_host="127.0.0.1", local_port=5060), random.Random(1))
    source = ("127.0.0.1", 5061)
    n = int(rate * seconds)
    schedule = sorted(
        (i / rate + offset, kind, i)
        for i in range(n)
        for kind, offset in ((0, 0.0), (1, 0.001), (2, hold_s))
    )
    to: dict[int, str] = {}
    armed: float | None = None
    start = time.process_time()
    for now, kind, i in schedule:
        if armed is not None and armed <= now:
            ua.handle_timer(now)
            ua.actions_to_send(), ua.events_received()
        if kind == 0:
            sdp = _SETUP_SDP.format(o=53655765 + i)  # carriers vary o= per call
            ua.receive_datagram(
                _sipp_request("INVITE", i, "To: <sip:bench@127.0.0.1:5060>", 1, sdp), source, now
            )
            sent = ua.actions_to_send()
            for event in ua.events_received():
                if isinstance(event, CallOffered):
                    ua.answer(event.call_id, answer, now)
                    sent += ua.actions_to_send()
                    ua.events_received()
            for action in sent:
                data = action.data  # type: ignore[attr-defined]
                if data.startswith(b"SIP/2.0 200"):
                    at = data.find(b"\r\nTo: ") + 2
                    to[i] = data[at : data.find(b"\r\n", at)].decode()
        else:
            method, cseq = ("ACK", 1) if kind == 1 else ("BYE", 2)
            ua.receive_datagram(_sipp_request(method, i, to[i], cseq), source, now)
            ua.actions_to_send(), ua.events_received()
        armed = ua.next_deadline()
    return (time.process_time() - start) / n * 1e6


def engine_setup_cost(runs: int = 5) -> dict[str, Any]:
    values = [_engine_run(200.0, 10.0, 2.0) for _ in range(runs)]
    return {
        "us_per_call_median": round(statistics.median(values), 1),
        "us_per_call_runs": [round(v, 1) for v in values],
        "simulated": "200 calls/s for 10 s, calls of 2 s, process_time",
    }


_FRAME = re.compile(r"\((?:[^()]*/)?((?:bridge|telcodec)/[\w/]+\.py)")
_CATEGORIES = (
    ("event loop (uvloop in C: sockets, timers, callbacks)", ("bridge/io/daemon.py",)),
    ("sip parse/serialize", ("bridge/sip/message.py", "bridge/sip/uri.py", "bridge/sip/framer.py")),
    ("sip sdp", ("bridge/sip/sdp.py",)),
    ("sip transactions/dialogs/ua", ("bridge/sip/",)),
    (
        "shell: legs/sip (sockets, RTP ports, SIP pump)",
        ("bridge/io/legs/sip.py", "bridge/io/legs/sip_call.py"),
    ),
    ("shell: call runner (CallRunner, turns)", ("bridge/io/callrun.py",)),
    (
        "media (rtp, bridge, ticker, codecs)",
        ("bridge/rtp/", "bridge/media/", "bridge/io/ticker.py", "telcodec/"),
    ),
    (
        "tts client",
        (
            "bridge/io/provider_ws.py",
            "bridge/io/provider_pool.py",
            "bridge/io/provider_turns.py",
            "bridge/io/session_http.py",
            "bridge/providers/",
        ),
    ),
    ("logs and metrics", ("bridge/logs.py", "bridge/metrics.py")),
)


def split_profile(raw: Path) -> dict[str, Any]:
    """Share of py-spy samples by the innermost callbridge frame of each stack."""
    shares: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        name = "outside callbridge frames"
        for frame in reversed(frames):
            m = _FRAME.search(frame)
            if m is None:
                continue
            path = m.group(1)
            name = next(
                (cat for cat, prefixes in _CATEGORIES if path.startswith(prefixes)),
                f"other callbridge ({path})",
            )
            break
        shares[name] = shares.get(name, 0) + n
        top = frames[-1].split(" (")[0]
        leaf[top] = leaf.get(top, 0) + n
    if not total:
        return {}
    pct_of = {
        k: round(100 * v / total, 1) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
    }
    hot = sorted(leaf.items(), key=lambda kv: -kv[1])[:15]
    return {
        "samples": total,
        "pct": pct_of,
        "self_pct_top": {k: round(100 * v / total, 1) for k, v in hot},
    }


def daemon_setup_cost(
    root: Path, daemon: Daemon, rate: int, seconds: int, profile: bool
) -> dict[str, Any]:
    """Daemon CPU per call of calls with no hold time (see the docstring)."""
    idle_s = cpu_window(daemon, 3.0) / 3.0
    workdir = root / "setup_cost"
    workdir.mkdir()
    raw = workdir / "profile.txt"
    spy = VENV_BIN / "py-spy"
    spy_proc = None
    if profile and spy.exists():
        spy_proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(daemon.proc.pid), "--rate", "250",
             "--format", "raw", "-o", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
    calls = rate * seconds
    start_cpu, start_wall = daemon.cpu_s(), time.monotonic()
    start_children = daemon.children_cpu_s()
    proc, stat = sipp(workdir, "setup_cost", daemon, ["-r", str(rate), "-m", str(calls), "-d", "0"])
    proc.communicate(timeout=seconds + 150)
    wait_idle(daemon)
    cpu_s, wall_s = daemon.cpu_s() - start_cpu, time.monotonic() - start_wall
    children_s = daemon.children_cpu_s() - start_children
    if spy_proc is not None:
        spy_proc.send_signal(signal.SIGINT)
        spy_proc.wait(30)
    row = last_row(stat) if stat.exists() else {}
    answered = len(rtt_ms(workdir))
    result: dict[str, Any] = {
        "rate_cps": rate,
        "calls": calls,
        "answered": answered,
        "failed": int(row.get("FailedCall(C)", "0") or 0),
        "cpu_s": round(cpu_s, 3),
        "idle_cpu_s": round(idle_s * wall_s, 3),
        "us_per_call": round((cpu_s - idle_s * wall_s) / max(1, calls) * 1e6, 1),
        # the embedded TTS server rendering the greetings, on the same core (not idle-corrected)
        "tts_child_us_per_call": round(children_s / max(1, calls) * 1e6, 1),
        "profiled": spy_proc is not None,
    }
    if spy_proc is not None:
        result["profile"] = split_profile(raw)
    return result


def median_step(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the table: medians over the repetitions of a rate."""

    def med(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "rate_cps": runs[0]["rate_cps"],
        "calls": runs[0]["calls"],
        "runs": len(runs),
        **{
            k: med(k)
            for k in (
                "successful",
                "failed",
                "timeouts",
                "refused_503",
                "refused_by_shedding",
                "answered",
                "invite_200_p50_ms",
                "invite_200_p99_ms",
            )
        },
        "failed_max": max(r["failed"] for r in runs),
        "refused_503_max": max(r["refused_503"] or 0 for r in runs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--quick", action="store_true", help="2 s steps, 50/100 cps, 1 run, shedding on"
    )
    ap.add_argument("--rates", default="50,100,150,200,300")
    ap.add_argument("--step-s", type=int, default=10)
    ap.add_argument("--call-s", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each rate (median reported)")
    ap.add_argument("--shedding", default="on,off", help="on (max_loop_lag_ms 20), off (0)")
    ap.add_argument("--concurrent", type=int, default=100)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--setup-rate", type=int, default=50, help="calls/s of the setup-cost step")
    ap.add_argument("--setup-s", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="py-spy split of the setup-cost step")
    ap.add_argument("--out", default="sip")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.step_s, args.concurrent, args.window_s = "50,100", 2, 20, 3.0
        args.repeat, args.shedding, args.setup_s = 1, "on", 3
    if shutil.which("sipp") is None:
        print("bench_sip: sipp not installed (Debian package sip-tester); nothing measured")
        return 1
    rates = [int(r) for r in args.rates.split(",")]
    modes = [m.strip() for m in args.shedding.split(",") if m.strip()]
    engine = engine_setup_cost(3 if args.quick else 5)
    print(f"SIP engine CPU per call (INVITE..BYE, in process): {engine['us_per_call_median']} us")
    ladders: dict[str, dict[str, Any]] = {}
    cpu: dict[str, Any] = {}
    setup_cost: dict[str, Any] = {}
    log_tail = ""
    with tempfile.TemporaryDirectory(prefix="bench_sip_") as tmp:
        for index, mode in enumerate(modes):
            root = Path(tmp) / f"shedding_{mode}"
            root.mkdir()
            daemon = Daemon(root, 20.0 if mode == "on" else 0.0)
            try:
                if index == 0:
                    # CPU first: after an overload step the idle daemon still has transactions
                    # and dialogs winding down, which would inflate the idle baseline
                    cpu = cpu_per_packet(root, daemon, args.concurrent, args.window_s)
                    setup_cost = daemon_setup_cost(
                        root, daemon, args.setup_rate, args.setup_s, args.profile
                    )
                runs: dict[int, list[dict[str, Any]]] = {r: [] for r in rates}
                for k in range(args.repeat):  # interleaved: a noisy minute hits every rate
                    for r in rates:
                        runs[r].append(
                            setup_step(root, daemon, r, args.step_s, args.call_s, f"_{k}")
                        )
            finally:
                daemon.stop()
                tail = (root / "daemon.log").read_text(errors="replace")[-2000:]
            rows = [median_step(runs[r]) for r in rates]
            clean = [
                r
                for r in rates
                if all(x["failed"] == 0 and (x["refused_503"] or 0) == 0 for x in runs[r])
            ]
            fast = [
                row["rate_cps"]
                for row in rows
                if row["rate_cps"] in clean
                and (row["invite_200_p99_ms"] or 1e9) < FAST_SETUP_P99_MS
            ]
            ladders[mode] = {
                "max_loop_lag_ms": 20.0 if mode == "on" else 0.0,
                "table": rows,
                "runs": {str(r): runs[r] for r in rates},
                "sustained_cps": max(clean) if clean else 0,
                "sustained_fast_setup_cps": max(fast) if fast else 0,
            }
            if any(x["failed"] for r in rates for x in runs[r]):
                log_tail += f"[shedding {mode}]\n{tail}\n"
    load = os.getloadavg()
    print(f"\nSIP setup rate: calls of {args.call_s} s, {args.step_s} s per step, "
          f"median of {args.repeat} run(s)")  # fmt: skip
    print(f"(max_calls {MAX_CALLS}: past it the daemon answers 503 + Retry-After)")
    for mode, ladder in ladders.items():
        print(f"\nshedding {mode} (max_loop_lag_ms {ladder['max_loop_lag_ms']})")
        print(f"{'cps':>5} {'calls':>6} {'ok':>6} {'failed':>6} {'timeouts':>8} {'503':>6} "
              f"{'shed':>6} {'p50 ms':>8} {'p99 ms':>8}")  # fmt: skip
        for s in ladder["table"]:
            print(
                f"{s['rate_cps']:>5} {s['calls']:>6} {s['successful']!s:>6} {s['failed']!s:>6} "
                f"{s['timeouts']!s:>8} {s['refused_503']!s:>6} {s['refused_by_shedding']!s:>6} "
                f"{s['invite_200_p50_ms']!s:>8} {s['invite_200_p99_ms']!s:>8}"
            )
        print(f"sustained with 0 failures and 0 refusals in every run: {ladder['sustained_cps']}")
        print(
            f"... and INVITE->200 p99 under {FAST_SETUP_P99_MS} ms: "
            f"{ladder['sustained_fast_setup_cps']} calls/s"
        )
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"\nCPU of the daemon process, {cpu['concurrent_calls']} calls, {cpu['window_s']} s window"
    )
    print(f"  out only: {cpu['out_only']}")
    print(f"  echo:     {cpu['echo']}")
    print(f"  per packet: out {cpu['out_us_per_packet']} us, in {cpu['in_us_per_packet']} us")
    print(
        "\nCPU per call setup (INVITE..BYE, no hold): "
        f"SIP engine {engine['us_per_call_median']} us; "
        f"whole daemon {setup_cost['us_per_call']} us ({setup_cost['calls']} calls at "
        f"{setup_cost['rate_cps']}/s, {setup_cost['failed']} failed); "
        f"embedded TTS child on the same core {setup_cost['tts_child_us_per_call']} us"
    )
    for name, share in setup_cost.get("profile", {}).get("pct", {}).items():
        print(f"  {share:5.1f} %  {name}")
    sipp_version = subprocess.run(["sipp", "-v"], capture_output=True, text=True).stdout
    m = re.search(r"SIPp v\S+", sipp_version)
    first = ladders[modes[0]] if modes else {}
    path = write(
        args.out,
        {
            "setup_cost": {"sip_engine": engine, "daemon": setup_cost},
            "ladders": ladders,
            "sustained_cps": first.get("sustained_cps", 0),
            "sustained_fast_setup_cps": first.get("sustained_fast_setup_cps", 0),
            "load_average_at_end": [round(v, 2) for v in load],
            "cpu": cpu,
            "daemon_log_tail": log_tail,
        },
        {
            "rates_cps": rates,
            "step_s": args.step_s,
            "call_s": args.call_s,
            "repeat": args.repeat,
            "shedding": modes,
            "max_calls": MAX_CALLS,
            "invite_rate_per_source": 100000,
            "rtp_ports": "20000-29999",
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

"""The shipped IVR at real call rates: the demo config, the embedded Piper voice, SIP callers.

Usage: python -m bench.bench_ivr [--quick] [--calls 500] [--rate 25] [--hold-s 30]
                                 [--cores split,one] [--cache warm,cold] [--stalls] [--out NAME]

What is measured (issue 31): ``callbridge serve`` with ``config/callbridge.toml`` as shipped
(the embedded Piper voice as a supervised child, a route greeting, the demo flow's menu that
repeats itself while the caller says nothing), its listeners moved to free ports, JSON logs,
and ``cache_dir`` set to a directory of the run's own. The load generator
(``bench/loadgen/rtp.py``: our SIP UA over UDP, one RTP socket per call, every packet from
the daemon timestamped by the kernel) places ``--calls`` calls at ``--rate`` calls/s, each
sending PCMU with low-level noise every 20 ms (below the barge-in floor), and holds them
``--hold-s`` after the last one is answered. One source places every call, so the run sets
``invite_rate_per_source`` above ``--rate`` (a load generator is not a flood).

Placement (``--cores``): ``split`` pins the daemon to core 0 and moves its embedded TTS
child to core 1 (with the load generator); ``one`` leaves the child on the daemon's core,
as ``make run`` and a plain systemd install do.

Cache (``--cache``): ``cold`` starts from an empty ``cache_dir``; ``warm`` restarts the
daemon on the ``cache_dir`` the cold run left (where the daemon keeps prompts on disk).

Figures per run: calls answered; turns finished, interrupted and failed (the log's
``turn.finished``, ``turn.interrupted`` and ``provider.error`` lines) and provider errors (from
``/metrics``); broken prompts (a turn that ended with a provider error, or frames the
provider had not sent yet inside a turn: ``callbridge_underruns_provider_total``); pacing of
every call's RTP (p50/p99/max departure deviation from the 20 ms grid, kernel arrival time);
the daemon's CPU. Pacing is given over the whole window (``pacing``: the ramp at
``--rate`` included, as the goal counts it) and over the packets that arrived after the last
call was answered (``pacing_steady``), so that call set-up is told apart from the calls' own
turns. With ``--stalls`` the daemon's core is watched for host stalls over the run
(``hostspeed.watch``: a ``SCHED_FIFO`` thread on that core sleeping 1 ms at a time, which no
process in the guest can delay, only the hypervisor), and every episode of packets over
``EXCURSION_MS`` (``excursions``) says which stall, if any, ended within ``STALL_REACH_MS``
before it: a late frame after the core itself did not run is the host's, one without is the
daemon's to explain. Goal: 0 provider errors, 0 broken prompts, pacing p99 <= 2 ms and
max <= 10 ms, in every placement, warm and cold.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write
from bench.loadgen import hostspeed
from bench.loadgen.analysis import pacing_summary, rtp_deviations_ns
from bench.loadgen.procs import (
    DAEMON_CORE,
    LOADGEN_CORE,
    ROOT,
    VENV_BIN,
    _pinned,
    free_port,
    pin_self,
    terminate,
)
from bench.loadgen.rtp import RtpLoad

DEMO = ROOT / "config" / "callbridge.toml"
EXCURSION_MS = 10.0
"""The goal's bound on any one packet's deviation from the grid."""


def demo_config(sip: int, ms: int, api: int, cache_dir: Path, rate: float) -> str:
    """The shipped demo config with its listeners on free ports and the run's cache_dir."""
    text = DEMO.read_text()
    text = text.replace('listen = ["127.0.0.1:5060"]', f'listen = ["127.0.0.1:{sip}"]')
    text = text.replace('listen = "127.0.0.1:8080"', f'listen = "127.0.0.1:{ms}"')
    text = text.replace('listen = "127.0.0.1:8081"', f'listen = "127.0.0.1:{api}"')
    text = re.sub(r"^log_format = .*$", 'log_format = "json"', text, count=1, flags=re.M)
    text = re.sub(r"^cache_dir = .*$\n", "", text, flags=re.M)
    text = text.replace("[daemon]\n", f'[daemon]\ncache_dir = "{cache_dir}"\n', 1)
    rate_line = f"invite_rate_per_source = {max(100.0, 4 * rate)}\n"
    text = re.sub(r"^invite_rate_per_source = .*$\n", "", text, flags=re.M)
    return text.replace("[sip]\n", "[sip]\n" + rate_line, 1)


class Daemon:
    def __init__(self, workdir: Path, cache_dir: Path, rate: float) -> None:
        self.workdir = workdir
        self.sip, self.ms, self.api = free_port(2), free_port(), free_port()  # 2: SOCK_DGRAM
        cfg = workdir / "callbridge.toml"
        cfg.write_text(demo_config(self.sip, self.ms, self.api, cache_dir, rate))
        self.log = workdir / "daemon.log"
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "callbridge"), "serve", "--config", str(cfg)],
            preexec_fn=_pinned(DAEMON_CORE),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab"),  # noqa: SIM115 - the child owns it
        )

    def http(self, path: str) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.api}{path}", timeout=5) as r:
            return str(r.read().decode())

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited; see {self.log}")
            try:
                self.http("/readyz")
                return time.monotonic() - t0
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"daemon not ready in {timeout_s} s; see {self.log}")

    def children(self) -> list[int]:
        out: list[int] = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            kids = (task / "children").read_text().split()
            out.extend(int(k) for k in kids)
        return out

    def metric_sum(self, name: str, where: str = "") -> float:
        total = 0.0
        for line in self.http("/metrics").splitlines():
            if line.startswith(name) and where in line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                if key.split("{")[0] == name:
                    total += float(value)
        return total

    def log_counts(self, names: tuple[str, ...]) -> dict[str, int]:
        """How many lines of each event the daemon's JSON log holds."""
        counts = dict.fromkeys(names, 0)
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.search(r'"event": ?"([a-z_.]+)"', line)
            if m and m.group(1) in counts:
                counts[m.group(1)] += 1
                why = re.search(r'"reason": ?"([a-z_]+)"', line)
                if why:
                    key = f"{m.group(1)}:{why.group(1)}"
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def cpu_s(self, pid: int | None = None) -> float:
        fields = Path(f"/proc/{pid or self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        terminate(self.proc, 15)


def excursions(
    per: list[tuple[Any, Any]], stalls: list[tuple[float, float]], t0_ns: int
) -> list[dict[str, Any]]:
    """Episodes of packets deviating over ``EXCURSION_MS`` (``episodes_of``): when (ms after
    ``t0_ns``) and for how long, how many packets on how many calls (of those sending
    then), the largest deviation, and the longest host stall that ended within
    ``STALL_REACH_MS`` before the episode began (None: none did). Every call late at once
    is one late wake-up of the media clock; a few calls late for long is their grid."""
    late: list[tuple[int, float, int]] = []
    for call, (a, dev) in enumerate(per):
        over = abs(dev) > EXCURSION_MS * 1e6
        ms = (abs(dev[over]) / 1e6).tolist()
        late.extend((t, m, call) for t, m in zip(a[over].tolist(), ms, strict=True))
    late.sort()
    episodes = hostspeed.episodes_of([t for t, _, _ in late])
    causes = hostspeed.stalls_before([first for first, _ in episodes], stalls)
    out = []
    i = 0
    for (first, n), cause in zip(episodes, causes, strict=True):
        these = late[i : i + n]  # episodes_of groups in time order
        i += n
        last = these[-1][0]
        sending = sum(1 for a, _ in per if a.size and a[0] <= first <= a[-1])
        out.append(
            {
                "at_ms": (first - t0_ns) // 1_000_000,
                "span_ms": (last - first) // 1_000_000,
                "packets": n,
                "calls": len({c for _, _, c in these}),
                "calls_sending": sending,
                "max_ms": round(max(m for _, m, _ in these), 2),
                "stall_before_ms": cause,
            }
        )
    return out


def run_once(
    calls: int,
    rate: float,
    hold_s: float,
    cores: str,
    cache_dir: Path,
    workdir: Path,
    watch_stalls: bool = False,
) -> dict[str, Any]:
    d = Daemon(workdir, cache_dir, rate)
    watcher: hostspeed.StallWatch | None = None
    try:
        ready_s = d.wait_ready(300)
        kids = d.children()
        target = {LOADGEN_CORE} if cores == "split" else {DAEMON_CORE}
        for pid in kids:
            os.sched_setaffinity(pid, target)
        load = RtpLoad(("127.0.0.1", d.sip), route="demo")
        if watch_stalls:  # the ramp, up to 30 s for the last answer, the hold
            watcher = hostspeed.StallWatch(calls / rate + hold_s + 10, DAEMON_CORE)
        load.recording = True
        c0, t0 = d.cpu_s(), time.monotonic()
        k0 = sum(d.cpu_s(k) for k in kids)
        load.place(calls, rate_per_s=rate)
        answered = load.wait_answered(30)
        steady_ns = time.monotonic_ns()  # every call answered: the ramp is over
        load.run_for(hold_s)
        load.recording = False
        c1, t1 = d.cpu_s(), time.monotonic()
        k1 = sum(d.cpu_s(k) for k in kids)
        per = [rtp_deviations_ns(c.arrival_ns, c.rtp_ts, c.marker) for c in load.calls]
        steady = [(a[a >= steady_ns], d[a >= steady_ns]) for a, d in per]
        load.hangup_all(settle_s=2.0)
        load.close()
        time.sleep(1.0)
        host: dict[str, Any] = {}
        stalls = watcher.result() if watcher is not None else None
        if stalls is not None:
            seen = [(end, ms) for end, ms in stalls if end >= t0]
            host = {
                "stalls": len(seen),
                "longest_stall_ms": max((ms for _, ms in seen), default=0.0),
                "stall_chance_pct": round(hostspeed.chance_pct(seen, t1 - t0), 1),
                "excursions": excursions(per, seen, int(t0 * 1e9)),
            }
        events = d.log_counts(("turn.finished", "turn.interrupted", "provider.error"))
        turns = {
            "finished": events["turn.finished"],
            "interrupted": events["turn.interrupted"],
            **{k.split(":")[1]: v for k, v in events.items() if k.startswith("turn.interrupted:")},
            "provider_error": events["provider.error"],
        }
        errors = d.metric_sum("callbridge_provider_errors_total")
        refused = d.metric_sum("callbridge_sip_responses_total", 'code="503"')
        dry = d.metric_sum("callbridge_underruns_provider_total")
        return {
            "cores": cores,
            "ready_s": round(ready_s, 2),
            "calls": calls,
            "answered": answered,
            "failed_setups": load.failed,
            "sip_503": refused,
            "turns": turns,
            "provider_errors": errors,
            "provider_underrun_frames": dry,
            "broken_prompts": turns["provider_error"] + (1 if dry else 0),
            "pacing": pacing_summary(per),
            "pacing_steady": pacing_summary(steady),
            "daemon_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 1),
            "tts_child_cpu_pct": round(100 * (k1 - k0) / (t1 - t0), 1),
            "cache_files": sum(1 for p in cache_dir.rglob("*") if p.is_file()),
            **({"host_stalls": host} if host else {}),
        }
    finally:
        d.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 calls at 10 calls/s, 15 s held")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--hold-s", type=float, default=30.0)
    ap.add_argument("--cores", default="split,one")
    ap.add_argument("--cache", default="cold,warm")
    ap.add_argument("--stalls", action="store_true", help="watch the daemon's core's host stalls")
    ap.add_argument("--out", default="ivr")
    a = ap.parse_args()
    if a.quick:
        a.calls, a.rate, a.hold_s = 60, 10.0, 15.0
        a.out = a.out if a.out != "ivr" else "ivr_quick"
    pin_self(LOADGEN_CORE)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_ivr_") as tmp:
        for cores in a.cores.split(","):
            cache_dir = Path(tmp) / f"cache_{cores}"
            cache_dir.mkdir()
            for cache in a.cache.split(","):
                workdir = Path(tmp) / f"{cores}_{cache}"
                workdir.mkdir()
                if cache == "cold":
                    for p in cache_dir.rglob("*"):
                        if p.is_file():
                            p.unlink()
                r = run_once(a.calls, a.rate, a.hold_s, cores, cache_dir, workdir, a.stalls)
                r["cache"] = cache
                pac, ste = r["pacing"], r["pacing_steady"]
                print(
                    f"{cores:5} {cache:4}: answered {r['answered']}/{r['calls']}, turns "
                    f"{r['turns']}, provider errors {r['provider_errors']:.0f}, provider "
                    f"underrun frames {r['provider_underrun_frames']:.0f}, pacing p50 "
                    f"{pac.get('p50_ms')} / p99 {pac.get('p99_ms')} / max {pac.get('max_ms')} "
                    f"ms (after the ramp p99 {ste.get('p99_ms')} / max {ste.get('max_ms')} ms), "
                    f"daemon {r['daemon_cpu_pct']} %, tts child {r['tts_child_cpu_pct']} %, "
                    f"ready in {r['ready_s']} s",
                    flush=True,
                )
                host = r.get("host_stalls")
                if host:
                    print(
                        f"      host stalls over {hostspeed.STALL_MS} ms: {host['stalls']} "
                        f"(longest {host['longest_stall_ms']} ms; a stall ends within "
                        f"{hostspeed.STALL_REACH_MS:g} ms "
                        f"before a random moment {host['stall_chance_pct']} % of the time)",
                        flush=True,
                    )
                    for e in host["excursions"]:
                        cause = e["stall_before_ms"]
                        print(
                            f"      t={e['at_ms']} ms for {e['span_ms']} ms: {e['packets']} "
                            f"packets "
                            f"over {EXCURSION_MS:g} ms on {e['calls']} of {e['calls_sending']} "
                            f"calls (max {e['max_ms']}), "
                            + (f"after a {cause} ms stall" if cause else "no stall before it"),
                            flush=True,
                        )
                elif a.stalls:
                    print("      host stalls: not watched (SCHED_FIFO needs CAP_SYS_NICE)")
                runs.append(r)
    settings = {"calls": a.calls, "rate": a.rate, "hold_s": a.hold_s, "config": str(DEMO)}
    path = write(a.out, {"runs": runs}, settings)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

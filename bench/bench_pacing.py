"""Pacing: departure deviation of outbound frames from the 20 ms grid, seen by a separate receiver.

SIP/RTP: the load generator (its own process, core 1) is the UAC and the
receiver: every RTP packet is timestamped by the kernel on arrival
(``SO_TIMESTAMPNS`` on each call's socket, read from ``recvmsg`` ancillary
data), so the receiver's own scheduling does not enter the figure. The grid
of each talkspurt is anchored on its first packet (marker bit, or the first
packet of the window) and the RTP timestamp gives each packet's slot.
Figures: p50/p99/max of |deviation| over all packets of all calls and per
call, and drift (slope of the deviation against time, ppm and ms per
minute). Media streams: arrival at the carrier (``time.monotonic_ns()`` in
the load generator, no kernel timestamps through a WebSocket), grid fitted
per talkspurt after the lead frames.

Calls as in ``bench_capacity`` (continuous TTS, inbound audio through the
VAD, 8 kHz mu-law pass-through); the daemon is pinned to core 0, the load
generator and the TTS server to core 1. Call counts: 1, 100 and the last
step that met the bar in ``bench/results/capacity.json`` (200 when none),
each repeated ``--reps`` times (medians and spread over the repetitions).

Baseline in the same run: baresip (a C softphone) dials the load
generator's own UAS and plays a WAV file over PCMU; the same receiver
measures its packets the same way. baresip is pinned to core 0 while the
daemon is idle. The ratio daemon/baresip is reported for 1 call.

Drift: full mode (no ``--quick``) adds one run of ``--drift-minutes``
(default 10) at 100 calls; ``/proc/loadavg`` is recorded before and after.

Plots (``bench/plots.py``): ``bench/results/pacing_cdf.png`` (|deviation|
per set-up: every packet of every repetition), ``pacing_drift.png``
(deviation over time in the drift run); their paths are in the JSON.

    python -m bench.bench_pacing [--quick] [--reps N] [--drift-minutes N] [--no-twilio]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

from bench import plots
from bench.common import RESULTS, write
from bench.loadgen.analysis import (
    pacing_summary,
    per_call_figures,
    rtp_deviations_ns,
    rtp_gap_frames,
)
from bench.loadgen.procs import DAEMON_CORE, DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.rtp import RtpLoad, realtime_to_monotonic_offset_ns
from bench.loadgen.steps import core_busy_s, ws_step

PerCall = list[tuple[np.ndarray, np.ndarray]]
ROOT = Path(__file__).resolve().parents[1]
FIGS = ("p50_ms", "p99_ms", "max_ms", "worst_call_p99_ms", "drift_ms_per_min_median")


def source_tree() -> dict[str, Any]:
    """Which ``bridge`` the daemon runs (the working tree, or an export of a commit when
    others' uncommitted edits are in the shared tree) and the commit at the start."""
    import bridge

    src = Path(bridge.__file__).resolve().parent
    out: dict[str, Any] = {"bridge_package": str(src)}
    for key, cmd in (
        ("commit_at_start", ["git", "rev-parse", "HEAD"]),
        ("uncommitted_daemon_files", ["git", "status", "--porcelain", "bridge", "codecs"]),
    ):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
            out[key] = res.stdout.strip().splitlines() if "status" in cmd else res.stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            out[key] = None
    exported = ROOT / "EXPORTED_FROM"  # written next to a `git archive` export of a commit
    if exported.exists():
        out["commit_at_start"] = exported.read_text().strip()
        out["uncommitted_daemon_files"] = []
    return out


def max_calls() -> int:
    try:
        cap = json.loads((RESULTS / "capacity.json").read_text())["figures"]
        best = int(cap["sip_mulaw"]["last_step_meeting_bar"])
    except (OSError, KeyError, ValueError):
        best = 0
    return best if best > 100 else 200


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window(load: RtpLoad, pid: int, measure_s: float) -> tuple[dict[str, Any], PerCall]:
    """Record ``measure_s`` of the calls in ``load``; CPU of ``pid`` and of others on core 0."""
    k0 = core_busy_s(DAEMON_CORE)
    off0 = realtime_to_monotonic_offset_ns()
    c0, t0 = proc_cpu_s(pid), time.monotonic()
    load.recording = True
    load.run_for(measure_s)
    load.recording = False
    c1, t1 = proc_cpu_s(pid), time.monotonic()
    k1 = core_busy_s(DAEMON_CORE)
    off1 = realtime_to_monotonic_offset_ns()
    per = [rtp_deviations_ns(c.arrival_ns, c.rtp_ts, c.marker) for c in load.calls]
    missing = sum(rtp_gap_frames(c.rtp_ts) for c in load.calls)
    received = sum(len(c.rtp_ts) for c in load.calls)
    # frames the wall clock says should have arrived between each call's first and last
    # packet of the window, minus those that did (a gap the RTP timestamps do not show)
    short = sum(
        round((c.arrival_ns[-1] - c.arrival_ns[0]) / 20e6) + 1 - len(c.arrival_ns)
        for c in load.calls
        if len(c.arrival_ns) > 1
    )
    wall = t1 - t0
    answered = sum(1 for c in load.calls if c.remote is not None)
    info = {
        "answered": answered,
        "window_s": round(wall, 2),
        "sender_cpu_pct": round(100 * (c1 - c0) / wall, 1),
        "sender_cpu_us_per_call_s": round(1e6 * (c1 - c0) / wall / max(1, answered), 1),
        "core0_other_pct": round(100 * max(0.0, k1[0] - k0[0] - (c1 - c0)) / wall, 1),
        "core0_steal_pct": round(100 * (k1[1] - k0[1]) / wall, 1),
        # frames never received (skipped by the sender after a late wake-up, or lost):
        # they have no deviation, so the pacing figures alone would hide them
        "frames_received": received,
        "frames_missing": missing,
        "frames_missing_pct": round(100 * missing / max(1, missing + received), 3),
        "frames_short_of_wall_clock": int(short),
        "frames_expected_in_window": int(answered * wall / 0.02),
        # CLOCK_REALTIME - CLOCK_MONOTONIC moved by this much during the window: the
        # kernel timestamps are realtime, moved onto monotonic with the offset at start
        "clock_offset_change_us": round((off1 - off0) / 1e3, 1),
    }
    return info, per


def sip_run(
    d: DaemonUnderTest, n: int, measure_s: float, warm_s: float = 2.0
) -> tuple[dict[str, Any], PerCall]:
    """``n`` daemon calls (route ``talk``), one measured window; summary and raw deviations."""
    load = RtpLoad(("127.0.0.1", d.sip_port), route="talk")
    try:
        load.place(n, rate_per_s=150)
        load.wait_answered(20)
        load.run_for(warm_s)
        info, per = _window(load, d.pid, measure_s)
        ids = {c.call_id for c in load.calls}
        load.hangup_all(settle_s=1.5)
    finally:
        load.close()
    time.sleep(0.5)
    cdrs = [c for c in d.cdr_lines() if c.get("call_id") in ids]
    out = {
        "calls": n,
        **info,
        "pacing": pacing_summary(per),
        "underruns": sum(int(c.get("underruns", 0)) for c in cdrs),
        "late_wakeups": sum(int(c.get("late_wakeups", 0)) for c in cdrs),
    }
    return out, per


# ------------------------------------------------------------------ baresip

BARESIP_CONFIG = """\
poll_method\t\tepoll
net_interface\t\t127.0.0.1
sip_listen\t\t127.0.0.1:{sip_port}
module_path\t\t/usr/lib/baresip/modules
module\t\t\tg711.so
module\t\t\taufile.so
module_app\t\taccount.so
module_app\t\tmenu.so
audio_source\t\taufile,{wav}
audio_player\t\taufile,/dev/null
audio_alert\t\taufile,/dev/null
rtp_ports\t\t{rtp_lo}-{rtp_hi}
"""
BARESIP_ACCOUNTS = "<sip:pacing@127.0.0.1:{sip_port}>;regint=0;audio_codecs=PCMU\n"


def _free_pair(kind: int, avoid: set[int]) -> int:
    """An even port ``p`` such that ``p`` and ``p + 1`` are free (bind(0) gives odd ports)."""
    while True:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1]) & ~1
        if port in avoid or port + 1 in avoid:
            continue
        try:
            for p in (port, port + 1):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def write_wav(path: Path, seconds: float) -> None:
    """8 kHz mono s16: a 440 Hz tone at about -12 dBFS with a 3 Hz swell (speech-like level)."""
    t = np.arange(int(8000 * seconds)) / 8000
    pcm = 8000 * np.sin(2 * math.pi * 440 * t) * (0.6 + 0.4 * np.sin(2 * math.pi * 3 * t))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm.astype("<i2").tobytes())


def baresip_run(
    wd: Path, measure_s: float, warm_s: float = 2.0, core: int = DAEMON_CORE
) -> tuple[dict[str, Any], PerCall]:
    """baresip dials our UAS and plays a WAV over PCMU; its packets measured like the daemon's."""
    exe = shutil.which("baresip")
    if exe is None:
        return {"error": "baresip not installed"}, []
    load = RtpLoad(("127.0.0.1", 9), route="unused")
    load.accept_incoming = True
    cfg = wd / "baresip"
    cfg.mkdir(exist_ok=True)
    wav = cfg / "source.wav"
    total_s = warm_s + measure_s + 15
    write_wav(wav, total_s + 10)
    sip_port = _free_pair(socket.SOCK_STREAM, {load.sip_addr[1]})  # +1: SIP over TLS
    rtp_lo = _free_pair(socket.SOCK_DGRAM, {load.sip_addr[1]})
    (cfg / "config").write_text(
        BARESIP_CONFIG.format(sip_port=sip_port, wav=wav, rtp_lo=rtp_lo, rtp_hi=rtp_lo + 9)
    )
    (cfg / "accounts").write_text(BARESIP_ACCOUNTS.format(sip_port=sip_port))
    host, port = load.sip_addr
    log = cfg / "baresip.log"
    argv = [exe, "-f", str(cfg), "-t", str(int(total_s)), "-e", f"/dial sip:pace@{host}:{port}"]
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        )
    try:
        deadline = time.monotonic() + 15
        while not load.calls and time.monotonic() < deadline and proc.poll() is None:
            load.run_for(0.1)
        if not load.calls:
            tail = log.read_text(errors="replace")[-1500:]
            return {"error": f"baresip did not call; log tail: {tail}"}, []
        load.run_for(warm_s)
        info, per = _window(load, proc.pid, measure_s)
        load.hangup_all(settle_s=1.0)
    finally:
        load.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    version = subprocess.run([exe, "-h"], capture_output=True, text=True).stdout.split("\n")[0]
    out = {"calls": 1, **info, "pacing": pacing_summary(per), "baresip": version.strip()}
    return out, per


# ------------------------------------------------------------------ summaries


def over_reps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and [min, max] over repetitions of the headline pacing figures."""
    out: dict[str, Any] = {"repetitions": len(runs)}
    for key in FIGS:
        vals = [r["pacing"][key] for r in runs if r.get("pacing", {}).get(key) is not None]
        if vals:
            out[f"{key}_median"] = round(statistics.median(vals), 4)
            out[f"{key}_spread"] = [min(vals), max(vals)]
    out["core0_other_pct"] = [r.get("core0_other_pct") for r in runs]
    return out


def abs_ms(per: PerCall) -> np.ndarray:
    devs = [d for _, d in per if d.size]
    return np.abs(np.concatenate(devs)) / 1e6 if devs else np.zeros(0)


def drift_plot(per: PerCall, minutes: float, n: int) -> str | None:
    if not any(d.size for _, d in per):
        return None
    t0 = min(int(a[0]) for a, d in per if d.size)
    t = np.concatenate([(a - t0) / 1e9 for a, d in per if d.size])
    v = np.concatenate([d / 1e6 for _, d in per if d.size])
    return plots.over_time(
        t,
        v,
        "pacing_drift",
        title=f"SIP/RTP, {n} calls, {minutes:g} min: signed deviation from each call's grid"
        " (kernel receive time; all calls pooled)",
        ylabel="deviation (ms)",
        bin_s=5.0,
        goals={"max goal ±10 ms": 10.0},
    )


def print_row(leg: str, n: int, rep: int, r: dict[str, Any]) -> None:
    p = r.get("pacing", {})
    print(
        f"{leg:<8} {n:>5} {rep:>3} {p.get('p50_ms')!s:>7} {p.get('p99_ms')!s:>7}"
        f" {p.get('max_ms')!s:>7} {p.get('worst_call_p99_ms')!s:>8}"
        f" {p.get('drift_ms_per_min_median')!s:>9} {r.get('core0_other_pct')!s:>7}"
        f" {r.get('answered')!s:>5}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--reps", type=int, default=None, help="repetitions of each case (default 3; --quick: 2)"
    )
    ap.add_argument(
        "--drift-minutes",
        type=float,
        default=None,
        help="length of the drift run at 100 calls (default: 10 in full mode, none with --quick)",
    )
    ap.add_argument("--drift-calls", type=int, default=100)
    ap.add_argument("--no-twilio", action="store_true", help="skip the media-stream leg")
    ap.add_argument("--workdir", default="", help="keep the daemon's config and logs here")
    ap.add_argument("--counts", default="", help="call counts, e.g. 1,100 (default 1,100,max)")
    args = ap.parse_args()
    measure_s = 5.0 if args.quick else 30.0
    if args.reps is None:  # --quick stays near the 2 minutes make bench-quick allows each bench
        args.reps = 2 if args.quick else 3
    drift_min = args.drift_minutes if args.drift_minutes is not None else (0 if args.quick else 10)
    counts = sorted(
        {int(c) for c in args.counts.split(",")} if args.counts else {1, 100, max_calls()}
    )
    tree = source_tree()
    pin_self()
    figures: dict[str, Any] = {}
    raw: dict[str, PerCall] = {}
    print(
        f"{'leg':<8} {'calls':>5} {'rep':>3} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
        f" {'worst99':>8} {'ms/min':>9} {'core0+%':>7} {'up':>5}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(args.workdir or tmp)
        wd.mkdir(parents=True, exist_ok=True)
        runs: list[dict[str, Any]] = []
        raw["baresip"] = []
        for rep in range(args.reps):
            r, per = baresip_run(wd, measure_s)
            runs.append(r)
            raw["baresip"] += per
            print_row("baresip", 1, rep, r)
            if "error" in r:
                print(r["error"])
                break
        figures["baresip_1"] = {**over_reps(runs), "runs": runs}
        tts = TtsProcess.start(wd)
        d = DaemonUnderTest.start(wd, tts.port)
        try:
            for n in counts:
                runs, raw[f"sip_{n}"] = [], []
                for rep in range(args.reps):
                    r, per = sip_run(d, n, measure_s)
                    runs.append(r)
                    raw[f"sip_{n}"] += per
                    print_row("sip", n, rep, r)
                figures[f"sip_{n}"] = {**over_reps(runs), "runs": runs}
            if not args.no_twilio:
                for n in counts:
                    runs = []
                    for rep in range(args.reps):
                        r = ws_step(d, tts, n, measure_s)
                        runs.append(r)
                        print_row("twilio", n, rep, r)
                    figures[f"twilio_{n}"] = {**over_reps(runs), "runs": runs}
            if drift_min > 0:
                before = loadavg()
                thaws_before = len(d.log_events("gc.thaw"))
                r, per = sip_run(d, args.drift_calls, drift_min * 60)
                # the GC policy's full passes with calls up: one pause each (bridge/io/gcpolicy.py)
                r["gc_busy_thaws"] = [
                    {k: t.get(k) for k in ("calls", "pass_ms", "young_found", "evidence")}
                    for t in d.log_events("gc.thaw")[thaws_before:]
                    if t.get("calls")
                ]
                r["loadavg_before"], r["loadavg_after"] = before, loadavg()
                r["per_call"] = per_call_figures(per)
                r["plot"] = drift_plot(per, drift_min, args.drift_calls)
                figures[f"sip_{args.drift_calls}_{drift_min:g}min"] = r
                print_row(f"drift{drift_min:g}m", args.drift_calls, 0, r)
                print(f"  loadavg before {r['loadavg_before']} / after {r['loadavg_after']}")
                print(f"  GC thaws with calls up: {r['gc_busy_thaws']}")
        finally:
            d.stop()
            tts.stop()

    # the daemon against baresip, one call each (medians over the repetitions)
    b, s1 = figures["baresip_1"], figures.get("sip_1", {})
    figures["ratio_daemon_over_baresip_1call"] = {
        k: round(s1[f"{k}_median"] / b[f"{k}_median"], 2)
        for k in ("p50_ms", "p99_ms", "max_ms")
        if s1.get(f"{k}_median") is not None and b.get(f"{k}_median")
    }
    cdf_sets = {
        (f"daemon, {k.split('_')[1]} call{'s' if k != 'sip_1' else ''}" if k != "baresip" else
         "baresip 1.0 (aufile WAV), 1 call"): abs_ms(v)
        for k, v in raw.items()
    }  # fmt: skip
    figures["plots"] = {
        "cdf": plots.cdf(
            cdf_sets,
            "pacing_cdf",
            title=f"|deviation| from the 20 ms grid, SIP/RTP PCMU ({args.reps} x {measure_s:g} s)",
            xlabel="|deviation| at the receiver, kernel timestamps (ms)",
            goals={"goal p99 2 ms": 2.0, "goal max 10 ms": 10.0},
            logx=True,
        )
    }
    for r in figures.values():
        if isinstance(r, dict) and r.get("plot"):
            figures["plots"]["drift"] = r["plot"]
    figures["goal"] = {"p99_ms": 2.0, "max_ms": 10.0, "drift": "none over 10 minutes"}
    path = write(
        "pacing",
        figures,
        {
            "measure_s": measure_s,
            "repetitions": args.reps,
            "counts": counts,
            "source": tree,
            "drift_minutes": drift_min,
            "drift_calls": args.drift_calls,
            "audio": "kova mulaw/8000 pass-through, continuous (route talk)",
            "receiver": "load generator process, core 1; RTP: kernel receive timestamps"
            " (SO_TIMESTAMPNS), grid anchored on each talkspurt's first packet",
            "baseline": "baresip playing an 8 kHz WAV (aufile) over PCMU to the load"
            " generator's UAS, pinned to core 0 with the daemon idle",
            "daemon": "callbridge serve, uvloop, core 0, load shedding off"
            " (max_loop_lag_ms = 0: off, loadgen.procs.config_text)",
            "machine_note": "shared 2-core VM: core0_other_pct is CPU others used on core 0",
        },
    )
    print(json.dumps(figures["ratio_daemon_over_baresip_1call"]))
    print(f"wrote {path} and {', '.join(figures['plots'].values())}")


if __name__ == "__main__":
    main()

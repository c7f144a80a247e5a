"""Capacity with SRTP against plain RTP: the daemon's CPU per call-second, both ways (issue 34).

Issue 34's budget is "capacity at the pacing bar with SRTP at least 85 % of the
plain figure". This bench runs one ``bench_capacity`` SIP step (``loadgen.steps
.sip_step``: N calls on route ``talk``, mu-law, TTS without pause, inbound
noise every 20 ms, a ``--measure-s`` window) again and again on one daemon
(``[sip] srtp = "offer"``, a TLS listener with a certificate made for the run),
alternating the modes rep by rep (plain, srtp, srtp, plain, ...):

* ``plain``: the calls' SIP over one TLS connection, no key offered: RTP;
* ``srtp``: the same, each call offering an SDES key: SRTP both ways (the load
  generator protects what it sends and verifies what it receives with
  ``bridge.rtp.srtp.SrtpContext``);
* ``udp`` (``--modes``): SIP over UDP, as ``bench_capacity``.

Reported per step: the daemon's CPU microseconds per call-second
(``/proc/<pid>/stat`` over the window), its share of the core, pacing, the
daemon's underruns, calls answered with SRTP; then the medians per mode and
``plain / srtp``, the ratio of CPU per call-second. The pacing bar's capacity is
the call count at which the core runs out, so at one CPU cost per call-second
capacity scales as its inverse: the ratio is the capacity ratio's proxy, without
a capacity search (which needs a quiet host and the compiled build: each search
takes tens of minutes).

    python -m bench.bench_srtp_capacity --calls 150 --reps 3
    python -m bench.bench_srtp_capacity --quick
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_capacity import CAPACITY_PROVIDER_SETTINGS
from bench.bench_tls_reuse import make_certs
from bench.common import write
from bench.loadgen.procs import DaemonUnderTest, TtsProcess, pin_self
from bench.loadgen.steps import meets_bar, sip_step

MODES = ("plain", "srtp", "udp")


def order(modes: list[str], rep: int) -> list[str]:
    """The modes of rep ``rep``: as given on even reps, reversed on odd ones (A B B A ...),
    so a drift of the host over the run weighs on every mode alike."""
    return list(modes) if rep % 2 == 0 else list(reversed(modes))


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    certs = make_certs(workdir, "daemon")
    client = ssl.create_default_context(cafile=str(certs.ca_file))
    tts = TtsProcess.start(workdir)
    d = DaemonUnderTest.start(
        workdir,
        tts.port,
        provider_extra=CAPACITY_PROVIDER_SETTINGS,
        tls=(certs.cert_file, certs.key_file),
        sip_extra='srtp = "offer"\n',
    )
    steps: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
    try:
        for rep in range(args.reps):
            for mode in order(args.modes, rep):
                step = sip_step(
                    d,
                    tts,
                    args.calls,
                    args.measure_s,
                    tls=None if mode == "udp" else client,
                    srtp=mode == "srtp",
                )
                step["loadavg_1m"] = round(os.getloadavg()[0], 2)
                step["meets_bar"] = meets_bar(step)
                steps[mode].append(step)
                p = step["pacing"]
                print(
                    f"rep {rep} {mode:<5} answered {step['answered']}/{args.calls}"
                    f" srtp {step['srtp_calls']} cpu {step['daemon_cpu_pct']} %"
                    f" {step['cpu_us_per_call_s']} us/call-s pacing p99 {p.get('p99_ms')}"
                    f" worst-call p99 {p.get('worst_call_p99_ms')} ms"
                    f" undr(daemon) {step['underruns_daemon']} strays {step['stray_packets']}"
                    f" core0-other {step['core0_other_pct']} % load {step['loadavg_1m']}",
                    flush=True,
                )
    finally:
        d.stop()
        tts.stop()
    medians = {
        m: statistics.median(s["cpu_us_per_call_s"] for s in runs) for m, runs in steps.items()
    }
    figures: dict[str, Any] = {
        "cpu_us_per_call_s_median": medians,
        "cpu_us_per_call_s_runs": {
            m: [s["cpu_us_per_call_s"] for s in runs] for m, runs in steps.items()
        },
        "steps": steps,
    }
    if "plain" in medians and "srtp" in medians:
        figures["plain_over_srtp_cpu_ratio"] = round(medians["plain"] / medians["srtp"], 3)
        figures["pair_ratios"] = [
            round(a["cpu_us_per_call_s"] / b["cpu_us_per_call_s"], 3)
            for a, b in zip(steps["plain"], steps["srtp"], strict=True)
        ]
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 calls, 1 rep, 6 s windows")
    ap.add_argument("--calls", type=int, default=0, help="calls per step (default 150)")
    ap.add_argument("--reps", type=int, default=0, help="reps per mode (default 3)")
    ap.add_argument("--measure-s", type=float, default=0.0, help="window (default 20 s)")
    ap.add_argument("--modes", default="plain,srtp", help=f"of {', '.join(MODES)}")
    ap.add_argument("--out", default="", help="result name or path (default srtp_capacity[_quick])")
    args = ap.parse_args()
    args.calls = args.calls or (40 if args.quick else 150)
    args.reps = args.reps or (1 if args.quick else 3)
    args.measure_s = args.measure_s or (6.0 if args.quick else 20.0)
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in MODES for m in args.modes):
        ap.error(f"--modes: some of {', '.join(MODES)}")
    pin_self()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args, Path(tmp))
    figures["loadavg_at_start"] = load_before
    figures["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    build = "pure Python" if os.environ.get("CALLBRIDGE_PURE_PYTHON") else "default"
    settings = {"calls": args.calls, "reps": args.reps, "measure_s": args.measure_s,
                "modes": args.modes, "leg": "sip", "codec": "PCMU", "build": build,
                "provider": CAPACITY_PROVIDER_SETTINGS.strip().splitlines()}  # fmt: skip
    print(
        f"median CPU per call-second {figures['cpu_us_per_call_s_median']} µs;"
        f" plain/srtp {figures.get('plain_over_srtp_cpu_ratio')}"
        f" (pairs {figures.get('pair_ratios')}); load {load_before} ->"
        f" {figures['loadavg_at_end']} (shared host, {build})"
    )
    path = write(args.out or ("srtp_capacity_quick" if args.quick else "srtp_capacity"),
                 figures, settings)  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

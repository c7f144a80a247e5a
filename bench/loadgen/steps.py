"""One load step: N concurrent calls on one leg, measured from outside the daemon.

``sip_step`` / ``ws_step`` place ``n`` calls (route ``talk``: a flow that
says a ~15 s text again and again, so outbound audio never stops), let them
settle, then for ``measure_s`` record every outbound frame's arrival and the
daemon's CPU time (``/proc/<pid>/stat``), hang up, and read the calls' CDR
lines (underruns, late wake-ups, added latency). ``profile_s`` > 0 also runs
``py-spy record`` on the daemon during the window.

``ws_step`` takes any server with the ``ServerUnderTest`` attributes (the peer
comparison runs it on Pipecat, which has no CDR lines); with
``sized_media=True`` each message is timed against its talkspurt's audio clock
from the payload sizes (``ws_sized_deviations_ns``), for a peer whose ``media``
messages are not 20 ms.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import ssl
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .analysis import (
    PTIME_NS,
    pacing_summary,
    rtp_deviations_ns,
    talkspurt_median_fit,
    ws_deviations_ns,
)
from .procs import DAEMON_CORE, VENV_BIN, DaemonUnderTest, TtsProcess
from .rtp import RtpLoad
from .twilio import TwilioLoad
from .wire import WireCapture


class ServerUnderTest(Protocol):
    """What a step reads from the server under test (``DaemonUnderTest`` has it all)."""

    @property
    def pid(self) -> int: ...
    @property
    def ms_port(self) -> int: ...
    @property
    def workdir(self) -> Path: ...
    def cpu_s(self) -> float: ...
    def rss_bytes(self) -> int: ...
    def cdr_lines(self) -> list[dict[str, Any]]: ...


def ws_sized_deviations_ns(
    arrival_ns: Iterable[int],
    size_bytes: Iterable[int],
    lead_frames: int = 2,
    gap_ns: int = 50_000_000,
    rate_hz: int = 8000,
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival, deviation) of media messages of any duration, against the audio clock.

    Message ``i`` of a talkspurt is due at the talkspurt's offset + the duration
    of the audio sent before it (its slot); the offset is the median of
    ``arrival - slot`` over the messages measured. A talkspurt starts when a
    message arrives more than ``gap_ns - 20 ms`` after the previous one's audio
    ended; messages whose slot is within the lead (``lead_frames`` * 20 ms) are
    skipped. With 160-byte messages this is ``ws_deviations_ns`` exactly.
    """
    a = np.asarray(arrival_ns, dtype=np.int64)
    if a.size == 0:
        return a, a
    dur = np.asarray(size_bytes, dtype=np.int64) * 1_000_000_000 // rate_hz
    start = np.ones(a.size, dtype=bool)
    start[1:] = (np.diff(a) - dur[:-1]) > gap_ns - PTIME_NS
    starts = np.flatnonzero(start)
    seg = np.cumsum(start) - 1
    before = np.cumsum(dur) - dur
    slot = before - before[starts][seg]
    raw = a - slot
    keep = slot > lead_frames * PTIME_NS
    return a[keep], talkspurt_median_fit(raw, keep, seg, starts.size)[keep]


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_busy_s(core: int) -> tuple[float, float]:
    """(busy, steal) seconds of one CPU so far (``/proc/stat``): what else ran there."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            tck = os.sysconf("SC_CLK_TCK")
            return (v[0] + v[1] + v[2] + v[5] + v[6]) / tck, v[7] / tck
    return 0.0, 0.0


def ttfa_figures(lines: list[dict[str, Any]]) -> dict[str, float | None]:
    """Time to first audio (``OpenTurn`` to the first provider audio) from CDR lines.

    ``later_turns``: every turn after each call's first. In the capacity workload those
    are the turns restarted together while the provider streams every other turn's
    audio at once; a turn's wait before its first frame is silence on the line that
    the underrun count does not see (docs/benchmarks.md, section 3).
    """

    def q(values: list[float], at: float) -> float | None:
        if not values:
            return None
        s = sorted(values)
        return round(s[min(len(s) - 1, int(at * (len(s) - 1) + 0.5))], 1)

    every = [float(v) for c in lines for v in c.get("time_to_first_audio_ms", [])]
    later = [float(v) for c in lines for v in c.get("time_to_first_audio_ms", [])[1:]]
    return {
        "ttfa_ms_p50": q(every, 0.5),
        "ttfa_ms_p99": q(every, 0.99),
        "ttfa_later_turns_ms_p50": q(later, 0.5),
        "ttfa_later_turns_ms_p99": q(later, 0.99),
        "ttfa_later_turns_ms_max": max(later) if later else None,
    }


def _cdr_figures(d: ServerUnderTest, call_ids: set[str] | None) -> dict[str, Any]:
    lines = [c for c in d.cdr_lines() if call_ids is None or c["call_id"] in call_ids]
    return {
        "cdr_calls": len(lines),
        "underruns": (underruns := sum(int(c.get("underruns", 0)) for c in lines)),
        # of those, frames whose audio the provider had not sent yet (the daemon held
        # none of it, nothing waited unread on the turn's connection: CallStats)
        "underruns_provider": (provider := sum(int(c.get("underruns_provider", 0)) for c in lines)),
        "underruns_daemon": underruns - provider,
        # of the provider's, those whose tick found other turns' audio unread on the turn's
        # connection, none of it the turn's (head-of-line on a shared connection)
        "underruns_provider_busy": sum(int(c.get("underruns_provider_busy", 0)) for c in lines),
        # media streams: ticks with nothing to send that the carrier's lead covered (no gap)
        "dry_covered": sum(int(c.get("dry_covered", 0)) for c in lines),
        "late_wakeups": sum(int(c.get("late_wakeups", 0)) for c in lines),
        "provider_errors": sum(int(c.get("provider_errors", 0)) for c in lines),
        **ttfa_figures(lines),
    }


def start_profile(d: ServerUnderTest, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = VENV_BIN / "py-spy"
    if not spy.exists():
        return None
    return subprocess.Popen(
        [str(spy), "record", "--pid", str(d.pid), "--duration", str(int(seconds)), "--rate", "250",
         "--format", "raw", "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


_LINE = re.compile(r":\d+\)$|\)$")


def summarize_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self time by leaf function and inclusive time of the hot paths, from collapsed stacks."""
    if not raw.exists():
        return {}
    leaf: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack:
            continue
        n = int(count_s)
        total += n
        frames = [_LINE.sub("", f) for f in stack.split(";")]
        leaf[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return {}

    def pct(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)]

    return {"samples": total, "self_pct": pct(leaf), "inclusive_pct": pct(incl)}


def _settle(d: Any) -> dict[str, float]:
    """Before a step: wait for the previous step's calls to end (a server that can say)."""
    wait = getattr(d, "wait_calls_ended", None)
    return wait() if wait is not None else {}


def _finish_step(
    d: ServerUnderTest,
    tts: TtsProcess,
    n: int,
    answered: int,
    per_call: list[tuple[np.ndarray, np.ndarray]],
    cpu: tuple[float, float, float],
    others: dict[str, Any],
    call_ids: set[str] | None,
) -> dict[str, Any]:
    used_s, wall_s, _ = cpu
    return {
        "calls": n,
        "answered": answered,
        "daemon_cpu_pct": round(100 * used_s / wall_s, 1),
        "cpu_us_per_call_s": round(1e6 * used_s / wall_s / max(1, answered), 1),
        "pacing": pacing_summary(per_call),
        **others,
        **_cdr_figures(d, call_ids),
    }


def sip_step(
    d: DaemonUnderTest,
    tts: TtsProcess,
    n: int,
    measure_s: float,
    warm_s: float = 2.0,
    profile: Path | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    srtp: bool = False,
) -> dict[str, Any]:
    """``tls``: the calls' SIP over TLS to the daemon's TLS listener; ``srtp`` too: every
    call offers an SDES key and its media is SRTP both ways (``srtp_calls`` counts the
    calls answered with a key)."""
    settled = _settle(d)
    target = ("127.0.0.1", d.tls_port if tls is not None else d.sip_port)
    load = RtpLoad(target, route="talk", tls=tls, srtp=srtp)
    load.place(n, rate_per_s=150)
    answered = load.wait_answered(20)
    load.run_for(warm_s)
    spy = start_profile(d, measure_s, profile) if profile else None
    k0 = core_busy_s(DAEMON_CORE)
    c0, t0, g0, s0 = d.cpu_s(), time.monotonic(), os.times(), _proc_cpu_s(tts.proc.pid)
    load.recording = True
    load.run_for(measure_s)
    load.recording = False
    c1, t1, g1, s1 = d.cpu_s(), time.monotonic(), os.times(), _proc_cpu_s(tts.proc.pid)
    k1 = core_busy_s(DAEMON_CORE)
    per = [rtp_deviations_ns(c.arrival_ns, c.rtp_ts, c.marker) for c in load.calls]
    ids = {c.call_id for c in load.calls}
    strays = sum(c.strays for c in load.calls)
    srtp_calls = sum(1 for c in load.calls if c.srtp is not None)
    load.hangup_all(settle_s=1.5)
    load.close()
    if spy is not None:
        spy.wait(30)
    others = {
        "loadgen_cpu_pct": round(100 * (g1.user + g1.system - g0.user - g0.system) / (t1 - t0), 1),
        "ttsd_cpu_pct": round(100 * (s1 - s0) / (t1 - t0), 1),
        "rss_mb_at_end": round(d.rss_bytes() / 1e6, 1),
        "stray_packets": strays,
        "signalling": "tls" if tls is not None else "udp",
        "srtp_calls": srtp_calls,
        **_core0(k0, k1, c1 - c0, t1 - t0),
        **settled,
    }
    time.sleep(0.5)
    return _finish_step(d, tts, n, answered, per, (c1 - c0, t1 - t0, 0), others, ids)


def ws_step(
    d: ServerUnderTest,
    tts: TtsProcess,
    n: int,
    measure_s: float,
    warm_s: float = 2.0,
    lead_frames: int = 2,
    profile: Path | None = None,
    sized_media: bool = False,
) -> dict[str, Any]:
    """One step of ``n`` Twilio calls. Pacing is taken at the wire (kernel timestamps of
    the daemon's TCP segments, ``loadgen.wire``) when dumpcap can run, so the figure
    is the daemon's; the carrier's user-space arrival times are kept as ``carrier_pacing``.
    ``carrier_gaps`` counts the carrier's buffer running dry mid-turn, ``clears`` the
    ``clear`` messages received while recording."""
    capture = WireCapture(d.ms_port, d.workdir) if WireCapture.available() else None
    window: list[int] = []

    def deviations(arrival: Any, sizes: Any) -> tuple[np.ndarray, np.ndarray]:
        if sized_media:
            return ws_sized_deviations_ns(arrival, sizes, lead_frames)
        return ws_deviations_ns(arrival, lead_frames)

    async def run() -> dict[str, Any]:
        load = TwilioLoad(d.ms_port, route="talk", sized_media=sized_media)
        await load.place(n, rate_per_s=150)
        await asyncio.sleep(warm_s)
        spy = start_profile(d, measure_s, profile) if profile else None
        k0 = core_busy_s(DAEMON_CORE)
        c0, t0, g0, s0 = d.cpu_s(), time.monotonic(), os.times(), _proc_cpu_s(tts.proc.pid)
        window.append(time.time_ns())
        load.recording = True
        await asyncio.sleep(measure_s)
        load.recording = False
        window.append(time.time_ns())
        c1, t1, g1, s1 = d.cpu_s(), time.monotonic(), os.times(), _proc_cpu_s(tts.proc.pid)
        k1 = core_busy_s(DAEMON_CORE)
        per = [deviations(c.arrival_ns, c.sizes) for c in load.calls]
        answered = load.active()
        carrier: dict[str, float] = {
            "calls_not_placed": len(load.failed),
            "carrier_gaps": sum(c.gaps for c in load.calls),
            "calls_with_gaps": sum(1 for c in load.calls if c.gaps),
            "carrier_dry_ms_per_call_s": round(
                1000 * sum(c.dry_s for c in load.calls) / max(1, n) / (t1 - t0), 3
            ),
            "calls_without_media": sum(1 for c in load.calls if not c.arrival_ns),
            "clears": sum(len(c.clears_ns) for c in load.calls),
        }
        if sized_media:
            sizes = [x for c in load.calls for x in c.sizes]
            carrier["media_bytes_median"] = float(np.median(sizes)) if sizes else 0.0
        await load.hangup_all(settle_s=1.5)
        await load.close()
        if spy is not None:
            spy.wait(30)
        others = {
            "loadgen_cpu_pct": round(
                100 * (g1.user + g1.system - g0.user - g0.system) / (t1 - t0), 1
            ),
            "ttsd_cpu_pct": round(100 * (s1 - s0) / (t1 - t0), 1),
            "rss_mb_at_end": round(d.rss_bytes() / 1e6, 1),
            **_core0(k0, k1, c1 - c0, t1 - t0),
            **carrier,
            **settled,
        }
        return _finish_step(d, tts, n, answered, per, (c1 - c0, t1 - t0, 0), others, None)

    settled = _settle(d)
    before = {c["call_id"] for c in d.cdr_lines()}
    try:
        out = asyncio.run(run())
    finally:
        if capture is not None:
            capture.stop()
    out["pacing_seen_at"] = "carrier (user space)"
    if capture is not None and len(window) == 2:
        msgs = capture.media_messages(window[0], window[1]).values()
        wire = [(a, b) for a, b in msgs if a.size]
        if len(wire) == out["answered"] and not capture.dropped:
            out["carrier_pacing"] = out["pacing"]
            out["pacing"] = pacing_summary([deviations(a, b) for a, b in wire])
            out["pacing_seen_at"] = "wire (kernel timestamps, dumpcap on lo)"
        out["capture"] = {
            "connections_with_media": len(wire),
            "packets": capture.received,
            "dropped": capture.dropped,
        }
        capture.path.unlink(missing_ok=True)
    time.sleep(0.5)
    new = {c["call_id"] for c in d.cdr_lines()} - before
    out.update(_cdr_figures(d, new))
    return out


def _core0(
    k0: tuple[float, float], k1: tuple[float, float], daemon_s: float, wall_s: float
) -> dict[str, float]:
    """CPU others used on the daemon's core (a shared machine), and hypervisor steal."""
    other = max(0.0, (k1[0] - k0[0]) - daemon_s)
    return {
        "core0_other_pct": round(100 * other / wall_s, 1),
        "core0_steal_pct": round(100 * (k1[1] - k0[1]) / wall_s, 1),
    }


def meets_bar(step: dict[str, Any], p99_ms: float = 2.0) -> bool:
    pacing = step.get("pacing", {})
    return bool(
        step["answered"] == step["calls"]
        and pacing.get("packets", 0) > 0
        and pacing.get("worst_call_p99_ms", 1e9) <= p99_ms
        and step.get("underruns_daemon", step.get("underruns", 1)) == 0
    )

"""SIP barge-in on the wire with a real softphone: baresip talks over the greeting (issue 34).

The daemon in-process (``tests/e2e/harness.py``: the real SIP leg, the ttsd with the
``tone`` engine, a greeting of eight 1.2 s tones) and baresip 1.0 as a subprocess per call (the
peer tests' templates, ``tests/e2e/scenarios/baresip.*.in``), its microphone
``aufile``: a WAV that is silent for a random 1.6-3.2 s, then 1.5 s of a voiced,
speech-like clip (``speech_mulaw``, the wire bench's clip), then silent. baresip
dials, and hangs up ``hold`` after the clip would have ended.

``dumpcap`` captures the daemon's RTP port range on ``lo`` for the whole run; each
call is the packets to and from its RTP port inside its wall-clock window (a shared
host's other tests may use ports in the range). From the capture alone, per call
(``stop_latency``, the definitions of ``docs/test-caller.md``'s ``barge_ins``):

* onset: the capture time of baresip's first PCMU packet at or above -40 dBFS;
* stop: the end (capture time + 20 ms) of the daemon's last PCMU packet at or above
  -40 dBFS that is followed by 0.5 s without one (the bot was speaking in the 0.5 s
  before the onset, or the call is ``not-speaking``);
* ``barge_in_ms`` = stop - onset.

Both times are packet departures seen on loopback: a caller packet leaves when the
last of its 160 samples exists, so the onset sample is up to 20 ms earlier than its
packet. The daemon's own timings of each barge-in (``BargeInTiming``: its onset
estimate, the decision, the cut turn's last tick) are mapped to wall-clock time and
kept beside the wire figures, to show where the time goes, with how long after the
daemon's tick the caller's packets land (``after_tick_ms``). A cut that falls in one of
the tone's 40 ms gaps ends the bot's speech on the wire early and reads short (the
daemon's last tick then lies after the wire's stop: ``tick_to_stop_ms`` below 20).
Wall-clock figures on a shared host: they move with its load (the load average is
recorded); root (or capture rights) needed for dumpcap.

    python -m bench.bench_bargein_baresip [--quick] [--calls N] [--seed N] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import shutil
import signal
import socket
import statistics
import struct
import tempfile
import time
import wave
from collections.abc import Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import pct, write

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE.parent / "tests" / "e2e" / "scenarios"

GREETING = " ".join(f"w{i}" + "o" * 38 for i in range(8)) + "."
"""Eight 40-letter words: the tone engine makes each a 1.2 s tone with a 40 ms gap after it
(``bench_bargein_wire``'s 60 six-letter words are 180 ms tones: a cut that lands in or just
after one of their gaps ends the bot's speech on the wire a frame or two early)."""
FRAME_S = 0.020
SPEECH_DBFS = -40.0
"""A packet carries speech at or above this RTP level (``docs/test-caller.md``)."""
HOLD_S = 0.5
"""The bot has stopped once this long passes without one of its speech packets."""
PCMU_PT = 0
CLIP_S = 1.5


# ------------------------------------------------------------------ analysis (pure)


@dataclass(frozen=True, slots=True)
class Packet:
    """One captured UDP datagram."""

    at_s: float
    src_port: int
    dst_port: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class WireStop:
    """One call's barge-in as seen on the wire."""

    outcome: str
    """``stopped``; ``no-onset`` (the caller never spoke); ``not-speaking`` (the bot was
    silent in the ``hold`` before the onset); ``still-speaking`` (it never stopped)."""
    onset_s: float | None = None
    stopped_s: float | None = None

    @property
    def barge_in_ms(self) -> float | None:
        if self.onset_s is None or self.stopped_s is None:
            return None
        return round(max(0.0, self.stopped_s - self.onset_s) * 1000.0, 1)


def read_pcap(data: bytes) -> list[Packet]:
    """Every IPv4/UDP datagram of a classic pcap file (Ethernet, SLL, SLL2 or null link)."""
    magic = data[:4]
    micro = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">"}.get(magic)
    nano = {b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}.get(magic)
    order = micro or nano
    if order is None:
        raise ValueError(f"not a classic pcap file: {magic!r}")
    divisor = 1e9 if nano else 1e6
    link_bytes = {1: 14, 113: 16, 276: 20, 0: 4}[struct.unpack_from(order + "I", data, 20)[0]]
    out: list[Packet] = []
    offset = 24
    while offset + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack_from(order + "IIII", data, offset)
        ip = data[offset + 16 + link_bytes : offset + 16 + caplen]
        offset += 16 + caplen
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        ihl = (ip[0] & 0x0F) * 4
        src, dst = struct.unpack_from("!HH", ip, ihl)
        out.append(Packet(sec + frac / divisor, src, dst, ip[ihl + 8 :]))
    return out


def pcmu_level_dbfs(payload: bytes) -> float | None:
    """The RMS level of a PCMU RTP packet's audio, dBFS; None for anything else (RTCP,
    telephone-event, a probe)."""
    if len(payload) <= 12 or payload[0] >> 6 != 2 or payload[1] & 0x7F != PCMU_PT:
        return None
    csrc = payload[0] & 0x0F
    body = payload[12 + 4 * csrc :]
    if not body:
        return None
    from telcodec import g711

    pcm = np.frombuffer(g711.ulaw_decode(body), dtype="<i2").astype(np.float64)
    rms = float(np.sqrt(np.mean(pcm * pcm)))
    return -120.0 if rms <= 0 else 20 * float(np.log10(rms / 32768))


def timelines(
    packets: Sequence[Packet], daemon_ports: Container[int], start_s: float, end_s: float
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The (time, level) of each PCMU packet in ``[start_s, end_s]``: the caller's (to one
    of ``daemon_ports``, the call's RTP port) and the bot's (from one). Other traffic in the
    captured range (a shared host's other tests) is left out."""
    caller: list[tuple[float, float]] = []
    bot: list[tuple[float, float]] = []
    for p in packets:
        if not start_s <= p.at_s <= end_s:
            continue
        level = pcmu_level_dbfs(p.payload)
        if level is None:
            continue
        if p.dst_port in daemon_ports and p.src_port not in daemon_ports:
            caller.append((p.at_s, level))
        elif p.src_port in daemon_ports and p.dst_port not in daemon_ports:
            bot.append((p.at_s, level))
    return caller, bot


def stop_latency(
    caller: Sequence[tuple[float, float]],
    bot: Sequence[tuple[float, float]],
    ended_at_s: float,
    threshold_dbfs: float = SPEECH_DBFS,
    hold_s: float = HOLD_S,
    frame_s: float = FRAME_S,
) -> WireStop:
    """The caller's onset to the bot's stop, from the packets' (time, level) alone
    (module docstring); ``ended_at_s``: when the capture of the call ended."""
    onset = next((t for t, level in sorted(caller) if level >= threshold_dbfs), None)
    if onset is None:
        return WireStop("no-onset")
    speech = sorted(t for t, level in bot if level >= threshold_dbfs)
    before = [i for i, t in enumerate(speech) if onset - hold_s <= t <= onset]
    if not before:
        return WireStop("not-speaking", onset)
    for i in range(before[-1], len(speech)):
        end = speech[i] + frame_s
        following = speech[i + 1] if i + 1 < len(speech) else None
        if following is None:
            if ended_at_s - end >= hold_s:
                return WireStop("stopped", onset, end)
            break
        if following - end >= hold_s:
            return WireStop("stopped", onset, end)
    return WireStop("still-speaking", onset)


def after_tick_ms(caller_s: Sequence[float], bot_s: Sequence[float]) -> float | None:
    """The median time from the daemon's last packet out to each caller packet, ms.

    The daemon sends a packet at every tick of the call's clock (comfort silence between
    turns) and reads the caller's RTP socket right after it: a caller packet that lands
    ``x`` ms after a tick waits ``20 - x`` ms for the next read.
    """
    sends = sorted(bot_s)
    gaps: list[float] = []
    for t in sorted(caller_s):
        i = bisect.bisect_right(sends, t) - 1
        if i >= 0 and t - sends[i] < 2 * FRAME_S:
            gaps.append((t - sends[i]) * 1000.0)
    return round(statistics.median(gaps), 2) if gaps else None


def summarize(ms: Sequence[float]) -> dict[str, float | None]:
    values = list(ms)
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 1) if values else None,
        "p95_ms": round(pct(values, 95), 1) if values else None,
        "max_ms": round(max(values), 1) if values else None,
    }


# ------------------------------------------------------------------ the run (I/O)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_source(path: Path, at_s: float, clip: np.ndarray, total_s: float) -> None:
    """baresip's microphone: ``at_s`` of silence, the clip, silence to ``total_s``."""
    lead = np.zeros(round(at_s * 8000), dtype="<i2")
    tail = np.zeros(max(0, round(total_s * 8000) - len(lead) - len(clip)), dtype="<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.concatenate([lead, clip.astype("<i2"), tail]).tobytes())


class Softphone:
    """One baresip process: its config from the peer tests' templates, its own WAV."""

    def __init__(self, workdir: Path, source: Path) -> None:
        self.workdir = workdir
        self.output = b""
        rec = workdir / "rec"
        rec.mkdir(parents=True, exist_ok=True)
        sip_port = _free_udp_port()
        rtp_lo = _free_udp_port() // 2 * 2
        values = {
            "sip_port": sip_port,
            "ctrl_port": _free_tcp_port(),
            "source_wav": source,
            "record_dir": rec,
            "rtp_lo": rtp_lo,
            "rtp_hi": rtp_lo + 9,
        }
        for template, name in (("baresip.conf.in", "config"), ("baresip.accounts.in", "accounts")):
            text = (SCENARIOS / template).read_text()
            (workdir / name).write_text(text.format(**values))
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def dial(self, uri: str) -> None:
        argv = ["baresip", "-f", str(self.workdir), "-t", "60", "-e", f"/dial {uri}"]
        if shutil.which("stdbuf"):
            argv = ["stdbuf", "-o0", *argv]
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(4096):
            self.output += chunk

    async def wait_said(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while text.encode() not in self.output:
            if time.monotonic() > deadline or (self.proc and self.proc.returncode is not None):
                return False
            await asyncio.sleep(0.01)
        return True

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
            if self._reader is not None:
                await self._reader


async def start_capture(pcap: Path, lo: int, hi: int) -> asyncio.subprocess.Process:
    """dumpcap on ``lo`` for the daemon's RTP ports; returns once it is writing packets."""
    proc = await asyncio.create_subprocess_exec(
        "dumpcap", "-i", "lo", "-f", f"udp portrange {lo}-{hi}", "-P", "-w", str(pcap), "-q",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _ in range(200):  # a probe (not RTP) to a port no call uses, until captured
            if pcap.exists() and pcap.stat().st_size > 24:
                return proc
            probe.sendto(b"probe", ("127.0.0.1", hi))
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    await proc.wait()
    raise RuntimeError("dumpcap captured nothing")


async def run(calls: int, seed: int, workdir: Path) -> dict[str, Any]:
    from bridge.io.legs.sip import SipLeg
    from bridge.logs import configure
    from telcodec import g711
    from tests.e2e.harness import speech_mulaw, stack

    rng = np.random.default_rng(seed)
    clip = np.frombuffer(g711.ulaw_decode(speech_mulaw(CLIP_S)), dtype="<i2")
    base = int(rng.integers(40000, 48000)) // 200 * 200
    lo, hi = base, base + 199
    route = f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{GREETING}"\n'
    pcap = workdir / "rtp.pcap"
    windows: list[tuple[float, float, float]] = []  # start, caller hung up, end (wall clock)
    daemon: list[list[dict[str, float | None]]] = []
    call_ports: list[set[int]] = []
    established = 0
    async with stack(route, rtp=f"{lo}-{hi - 2}") as st:
        configure("warning", "json")
        leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
        assert isinstance(leg, SipLeg)
        loop = asyncio.get_running_loop()
        capture = await start_capture(pcap, lo, hi)
        try:
            for n in range(calls):
                at_s = float(rng.uniform(1.6, 3.2))
                source = workdir / f"mic{n}.wav"
                write_source(source, at_s, clip, at_s + CLIP_S + HOLD_S + 3.0)
                phone = Softphone(workdir / f"call{n}", source)
                runners: dict[int, Any] = {}
                ports: set[int] = set()
                start = time.time()
                await phone.dial(f"sip:demo@127.0.0.1:{st.sip_port}")
                try:
                    if not await phone.wait_said("Call established", 10.0):
                        print(f"call {n}: not established", phone.output[-500:], flush=True)
                        continue
                    established += 1
                    until = loop.time() + at_s + CLIP_S + HOLD_S + 0.3
                    while loop.time() < until:  # keep the runner: its stats after the call
                        for call in list(leg.calls.values()):
                            ports.add(call.rtp_port)
                            if call.runner is not None:
                                runners[id(call.runner)] = call.runner
                        await asyncio.sleep(0.01)
                finally:
                    hung_up = time.time()
                    await phone.stop()
                deadline = loop.time() + 5
                while leg.ports.allocated_count and loop.time() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)
                windows.append((start, hung_up, time.time()))
                call_ports.append(ports)
                wall = time.time() - loop.time()  # loop clock -> wall clock
                daemon.append(
                    [
                        {
                            "onset_s": t.onset_s + wall,
                            "decided_s": t.decided_s + wall,
                            "last_frame_s": None
                            if t.last_frame_s is None
                            else t.last_frame_s + wall,
                        }
                        for r in runners.values()
                        for t in r.bridge.stats().bargein_timings
                    ]
                )
        finally:
            capture.send_signal(signal.SIGINT)
            await asyncio.wait_for(capture.wait(), 10)
    packets = read_pcap(pcap.read_bytes())
    per_call: list[dict[str, Any]] = []
    outcomes: dict[str, int] = {}
    wire_ms: list[float] = []
    parts: dict[str, list[float]] = {
        "wire_onset_to_daemon_onset": [],
        "wire_onset_to_decision": [],
        "wire_onset_to_last_tick": [],
        "last_tick_to_wire_stop": [],
    }
    for (start, hung_up, end), timings, ports in zip(windows, daemon, call_ports, strict=True):
        caller, bot = timelines(packets, ports, start, end)
        stop = stop_latency(caller, bot, hung_up)
        outcomes[stop.outcome] = outcomes.get(stop.outcome, 0) + 1
        row: dict[str, Any] = {
            "outcome": stop.outcome,
            "barge_in_ms": stop.barge_in_ms,
            "caller_packets": len(caller),
            # the caller's first two packets at or after the onset: a first packet that holds
            # only a few ms of the clip is speech on the wire but may not be for the detector
            "onset_levels_dbfs": [round(v, 1) for t, v in caller if t >= (stop.onset_s or 0)][:2],
            "bot_packets": len(bot),
            "caller_after_tick_ms": after_tick_ms([t for t, _ in caller], [t for t, _ in bot]),
            "daemon_bargeins": len(timings),
        }
        if stop.barge_in_ms is not None and stop.outcome == "stopped":
            wire_ms.append(stop.barge_in_ms)
        if stop.onset_s is not None and timings:
            t = timings[0]
            onset = stop.onset_s
            row["daemon_onset_ms"] = round((float(t["onset_s"] or 0) - onset) * 1000, 1)
            row["decided_ms"] = round((float(t["decided_s"] or 0) - onset) * 1000, 1)
            parts["wire_onset_to_daemon_onset"].append(row["daemon_onset_ms"])
            parts["wire_onset_to_decision"].append(row["decided_ms"])
            if t["last_frame_s"] is not None:
                row["last_tick_ms"] = round((float(t["last_frame_s"]) - onset) * 1000, 1)
                parts["wire_onset_to_last_tick"].append(row["last_tick_ms"])
                if stop.stopped_s is not None:
                    row["tick_to_stop_ms"] = round(
                        (stop.stopped_s - float(t["last_frame_s"])) * 1000, 1
                    )
                    parts["last_tick_to_wire_stop"].append(row["tick_to_stop_ms"])
        per_call.append(row)
    return {
        "calls": calls,
        "established": established,
        "outcomes": outcomes,
        "wire": summarize(wire_ms),
        "all_ms": wire_ms,
        "daemon_view_ms": {k: summarize(v) for k, v in parts.items()},
        "caller_after_tick_ms": summarize(
            [r["caller_after_tick_ms"] for r in per_call if r["caller_after_tick_ms"] is not None]
        ),
        "per_call": per_call,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="8 calls (make bench-quick)")
    ap.add_argument("--calls", type=int, default=None, help="calls (default 30, quick 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--name", default=None, help="default: bargein_baresip[_quick]")
    ap.add_argument("--keep", action="store_true", help="keep the capture and baresip dirs")
    args = ap.parse_args()
    args.calls = args.calls or (8 if args.quick else 30)
    args.name = args.name or ("bargein_baresip_quick" if args.quick else "bargein_baresip")
    for tool in ("baresip", "dumpcap"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed")
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="bargein_baresip_"))
    try:
        fig = asyncio.run(run(args.calls, args.seed, workdir))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print("kept", workdir)
    fig["loadavg"] = {
        "before": [round(v, 2) for v in load_before],
        "after": [round(v, 2) for v in os.getloadavg()],
    }
    w, d = fig["wire"], fig["daemon_view_ms"]
    print(
        f"SIP barge-in on the wire with baresip, {w['n']} of {fig['calls']} stopped: "
        f"p50 {w['p50_ms']} p95 {w['p95_ms']} max {w['max_ms']} ms; outcomes {fig['outcomes']}; "
        f"load {fig['loadavg']}"
    )
    a = fig["caller_after_tick_ms"]
    print(f"  caller packets land after the daemon's tick (median per call): p50 {a['p50_ms']} ms")
    for k, v in d.items():
        print(f"  {k}: p50 {v['p50_ms']} p95 {v['p95_ms']} max {v['max_ms']} ms (n {v['n']})")
    print(
        "wrote",
        write(
            args.name,
            {"sip_baresip": fig},
            {
                "calls": args.calls,
                "seed": args.seed,
                "clip_s": CLIP_S,
                "threshold_dbfs": SPEECH_DBFS,
                "hold_s": HOLD_S,
            },
        ),
    )


if __name__ == "__main__":
    main()

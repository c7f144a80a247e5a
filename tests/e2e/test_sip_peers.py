"""The SIP/RTP leg against real peers: SIPp (UAC and UAS), baresip, and a capture of its RTP.

The daemon runs in-process (``harness.stack``) against the real ``ttsd`` with
the deterministic ``tone`` engine; SIPp and baresip run as subprocesses on
127.0.0.1. A Python ``RtpPhone`` owns the RTP port that SIPp's SDP offers, so
the test sees every packet the daemon sends and can send RFC 4733 events on
the same stream, as a phone would.

Every process started here is waited for or killed by the coroutine that
started it. Nothing sleeps a fixed time to let something happen: waits are
bounded polls of an observable. A test skips only when its peer binary is
missing (and says which package provides it).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import errno
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import sys
import wave
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Stack, stack

from bridge.io.legs.sip import SipLeg
from bridge.ttsd.synth import TONE_GAP_S, ToneEngine, split_words
from telcodec import g711

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))

PCMU_PT = 0
TELEPHONE_EVENT_PT = 101
FRAME_SAMPLES = 160
SILENT_SAMPLE_LEVEL = 200
"""|s16| above this is "not silent" (the tone engine's words peak near 8190)."""

DTMF_EVENTS = {d: i for i, d in enumerate("0123456789*#ABCD")}


def free_udp_port(odd: bool | None = None) -> int:
    """A free UDP port on 127.0.0.1, odd or even when asked."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if odd is None or (port % 2 == 1) == odd:
            return port
    raise RuntimeError("no free UDP port of the asked parity")


def free_sip_port() -> int:
    """A port free for both UDP and TCP (the daemon listens on both)."""
    for _ in range(50):
        port = free_udp_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free for UDP and TCP")


def greeting_speech_s(text: str) -> float:
    """Length of the tone engine's audible part: every word, the gaps between them."""
    engine = ToneEngine()
    words = split_words(text)
    return sum(engine.word_duration_s(w) for w in words) + TONE_GAP_S * (len(words) - 1)


def audible_span_s(pcm: np.ndarray, rate_hz: int = 8000) -> tuple[float, float] | None:
    """(first, last) time in seconds of a sample above the silence level, or None."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > SILENT_SAMPLE_LEVEL)
    if loud.size == 0:
        return None
    return float(loud[0]) / rate_hz, float(loud[-1] + 1) / rate_hz


# ---------------------------------------------------------------- SIPp


@dataclass
class SippResult:
    returncode: int
    successful_calls: int
    failed_calls: int
    log: str
    messages: str
    stderr: str

    @property
    def port_taken(self) -> bool:
        """SIPp could not bind its port (another process took it after we chose it)."""
        return self.returncode != 0 and "already in use" in self.stderr.lower()

    def explain(self) -> str:
        return (
            f"sipp rc={self.returncode} ok={self.successful_calls} failed={self.failed_calls}\n"
            f"--- stderr\n{self.stderr[-1500:]}\n--- log\n{self.log[-1500:]}\n"
            f"--- messages\n{self.messages[-3000:]}"
        )


def read_stat_csv(path: Path) -> dict[str, str]:
    """The last row of a SIPp ``-trace_stat`` file as {column: value}."""
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    if len(rows) < 2:
        return {}
    return dict(zip(rows[0], rows[-1], strict=False))


async def run_sipp(
    workdir: Path,
    name: str,
    args: list[str],
    *,
    timeout_s: float = 30.0,
    new_port_on_collision: bool = True,
) -> SippResult:
    """Run SIPp to completion (killed after ``timeout_s``) with stats, log and message traces.

    SIPp needs its own port (``-p``) up front: if it was taken meanwhile, SIPp is run
    again on another (``new_port_on_collision``; off where the port is the peer's address,
    a UAS the daemon calls: ``start_sipp_uas``)."""
    for _attempt in range(5):
        result = await _run_sipp_once(workdir, name, args, timeout_s)
        if not (new_port_on_collision and result.port_taken and "-p" in args):
            return result
        args = list(args)
        args[args.index("-p") + 1] = str(free_sip_port())
    return result


async def _run_sipp_once(workdir: Path, name: str, args: list[str], timeout_s: float) -> SippResult:
    workdir.mkdir(parents=True, exist_ok=True)
    stat = workdir / f"{name}_stat.csv"
    logf = workdir / f"{name}_log.txt"
    msgs = workdir / f"{name}_msg.txt"
    argv = [
        "sipp",
        *args,
        "-nostdin",
        "-trace_stat",
        "-stf",
        str(stat),
        "-trace_logs",
        "-log_file",
        str(logf),
        "-trace_msg",
        "-message_file",
        str(msgs),
        "-timeout",
        f"{int(timeout_s)}s",
        "-timeout_error",
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(workdir),
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s + 10)
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
    stats = read_stat_csv(stat)
    return SippResult(
        returncode=proc.returncode if proc.returncode is not None else -1,
        successful_calls=int(stats.get("SuccessfulCall(C)", "0") or 0),
        failed_calls=int(stats.get("FailedCall(C)", "0") or 0),
        log=logf.read_text(errors="replace") if logf.exists() else "",
        messages=msgs.read_text(errors="replace") if msgs.exists() else "",
        stderr=err.decode(errors="replace"),
    )


def sipp_uac_args(scenario: str, sip_port: int, service: str, **variables: int | str) -> list[str]:
    args = [
        "-sf",
        str(SCENARIOS / scenario),
        f"127.0.0.1:{sip_port}",
        "-s",
        service,
        "-i",
        "127.0.0.1",
        "-p",
        str(free_sip_port()),  # free for TCP too: -t t1 binds it for TCP
        "-m",
        "1",
    ]
    for key, value in variables.items():
        args += ["-set", key, str(value)]
    return args


def sipp_listening(port: int, tcp: bool = False) -> str:
    """ "UAS" once some process has bound UDP ``port`` (or listens on TCP ``port``; read
    from /proc: probing by binding the port ourselves could steal it from SIPp while it
    starts)."""
    suffix = f":{port:04X}"
    tables = ("/proc/net/tcp", "/proc/net/tcp6") if tcp else ("/proc/net/udp", "/proc/net/udp6")
    for table in tables:
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1].endswith(suffix) and (not tcp or fields[3] == "0A"):  # LISTEN
                    return "UAS"
    return ""


def sipp_uas_args(scenario: str, sip_port: int, **variables: int | str) -> list[str]:
    args = ["-sf", str(SCENARIOS / scenario), "-i", "127.0.0.1", "-p", str(sip_port)]
    args += ["-m", "1"]
    for key, value in variables.items():
        args += ["-set", key, str(value)]
    return args


async def start_sipp_uas(
    workdir: Path,
    name: str,
    scenario: str,
    timeout_s: float,
    tcp: bool = False,
    **variables: int | str,
) -> tuple[int, asyncio.Future[SippResult]]:
    """SIPp as a UAS on a port free a moment ago, once it listens there (started again on
    another port if it could not bind that one): (its port, its result to come). ``tcp``:
    SIPp's TCP mode (``-t t1``), one connection per peer."""
    for _attempt in range(5):
        port = free_udp_port()
        args = sipp_uas_args(scenario, port, **variables) + (["-t", "t1"] if tcp else [])
        uas = asyncio.ensure_future(
            run_sipp(workdir, name, args, timeout_s=timeout_s, new_port_on_collision=False)
        )
        up = await wait_for(
            lambda u=uas, p=port: u.done() or "UAS" in sipp_listening(p, tcp),  # type: ignore[misc]
            5.0,
        )
        if uas.done() and uas.result().port_taken:
            continue
        assert up and not uas.done(), uas.result().explain() if uas.done() else "no SIPp"
        return port, uas
    raise AssertionError("SIPp found no free port in 5 attempts")


# ------------------------------------------------------------- RTP phone


@dataclass(frozen=True, slots=True)
class RtpReceived:
    at_s: float
    marker: bool
    pt: int
    seq: int
    ts: int
    ssrc: int
    payload: bytes
    source: tuple[str, int]


@dataclass
class RtpPhone(asyncio.DatagramProtocol):
    """The media end of a test phone: records the daemon's RTP, sends PCMU silence and RFC 4733.

    It is symmetric (sends from the port it receives on, to where the daemon's
    RTP comes from, or to ``remote`` once set).
    """

    received: list[RtpReceived] = field(default_factory=list)
    remote: tuple[str, int] | None = None
    transport: asyncio.DatagramTransport | None = None
    port: int = 0
    ssrc: int = field(default_factory=lambda: random.getrandbits(32))
    seq: int = field(default_factory=lambda: random.getrandbits(16))
    ts: int = field(default_factory=lambda: random.getrandbits(32))
    _queue: list[tuple[bool, int, bytes, int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    first_packet: asyncio.Event = field(default_factory=asyncio.Event)
    sent_events: int = 0

    async def open(self, port: int = 0) -> RtpPhone:
        """Bind ``port`` (one free a moment ago; taken meanwhile: another of its parity)."""
        loop = asyncio.get_running_loop()
        for attempt in range(20):
            try:
                await loop.create_datagram_endpoint(lambda: self, local_addr=("127.0.0.1", port))
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE or port == 0 or attempt == 19:
                    raise
                port = free_udp_port(odd=port % 2 == 1)
        assert self.transport is not None
        self.port = self.transport.get_extra_info("sockname")[1]
        self._task = loop.create_task(self._sender())
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 12 or data[0] >> 6 != 2 or 192 <= data[1] <= 223:
            return  # not RTP (RTCP goes to port + 1 anyway)
        b0, b1, seq, ts, ssrc = struct.unpack_from("!BBHII", data)
        header = 12 + 4 * (b0 & 0x0F)
        now = asyncio.get_running_loop().time()
        self.received.append(
            RtpReceived(
                now, bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, data[header:], (addr[0], addr[1])
            )
        )
        if self.remote is None:
            self.remote = (addr[0], addr[1])
        self.first_packet.set()

    def audio(self) -> list[RtpReceived]:
        return [p for p in self.received if p.pt == PCMU_PT]

    def pcm(self) -> np.ndarray:
        """The received PCMU decoded and placed by RTP timestamp (gaps stay silent)."""
        audio = self.audio()
        if not audio:
            return np.zeros(0, dtype=np.int16)
        ts0 = audio[0].ts
        end = max((p.ts - ts0) % 2**32 + len(p.payload) for p in audio)
        out = np.zeros(end, dtype=np.int16)
        for p in audio:
            start = (p.ts - ts0) % 2**32
            out[start : start + len(p.payload)] = np.frombuffer(
                g711.ulaw_decode(p.payload), dtype="<i2"
            )
        return out

    def press(self, digit: str, duration_ms: int = 100) -> None:
        """Queue one RFC 4733 event: M on the first packet, one timestamp, E three times."""
        event = DTMF_EVENTS[digit]
        steps = max(1, duration_ms // 20)
        for k in range(1, steps + 1):
            self._queue.append((k == 1, event, struct.pack("!BBH", event, 10, 160 * k), k))
        end = struct.pack("!BBH", event, 0x80 | 10, 160 * steps)
        self._queue += [(False, event, end, steps)] * 3

    def _packet(self, marker: bool, pt: int, ts: int, payload: bytes) -> bytes:
        self.seq = (self.seq + 1) & 0xFFFF
        b1 = (0x80 if marker else 0) | pt
        return struct.pack("!BBHII", 0x80, b1, self.seq, ts, self.ssrc) + payload

    async def _sender(self) -> None:
        """A packet every 20 ms on absolute deadlines: silence, or the queued DTMF event."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        n = 0
        event_ts = self.ts
        silence = bytes([g711.ULAW_SILENCE]) * FRAME_SAMPLES
        while True:
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - loop.time()))
            if self.remote is None or self.transport is None:
                continue
            self.ts = (self.ts + FRAME_SAMPLES) & 0xFFFFFFFF
            if self._queue:
                first, _, payload, _ = self._queue.pop(0)
                if first:
                    event_ts = self.ts
                data = self._packet(first, TELEPHONE_EVENT_PT, event_ts, payload)
                self.sent_events += 1
            else:
                data = self._packet(False, PCMU_PT, self.ts, silence)
            self.transport.sendto(data, self.remote)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.close()


async def wait_for(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passes; returns the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while True:
        if predicate():
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(step_s)


# ------------------------------------------------------------------ the daemon

GREETING = "Hello caller, welcome to the bridge."
BYE_TEXT = "Goodbye."
ROUTES = f"""
[[routes]]
match = "greet"
provider = ["main"]
greeting = "{GREETING}"

[[routes]]
match = "press"
provider = ["main"]
flow = "press"

[[routes]]
match = "announce"
provider = ["main"]
flow = "announce"

[flows.announce]
start = "say"

[flows.announce.steps.say]
say = "{GREETING}"
interruptible = false
hangup = true

[flows.press]
start = "menu"

[flows.press.steps.menu]
say = "Press one."
gather = {{ max_digits = 1, timeout_s = 30 }}
branch = {{ "1" = "bye", timeout = "menu", default = "menu" }}

[flows.press.steps.bye]
say = "{BYE_TEXT}"
interruptible = false
hangup = true
"""
_RTP_BASE = [34000]


def _rtp_range() -> str:
    """A fresh RTP port range per daemon, so a lingering socket never collides."""
    lo = _RTP_BASE[0]
    _RTP_BASE[0] += 100
    return f"{lo}-{lo + 99}"


class SkippedFrames:
    """The frames the daemon's media clocks skipped in the calls of ``leg`` (a wake-up a
    whole period late skips ahead rather than burst): a loaded host stretches or shortens
    what a peer hears by that much, and the tests allow it, measured in the same run."""

    def __init__(self, leg: SipLeg) -> None:
        self.leg = leg
        self.runners: dict[int, Any] = {}
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            for call in list(self.leg.calls.values()):
                if call.runner is not None:
                    self.runners[id(call.runner)] = call.runner
            await asyncio.sleep(0.005)

    def seconds(self) -> float:
        self.task.cancel()
        return 0.020 * sum(r.clock.stats().skipped_frames for r in self.runners.values())

    def slack(self) -> float:
        """How far what was heard may be from the rendered audio's length: the 100 ms
        these tests always allowed, and what the clocks skipped."""
        return 0.1 + self.seconds()


def sip_leg(st: Stack) -> SipLeg:
    leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
    assert isinstance(leg, SipLeg)
    return leg


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


requires_sipp = pytest.mark.needs("sipp")


# ------------------------------------------------------------- SIPp as UAC


@pytest.mark.peers
@requires_sipp
def test_sipp_call_hears_the_greeting_then_hangs_up(tmp_path: Path) -> None:
    """INVITE/100/200/ACK, the greeting's RTP at the phone, BYE/200; the port pair is freed."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            # an odd port, as a NAT may hand out: RTP must still come from the RTP port
            phone = await RtpPhone().open(free_udp_port(odd=True))
            try:
                args = sipp_uac_args("uac_greeting.xml", sip_port, "greet", rtp_port=phone.port)
                result = await run_sipp(tmp_path, "greet", [*args, "-d", "2500"])
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            answered_port = answered_rtp_port(result)
            assert {p.source for p in phone.received} == {("127.0.0.1", answered_port)}
            span = audible_span_s(phone.pcm())
            assert span is not None, "no audible RTP received"
            expected_s = greeting_speech_s(GREETING)
            assert abs((span[1] - span[0]) - expected_s) <= skips.slack(), (span, expected_s)
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls

    run(main())


def answered_rtp_port(result: SippResult) -> int:
    """The m=audio port of the daemon's SDP answer, from SIPp's message trace."""
    answer = result.messages[result.messages.index("SIP/2.0 200 OK") :]
    m = re.search(r"m=audio (\d+) ", answer)
    assert m is not None, result.explain()
    return int(m.group(1))


def outcome(result: SippResult) -> str:
    return next((line for line in result.log.splitlines() if "outcome=" in line), "")


@pytest.mark.peers
@requires_sipp
def test_sipp_cancel_before_answer_releases_the_port_pair(tmp_path: Path) -> None:
    """INVITE then CANCEL: 487 (or, if the answer won, ACK+BYE); no RTP port pair leaks."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            outcomes = []
            for i in range(3):
                phone = await RtpPhone().open()
                try:
                    args = sipp_uac_args("uac_cancel.xml", sip_port, "greet", rtp_port=phone.port)
                    result = await run_sipp(tmp_path, f"cancel{i}", args, timeout_s=15)
                finally:
                    phone.close()
                assert result.returncode == 0, result.explain()
                assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
                outcomes.append(outcome(result))
                assert outcomes[-1] in ("outcome=487", "outcome=answered"), result.explain()
                assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0), outcomes
                assert not leg.calls

    run(main())


@pytest.mark.peers
@requires_sipp
def test_sipp_cancel_after_answer_has_no_effect(tmp_path: Path) -> None:
    """The race's other branch made deterministic: CANCEL after 200 leaves the call up."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            phone = await RtpPhone().open()
            try:
                args = sipp_uac_args(
                    "uac_cancel_after_answer.xml", sip_port, "greet", rtp_port=phone.port
                )
                result = await run_sipp(tmp_path, "late_cancel", args, timeout_s=15)
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            assert outcome(result) == "outcome=answered"
            assert "SIP/2.0 487" not in result.messages
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())


@pytest.mark.peers
@requires_sipp
def test_sipp_hold_and_resume_by_reinvite(tmp_path: Path) -> None:
    """a=sendonly: 200 a=recvonly, RTP stops; a=sendrecv: 200 a=sendrecv, RTP resumes with M."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            phone = await RtpPhone().open()
            try:
                args = sipp_uac_args("uac_hold.xml", sip_port, "greet", rtp_port=phone.port)
                result = await run_sipp(tmp_path, "hold", args, timeout_s=20)
            finally:
                phone.close()
            # the scenario checks the answers' directions itself (ereg check_it)
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            packets = phone.received
            gaps = [
                (b.at_s - a.at_s, i + 1) for i, (a, b) in enumerate(itertools.pairwise(packets))
            ]
            longest_s, resumed_at = max(gaps)
            # on hold for 1.5 s in the scenario (SIPp's pause); the re-INVITE round trips
            # shave a little. A loaded host only lengthens it: no upper bound.
            assert longest_s >= 1.3, gaps
            assert packets[resumed_at].marker, "resumed stream must start a talkspurt"
            assert resumed_at < len(packets) - 25, "RTP must flow again after the resume"
            # only one silence, the hold, read on the media clock rather than on arrival
            # times (a stalled host delays packets): no packet lost, and but for the
            # resume each audio packet follows the last by a frame (a few, had the
            # daemon's clock skipped some under load; a hold is seconds)
            audio = [(i, p) for i, p in enumerate(packets) if p.pt == PCMU_PT]
            for (_, a), (j, b) in itertools.pairwise(audio):
                if j != resumed_at:
                    assert (b.ts - a.ts) % 2**32 in range(160, 161 + 160 * 5, 160), (j, a, b)
            seqs = [p.seq for p in packets]
            assert all((b - a) % 2**16 == 1 for a, b in itertools.pairwise(seqs)), seqs
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())


@pytest.mark.peers
@requires_sipp
def test_sipp_rfc4733_digit_drives_the_flow_to_hang_up(tmp_path: Path) -> None:
    """RFC 4733 on the RTP stream: "2" keeps the menu going; "1" makes the daemon say bye, BYE."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            phone = await RtpPhone().open(free_udp_port(odd=True))
            try:
                args = sipp_uac_args("uac_dtmf_bye.xml", sip_port, "press", rtp_port=phone.port)
                sipp = asyncio.ensure_future(run_sipp(tmp_path, "dtmf", args, timeout_s=30))
                assert await wait_for(phone.first_packet.is_set, 5.0), "no RTP from the daemon"
                phone.press("2")
                # a wrong digit: the menu repeats, nobody hangs up
                assert not await wait_for(sipp.done, 1.5)
                pressed_at = asyncio.get_running_loop().time()
                phone.press("1")
                result = await sipp
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            assert phone.sent_events == 2 * 8, "two events of 5 updates + 3 end packets"
            # the goodbye was spoken before the BYE: audible audio after the "1"
            after = [p for p in phone.audio() if p.at_s > pressed_at + 0.1]
            loud = [p for p in after if max(p.payload) - min(p.payload) > 40]
            assert loud, "the flow's goodbye step was not heard"
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())


# ------------------------------------------------------------- SIPp as UAS


@pytest.mark.peers
@requires_sipp
def test_daemon_calls_out_to_a_sipp_uas(tmp_path: Path) -> None:
    """SipLeg.originate: INVITE to SIPp, 180, 200, ACK; the flow speaks, then the daemon BYEs."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = await RtpPhone().open(free_udp_port(odd=False))
            try:
                uas_port, uas = await start_sipp_uas(
                    tmp_path, "uas", "uas_answer.xml", 20, rtp_port=phone.port
                )
                call_id = leg.originate(
                    f"sip:bot@127.0.0.1:{uas_port}", "sip:callbridge@127.0.0.1", "announce"
                )
                assert call_id in leg.calls
                result = await uas
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            span = audible_span_s(phone.pcm())
            assert span is not None, "the callee heard nothing"
            expected_s = greeting_speech_s(GREETING)
            assert abs((span[1] - span[0]) - expected_s) <= skips.slack(), (span, expected_s)
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls

    run(main())


@pytest.mark.peers
@requires_sipp
@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_daemon_registers_with_digest_auth_at_a_sipp_registrar(
    tmp_path: Path, transport: str
) -> None:
    """[sip.registrations]: REGISTER, 401, REGISTER with credentials SIPp verifies, 200;
    over UDP, and over TCP (``;transport=tcp``: both REGISTERs on one connection)."""

    async def main() -> None:
        tcp = transport == "tcp"
        registrar_port, registrar = await start_sipp_uas(
            tmp_path, "registrar", "uas_register_digest.xml", 15, tcp=tcp
        )
        param = ";transport=tcp" if tcp else ""
        routes = (
            ROUTES
            + f"""
[sip.registrations.pbx]
registrar = "sip:127.0.0.1:{registrar_port}{param}"
user = "alice"
password = "s3cret"
expires_s = 120
"""
        )
        async with stack(routes, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            result = await registrar
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            assert "SIP/2.0 401" in result.messages and "Authorization: Digest" in result.messages
            runner = next(r for r in leg.runners if r.kind == transport.upper())
            registrations = list(runner.ua._registrations.values())
            if tcp:
                # both REGISTERs on one connection, SIPp's 200 granted the binding; SIPp
                # closes the connection as it exits: the daemon registers again a second
                # later (a third REGISTER), not at the refresh 60 s on
                assert "SIP/2.0/TCP" in result.messages and "SIP/2.0 200 OK" in result.messages
                assert runner.connections_opened == 1
                [registration] = registrations
                assert await wait_for(lambda: registration.cseq == 3, 5.0)
                return
            assert await wait_for(lambda: all(r.registered for r in registrations), 2.0)
            [registration] = registrations
            assert registration.refresh_at is not None
            # refreshed at half the granted 120 s
            assert 55.0 <= registration.refresh_at - asyncio.get_running_loop().time() <= 60.5

    run(main())


# ------------------------------------------------------------- RTP capture


def read_pcap_udp(path: Path) -> list[tuple[float, bytes]]:
    """(time, UDP payload) of every IPv4/UDP frame of a classic pcap file (Ethernet/SLL/SLL2)."""
    data = path.read_bytes()
    magic = data[:4]
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">"}.get(magic)
    nano = {b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}.get(magic)
    order = endian or nano
    assert order is not None, f"not a classic pcap file: {magic!r}"
    divisor = 1e9 if nano else 1e6
    linktype = struct.unpack_from(order + "I", data, 20)[0]
    link_bytes = {1: 14, 113: 16, 276: 20, 0: 4}[linktype]
    out = []
    offset = 24
    while offset + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack_from(order + "IIII", data, offset)
        frame = data[offset + 16 : offset + 16 + caplen]
        offset += 16 + caplen
        ip = frame[link_bytes:]
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        ihl = (ip[0] & 0x0F) * 4
        out.append((sec + frac / divisor, ip[ihl + 8 :]))
    return out


def check_rtp_stream(packets: list[tuple[float, bytes]]) -> dict[str, Any]:
    """Pacing, sequence, timestamp and marker facts of one captured RTP stream."""
    rows = []
    for at, payload in packets:
        _, b1, seq, ts, ssrc = struct.unpack_from("!BBHII", payload)
        loud = audible_span_s(np.frombuffer(g711.ulaw_decode(payload[12:]), dtype="<i2"))
        rows.append((at, bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, loud is not None))
    gaps_ms = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(rows)]
    return {
        "packets": len(rows),
        "median_gap_ms": float(np.median(gaps_ms)),
        "p99_gap_ms": float(np.percentile(gaps_ms, 99)),
        "seq_steps": {(b[3] - a[3]) % 2**16 for a, b in itertools.pairwise(rows)},
        "ts_steps": {(b[4] - a[4]) % 2**32 for a, b in itertools.pairwise(rows)},
        "ts_step_list": [(b[4] - a[4]) % 2**32 for a, b in itertools.pairwise(rows)],
        "ssrcs": {r[5] for r in rows},
        "pts": {r[2] for r in rows},
        "markers": [i for i, r in enumerate(rows) if r[1]],
        "first_loud": next((i for i, r in enumerate(rows) if r[6]), None),
    }


requires_tshark = pytest.mark.needs("tshark")
requires_root = pytest.mark.needs("root", why="capturing on lo with tshark (CI runs as root)")


@pytest.mark.peers
@requires_sipp
@requires_tshark
@requires_root
def test_tshark_capture_of_one_call_rtp_is_paced_and_continuous(tmp_path: Path) -> None:
    """On the wire: seq +1, ts +160 (+160 per frame the daemon's clock skipped, had the host
    stalled it), one SSRC, M on the greeting's first packet. (Its spacing: bench_pacing.py.)"""

    async def main() -> None:
        pcap = tmp_path / "call.pcap"
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            phone = await RtpPhone().open()
            tshark = await asyncio.create_subprocess_exec(
                "tshark", "-i", "lo", "-f", f"udp dst port {phone.port}", "-F", "pcap",
                "-w", str(pcap), "-q",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                assert tshark.stderr is not None
                started = b""
                while b"Capturing on" not in started:  # after a warning line when root
                    line = await asyncio.wait_for(tshark.stderr.readline(), 10 * FACTOR)
                    assert line, f"tshark did not start: {started!r}"
                    started += line
                # it says so before its filter is attached: probe (not RTP) until it captures
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                    for _ in range(int(200 * FACTOR)):
                        if pcap.exists() and pcap.stat().st_size > 24:  # past the file header
                            break
                        probe.sendto(b"probe", ("127.0.0.1", phone.port))
                        await asyncio.sleep(0.05)
                    assert pcap.stat().st_size > 24, "tshark captured nothing"
                args = sipp_uac_args("uac_greeting.xml", sip_port, "greet", rtp_port=phone.port)
                sipp = asyncio.ensure_future(run_sipp(tmp_path, "capture", [*args, "-d", "2000"]))
                leg = sip_leg(st)
                assert await wait_for(
                    lambda: sipp.done() or any(c.runner for c in leg.calls.values()), 10.0
                )
                runner = next((c.runner for c in leg.calls.values() if c.runner), None)
                result = await sipp
                assert runner is not None, result.explain()
                skipped = runner.clock.stats().skipped_frames
            finally:
                phone.close()
                if tshark.returncode is None:
                    tshark.send_signal(signal.SIGINT)
                await asyncio.wait_for(tshark.wait(), 10 * FACTOR)
            assert result.returncode == 0, result.explain()
        rtp = [(at, data) for at, data in read_pcap_udp(pcap) if data != b"probe"]
        facts = check_rtp_stream(rtp)
        assert facts["packets"] + skipped >= 90, facts  # a 2 s call
        assert facts["seq_steps"] == {1}, facts
        # every timestamp step a whole number of frames, each frame more than one a skip
        # the daemon's clock counted (it may also have skipped before its first packet)
        steps = facts["ts_step_list"]
        assert all(step % 160 == 0 and step > 0 for step in steps), facts
        assert sum(step // 160 - 1 for step in steps) <= skipped, (facts, skipped)
        assert len(facts["ssrcs"]) == 1 and facts["pts"] == {PCMU_PT}, facts
        first_loud = facts["first_loud"]
        assert first_loud is not None, facts
        # one turn = one talkspurt: M on its first packet only (and on packet 0, a stream start)
        assert first_loud in facts["markers"], facts
        assert set(facts["markers"]) <= {0, first_loud}, facts

    run(main())


# ------------------------------------------------------------------- baresip

requires_baresip = pytest.mark.needs("baresip")


def free_tcp_port_not(*avoid: int) -> int:
    """A free TCP port that is none of ``avoid`` (baresip also binds SIP TLS on sip_port + 1)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


LIFETIME_S = 120
"""baresip's own end (``-t``), a backstop: the tests end its calls on what they wait for."""


@dataclass
class Baresip:
    """baresip as a subprocess: a temp config dir, a silent WAV as its microphone, the
    decoded received audio dumped by the ``sndfile`` filter, commands over ``ctrl_tcp``."""

    workdir: Path
    sip_port: int = field(default_factory=free_sip_port)
    output: bytes = b""
    proc: asyncio.subprocess.Process | None = None
    _reader: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.ctrl_port = free_tcp_port_not(self.sip_port, self.sip_port + 1)
        self.record_dir = self.workdir / "rec"
        self.record_dir.mkdir(parents=True, exist_ok=True)
        source = self.workdir / "silence.wav"
        with wave.open(str(source), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes(b"\0\0" * 8000 * 30)
        rtp_lo = free_udp_port(odd=False) // 2 * 2
        values = {
            "sip_port": self.sip_port,
            "ctrl_port": self.ctrl_port,
            "source_wav": source,
            "record_dir": self.record_dir,
            "rtp_lo": rtp_lo,
            "rtp_hi": rtp_lo + 9,
        }
        for template, name in (("baresip.conf.in", "config"), ("baresip.accounts.in", "accounts")):
            text = (SCENARIOS / template).read_text()
            (self.workdir / name).write_text(text.format(**values))

    async def start(self, dial: str | None = None) -> None:
        """Start baresip (and dial ``dial``) once it is ready; on a port taken since it was
        chosen, again on new ports. It lives until ``stop`` (at most ``LIFETIME_S``)."""
        for _attempt in range(5):
            await self._spawn(dial)
            ready = await wait_for(
                lambda: self.said("baresip is ready") or self.said("in use") or self.exited, 10.0
            )
            assert ready, self.explain()
            if not (self.said("in use") or self.exited):
                return
            await self.stop()
            self.sip_port = free_sip_port()
            self.output = b""
            self.__post_init__()
        raise AssertionError(f"baresip did not start in 5 attempts: {self.explain()}")

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def _spawn(self, dial: str | None) -> None:
        argv = ["baresip", "-f", str(self.workdir), "-t", str(LIFETIME_S)]
        if shutil.which("stdbuf"):  # its stdout is a pipe: unbuffered, or lines arrive late
            argv = ["stdbuf", "-o0", *argv]
        if dial is not None:
            argv += ["-e", f"/dial {dial}"]
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

    def said(self, text: str) -> bool:
        return text.encode() in self.output

    async def command(self, command: str, params: str = "") -> dict[str, Any]:
        """One ``ctrl_tcp`` command (netstring-framed JSON) and its response."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.ctrl_port)
        body = json.dumps({"command": command, "params": params, "token": "t"}).encode()
        writer.write(b"%d:%s," % (len(body), body))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b":"), 5 * FACTOR)
        payload = await reader.readexactly(int(head[:-1]) + 1)
        writer.close()
        return dict(json.loads(payload[:-1]))

    async def stop(self) -> int:
        """Quit now (SIGTERM to the process this object started)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
        return await self.wait(5)

    async def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s * FACTOR)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
            if self._reader is not None:
                await self._reader
        return self.proc.returncode or 0

    def explain(self) -> str:
        return self.output.decode(errors="replace").replace("\\r", "\\n")[-3000:]

    def decoded_so_far(self) -> np.ndarray:
        """What baresip has decoded up to now (the dump's header is written at the end)."""
        paths = sorted(self.record_dir.glob("*-dec.wav"))
        if not paths:
            return np.zeros(0, dtype=np.int16)
        data = paths[0].read_bytes()
        at = data.find(b"data")
        body = data[at + 8 :] if at >= 0 else b""
        return np.frombuffer(body[: len(body) // 2 * 2], dtype="<i2")

    def heard_through(self, quiet_s: float = 0.3) -> bool:
        """Whether baresip has decoded something audible and then ``quiet_s`` of silence
        (the daemon sends comfort silence after a turn): the turn's end was heard."""
        pcm = self.decoded_so_far()
        segments = audible_segments_s(pcm)
        return bool(segments) and len(pcm) / 8000 - segments[-1][1] >= quiet_s

    def received_pcm(self) -> np.ndarray:
        """What baresip decoded from the daemon's RTP (the sndfile ``-dec.wav`` dump)."""
        [path] = sorted(self.record_dir.glob("*-dec.wav"))
        with wave.open(str(path)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
            return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def audible_segments_s(pcm: np.ndarray, join_s: float = 0.06) -> list[tuple[float, float]]:
    """Audible stretches (start, end) in seconds; pauses shorter than ``join_s`` are bridged
    (the tone engine's 40 ms word gaps stay inside one utterance)."""
    loud = (np.abs(pcm.astype(np.int32)) > SILENT_SAMPLE_LEVEL).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], loud, [0]])))
    segments: list[tuple[float, float]] = []
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        start, end = a / 8000, b / 8000
        if segments and start - segments[-1][1] < join_s:
            segments[-1] = (segments[-1][0], end)
        else:
            segments.append((start, end))
    return segments


@pytest.mark.peers
@requires_baresip
def test_baresip_calls_the_daemon_and_records_the_greeting(tmp_path: Path) -> None:
    """A real softphone dials sip:greet@; its recording holds the greeting, ±100 ms."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = Baresip(tmp_path)
            await phone.start(dial=f"sip:greet@127.0.0.1:{st.sip_port}")
            assert await wait_for(lambda: phone.said("Call established"), 10.0), phone.explain()
            # the whole greeting played, then baresip decoded it and the silence after it
            assert await wait_for(lambda: prompt_played(leg), 10.0)
            assert await wait_for(phone.heard_through, 10.0), phone.explain()
            await phone.stop()  # baresip hangs up as it quits
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
        segments = audible_segments_s(phone.received_pcm())
        assert len(segments) == 1, segments
        [(start_s, end_s)] = segments
        expected_s = greeting_speech_s(GREETING)
        assert abs((end_s - start_s) - expected_s) <= skips.slack(), (segments, expected_s)

    run(main())


def prompt_played(leg: SipLeg) -> bool:
    """The one call hears its caller and has sent a turn's frames, and is idle again."""
    calls = list(leg.calls.values())
    return (
        len(calls) == 1
        and calls[0].rtp.reception_stats().received > 5
        and calls[0].runner is not None
        and calls[0].runner.bridge.stats().frames_sent > 0
        and calls[0].runner.idle
    )


@pytest.mark.peers
@requires_baresip
def test_baresip_dtmf_makes_the_daemon_say_goodbye_and_hang_up(tmp_path: Path) -> None:
    """baresip sends "1" (RFC 4733): the flow's goodbye plays and the daemon ends the call."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = Baresip(tmp_path)
            await phone.start(dial=f"sip:press@127.0.0.1:{sip_port}")
            assert await wait_for(lambda: phone.said("Call established"), 10.0), phone.explain()
            # the daemon hears baresip (latched its RTP) and has played the whole prompt (a
            # digit during the prompt would cut it: then the two could not be told apart)
            assert await wait_for(lambda: prompt_played(leg), 5.0)
            # ... and baresip has decoded all of it: what it decodes from now on follows "1"
            assert await wait_for(phone.heard_through, 10.0), phone.explain()
            digit_at_s = len(phone.decoded_so_far()) / 8000
            response = await phone.command("sndcode", "1")
            assert response.get("ok") is True, response
            # the daemon hangs up: baresip reports the call over
            assert await wait_for(
                lambda: phone.said("session closed") or phone.said("terminated"), 10.0
            ), phone.explain()
            await phone.stop()
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
        # "Press one." before the digit, "Goodbye." after it, each whole: told apart by
        # when the digit was sent, not by the pause between them (a loaded host shortens it)
        segments = audible_segments_s(phone.received_pcm())
        before = [seg for seg in segments if seg[1] <= digit_at_s]
        after = [seg for seg in segments if seg[0] >= digit_at_s]
        assert before and after and len(before) + len(after) == len(segments), segments
        prompt_s = greeting_speech_s("Press one.")
        assert abs((before[-1][1] - before[0][0]) - prompt_s) <= skips.slack(), (
            segments,
            digit_at_s,
        )
        goodbye_s = greeting_speech_s(BYE_TEXT)
        assert abs((after[-1][1] - after[0][0]) - goodbye_s) <= skips.slack(), (
            segments,
            digit_at_s,
        )

    run(main())


@pytest.mark.peers
@requires_baresip
def test_daemon_calls_baresip_which_answers_and_records_the_greeting(tmp_path: Path) -> None:
    """The reverse direction: SipLeg.originate to baresip (auto-answer); it hears the greeting."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = Baresip(tmp_path)
            await phone.start()
            assert await wait_for(lambda: phone.said("baresip is ready"), 5.0), phone.explain()
            leg.originate(
                f"sip:tester@127.0.0.1:{phone.sip_port}", "sip:callbridge@127.0.0.1", "greet"
            )
            assert await wait_for(lambda: phone.said("Call established"), 5.0), phone.explain()
            assert await wait_for(lambda: prompt_played(leg), 10.0)
            assert await wait_for(phone.heard_through, 10.0), phone.explain()
            await phone.stop()  # baresip hangs up as it quits
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls
        segments = audible_segments_s(phone.received_pcm())
        assert len(segments) == 1, segments
        [(start_s, end_s)] = segments
        expected_s = greeting_speech_s(GREETING)
        assert abs((end_s - start_s) - expected_s) <= skips.slack(), (segments, expected_s)

    run(main())


@pytest.mark.peers
@requires_sipp
def test_sipp_call_over_tcp_hears_the_greeting(tmp_path: Path) -> None:
    """The same call with SIP over TCP (Content-Length framing on a stream)."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            sip_port = st.sip_port
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = await RtpPhone().open(free_udp_port())
            try:
                args = sipp_uac_args("uac_greeting.xml", sip_port, "greet", rtp_port=phone.port)
                result = await run_sipp(tmp_path, "greet-tcp", [*args, "-t", "t1", "-d", "2500"])
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            span = audible_span_s(phone.pcm())
            assert span is not None, "no audible RTP received"
            assert abs((span[1] - span[0]) - greeting_speech_s(GREETING)) <= skips.slack(), span
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())

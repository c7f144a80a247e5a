"""Soak: 10 000 mixed calls with barge-ins, DTMF and provider failures; then back to baseline?

    python -m bench.bench_soak [--calls N] [--checkpoints K] [--concurrency C] [--seed S]
                                                                          (make soak)

The daemon (``bench/loadgen/soak_daemon.py``: ``callbridge serve`` plus a
task that writes its SIP transactions, RTP ports, calls and tasks to a file
every second) runs against two reference TTS servers (tone engine): ``fast``
and ``flaky``. Calls are placed by ``callbridge call``'s own code
(``place_call``), ``--concurrency`` at a time, in a seeded mix:

=====  ================================  ===========================================
share  leg and route                     what happens
=====  ================================  ===========================================
20 %   SIP, ``greet``                    greeting heard, caller hangs up
10 %   SIP, ``ivr``                      a key press answered by the flow
10 %   SIP, ``long``                     the caller talks over the greeting (barge-in)
10 %   SIP, ``flaky``                    provider chain ``flaky`` then ``fast``
10 %   SIP, ``dyn``                      an application's turn (not a cached prompt)
                                         on ``flaky`` then ``fast``
10 %   Twilio media stream, ``greet``
10 %   Twilio media stream, ``ivr``      a key press (``dtmf`` message)
10 %   Twilio media stream, ``long``     the caller talks over the greeting
10 %   Twilio media stream, ``dyn``
=====  ================================  ===========================================

Injected provider failures, two kinds:

* the ``flaky`` TTS server is killed every ``--fault-every-s`` seconds and
  started again (on the same port) ``--fault-down-s`` later;
* mid-turn (``--turn-faults F``, default 0.2): ``flaky`` is reached through
  ``loadgen/turn_faults.py``, which makes that fraction of the ``dyn`` turns
  fail at the moment their first audio comes back (the turn accepted, its text
  sent): the connection reset (``drop``), a frame that is not JSON
  (``garbage``), or the turn's audio held back (``stall``), each turn's kind
  drawn from ``--turn-fault-kinds``. Each ``dyn`` turn's text carries a token,
  so every turn a fault hit (others on a dropped connection too) is checked
  from the application's side: it must still play to its end, failed over to
  ``fast`` or as the route's fallback prompt (which of the two: the daemon's
  ``tts.failover`` / ``tts.fallback_prompt`` lines; a turn that fell back ends
  ``turn.interrupted`` with reason ``provider_error``, and the caller must have
  heard the whole fallback prompt), and its call must not be
  lost. Static prompts are rendered once and cached, so only ``dyn`` turns
  reach a provider during the calls.

Ctrl-C or SIGTERM stops the soak: the daemon, the TTS servers, the proxy and
the application go with it (exit status 130).

Before the measured calls, a warm-up of the same mix (``--warmup`` calls);
baseline and end state are both read once the daemon is idle and the SIP
transactions of the last calls have expired (64 x T1 = 32 s) and idle
provider connections have closed (``close_idle_after_s = 5``). What must
hold: descriptors, asyncio tasks, SIP transactions and RTP port pairs equal
their baseline; RSS within ``--rss-tolerance-mib`` of it (the heap keeps its
high-water mark: bench_memory.py); no warning or error line in the daemon's
log that the injected faults do not explain (the list of every such event,
matched or not, is in the result). Figures go to ``bench/results/soak.json``.

``--checkpoints K`` cuts the measured calls in K equal parts; after each the
soak waits for the daemon to be idle the same way (no call up, so the idle
thaw and ``malloc_trim`` have run; SIP transactions expired) and records its
RSS (``rss_by_calls_mib``: ``[calls done, RSS]``, the baseline first), that
RSS by kind of mapping (``/proc/PID/smaps``: glibc's main heap, anonymous
mappings, files) and the heap as the daemon sees it at idle (``heap_by_calls``: Python's allocated
blocks, frozen objects, glibc's in-use and free bytes; see
``loadgen/soak_daemon.py``). A warm-up plateau grows in the first part and
stays flat after; a per-call leak grows in every part. Provider kills and
mid-turn faults run only while calls do; the wall time counts the calls only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websockets

from bench.common import write
from bench.loadgen.procs import PAGE_BYTES, ROOT, free_port, terminate
from bench.loadgen.turn_faults import FAULT_KINDS, TurnFaultProxy
from bridge.io.caller import CallerOptions, SpeakClip, place_call
from telcodec import g711

SIP_RETENTION_S = 33.0
"""64 x T1 (32 s) and a margin: how long a completed call's SIP transactions live."""
CLOSE_IDLE_AFTER_S = 5.0
LONG_GREETING = " ".join(f"word{i}" for i in range(40)) + "."

MIX: tuple[tuple[str, str, int], ...] = (
    # (leg, route, weight)
    ("sip", "greet", 20),
    ("sip", "ivr", 10),
    ("sip", "long", 10),
    ("sip", "flaky", 10),
    ("sip", "dyn", 10),
    ("twilio", "greet", 10),
    ("twilio", "ivr", 10),
    ("twilio", "long", 10),
    ("twilio", "dyn", 10),
)
DYN_DURATION_S = 6.0
"""A ``dyn`` call's length: its turn (under 1 s of audio) after a first-audio deadline
(1 s) and a failover still ends before the caller hangs up."""

FALLBACK_PROMPT = "Sorry, one moment please."
"""The ``dyn`` route's fallback prompt: a faulted turn whose caller heard all of it (the
turn interrupted with reason ``provider_error`` and this as its ``heard_text``) was
recovered by falling back."""

FAULTY = '"flaky"'
"""The injected faults explain a warning or error line that names the killed provider
(``provider``, ``route``...); anything else at warning or error is unexplained."""


def config_text(fast_port: int, flaky_port: int, sip_port: int, app_url: str) -> str:
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
match = "dyn"
provider = ["flaky", "fast"]
app = "{app_url}"
fallback_prompt = "{FALLBACK_PROMPT}"

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


class Peers:
    """The application the ``dyn`` route dials and the mid-turn fault proxy in front of
    ``flaky``, on an event loop of their own in a thread (the calls run in the main one).

    The application says one turn per call when it starts: ``Turn k<n> is here.``, the
    token ``k<n>`` naming it (its ``turn_id`` too), and keeps what it hears of each turn."""

    def __init__(self, flaky_url: str, fraction: float, kinds: tuple[str, ...], seed: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="soak-peers")
        self.proxy = TurnFaultProxy(flaky_url, fraction, kinds, seed)
        self.turns: dict[str, list[str]] = {}
        """token -> the app events of that turn, in order (``provider.error``, ``turn.*``)."""
        self.interrupted: dict[str, tuple[str, str]] = {}
        """token -> its ``turn.interrupted``'s (reason, heard_text)."""
        self._count = 0
        self._server: websockets.Server | None = None
        self.thread.start()
        try:
            self._run(self._start())
        except BaseException:
            self.stop()
            raise

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        await self.proxy.start()
        self._server = await websockets.serve(self._app, "127.0.0.1", 0)

    @property
    def app_url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/app"

    async def _app(self, ws: websockets.ServerConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for msg in ws:
                event = json.loads(msg)
                kind = event.get("type")
                if kind == "call.started":
                    self._count += 1
                    token = f"k{self._count}"
                    self.turns[token] = []
                    say = {"type": "say", "turn_id": token, "text": f"Turn {token} is here.",
                           "final": True}  # fmt: skip
                    await ws.send(json.dumps(say))
                elif event.get("turn_id") in self.turns:
                    self.turns[event["turn_id"]].append(str(kind))
                    if kind == "turn.interrupted":
                        self.interrupted[event["turn_id"]] = (
                            str(event.get("reason")),
                            str(event.get("heard_text")),
                        )

    def stop(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            await self.proxy.close()

        with contextlib.suppress(Exception):
            self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class SoakDaemon:
    def __init__(self, workdir: Path, fast: int, flaky: int, app_url: str) -> None:
        self.workdir = workdir
        self.sip_port = free_port(socket.SOCK_DGRAM)
        self.config = workdir / "callbridge.toml"
        self.config.write_text(config_text(fast, flaky, self.sip_port, app_url))
        self.state_path = workdir / "state.json"
        self.log = workdir / "daemon.log"
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen.soak_daemon", str(self.config),
             str(self.state_path)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("wb"), start_new_session=True,
            cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        try:
            while not self.state_path.exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"daemon did not become ready:\n{tail}")
                time.sleep(0.1)
        except BaseException:  # not ready, or interrupted meanwhile: not left running
            self.stop()
            raise
        self.ms_port = int(self.state()["ports"]["media_streams"])

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]

    def rss_bytes(self) -> int:
        return int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1]) * PAGE_BYTES

    def rss_by_mapping(self) -> dict[str, float]:
        return rss_by_mapping(Path(f"/proc/{self.proc.pid}/smaps").read_text())

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


def rss_by_mapping(smaps: str) -> dict[str, float]:
    """A process's RSS (MiB) by the kind of mapping it is in, from ``/proc/PID/smaps``:
    ``heap`` (glibc's main arena, ``[heap]``), ``anon`` (anonymous mappings: Python's
    object arenas, glibc's thread arenas and large ``mmap`` chunks, thread stacks),
    ``file`` (shared libraries, compiled modules and other mapped files) and ``other``
    (``[stack]``, ``[vdso]``...)."""
    out = {"heap": 0, "anon": 0, "file": 0, "other": 0}
    kind = "other"
    for line in smaps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":") and "-" in fields[0] and len(fields) >= 5:
            path = " ".join(fields[5:])
            kind = (
                "heap" if path == "[heap]"
                else "anon" if not path
                else "other" if path.startswith("[")
                else "file"
            )  # fmt: skip
        elif fields[0] == "Rss:":
            out[kind] += int(fields[1])
    return {k: round(kib / 1024, 2) for k, kib in out.items()}


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
        duration_s={"ivr": 3.0, "dyn": DYN_DURATION_S}.get(route, 2.5),
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
        "heap": s.get("heap"),
        "rss_by_mapping_mib": d.rss_by_mapping(),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def part_sizes(calls: int, parts: int) -> list[int]:
    """``calls`` cut in ``parts`` equal parts (the first ones a call longer when ``parts``
    does not divide ``calls``); no empty part."""
    if calls < 0 or parts < 1:
        raise ValueError(f"{calls} calls in {parts} parts")
    parts = min(parts, calls) or 1
    q, r = divmod(calls, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def growth_by_part(rss_by_calls: list[list[float]]) -> list[dict[str, float]]:
    """Each part's RSS growth from the checkpoint before it: ``rss_by_calls`` is
    ``[calls done, RSS MiB]`` from the baseline (0 calls) on; per part the calls it
    placed, the MiB it added and the KB (1000 bytes) per call that makes."""
    out = []
    for (c0, r0), (c1, r1) in itertools.pairwise(rss_by_calls):
        calls = int(c1 - c0)
        mib = r1 - r0
        out.append(
            {
                "calls": calls,
                "rss_growth_mib": round(mib, 2),
                "kb_per_call": round(mib * 2**20 / 1000 / calls, 2) if calls else 0.0,
            }
        )
    return out


def plateau(rss_by_calls: list[list[float]], flat_mib: float = 2.0) -> bool | None:
    """Whether RSS stopped growing after the first part: from the first checkpoint to the
    last it moved by at most ``flat_mib`` (``None``: fewer than two parts, nothing to tell)."""
    if len(rss_by_calls) < 3:
        return None
    later = [r for _, r in rss_by_calls[1:]]
    return max(later) - later[0] <= flat_mib


def merge_calls(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """``run_calls``' results of the parts, added up."""
    out: dict[str, Counter[str]] = {"placed": Counter(), "ok": Counter(), "failed": Counter()}
    for part in parts:
        for key, counts in out.items():
            counts.update(part.get(key, {}))
    return {key: dict(counts) for key, counts in out.items()}


def unexplained(
    events: list[dict[str, Any]], faulted_turns: frozenset[str] = frozenset()
) -> tuple[Counter[str], Counter[str]]:
    """Warning and error lines split into those the injected faults explain (a line that
    names the killed provider, or the turn a mid-turn fault hit) and the others."""
    explained: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for e in events:
        if e.get("level") not in ("warning", "error", "critical"):
            continue
        name = str(e.get("event"))
        text = json.dumps(e)
        if FAULTY in text or str(e.get("turn_id")) in faulted_turns:
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


def turn_fault_figures(peers: Peers, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every turn a mid-turn fault hit: did it play to its end, and how (the daemon's
    ``tts.failover`` / ``tts.fallback_prompt`` lines name the turn)."""
    failed_over = {str(e.get("turn_id")) for e in events if e.get("event") == "tts.failover"}
    fell_back = {str(e.get("turn_id")) for e in events if e.get("event") == "tts.fallback_prompt"}
    by_kind: dict[str, Counter[str]] = {}
    not_recovered: list[str] = []
    for kind, token in peers.proxy.faulted:
        heard = peers.turns.get(token, [])
        # a turn that fell back ends interrupted: recovered if the fallback was heard whole
        whole_fallback = peers.interrupted.get(token) == ("provider_error", FALLBACK_PROMPT)
        if "turn.finished" not in heard and not (whole_fallback and token in fell_back):
            how = "not_recovered"
            not_recovered.append(f"{kind} {token}: {heard}")
        elif token in fell_back:
            how = "fell_back"
        elif token in failed_over:
            how = "failed_over"
        else:
            how = "finished_unexplained"  # played on flaky after all: a fault that missed
        by_kind.setdefault(kind, Counter())[how] += 1
    dyn_turns = [t for t in peers.turns.values() if t]
    return {
        "fraction": peers.proxy.fraction,
        "faults_injected": dict(peers.proxy.injected),
        "turns_hit": len(peers.proxy.faulted),
        "turns_hit_by_kind": {k: dict(c) for k, c in by_kind.items()},
        "collateral_untokened": peers.proxy.collateral_untokened,
        "not_recovered": not_recovered[:20],
        "dyn_turns_with_warmup": len(dyn_turns),
        "dyn_turns_finished_with_warmup": sum(1 for t in dyn_turns if "turn.finished" in t),
        "proxy_connections": peers.proxy.connections,
        "proxy_upstream_failures": peers.proxy.upstream_failures,
    }


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same way out as Ctrl-C: every ``finally`` stops its part


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=30)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--fault-every-s", type=float, default=20.0)
    ap.add_argument("--fault-down-s", type=float, default=5.0)
    ap.add_argument(
        "--turn-faults",
        type=float,
        default=0.2,
        help="fraction of the dyn turns made to fail mid-turn on flaky (0: none)",
    )
    ap.add_argument(
        "--turn-fault-kinds",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated, from {','.join(FAULT_KINDS)}",
    )
    ap.add_argument("--rss-tolerance-mib", type=float, default=16.0)
    ap.add_argument(
        "--checkpoints",
        type=int,
        default=1,
        help="cut the calls in K parts; RSS and heap at idle after each",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="make bench-quick: 300 calls after 50 warm-up ones, to soak_quick.json",
    )
    args = ap.parse_args()
    if args.quick:
        args.calls, args.warmup = min(args.calls, 300), min(args.warmup, 50)
    kinds = tuple(k.strip() for k in args.turn_fault_kinds.split(",") if k.strip())
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return soak(args, kinds)
    except KeyboardInterrupt:
        print("interrupted: daemon, TTS servers, proxy and application stopped", flush=True)
        return 130


def soak(args: argparse.Namespace, kinds: tuple[str, ...]) -> int:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        fast = Tts(free_port(), work / "tts-fast.log")
        flaky = Tts(free_port(), work / "tts-flaky.log")
        stack.callback(fast.stop)
        stack.callback(flaky.stop)
        fast.start()
        flaky.start()
        flaky_url = f"ws://127.0.0.1:{flaky.port}/v1/ws/kova"
        peers = Peers(flaky_url, args.turn_faults, kinds, args.seed)
        stack.callback(peers.stop)
        d = SoakDaemon(work, fast.port, peers.proxy.port, peers.app_url)
        stack.callback(d.stop)  # last in, first out: the daemon stops first
        print(f"warm-up: {args.warmup} calls", flush=True)
        warm = asyncio.run(run_calls(d, args.warmup, args.concurrency, rng))
        base = idle_state(d)
        print(f"baseline: {base}", flush=True)
        log_mark = len(d.log_events())
        kills: list[float] = []

        async def measured(n: int) -> dict[str, Any]:
            injector = asyncio.ensure_future(
                fault_injector(flaky, args.fault_every_s, args.fault_down_s, kills)
            )
            try:
                return await run_calls(d, n, args.concurrency, rng)
            finally:
                injector.cancel()

        sizes = part_sizes(args.calls, args.checkpoints)
        rss_by_calls: list[list[float]] = [[0, base["rss_mib"]]]
        heap_by_calls: list[list[Any]] = [[0, base["heap"]]]
        parts: list[dict[str, Any]] = []
        wall_s = 0.0
        peak_rss = 0.0
        done = 0
        end = base
        for i, n in enumerate(sizes):
            peers.proxy.armed = True
            t0 = time.monotonic()
            part = asyncio.run(measured(n))
            part_s = time.monotonic() - t0
            wall_s += part_s
            peers.proxy.armed = False
            if flaky.proc is None or flaky.proc.poll() is not None:
                flaky.start()
            parts.append(part)
            done += n
            print(f"part {i + 1}/{len(sizes)}: {n} calls in {part_s:.0f} s: {part}", flush=True)
            peak_rss = max(peak_rss, round(d.rss_bytes() / 2**20, 2))
            end = idle_state(d)
            rss_by_calls.append([done, end["rss_mib"]])
            heap_by_calls.append([done, end["heap"]])
            print(
                f"checkpoint {done} calls: RSS {end['rss_mib']} MiB "
                f"({end['rss_mib'] - base['rss_mib']:+.2f}), heap {end['heap']}, "
                f"load {end['load']}",
                flush=True,
            )
        calls = merge_calls(parts)
        print(f"{args.calls} calls in {wall_s:.0f} s: {calls}", flush=True)
        print(f"end: {end}", flush=True)
        events = d.log_events()[log_mark:]
        explained, other = unexplained(events, frozenset(token for _, token in peers.proxy.faulted))
        fault_effects = Counter(str(e.get("event")) for e in events if "flaky" in json.dumps(e))
        cdrs = cdr_figures(events)
        turn_faults = turn_fault_figures(peers, events)
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
        # every turn a mid-turn fault hit still played to its end (failed over or fell
        # back); with faults asked for, some were injected (else this proves nothing)
        "every_faulted_turn_recovered": not turn_faults["not_recovered"],
        "turn_faults_injected": turn_faults["turns_hit"] > 0 or args.turn_faults == 0,
    }
    figures = {
        "calls": args.calls,
        "wall_s": round(wall_s, 1),
        "calls_per_s": round(args.calls / wall_s, 2),
        "projected_10000_calls_min": round(wall_s / args.calls * 10_000 / 60, 1),
        "warmup": warm,
        "measured": calls,
        "provider_kills": len(kills),
        "turn_faults": turn_faults,
        "baseline": base,
        "end": end,
        "rss_peak_after_calls_mib": peak_rss,
        "rss_growth_mib": round(end["rss_mib"] - base["rss_mib"], 2),
        "rss_by_calls_mib": rss_by_calls,
        "rss_growth_by_part": growth_by_part(rss_by_calls),
        "rss_plateau_after_first_part": plateau(rss_by_calls),
        "heap_by_calls": heap_by_calls,
        "flaky_provider_log_events": dict(fault_effects),
        "cdrs": cdrs,
        "log_warnings_explained_by_faults": dict(explained),
        "log_warnings_unexplained": dict(other),
        "checks": checks,
    }
    settings = {k: v for k, v in vars(args).items()}
    path = write("soak_quick" if args.quick else "soak", figures, settings)
    print(json.dumps(figures, indent=1))
    print(f"written to {path}")
    failed = [k for k, ok in checks.items() if not ok]
    print("PASS" if not failed else f"FAIL: {', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

"""CPU of one SIP call's whole per-frame chain, with the objects wired as the daemon wires them.

Per call: a real ``_SipCall`` (``bridge/io/legs/sip_call.py``) with its RTP/RTCP
socket pair on 127.0.0.1 (``SO_TIMESTAMPNS`` on), a real ``CallRunner``
(``bridge/io/callrun.py``) with its real ``CallBridge`` (SIP profile, mu-law,
barge-in policy from the default ``[bargein]`` config, the real metrics
objects), registered on the process-wide ``MediaTicker`` (``bridge/io/ticker.py``)
exactly as the leg registers them. Nothing in the chain is a stub but the
turn source's provider connection (a ``Speaker`` that only records the turn
it was asked to open: the harness then plays the provider).

Driving. The loop is uvloop, but the clock every object reads (``MediaTicker``'s
clock and the ``loop.time()`` of the runner and the leg) is a simulated one
the harness moves: it reads the time the ticker armed its timer for and moves
the clock there as uvloop fires (the whole millisecond nearest to what was
armed, 0.3 ms into it), then runs the real ``MediaTicker._run`` (talkspurt
starts, ``Ticker.due``, every due call's ``_on_frame`` → ``CallBridge.tick`` →
``_SipCall.send_frame``, the outbox ``flush`` with the real ``sendto``, every
call's ``_inbound`` ``recvmsg``, every call's ``_process`` → ``RtpSession`` →
``CallRunner.caller_audio`` → ``CallBridge.caller_audio``, re-arm).

Script per call (as ``bench/bench_call.py``'s):

* inbound: a peer socket sends each call one PCMU packet per 20 ms of quiet
  noise (-60 dBFS white noise; the VAD and the detector run, nothing
  triggers), every call's at the start of each period (not counted); the
  first packet latches the call's symmetric RTP. The kernel's arrival
  stamps are real time and the ticks simulated, so the ticker's one
  wall-clock reading is stubbed to put every stamp at the tick that reads
  it (one ``recvmsg`` per call per tick, as in the daemon's common tick).
  The stub replaces ``time`` in the ticker module's namespace, which only
  the interpreted ticker reads: with ``bridge/io/ticker.py`` compiled
  (sixteenth pass) it no longer applies, the stamps are taken against the
  simulated clock as they are, and how many datagrams a tick reads may
  differ from the daemon's common tick (not checked);
* provider: a 15 s turn (``Say``) whose audio arrives as mu-law 8 kHz
  (pass-through) in 100 ms chunks, one chunk every 2 periods (2.5 x real
  time), through the runner's real provider sink (``_provider_sink``:
  ``provider_event``, talkspurt start, drain), then ``TurnDone``; when the
  bridge reports the turn finished, the next ``Say`` opens the next turn.
  The first turn of call ``i`` is ``i / N`` of a turn long, so that the
  calls' turns are spread over the cycle (some receiving audio, some only
  playing out, a few between turns).

Printed: CPU µs per call per 20 ms (``time.process_time``, the median of
``--reps`` windows of ``--frames`` periods after one warm-up window), split
into the ticker's wake-ups (``tick``: everything ``MediaTicker._run`` does)
and the provider sink (``provider``). Written to
``bench/results/chain.json``.

Not in the chain: the event loop's own work (uvloop wakes the ticker about
once per millisecond: its timer handling and the epoll wait), RTCP reads
(the loop's, every ~5 s per call), the provider's WebSocket client and
protocol decoding (the harness hands ``AudioReceived`` to the sink), SIP
signalling, the GC policy.

Instructions (repeatable whatever else runs on the machine): ``--callgrind``
runs this script twice under ``valgrind --tool=callgrind`` with
``--frames F`` and ``2F`` (one rep, no warm-up beyond the set-up) and prints
the difference of the two totals per call per 20 ms: set-up and start-up
cancel out (``PYTHONHASHSEED=0``: repeat runs agree within ~1%). With
``--cache-sim`` it also counts simulated L1 and L2 misses (the L2 as the
last level: see ``CACHE_SIM``).

    .venv/bin/python -m bench.bench_chain                  # 100 and 400 calls
    .venv/bin/python -m bench.bench_chain --calls 400 --profile
    .venv/bin/python -m bench.bench_chain --callgrind --calls 100 --frames 50
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench import common
from bridge import commands as cmd
from bridge.config import parse_config
from bridge.logs import configure
from bridge.providers.base import AudioFormat, AudioReceived, TurnDone
from bridge.rtp.packet import RTP_FIXED_HEADER
from telcodec import g711

ROOT = Path(__file__).resolve().parents[1]

FRAME_S = 0.020
TURN_S = 15.0
CHUNK_MS = 100
CHUNK_EVERY = 2  # periods
MULAW8K = AudioFormat("mulaw", 8000)
CONFIG = """
[daemon]
prompt_cache_bytes = 0
[sip]
rtp_timeout_s = 60
[providers.bench]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"
[[routes]]
match = "*"
provider = "bench"
"""
"""The daemon's config for the chain: the default ``[bargein]``, one route whose provider
the harness plays (no connection is made to its URL)."""
_pack_header = RTP_FIXED_HEADER.pack


def bot_audio_chunks() -> list[bytes]:
    """15 s of a speech-like signal, mu-law 8 kHz, in 100 ms chunks (as bench_call's)."""
    rate = 8000
    t = np.arange(int(TURN_S * rate)) / rate
    sig = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 12))
    sig = sig * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    pcm = (sig / np.max(np.abs(sig)) * 0.3 * 32767).astype("<i2").tobytes()
    ulaw = g711.ulaw_encode(pcm)
    size = rate * CHUNK_MS // 1000
    return [ulaw[i : i + size] for i in range(0, len(ulaw), size)]


def caller_payloads(count: int = 250) -> list[bytes]:
    """Quiet noise, -60 dBFS, mu-law, 160 bytes each (as bench_call's)."""
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 32768 * 10 ** (-60 / 20), count * 160)
    pcm = np.clip(noise, -32768, 32767).astype("<i2").tobytes()
    ulaw = g711.ulaw_encode(pcm)
    return [ulaw[i * 160 : (i + 1) * 160] for i in range(count)]


class _SimLoop:
    """The clock the chain reads; everything else is the real (uvloop) loop's."""

    def __init__(self, real: asyncio.AbstractEventLoop) -> None:
        self.real = real
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        # never fires by itself: the harness runs the ticker at the armed time
        return self.real.call_at(self.real.time() + 3600 + (when - self.now), callback, *args)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Any:
        return self.real.call_later(3600 + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self.call_at(self.now, callback, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _ProviderStub:
    """The route's ``Speaker``: records the turn to stream; the harness is the provider."""

    def __init__(self, chain: _Chain, index: int) -> None:
        self.chain = chain
        self.index = index
        self.turns: dict[str, Any] = {}

    def open_turn(self, turn_id: str, settings: Any, sink: Callable[[Any], None]) -> None:
        self.chain.opened(self.index, turn_id, sink)

    def send_text(self, turn_id: str, text: str) -> None:
        pass

    def end_turn(self, turn_id: str) -> None:
        pass

    def cancel(self, turn_id: str) -> None:
        pass


class _Chain:
    """N calls wired as the daemon wires them, on a simulated clock."""

    def __init__(self, n_calls: int) -> None:
        self.n = n_calls
        self.chunks = bot_audio_chunks()
        self.payloads = caller_payloads()
        # per call: the turn being streamed, its sink, the next chunk, the chunks of this turn
        self.turn: list[str | None] = [None] * n_calls
        self.sink: list[Callable[[Any], None] | None] = [None] * n_calls
        self.next_chunk = [0] * n_calls
        self.turn_chunks = [
            max(1, len(self.chunks) * i // n_calls) for i in range(n_calls)
        ]  # first turns spread the cycle
        self.turns_opened = [0] * n_calls
        self.awaiting_finish = [False] * n_calls
        self.seq = [0] * n_calls
        self.period = -1
        self.cpu = {"tick": 0.0, "provider": 0.0}
        self.ticks = 0

    async def setup(self) -> None:
        from bridge.io import ticker as ticker_module
        from bridge.io.callrun import CallRunner
        from bridge.io.legs.sip_call import SO_TIMESTAMPNS, _SipCall
        from bridge.io.services import Runtime, Services
        from bridge.io.ticker import MediaTicker
        from bridge.media.call_types import LegProfile
        from bridge.providers.prompts import PromptCache
        from bridge.sip.sdp import NegotiatedAudio

        real = asyncio.get_running_loop()
        # The kernel's arrival stamps are real time, the ticks are simulated: every datagram
        # counts as arrived at the tick that reads it (the ticker's wall-clock reading, the
        # only one, is made to put every stamp in the future, which _inbound clamps to now).
        ticker_module.time = SimpleNamespace(  # type: ignore[attr-defined]
            time=lambda: -1e12, monotonic=time.monotonic
        )
        self.sim = sim = _SimLoop(real)
        self.ticker = ticker = MediaTicker(sim, clock=sim.time)  # type: ignore[arg-type]
        # the services the daemon hands its legs, built from a real config: the default
        # [bargein], no provider pool (the harness plays the provider), no prompt cache
        config = parse_config(CONFIG, "bench_chain.toml")
        runtime = Runtime(config, pools={}, cache=PromptCache(0))
        services = Services.standalone(config, ticker, runtime)
        self.peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.peer.bind(("127.0.0.1", 0))
        self.peer.setblocking(False)
        route = config.routes[0]
        self.calls: list[Any] = []
        self.runners: list[Any] = []
        self.addrs: list[tuple[str, int]] = []
        for i in range(self.n):
            call = _SipCall(services, None, f"call-{i}", 0)  # type: ignore[arg-type]
            call.loop = sim
            rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rtp.setblocking(False)
            rtp.bind(("127.0.0.1", 0))
            if SO_TIMESTAMPNS is not None:  # as the leg binds it
                rtp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rtcp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rtcp.setblocking(False)
            rtcp.bind(("127.0.0.1", 0))
            await call.attach((rtp, rtcp))
            call.start_media(
                NegotiatedAudio(0, "PCMU", 0, 101, self.peer.getsockname(), "sendrecv", 20)
            )
            profile = LegProfile(kind="sip", codec="mulaw", heard_from="frames")
            started = cmd.CallStarted(call_id=call.call_id, leg="sip", from_="a", to="b")
            runner = CallRunner(services, call.call_id, call, profile, route, started)
            runner.loop = sim
            runner.speakers[None] = _ProviderStub(self, i)  # type: ignore[assignment]
            call.runner = runner
            runner.start()
            self.calls.append(call)
            self.runners.append(runner)
            self.addrs.append(rtp.getsockname())
            sim.now += 0.02 / self.n  # calls arrive spread over the period
        for i in range(self.n):
            self.say(i)

    def say(self, i: int) -> None:
        self.turns_opened[i] += 1
        self.runners[i].say(cmd.Say(f"t{self.turns_opened[i]}", "fifteen seconds", final=True))

    def opened(self, i: int, turn_id: str, sink: Callable[[Any], None]) -> None:
        self.turn[i] = turn_id
        self.sink[i] = sink
        self.next_chunk[i] = 0

    def close(self) -> None:
        for call in self.calls:
            call.close()
        self.peer.close()
        self.ticker.close()

    # ------------------------------------------------------------- driving

    def _provider_phase(self, period: int) -> None:
        """This period's provider chunks (half the calls each period), through the real sink."""
        chunks = self.chunks
        events: list[tuple[Callable[[Any], None], Any]] = []
        for i in range(period & 1, self.n, CHUNK_EVERY):
            sink = self.sink[i]
            turn_id = self.turn[i]
            if sink is None or turn_id is None:
                continue
            k = self.next_chunk[i]
            if k < self.turn_chunks[i]:
                events.append((sink, AudioReceived(turn_id, chunks[k], MULAW8K)))
                self.next_chunk[i] = k + 1
            else:
                events.append((sink, TurnDone(turn_id)))
                self.sink[i] = None
                self.turn_chunks[i] = len(chunks)
                self.awaiting_finish[i] = True
        start = time.process_time()
        for sink, event in events:
            sink(event)
        self.cpu["provider"] += time.process_time() - start
        if period % 10 == 0:  # restart finished turns (not counted)
            for i in range(self.n):
                finished = self.awaiting_finish[i] and (
                    self.runners[i].bridge.stats().turns_finished >= self.turns_opened[i]
                )
                if finished:
                    self.awaiting_finish[i] = False
                    self.say(i)

    def run(self, periods: int) -> None:
        """Run the chain for ``periods`` x 20 ms of simulated time."""
        sim = self.sim
        ticker = self.ticker
        offset = ticker._arm_offset_s
        addrs = self.addrs
        payloads = self.payloads
        sendto = self.peer.sendto
        end = sim.now + periods * FRAME_S
        process_time = time.process_time
        while sim.now < end:
            armed = ticker._armed_at
            handle = ticker._handle
            if armed is None or handle is None:
                raise RuntimeError("ticker not armed")
            handle.cancel()
            if armed != -float("inf"):
                # as uvloop fires: the nearest whole ms to what was armed, 0.3 ms into it
                sim.now = max(sim.now, round((armed + offset) * 1000) / 1000 + 0.0003)
            period = int(sim.now / FRAME_S)
            if period != self.period:
                self.period = period
                # the peer's packets, one per call, at the start of each period (not counted)
                for i, addr in enumerate(addrs):
                    s = self.seq[i]
                    self.seq[i] = s + 1
                    data = _pack_header(
                        0x80, 0x80 if s == 0 else 0, s & 0xFFFF, (s * 160) & 0xFFFFFFFF, 0x1234
                    )
                    sendto(data + payloads[s % len(payloads)], addr)
                self._provider_phase(period)
            start = process_time()
            ticker._run()
            self.cpu["tick"] += process_time() - start
            self.ticks += 1


def measure(n_calls: int, frames: int, reps: int, warmup: int, profile: str = "") -> dict[str, Any]:
    import uvloop

    async def main() -> dict[str, Any]:
        random.seed(1)  # the runners' RTP ts0 (the sessions' own SSRC and sequence stay random)
        # the daemon's JSON log lines (call.started, turn.finished: a few per turn), discarded
        configure("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
        chain = _Chain(n_calls)
        await chain.setup()
        if warmup:
            chain.run(warmup)
        totals: list[float] = []
        parts: dict[str, list[float]] = {"tick": [], "provider": []}
        frames_sent = sum(r.clock.stats().frames_sent for r in chain.runners)
        prof = cProfile.Profile() if profile else None
        for _ in range(reps):
            chain.cpu = {"tick": 0.0, "provider": 0.0}
            if prof is not None:
                prof.enable()
            chain.run(frames)
            if prof is not None:
                prof.disable()
            sent = sum(r.clock.stats().frames_sent for r in chain.runners)
            per = 1e6 / (sent - frames_sent)
            frames_sent = sent
            parts["tick"].append(chain.cpu["tick"] * per)
            parts["provider"].append(chain.cpu["provider"] * per)
            totals.append((chain.cpu["tick"] + chain.cpu["provider"]) * per)
        underruns = sum(r.bridge.stats().underruns for r in chain.runners)
        turns = sum(r.bridge.stats().turns_finished for r in chain.runners)
        chain.close()
        await asyncio.sleep(0.05)
        if prof is not None:
            stats = pstats.Stats(prof)
            stats.sort_stats(profile).print_stats(40)
        return {
            "median_us": round(statistics.median(totals), 2),
            "reps_us": [round(v, 2) for v in totals],
            "tick_us": round(statistics.median(parts["tick"]), 2),
            "provider_us": round(statistics.median(parts["provider"]), 2),
            "turns_finished": turns,
            "underruns": underruns,
        }

    return uvloop.run(main())


_EVENTS = re.compile(r"^events:\s*(.+)$", re.M)
_TOTALS = re.compile(r"^(?:summary|totals):\s*([\d ]+)$", re.M)
CACHE_SIM = ("--cache-sim=yes", "--LL=2097152,16,64")
"""``--cache-sim``: simulate L1 and, as the last level, this machine's 2 MiB L2 (the L3 of
32 MiB holds every call at 400 calls: the misses that cost are the L2's)."""


def callgrind(n_calls: int, frames: int, cache_sim: bool = False) -> dict[str, float]:
    """Events per call per 20 ms: two runs under callgrind, ``frames`` and ``2 x frames``.

    ``Ir`` (instructions), and with ``cache_sim`` the simulated misses too
    (``D1mr``/``D1mw``: L1 data; ``DLmr``/``DLmw``: the last level, here the L2).
    """
    totals: list[dict[str, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in (frames, 2 * frames):
            out = Path(tmp) / f"cg.{f}"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    *(CACHE_SIM if cache_sim else ()),
                    sys.executable,
                    "-m",
                    "bench.bench_chain",
                    "--calls",
                    str(n_calls),
                    "--frames",
                    str(f),
                    "--reps",
                    "1",
                    "--warmup",
                    "0",
                    "--no-write",
                ],
                check=True,
                capture_output=True,
                cwd=ROOT,  # where the bench package is
                env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict and set layouts
            )
            text = out.read_text()
            events, values = _EVENTS.search(text), _TOTALS.search(text)
            if events is None or values is None:
                raise RuntimeError("no totals in the callgrind output")
            totals.append(
                dict(zip(events.group(1).split(), map(int, values.group(1).split()), strict=True))
            )
    return {k: (totals[1][k] - totals[0][k]) / (n_calls * frames) for k in totals[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", default="100,400", help="comma-separated call counts")
    parser.add_argument("--frames", type=int, default=250, help="20 ms periods per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=250, help="periods before measuring")
    parser.add_argument("--profile", default="", help="cProfile the reps, sorted by this key")
    parser.add_argument("--callgrind", action="store_true", help="instructions, under valgrind")
    parser.add_argument("--cache-sim", action="store_true", help="with --callgrind: cache misses")
    parser.add_argument("--no-write", action="store_true", help="do not write chain.json")
    parser.add_argument("--name", default="chain", help="results file name (bench/results)")
    parser.add_argument(
        "--quick", action="store_true", help="make bench-quick: 100 calls, 3 reps, chain_quick"
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.reps, args.name = "100", 3, "chain_quick"
    counts = [int(c) for c in args.calls.split(",")]
    if args.callgrind:
        for n in counts:
            per = callgrind(n, args.frames, args.cache_sim)
            print(f"{n} calls: {per['Ir']:,.0f} instructions per call per 20 ms (callgrind)")
            if len(per) > 1:
                print("  per call per 20 ms: " + ", ".join(f"{k} {v:,.0f}" for k, v in per.items()))
        return
    results: dict[str, Any] = {}
    print(f"CPU µs per call per 20 ms (median of {args.reps} x {args.frames} periods)")
    print(f"{'calls':>6} {'total':>7} {'tick':>7} {'provider':>8}")
    for n in counts:
        r = measure(n, args.frames, args.reps, args.warmup, args.profile)
        results[str(n)] = r
        print(
            f"{n:6d} {r['median_us']:7.2f} {r['tick_us']:7.2f} {r['provider_us']:8.2f}"
            f"   reps {r['reps_us']}"
        )
    if not args.no_write and not args.profile:
        settings = {
            "frames": args.frames,
            "reps": args.reps,
            "warmup": args.warmup,
            "turn_s": TURN_S,
            "chunk_ms": CHUNK_MS,
            "chunk_every_periods": CHUNK_EVERY,
            "provider_format": "mulaw 8 kHz (pass-through)",
            "caller": "white noise -60 dBFS, PCMU, every 20 ms",
        }
        path = common.write(args.name, results, settings)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

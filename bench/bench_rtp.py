"""Benchmark the RTP hot path: microseconds per packet, in and out.

Usage: python -m bench.bench_rtp [--quick] [--out PATH]

Prints a table and writes JSON (default ``bench/results/rtp.json``) with the
machine and commit it ran on. Every figure is the median over several runs
of the mean time per packet over a batch of packets, each run on a fresh
session:

* ``receive_and_pop``: ``RtpSession.receive_datagram`` (parse, PT check,
  source check, SSRC, RFC 3550 A.1 sequence and A.8 jitter, jitter-buffer
  insert) followed by ``pop_frame`` (jitter-buffer out) for a 20 ms PCMU
  packet from the locked peer, as every inbound packet costs in a call;
* ``receive_and_pop_latched``: the same with symmetric-RTP latching on;
* ``receive_and_pop_reordered``: the same with every pair of packets swapped;
* ``send_frame``: ``RtpSession.send_frame`` (header pack, ``SendDatagram``)
  plus draining ``actions_to_send()``, as the ticker does per call per tick;
* ``parse_rtp_header`` / ``build_rtp`` / ``RtpPacket.parse``: the packet
  functions alone, for comparison.

``calls_per_core_rtp_only`` is 1 s divided by 50 x (receive_and_pop +
send_frame): the RTP engine's share of one call per 20 ms; sockets, the event
loop, codecs and VAD come on top (see bench_codecs and the design notes).

Shell figures, in **CPU** microseconds (``time.process_time``, median of the
repetitions) so that other processes on the machine do not enter them:

* ``sip_call_path``: N real ``_SipCall`` shell objects of ``bridge/io/legs/sip_call.py``
  under uvloop, each with a real RTP/RTCP socket pair on 127.0.0.1
  (SO_TIMESTAMPNS on, as the leg binds it); per 20 ms a peer socket sends one
  PCMU packet to every call (not counted), then the ticker's phases run as
  ``bridge.io.ticker`` runs them: every call's ``send_frame`` (RTP session,
  packet queued on the outbox), the outbox sent (the real ``sendto``, back to
  the peer socket, which never reads), every call's read (``recvmsg`` with the
  kernel arrival time), then every call's work on what it read (RTP engine,
  jitter-buffer pop). The call's runner is a stub: VAD, barge-in and playout
  belong to the call side (``bench_call`` measures that path);
* ``ticker``: the process-wide ``MediaTicker`` driving N streams (no-op frame
  callbacks) on a simulated clock that wakes it when it asked, with a real
  uvloop ``call_at`` per re-arm: CPU per stream per 20 ms tick, the scheduling
  overhead every call pays on top of its own frame work. The simulated timer
  fires as uvloop's does: at the whole millisecond nearest to what was armed,
  here 0.3 ms into it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import machine
from bridge.rtp.packet import RtpPacket, build_rtp, parse_rtp_header
from bridge.rtp.session import RtpSession, RtpSessionConfig

SHELL_CALLS = (100, 500)

ROOT = Path(__file__).resolve().parent.parent
PEER = ("192.0.2.10", 40000)
PAYLOAD = b"\xff" * 160
PACKETS_PER_S = 50


def inbound_packets(count: int, swap_pairs: bool = False) -> list[bytes]:
    seqs = list(range(count))
    if swap_pairs:
        for i in range(0, count - 1, 2):
            seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
    return [build_rtp(0, s & 0xFFFF, (s * 160) & 0xFFFFFFFF, 0x1234, PAYLOAD, False) for s in seqs]


def median_us(run: Callable[[], float], repeats: int) -> float:
    run()  # warm-up: caches, allocator, first-use costs
    return statistics.median(run() for _ in range(repeats))


def bench_receive(packets: list[bytes], config: RtpSessionConfig) -> float:
    session = RtpSession(config, PEER, 0.0, random.Random(1))
    receive = session.receive_datagram
    pop = session.pop_frame
    peer = PEER
    now = 0.0
    start = time.perf_counter()
    for data in packets:
        receive(data, peer, now)
        pop(now)
        now += 0.02
    elapsed = time.perf_counter() - start
    session.events_received()
    return elapsed / len(packets) * 1e6


def bench_send(count: int) -> float:
    session = RtpSession(RtpSessionConfig(), PEER, 0.0, random.Random(1))
    send = session.send_frame
    drain = session.actions_to_send
    now = 0.0
    start = time.perf_counter()
    for n in range(count):
        send(PAYLOAD, 0, now, n)
        drain()
        now += 0.02
    return (time.perf_counter() - start) / count * 1e6


def bench_call(fn: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count * 1e6


def run(quick: bool) -> dict[str, float]:
    count = 5_000 if quick else 50_000
    repeats = 3 if quick else 9
    plain = inbound_packets(count)
    swapped = inbound_packets(count, swap_pairs=True)
    one = plain[7]
    return {
        "receive_and_pop": median_us(lambda: bench_receive(plain, RtpSessionConfig()), repeats),
        "receive_and_pop_latched": median_us(
            lambda: bench_receive(plain, RtpSessionConfig(latch=True)), repeats
        ),
        "receive_and_pop_reordered": median_us(
            lambda: bench_receive(swapped, RtpSessionConfig()), repeats
        ),
        "send_frame": median_us(lambda: bench_send(count), repeats),
        "parse_rtp_header": median_us(
            lambda: bench_call(lambda: parse_rtp_header(one), count), repeats
        ),
        "build_rtp": median_us(
            lambda: bench_call(lambda: build_rtp(0, 1, 160, 0x1234, PAYLOAD, False), count),
            repeats,
        ),
        "RtpPacket.parse": median_us(
            lambda: bench_call(lambda: RtpPacket.parse(one), count), repeats
        ),
    }


class _StubRunner:
    """Stands in for the call's ``CallRunner``: takes the inbound audio and does nothing."""

    frames = 0

    def caller_speech(self, frame: bytes) -> None:
        pass

    def caller_playout(self, frame: bytes) -> None:
        self.frames += 1

    def caller_dtmf(self, digit: str) -> None:
        pass

    def hangup(self, reason: str) -> None:
        pass


def _cpu_median_us(run: Callable[[], float], repeats: int) -> float:
    run()  # warm-up
    return statistics.median(run() for _ in range(repeats))


async def _sip_calls(n_calls: int, peer: socket.socket) -> tuple[list[Any], Any]:
    from bridge.config import parse_config
    from bridge.io.legs.sip_call import SO_TIMESTAMPNS, _SipCall
    from bridge.io.services import Services
    from bridge.io.ticker import MediaTicker
    from bridge.sip.sdp import NegotiatedAudio

    ticker = MediaTicker(asyncio.get_running_loop())
    config = parse_config(
        '[sip]\nrtp_timeout_s = 60\n[providers.p]\nprotocol = "kova"\n'
        'url = "ws://127.0.0.1:9/v1/ws/kova"\n[[routes]]\nmatch = "*"\nprovider = "p"\n',
        "bench_rtp.toml",
    )
    services = Services.standalone(config, ticker)
    calls = []
    for i in range(n_calls):
        call = _SipCall(services, None, f"call-{i}", 0)  # type: ignore[arg-type]
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp.setblocking(False)
        rtp.bind(("127.0.0.1", 0))
        if SO_TIMESTAMPNS is not None:  # as the leg binds it
            rtp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        rtcp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtcp.setblocking(False)
        rtcp.bind(("127.0.0.1", 0))
        await call.attach((rtp, rtcp))
        # the peer's packets are latched; ours go back to it (never read: the kernel drops them)
        call.start_media(NegotiatedAudio(0, "PCMU", 0, 101, peer.getsockname(), "sendrecv", 20))
        call.runner = _StubRunner()  # type: ignore[assignment]
        calls.append(call)
    return calls, ticker


def bench_sip_call_path(n_calls: int, frames: int, repeats: int) -> float:
    """CPU us per call per 20 ms: one inbound packet + one outbound frame through ``_SipCall``."""
    import uvloop

    async def main() -> float:
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        calls, ticker = await _sip_calls(n_calls, peer)
        # every arrival counts as within the last frame period: one recvmsg per call per tick,
        # as in the daemon's common tick (the kernel stamps are real time, the ticks are not)
        ticker.real_to_mono = 1e9
        addrs = [c.rtp_sock.getsockname() for c in calls]
        packets = [
            build_rtp(0, s & 0xFFFF, (s * 160) & 0xFFFFFFFF, 0x1234, PAYLOAD, s == 0)
            for s in range(frames * (repeats + 1))
        ]
        state = {"frame": 0}

        def run() -> float:
            first = state["frame"]
            now = 1.0 + first * 0.02
            elapsed = 0.0
            for k in range(first, first + frames):
                data = packets[k]
                for addr in addrs:
                    peer.sendto(data, addr)
                start = time.process_time()
                seconds = [call.send_frame(PAYLOAD, k, now) for call in calls]
                ticker.flush()
                thirds = [second(now) for second in seconds]
                for third in thirds:
                    third(now)
                elapsed += time.process_time() - start
                now += 0.02
            state["frame"] = first + frames
            return elapsed / frames / n_calls * 1e6

        result = _cpu_median_us(run, repeats - 1)
        for c in calls:
            c.close()
        peer.close()
        await asyncio.sleep(0.05)
        return result

    return uvloop.run(main())


class _SimLoop:
    """A loop whose clock the benchmark moves; ``call_at`` is the real uvloop one."""

    def __init__(self, real: asyncio.AbstractEventLoop) -> None:
        self.real = real
        self.now = 1000.0
        self.armed_for = 0.0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        self.armed_for = when
        return self.real.call_at(self.real.time() + 3600 + (when - self.now), callback)

    def call_soon(self, callback: Callable[[], None]) -> asyncio.Handle:
        return self.call_at(self.now, callback)


def bench_ticker(n_streams: int, ticks: int, repeats: int) -> float:
    """CPU us per stream per 20 ms tick of ``MediaTicker`` scheduling (callbacks do nothing)."""
    import uvloop

    from bridge.io.ticker import MediaTicker

    async def main() -> float:
        sim = _SimLoop(asyncio.get_running_loop())
        ticker = MediaTicker(sim, clock=sim.time)  # type: ignore[arg-type]
        sent = [0]

        def on_frame(n: int, now: float) -> None:
            sent[0] += 1

        for i in range(n_streams):
            ticker.add(f"s{i}", on_frame, lambda e: None)
            sim.now += 0.02 / n_streams  # calls arrive spread over the period

        def run() -> float:
            target = sent[0] + ticks * n_streams
            start = time.process_time()
            while sent[0] < target:
                handle = ticker._handle
                if handle is None:
                    raise RuntimeError("ticker not armed")
                handle.cancel()
                # as uvloop does: the timer rounded to the nearest whole ms T, fired 0.3 ms into it
                sim.now = max(sim.now, round(sim.armed_for * 1000) / 1000 + 0.0003)
                ticker._run()
            elapsed = time.process_time() - start
            return elapsed / ticks / n_streams * 1e6

        result = _cpu_median_us(run, repeats)
        ticker.close()
        return result

    return uvloop.run(main())


def run_shell(quick: bool) -> dict[str, float]:
    frames = 250 if quick else 1000
    repeats = 5 if quick else 9
    out: dict[str, float] = {}
    for n in SHELL_CALLS:
        out[f"sip_call_path_{n}"] = bench_sip_call_path(n, frames, repeats)
        out[f"ticker_{n}"] = bench_ticker(n, frames, repeats)
    return out


def machine_info() -> dict[str, Any]:
    """The shared machine/commit record (bench/common.py)."""
    return machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer packets and repetitions")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rtp.json")
    args = parser.parse_args()

    timings = run(args.quick)
    shell = run_shell(args.quick)
    per_call_us = PACKETS_PER_S * (timings["receive_and_pop"] + timings["send_frame"])
    report = {
        "benchmark": "rtp",
        "quick": args.quick,
        "machine": machine_info(),
        "us_per_packet": timings,
        "us_per_call_per_second": per_call_us,
        "calls_per_core_rtp_only": 1e6 / per_call_us,
        "cpu_us_per_call_per_20ms": shell,
    }
    print(f"{'operation':28s} {'us / packet':>12s}")
    for name, us in timings.items():
        print(f"{name:28s} {us:12.3f}")
    print(
        f"\nRTP engine per call: {per_call_us:.0f} us per second of call "
        f"-> {report['calls_per_core_rtp_only']:.0f} calls per core (RTP engine only)"
    )
    print(f"\n{'shell path (CPU)':28s} {'us / call / 20 ms':>18s}")
    for name, us in shell.items():
        print(f"{name:28s} {us:18.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""CPU of the call side per call per 20 ms: a real ``CallBridge`` driven by a fixed script.

No sockets, no loop, no clock reads inside the engine: N ``CallBridge``
objects are driven through their public methods with plain ``now`` numbers,
interleaved as the daemon interleaves them (every call's caller frame, then
every call's tick, each 20 ms step), and the CPU time of each phase is taken
with ``time.process_time_ns`` around the whole loop over the N calls (two
clock reads per phase and step, not per call).

Script per call (the same for every call, phases offset by nothing):

* t = 0: ``Say`` (final) opens a turn; the provider then sends a 15 s turn
  in 100 ms chunks, one chunk every 2 ticks (2.5 x real time, as a fast
  provider does), then ``TurnDone``; audio at mu-law 8 kHz (pass-through) or
  PCM 24 kHz (resampled and encoded);
* every 20 ms: one caller frame of quiet noise (-60 dBFS white noise,
  mu-law; the VAD and the detector run, nothing triggers), then ``tick``;
  ``--caller silent``: digital silence instead (every sample 0: a muted
  phone; the VAD is skipped once it is at rest, ``bridge.media.vad``);
* the script runs until the turn is reported (15 s + a few frames).
* Twilio-style legs (marks): every ``SendMark`` is echoed back at the next
  step (counted in the tick phase).

After every call, the shell's drain is done as the shell does it
(``bridge/io/callrun.py``: ``actions_to_send`` and ``events_received`` only
when ``has_output()`` says there is something), inside the measured phase.
``--drain always`` drains after every call regardless (what this bench did
before 2026-11-30: two calls and two new lists per call and phase that the
daemon does not pay).

Printed: CPU µs per call per 20 ms, split into tick / caller_audio /
provider (``provider_event``) and their sum, the median over ``--reps``
repetitions, for each leg x provider format, with and without the echo
correlator (``BargeInPolicy.echo_correlation`` 0 switches it off). The
figures are CPU time, so they are meaningful on a loaded machine; they
still include cache effects of whatever else runs.

    .venv/bin/python -m bench.bench_call               # 100 calls, 5 reps
    .venv/bin/python -m bench.bench_call --profile     # cProfile of one run
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

import numpy as np

from bench import common
from bridge.commands import Say
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import LegProfile, SendMark
from bridge.providers.base import AudioFormat, AudioReceived, TurnDone
from telcodec import g711

FRAME_S = 0.020
TURN_S = 15.0
CHUNK_MS = 100
CHUNK_EVERY_TICKS = 2
LEGS = {
    "sip": LegProfile(kind="sip", codec="mulaw", sample_rate_hz=8000, heard_from="frames"),
    "twilio": LegProfile(
        kind="twilio",
        codec="mulaw",
        sample_rate_hz=8000,
        heard_from="marks",
        can_clear=True,
        mark_interval_ms=200,
    ),
}
FORMATS = {"mulaw8k": AudioFormat("mulaw", 8000), "pcm24k": AudioFormat("pcm_s16le", 24000)}


def bot_audio(audio_format: AudioFormat) -> bytes:
    """15 s of a speech-like signal (harmonics, 4 Hz envelope) in the provider's format."""
    rate = audio_format.sample_rate_hz
    t = np.arange(int(TURN_S * rate)) / rate
    sig = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 12))
    sig = sig * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    pcm = (sig / np.max(np.abs(sig)) * 0.3 * 32767).astype("<i2").tobytes()
    return g711.ulaw_encode(pcm) if audio_format.encoding == "mulaw" else pcm


def caller_frames(count: int = 250, silent: bool = False) -> list[bytes]:
    if silent:
        return [g711.ulaw_encode(bytes(320))] * count
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 32768 * 10 ** (-60 / 20), count * 160)
    pcm = np.clip(noise, -32768, 32767).astype("<i2").tobytes()
    ulaw = g711.ulaw_encode(pcm)
    return [ulaw[i * 160 : (i + 1) * 160] for i in range(count)]


def run_once(
    leg_name: str,
    fmt_name: str,
    calls: int,
    echo: bool,
    drain_always: bool = False,
    silent: bool = False,
) -> dict[str, float]:
    leg = LEGS[leg_name]
    audio_format = FORMATS[fmt_name]
    audio = bot_audio(audio_format)
    chunk_bytes = audio_format.sample_rate_hz * audio_format.bytes_per_sample * CHUNK_MS // 1000
    chunks = [audio[i : i + chunk_bytes] for i in range(0, len(audio), chunk_bytes)]
    inbound = caller_frames(silent=silent)
    policy = BargeInPolicy(echo_correlation=0.7 if echo else 0.0)
    bridges = [CallBridge(f"call-{i}", leg, policy, 0.0) for i in range(calls)]
    echoes: list[list[str]] = [[] for _ in range(calls)]
    ns = {"tick": 0, "caller_audio": 0, "provider": 0}
    clock = time.process_time_ns
    t0 = clock()
    for bridge in bridges:
        bridge.execute(Say("t1", "fifteen seconds of speech", final=True), 0.0)
        if drain_always or bridge.has_output():
            bridge.actions_to_send()
            bridge.events_received()
    ns["provider"] += clock() - t0
    steps = int(TURN_S / FRAME_S) + 50
    done_at = len(chunks) * CHUNK_EVERY_TICKS
    for n in range(steps):
        now = round(n * FRAME_S, 9)
        if n % CHUNK_EVERY_TICKS == 0 and n <= done_at:
            k = n // CHUNK_EVERY_TICKS
            event = AudioReceived("t1", chunks[k], audio_format) if k < len(chunks) else None
            t0 = clock()
            for bridge in bridges:
                bridge.provider_event(event if event is not None else TurnDone("t1"), now)
                if drain_always or bridge.has_output():
                    bridge.actions_to_send()
                    bridge.events_received()
            ns["provider"] += clock() - t0
        frame = inbound[n % len(inbound)]
        t0 = clock()
        for bridge in bridges:
            bridge.caller_audio(frame, now)
            if drain_always or bridge.has_output():
                bridge.actions_to_send()
                bridge.events_received()
        ns["caller_audio"] += clock() - t0
        t0 = clock()
        for i, bridge in enumerate(bridges):
            pending = echoes[i]
            if pending:
                for name in pending:
                    bridge.mark_echoed(name, False, now)
                pending.clear()
            bridge.tick(now)
            if bridge.feed_due():  # as the daemon's shell: the look-ahead after the send
                bridge.feed(now)
            if drain_always or bridge.has_output():
                for action in bridge.actions_to_send():
                    if type(action) is SendMark:
                        pending.append(action.name)
                bridge.events_received()
        ns["tick"] += clock() - t0
    for bridge in bridges:
        assert bridge.stats().turns_finished == 1, bridge.stats()
    per = calls * steps
    figures = {k: v / 1000 / per for k, v in ns.items()}
    figures["total"] = sum(figures.values())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--legs", default="sip,twilio")
    parser.add_argument("--formats", default="mulaw8k,pcm24k")
    parser.add_argument("--echo", default="on,off", help="on, off or on,off")
    parser.add_argument(
        "--drain",
        choices=("shell", "always"),
        default="shell",
        help="drain after a call only when has_output() (as the shell does), or always",
    )
    parser.add_argument(
        "--caller",
        choices=("noise", "silent"),
        default="noise",
        help="the caller's frames: -60 dBFS white noise, or digital silence",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one run per case")
    parser.add_argument("--name", default="call_cpu", help="results file name (bench/results)")
    parser.add_argument("--quick", action="store_true", help="make bench-quick: 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.reps = min(args.reps, 3)
    results: dict[str, Any] = {}
    drain_always = args.drain == "always"
    silent = args.caller == "silent"
    print(f"CPU µs per call per 20 ms ({args.calls} calls, median of {args.reps})")
    print(f"{'case':28} {'tick':>7} {'caller':>7} {'provider':>8} {'total':>7}")
    for leg_name in args.legs.split(","):
        for fmt_name in args.formats.split(","):
            for echo_s in args.echo.split(","):
                echo = echo_s == "on"
                case = f"{leg_name}/{fmt_name}/echo-{echo_s}"
                if args.profile:
                    prof = cProfile.Profile()
                    prof.runcall(
                        run_once, leg_name, fmt_name, args.calls, echo, drain_always, silent
                    )
                    print(f"== {case}")
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                    continue
                reps = [
                    run_once(leg_name, fmt_name, args.calls, echo, drain_always, silent)
                    for _ in range(args.reps)
                ]
                med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
                results[case] = {
                    "median_us": {k: round(v, 2) for k, v in med.items()},
                    "reps_total_us": [round(r["total"], 2) for r in reps],
                }
                print(
                    f"{case:28} {med['tick']:7.2f} {med['caller_audio']:7.2f}"
                    f" {med['provider']:8.2f} {med['total']:7.2f}"
                )
    if results:
        settings = {
            "calls": args.calls,
            "reps": args.reps,
            "turn_s": TURN_S,
            "chunk_ms": CHUNK_MS,
            "chunk_every_ticks": CHUNK_EVERY_TICKS,
            "caller": "digital silence" if silent else "white noise -60 dBFS, mu-law",
            "drain": args.drain,
        }
        path = common.write(args.name, results, settings)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

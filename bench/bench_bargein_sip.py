"""Barge-in through the SIP leg's inbound path: where the time goes, and the fix (issue 34).

``bench_bargein.py``'s engine figure (a) feeds the call each caller frame the
moment its last sample exists and ticks after it: no jitter buffer, and the
decision always lands before the tick that stops the bot. A SIP call does
neither. This bench runs the same onset and false sets through the SIP leg's
own per-tick code, with simulated time:

* the caller's 20 ms frames are RTP packets that arrive ``net_ms`` after their
  last sample, at a random phase ``phi`` against the call's tick grid (the
  phone's clock is not ours);
* at each tick (``now = k * 20 ms``) the shell's order: the call's frame goes
  out first (``CallBridge.tick``), then the packets that have arrived are read
  and ``_SipCall._process`` runs: the real RTP engine, jitter buffer (depth 3)
  and the detector's feed;
* the bot stops at the first tick that sends none of its audio after the
  decision; latency = that tick - the true onset (``phi + onset_s``).

Two feeds of the detector, the same frames otherwise:

* ``jitter``: the path before issue 34: one frame per tick out of the jitter
  buffer (``caller_playout`` handed to ``CallBridge.caller_audio``), silence
  when it has none, also before the caller's first packet;
* ``jitter_started``: the same, but no silence before the buffer's first frame
  (that silence started the detector's noise floor far below a loud line:
  babble from the first frame then read as a rise, a false barge-in);
* ``arrival``: what the SIP call does now: every frame on the tick that reads
  it (``caller_speech``), the buffer's stream for playout only, silence only
  once the caller has sent;
* ``arrival_before_send``: a model of what the shell does not do: the same
  feed, but each tick's read and work run before its frame is built (as a
  read on arrival would), so a decision stops the frame of that very tick.
  The difference to ``arrival`` is what the tick order still costs.

And two networks: ``steady`` (every packet ``net_ms`` = 1 ms after its frame)
and ``jittery`` (1-11 ms, uniform, seeded). The false set (bot echo, babble,
clicks, noise; 10-s clips while the bot talks) through the same path counts
clips with any trigger. No clock, no sleeps: the figures are deterministic
for a seed.

    python -m bench.bench_bargein_sip [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_bargein import (
    FRAME,
    FRAME_S,
    RATE_HZ,
    SIP_LEG,
    Clip,
    Onset,
    Signal,
    Thresholds,
    Voices,
    decode_ulaw,
    false_set,
    measure_onsets,
    onset_set,
    piper_bot_audio,
    tone_bot_audio,
    ulaw_bytes,
)
from bench.common import pct, write
from bridge.commands import Say
from bridge.config import parse_config
from bridge.io.legs.sip_call import _SipCall
from bridge.io.services import Services
from bridge.io.ticker import MediaTicker
from bridge.logs import configure
from bridge.media.call import CallBridge
from bridge.providers.base import MULAW_8K, AudioReceived
from bridge.rtp.packet import build_rtp
from bridge.sip.sdp import NegotiatedAudio

HERE = Path(__file__).resolve().parent

CONFIG = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""
PEER = ("127.0.0.1", 40000)
FEEDS = ("jitter", "jitter_started", "arrival", "arrival_before_send")
NETWORKS = {"steady": (1.0, 1.0), "jittery": (1.0, 11.0)}
"""Arrival after the frame's last sample, ms: (low, high), uniform."""


class _Runner:
    """The call's ``CallRunner`` as far as the SIP call's inbound path goes: hands the
    frames to the ``CallBridge`` at the tick's ``now``, per ``feed``."""

    def __init__(self, call: CallBridge, feed: str, leg: _SipCall) -> None:
        self.call = call
        self.feed = feed
        self.leg = leg
        self.now = 0.0
        self.played = False

    def caller_speech(self, frame: bytes) -> None:
        if self.feed.startswith("arrival"):
            self.call.caller_speech(frame, self.now)

    def caller_playout(self, frame: bytes) -> None:
        if self.feed.startswith("arrival"):
            self.call.caller_playout(frame, self.now)
        else:  # before issue 34: the detector heard the jitter buffer's output
            if frame is not self.leg.silence:  # (the leg's own object: nothing was played)
                self.played = True
            if self.feed == "jitter" or self.played:
                self.call.caller_audio(frame, self.now)

    def caller_dtmf(self, digit: str) -> None:
        self.call.caller_dtmf(digit, self.now)

    def hangup(self, reason: str) -> None:
        pass

    def leg_ended(self, reason: str) -> None:
        pass


def run_sip(
    services: Services,
    caller: Signal,
    bot: Signal,
    th: Thresholds,
    feed: str,
    phi_s: float,
    net_ms: tuple[float, float],
    rng: np.random.Generator,
    echo_db: float | None = None,
    echo_delay_ms: int = 0,
) -> list[tuple[float, float]]:
    """One trial through ``_SipCall._process``; (decision, stop) of every speech barge-in,
    on the call's timeline (the caller's sample ``i`` happens at ``phi_s + i / 8000``)."""
    leg = _SipCall(services, None, "bench", PEER[1])  # type: ignore[arg-type]
    leg.start_media(NegotiatedAudio(0, "PCMU", 0, 101, PEER, "sendrecv", 20))
    t0 = leg.loop.time()  # the RTP session's clock started here: trial times are offsets
    call = CallBridge("bench", SIP_LEG, th.policy(), t0)
    runner = _Runner(call, feed, leg)
    leg.runner = runner
    bot_ulaw = ulaw_bytes(bot)
    steps = len(caller) // FRAME
    sent = np.zeros(len(caller) + FRAME * 8)
    gain = 0.0 if echo_db is None else 10 ** (-echo_db / 20)
    delay_s = echo_delay_ms / 1000
    # frame n leaves the phone when its last sample has happened, and arrives net_ms later
    arrivals = [
        phi_s + (n + 1) * FRAME_S + float(rng.uniform(*net_ms)) / 1000 for n in range(steps)
    ]
    turn, bot_pos, cuts, next_frame = 0, 0, 0, 0
    pending: float | None = None
    out: list[tuple[float, float]] = []

    def start_turn(now: float) -> None:
        nonlocal turn
        turn += 1
        call.execute(Say(f"t{turn}", "bot"), t0 + now)
        call.provider_event(
            AudioReceived(f"t{turn}", bot_ulaw[bot_pos * FRAME :], MULAW_8K), t0 + now
        )
        call.actions_to_send()
        call.events_received()

    def caller_frame(n: int) -> bytes:
        frame = caller[n * FRAME : (n + 1) * FRAME]
        if gain:  # the bot's own audio back: what was sent delay_s before each sample
            times = phi_s + (n * FRAME + np.arange(FRAME)) / RATE_HZ - delay_s
            idx = np.floor(times * RATE_HZ).astype(np.int64)
            echo = np.where(idx >= 0, sent[np.clip(idx, 0, None)], 0.0)
            frame = frame + gain * echo
        return ulaw_bytes(frame)

    def outbound(k: int, now: float) -> None:
        nonlocal bot_pos, pending
        payload = call.tick(t0 + now)
        call.actions_to_send()
        call.events_received()
        if payload is not None:
            sent[k * FRAME : (k + 1) * FRAME] = decode_ulaw(payload)
            bot_pos += 1
        elif pending is not None:
            out.append((pending, now))
            pending = None
            start_turn(now)

    def inbound(now: float) -> None:
        nonlocal next_frame, cuts, pending
        got: list[tuple[float, int]] = []  # every packet that has arrived, in arrival order
        while next_frame < steps and arrivals[next_frame] <= now:
            got.append((arrivals[next_frame], next_frame))
            next_frame += 1
        got.sort()
        for i, (at_s, n) in enumerate(got):
            data = build_rtp(0, n + 1, n * FRAME, 0x1234, caller_frame(n), False)
            if i == 0:
                leg._rx_data, leg._rx_addr, leg._rx_at = data, PEER, t0 + at_s
            else:
                leg._rx.append((data, PEER, t0 + at_s))
        runner.now = t0 + now
        leg._process(t0 + now)
        call.actions_to_send()
        call.events_received()
        timings = call.stats().bargein_timings
        if len(timings) > cuts:
            cuts = len(timings)
            pending = timings[-1].decided_s - t0

    start_turn(0.0)
    k = 0
    # after the last packet: ticks enough for the buffer to play it and a stop to show
    while next_frame < steps or k * FRAME_S <= arrivals[-1] + 4 * FRAME_S:
        now = round(k * FRAME_S, 9)
        if feed == "arrival_before_send":  # a model only: the tick's read ahead of its frame
            inbound(now)
            outbound(k, now)
        else:  # the shell's order: the frame goes out first, then the tick's read
            outbound(k, now)
            inbound(now)
        k += 1
    return out


def _summary(lat_s: list[float], missed: int, early: int, n: int) -> dict[str, Any]:
    ms = [v * 1000 for v in lat_s]
    return {
        "n": n,
        "detected": len(ms),
        "missed": missed,
        "early_false_triggers": early,
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p95_ms": round(pct(ms, 95), 1) if ms else None,
        "max_ms": round(max(ms), 1) if ms else None,
    }


def measure(
    services: Services,
    onsets: list[Onset],
    clips: list[Clip],
    bots: dict[str, Signal],
    feed: str,
    net_ms: tuple[float, float],
    seed: int,
) -> dict[str, Any]:
    th = Thresholds.defaults()
    rng = np.random.default_rng(seed)
    lat: list[float] = []
    missed = early = 0
    for o in onsets:
        phi = float(rng.uniform(0, FRAME_S))
        stops = run_sip(
            services, o.caller, bots["piper"][: len(o.caller) + FRAME], th, feed, phi, net_ms, rng
        )
        onset = phi + o.onset_s
        early += sum(1 for d, _ in stops if d < onset)
        after = [s - onset for d, s in stops if d >= onset]
        if after:
            lat.append(after[0])
        else:
            missed += 1
    with_trigger: list[str] = []
    for c in clips:
        phi = float(rng.uniform(0, FRAME_S))
        bot = bots[c.bot][: len(c.caller) + FRAME]
        stops = run_sip(
            services, c.caller, bot, th, feed, phi, net_ms, rng, c.echo_db, c.echo_delay_ms
        )
        if stops:
            with_trigger.append(f"{c.name}: {len(stops)}")
    return {
        "onsets": _summary(lat, missed, early, len(onsets)),
        "false": {
            "clips": len(clips),
            "clips_with_trigger": len(with_trigger),
            "false_pct": round(100 * len(with_trigger) / len(clips), 2),
            "triggered": with_trigger,
        },
    }


async def run_all(
    onsets: list[Onset], clips: list[Clip], bots: dict[str, Signal], seed: int
) -> dict[str, Any]:
    services = Services.standalone(
        parse_config(CONFIG, "bench.toml"), MediaTicker(asyncio.get_running_loop())
    )
    figures: dict[str, Any] = {}
    for net, span in NETWORKS.items():
        for feed in FEEDS:
            fig = measure(services, onsets, clips, bots, feed, span, seed)
            figures[f"{net}_{feed}"] = fig
            a, f = fig["onsets"], fig["false"]
            print(
                f"{net:8} {feed:8} p50 {a['p50_ms']} p95 {a['p95_ms']} max {a['max_ms']} "
                f"missed {a['missed']}/{a['n']} early {a['early_false_triggers']} | "
                f"false {f['clips_with_trigger']}/{f['clips']}",
                flush=True,
            )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=1, help="onset set seed (false set: seed + 1)")
    ap.add_argument("--name", default="", help="results file name (default: bargein_sip[_quick])")
    args = ap.parse_args()
    configure("warning", "json")  # a line per trial's RTP latch would drown the figures
    voices = Voices()
    onsets = onset_set(voices, args.quick, args.seed)
    clips = false_set(voices, args.quick, args.seed + 1)
    bots = {"piper": piper_bot_audio(voices, 12.0), "tone": tone_bot_audio(12.0)}
    print(f"onset set: {len(onsets)} trials; false set: {len(clips)} clips of 10 s", flush=True)
    engine = measure_onsets(onsets, bots["piper"], Thresholds.defaults())["all"].summary()
    print(
        f"engine (bench_bargein (a): no jitter buffer, decision before the tick): "
        f"p50 {engine['p50_ms']} p95 {engine['p95_ms']} max {engine['max_ms']}",
        flush=True,
    )
    figures: dict[str, Any] = {"engine_reference": engine}
    figures.update(asyncio.run(run_all(onsets, clips, bots, args.seed + 10)))
    settings = {
        "quick": args.quick,
        "seed": args.seed,
        "defaults": Thresholds.defaults().__dict__,
        "jitter_depth_frames": 3,
        "networks_ms": NETWORKS,
        "feeds": FEEDS,
        "onset_trials": len(onsets),
        "false_clips": len(clips),
    }
    name = args.name or ("bargein_sip_quick" if args.quick else "bargein_sip")
    print("wrote", write(name, figures, settings))


if __name__ == "__main__":
    main()

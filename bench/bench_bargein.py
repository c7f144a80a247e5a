"""Barge-in: caller speech onset -> bot audio stopped, and false barge-ins (issue 8, item 5).

What is measured, with the daemon's default thresholds (``bridge.media.bargein.BargeInPolicy``):

* **Onset set.** Short interruptions ("Wait, stop.", ...) spoken by Piper
  (``joe``) and by espeak-ng (two voices), scaled to an active speech level of
  -10, -20 and -30 dBFS, over white or pink line noise at -50 and -40 dBFS,
  placed at a random sub-frame phase. The true onset is the first 5 ms block of
  the clean utterance within 20 dB of its active level.
* **(a) Engine.** A ``CallBridge`` (SIP leg, mu-law) plays a Piper turn; the
  caller's audio is fed as 20 ms frames with ``now`` advancing in 20 ms steps
  (a frame is fed when its last sample has arrived, then the call ticks). The
  stop time is the first tick at or after the decision that sends no bot
  frame. Latency = stop time - true onset. No clock, no sleeps: deterministic.
* **(b) End to end.** The real daemon in-process (``tests/e2e/harness.py``)
  against ``ttsd`` with the ``tone`` engine, a Twilio media stream over a real
  loopback WebSocket driven by the carrier emulator; each caller frame is sent
  when its last sample has "happened". Latency = ``clear`` received - true
  onset; the bot's media is checked to stop there.
* **Double talk.** The onset set again with the bot's own audio (Piper) coming
  back 20 dB and 10 dB down with 40 ms delay: the caller starts over the echo.
* **False barge-ins.** 10-s clips while the bot talks: the bot's own audio
  (what the call actually sent, Piper or tone) returned at 10-25 dB below with
  20-60 ms delay, babble (Piper and espeak talkers summed at -40/-35 dBFS),
  clicks, plain line noise. A clip with any trigger is a false barge-in; after
  a trigger the bot resumes so later triggers are counted too.
* **Grid.** If the defaults miss a goal (p95 <= 150 ms, <= 2 % false), a grid
  of ``min_speech_ms``, ``energy_floor_dbfs``, ``echo_return_loss_db`` and VAD
  aggressiveness on the engine level.

    python -m bench.bench_bargein [--quick] [--no-e2e] [--no-grid] [--seed N]

``--seed`` regenerates both sets (noise, phases, babble mixes) from another
seed: a threshold tuned on the default seed (1) is reported on another one too.

Generated audio is cached under ``bench/data/cache/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import statistics
import subprocess
import tempfile
import wave
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr

from bench.common import pct, write
from bridge.commands import Say
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import LegProfile
from bridge.providers.base import MULAW_8K, AudioReceived
from telcodec import g711

HERE = Path(__file__).resolve().parent

Signal = npt.NDArray[np.float64]
"""Mono audio at 8 kHz in int16 units (full scale 32768), as float."""

RATE_HZ = 8000
FRAME = 160
FRAME_S = 0.020
CACHE = HERE / "data" / "cache"
GOAL_P95_MS = 150.0
GOAL_FALSE_PCT = 2.0

TEXTS = (
    "Wait, stop.",
    "Hello? Can you hear me?",
    "No, that is not right.",
    "Excuse me, I have a question.",
    "Yes, okay.",
    "Sorry, can you repeat that?",
)
ESPEAK_VOICES = ("en-us", "en-gb+f3")
BOT_TEXT = (
    "Thank you for calling. Your call is important to us. "
    "Please listen carefully, as our menu options have recently changed. "
    "For billing questions, press one. For technical support, press two. "
    "To hear these options again, stay on the line. "
    "You can also visit our website at any time of the day or night."
)
BABBLE_TEXTS = (
    "I went to the market on Saturday and the prices were higher than last week.",
    "The meeting has been moved to Thursday afternoon, after lunch.",
    "She said the train was late again, so we waited for almost an hour.",
    "Could you pass me the salt and the pepper, please?",
    "We should really repaint the kitchen before the winter comes.",
    "Nobody told me the shop closes early on public holidays.",
)
LEVELS_DBFS = (-10.0, -20.0, -30.0)
DOUBLE_TALK_ECHO_DB = (20.0, 10.0)
"""Double talk: the onsets again, with the bot's own audio returned this far down."""
DOUBLE_TALK_DELAY_MS = 40
NOISES = (("white", -50.0), ("pink", -50.0), ("white", -40.0), ("pink", -40.0))
QUIET_LINES = (("white", -70.0), ("pink", -60.0), ("silent", 0.0))
"""Quiet lines (far below the energy floor) and a digital-silence line (every sample
0): the onsets again over them, and false-set clips of them (with and without the
bot's echo). Drawn from their own generator (seed + 100) after the other trials,
so adding them changed none of the others."""
SIP_LEG = LegProfile(kind="sip", codec="mulaw", sample_rate_hz=RATE_HZ, heard_from="frames")


# ----------------------------------------------------------------- audio corpus


def _read_wav(path: Path) -> tuple[npt.NDArray[np.int16], int]:
    with wave.open(str(path), "rb") as w:
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        if w.getnchannels() > 1:
            data = data[:: w.getnchannels()]
    return data, rate


def _write_wav(path: Path, pcm: npt.NDArray[np.int16], rate_hz: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate_hz)
        w.writeframes(pcm.astype("<i2").tobytes())


def _cached(key: str) -> Path:
    return CACHE / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.wav"


def _to_8k(pcm: npt.NDArray[np.int16], rate_hz: int) -> Signal:
    x = pcm.astype(np.float64)
    if rate_hz == RATE_HZ:
        return x
    return np.asarray(soxr.resample(x, rate_hz, RATE_HZ, quality="VHQ"), dtype=np.float64)


class Voices:
    """Piper and espeak-ng utterances at 8 kHz, synthesised once and cached as WAV."""

    def __init__(self) -> None:
        self._piper: Any = None

    def piper(self, text: str, speed: float = 1.0) -> Signal:
        path = _cached(f"piper|{speed}|{text}")
        if not path.exists():
            if self._piper is None:
                from bridge.ttsd.piper_engine import PiperEngine

                self._piper = PiperEngine()
            chunks = self._piper.synthesize(text, "joe", speed)
            pcm = np.frombuffer(b"".join(c.pcm for c in chunks), "<i2")
            _write_wav(
                path, np.round(_to_8k(pcm, self._piper.native_rate_hz)).astype(np.int16), RATE_HZ
            )
        data, rate = _read_wav(path)
        return _to_8k(data, rate)

    def espeak(self, text: str, voice: str) -> Signal:
        path = _cached(f"espeak|{voice}|{text}")
        if not path.exists():
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "e.wav"
                subprocess.run(["espeak-ng", "-v", voice, "-w", str(raw), text], check=True)
                data, rate = _read_wav(raw)
            _write_wav(path, np.round(_to_8k(data, rate)).astype(np.int16), RATE_HZ)
        data, rate = _read_wav(path)
        return _to_8k(data, rate)


def block_dbfs(x: Signal, block: int) -> Signal:
    n = len(x) // block
    rms = np.sqrt(np.mean(x[: n * block].reshape(n, block) ** 2, axis=1))
    return np.asarray(20 * np.log10(np.maximum(rms, 1e-3) / 32768.0), dtype=np.float64)


def active_level_dbfs(x: Signal) -> float:
    """RMS over the 10 ms blocks within 25 dB of the loudest (a simple P.56 stand-in)."""
    db = block_dbfs(x, 80)
    blocks = x[: len(db) * 80].reshape(len(db), 80)[db >= db.max() - 25.0]
    return float(20 * np.log10(np.sqrt(np.mean(blocks**2)) / 32768.0))


def scale_to(x: Signal, level_dbfs: float) -> Signal:
    return x * 10 ** ((level_dbfs - active_level_dbfs(x)) / 20)


def onset_index(x: Signal) -> int:
    """First sample of the first 5 ms block within 20 dB of the active level."""
    db = block_dbfs(x, 40)
    return int(np.argmax(db >= active_level_dbfs(x) - 20.0)) * 40


def noise(kind: str, n: int, level_dbfs: float, rng: np.random.Generator) -> Signal:
    if kind == "silent":  # a digital-silence line: every sample 0, nothing drawn
        return np.zeros(n)
    w = rng.standard_normal(n)
    if kind == "pink":
        spectrum = np.fft.rfft(w)
        f = np.arange(len(spectrum), dtype=np.float64)
        f[0] = 1.0
        w = np.fft.irfft(spectrum / np.sqrt(f), n)
    w = w / np.sqrt(np.mean(w**2))
    return np.asarray(w * 32768.0 * 10 ** (level_dbfs / 20), dtype=np.float64)


def clicks(n: int, per_s: float, level_dbfs: float, rng: np.random.Generator) -> Signal:
    """Impulses (a 1-3 ms decaying burst each) at random times, peak at ``level_dbfs``."""
    out = np.zeros(n)
    peak = 32767.0 * 10 ** (level_dbfs / 20)
    for at in rng.integers(0, n - 40, int(per_s * n / RATE_HZ)):
        length = int(rng.integers(8, 24))
        burst = peak * np.exp(-np.arange(length) / (length / 4)) * rng.choice([-1.0, 1.0], length)
        out[at : at + length] += burst
    return out


def ulaw_bytes(x: Signal) -> bytes:
    pcm = np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()
    return g711.ulaw_encode(pcm)


def decode_ulaw(data: bytes) -> Signal:
    return np.frombuffer(g711.ulaw_decode(data), "<i2").astype(np.float64)


@dataclass(frozen=True)
class Onset:
    """One caller interruption: speech over line noise, its true onset."""

    name: str
    source: str
    level_dbfs: float
    noise: str
    caller: Signal
    onset_s: float


def onset_set(voices: Voices, quick: bool, seed: int = 1) -> list[Onset]:
    rng = np.random.default_rng(seed)
    texts = TEXTS[:3] if quick else TEXTS
    noises = NOISES[:2] if quick else NOISES
    speech: list[tuple[str, str, Signal]] = []
    for text in texts:
        speech.append(("piper", text, voices.piper(text)))
        for v in ESPEAK_VOICES:
            speech.append((f"espeak:{v}", text, voices.espeak(text, v)))
    out = [
        _onset(source, text, clean, level, kind, noise_dbfs, rng)
        for (source, text, clean), level, (kind, noise_dbfs) in itertools.product(
            speech, LEVELS_DBFS, noises
        )
    ]
    quiet_rng = np.random.default_rng(seed + 100)
    for (source, text, clean), level, (kind, noise_dbfs) in itertools.product(
        speech, LEVELS_DBFS, QUIET_LINES
    ):
        out.append(_onset(source, text, clean, level, kind, noise_dbfs, quiet_rng))
    return out


def _onset(
    source: str,
    text: str,
    clean: Signal,
    level: float,
    kind: str,
    noise_dbfs: float,
    rng: np.random.Generator,
) -> Onset:
    """One trial: ``clean`` at ``level`` over a line of ``kind`` at ``noise_dbfs``."""
    x = scale_to(clean, level)
    start = onset_index(x)
    onset_s = 1.0 + float(rng.uniform(0, FRAME_S))
    at = round(onset_s * RATE_HZ) - start
    total = round((onset_s + 1.6) * RATE_HZ)
    caller = noise(kind, total, noise_dbfs, rng)
    seg = x[: total - at]
    caller[at : at + len(seg)] += seg
    line = "silent" if kind == "silent" else f"{kind}{noise_dbfs:g}"
    return Onset(
        f"{source}|{text}|{level:g}|{line}",
        source,
        level,
        line,
        caller,
        at / RATE_HZ + start / RATE_HZ,
    )


@dataclass(frozen=True)
class Clip:
    """A 10-s stretch of caller audio with no caller speech, while the bot talks."""

    name: str
    kind: str
    caller: Signal
    bot: str
    """``piper`` or ``tone``: what the bot says."""
    echo_db: float | None = None
    """Attenuation of the bot's own audio returned inbound (``None``: no echo)."""
    echo_delay_ms: int = 0


def tone_bot_audio(seconds: float) -> Signal:
    """The ``tone`` engine's rendering of the bot text, at 8 kHz."""
    from bridge.ttsd.synth import ToneEngine

    eng = ToneEngine(RATE_HZ)
    pcm = b"".join(c.pcm for c in eng.synthesize(BOT_TEXT, "tone"))
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    return np.tile(x, int(np.ceil(seconds * RATE_HZ / len(x))))[: round(seconds * RATE_HZ)]


def piper_bot_audio(voices: Voices, seconds: float) -> Signal:
    x = voices.piper(BOT_TEXT)
    return np.tile(x, int(np.ceil(seconds * RATE_HZ / len(x))))[: round(seconds * RATE_HZ)]


def false_set(voices: Voices, quick: bool, seed: int = 2) -> list[Clip]:
    rng = np.random.default_rng(seed)
    n = 10 * RATE_HZ
    clips: list[Clip] = []
    delays = (20, 60) if quick else (20, 40, 60)
    for bot, erl, delay in itertools.product(("piper", "tone"), (10.0, 15.0, 20.0, 25.0), delays):
        clips.append(
            Clip(
                f"echo|{bot}|{erl:g}dB|{delay}ms",
                "echo",
                noise("white", n, -50, rng),
                bot,
                erl,
                delay,
            )
        )
    talkers = [voices.piper(t, s) for t, s in zip(BABBLE_TEXTS, (0.85, 1.0, 1.15) * 2, strict=True)]
    talkers += [voices.espeak(t, v) for t in BABBLE_TEXTS[:3] for v in ESPEAK_VOICES]
    for level, rep in itertools.product((-40.0, -35.0), range(1 if quick else 3)):
        mix = noise("pink", n, -50, rng)
        for _ in range(6):
            t = talkers[int(rng.integers(len(talkers)))]
            t = np.tile(t, int(np.ceil(n / len(t))) + 1)
            start = int(rng.integers(0, len(t) - n))
            mix += scale_to(t[start : start + n], level - 10 * np.log10(6))
        clips.append(Clip(f"babble|{level:g}dBFS|{rep}", "babble", mix, "piper"))
    for per_s, level in itertools.product((1.0, 5.0), (-6.0, -20.0)):
        caller = noise("white", n, -50, rng) + clicks(n, per_s, level, rng)
        clips.append(Clip(f"clicks|{per_s:g}/s|{level:g}dBFS", "clicks", caller, "piper"))
    for kind in ("white", "pink"):
        clips.append(Clip(f"noise|{kind}-40", "noise", noise(kind, n, -40, rng), "piper"))
    quiet_rng = np.random.default_rng(seed + 100)
    for (kind, level), bot in itertools.product(QUIET_LINES, ("piper", "tone")):
        line = "silent" if kind == "silent" else f"{kind}{level:g}"
        quiet = noise(kind, n, level, quiet_rng)
        clips.append(Clip(f"quiet|{line}|{bot}", "quiet", quiet, bot))
        clips.append(Clip(f"quiet|{line}|{bot}|echo25dB|40ms", "quiet", quiet, bot, 25.0, 40))
    return clips


# -------------------------------------------------------------- engine level


@dataclass(frozen=True)
class Thresholds:
    """What the grid varies (the rest of ``BargeInPolicy`` stays at its defaults)."""

    min_speech_ms: int
    energy_floor_dbfs: float
    echo_return_loss_db: float
    vad_aggressiveness: int
    echo_correlation: float = BargeInPolicy().echo_correlation
    noise_rise_db: float = BargeInPolicy().noise_rise_db
    """The policy's defaults (the daemon's)."""
    noise_floor_up_ms: int = BargeInPolicy().noise_floor_up_ms
    noise_floor_down_ms: int = BargeInPolicy().noise_floor_down_ms
    babble_spread: float = BargeInPolicy().babble_spread

    @staticmethod
    def defaults() -> Thresholds:
        c = BargeInPolicy()
        return Thresholds(
            c.min_speech_ms, c.energy_floor_dbfs, c.echo_return_loss_db, c.vad_aggressiveness
        )

    def policy(self) -> BargeInPolicy:
        return BargeInPolicy(
            min_speech_ms=self.min_speech_ms,
            energy_floor_dbfs=self.energy_floor_dbfs,
            echo_return_loss_db=self.echo_return_loss_db,
            vad_aggressiveness=self.vad_aggressiveness,
            echo_correlation=self.echo_correlation,
            noise_rise_db=self.noise_rise_db,
            noise_floor_up_ms=self.noise_floor_up_ms,
            noise_floor_down_ms=self.noise_floor_down_ms,
            babble_spread=self.babble_spread,
        )


def run_engine(
    caller: Signal,
    bot: Signal,
    th: Thresholds,
    echo_db: float | None = None,
    echo_delay_ms: int = 0,
    trace: list[str] | None = None,
) -> list[tuple[float, float]]:
    """Drive one ``CallBridge``; return (decision, stop) times of every speech barge-in.

    ``trace`` (if given) gets every event the call emits, with the step's time:
    the engine's decisions, to diff two versions of the engine trial by trial.

    Step n at ``now = n * 20 ms``: caller frame n (samples ``[(n-1)*160, n*160)``,
    plus the echo of what the call sent, delayed and attenuated) goes in, then
    the call ticks. After a barge-in the bot resumes where it was cut (a new
    turn), so every trigger over a clip is counted.
    """
    call = CallBridge("bench", SIP_LEG, th.policy(), 0.0)
    bot_ulaw = ulaw_bytes(bot)
    steps = len(caller) // FRAME
    sent = np.zeros(len(caller) + FRAME * 2)
    gain = 0.0 if echo_db is None else 10 ** (-echo_db / 20)
    delay = echo_delay_ms * RATE_HZ // 1000
    turn, bot_pos, cuts = 0, 0, 0
    pending: float | None = None  # decision awaiting its stop tick
    out: list[tuple[float, float]] = []

    def drain(now: float) -> None:
        call.actions_to_send()
        events = call.events_received()
        if trace is not None:
            trace.extend(f"{now:.2f} {event!r}" for event in events)

    def start_turn(now: float) -> None:
        nonlocal turn
        turn += 1
        call.execute(Say(f"t{turn}", "bot"), now)
        call.provider_event(AudioReceived(f"t{turn}", bot_ulaw[bot_pos * FRAME :], MULAW_8K), now)
        drain(now)

    start_turn(0.0)
    for n in range(steps + 1):
        now = round(n * FRAME_S, 9)
        if n >= 1:
            lo, hi = (n - 1) * FRAME, n * FRAME
            frame = caller[lo:hi]
            if gain and hi - delay > 0:
                echo = np.zeros(FRAME)
                src = sent[max(0, lo - delay) : hi - delay]
                echo[FRAME - len(src) :] = src
                frame = frame + gain * echo
            call.caller_audio(ulaw_bytes(frame), now)
            drain(now)
            timings = call.stats().bargein_timings
            if len(timings) > cuts:
                cuts = len(timings)
                pending = timings[-1].decided_s
        payload = call.tick(now)
        drain(now)
        if payload is not None:
            sent[n * FRAME : (n + 1) * FRAME] = decode_ulaw(payload)
            bot_pos += 1
        elif pending is not None:
            out.append((pending, now))
            pending = None
            start_turn(now)
    return out


@dataclass
class OnsetFigures:
    latencies_s: list[float]
    missed: int
    early: int
    n: int

    def summary(self) -> dict[str, Any]:
        ms = [v * 1000 for v in self.latencies_s]
        return {
            "n": self.n,
            "detected": len(ms),
            "missed": self.missed,
            "early_false_triggers": self.early,
            "p50_ms": round(statistics.median(ms), 1) if ms else None,
            "p95_ms": round(pct(ms, 95), 1) if ms else None,
            "max_ms": round(max(ms), 1) if ms else None,
        }


def measure_onsets(
    onsets: list[Onset],
    bot: Signal,
    th: Thresholds,
    echo_db: float | None = None,
    echo_delay_ms: int = 0,
    traces: dict[str, list[str]] | None = None,
) -> dict[str, OnsetFigures]:
    """Latency per group ("all", "source=...", "level=...", "noise=..."); with
    ``echo_db`` the bot's own audio also comes back on the line (double talk).
    ``traces`` gets each trial's events (``run_engine``), by trial name."""
    groups: dict[str, OnsetFigures] = {}
    for o in onsets:
        trace = None if traces is None else traces.setdefault(o.name, [])
        stops = run_engine(
            o.caller, bot[: len(o.caller) + FRAME], th, echo_db, echo_delay_ms, trace
        )
        early = sum(1 for d, _ in stops if d < o.onset_s)
        after = [s - o.onset_s for d, s in stops if d >= o.onset_s]
        for key in ("all", f"source={o.source}", f"level={o.level_dbfs:g}", f"noise={o.noise}"):
            g = groups.setdefault(key, OnsetFigures([], 0, 0, 0))
            g.n += 1
            g.early += early
            if after:
                g.latencies_s.append(after[0])
            else:
                g.missed += 1
    return groups


def measure_false(
    clips: list[Clip],
    bots: dict[str, Signal],
    th: Thresholds,
    traces: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    per_kind: dict[str, list[int]] = {}
    triggered: list[str] = []
    for c in clips:
        trace = None if traces is None else traces.setdefault(c.name, [])
        stops = run_engine(
            c.caller, bots[c.bot][: len(c.caller) + FRAME], th, c.echo_db, c.echo_delay_ms, trace
        )
        per_kind.setdefault(c.kind, []).append(len(stops))
        if stops:
            triggered.append(f"{c.name}: {len(stops)}")
    counts = [n for v in per_kind.values() for n in v]
    return {
        "clips": len(counts),
        "clips_with_trigger": sum(1 for n in counts if n),
        "false_pct": round(100 * sum(1 for n in counts if n) / len(counts), 2),
        "triggers_per_10s_clip": round(sum(counts) / len(counts), 3),
        "by_kind": {
            k: {"clips": len(v), "with_trigger": sum(1 for n in v if n), "triggers": sum(v)}
            for k, v in per_kind.items()
        },
        "triggered": triggered,
    }


# -------------------------------------------------------------- end to end


class StreamCaller:
    """One Twilio media stream over a real WebSocket, the caller's frames in real time.

    Frame n (samples ``[n*160, (n+1)*160)`` of ``caller``) is sent at
    ``t0 + (n+1) * 20 ms``, when its last sample has happened, so a latency
    measured from ``t0 + onset_s`` includes the capture of the onset's frame.
    """

    _count = 0

    def __init__(self, url: str, caller: Signal, custom: dict[str, str] | None = None) -> None:
        from bridge.streams.carrier import TwilioCarrier

        self.url = url
        self.audio = ulaw_bytes(caller)
        StreamCaller._count += 1
        sid = f"{StreamCaller._count:032d}"
        self.carrier = TwilioCarrier(
            stream_sid=f"MZ{sid}", call_sid=f"CA{sid}", custom_parameters=custom or {}
        )
        self.t0 = 0.0
        self.closed_at: float | None = None
        """When the server closed the stream (``None``: it stayed open)."""

    async def run(self, extra_s: float = 0.3) -> None:
        import websockets

        loop = asyncio.get_running_loop()
        async with websockets.connect(self.url, max_size=1 << 20) as ws:

            async def flush() -> None:
                for text in self.carrier.frames_to_send(loop.time()):
                    if self.closed_at is None:
                        try:
                            await ws.send(text)
                        except websockets.ConnectionClosed:
                            self.closed_at = loop.time()

            async def receive() -> None:
                try:
                    async for msg in ws:
                        self.carrier.receive(str(msg), loop.time())
                        await flush()
                except websockets.ConnectionClosed:
                    pass
                if self.closed_at is None:
                    self.closed_at = loop.time()

            self.t0 = loop.time()
            self.carrier.connect(self.t0)
            await flush()
            reader = loop.create_task(receive())
            frames = len(self.audio) // FRAME
            for n in range(frames):
                if self.closed_at is not None:
                    break
                await asyncio.sleep(max(0.0, self.t0 + (n + 1) * FRAME_S - loop.time()))
                self.carrier.send_audio(self.audio[n * FRAME : (n + 1) * FRAME], loop.time())
                await flush()
            await asyncio.sleep(extra_s)
            self.carrier.send_stop(loop.time())
            await flush()
            reader.cancel()

    def stop_latency(self, onset_s: float) -> tuple[float | None, int, int]:
        """(``clear`` after onset - onset, clears before onset, media after that clear)."""
        onset = self.t0 + onset_s
        clears = self.carrier.clear_times()
        early = sum(1 for t in clears if t < onset)
        after = [t for t in clears if t >= onset]
        if not after:
            return None, early, 0
        late_media = sum(1 for t, _ in self.carrier.received_media() if t > after[0])
        return after[0] - onset, early, late_media


def e2e_route(greeting: str) -> str:
    return f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{greeting}"\n'


async def measure_e2e(onsets: list[Onset], parallel: int) -> dict[str, Any]:
    from bridge.logs import configure
    from tests.e2e.harness import stack

    latencies: list[float] = []
    missed = early = late_media = 0
    async with stack(e2e_route(BOT_TEXT)) as st:
        configure("warning", "json")  # per-call info lines would drown the figures
        url = f"ws://127.0.0.1:{st.ms_port}/twilio"
        for i in range(0, len(onsets), parallel):
            batch = onsets[i : i + parallel]
            callers = [StreamCaller(url, o.caller) for o in batch]
            await asyncio.gather(*(c.run() for c in callers))
            for c, o in zip(callers, batch, strict=True):
                lat, e, m = c.stop_latency(o.onset_s)
                early += e
                late_media += m
                if lat is None:
                    missed += 1
                else:
                    latencies.append(lat)
    ms = [v * 1000 for v in latencies]
    return {
        "n": len(onsets),
        "detected": len(ms),
        "missed": missed,
        "early_clears": early,
        "media_after_clear": late_media,
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p95_ms": round(pct(ms, 95), 1) if ms else None,
        "max_ms": round(max(ms), 1) if ms else None,
        "parallel_calls": parallel,
    }


# ---------------------------------------------------------------------- main


def grid(quick: bool) -> Iterator[Thresholds]:
    d = Thresholds.defaults()
    if quick:
        for ms in (60, 80, 100, 140):
            yield replace(d, min_speech_ms=ms)
        return
    for ms, floor, erl, aggr in itertools.product(
        (60, 80, 100, 140), (-50.0, -45.0, -40.0), (6.0, 10.0, 15.0, 20.0), (2, 3)
    ):
        yield Thresholds(ms, floor, erl, aggr)


def evaluate(
    th: Thresholds,
    onsets: list[Onset],
    clips: list[Clip],
    bots: dict[str, Signal],
    double_talk: bool = False,
    decisions: bool = False,
) -> dict[str, Any]:
    """Figures for one set of thresholds; with ``decisions`` also every trial's events
    (``"decisions"``, by set and trial) and a digest of them all (``"decisions_sha1"``):
    two engine versions that decide the same give the same digest."""
    traces: dict[str, dict[str, list[str]]] | None = {} if decisions else None

    def bucket(name: str) -> dict[str, list[str]] | None:
        return None if traces is None else traces.setdefault(name, {})

    groups = measure_onsets(onsets, bots["piper"], th, traces=bucket("onsets"))
    fig: dict[str, Any] = {
        "thresholds": th.__dict__,
        "onsets": {k: g.summary() for k, g in sorted(groups.items())},
        "false": measure_false(clips, bots, th, bucket("false")),
    }
    if double_talk:
        for erl in DOUBLE_TALK_ECHO_DB:
            dt = measure_onsets(
                onsets,
                bots["piper"],
                th,
                erl,
                DOUBLE_TALK_DELAY_MS,
                bucket(f"onsets_over_echo_{erl:g}dB"),
            )
            fig[f"onsets_over_echo_{erl:g}dB"] = {
                k: g.summary() for k, g in sorted(dt.items()) if not k.startswith("source=")
            }
    if traces is not None:
        text = json.dumps(traces, sort_keys=True)
        fig["decisions_sha1"] = hashlib.sha1(text.encode()).hexdigest()
        fig["decisions"] = traces
    return fig


def meets(fig: dict[str, Any]) -> bool:
    a = fig["onsets"]["all"]
    return bool(
        a["p95_ms"] is not None
        and a["p95_ms"] <= GOAL_P95_MS
        and a["missed"] == 0
        and fig["false"]["false_pct"] <= GOAL_FALSE_PCT
    )


def _line(fig: dict[str, Any]) -> str:
    a, f, t = fig["onsets"]["all"], fig["false"], fig["thresholds"]
    return (
        f"min_speech {t['min_speech_ms']:>3} floor {t['energy_floor_dbfs']:>5} "
        f"erl {t['echo_return_loss_db']:>4} vad {t['vad_aggressiveness']} | "
        f"p50 {a['p50_ms']} p95 {a['p95_ms']} max {a['max_ms']} missed {a['missed']}/{a['n']} "
        f"early {a['early_false_triggers']} | false {f['false_pct']}% "
        f"({f['clips_with_trigger']}/{f['clips']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument(
        "--seed", type=int, default=1, help="onset set seed (false set: seed + 1); 1 = the record"
    )
    ap.add_argument(
        "--name", default="", help="results file name (default: bargein, bargein-seedN)"
    )
    args = ap.parse_args()
    voices = Voices()
    onsets = onset_set(voices, args.quick, args.seed)
    clips = false_set(voices, args.quick, args.seed + 1)
    bots = {"piper": piper_bot_audio(voices, 12.0), "tone": tone_bot_audio(12.0)}
    print(f"onset set: {len(onsets)} trials; false set: {len(clips)} clips of 10 s")
    print(
        f"bot level (active): piper {active_level_dbfs(bots['piper']):.1f} dBFS, "
        f"tone {active_level_dbfs(bots['tone']):.1f} dBFS"
    )
    defaults = evaluate(
        Thresholds.defaults(), onsets, clips, bots, double_talk=True, decisions=True
    )
    print("engine, defaults:", _line(defaults))
    print("  decisions sha1:", defaults["decisions_sha1"])
    for k, g in defaults["onsets"].items():
        print(f"  {k:<24} p50 {g['p50_ms']} p95 {g['p95_ms']} missed {g['missed']}/{g['n']}")
    print("  false by kind:", defaults["false"]["by_kind"])
    for erl in DOUBLE_TALK_ECHO_DB:
        print(f"  double talk (bot echo {erl:g} dB down, {DOUBLE_TALK_DELAY_MS} ms):")
        for k, g in defaults[f"onsets_over_echo_{erl:g}dB"].items():
            print(
                f"    {k:<22} p50 {g['p50_ms']} p95 {g['p95_ms']} missed {g['missed']}/{g['n']}"
                f" early {g['early_false_triggers']}"
            )
    figures: dict[str, Any] = {"engine_defaults": defaults}
    if not args.no_grid and not meets(defaults):
        rows = []
        for th in grid(args.quick):
            fig = evaluate(th, onsets, clips, bots)
            rows.append(fig)
            print("grid:", _line(fig))
        figures["grid"] = [
            {
                "thresholds": r["thresholds"],
                "all": r["onsets"]["all"],
                "by_level": {k: v for k, v in r["onsets"].items() if k.startswith("level=")},
                "false": {k: v for k, v in r["false"].items() if k != "triggered"},
            }
            for r in rows
        ]
        figures["grid_meeting_goals"] = [r["thresholds"] for r in rows if meets(r)]
    if not args.no_e2e:
        subset = onsets[:: 4 if args.quick else 2]
        e2e = asyncio.run(measure_e2e(subset, parallel=6))
        figures["e2e_twilio_defaults"] = e2e
        print("end to end (Twilio, defaults):", e2e)
    settings = {
        "quick": args.quick,
        "seed": args.seed,
        "defaults": Thresholds.defaults().__dict__,
        "onset_trials": len(onsets),
        "false_clips": len(clips),
        "levels_dbfs": LEVELS_DBFS,
        "noises": [f"{k}{lvl:g}" for k, lvl in NOISES[: 2 if args.quick else 4]],
        "quiet_lines": ["silent" if k == "silent" else f"{k}{lvl:g}" for k, lvl in QUIET_LINES],
        "goals": {"p95_ms": GOAL_P95_MS, "false_pct": GOAL_FALSE_PCT},
    }
    name = args.name or ("bargein" if args.seed == 1 else f"bargein-seed{args.seed}")
    print("wrote", write(name, figures, settings))


if __name__ == "__main__":
    main()

"""Recorded-session replay and a fake synthesizer, shared by the engine tests.

Test directories are not packages and the suite runs with
``--import-mode=importlib``, so this file is loaded by path:
``tests/tts/conftest.py`` registers it as the module ``tts_replay`` before
any test below ``tests/tts`` is imported, and ``tests/streams/conftest.py``
loads it the same way. Use it as ``import tts_replay``.

Fixtures are JSON lines ``{"t": seconds, "dir": "in"|"out", "msg": ...}``.
An ``in`` message is fed to the engine under test (``feed``):

* a bare string: raw text (to record malformed input);
* ``{"b64": "..."}``: a binary message;
* ``{"raw": "..."}``: raw text, as in the zwst and Kletso fixtures;
* ``{<close_key>: {"code": c, "reason": r}}``: the socket closing;
* any other object: its JSON text.

An ``out`` message is what the engine must send, as ``action_to_msg``
renders it: the parsed JSON of a ``SendText``, ``{"b64": ...}`` for
``SendBytes`` and, for ``CloseConnection``, ``{"close": {"code", "reason"}}``
unless the protocol's fixtures spell it another way (``close=``).

Two replay loops, because the fixtures were recorded with two clocks:

* ``replay_by_time``: the engine is visited at every time any line or
  command names; at each time a due timer fires (at that time), then the
  commands, then the ``in`` lines, and what the engine sent is compared with
  that time's ``out`` lines (Coda, Kova, the media-stream dialects).
* ``replay_steps``: commands and ``in`` lines are steps in time order
  (commands first at equal times); timers fire at their own deadlines
  between steps, and everything sent is compared, with the time it was sent
  at, with the ``out`` lines (zwst, Kletso, KugelAudio).
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge.engine import Action, CloseConnection, Event, SendBytes, SendText
from bridge.providers.base import AudioReceived, WordTiming
from bridge.providers.server_base import Synthesize

Line = dict[str, Any]
Command = Callable[[Any, float], object]
Feed = Callable[[Any, Any, float], None]
ToMsg = Callable[[Action], object]

#: Timers due at one step may re-arm each other; more than this is a loop.
MAX_TIMERS_PER_STEP = 100


# ------------------------------------------------------------------ lines


def load_jsonl(path: Path) -> list[Line]:
    """The fixture's lines (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def close_with_reason(action: CloseConnection) -> object:
    return {"close": {"code": action.code, "reason": action.reason}}


def action_to_msg(
    action: Action, close: Callable[[CloseConnection], object] = close_with_reason
) -> object:
    """What an ``out`` line holds for one action of the engine."""
    if isinstance(action, SendText):
        return json.loads(action.text)
    if isinstance(action, SendBytes):
        return {"b64": base64.b64encode(action.data).decode()}
    if isinstance(action, CloseConnection):
        return close(action)
    raise AssertionError(f"unexpected action {action!r}")


def client_connection_lost(engine: Any, close: dict[str, Any], now: float) -> None:
    """A provider client's ``connection_lost(code, reason, now)``."""
    assert isinstance(close, dict)
    engine.connection_lost(close["code"], close.get("reason", ""), now)


def feed(
    engine: Any,
    msg: Any,
    now: float,
    *,
    close_key: str = "close",
    lost: Callable[[Any, dict[str, Any], float], None] = client_connection_lost,
) -> None:
    """Hand one ``in`` message to the engine (see the module docstring)."""
    keys = set(msg) if isinstance(msg, dict) else set()
    if isinstance(msg, str):
        _receive(engine, "text", msg, now)
    elif keys == {"b64"}:
        _receive(engine, "bytes", base64.b64decode(str(msg["b64"])), now)
    elif keys == {"raw"}:
        _receive(engine, "text", str(msg["raw"]), now)
    elif keys == {close_key}:
        lost(engine, msg[close_key], now)
    else:
        _receive(engine, "text", json.dumps(msg), now)


def _receive(engine: Any, kind: str, data: str | bytes, now: float) -> None:
    getattr(engine, f"receive_{kind}")(data, now)


# ---------------------------------------------------------- replay by time


def replay_by_time(
    engine: Any,
    lines: list[Line],
    commands: Iterable[tuple[float, Command]],
    *,
    name: str,
    also_at: Iterable[float] = (),
    feed_line: Feed = feed,
    to_msg: ToMsg = action_to_msg,
) -> list[tuple[float, Event]]:
    """Drive ``engine`` through ``lines`` time by time; return the events with their times.

    ``also_at``: more times to visit (e.g. to let a timer fire after the
    last line).
    """
    commands = list(commands)
    times = {float(line["t"]) for line in lines} | {t for t, _ in commands} | set(also_at)
    events: list[tuple[float, Event]] = []
    for now in sorted(times):
        deadline = engine.next_deadline()
        if deadline is not None and deadline <= now:
            engine.handle_timer(now)
        for t, command in commands:
            if t == now:
                command(engine, now)
        here = [line for line in lines if float(line["t"]) == now]
        for line in here:
            if line["dir"] == "in":
                feed_line(engine, line["msg"], now)
        sent = [to_msg(a) for a in engine.actions_to_send()]
        expected = [line["msg"] for line in here if line["dir"] == "out"]
        assert sent == expected, f"{name} at t={now}"
        events.extend((now, e) for e in engine.events_received())
    return events


# ---------------------------------------------------------- replay by step


@dataclass
class StepRun:
    """What ``replay_steps`` saw: everything sent and every event, with times."""

    sent: list[tuple[float, object]]
    events: list[tuple[float, Event]]


def replay_steps(
    engine: Any,
    lines: list[Line],
    commands: Iterable[tuple[float, Command]],
    *,
    connect: Command | None = None,
    settle_at_end: bool = True,
    until: float | None = None,
    time_digits: int | None = None,
    feed_line: Feed = feed,
    to_msg: ToMsg = action_to_msg,
) -> StepRun:
    """Drive ``engine`` step by step and assert the ``out`` lines, times included.

    Args:
        connect: called at 0.0 before the first step (what it makes the
            engine send counts as sent at 0.0); ``None``: the engine is
            already connected.
        settle_at_end: after the last step, fire the timers due up to the
            latest time any line or command names.
        until: then fire the timers due up to this time.
        time_digits: compare times rounded to this many digits.
    """
    indexed = list(enumerate(commands))
    steps: list[tuple[float, int, int, Any]] = [(t, 0, i, cmd) for i, (t, cmd) in indexed]
    steps += [
        (float(line["t"]), 1, i, line["msg"]) for i, line in enumerate(lines) if line["dir"] == "in"
    ]
    steps.sort(key=lambda step: step[:3])
    run = StepRun([], [])

    def drain(now: float) -> None:
        run.sent.extend((now, to_msg(a)) for a in engine.actions_to_send())
        run.events.extend((now, e) for e in engine.events_received())

    def fire_timers(limit: float) -> None:
        for _ in range(MAX_TIMERS_PER_STEP):
            deadline = engine.next_deadline()
            if deadline is None or deadline > limit:
                return
            engine.handle_timer(deadline)
            drain(deadline)
        raise AssertionError("timers did not settle")

    if connect is not None:
        connect(engine, 0.0)
        drain(0.0)
    for t, kind, _, step in steps:
        fire_timers(t)
        if kind == 0:
            step(engine, t)
        else:
            feed_line(engine, step, t)
        drain(t)
    if settle_at_end:
        end = max([float(line["t"]) for line in lines] + [t for t, _ in indexed])
        fire_timers(end)
        drain(end)
    if until is not None:
        fire_timers(until)

    def rounded(t: float) -> float:
        return t if time_digits is None else round(t, time_digits)

    got = [(rounded(t), msg) for t, msg in run.sent]
    expected = [(rounded(float(line["t"])), line["msg"]) for line in lines if line["dir"] == "out"]
    assert got == expected
    return run


# -------------------------------------------------------- fake synthesizer


@functools.lru_cache(maxsize=256)
def word_pcm(word: str, sample_rate_hz: int) -> bytes:
    """A deterministic tone for one word: 40 ms + 10 ms per letter, pitch by length."""
    n_samples = sample_rate_hz * (40 + 10 * len(word)) // 1000
    t = np.arange(n_samples) / sample_rate_hz
    tone = 8000 * np.sin(2 * math.pi * (300 + 40 * len(word)) * t)
    return tone.astype("<i2").tobytes()


def render(text: str, sample_rate_hz: int) -> tuple[bytes, tuple[WordTiming, ...]]:
    """What the fake synthesizer makes of ``text``: PCM and word timings."""
    chunks, words, at_s = [], [], 0.0
    for word in text.split():
        chunk = word_pcm(word, sample_rate_hz)
        dur_s = len(chunk) / 2 / sample_rate_hz
        words.append(WordTiming(word, at_s, at_s + dur_s))
        chunks.append(chunk)
        at_s += dur_s
    return b"".join(chunks), tuple(words)


@dataclass
class Job:
    """One synthesis job of the fake synthesizer and the chunks it still owes."""

    request: Synthesize
    chunks: list[tuple[bytes, tuple[WordTiming, ...]]]


def two_chunk_job(request: Synthesize) -> Job:
    """The job in two chunks: a quarter of the PCM with half the words, then the rest.

    The second chunk's timings stay relative to the job's start.
    """
    pcm, words = render(request.text, request.sample_rate_hz)
    half_bytes = len(pcm) // 4 * 2
    half_words = len(words) // 2
    first = (pcm[:half_bytes], words[:half_words])
    return Job(request, [first, (pcm[half_bytes:], words[half_words:])])


# ------------------------------------------------------------ small helpers


def audio_of(events: list[Event], turn_id: str) -> bytes:
    """All the audio one turn received, joined."""
    return b"".join(
        e.audio for e in events if isinstance(e, AudioReceived) and e.turn_id == turn_id
    )


def pcm(*samples: int) -> bytes:
    """16-bit little-endian PCM of the given sample values."""
    return b"".join(s.to_bytes(2, "little", signed=True) for s in samples)

"""The per-frame fast paths of the call side give what the general paths give."""

from __future__ import annotations

import numpy as np
from call_harness import SIP, TWILIO, Harness, at, of_type, tone_ulaw_frames, voiced_ulaw_frames

from bridge.commands import Cancel, Say, SpeechStarted, SpeechStopped
from bridge.media.call_types import LegProfile, SendMark
from bridge.media.vad import MIN_DBFS, Vad, energy_dbfs
from telcodec import g711


def _frames() -> list[bytes]:
    rng = np.random.default_rng(3)
    voiced = g711.ulaw_decode(b"".join(voiced_ulaw_frames(0.4)))
    frames = [voiced[i : i + 320] for i in range(0, len(voiced), 320)]
    noise = rng.normal(0, 300, 160).astype("<i2").tobytes()
    click = bytearray(320)
    click[100:104] = b"\xff\x7f\xff\x7f"
    dc = (np.full(160, 2000) + rng.normal(0, 50, 160)).astype("<i2").tobytes()
    return [*frames, noise, bytes(click), dc, bytes(320), b"", noise[:319], noise + b"\x01"]


def test_speech_and_level_matches_the_wrapper_path() -> None:
    fast, slow = Vad(2, 8000, 20), Vad(2, 8000, 20)
    slow._direct = False  # the webrtcvad wrapper, the path taken before the fast one
    for frame in _frames():
        assert fast.speech_and_level(frame) == slow.speech_and_level(frame)
        analysis = slow.analyze(frame)
        assert (analysis.is_speech, analysis.energy_dbfs) == fast.speech_and_level(frame)
    assert any(fast.speech_and_level(f)[0] for f in _frames())  # the voiced frames are speech


def test_energy_dbfs_ignores_a_trailing_odd_byte() -> None:
    pcm = (np.full(160, 1000)).astype("<i2").tobytes()
    assert energy_dbfs(pcm + b"\x7f") == energy_dbfs(pcm)
    assert energy_dbfs(b"\x01") == MIN_DBFS


def test_speech_events_reach_the_call_when_speech_starts_and_stops() -> None:
    h = Harness(SIP)
    n = 0
    for frame in voiced_ulaw_frames(0.6):
        h.caller(frame, at(n))
        n += 1
    _, events = h.take()
    assert [type(e) for e in events] == [SpeechStarted]
    for _ in range(40):  # 800 ms of silence ends the run
        h.caller(b"\xff" * 160, at(n))
        n += 1
    _, events = h.take()
    assert [type(e) for e in events] == [SpeechStopped]


def _mark_ticks(chunk_frames: list[int], total: int) -> list[int]:
    """Ticks after which a ``SendMark`` goes out, frames delivered in the given chunk sizes."""
    h = Harness(TWILIO)
    h.say("t1", final=True)
    frames = tone_ulaw_frames(total)
    start, k = 0, 0
    while start < total:
        size = chunk_frames[k % len(chunk_frames)]
        h.frames("t1", frames[start : start + size], 0.0)
        start += size
        k += 1
    h.done("t1", 0.0)
    h.take()
    ticks = []
    for n in range(total + 2):
        h.tick(n)
        actions, _ = h.take()
        ticks += [n] * len(of_type(actions, SendMark))
    return ticks


def test_marks_every_interval_whatever_the_chunking() -> None:
    # TWILIO: a mark every 200 ms (10 frames) and one after the last frame
    expected = [9, 19, 29, 39, 44]
    for chunking in ([45], [1], [3], [7, 13], [10], [9, 2, 11]):
        assert _mark_ticks(chunking, 45) == expected, chunking


def test_the_tick_arms_the_detector_as_the_full_check_does() -> None:
    # ``tick`` arms the detector without ``_interruptible_sounding`` when the
    # frame it sent belongs to an interruptible turn still sounding. Through
    # random scripts (interruptible and protected turns, replaces, cancels,
    # barge-ins by voice and DTMF, mark echoes on a marks leg) the state it
    # leaves must always be the full check's.
    voice = voiced_ulaw_frames(0.6)
    bot = tone_ulaw_frames(40)
    legs: tuple[LegProfile, ...] = (SIP, TWILIO)
    for seed in range(12):
        rng = np.random.default_rng(seed)
        leg = legs[seed % 2]
        h = Harness(leg)
        open_turns: list[str] = []
        echoes: list[tuple[int, str]] = []
        talking = 0
        checked = 0
        for n in range(700):
            now = at(n)
            r = rng.random()
            if r < 0.03 or (not open_turns and r < 0.2):
                tid = f"t{n}"
                h.call.execute(
                    Say(
                        tid,
                        "hi",
                        final=True,
                        interruptible=bool(rng.random() < 0.7),
                        replace=bool(rng.random() < 0.15),
                    ),
                    now,
                )
                open_turns.append(tid)
            elif r < 0.25 and open_turns:
                tid = open_turns[int(rng.integers(len(open_turns)))]
                k = int(rng.integers(1, 12))
                h.audio(tid, b"".join(bot[:k]) + bot[k][: int(rng.integers(0, 160))], now)
            elif r < 0.29 and open_turns:
                h.done(open_turns.pop(0), now)
            elif r < 0.30 and open_turns:
                h.call.execute(Cancel(open_turns[-1]), now)
            elif r < 0.31:
                h.call.caller_dtmf("5", now)
            elif r < 0.33:
                talking = len(voice)
            h.drain()
            due = [name for at_n, name in echoes if at_n <= n]
            echoes = [(at_n, name) for at_n, name in echoes if at_n > n]
            for name in due:
                h.call.mark_echoed(name, False, now)
            if talking:
                talking -= 1
                h.caller(voice[len(voice) - 1 - talking], now)
            else:
                h.caller(b"\xff" * 160, now)
            h.call.tick(now)
            actions, _ = h.take()
            for mark in of_type(actions, SendMark):
                echoes.append((n + int(rng.integers(1, 15)), mark.name))
            assert h.call._armed is h.call._interruptible_sounding(), (seed, n)
            checked += h.call._armed
        assert checked > 50, seed  # the scripts do arm the detector

"""The per-frame fast paths of the call side give what the general paths give."""

from __future__ import annotations

import numpy as np
from call_harness import SIP, Harness, at, voiced_ulaw_frames

from bridge.control.commands import SpeechStarted, SpeechStopped
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
    slow._handle = None  # the webrtcvad wrapper, the path taken before the fast one
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

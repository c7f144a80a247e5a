"""Digital silence skips the WebRTC VAD once it is at rest, with the same answers."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import webrtcvad

from bridge.media.vad import SETTLED_ZERO_FRAMES, Vad, ac_energy_dbfs, is_click

FRAME_BYTES = 320
ZERO = bytes(FRAME_BYTES)
VAD_STATE_BYTES = 736
"""sizeof(VadInstT) in webrtc's vad_core.h (filter states, models, hangover, flags)."""

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def c_state(vad: webrtcvad.Vad) -> bytes:
    """The C VAD's whole state, as bytes."""
    capsule = vad._vad
    return ctypes.string_at(_get_pointer(capsule, b"WebRtcVadPtr"), VAD_STATE_BYTES)


def frame(rng: np.random.Generator, level_dbfs: float) -> bytes:
    x = rng.normal(0.0, 32768 * 10 ** (level_dbfs / 20), 160)
    if rng.random() < 0.3:  # voiced-like: a loud harmonic burst
        t = np.arange(160) / 8000
        x += 32768 * 10 ** ((level_dbfs + 10) / 20) * np.sin(2 * np.pi * rng.uniform(90, 300) * t)
    return np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()


@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
def test_the_c_vad_is_at_rest_after_the_settling_zero_frames(aggressiveness: int) -> None:
    # The premise of the skip, on the installed library: from states left by
    # noise and speech-like audio at any level, after SETTLED_ZERO_FRAMES zero
    # frames another zero frame changes no byte of the state and is not speech.
    rng = np.random.default_rng(aggressiveness)
    for trial in range(40):
        vad = webrtcvad.Vad(aggressiveness)
        level = float(rng.uniform(-80.0, -5.0))
        for _ in range(int(rng.integers(1, 150))):
            vad.is_speech(frame(rng, level), 8000)
        for _ in range(SETTLED_ZERO_FRAMES):
            vad.is_speech(ZERO, 8000)
        before = c_state(vad)
        for _ in range(5):
            assert vad.is_speech(ZERO, 8000) is False, trial
            assert c_state(vad) == before, trial


def test_speech_and_level_on_digital_silence_answers_as_the_vad_and_calls_it_less() -> None:
    # Runs of silence (shorter and longer than the settling count, one with a
    # single non-zero sample) between noise and speech-like audio: every answer
    # is the plain VAD's (click rule and level as ``analyze`` defines them),
    # and long silences stop reaching the C VAD.
    rng = np.random.default_rng(5)
    one_sample = bytearray(ZERO)
    one_sample[200] = 1
    frames: list[bytes] = []
    for run in range(30):
        frames += [
            frame(rng, float(rng.uniform(-70, -10))) for _ in range(int(rng.integers(1, 30)))
        ]
        silence = [ZERO] * int(rng.integers(1, 3 * SETTLED_ZERO_FRAMES))
        if run % 5 == 2:
            silence[len(silence) // 2] = bytes(one_sample)
        frames += silence
    vad = Vad(3)
    calls = 0
    process = vad._process

    def counting(*args: object) -> int:
        nonlocal calls
        calls += 1
        return process(*args)  # type: ignore[arg-type]

    vad._process = counting
    reference = webrtcvad.Vad(3)
    for i, f in enumerate(frames):
        expected = reference.is_speech(f, 8000) and not is_click(f), ac_energy_dbfs(f)
        assert vad.speech_and_level(f) == expected, i
    assert calls < len(frames) - 100  # the silences past the settling count skipped it

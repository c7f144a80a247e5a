"""The echo correlator tells the bot's own voice coming back from a caller speaking."""

from __future__ import annotations

import numpy as np

from bridge.media.echo import EchoCorrelator
from telcodec import g711

RATE = 8000
FRAME = 160


def voiced(seconds: float, f0: float, seed: int) -> np.ndarray:
    """A speech-like signal: harmonics of a wobbling pitch with a syllable envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    pitch = f0 * (1 + 0.1 * np.sin(2 * np.pi * 2.5 * t + rng.uniform(0, 6)))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    wave = sum(np.sin(k * phase + rng.uniform(0, 6)) / k for k in range(1, 9))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6))
    return wave * envelope / 4.0  # about -16 dBFS peak region


def to_s16(x: np.ndarray, gain: float) -> bytes:
    return np.clip(x * gain * 32767, -32768, 32767).astype("<i2").tobytes()


def through_g711(pcm: bytes) -> bytes:
    return g711.ulaw_decode(g711.ulaw_encode(pcm))


def frames(pcm: bytes) -> list[bytes]:
    return [pcm[i : i + 2 * FRAME] for i in range(0, len(pcm) - 2 * FRAME + 1, 2 * FRAME)]


def run(bot: np.ndarray, inbound: np.ndarray, corr: EchoCorrelator) -> list[float]:
    out = frames(to_s16(bot, 1.0))
    inn = frames(through_g711(to_s16(inbound, 1.0)))
    scores = []
    for o, i in zip(out, inn, strict=False):
        corr.push_outbound(o)
        scores.append(corr.likelihood(i))
    return scores[10:]  # once the echo path is inside the history


def delayed(x: np.ndarray, delay_ms: float, gain_db: float) -> np.ndarray:
    d = int(RATE * delay_ms / 1000)
    return np.concatenate([np.zeros(d), x[: len(x) - d]]) * 10 ** (gain_db / 20)


def test_the_bots_own_audio_coming_back_is_echo_at_every_delay_and_level() -> None:
    bot = voiced(3.0, 120, seed=1)
    for delay_ms, gain_db in [(20, -10), (60, -15), (137, -25), (250, -10)]:
        scores = run(bot, delayed(bot, delay_ms, gain_db), EchoCorrelator())
        assert np.median(scores) > 0.9, (delay_ms, gain_db)
        assert np.mean([s >= 0.7 for s in scores]) > 0.9, (delay_ms, gain_db)


def test_a_caller_speaking_is_not_echo() -> None:
    bot = voiced(3.0, 120, seed=1)
    caller = voiced(3.0, 190, seed=7)
    scores = run(bot, caller, EchoCorrelator())
    assert np.mean([s >= 0.7 for s in scores]) < 0.05


def test_double_talk_with_the_caller_louder_than_the_echo_is_not_echo() -> None:
    bot = voiced(3.0, 120, seed=1)
    caller = voiced(3.0, 190, seed=7)
    inbound = delayed(bot, 60, -20) + caller * 10 ** (-6 / 20)  # caller 14 dB over the echo
    scores = run(bot, inbound, EchoCorrelator())
    assert np.mean([s >= 0.7 for s in scores]) < 0.1


def test_nothing_is_echo_while_the_bot_is_silent() -> None:
    corr = EchoCorrelator()
    caller = frames(to_s16(voiced(1.0, 190, seed=3), 1.0))
    for frame in caller:
        corr.push_outbound(None)
        assert corr.likelihood(frame) == 0.0
        assert not corr.is_echo(frame)


def test_a_zero_threshold_switches_it_off_and_bad_frames_score_zero() -> None:
    bot = frames(to_s16(voiced(1.0, 120, seed=1), 1.0))
    corr = EchoCorrelator(threshold=0.0)
    for frame in bot:
        corr.push_outbound(frame)
    assert not corr.is_echo(bot[-1])
    assert corr.likelihood(b"\x00" * 10) == 0.0
    assert corr.likelihood(b"\x00" * 320) == 0.0


def test_a_caller_near_the_bots_harmonics_is_rarely_taken_for_echo() -> None:
    # A 150 Hz caller over a 120 Hz bot shares harmonics (600 Hz, ...): the best
    # of ~2 400 raw correlations of a 160-sample frame reaches 0.7 on 38 % of the
    # frames; pre-emphasis (and the echo-gain bound) leaves 13 %.
    bot = voiced(3.0, 120, seed=1)
    caller = voiced(3.0, 150, seed=3)
    scores = run(bot, caller, EchoCorrelator())
    assert np.mean([s >= 0.7 for s in scores]) < 0.2


def test_inbound_louder_than_what_we_sent_is_not_its_echo() -> None:
    # The bot's own signal returned 10 dB *louder* cannot be line echo (an echo
    # path attenuates): the delay where it matches is ruled out by the gain
    # bound; only chance matches elsewhere in the history remain.
    bot = voiced(3.0, 120, seed=1)
    scores = run(bot, delayed(bot, 60, +10), EchoCorrelator())
    assert np.mean([s >= 0.7 for s in scores]) < 0.5
    same = run(bot, delayed(bot, 60, 0), EchoCorrelator())  # at 0 dB it still is echo
    assert np.mean([s >= 0.7 for s in same]) > 0.9


def test_pre_emphasis_is_the_same_whatever_the_frame_boundaries() -> None:
    # The history is pre-emphasised when searched, across frame joins: an echo
    # at a delay that is not a multiple of the frame still scores ~1.
    bot = voiced(3.0, 120, seed=2)
    scores = run(bot, delayed(bot, 37.5, -12), EchoCorrelator())
    assert np.median(scores) > 0.95

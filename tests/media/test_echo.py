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


def reference_likelihood(
    sent: np.ndarray, frame: bytes, max_delay_ms: int = 300, alpha: float = 0.5
) -> float:
    """The definition, by brute force: best gated ncc over every delay of the history."""
    length = RATE * max_delay_ms // 1000 + FRAME
    stream = np.concatenate([np.zeros(length + 1), sent])
    raw = stream[-length:]
    if float(np.dot(raw, raw)) < 30.0**2 * length:
        return 0.0
    emph = stream[1:] - alpha * stream[:-1]
    hist = emph[-length:]
    x = np.frombuffer(frame, "<i2").astype(np.float64)
    x[1:] -= alpha * x[:-1].copy()
    x[0] = 0.0
    x_norm = float(np.sqrt(np.dot(x, x)))
    if x_norm == 0.0:
        return 0.0
    best = 0.0
    for d in range(length - FRAME + 1):
        window = hist[d : d + FRAME]
        norm = float(np.sqrt(max(np.dot(window, window), 1e-9)))
        if norm * 10 ** (3.0 / 20) >= x_norm:
            best = max(best, abs(float(np.dot(window, x))) / (norm * x_norm))
    return min(1.0, best)


def mixed_call() -> tuple[list[bytes | None], list[bytes]]:
    """The bot talks, pauses, talks; the line carries echo, then the caller over it."""
    bot = voiced(2.4, 120, seed=4)
    caller = voiced(2.4, 180, seed=9)
    inbound = delayed(bot, 45.5, -12)
    inbound[int(RATE * 1.4) :] += caller[int(RATE * 1.4) :] * 0.4  # double talk at the end
    out: list[bytes | None] = list(frames(to_s16(bot, 1.0)))
    for k in range(40, 52):
        out[k] = None  # a pause: the newest part of the history falls silent
    return out, frames(through_g711(to_s16(inbound, 1.0)))


def test_every_decision_is_the_full_searchs_whatever_frames_are_checked() -> None:
    # Tracking, the lazy history (converted only when a frame is checked, however
    # many frames were pushed since) and the delay span searched only save work:
    # each decision is the one of the definition, searched over every delay.
    out, inn = mixed_call()
    for every in (1, 3, 20):  # 20: more frames pushed between checks than the history holds
        corr = EchoCorrelator()
        sent: list[np.ndarray] = []
        checked = 0
        for k, (o, i) in enumerate(zip(out, inn, strict=False)):
            corr.push_outbound(o)
            sent.append(np.zeros(FRAME) if o is None else np.frombuffer(o, "<i2"))
            if k % every:
                continue
            ref = reference_likelihood(np.concatenate(sent), i)
            assert corr.is_echo(i) == (ref >= 0.7), (every, k, ref)
            checked += 1
        assert checked >= len(out) // every


def test_the_history_is_made_at_the_first_check_and_decides_as_if_it_always_was() -> None:
    # A call whose caller never speaks over the bot never checks a frame: its
    # correlator holds no history arrays (about 20 KB a call). The first check,
    # however late, decides as the definition does.
    out, inn = mixed_call()
    corr = EchoCorrelator()
    sent: list[np.ndarray] = []
    first = 100  # 2 s of the bot's audio pushed before anything is checked
    for k, (o, i) in enumerate(zip(out, inn, strict=False)):
        corr.push_outbound(o)
        sent.append(np.zeros(FRAME) if o is None else np.frombuffer(o, "<i2"))
        if k < first:
            assert corr._emph is None and corr._norms is None
            continue
        ref = reference_likelihood(np.concatenate(sent), i)
        assert corr.is_echo(i) == (ref >= 0.7), (k, ref)
    assert corr._emph is not None


def test_a_not_echo_score_is_the_best_over_every_delay() -> None:
    out, inn = mixed_call()
    corr = EchoCorrelator()
    sent: list[np.ndarray] = []
    seen = 0
    for o, i in zip(out, inn, strict=False):
        corr.push_outbound(o)
        sent.append(np.zeros(FRAME) if o is None else np.frombuffer(o, "<i2"))
        score = corr.likelihood(i)
        if score < 0.7:
            assert abs(score - reference_likelihood(np.concatenate(sent), i)) < 1e-4
            seen += 1
    assert seen > 10


def test_a_history_that_is_not_a_whole_number_of_frames() -> None:
    bot = voiced(2.0, 120, seed=1)
    out = frames(to_s16(bot, 1.0))
    inn = frames(through_g711(to_s16(delayed(bot, 250, -10), 1.0)))
    corr = EchoCorrelator(max_delay_ms=290)  # 2 320 + 160 samples: 15.5 frames
    sent: list[np.ndarray] = []
    for k, (o, i) in enumerate(zip(out, inn, strict=False)):
        corr.push_outbound(o)
        sent.append(np.frombuffer(o, "<i2"))
        if k % 4 == 0 or k > 80:
            ref = reference_likelihood(np.concatenate(sent), i, max_delay_ms=290)
            assert corr.is_echo(i) == (ref >= 0.7), (k, ref)


def test_g711_frames_as_sent_score_exactly_as_their_decoded_samples() -> None:
    # The call gives the correlator its mu-law/A-law frames as sent (decoded only
    # when an inbound frame is checked): every score must be the s16le one.
    bot = voiced(3.0, 120, seed=4)
    inbound = frames(through_g711(to_s16(delayed(bot, 60, -12) + voiced(3.0, 200, 9) / 8, 1.0)))
    for codec, encode, decode in [
        ("mulaw", g711.ulaw_encode, g711.ulaw_decode),
        ("alaw", g711.alaw_encode, g711.alaw_decode),
    ]:
        sent = [encode(f) for f in frames(to_s16(bot, 1.0))]
        linear, as_sent = EchoCorrelator(), EchoCorrelator(outbound_codec=codec)
        for k, (o, i) in enumerate(zip(sent, inbound, strict=False)):
            frame = None if k % 37 == 5 else o  # some silent ticks too
            linear.push_outbound(None if frame is None else decode(frame))
            as_sent.push_outbound(frame)
            if k % 3 == 0:  # checks at irregular intervals (history synced in batches)
                assert as_sent.likelihood(i) == linear.likelihood(i), (codec, k)


def test_a_g711_correlator_takes_frames_of_the_g711_size_only() -> None:
    corr = EchoCorrelator(outbound_codec="mulaw")
    corr.push_outbound(bytes(2 * FRAME))  # an s16le-sized frame: silence, as any bad size
    assert corr.likelihood(to_s16(voiced(0.02, 120, 1), 1.0)) == 0.0
    try:
        EchoCorrelator(outbound_codec="opus")
    except ValueError:
        pass
    else:
        raise AssertionError("an unknown codec must raise")

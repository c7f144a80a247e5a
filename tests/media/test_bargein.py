"""BargeInDetector with synthetic frame sequences and plain-number times; one real-VAD test."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from bridge.engine import LocalProtocolError
from bridge.media.bargein import (
    BargeInDetector,
    BargeInPolicy,
    BargeInTriggered,
    SpeechStarted,
    SpeechStopped,
)
from bridge.media.echo import EchoCorrelator
from bridge.media.vad import MIN_DBFS, Vad, ac_energy_dbfs, energy_dbfs, is_click
from telcodec import g711

FRAME_S = 0.020
LOUD_DBFS = -20.0


def feed(
    det: BargeInDetector, pattern: str, start_s: float = 0.0, level_dbfs: float = LOUD_DBFS
) -> list[tuple[int, BargeInTriggered]]:
    """Feed one frame per character ('S' speech, '.' silence); return (frame index, trigger)."""
    triggers: list[tuple[int, BargeInTriggered]] = []
    for i, c in enumerate(pattern):
        speech = c == "S"
        now = round(start_s + i * FRAME_S, 6)  # literal times compare exactly
        decision = det.observe(speech, level_dbfs if speech else MIN_DBFS, now)
        if decision is not None:
            triggers.append((i, decision))
    return triggers


def speaking_detector(policy: BargeInPolicy | None = None) -> BargeInDetector:
    det = BargeInDetector(policy)
    det.set_bot_speaking(True)
    return det


def test_speech_shorter_than_minimum_does_not_trigger() -> None:
    det = speaking_detector(BargeInPolicy(min_speech_ms=160))
    assert feed(det, "." * 5 + "S" * 7 + "." * 30) == []
    assert det.events_received() == []


def test_speech_triggers_at_exactly_the_minimum_frame() -> None:
    det = speaking_detector(BargeInPolicy(min_speech_ms=160))
    triggers = feed(det, "..." + "S" * 20, start_s=10.0)
    assert len(triggers) == 1
    index, trigger = triggers[0]
    assert index == 3 + 7  # the eighth speech frame
    assert trigger == BargeInTriggered("speech", onset_s=10.06, now=10.2)
    assert det.events_received() == [SpeechStarted(10.2, 10.06)]


def test_short_gaps_within_hangover_are_bridged() -> None:
    det = speaking_detector(BargeInPolicy(min_speech_ms=160, hangover_ms=60))
    # 5 speech, 2 gap (credit 100 -> 60), 5 speech (credit 160 on the 5th).
    triggers = feed(det, "SSSSS..SSSSS")
    assert [(i, t.onset_s) for i, t in triggers] == [(11, 0.0)]


def test_gap_longer_than_hangover_restarts_the_run() -> None:
    det = speaking_detector(BargeInPolicy(min_speech_ms=160, hangover_ms=60, speech_end_ms=400))
    triggers = feed(det, "SSSSSSS" + "...." + "SSSSSSSS")
    assert [(i, t.onset_s) for i, t in triggers] == [(18, 0.22)]


def test_energy_floor() -> None:
    # flat synthetic levels: the noise-floor rise check (tested below) is off
    det = speaking_detector(BargeInPolicy(energy_floor_dbfs=-45.0, noise_rise_db=0.0))
    assert feed(det, "S" * 30, level_dbfs=-46.0) == []
    assert det.events_received() == []
    assert len(feed(det, "S" * 30, start_s=1.0, level_dbfs=-44.0)) == 1


def test_echo_guard_ignores_caller_at_echo_level() -> None:
    det = speaking_detector(BargeInPolicy(echo_return_loss_db=15.0))
    triggers = []
    for i in range(40):
        now = i * FRAME_S
        det.record_bot_level(-10.0, now)
        if (d := det.observe(True, -25.0, now)) is not None:  # exactly the expected echo
            triggers.append(d)
    assert triggers == []
    assert det.events_received() == []


def test_echo_guard_lets_loud_caller_through() -> None:
    det = speaking_detector(BargeInPolicy(echo_return_loss_db=15.0, min_speech_ms=160))
    triggers = []
    for i in range(20):
        now = i * FRAME_S
        det.record_bot_level(-10.0, now)
        if (d := det.observe(True, -18.0, now)) is not None:
            triggers.append((i, d.reason))
    assert triggers == [(7, "speech")]


def test_echo_guard_covers_echo_tail_then_expires() -> None:
    det = BargeInDetector(
        BargeInPolicy(
            echo_window_ms=200, min_speech_ms=40, noise_rise_db=0.0, echo_return_loss_db=15.0
        )
    )
    det.record_bot_level(-10.0, 0.0)  # guards down to -25 dBFS
    assert det.observe(True, -30.0, 0.1) is None
    assert det.observe(True, -30.0, 0.12) is None
    assert det.events_received() == []  # still within the echo window
    det.observe(True, -30.0, 0.22)
    det.observe(True, -30.0, 0.24)
    assert det.events_received() == [SpeechStarted(0.24, 0.22)]


def test_dtmf_triggers_immediately_only_while_bot_speaks() -> None:
    det = BargeInDetector()
    assert det.dtmf("5", 1.0) is None
    det.set_bot_speaking(True)
    assert det.dtmf("5", 2.0) == BargeInTriggered("dtmf", 2.0, 2.0)
    off = speaking_detector(BargeInPolicy(dtmf_triggers=False))
    assert off.dtmf("#", 2.0) is None


def test_single_click_and_sparse_clicks_never_trigger() -> None:
    det = speaking_detector()
    assert feed(det, ".....S.....") == []
    assert feed(det, "S.." * 40, start_s=1.0) == []  # a click every 60 ms
    assert feed(det, "S." * 60, start_s=5.0) == []  # a click every 40 ms
    assert det.events_received() == []


def test_speech_started_without_trigger_when_bot_silent() -> None:
    det = BargeInDetector(BargeInPolicy(min_speech_ms=160))
    assert feed(det, "S" * 30 + "." * 25) == []
    assert det.events_received() == [
        SpeechStarted(0.14, 0.0),
        SpeechStopped(0.98, 0.0, 0.58),
    ]


def test_disabled_policy_still_reports_speech() -> None:
    det = speaking_detector(BargeInPolicy(enabled=False))
    assert feed(det, "S" * 20) == []
    assert det.dtmf("1", 1.0) is None
    assert len(det.events_received()) == 1


def test_one_trigger_per_run_and_rearmed_by_new_bot_turn() -> None:
    det = speaking_detector(BargeInPolicy(min_speech_ms=160))
    assert [i for i, _ in feed(det, "S" * 30)] == [7]
    det.set_bot_speaking(False)  # the call cut the turn
    det.set_bot_speaking(True)  # and a new one starts while the caller still talks
    triggers = feed(det, "S" * 3, start_s=0.6)
    assert [(i, t.onset_s) for i, t in triggers] == [(0, 0.0)]
    assert det.caller_speaking


def test_speech_stops_after_speech_end_silence() -> None:
    det = BargeInDetector(BargeInPolicy(speech_end_ms=100, min_speech_ms=160))
    feed(det, "S" * 10 + "...." + "SS" + ".....")
    assert det.events_received() == [
        SpeechStarted(0.14, 0.0),
        SpeechStopped(0.4, 0.0, 0.3),
    ]
    assert not det.caller_speaking


def test_invalid_policy_is_our_error() -> None:
    with pytest.raises(LocalProtocolError):
        BargeInDetector(BargeInPolicy(min_speech_ms=0))


def voiced(duration_s: float, sample_rate_hz: int = 8000) -> npt.NDArray[np.float64]:
    """A vowel-like signal: 130 Hz harmonics with a 4 Hz syllable envelope."""
    t = np.arange(int(duration_s * sample_rate_hz)) / sample_rate_hz
    harmonics = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 25))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)
    signal = np.asarray(harmonics * envelope, dtype=np.float64)
    peak = float(np.max(np.abs(signal)))
    return signal / peak


def to_pcm(signal: npt.NDArray[np.float64], peak: float) -> bytes:
    return (signal * peak * 32767).astype("<i2").tobytes()


def test_real_webrtcvad_through_detector() -> None:
    rng = np.random.default_rng(7)
    noise = to_pcm(rng.normal(0.0, 1.0, 8000) / 1000.0, 1.0)  # 1 s of -70 dBFS hiss
    voice = to_pcm(voiced(1.0), 0.3)
    audio = noise + voice + bytes(16000)
    vad = Vad(aggressiveness=2)
    det = speaking_detector(BargeInPolicy(min_speech_ms=160, energy_floor_dbfs=-45.0))
    triggers: list[BargeInTriggered] = []
    for k in range(len(audio) // 320):
        chunk = audio[k * 320 : (k + 1) * 320]
        analysis = vad.analyze(chunk)
        if (d := det.observe(analysis.is_speech, analysis.energy_dbfs, k * FRAME_S)) is not None:
            triggers.append(d)
    assert len(triggers) == 1
    (trigger,) = triggers
    assert 1.0 <= trigger.onset_s <= 1.1  # the voice starts at 1.0 s
    assert trigger.now == pytest.approx(trigger.onset_s + 0.14)
    events = det.events_received()
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    assert isinstance(events[1], SpeechStopped)
    assert 1.9 <= events[1].last_speech_s <= 2.1


def test_vad_rejects_wrong_frame_size_and_measures_levels() -> None:
    vad = Vad()
    assert vad.frame_bytes == 320
    assert not vad.is_speech(b"\x00" * 100)
    assert energy_dbfs(b"") == MIN_DBFS
    assert energy_dbfs(bytes(320)) == MIN_DBFS
    square = np.tile(np.array([32767, -32767], dtype="<i2"), 80).tobytes()
    assert energy_dbfs(square) == pytest.approx(0.0, abs=0.01)
    sine = np.sin(2 * np.pi * 1000 * np.arange(160) / 8000) * 32767
    assert energy_dbfs(sine.astype("<i2").tobytes()) == pytest.approx(-3.01, abs=0.01)
    with pytest.raises(ValueError):
        Vad(aggressiveness=4)
    with pytest.raises(ValueError):
        Vad(sample_rate_hz=11025)


# ---------------------------------------------------------------- line noise, babble, quiet callers

DAEMON = BargeInPolicy(min_speech_ms=60, energy_floor_dbfs=-48.0, echo_return_loss_db=30.0)
"""The daemon's ``[bargein]`` defaults (the policy's own), stated."""
NO_RISE = BargeInPolicy(
    min_speech_ms=60,
    energy_floor_dbfs=-48.0,
    echo_return_loss_db=30.0,
    noise_rise_db=0.0,
    babble_spread=0.0,
)


def levels(n: int, mean_dbfs: float, spread_db: float, seed: int) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).normal(mean_dbfs, spread_db, n)]


def run_levels(det: BargeInDetector, dbfs: list[float], bot_dbfs: float | None = None) -> list[int]:
    """Every frame VAD-speech at the given levels, the bot speaking; frames that trigger."""
    det.set_bot_speaking(True)
    out = []
    for i, level in enumerate(dbfs):
        now = round(i * FRAME_S, 6)
        if bot_dbfs is not None:
            det.record_bot_level(bot_dbfs, now)
        if det.observe(True, level, now) is not None:
            out.append(i)
            det.set_bot_speaking(False)  # the call cuts the turn; the next one starts
            det.set_bot_speaking(True)
    return out


@pytest.mark.parametrize("babble_dbfs", [-40.0, -35.0])
def test_babble_is_not_the_caller(babble_dbfs: float) -> None:
    # 10 s of babble-like level (speech to the VAD, 3 dB of frame-to-frame
    # spread) from the first frame of the call: it sits at the line's floor.
    babble = levels(500, babble_dbfs, 3.0, seed=11)
    assert run_levels(BargeInDetector(DAEMON), babble) == []
    assert run_levels(BargeInDetector(NO_RISE), babble) != []  # VAD and energy floor alone


def test_steady_loud_line_noise_is_not_the_caller() -> None:
    hiss = levels(500, -40.0, 0.7, seed=12)  # webrtcvad often calls such noise speech
    assert run_levels(BargeInDetector(DAEMON), hiss) == []
    assert run_levels(BargeInDetector(NO_RISE), hiss) != []


def test_caller_rising_out_of_babble_is_detected() -> None:
    line = levels(100, -40.0, 3.0, seed=13) + levels(50, -22.0, 4.0, seed=14)
    first = run_levels(BargeInDetector(DAEMON), line)[0]
    assert 100 <= first <= 102  # by its 3rd frame (60 ms); babble credit may count


def test_quiet_caller_under_a_loud_bot_is_detected() -> None:
    # A -30 dBFS caller over -50 dBFS line noise while the bot plays at -6 dBFS
    # (no echo on the line): the old level guard (15 dB) hid the caller.
    line = levels(50, -50.0, 0.7, seed=15) + levels(50, -30.0, 3.0, seed=16)
    assert run_levels(BargeInDetector(DAEMON), line, bot_dbfs=-6.0)[:1] == [52]  # 3rd frame
    old_guard = BargeInPolicy(min_speech_ms=60, energy_floor_dbfs=-48.0, echo_return_loss_db=15.0)
    assert run_levels(BargeInDetector(old_guard), line, bot_dbfs=-6.0) == []


def test_caller_talking_from_the_first_frame_is_detected() -> None:
    # The floor learns the line in the call's first frames, but not from frames
    # rising as a run must: a caller already talking is not taken for the line.
    assert run_levels(BargeInDetector(DAEMON), levels(30, -20.0, 3.0, seed=17))[:1] == [2]


def test_noise_floor_follows_the_line_both_ways() -> None:
    det = BargeInDetector(DAEMON)
    run_levels(det, levels(200, -40.0, 0.5, seed=18))
    assert det.noise_floor_dbfs == pytest.approx(-40.0, abs=1.0)
    run_levels(det, levels(200, -55.0, 0.5, seed=19))
    assert det.noise_floor_dbfs == pytest.approx(-55.0, abs=1.5)


def test_echo_at_minus_10_db_60_ms_is_not_the_caller_with_the_echo_check() -> None:
    from bridge.media.echo import EchoCorrelator

    rng = np.random.default_rng(20)
    bot = voiced(3.0) * 0.5  # about -12 dBFS
    delay = int(0.060 * 8000)
    echo = np.concatenate([np.zeros(delay), bot[:-delay]]) * 10 ** (-10 / 20)
    inbound = echo + rng.normal(0.0, 1.0, len(echo)) * 10 ** (-50 / 20)

    def triggers(correlate: bool) -> int:
        vad, corr, det = Vad(3), EchoCorrelator(), BargeInDetector(DAEMON)
        det.set_bot_speaking(True)
        count = 0
        for k in range(len(bot) // 160):
            out = to_pcm(bot[k * 160 : (k + 1) * 160], 1.0)
            corr.push_outbound(out)
            det.record_bot_level(energy_dbfs(out), k * FRAME_S)
            frame = to_pcm(np.clip(inbound[k * 160 : (k + 1) * 160], -1, 1), 1.0)
            analysis = vad.analyze(frame)
            speech = analysis.is_speech and not (correlate and corr.is_echo(frame))
            if det.observe(speech, analysis.energy_dbfs, k * FRAME_S) is not None:
                count += 1
                det.set_bot_speaking(False)
                det.set_bot_speaking(True)
        return count

    assert triggers(correlate=True) == 0
    assert triggers(correlate=False) > 0  # 20 dB above the line: only the correlation tells


def test_level_for_the_detector_ignores_a_dc_offset() -> None:
    sine = np.sin(2 * np.pi * 1000 * np.arange(160) / 8000) * 8000
    assert ac_energy_dbfs(sine.astype("<i2").tobytes()) == pytest.approx(
        energy_dbfs(sine.astype("<i2").tobytes()), abs=0.01
    )
    offset = (sine + 12000).astype("<i2").tobytes()
    assert energy_dbfs(offset) > -8.0  # the offset reads as a loud level
    assert ac_energy_dbfs(offset) == pytest.approx(-15.2, abs=0.1)  # the sine alone
    flat = np.full(160, 12400, dtype="<i2").tobytes()
    assert ac_energy_dbfs(flat) == MIN_DBFS
    assert Vad().analyze(flat).energy_dbfs == MIN_DBFS


def test_a_peer_sending_a_constant_sample_is_silent() -> None:
    # baresip's "silent" microphone reached the daemon as a constant -8 dBFS
    # sample: webrtcvad calls the step speech for 4 frames, which met an 80 ms
    # (or 60 ms) minimum when the level included the offset.
    frames = [bytes(320)] * 3 + [np.full(160, 12400, dtype="<i2").tobytes()] * 60
    vad = Vad(3)
    analyses = [vad.analyze(f) for f in frames]
    with_offset = [(a.is_speech, energy_dbfs(f)) for a, f in zip(analyses, frames, strict=True)]
    det = speaking_detector(DAEMON)
    assert all(
        det.observe(sp, e, i * FRAME_S) is None
        for i, (sp, e) in enumerate((a.is_speech, a.energy_dbfs) for a in analyses)
    )
    old = speaking_detector(DAEMON)
    assert any(old.observe(sp, e, i * FRAME_S) is not None for i, (sp, e) in enumerate(with_offset))


def clicks_pcm(seconds: float, per_s: float, peak: float, seed: int) -> bytes:
    """-50 dBFS hiss with 1-3 ms decaying bursts (a crackling line, a tapped handset)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 8000)
    x = rng.normal(0.0, 1.0, n) * 10 ** (-50 / 20)
    for at in rng.integers(0, n - 40, int(per_s * seconds)):
        length = int(rng.integers(8, 24))
        burst = np.exp(-np.arange(length) / (length / 4)) * rng.choice([-1.0, 1.0], length)
        x[at : at + length] += peak * burst
    return to_pcm(np.clip(x, -1, 1), 1.0)


def test_clicks_are_not_speech() -> None:
    audio = clicks_pcm(
        10.0, 20.0, 0.5, seed=21
    )  # 20 clicks a second at -6 dBFS peak (a crackling line)
    frames = [audio[i : i + 320] for i in range(0, len(audio), 320)]
    assert sum(is_click(f) for f in frames) >= 100  # most of the 200 clicks
    vad = Vad(3)
    assert not any(vad.analyze(f).is_speech and is_click(f) for f in frames)
    speech = to_pcm(voiced(1.0), 0.3)
    assert not any(is_click(speech[i : i + 320]) for i in range(0, len(speech), 320))

    def triggers(analyse: bool) -> int:
        vad, det = Vad(3), speaking_detector(DAEMON)
        count = 0
        for i, f in enumerate(frames):
            speech_flag = vad.analyze(f).is_speech if analyse else vad.is_speech(f)
            if det.observe(speech_flag, ac_energy_dbfs(f), i * FRAME_S) is not None:
                count += 1
                det.set_bot_speaking(False)
                det.set_bot_speaking(True)
        return count

    assert triggers(analyse=True) == 0
    assert triggers(analyse=False) > 0  # webrtcvad alone calls some click frames speech


def test_caller_starting_over_the_bots_echo_is_detected() -> None:
    # 2 s of the bot's echo on the line (speech-like level, 5 dB of spread; the
    # call flags it, so it arrives as non-speech), then a caller 10 dB above
    # the echo's mean level. The echo must not teach the detector that the
    # line is as jumpy as babble (it did: a 15 dB rise was then needed).
    det = speaking_detector(DAEMON)
    echo = levels(100, -36.0, 5.0, seed=22)
    for i, level in enumerate(echo):
        assert det.observe(False, level, round(i * FRAME_S, 6)) is None
    caller = levels(25, -26.0, 2.0, seed=23)
    hits = [
        i
        for i, level in enumerate(caller)
        if det.observe(True, level, round((100 + i) * FRAME_S, 6)) is not None
    ]
    assert hits and hits[0] <= 9  # within 200 ms (10 dB is close to the 9 dB needed)


def test_bot_frames_recorded_as_sent_decide_exactly_as_their_levels() -> None:
    # ``record_bot_frame`` keeps the frame and measures it only when the echo
    # guard needs it (an inbound frame the VAD calls speech, above the floor):
    # every decision is the one ``record_bot_level`` of the same level gives.
    rng = np.random.default_rng(21)
    measured: list[bytes] = []

    def level_of(frame: bytes) -> float:
        measured.append(frame)
        return energy_dbfs(frame)

    policy = BargeInPolicy(min_speech_ms=60, energy_floor_dbfs=-48.0, echo_return_loss_db=6.0)
    by_level, by_frame = BargeInDetector(policy), BargeInDetector(policy, frame_level=level_of)
    for det in (by_level, by_frame):
        det.set_bot_speaking(True)
    caller = levels(300, -30.0, 6.0, seed=22)
    for i, level in enumerate(caller):
        now = round(i * FRAME_S, 6)
        if i % 11 != 3:  # the bot sends most ticks, at changing levels
            out = to_pcm(rng.normal(0.0, 10 ** (rng.uniform(-40, -10) / 20), 160), 1.0)
            by_level.record_bot_level(energy_dbfs(out), now)
            by_frame.record_bot_frame(out, now)
        speech = i % 7 < 4
        assert by_frame.observe(speech, level, now) == by_level.observe(speech, level, now), i
        assert by_frame.events_received() == by_level.events_received(), i
    assert 0 < len(measured) < 300  # some frames measured (once each), not every frame
    assert len(measured) == len(set(map(id, measured)))


@pytest.mark.parametrize("codec", ["pcm_s16le", "mulaw"])
def test_a_window_shared_with_the_echo_ring_decides_exactly_as_recording_every_frame(
    codec: str,
) -> None:
    # The call stores each outbound frame once, in the echo correlator's ring,
    # and the detector reads its window from there (``bot_frames``). Every
    # decision must be the one a detector recording every frame makes: also
    # when the ring overwrites frames still inside the window (a burst of lead
    # frames at one time, more than the ring holds), on silent ticks, and for
    # a frame the ring cannot hold (the wrong size), which it spills. The loud
    # frames are the burst's first and the bad-sized ones: caller runs right
    # after them are blocked by the guard only if it still sees them.
    rng = np.random.default_rng(41)
    frame_bytes = 160 if codec == "mulaw" else 320

    def level_of(frame: bytes) -> float:
        return energy_dbfs(g711.ulaw_decode(frame) if codec == "mulaw" else frame)

    policy = BargeInPolicy(min_speech_ms=60, energy_floor_dbfs=-48.0, echo_return_loss_db=10.0)
    recording = BargeInDetector(policy, frame_level=level_of)
    echo = EchoCorrelator(outbound_codec=codec)
    sharing = BargeInDetector(policy, frame_level=level_of, bot_frames=echo.bot_frames)
    echo.share_window(sharing.echo_window_s, sharing.spill_sink())
    started = 0
    for i in range(600):
        now = round(i * FRAME_S, 6)
        burst = 25 if i % 100 == 10 else 1  # a turn's lead frames, all at one time
        for k in range(burst if i % 11 != 3 else 0):  # most ticks send a frame
            loud = (burst > 1 and k < 10) or i % 100 == 60
            dbfs = rng.uniform(-14, -10) if loud else rng.uniform(-60, -50)
            pcm = to_pcm(rng.normal(0.0, 10 ** (dbfs / 20), 160), 1.0)
            out = g711.ulaw_encode(pcm) if codec == "mulaw" else pcm
            if i % 100 == 60:
                out = out[: frame_bytes - 2]  # a bad size: the ring spills it
            recording.record_bot_frame(out, now)
            echo.push_outbound(out, now)
        if i % 11 == 3:
            echo.push_outbound(None, now)  # a tick with nothing to send
        speech = i % 25 in range(11, 19)  # caller runs: every other one right after loud frames
        level = -28.0 + rng.uniform(-1, 1) if speech else -70.0 + rng.uniform(-1, 1)
        for det in (recording, sharing):
            det.set_bot_speaking(i % 25 > 5)  # re-armed for every run
        assert sharing.observe(speech, level, now) == recording.observe(speech, level, now), i
        events = recording.events_received()
        assert sharing.events_received() == events, i
        started += sum(isinstance(e, SpeechStarted) for e in events)
    assert 0 < started < 24  # the guard blocked some runs, not all


def test_has_events_says_when_speech_started_or_stopped() -> None:
    det = speaking_detector(BargeInPolicy(noise_rise_db=0.0, min_speech_ms=60))
    for i, c in enumerate("..SSS" + "." * 25):
        det.observe(c == "S", LOUD_DBFS if c == "S" else MIN_DBFS, round(i * FRAME_S, 6))
        events = det.events_received() if det.has_events() else []
        assert det.has_events() is False
        assert [type(e) for e in events] == (
            [SpeechStarted] if i == 4 else [SpeechStopped] if i == 24 else []
        ), i


def test_quiet_frames_skip_the_mean_and_read_the_same_level() -> None:
    # ``speech_and_level`` measures the mean (DC offset) only when the RMS is 64
    # or more: below, |mean| cannot exceed the offset limit. Its level must be
    # ``ac_energy_dbfs``'s (which always measures the mean) for quiet frames
    # with offsets on both sides of that limit, and at the boundary itself.
    rng = np.random.default_rng(31)
    frames = [bytes(320), np.full(160, -1, dtype="<i2").tobytes()]
    frames.append(np.array([-64] * 159 + [-65], dtype="<i2").tobytes())  # rms 64, avg -65
    frames.append(np.array([-63] * 159 + [-64], dtype="<i2").tobytes())  # rms 63
    for offset in (-66, -65, -64, -63, -10, 0, 10, 63, 64, 65, 66):
        for sigma in (0.0, 0.4, 3.0, 20.0, 60.0):
            x = np.round(offset + rng.normal(0.0, sigma, 160))
            frames.append(np.clip(x, -32768, 32767).astype("<i2").tobytes())
    vad = Vad(2)
    for frame in frames:
        assert vad.speech_and_level(frame)[1] == ac_energy_dbfs(frame)

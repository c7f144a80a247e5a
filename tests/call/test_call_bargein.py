"""CallBridge barge-in: speech and DTMF, RTP and mark-based legs, non-interruptible turns."""

from __future__ import annotations

from typing import Any

import pytest
from call_harness import (
    SIP,
    TWILIO,
    ULAW_SILENCE_FRAME,
    Harness,
    at,
    of_type,
    tone_ulaw_frames,
    voiced_s16le,
    voiced_ulaw_frames,
)

from bridge.commands import (
    CallEnded,
    Cancel,
    DtmfHeard,
    SpeechStarted,
    SpeechStopped,
    TurnBegan,
    TurnFinished,
    TurnInterrupted,
)
from bridge.media.bargein import BargeInPolicy
from bridge.media.call_types import CancelTurn, ClearLeg, LegProfile, SendMark
from bridge.providers.base import AudioFormat, TurnDone, WordsTimed, WordTiming

WORDS = (
    WordTiming("The", 0.00, 0.10),
    WordTiming("quick", 0.12, 0.40),
    WordTiming("brown", 0.45, 0.70),
    WordTiming("fox", 0.75, 1.00),
    WordTiming("jumps", 1.05, 1.50),
)


SLOW = BargeInPolicy(min_speech_ms=160, vad_aggressiveness=2)
"""Slower than the daemon's defaults (60 ms, mode 3), stated where a test counts the frames."""


def playing(
    leg: LegProfile = SIP, frames: int = 100, policy: BargeInPolicy | None = None, **say: Any
) -> tuple[Harness, list[bytes]]:
    """A call with turn t1 fully delivered (``frames`` x 20 ms) and word timings."""
    h = Harness(leg, policy)
    h.say("t1", "The quick brown fox jumps", **say)
    audio = tone_ulaw_frames(frames)
    h.frames("t1", audio, now=0.0)
    h.provide(WordsTimed("t1", WORDS), now=0.0)
    h.provide(TurnDone("t1"), now=0.0)
    return h, audio


def test_caller_speech_barges_in_after_min_speech_and_playout_stops_next_tick() -> None:
    h, audio = playing(policy=SLOW)
    voice = voiced_ulaw_frames(1.0)
    sent: list[bytes] = []
    interrupted: list[TurnInterrupted] = []
    n = 0
    while not interrupted:
        n += 1
        assert n < 80, "no barge-in"
        frame = h.tick(n)
        assert frame is not None
        sent.append(frame)
        caller_t = at(n) + 0.005  # the caller's frame for this period arrives just after
        k = n - 25  # the caller starts talking at tick 25 (0.5 s)
        h.caller(voice[k] if k >= 0 else ULAW_SILENCE_FRAME, caller_t)
        interrupted = of_type(h.events, TurnInterrupted)
    actions, events = h.take()
    assert sent == audio[: len(sent)]
    (turn_interrupted,) = interrupted
    heard_ms = 20 * len(sent)
    assert turn_interrupted == TurnInterrupted(
        "t1",
        heard_ms,
        " ".join(w.word for w in WORDS if w.end_s <= heard_ms / 1000),
        "speech",
    )
    assert of_type(actions, CancelTurn) == [CancelTurn("t1")]
    assert of_type(actions, ClearLeg) == []  # RTP: nothing buffered far away to clear
    speech = of_type(events, SpeechStarted)
    assert len(speech) == 1
    assert events.index(speech[0]) < events.index(turn_interrupted)
    (timing,) = h.call.stats().bargein_timings
    assert timing.onset_s >= 0.5
    assert timing.latency_s >= 0.14 - 1e-9  # min_speech_ms 160 = 8 frames, onset included
    assert timing.latency_s < 0.3
    assert timing.last_frame_s == at(n)
    assert timing.decided_s == at(n) + 0.005
    assert h.call.stats().barge_ins == {"speech": 1}
    assert h.tick(n + 1) is None  # the very next tick sends nothing of t1
    assert h.call.stats().underruns == 0


def test_a_short_noise_burst_does_not_interrupt() -> None:
    h, audio = playing(policy=SLOW)
    burst = voiced_ulaw_frames(0.1)  # 5 frames < min_speech_ms
    for n in range(1, 40):
        assert h.tick(n) == audio[n - 1]
        k = n - 10
        h.caller(burst[k] if 0 <= k < len(burst) else ULAW_SILENCE_FRAME, at(n) + 0.005)
    assert of_type(h.events, TurnInterrupted) == []
    assert of_type(h.events, SpeechStarted) == []


def test_caller_speech_while_the_bot_is_silent_is_reported_not_a_barge_in() -> None:
    h = Harness()
    voice = voiced_ulaw_frames(0.6)
    for n in range(1, 60):
        assert h.tick(n) is None
        k = n - 5
        h.caller(voice[k] if 0 <= k < len(voice) else ULAW_SILENCE_FRAME, at(n) + 0.005)
    actions, events = h.take()
    assert actions == []
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    assert h.call.stats().barge_ins == {}


def test_dtmf_barges_in_with_exact_heard_position() -> None:
    h, audio = playing()
    assert [h.tick(n) for n in range(1, 31)] == audio[:30]  # 600 ms sent
    h.take()
    h.call.caller_dtmf("5", at(30) + 0.007)
    actions, events = h.take()
    assert actions == [CancelTurn("t1")]
    assert events == [DtmfHeard("5"), TurnInterrupted("t1", 600, "The quick", "dtmf")]
    assert h.tick(31) is None
    assert h.call.stats().barge_ins == {"dtmf": 1}
    # Late audio and the provider's cancel confirmation change nothing.
    h.frames("t1", audio[:10], now=at(31) + 0.001)
    h.provide(TurnDone("t1", cancelled=True), now=at(31) + 0.002)
    assert h.tick(32) is None
    actions, events = h.take()
    assert actions == [] and events == []
    assert h.call.stats().late_chunks_dropped == 1


def test_dtmf_while_silent_is_only_heard() -> None:
    h = Harness()
    h.call.caller_dtmf("#", 0.1)
    actions, events = h.take()
    assert actions == []
    assert events == [DtmfHeard("#")]


def test_dtmf_does_not_interrupt_when_the_policy_says_so() -> None:
    h = Harness(SIP, BargeInPolicy(dtmf_triggers=False))
    h.say("t1")
    audio = tone_ulaw_frames(5)
    h.frames("t1", audio, now=0.0)
    assert h.tick(1) == audio[0]
    h.call.caller_dtmf("1", at(1) + 0.005)
    assert h.tick(2) == audio[1]
    assert of_type(h.events, TurnInterrupted) == []


def test_non_interruptible_turn_plays_through_a_barge_in() -> None:
    h = Harness(TWILIO)
    h.say("legal", "Calls are recorded.", interruptible=False)
    h.say("t2", "How can I help?")
    legal = tone_ulaw_frames(40, 440.0)
    h.frames("legal", legal, now=0.0)
    h.provide(TurnDone("legal"), now=0.0)
    h.frames("t2", tone_ulaw_frames(10, 880.0), now=0.0)
    assert [h.tick(n) for n in range(1, 11)] == legal[:10]
    h.take()
    assert h.call.barge_in("api", at(10) + 0.005) == ["t2"]
    actions, events = h.take()
    assert actions == [CancelTurn("t2")]  # no ClearLeg: it would cut the legal prompt
    assert events == [TurnInterrupted("t2", 0, "", "api")]
    # Caller speech over the prompt does not arm the detector either.
    voice = voiced_ulaw_frames(0.6)
    sent = []
    for n in range(11, 41):
        sent.append(h.tick(n))
        h.caller(voice[n - 11] if n - 11 < len(voice) else ULAW_SILENCE_FRAME, at(n) + 0.005)
    assert sent == legal[10:]
    assert of_type(h.events, TurnInterrupted) == []
    assert of_type(h.actions, ClearLeg) == []


def test_mark_leg_heard_position_comes_only_from_echoed_marks() -> None:
    h, audio = playing(TWILIO, frames=50)
    assert [h.tick(n) for n in range(1, 26)] == audio[:25]  # 500 ms sent
    actions, _ = h.take()
    marks = [a.name for a in of_type(actions, SendMark)]
    assert len(marks) == 2  # every 200 ms (mark_interval_ms of the TWILIO profile)
    h.call.mark_echoed(marks[0], False, at(25) + 0.001)  # the carrier played 200 ms
    h.call.caller_dtmf("9", at(25) + 0.005)
    actions, events = h.take()
    assert actions == [ClearLeg(), CancelTurn("t1")]
    # 500 ms were sent; the carrier played 200 ms by the echo and kept playing for
    # the 4 ms until the clear, so 204 ms were heard (not the 500 ms sent).
    assert of_type(events, TurnInterrupted) == [TurnInterrupted("t1", 204, "The", "dtmf")]
    # Twilio echoes the pending mark because of the clear: it must not count.
    h.call.mark_echoed(marks[1], True, at(25) + 0.03)
    h.call.mark_echoed(marks[1], False, at(25) + 0.031)
    assert h.tick(26) is None
    actions, events = h.take()
    assert actions == [] and events == []


def test_mark_leg_turn_finishes_when_its_final_mark_is_echoed() -> None:
    h, audio = playing(TWILIO, frames=15)
    assert [h.tick(n) for n in range(1, 16)] == audio
    actions, events = h.take()
    marks = [a.name for a in of_type(actions, SendMark)]
    assert len(marks) == 2  # at 200 ms and the final one at 300 ms
    assert events == [TurnBegan("t1")]
    assert h.tick(16) is None
    h.call.mark_echoed(marks[0], False, 0.5)
    h.call.mark_echoed(marks[1], False, 0.6)
    _, events = h.take()
    assert events == [TurnFinished("t1", 300, "The quick brown fox jumps")]


def test_mark_leg_barge_in_while_the_final_mark_is_in_flight_clears() -> None:
    h, audio = playing(TWILIO, frames=15)
    assert [h.tick(n) for n in range(1, 16)] == audio
    actions, _ = h.take()
    marks = [a.name for a in of_type(actions, SendMark)]
    h.call.mark_echoed(marks[0], False, at(15) + 0.001)
    h.call.caller_dtmf("0", at(15) + 0.002)
    actions, events = h.take()
    assert actions == [ClearLeg()]  # the provider turn was already done
    # the 200 ms mark was echoed 1 ms before the clear: 201 ms heard
    assert of_type(events, TurnInterrupted) == [TurnInterrupted("t1", 201, "The", "dtmf")]
    h.call.mark_echoed(marks[1], True, at(15) + 0.02)
    assert h.take() == ([], [])


def test_mark_leg_without_clear_reports_what_was_sent() -> None:
    leg = LegProfile(
        kind="vonage", codec="mulaw", heard_from="marks", can_clear=False, mark_interval_ms=200
    )
    h, audio = playing(leg, frames=50)
    assert [h.tick(n) for n in range(1, 21)] == audio[:20]
    h.take()
    h.call.caller_dtmf("1", at(20) + 0.005)
    actions, events = h.take()
    assert actions == [CancelTurn("t1")]
    # Nothing can stop the carrier: everything sent will be heard.
    assert of_type(events, TurnInterrupted) == [TurnInterrupted("t1", 400, "The quick", "dtmf")]


@pytest.mark.parametrize("reason", ["speech", "api"])
def test_barge_in_with_nothing_playing_changes_nothing(reason: str) -> None:
    h = Harness()
    assert h.call.barge_in(reason, 0.1) == []
    assert h.take() == ([], [])
    assert h.call.stats().barge_ins == {}


def test_mark_leg_with_everything_acknowledged_needs_no_clear() -> None:
    h, audio = playing(TWILIO, frames=50)
    assert [h.tick(n) for n in range(1, 21)] == audio[:20]  # 400 ms sent
    actions, _ = h.take()
    for mark in of_type(actions, SendMark):
        h.call.mark_echoed(mark.name, False, at(20) + 0.001)
    h.call.caller_dtmf("2", at(20) + 0.002)
    actions, events = h.take()
    assert actions == [CancelTurn("t1")]  # the carrier has nothing left of t1 to clear
    assert of_type(events, TurnInterrupted) == [TurnInterrupted("t1", 400, "The quick", "dtmf")]


def test_cancel_while_the_final_mark_is_in_flight_keeps_the_other_turn_waiting() -> None:
    h = Harness(TWILIO)
    h.say("t1")
    h.say("t2")
    h.frames("t1", tone_ulaw_frames(3), now=0.0)
    h.provide(TurnDone("t1"), now=0.0)
    h.frames("t2", tone_ulaw_frames(3, 880.0), now=0.0)
    h.provide(TurnDone("t2"), now=0.0)
    assert all(h.tick(n) is not None for n in range(1, 7))
    actions, _ = h.take()
    final_t1, final_t2 = [a.name for a in of_type(actions, SendMark)]
    h.call.mark_echoed(final_t1, False, at(6) + 0.001)  # t1 played out
    h.call.execute(Cancel("t2"), at(6) + 0.002)
    actions, events = h.take()
    assert actions == [ClearLeg()]
    assert events == [
        TurnFinished("t1", 60, ""),
        TurnInterrupted("t2", 0, "", "cancelled"),
    ]
    h.call.mark_echoed(final_t2, True, at(6) + 0.01)
    assert h.take() == ([], [])


def test_a_clear_also_cuts_a_turn_whose_final_mark_it_voids() -> None:
    h = Harness(TWILIO)
    h.say("t1")
    h.say("t2")
    h.frames("t1", tone_ulaw_frames(3), now=0.0)
    h.provide(TurnDone("t1"), now=0.0)
    h.frames("t2", tone_ulaw_frames(3, 880.0), now=0.0)
    assert all(h.tick(n) is not None for n in range(1, 7))
    actions, _ = h.take()
    (final_t1,) = [a.name for a in of_type(actions, SendMark)]
    h.call.execute(Cancel("t2"), at(6) + 0.001)
    actions, events = h.take()
    assert actions == [ClearLeg(), CancelTurn("t2")]
    # t1's final mark was not echoed, so it is reported cut (once); its 60 ms left
    # 100 ms ago and the carrier plays at real time, so all of it was heard. t2
    # queued behind it at the carrier: when it began playing is unknown, so 0.
    assert events == [
        TurnInterrupted("t2", 0, "", "cancelled"),
        TurnInterrupted("t1", 60, "", "cancelled"),
    ]
    h.call.mark_echoed(final_t1, True, at(6) + 0.01)
    h.call.hangup_received("bye", at(7))
    _, events = h.take()
    assert events == [CallEnded("bye")]


def test_wideband_caller_speech_barges_in() -> None:
    leg = LegProfile(kind="webrtc", codec="pcm_s16le", sample_rate_hz=16000)
    h = Harness(leg)
    h.say("t1")
    h.audio("t1", bytes(640) * 50, now=0.0, audio_format=AudioFormat("pcm_s16le", 16000))
    voice = voiced_s16le(1.0, rate_hz=16000)
    for n in range(1, 50):
        assert h.tick(n) == bytes(640)
        h.caller(voice[(n - 1) * 640 : n * 640], at(n) + 0.005)
        if of_type(h.events, TurnInterrupted):
            break
    assert of_type(h.events, TurnInterrupted)[0].reason == "speech"
    assert h.tick(n + 1) is None


def test_mark_leg_heard_position_before_any_echo_is_the_time_the_carrier_has_played() -> None:
    """Between echoes the carrier plays at real time: heard = time since the first frame."""
    h, audio = playing(TWILIO, frames=50)
    assert [h.tick(n) for n in range(1, 9)] == audio[:8]  # 160 ms sent, no mark echoed yet
    h.take()
    h.call.caller_dtmf("5", at(8) + 0.010)  # first frame left at at(1): 150 ms of playing
    _, events = h.take()
    (cut,) = of_type(events, TurnInterrupted)
    assert cut.heard_ms == 150


def test_mark_leg_heard_estimate_never_exceeds_what_was_sent() -> None:
    h, audio = playing(TWILIO, frames=50)
    assert [h.tick(n) for n in range(1, 6)] == audio[:5]  # 100 ms sent
    h.take()
    h.call.caller_dtmf("5", at(5) + 2.0)  # long after: the carrier ran dry at 100 ms
    _, events = h.take()
    (cut,) = of_type(events, TurnInterrupted)
    assert cut.heard_ms == 100


def test_caller_speech_alone_barges_in_as_caller_audio_does() -> None:
    """A SIP leg feeds the detector each frame as it arrives (``caller_speech``) and the
    in-order stream separately (``caller_playout``): the same frames through
    ``caller_speech`` interrupt at the same tick, with the same heard position."""

    def run(feed: str) -> tuple[int, list[TurnInterrupted]]:
        h, _ = playing(policy=SLOW)
        voice = voiced_ulaw_frames(1.0)
        for n in range(1, 80):
            h.tick(n)
            k = n - 25
            frame = voice[k] if k >= 0 else ULAW_SILENCE_FRAME
            if feed == "audio":
                h.caller(frame, at(n) + 0.005)
            else:
                h.call.caller_speech(frame, at(n) + 0.005)
                h.call.caller_playout(frame, at(n) + 0.005)  # no agent: takes nothing
                h.drain()
            if of_type(h.events, TurnInterrupted):
                return n, of_type(h.events, TurnInterrupted)
        raise AssertionError("no barge-in")

    n_audio, interrupted_audio = run("audio")
    n_speech, interrupted_speech = run("speech")
    assert (n_speech, interrupted_speech) == (n_audio, interrupted_audio)


def test_caller_playout_never_reaches_the_detector() -> None:
    h, audio = playing(policy=SLOW)
    voice = voiced_ulaw_frames(1.0)
    for n in range(1, 50):
        assert h.tick(n) == audio[n - 1]
        h.call.caller_playout(voice[n], at(n) + 0.005)
        h.drain()
    assert of_type(h.events, SpeechStarted) == []
    assert of_type(h.events, TurnInterrupted) == []
    assert not h.call.takes_playout

"""CallBridge turns: opening, pacing, pass-through and transcoding, queueing, errors, hangup."""

from __future__ import annotations

import numpy as np
import pytest
from call_harness import (
    PCM_24K,
    SIP,
    Harness,
    at,
    of_type,
    tone_s16le,
    tone_ulaw_frames,
)

from bridge.commands import (
    CallEnded,
    Cancel,
    CommandRejected,
    HandOver,
    Hangup,
    ProviderErrored,
    SendDtmf,
    Transfer,
    TurnBegan,
    TurnFinished,
    TurnInterrupted,
)
from bridge.media.call_types import (
    CallOptions,
    CancelTurn,
    ConnectApp,
    EndTurn,
    HangupLeg,
    LegProfile,
    OpenTurn,
    SendLegDtmf,
    SendTurnText,
    TransferLeg,
)
from bridge.providers.base import (
    ALAW_8K,
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    TurnFailed,
    WordsTimed,
    WordTiming,
)
from telcodec import g711


def test_say_opens_a_turn_asking_for_the_leg_format() -> None:
    h = Harness()
    h.say("t1", "Hello ", final=False, voice="anna", provider="kova", cacheable=True)
    h.say("t1", "world.")
    actions, events = h.take()
    assert len(actions) == 4
    open_turn, text1, text2, end = actions
    assert isinstance(open_turn, OpenTurn)
    assert open_turn.turn_id == "t1"
    assert open_turn.provider == "kova"
    assert open_turn.cacheable
    assert open_turn.settings.voice == "anna"
    assert open_turn.settings.audio_format == MULAW_8K
    assert (text1, text2, end) == (
        SendTurnText("t1", "Hello "),
        SendTurnText("t1", "world."),
        EndTurn("t1"),
    )
    assert events == []
    assert h.call.stats().turns == 1


def test_first_frame_goes_out_on_the_first_tick_after_20_ms_exist() -> None:
    h = Harness()
    h.say("t1", now=0.0)
    assert h.tick(1) is None  # waiting for the provider is not an underrun
    h.audio("t1", b"\x10" * 100, now=0.030)  # 12.5 ms: not a whole frame
    assert h.tick(2) is None
    h.audio("t1", b"\x20" * 60, now=0.050)
    assert h.tick(3) == b"\x10" * 100 + b"\x20" * 60  # pass-through, byte for byte
    _, events = h.take()
    assert events == [TurnBegan("t1")]
    stats = h.call.stats()
    assert stats.underruns == 0
    assert stats.time_to_first_audio_s == pytest.approx((0.030,))
    assert stats.added_latency_s == pytest.approx((at(3) - 0.030,))


def test_pacing_is_one_frame_per_tick_in_order_then_turn_finished() -> None:
    h = Harness()
    h.say("t1")
    frames = tone_ulaw_frames(50)
    h.frames("t1", frames, now=0.01)
    words = (WordTiming("one", 0.0, 0.3), WordTiming("two", 0.35, 0.9))
    h.provide(WordsTimed("t1", words), now=0.01)
    h.done("t1", now=0.01)
    sent = [h.tick(n) for n in range(1, 51)]
    assert sent == frames
    _, events = h.take()
    assert events == [TurnBegan("t1"), TurnFinished("t1", 1000, "one two")]
    assert h.tick(51) is None
    assert h.call.stats().frames_sent == 50
    assert h.call.stats().turns_finished == 1


def test_underrun_is_silence_and_counted() -> None:
    h = Harness()
    h.say("t1")
    frames = tone_ulaw_frames(4)
    h.frames("t1", frames[:2], now=0.0)
    assert h.tick(1) == frames[0]
    assert h.tick(2) == frames[1]
    assert h.tick(3) is None
    assert h.tick(4) is None
    h.frames("t1", frames[2:], now=at(4) + 0.005)
    h.done("t1", now=at(4) + 0.006)
    assert h.tick(5) == frames[2]
    assert h.tick(6) == frames[3]
    _, events = h.take()
    assert events[-1] == TurnFinished("t1", 80, "")
    assert h.call.stats().underruns == 2


def test_pcm_24k_is_resampled_to_mulaw_frames_and_flushed_padded() -> None:
    h = Harness()
    h.say("t1")
    pcm = tone_s16le(440.0, 0.5, 24000, peak=0.5)
    for k in range(0, len(pcm), 4800):  # 100 ms chunks
        h.audio("t1", pcm[k : k + 4800], now=0.0, audio_format=PCM_24K)
    h.done("t1", now=0.0)
    out = []
    n = 1
    while (frame := h.tick(n)) is not None:
        out.append(frame)
        n += 1
    assert all(len(f) == 160 for f in out)
    assert len(out) in (25, 26)  # 0.5 s of audio, the last frame padded with 0xFF
    decoded = np.frombuffer(g711.ulaw_decode(b"".join(out)), dtype="<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(decoded[400:3600]))
    peak_hz = np.argmax(spectrum) * 8000 / 3200
    assert peak_hz == pytest.approx(440.0, abs=5.0)
    _, events = h.take()
    assert events[-1] == TurnFinished("t1", len(out) * 20, "")


def test_mulaw_audio_on_an_alaw_leg_is_translated() -> None:
    h = Harness(LegProfile(kind="sip", codec="alaw"))
    h.say("t1")
    actions, _ = h.take()
    assert isinstance(actions[0], OpenTurn)
    assert actions[0].settings.audio_format == ALAW_8K
    frames = tone_ulaw_frames(2)
    h.frames("t1", frames, now=0.0)
    assert h.tick(1) == g711.ulaw_to_alaw(frames[0])
    assert h.tick(2) == g711.ulaw_to_alaw(frames[1])


def test_wideband_linear_leg_gets_640_byte_frames() -> None:
    leg = LegProfile(kind="webrtc", codec="pcm_s16le", sample_rate_hz=16000)
    h = Harness(leg)
    h.say("t1")
    actions, _ = h.take()
    assert isinstance(actions[0], OpenTurn)
    assert actions[0].settings.audio_format == AudioFormat("pcm_s16le", 16000)
    h.audio("t1", tone_s16le(300.0, 0.2, 24000), now=0.0, audio_format=PCM_24K)
    h.done("t1", now=0.0)
    out = [h.tick(n) for n in range(1, 12)]
    frames = [f for f in out if f is not None]
    assert all(len(f) == 640 for f in frames)
    assert len(frames) in (10, 11)
    _, events = h.take()
    assert events[-1] == TurnFinished("t1", len(frames) * 20, "")


def test_turns_queue_behind_each_other() -> None:
    h = Harness()
    h.say("t1")
    h.say("t2")
    f1, f2 = tone_ulaw_frames(3, 440.0), tone_ulaw_frames(2, 880.0)
    h.frames("t2", f2, now=0.0)  # t2's provider is faster; it still waits its turn
    h.done("t2", now=0.0)
    h.frames("t1", f1, now=0.0)
    h.done("t1", now=0.0)
    assert [h.tick(n) for n in range(1, 7)] == [*f1, *f2, None]
    _, events = h.take()
    assert events == [
        TurnBegan("t1"),
        TurnFinished("t1", 60, ""),
        TurnBegan("t2"),
        TurnFinished("t2", 40, ""),
    ]
    # t2's first audio arrived while t1 was playing: not pipeline latency.
    assert len(h.call.stats().added_latency_s) == 1


def test_replace_cuts_the_playing_turn_at_once() -> None:
    h = Harness()
    h.say("t1")
    f1, f2 = tone_ulaw_frames(20, 440.0), tone_ulaw_frames(2, 880.0)
    h.frames("t1", f1, now=0.0)
    h.provide(WordsTimed("t1", (WordTiming("a", 0.0, 0.04), WordTiming("b", 0.05, 0.2))), 0.0)
    assert [h.tick(n) for n in (1, 2, 3)] == f1[:3]
    h.take()
    h.say("t2", "new", now=at(3) + 0.001, replace=True)
    actions, events = h.take()
    assert actions[:2] == [CancelTurn("t1"), actions[1]]
    assert isinstance(actions[1], OpenTurn)
    assert events == [TurnInterrupted("t1", 60, "a", "replaced")]
    assert h.tick(4) is None  # t1 is gone; t2 has no audio yet
    h.frames("t2", f2, now=at(4) + 0.001)
    assert h.tick(5) == f2[0]
    h.frames("t1", f1[:5], now=at(5) + 0.001)  # late audio for the cut turn
    assert h.tick(6) == f2[1]
    assert h.call.stats().late_chunks_dropped == 1


def test_cancel_command_stops_one_turn() -> None:
    h = Harness()
    h.say("t1")
    h.say("t2")
    f1, f2 = tone_ulaw_frames(10, 440.0), tone_ulaw_frames(2, 880.0)
    h.frames("t1", f1, now=0.0)
    h.frames("t2", f2, now=0.0)
    h.done("t2", now=0.0)
    assert [h.tick(n) for n in (1, 2)] == f1[:2]
    h.take()
    h.call.execute(Cancel("t1"), at(2) + 0.005)
    actions, events = h.take()
    assert actions == [CancelTurn("t1")]
    assert events == [TurnInterrupted("t1", 40, "", "cancelled")]
    assert [h.tick(n) for n in (3, 4, 5)] == [*f2, None]
    h.call.execute(Cancel("t1"), at(5))
    _, events = h.take()
    assert of_type(events, CommandRejected) == [CommandRejected("Cancel", "t1", "no_such_turn")]


def test_leg_commands_and_rejections() -> None:
    h = Harness()
    h.call.execute(Transfer("sip:desk@example.com"), 0.0)
    h.call.execute(SendDtmf("12#a"), 0.0)
    h.call.execute(SendDtmf("12x"), 0.0)
    h.call.execute(HandOver(app="wss://app.example/ws"), 0.0)
    h.call.execute(HandOver(), 0.0)
    h.call.execute(Transfer(""), 0.0)
    h.say("t1")
    h.say("t1", "more")  # the first say was final
    h.say("", "no id")
    actions, events = h.take()
    assert actions[:3] == [
        TransferLeg("sip:desk@example.com"),
        SendLegDtmf("12#A"),
        ConnectApp("wss://app.example/ws"),
    ]
    assert [(e.command, e.reason) for e in of_type(events, CommandRejected)] == [
        ("SendDtmf", "bad_digits"),
        ("HandOver", "nothing_to_hand_over"),
        ("Transfer", "empty_target"),
        ("Say", "turn_closed"),
        ("Say", "empty_turn_id"),
    ]


def test_a_leg_without_transfer_or_dtmf_refuses_them() -> None:
    """A media stream: no carrier protocol here transfers, most send no DTMF. The
    call refuses both (the app and the API learn why); bad digits are still bad."""
    stream = LegProfile(
        kind="twilio", codec="mulaw", heard_from="marks", can_transfer=False, can_send_dtmf=False
    )
    h = Harness(stream)
    h.call.execute(Transfer("sip:desk@example.com"), 0.0)
    h.call.execute(SendDtmf("12#"), 0.0)
    h.call.execute(SendDtmf("12x"), 0.0)
    actions, events = h.take()
    assert not [a for a in actions if isinstance(a, (TransferLeg, SendLegDtmf))]
    assert [(e.command, e.reason) for e in of_type(events, CommandRejected)] == [
        ("Transfer", "transfer_unsupported"),
        ("SendDtmf", "dtmf_unsupported"),
        ("SendDtmf", "bad_digits"),
    ]


def test_a_transfer_through_a_trunk_needs_a_configured_trunk() -> None:
    """``Transfer.trunk`` must name one of ``CallOptions.trunks`` (the config's); the
    leg gets it with the target."""
    h = Harness(options=CallOptions(trunks=frozenset({"carrier"})))
    h.call.execute(Transfer("tel:+15551234567", "carrier"), 0.0)
    h.call.execute(Transfer("tel:+15551234567", "ghost"), 0.0)
    actions, events = h.take()
    assert actions == [TransferLeg("tel:+15551234567", "carrier")]
    assert [(e.command, e.reason) for e in of_type(events, CommandRejected)] == [
        ("Transfer", "unknown_trunk")
    ]


def test_provider_error_mid_turn_ends_that_turn_and_the_call_goes_on() -> None:
    h = Harness()
    h.say("t1")
    h.say("t2")
    f1, f2 = tone_ulaw_frames(3, 440.0), tone_ulaw_frames(2, 880.0)
    h.frames("t1", f1, now=0.0)
    h.audio("t1", b"\x00" * 40, now=0.0)  # a partial frame, padded on failure
    assert h.tick(1) == f1[0]
    h.provide(TurnFailed("t1", "synthesis_failed", "voice crashed"), now=at(1) + 0.001)
    h.frames("t2", f2, now=at(1) + 0.002)
    h.done("t2", now=at(1) + 0.002)
    sent = [h.tick(n) for n in range(2, 8)]
    assert sent == [f1[1], f1[2], b"\x00" * 40 + b"\xff" * 120, f2[0], f2[1], None]
    _, events = h.take()
    assert events == [
        TurnBegan("t1"),
        ProviderErrored("t1", "", "synthesis_failed", "voice crashed"),
        TurnInterrupted("t1", 80, "", "provider_error"),
        TurnBegan("t2"),
        TurnFinished("t2", 40, ""),
    ]
    assert h.call.stats().provider_errors == 1


def test_provider_connection_failure_fails_only_the_named_turns() -> None:
    h = Harness()
    h.say("t1", provider="kova")
    h.say("t2", provider="coda")
    h.provide(ProviderFailed("closed", "socket closed", ("t1", "other-call")), now=0.1)
    h.frames("t2", tone_ulaw_frames(1), now=0.1)
    h.done("t2", now=0.1)
    assert h.tick(6) is not None
    _, events = h.take()
    assert events == [
        ProviderErrored("t1", "kova", "closed", "socket closed"),
        TurnInterrupted("t1", 0, "", "provider_error"),
        TurnBegan("t2"),
        TurnFinished("t2", 20, ""),
    ]


def test_unconvertible_provider_audio_is_a_turn_error_not_an_exception() -> None:
    h = Harness()
    h.say("t1", provider="zwst")
    h.provide(AudioReceived("t1", b"\x00" * 320, AudioFormat("pcm_s16le", 0)), now=0.1)
    _, events = h.take()
    assert [type(e) for e in events] == [ProviderErrored, TurnInterrupted]
    assert isinstance(events[0], ProviderErrored)
    assert events[0].kind == "bad_audio_format"
    assert h.tick(6) is None


def test_hangup_cancels_open_turns_and_ends_the_call() -> None:
    h = Harness()
    h.say("t1")
    h.say("t2", final=False)
    h.say("t3")
    f1 = tone_ulaw_frames(10)
    h.frames("t1", f1, now=0.0)
    h.done("t1", now=0.0)
    h.frames("t3", f1[:2], now=0.0)
    assert [h.tick(n) for n in (1, 2)] == f1[:2]
    h.take()
    h.call.hangup_received("caller_bye", at(2) + 0.01)
    actions, events = h.take()
    assert actions == [CancelTurn("t2"), CancelTurn("t3")]  # t1's provider was done
    assert events == [
        TurnInterrupted("t1", 40, "", "call_ended"),
        TurnInterrupted("t2", 0, "", "call_ended"),
        TurnInterrupted("t3", 0, "", "call_ended"),
        CallEnded("caller_bye"),
    ]
    assert h.call.ended
    assert h.tick(3) is None
    h.frames("t3", f1, now=at(3))
    h.say("t4")
    h.call.leg_ended(at(4))
    actions, events = h.take()
    assert actions == []
    assert events == [CommandRejected("Say", "", "call_ended")]
    assert h.call.stats().late_chunks_dropped == 1


def test_hangup_command_then_leg_end_reports_our_reason() -> None:
    h = Harness(SIP)
    h.call.execute(Hangup("flow_done"), 0.0)
    actions, _ = h.take()
    assert actions == [HangupLeg("flow_done")]
    h.call.leg_ended(0.5)
    _, events = h.take()
    assert events == [CallEnded("flow_done")]


def test_inbound_frames_of_the_wrong_size_are_counted_not_raised() -> None:
    h = Harness()
    h.caller(b"\xff" * 100, 0.0)
    h.caller(b"", 0.02)
    h.call.caller_dtmf("x", 0.03)
    h.call.mark_echoed("nobody", False, 0.04)
    actions, events = h.take()
    assert actions == [] and events == []
    assert h.call.stats().bad_inbound_frames == 2


def test_provider_queue_depth_reaches_the_turn_source_as_backlog() -> None:
    from bridge.commands import ProviderBacklog
    from bridge.providers.base import QueueDepthChanged

    h = Harness(SIP)
    h.say("t1")
    h.provide(QueueDepthChanged("t1", 3), now=0.0)
    _, events = h.take()
    assert ProviderBacklog("t1", 3) in events
    h.provide(QueueDepthChanged("nope", 9), now=0.0)  # an unknown turn: nothing
    _, events = h.take()
    assert not [e for e in events if isinstance(e, ProviderBacklog)]

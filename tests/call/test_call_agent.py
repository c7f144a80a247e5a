"""CallBridge with a Kletso voice agent: audio up at 24 kHz, replies down, played positions."""

from __future__ import annotations

import numpy as np
import pytest
from call_harness import (
    PCM_24K,
    SIP,
    TWILIO,
    Harness,
    at,
    of_type,
    tone_s16le,
    tone_ulaw_frames,
)

from bridge.commands import CallEnded, CommandRejected, HandOver, TurnBegan, TurnInterrupted
from bridge.media.call_types import (
    AgentEnded,
    AgentPlayed,
    CancelTurn,
    ClearLeg,
    LegProfile,
    SendAgentAudio,
    SendMark,
    StartAgent,
    StopAgent,
)
from bridge.providers.base import AudioReceived, TurnDone, TurnStarted
from bridge.providers.kletso.client import VoiceEnded, VoiceInterrupted, VoiceUsage
from telcodec import g711


def with_agent(leg: LegProfile = SIP) -> Harness:
    h = Harness(leg)
    h.call.execute(HandOver(voice_agent="kletso"), 0.0)
    actions, _ = h.take()
    assert actions == [StartAgent("kletso")]
    assert h.call.agent_active
    return h


def agent_reply(h: Harness, seconds: float, now: float = 0.0) -> None:
    """Reply voice-1 (item_1): PCM 24 kHz, in 100 ms chunks, as Kletso sends it."""
    h.provide(TurnStarted("voice-1", "item_1"), now)
    pcm = tone_s16le(350.0, seconds, 24000, peak=0.3)
    for k in range(0, len(pcm), 4800):
        h.provide(AudioReceived("voice-1", pcm[k : k + 4800], PCM_24K), now)


def test_caller_audio_goes_up_at_24k_in_40_to_60_ms_pieces() -> None:
    h = with_agent()
    pcm_8k = tone_s16le(300.0, 1.0, 8000, peak=0.3)
    ulaw = g711.ulaw_encode(pcm_8k)
    for n in range(50):
        h.caller(ulaw[n * 160 : (n + 1) * 160], at(n) + 0.005)
    pieces = [a.pcm for a in of_type(h.actions, SendAgentAudio)]
    assert len(pieces) >= 15  # soxr HQ holds back about 80 ms at the start
    assert all(24000 * 2 * 40 // 1000 <= len(p) <= 24000 * 2 * 60 // 1000 for p in pieces)
    up = np.frombuffer(b"".join(pieces), dtype="<i2").astype(float)
    assert len(up) == pytest.approx(24000, abs=24000 * 0.06)  # 1 s, minus what is buffered
    spectrum = np.abs(np.fft.rfft(up[2400:21600]))
    assert np.argmax(spectrum) * 24000 / 19200 == pytest.approx(300.0, abs=3.0)


def test_agent_reply_plays_with_played_position_every_500_ms() -> None:
    h = with_agent()
    agent_reply(h, 1.2)
    h.provide(TurnDone("voice-1"), 0.0)
    sent = [h.tick(n) for n in range(1, 62)]
    assert all(f is not None and len(f) == 160 for f in sent[:60])
    assert sent[60] is None
    actions, events = h.take()
    assert events[0] == TurnBegan("voice-1")
    # First frame at tick 1; reports 0.5 s and 1.0 s later, with the exact position.
    assert of_type(actions, AgentPlayed) == [
        AgentPlayed("item_1", 520),
        AgentPlayed("item_1", 1020),
    ]
    assert events[-1].__class__.__name__ == "TurnFinished"
    assert h.call.next_deadline() is None  # no agent turn sounding any more


def test_handle_timer_reports_between_ticks() -> None:
    h = with_agent()
    agent_reply(h, 1.0)
    assert h.tick(1) is not None
    deadline = h.call.next_deadline()
    assert deadline is not None
    assert deadline == pytest.approx(at(1) + 0.5)
    for n in range(2, 26):
        h.tick(n)
    h.take()
    h.call.handle_timer(deadline)
    actions, _ = h.take()
    assert actions == [AgentPlayed("item_1", 500)]
    assert h.call.next_deadline() == pytest.approx(deadline + 0.5)


def test_voice_interrupted_truncates_the_reply() -> None:
    h = with_agent()
    agent_reply(h, 2.0)
    assert all(h.tick(n) is not None for n in range(1, 31))  # 600 ms played
    h.take()
    h.provide(VoiceInterrupted("item_1", 700), at(30) + 0.005)
    h.provide(TurnDone("voice-1", cancelled=True), at(30) + 0.006)
    late = tone_s16le(350.0, 0.2, 24000)
    h.provide(AudioReceived("voice-1", late, PCM_24K), at(30) + 0.007)
    sent = [h.tick(n) for n in range(31, 37)]
    assert [f is not None for f in sent] == [True] * 5 + [False]
    _, events = h.take()
    assert events == [TurnInterrupted("voice-1", 700, "", "agent_interrupted")]
    assert h.call.stats().late_chunks_dropped == 1


def test_local_barge_in_during_agent_speech_clears_and_reports_played() -> None:
    h = with_agent(TWILIO)
    agent_reply(h, 2.0)
    assert all(h.tick(n) is not None for n in range(1, 21))  # 400 ms sent
    actions, _ = h.take()
    marks = [a.name for a in of_type(actions, SendMark)]
    assert len(marks) == 2
    h.call.mark_echoed(marks[0], False, at(20) + 0.001)  # 200 ms played, 400 ms sent
    h.call.caller_dtmf("1", at(20) + 0.005)  # and 4 ms more played by the clear
    actions, events = h.take()
    assert actions == [ClearLeg(), AgentPlayed("item_1", 204), CancelTurn("voice-1")]
    assert of_type(events, TurnInterrupted) == [TurnInterrupted("voice-1", 204, "", "dtmf")]
    assert h.call.next_deadline() is None  # nothing sounding: no periodic report
    h.call.mark_echoed(marks[1], True, at(20) + 0.02)  # echoed by the clear
    assert all(h.tick(n) is None for n in range(21, 50))
    assert h.take() == ([], [])


def test_a_second_reply_queues_behind_the_first() -> None:
    h = with_agent()
    agent_reply(h, 0.1)
    h.provide(TurnDone("voice-1"), 0.0)
    h.provide(TurnStarted("voice-2", "item_2"), 0.01)
    h.provide(AudioReceived("voice-2", tone_s16le(500.0, 0.1, 24000), PCM_24K), 0.01)
    h.provide(TurnDone("voice-2"), 0.01)
    assert all(h.tick(n) is not None for n in range(1, 11))
    _, events = h.take()
    assert [type(e).__name__ for e in events] == [
        "TurnBegan",
        "TurnFinished",
        "TurnBegan",
        "TurnFinished",
    ]
    assert h.call.stats().turns == 2


def test_agent_end_stops_uplink_and_hangup_stops_the_agent() -> None:
    h = with_agent()
    frame = tone_ulaw_frames(1)[0]
    h.call.execute(HandOver(voice_agent="kletso"), 0.0)
    for n in range(4):
        h.caller(frame, at(n))
    actions, events = h.take()
    assert of_type(events, CommandRejected) == [
        CommandRejected("HandOver", "", "agent_already_active")
    ]
    assert of_type(actions, SendAgentAudio)
    h.provide(VoiceEnded("idle", VoiceUsage(1.0, 2.0, 30)), 0.1)
    for n in range(5, 10):
        h.caller(frame, at(n))
    actions, events = h.take()
    assert actions == []
    assert of_type(events, AgentEnded) == [AgentEnded("idle")]
    h.call.execute(HandOver(voice_agent="kletso"), 0.3)
    agent_reply(h, 0.5, now=0.3)
    h.call.hangup_received("bye", 0.4)
    actions, events = h.take()
    assert actions[0] == StartAgent("kletso")
    assert actions[1:] == [CancelTurn("voice-1"), StopAgent("user")]
    assert events[-1] == CallEnded("bye")


def test_caller_playout_goes_up_to_the_agent_and_caller_speech_does_not() -> None:
    """A SIP leg splits the inbound frame: the agent gets the jitter buffer's in-order
    stream (``caller_playout``), the detector the arrivals (``caller_speech``)."""
    h = with_agent()
    assert h.call.takes_playout
    ulaw = g711.ulaw_encode(tone_s16le(300.0, 1.0, 8000, peak=0.3))
    for n in range(50):
        h.call.caller_speech(ulaw[n * 160 : (n + 1) * 160], at(n) + 0.005)
    h.drain()
    assert of_type(h.actions, SendAgentAudio) == []
    for n in range(50):
        h.call.caller_playout(ulaw[n * 160 : (n + 1) * 160], at(n) + 0.005)
    h.drain()
    assert len(of_type(h.actions, SendAgentAudio)) >= 15  # as caller_audio gives

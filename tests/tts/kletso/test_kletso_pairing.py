"""Conformance: the Kletso client engine against the Kletso server session, in-process.

A tiny loop moves ``SendText`` / ``SendBytes`` between the two engines; a
fake synthesizer turns each ``Synthesize`` into deterministic PCM (one
100 ms tone per word, its pitch from the word's length) delivered word by
word when the test says so. Time is a number the test passes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from tts_replay import audio_of

from bridge.engine import Action, CloseConnection, Event, LocalProtocolError, SendBytes, SendText
from bridge.providers.base import (
    MULAW_8K,
    PCM_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.kletso.client import (
    PCM_24K,
    KletsoProtocol,
    TranscriptReceived,
    VoiceEnded,
    VoiceFailed,
    VoiceInterrupted,
    VoiceStarted,
)
from bridge.providers.kletso.server import KletsoServerSession
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

WORD_MS = 100


def word_pcm(word: str) -> bytes:
    n = 24 * WORD_MS
    wave = 4000 * np.sin(2 * np.pi * (200 + 50 * len(word)) * np.arange(n) / 24000)
    return wave.astype("<i2").tobytes()


def tone(ms: int) -> bytes:
    wave = 3000 * np.sin(2 * np.pi * 440 * np.arange(24 * ms) / 24000)
    return wave.astype("<i2").tobytes()


@dataclass
class FakeSynth:
    """Each job renders its words one 100 ms tone at a time, when ``step`` says."""

    jobs: dict[str, list[str]] = field(default_factory=dict)
    rendered: dict[str, bytes] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)

    def start(self, job: Synthesize) -> None:
        self.jobs[job.job_id] = job.text.split()
        self.rendered[job.job_id] = b"".join(word_pcm(w) for w in job.text.split())

    def step(self, server: KletsoServerSession, words: int, now: float) -> None:
        for job_id, remaining in list(self.jobs.items()):
            done_s = (len(self.rendered[job_id]) // 48 - len(remaining) * WORD_MS) / 1000
            for _ in range(min(words, len(remaining))):
                word = remaining.pop(0)
                timing = WordTiming(word, done_s, done_s + WORD_MS / 1000)
                server.synthesis_audio(job_id, word_pcm(word), (timing,), now)
                done_s += WORD_MS / 1000
            if not remaining:
                del self.jobs[job_id]
                server.synthesis_done(job_id, now)


class Pair:
    def __init__(self, **server_kw: object) -> None:
        settings = ProviderSettings("kletso", "kletso", "ws://127.0.0.1/v1/realtime", "k1")
        self.client = KletsoProtocol(settings)
        options = ServerOptions(api_keys=frozenset({"k1"}))
        self.server = KletsoServerSession(options, **server_kw)  # type: ignore[arg-type]
        self.synth = FakeSynth()
        self.events: list[Event] = []
        self.closed: list[Action] = []
        headers = {k.lower(): v for k, v in self.client.connect_params().headers}
        self.server.connection_made("/v1/realtime", {}, headers, 0.0)
        self.client.connection_made(None, 0.0)
        self.pump(0.0)

    def pump(self, now: float) -> None:
        """Move frames both ways until both engines are quiet; fire due timers first."""
        for engine in (self.client, self.server):
            deadline = engine.next_deadline()
            if deadline is not None and deadline <= now:
                engine.handle_timer(now)
        moved = True
        while moved:
            moved = False
            for action in self.client.actions_to_send():
                moved = True
                if isinstance(action, SendText):
                    self.server.receive_text(action.text, now)
                elif isinstance(action, SendBytes):
                    self.server.receive_bytes(action.data, now)
                else:
                    self.closed.append(action)
            for action in self.server.actions_to_send():
                moved = True
                self._server_action(action, now)
            self.events.extend(self.client.events_received())

    def _server_action(self, action: Action, now: float) -> None:
        if isinstance(action, SendText):
            self.client.receive_text(action.text, now)
        elif isinstance(action, SendBytes):
            self.client.receive_bytes(action.data, now)
        elif isinstance(action, Synthesize):
            self.synth.start(action)
        elif isinstance(action, CancelSynthesis):
            self.synth.cancelled.append(action.job_id)
            self.synth.jobs.pop(action.job_id, None)
        else:
            self.closed.append(action)

    def synthesize(self, words: int, now: float) -> None:
        self.synth.step(self.server, words, now)
        self.pump(now)

    def say(self, turn_id: str, text: str, now: float, settings: TurnSettings) -> None:
        self.client.open_turn(turn_id, settings, now)
        self.client.send_text(turn_id, text, now)
        self.client.end_turn(turn_id, now)
        self.pump(now)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


PCM_TURN = TurnSettings(voice="joe", audio_format=PCM_8K)
MULAW_TURN = TurnSettings(voice="joe", audio_format=MULAW_8K)


@pytest.mark.parametrize("settings", [PCM_TURN, MULAW_TURN])
def test_full_turn_delivers_the_agents_spoken_reply(settings: TurnSettings) -> None:
    pair = Pair()
    pair.say("t1", "hello world", 0.1, settings)
    pair.synthesize(99, 0.2)
    events = pair.take()
    started = [e for e in events if isinstance(e, VoiceStarted)]
    assert started and started[0].voice == "joe" and started[0].voice_session_id == "vs_1"
    assert [e for e in events if isinstance(e, TurnStarted)] == [TurnStarted("t1", "item_2")]
    expected = b"".join(word_pcm(w) for w in ["You", "wrote:", "hello", "world"])
    assert audio_of(events, "t1") == expected
    # Kletso only speaks PCM 24 kHz: even a mu-law turn gets that (the Call transcodes).
    assert {e.audio_format for e in events if isinstance(e, AudioReceived)} == {PCM_24K}
    # The protocol carries no word timings (message.delta text only).
    assert not [e for e in events if isinstance(e, WordsTimed)]
    assert events[-1] == TurnDone("t1")
    assert pair.client.open_turns() == 0


def test_cancel_mid_utterance_no_audio_after_cancel_and_next_turn_is_clean() -> None:
    pair = Pair()
    pair.say("t1", "one two three four five six", 0.1, PCM_TURN)
    pair.synthesize(2, 0.2)
    before = pair.take()
    assert audio_of(before, "t1") == word_pcm("You") + word_pcm("wrote:")
    pair.client.set_played_position("item_2", 150)
    pair.client.cancel("t1", 0.3)
    pair.pump(0.3)
    assert pair.take() == [TurnDone("t1", cancelled=True)]
    pair.synthesize(99, 0.4)  # the agent finishes its reply; all of it is dropped
    assert not [e for e in pair.take() if isinstance(e, AudioReceived)]
    pair.say("t2", "again", 0.5, PCM_TURN)
    pair.synthesize(99, 0.6)
    events = pair.take()
    assert audio_of(events, "t2") == b"".join(word_pcm(w) for w in ["You", "wrote:", "again"])
    assert events[-1] == TurnDone("t2")
    assert not [e for e in events if getattr(e, "turn_id", "t2") != "t2"]


def test_one_turn_at_a_time_is_the_protocols_limit() -> None:
    pair = Pair()
    assert KletsoProtocol.max_turns == 1
    pair.say("t1", "first", 0.1, PCM_TURN)
    with pytest.raises(LocalProtocolError):
        pair.client.open_turn("t2", PCM_TURN, 0.1)
    pair.synthesize(99, 0.2)
    pair.say("t2", "second", 0.3, PCM_TURN)
    pair.synthesize(99, 0.4)
    done = [e for e in pair.take() if isinstance(e, TurnDone)]
    assert done == [TurnDone("t1"), TurnDone("t2")]


def test_played_position_timer_feeds_the_servers_interruption_point() -> None:
    pair = Pair()
    pair.client.start_voice("vad", "agent-1", 0.0)
    pair.pump(0.0)
    pair.client.send_audio(tone(600) + bytes(48 * 700), 0.1)
    pair.pump(0.1)
    events = pair.take()
    assert TranscriptReceived("user", "[speech, 0.6 s]", True) in events
    pair.synthesize(3, 0.2)
    assert audio_of(pair.take(), "voice-1") == b"".join(word_pcm(w) for w in ["I", "heard", "you"])
    assert pair.client.next_deadline() == pytest.approx(0.7)
    pair.client.set_played_position("item_2", 230)
    pair.pump(0.7)  # the 500 ms voice.played reaches the agent
    pair.client.send_audio(tone(100), 0.8)  # the caller talks over the reply
    pair.pump(0.8)
    events = pair.take()
    assert VoiceInterrupted("item_2", 230) in events
    assert TurnDone("voice-1", cancelled=True) in events
    assert pair.synth.cancelled == ["item_2"]
    pair.client.stop_voice("user", 1.0)
    pair.pump(1.0)
    (ended,) = [e for e in pair.take() if isinstance(e, VoiceEnded)]
    assert ended.reason == "user"
    assert ended.usage.audio_in_s == pytest.approx(1.4)
    assert ended.usage.audio_out_s == pytest.approx(0.3)


def test_not_configured_surfaces_as_provider_failed() -> None:
    pair = Pair(not_configured=True)
    pair.say("t1", "hi", 0.1, PCM_TURN)
    failed = [e for e in pair.take() if isinstance(e, ProviderFailed)]
    assert failed == [
        ProviderFailed("not_configured", "no OpenAI key on the agent", ("t1",), False)
    ]
    assert pair.closed == [CloseConnection(1000, "not_configured")]


def test_rate_limit_surfaces_as_retryable_turn_failure() -> None:
    pair = Pair(max_starts_per_minute=0)
    pair.say("t1", "hi", 0.1, PCM_TURN)
    events = pair.take()
    message = "too many voice sessions, retry later"
    assert TurnFailed("t1", "voice_rate_limited", message, True) in events
    assert VoiceFailed("voice_rate_limited", message, True) in events
    assert pair.client.ready


def test_synthesis_failure_surfaces_as_turn_failed_and_session_end() -> None:
    pair = Pair()
    pair.say("t1", "hi", 0.1, PCM_TURN)
    pair.server.synthesis_failed("item_2", "engine crashed", 0.2)
    pair.pump(0.2)
    events = pair.take()
    failed = [e for e in events if isinstance(e, TurnFailed)]
    assert failed == [TurnFailed("t1", "voice_provider_error", "synthesis failed: engine crashed")]
    assert [e.reason for e in events if isinstance(e, VoiceEnded)] == ["error"]
    pair.say("t2", "retry", 0.5, PCM_TURN)  # a new session starts on the same connection
    pair.synthesize(99, 0.6)
    assert pair.take()[-1] == TurnDone("t2")


def test_server_idle_timeout_ends_the_session_and_the_client_restarts_it() -> None:
    pair = Pair(idle_seconds=5.0)
    pair.say("t1", "hi", 0.1, PCM_TURN)
    pair.synthesize(99, 0.2)
    pair.take()
    assert pair.server.next_deadline() == pytest.approx(5.2)
    pair.pump(5.2)
    assert [e.reason for e in pair.take() if isinstance(e, VoiceEnded)] == ["idle"]
    pair.say("t2", "back", 6.0, PCM_TURN)
    pair.synthesize(99, 6.1)
    assert pair.take()[-1] == TurnDone("t2")

"""Conformance pairing: the KugelAudio client engine against our KugelAudio server.

Both engines run in-process; a tiny loop moves ``SendText`` frames between
them, and a fake synthesiser turns each ``Synthesize`` into a deterministic
tone (one piece per word, ``50 + 10 * len(word)`` ms) with word timings.
Time is a number advanced by the loop; nothing sleeps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from bridge.engine import Action, CloseConnection, Event, SendText
from bridge.providers.base import (
    MULAW_8K,
    PCM_8K,
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    UsageReported,
    WordsTimed,
    WordTiming,
)
from bridge.providers.kugelaudio.client import ENGINE, KugelAudioProtocol
from bridge.providers.kugelaudio.server import PATHS, SESSION, KugelAudioServerSession
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

PCM_24K = AudioFormat("pcm_s16le", 24000)
STEP_S = 0.01


def word_ms(word: str) -> int:
    return 50 + 10 * len(word)


@dataclass
class FakeSynth:
    """Deterministic synthesis: a 440 Hz tone per word, delivered one word per step."""

    fail_on: str = "\x00never"
    jobs: deque[tuple[Synthesize, deque[str]]] = field(default_factory=deque)
    rendered: dict[str, bytes] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    offsets_ms: dict[str, int] = field(default_factory=dict)

    def start(self, job: Synthesize) -> None:
        self.jobs.append((job, deque(job.text.split())))
        self.rendered[job.job_id] = b""
        self.offsets_ms[job.job_id] = 0

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.jobs = deque(j for j in self.jobs if j[0].job_id != job_id)

    def step(self, server: KugelAudioServerSession, now: float) -> bool:
        if not self.jobs:
            return False
        job, words = self.jobs[0]
        if self.fail_on in job.text:
            self.jobs.popleft()
            server.synthesis_failed(job.job_id, "synthesiser exploded", now)
            return True
        if not words:
            self.jobs.popleft()
            server.synthesis_done(job.job_id, now)
            return True
        word = words.popleft()
        samples = job.sample_rate_hz * word_ms(word) // 1000
        t = np.arange(samples) / job.sample_rate_hz
        pcm = (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
        start_ms = self.offsets_ms[job.job_id]
        end_ms = start_ms + word_ms(word)
        self.offsets_ms[job.job_id] = end_ms
        self.rendered[job.job_id] += pcm
        server.synthesis_audio(
            job.job_id, pcm, (WordTiming(word, start_ms / 1000, end_ms / 1000),), now
        )
        return True


class Link:
    """One client engine wired to one server session."""

    def __init__(
        self,
        *,
        api_key: str = "",
        server_keys: frozenset[str] = frozenset(),
        synth: FakeSynth | None = None,
        **client_options: str | int | float | bool,
    ) -> None:
        self.client: KugelAudioProtocol = ENGINE(
            ProviderSettings(
                "ka",
                "kugelaudio",
                "ws://127.0.0.1:1",
                api_key,
                options=tuple(client_options.items()),
            )
        )
        self.server: KugelAudioServerSession = SESSION(
            ServerOptions(voices=frozenset({"joe", "tone"}), api_keys=server_keys)
        )
        self.synth = synth or FakeSynth()
        self.events: list[tuple[float, Event]] = []
        self.now = 0.0
        self.closed = False
        self.server.connection_made(PATHS[0], {"api_key": api_key}, {}, 0.0)
        self.client.connection_made(None, 0.0)
        self.pump()

    def pump(self) -> None:
        for _ in range(10_000):
            moved = [self._client_action(a) for a in self.client.actions_to_send()]
            moved += [self._server_action(a) for a in self.server.actions_to_send()]
            self.events.extend((self.now, e) for e in self.client.events_received())
            if not moved:
                return
        raise AssertionError("pump did not settle")

    def _client_action(self, action: Action) -> bool:
        if self.closed:
            return True
        if isinstance(action, SendText):
            self.server.receive_text(action.text, self.now)
        elif isinstance(action, CloseConnection):
            self._close(action.code, action.reason)
        return True

    def _server_action(self, action: Action) -> bool:
        if self.closed:
            return True
        if isinstance(action, SendText):
            self.client.receive_text(action.text, self.now)
        elif isinstance(action, Synthesize):
            self.synth.start(action)
        elif isinstance(action, CancelSynthesis):
            self.synth.cancel(action.job_id)
        elif isinstance(action, CloseConnection):
            self._close(action.code, action.reason)
        return True

    def _close(self, code: int, reason: str) -> None:
        self.closed = True
        self.client.connection_lost(code, reason, self.now)
        self.server.connection_lost(self.now)

    def step(self, horizon: float) -> bool:
        """One synthesis piece, else the next timer up to ``horizon``; False when idle."""
        self.pump()
        if self.synth.step(self.server, self.now):
            self.now += STEP_S
            self.pump()
            return True
        deadlines = [
            d
            for d in (self.client.next_deadline(), self.server.next_deadline())
            if d is not None and d <= horizon
        ]
        if not deadlines or self.closed:
            return False
        self.now = max(self.now, min(deadlines))
        self.client.handle_timer(self.now)
        self.server.handle_timer(self.now)
        self.pump()
        return True

    def run(self, horizon: float = 0.0, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.step(horizon):
                return
        raise AssertionError("run did not settle")

    def of(self, kind: type[Event], turn_id: str | None = None) -> list[Event]:
        return [
            e
            for _, e in self.events
            if isinstance(e, kind) and (turn_id is None or getattr(e, "turn_id", None) == turn_id)
        ]

    def say(self, turn_id: str, settings: TurnSettings, text: str) -> None:
        self.client.open_turn(turn_id, settings, self.now)
        self.client.send_text(turn_id, text, self.now)
        self.client.end_turn(turn_id, self.now)
        self.pump()


def expected_words(text: str) -> list[tuple[str, float, float]]:
    out, at_ms = [], 0
    for word in text.split():
        out.append((word, at_ms / 1000, (at_ms + word_ms(word)) / 1000))
        at_ms += word_ms(word)
    return out


def flat_words(events: list[Event]) -> list[tuple[str, float, float]]:
    return [
        (w.word, w.start_s, w.end_s) for e in events if isinstance(e, WordsTimed) for w in e.words
    ]


def audio_of(events: list[Event]) -> bytes:
    return b"".join(e.audio for e in events if isinstance(e, AudioReceived))


# ----------------------------------------------------------------------- tests


def test_full_turn_pcm_with_word_timings_and_usage() -> None:
    link = Link()
    text = "Hello world. This is a test."
    link.say("t1", TurnSettings("joe", PCM_24K), text)
    link.run()

    events = [e for _, e in link.events]
    assert isinstance(events[1], TurnStarted)
    assert link.of(TurnDone) == [TurnDone("t1")]
    assert audio_of(events) == b"".join(link.synth.rendered.values())
    assert {e.audio_format for e in events if isinstance(e, AudioReceived)} == {PCM_24K}
    got, want = flat_words(events), expected_words(text)
    assert [w for w, _, _ in got] == [w for w, _, _ in want]
    assert [s for _, s, _ in got] == pytest.approx([s for _, s, _ in want])
    assert [e for _, _, e in got] == pytest.approx([e for _, _, e in want])
    (usage,) = link.of(UsageReported)
    assert isinstance(usage, UsageReported) and usage.turn_id == "t1"
    total_s = sum(word_ms(w) for w in text.split()) / 1000
    assert usage.usage["audio_seconds"] == pytest.approx(total_s)
    assert usage.usage["cost_cents"] is None and usage.usage["cost_unavailable"] is True
    assert usage.usage["characters"] == len("Hello world.") + len("This is a test.")
    assert link.client.ready


def test_mulaw_turn_gets_8khz_pcm_since_the_protocol_has_no_g711() -> None:
    link = Link()
    link.say("t1", TurnSettings("joe", MULAW_8K), "Press one.")
    link.run()
    audio = link.of(AudioReceived)
    assert {e.audio_format for e in audio if isinstance(e, AudioReceived)} == {PCM_8K}
    job_ids = list(link.synth.rendered)
    assert audio_of(audio) == link.synth.rendered[job_ids[0]]
    assert len(audio_of(audio)) == 2 * 8000 * (word_ms("Press") + word_ms("one.")) // 1000
    assert link.of(TurnDone) == [TurnDone("t1")]


def test_cancel_mid_utterance_no_audio_after_cancel_then_reuse() -> None:
    link = Link()
    text = "one two three four five six seven eight nine ten."
    link.say("t1", TurnSettings("joe", PCM_24K), text)
    for _ in range(3):
        link.step(0.0)
    audio_before = audio_of(link.of(AudioReceived, "t1"))
    assert audio_before
    n_events = len(link.events)
    link.client.cancel("t1", link.now)
    link.pump()
    link.run()

    after = [e for _, e in link.events[n_events:]]
    assert [e for e in after if isinstance(e, AudioReceived | WordsTimed)] == []
    assert link.of(TurnDone) == [TurnDone("t1", cancelled=True)]
    assert link.synth.cancelled == ["ka1.0"]
    assert link.client.ready

    link.say("t2", TurnSettings("joe", PCM_24K), "Okay.")
    link.run()
    assert audio_of(link.of(AudioReceived, "t2")) == link.synth.rendered["ka2.0"]
    assert link.of(TurnDone, "t2") == [TurnDone("t2")]


def test_several_turns_in_sequence_and_on_parallel_connections() -> None:
    link = Link()
    for i, language in enumerate(["en", "de", "de"], start=1):
        settings = TurnSettings("joe", PCM_24K, language=language)
        link.say(f"t{i}", settings, f"Turn number {i}.")
        link.run()
    assert link.of(TurnDone) == [TurnDone("t1"), TurnDone("t2"), TurnDone("t3")]
    assert link.of(TurnFailed) == []

    a, b = Link(), Link()
    a.say("a1", TurnSettings("joe", PCM_24K), "Alpha speaks first.")
    b.say("b1", TurnSettings("tone", PCM_8K), "Bravo answers.")
    while a.step(0.0) | b.step(0.0):
        pass
    assert audio_of(a.of(AudioReceived, "a1")) == a.synth.rendered["ka1.0"]
    assert audio_of(b.of(AudioReceived, "b1")) == b.synth.rendered["ka1.0"]
    assert a.of(AudioReceived, "b1") == [] and b.of(AudioReceived, "a1") == []
    assert a.of(TurnDone) == [TurnDone("a1")] and b.of(TurnDone) == [TurnDone("b1")]


def test_unknown_voice_is_a_turn_failure_and_the_connection_recovers() -> None:
    link = Link()
    link.say("t1", TurnSettings("nobody", PCM_24K), "Hi.")
    link.run()
    assert link.of(TurnFailed) == [TurnFailed("t1", "NOT_FOUND", "Voice not found", True)]
    assert link.of(AudioReceived) == [] and link.client.ready

    link.say("t2", TurnSettings("joe", PCM_24K), "Hi again.")
    link.run()
    assert link.of(TurnDone) == [TurnDone("t2")]


def test_out_of_range_setting_is_a_validation_error() -> None:
    link = Link()
    link.say("t1", TurnSettings("joe", PCM_24K, speed=3.0), "Too fast.")
    link.run()
    (failed,) = link.of(TurnFailed)
    assert isinstance(failed, TurnFailed)
    assert (failed.kind, failed.retryable) == ("VALIDATION_ERROR", False)


def test_synthesis_failure_surfaces_as_turn_failed() -> None:
    link = Link(synth=FakeSynth(fail_on="boom"))
    link.say("t1", TurnSettings("joe", PCM_24K), "This goes boom.")
    link.run()
    assert link.of(TurnFailed) == [TurnFailed("t1", "INTERNAL_ERROR", "Generation failed", True)]
    assert link.client.ready


def test_refused_api_key_is_a_provider_failure() -> None:
    link = Link(api_key="wrong", server_keys=frozenset({"right"}))
    failures = link.of(ProviderFailed)
    assert [f.kind for f in failures if isinstance(f, ProviderFailed)] == ["UNAUTHORIZED"]
    assert "wrong" not in repr(failures)
    assert link.closed and not link.client.ready


def test_long_pause_splits_the_turn_with_the_client_idle_flush() -> None:
    link = Link()
    settings = TurnSettings("joe", PCM_24K)
    link.client.open_turn("t1", settings, 0.0)
    link.client.send_text("t1", "Let me check", 0.0)
    link.run(horizon=5.0)  # the client flushes at 4.0, before the server's 5 s
    assert link.of(TurnDone) == [] and len(link.of(UsageReported)) == 1
    link.client.send_text("t1", "Found it.", link.now)
    link.client.end_turn("t1", link.now)
    link.run()
    assert link.of(TurnDone) == [TurnDone("t1")]
    got = flat_words([e for _, e in link.events])
    assert [s for _, s, _ in got] == pytest.approx(
        [s for _, s, _ in expected_words("Let me check Found it.")]
    )


def test_server_auto_flush_warning_end_to_end() -> None:
    link = Link(idle_flush_s=0)
    link.client.open_turn("t1", TurnSettings("joe", PCM_24K), 0.0)
    link.client.send_text("t1", "Let me check", 0.0)
    link.run(horizon=10.0)
    assert len(link.of(UsageReported)) == 1  # the server ended the session at 5 s
    link.client.end_turn("t1", link.now)
    link.pump()
    assert link.of(TurnDone) == [TurnDone("t1")]
    assert link.client.ready


def test_close_mid_turn_delivers_the_turn_then_closes_quietly() -> None:
    link = Link()
    link.client.open_turn("t1", TurnSettings("joe", PCM_24K), 0.0)
    link.client.send_text("t1", "Goodbye now.", 0.0)
    link.client.close(0.0)
    link.pump()
    link.run()
    assert link.of(TurnDone) == [TurnDone("t1")]
    assert link.of(ProviderFailed) == []
    assert link.closed

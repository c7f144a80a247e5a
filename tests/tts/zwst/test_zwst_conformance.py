"""Conformance: the zwst client engine against the zwst server engine, in process.

A tiny link moves ``SendText``/``SendBytes`` between the two engines (frames
from the server can be held "in flight"), and a fake synthesizer turns each
``Synthesize`` into a deterministic tone (60 ms per character of each word,
20 ms of silence between words) with exact word timings, delivered one word
per chunk. Times are numbers; nothing sleeps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from bridge.engine import Action, CloseConnection, Event, SendBytes, SendText
from bridge.providers.base import (
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    ProviderSettings,
    QueueDepthChanged,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.zwst.client import HeaderByteOrderSwitched, ZwstProtocol, settings_for
from bridge.providers.zwst.server import ZwstServerSession, handle_session_request

API_KEY = "k-conformance-secret"
BASE_URL = "http://127.0.0.1:9000"
OPTIONS = ServerOptions(
    voices=frozenset({"tone"}), default_voice="tone", api_keys=frozenset({API_KEY}), max_contexts=3
)
WORD_S_PER_CHAR = 0.060
GAP_S = 0.020


def tone(n_samples: int, rate: int, freq_hz: float) -> bytes:
    return b"".join(
        int(8000 * math.sin(2 * math.pi * freq_hz * i / rate)).to_bytes(2, "little", signed=True)
        for i in range(n_samples)
    )


def render(text: str, rate: int) -> list[tuple[bytes, WordTiming]]:
    """One chunk per word: a tone for the word, then a gap; timings from the job start."""
    chunks = []
    t_samples = 0
    for i, word in enumerate(text.split()):
        word_samples = round(len(word) * WORD_S_PER_CHAR * rate)
        gap_samples = round(GAP_S * rate)
        start_s = t_samples / rate
        timing = WordTiming(word, start_s, (t_samples + word_samples) / rate)
        chunks.append((tone(word_samples, rate, 300 + 50 * i) + bytes(2 * gap_samples), timing))
        t_samples += word_samples + gap_samples
    return chunks


@dataclass
class FakeSynth:
    jobs: dict[str, deque[tuple[bytes, WordTiming]]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)  # jobs whose engine crashes

    def start(self, action: Synthesize) -> None:
        self.jobs[action.job_id] = deque(render(action.text, action.sample_rate_hz))
        if "crash" in action.text:
            self.failing.add(action.job_id)
        self.order.append(action.job_id)

    def cancel(self, action: CancelSynthesis) -> None:
        self.cancelled.append(action.job_id)
        self.jobs.pop(action.job_id, None)


class Pair:
    """A connected client/server pair and the link between them."""

    def __init__(self, audio_format: AudioFormat, **client_options: str | int | bool) -> None:
        base = ProviderSettings(
            name="zwst",
            protocol="zwst",
            url=BASE_URL,
            api_key=API_KEY,
            options=tuple(client_options.items()),
        )
        self.client = ZwstProtocol(settings_for(base, "tone", audio_format))
        self.server = ZwstServerSession(OPTIONS)
        self.synth = FakeSynth()
        self.in_flight: deque[Action] = deque()
        self.events: list[Event] = []
        self.close: CloseConnection | None = None
        request = self.client.session_request()
        headers = {k.lower(): v for k, v in request.headers}
        status, body = handle_session_request(
            request.body, OPTIONS, BASE_URL, headers=headers, now=0
        )
        self.client.session_response(status, body, 0.0)
        url = urlsplit(self.client.connect_params().url)
        self.server.connection_made(url.path, dict(parse_qsl(url.query)), {}, 0.0)
        self.client.connection_made(None, 0.0)
        self.pump(0.0)
        assert self.events == [ConnectionReady()]
        self.events.clear()

    def pump(self, now: float, deliver: bool = True) -> None:
        """Move frames until both sides are quiet (server frames stay queued if not ``deliver``)."""
        while True:
            moved = False
            for action in self.client.actions_to_send():
                moved = True
                if isinstance(action, SendText):
                    self.server.receive_text(action.text, now)
                elif isinstance(action, CloseConnection):
                    self.server.connection_lost(now)
            for action in self.server.actions_to_send():
                moved = True
                if isinstance(action, Synthesize):
                    self.synth.start(action)
                elif isinstance(action, CancelSynthesis):
                    self.synth.cancel(action)
                else:
                    self.in_flight.append(action)
            if deliver:
                moved |= self.deliver(now)
            self.events.extend(self.client.events_received())
            if not moved:
                return

    def deliver(self, now: float) -> bool:
        moved = bool(self.in_flight)
        while self.in_flight:
            action = self.in_flight.popleft()
            if isinstance(action, SendText):
                self.client.receive_text(action.text, now)
            elif isinstance(action, SendBytes):
                self.client.receive_bytes(action.data, now)
            elif isinstance(action, CloseConnection):
                self.close = action
                self.client.connection_lost(action.code, action.reason, now)
        return moved

    def step_synth(self, now: float, deliver: bool = True) -> bool:
        """Deliver one chunk of the oldest running job (or finish it)."""
        for job_id in self.synth.order:
            chunks = self.synth.jobs.get(job_id)
            if chunks is None:
                continue
            if job_id in self.synth.failing:
                del self.synth.jobs[job_id]
                self.server.synthesis_failed(job_id, "engine crashed", now)
            elif chunks:
                pcm, word = chunks.popleft()
                self.server.synthesis_audio(job_id, pcm, (word,), now)
            else:
                del self.synth.jobs[job_id]
                self.server.synthesis_done(job_id, now)
            self.pump(now, deliver)
            return True
        return False

    def run(self, now: float) -> None:
        while self.step_synth(now):
            pass

    def audio(self, turn_id: str) -> bytes:
        return b"".join(
            e.audio for e in self.events if isinstance(e, AudioReceived) and e.turn_id == turn_id
        )

    def words(self, turn_id: str) -> list[WordTiming]:
        return [
            w
            for e in self.events
            if isinstance(e, WordsTimed) and e.turn_id == turn_id
            for w in e.words
        ]

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


def turn(audio_format: AudioFormat) -> TurnSettings:
    return TurnSettings(voice="tone", audio_format=audio_format)


def expected_audio(texts: list[str], rate: int) -> bytes:
    return b"".join(pcm for text in texts for pcm, _ in render(text, rate))


def test_full_turn_pcm_with_word_timings() -> None:
    fmt = AudioFormat("pcm_s16le", 16000)
    pair = Pair(fmt)
    pair.client.open_turn("t1", turn(fmt), 0.0)
    pair.client.send_text("t1", "Hello there.", 0.0)
    pair.client.send_text("t1", "General Kenobi!", 0.0)
    pair.client.end_turn("t1", 0.0)
    pair.pump(0.0)
    pair.run(0.1)
    assert pair.audio("t1") == expected_audio(["Hello there.", "General Kenobi!"], 16000)
    assert {e.audio_format for e in pair.of(AudioReceived) if isinstance(e, AudioReceived)} == {fmt}
    first_segment_s = len(expected_audio(["Hello there."], 16000)) / 2 / 16000
    words = pair.words("t1")
    assert [w.word for w in words] == ["Hello", "there.", "General", "Kenobi!"]
    assert words[0] == WordTiming("Hello", 0.0, 0.3)
    # the second segment's words are offset by the first segment's audio
    assert math.isclose(words[2].start_s, first_segment_s, abs_tol=0.001)
    assert math.isclose(words[3].end_s, first_segment_s + 0.42 + 0.02 + 0.42, abs_tol=0.001)
    assert pair.events[0] == TurnStarted("t1", provider_ref="c1")
    assert pair.of(QueueDepthChanged) == [QueueDepthChanged("t1", 0)]
    assert pair.events[-1] == TurnDone("t1")
    assert pair.of(HeaderByteOrderSwitched) == []
    assert pair.client.open_turns() == 0 and pair.server.next_deadline() is None


def test_mulaw_request_gets_pcm_at_8khz_because_zwst_has_no_g711() -> None:
    fmt = AudioFormat("mulaw", 8000)
    pair = Pair(fmt)
    assert pair.server.properties is not None
    assert (pair.server.properties.format, pair.server.properties.sample_rate) == (
        "pcm_s16le",
        8000,
    )
    pair.client.open_turn("t1", turn(fmt), 0.0)
    pair.client.send_text("t1", "Press one.", 0.0)
    pair.client.end_turn("t1", 0.0)
    pair.pump(0.0)
    pair.run(0.1)
    assert pair.audio("t1") == expected_audio(["Press one."], 8000)
    formats = {e.audio_format for e in pair.of(AudioReceived) if isinstance(e, AudioReceived)}
    assert formats == {AudioFormat("pcm_s16le", 8000)}
    assert pair.events[-1] == TurnDone("t1")


def test_cancel_mid_utterance_no_audio_after_cancel() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt)
    pair.client.open_turn("t1", turn(fmt), 0.0)
    pair.client.send_text("t1", "This is a long answer that the caller interrupts.", 0.0)
    pair.pump(0.0)
    pair.step_synth(0.1)  # first word reaches the client
    heard = pair.audio("t1")
    assert heard
    pair.step_synth(0.2, deliver=False)  # second word is in flight when the caller speaks
    assert any(isinstance(a, SendBytes) for a in pair.in_flight)
    pair.client.cancel("t1", 0.25)
    pair.pump(0.25, deliver=False)
    pair.deliver(0.3)  # the late frames arrive after the cancel
    pair.run(0.4)
    cancelled_at = pair.events.index(TurnDone("t1", cancelled=True))
    assert not any(isinstance(e, AudioReceived) for e in pair.events[cancelled_at:])
    assert pair.audio("t1") == heard
    [job] = pair.synth.order
    assert pair.synth.cancelled == [job]
    assert pair.of(TurnDone) == [TurnDone("t1", cancelled=True)]

    pair.client.open_turn("t2", turn(fmt), 0.5)  # the socket carries on
    pair.client.send_text("t2", "Yes?", 0.5)
    pair.client.end_turn("t2", 0.5)
    pair.pump(0.5)
    pair.run(0.6)
    assert pair.audio("t2") == expected_audio(["Yes?"], 8000)
    assert pair.events[-1] == TurnDone("t2")


def test_concurrent_turns_are_routed_by_ordinal() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt)
    texts = {"a": "Alpha bravo charlie.", "b": "Delta echo.", "c": "Foxtrot."}
    for turn_id, text in texts.items():
        pair.client.open_turn(turn_id, turn(fmt), 0.0)
        pair.client.send_text(turn_id, text, 0.0)
        pair.client.end_turn(turn_id, 0.0)
    pair.pump(0.0)
    # run the jobs newest first so arrival order differs from context order
    pair.synth.order.reverse()
    pair.run(0.1)
    for turn_id, text in texts.items():
        assert pair.audio(turn_id) == expected_audio([text], 8000)
        assert [w.word for w in pair.words(turn_id)] == text.split()
    assert [e.turn_id for e in pair.of(TurnDone) if isinstance(e, TurnDone)] == ["c", "b", "a"]


def test_server_error_frames_surface_as_turn_failed() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt)
    for turn_id in ("a", "b", "c", "d"):  # the server holds 3 contexts
        pair.client.open_turn(turn_id, turn(fmt), 0.0)
        pair.client.send_text(turn_id, "Engine crash." if turn_id == "a" else "Hello.", 0.0)
        pair.client.end_turn(turn_id, 0.0)
    pair.pump(0.0)
    [failed] = pair.of(TurnFailed)
    assert isinstance(failed, TurnFailed)
    assert (failed.turn_id, failed.kind) == ("d", "provider_error")
    assert "too many open contexts" in failed.message

    pair.run(0.1)  # a's job crashes twice: resumed once, then an error frame
    failures = [e for e in pair.of(TurnFailed) if isinstance(e, TurnFailed)]
    assert [f.turn_id for f in failures] == ["d", "a"]
    assert "engine crashed" in failures[1].message
    assert pair.audio("a") == b""
    assert [e.turn_id for e in pair.of(TurnDone) if isinstance(e, TurnDone)] == ["b", "c"]
    assert pair.client.ready and pair.of(ProviderFailed) == []


def test_segment_too_long_surfaces_as_provider_failed() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt, segment_mode="none", max_segment_chars=10_000)  # client misconfigured
    pair.client.open_turn("t1", turn(fmt), 0.0)
    pair.client.send_text("t1", "word " * 120, 0.0)
    pair.pump(0.0)
    assert pair.close == CloseConnection(4003, "segment_too_long")
    [failed] = pair.of(ProviderFailed)
    assert isinstance(failed, ProviderFailed)
    assert (failed.kind, failed.turn_ids, failed.retryable) == ("segment_too_long", ("t1",), False)


def test_slow_reader_surfaces_as_provider_failed() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt)
    pair.client.open_turn("t1", turn(fmt), 0.0)
    pair.client.send_text("t1", "Nobody is reading this.", 0.0)
    pair.pump(0.0)
    pair.server.transport_backlog(10 * 8000 * 2, 1.0)
    deadline = pair.server.next_deadline()
    assert deadline is not None
    pair.server.handle_timer(deadline)
    pair.pump(deadline)
    [failed] = pair.of(ProviderFailed)
    assert isinstance(failed, ProviderFailed)
    assert (failed.kind, failed.turn_ids) == ("slow_reader", ("t1",))
    assert pair.synth.cancelled == pair.synth.order


def test_heartbeat_is_answered() -> None:
    fmt = AudioFormat("pcm_s16le", 8000)
    pair = Pair(fmt)
    for n in range(1, 4):
        deadline = pair.client.next_deadline()
        assert deadline == 20.0 * n
        pair.client.handle_timer(deadline)
        pair.pump(deadline)
    # each pong cleared the 10 s pong timer, so the next deadline is the next ping
    assert pair.client.ready and pair.events == []

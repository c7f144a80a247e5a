"""Conformance: the Kova client engine against the Kova server session, in process.

The pair (``conftest.KovaPair``) moves every ``SendText`` between the two
engines and runs a fake synthesizer: each ``Synthesize`` becomes a tone whose
length depends on the words, delivered in two chunks with word timings.
"""

from __future__ import annotations

from typing import Any

import pytest
from tts_replay import audio_of

from bridge.engine import Event
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    TurnDone,
    TurnFailed,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.server_base import ServerOptions
from telcodec import g711

PCM_16K = AudioFormat("pcm_s16le", 16000)


def formats_of(events: list[Event], turn_id: str) -> set[AudioFormat]:
    return {e.audio_format for e in events if isinstance(e, AudioReceived) and e.turn_id == turn_id}


def words_of(events: list[Event], turn_id: str) -> list[WordTiming]:
    return [
        w for e in events if isinstance(e, WordsTimed) and e.turn_id == turn_id for w in e.words
    ]


def expected(kova: Any, sentences: list[str], rate_hz: int) -> tuple[bytes, list[WordTiming]]:
    """What a turn made of ``sentences`` (one job each) must deliver."""
    pcm, words, offset_s = b"", [], 0.0
    for sentence in sentences:
        job_pcm, job_words = kova.render(sentence, rate_hz)
        words += [WordTiming(w.word, w.start_s + offset_s, w.end_s + offset_s) for w in job_words]
        pcm += job_pcm
        offset_s += len(job_pcm) / 2 / rate_hz
    return pcm, words


def assert_words(got: list[WordTiming], want: list[WordTiming]) -> None:
    assert [w.word for w in got] == [w.word for w in want]
    assert [w.start_s for w in got] == pytest.approx([w.start_s for w in want], abs=1e-6)
    assert [w.end_s for w in got] == pytest.approx([w.end_s for w in want], abs=1e-6)


def test_full_turn_pcm(kova: Any) -> None:
    pair = kova.make_pair()
    pair.client.open_turn("t1", kova.turn(PCM_16K), pair.now)
    pair.client.send_text("t1", "Welcome to ", pair.now)
    pair.client.send_text("t1", "Kova. How are", pair.now)
    pair.client.send_text("t1", " you today?", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    pair.run()
    pcm, words = expected(kova, ["Welcome to Kova.", "How are you today?"], 16000)
    assert pair.events[1] == TurnStarted("t1", provider_ref="c1")
    assert audio_of(pair.events, "t1") == pcm
    assert formats_of(pair.events, "t1") == {PCM_16K}
    assert_words(words_of(pair.events, "t1"), words)
    assert pair.events[-1] == TurnDone("t1")
    assert pair.server_frames[-1] == {"context_closed": True, "context_id": "c1"}
    assert pair.client.open_turns() == 0
    # the connection carries the next turn (same turn id, new context)
    pair.client.open_turn("t1", kova.turn(PCM_16K), pair.now)
    pair.pump()
    assert pair.events[-1] == TurnStarted("t1", provider_ref="c2")


def test_mulaw_8k_passes_through(kova: Any) -> None:
    pair = kova.make_pair()
    pair.client.open_turn("t1", kova.turn(MULAW_8K), pair.now)
    pair.client.send_text("t1", "Press one for sales.", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    pair.run()
    pcm, words = expected(kova, ["Press one for sales."], 8000)
    assert audio_of(pair.events, "t1") == g711.ulaw_encode(pcm)
    assert formats_of(pair.events, "t1") == {MULAW_8K}
    assert_words(words_of(pair.events, "t1"), words)
    assert pair.events[-1] == TurnDone("t1")


def test_cancel_mid_utterance(kova: Any) -> None:
    pair = kova.make_pair()
    pair.client.open_turn("t1", kova.turn(PCM_16K), pair.now)
    pair.client.send_text("t1", "First sentence here. Second one follows. ", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    assert pair.step_synthesis()  # first chunk reaches the client
    heard = audio_of(pair.events, "t1")
    assert heard
    assert pair.step_synthesis(deliver=False)  # the next chunk is still in flight
    (running,) = pair.jobs
    pair.client.cancel("t1", pair.now)
    cancel_at = len(pair.events)
    pair.pump()  # close_context goes out, then the in-flight audio arrives late
    pair.run()
    after = pair.events[cancel_at:]
    assert not [e for e in after if isinstance(e, AudioReceived | WordsTimed)]
    assert after == [TurnDone("t1", cancelled=True)]
    assert audio_of(pair.events, "t1") == heard
    assert pair.cancelled_jobs == [running]
    assert not any("flush_completed" in f for f in pair.server_frames)
    assert pair.server_frames[-1] == {"context_closed": True, "context_id": "c1"}
    assert pair.client.open_turns() == 0


def test_concurrent_turns_demultiplex(kova: Any) -> None:
    pair = kova.make_pair(ServerOptions(voices=frozenset({"cal", "joe"}), max_contexts=8))
    plans = {
        "a": (PCM_16K, ["Good morning.", "This is turn a."]),
        "b": (MULAW_8K, ["Hello from b."]),
        "c": (AudioFormat("pcm_s16le", 24000), ["Turn c speaks.", "Twice.", "Thrice!"]),
    }
    for turn_id, (fmt, _) in plans.items():
        pair.client.open_turn(turn_id, kova.turn(fmt, voice="joe"), pair.now)
    for turn_id, (_, sentences) in plans.items():
        pair.client.send_text(turn_id, " ".join(sentences), pair.now)
        pair.client.end_turn(turn_id, pair.now)
    pair.pump()
    pair.run()
    for turn_id, (fmt, sentences) in plans.items():
        pcm, words = expected(kova, sentences, fmt.sample_rate_hz)
        audio = g711.ulaw_encode(pcm) if fmt.encoding == "mulaw" else pcm
        assert audio_of(pair.events, turn_id) == audio, turn_id
        assert formats_of(pair.events, turn_id) == {fmt}
        assert_words(words_of(pair.events, turn_id), words)
    done = [e for e in pair.events if isinstance(e, TurnDone)]
    assert sorted(e.turn_id for e in done) == ["a", "b", "c"]
    assert all(not e.cancelled for e in done)
    # the chunks of the three contexts really interleaved on the socket
    audio_turns = [e.turn_id for e in pair.events if isinstance(e, AudioReceived)]
    assert audio_turns[:3] == ["a", "b", "c"]


def test_per_turn_errors_surface_as_turn_failed(kova: Any) -> None:
    pair = kova.make_pair(ServerOptions(voices=frozenset({"cal"}), max_contexts=2))
    pair.client.open_turn("bad-voice", kova.turn(PCM_16K, voice="zed"), pair.now)
    pair.client.send_text("bad-voice", "Hello. ", pair.now)
    pair.pump()
    pair.client.open_turn("one", kova.turn(PCM_16K), pair.now)
    pair.client.open_turn("two", kova.turn(PCM_16K), pair.now)
    pair.client.open_turn("three", kova.turn(PCM_16K), pair.now)
    pair.pump()
    failures = [e for e in pair.events if isinstance(e, TurnFailed)]
    assert failures == [
        TurnFailed("bad-voice", "error", "unknown voice: zed"),
        TurnFailed("three", "error", "too many contexts (max 2)"),
    ]
    # a synthesis failure fails only its turn
    pair.client.send_text("one", "Broken sentence.", pair.now)
    pair.client.end_turn("one", pair.now)
    pair.pump()
    (job_id,) = pair.jobs
    del pair.jobs[job_id]
    pair.server.synthesis_failed(job_id, "engine crashed", pair.now)
    pair.pump()
    assert pair.events[-1] == TurnFailed("one", "error", "synthesis failed: engine crashed")
    assert pair.client.ready
    pair.client.send_text("two", "Still fine.", pair.now)
    pair.client.end_turn("two", pair.now)
    pair.pump()
    pair.run()
    assert pair.events[-1] == TurnDone("two")
    assert pair.client.open_turns() == 0


def test_rejected_key_surfaces_as_provider_failed(kova: Any) -> None:
    options = ServerOptions(voices=frozenset({"cal"}), api_keys=frozenset({"right-key"}))
    pair = kova.make_pair(options, api_key="wrong-key")
    failed = [e for e in pair.events if isinstance(e, ProviderFailed)]
    assert failed == [ProviderFailed("error", "provider error: unauthorized", ())]
    assert not pair.client.ready
    assert "wrong-key" not in repr(pair.events)


def test_accepted_key(kova: Any) -> None:
    options = ServerOptions(voices=frozenset({"cal"}), api_keys=frozenset({"right-key"}))
    pair = kova.make_pair(options, api_key="right-key")
    assert pair.client.ready
    pair.client.open_turn("t1", kova.turn(PCM_16K), pair.now)
    pair.pump()
    assert pair.events[-1] == TurnStarted("t1", provider_ref="c1")

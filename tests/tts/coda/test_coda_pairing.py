"""Conformance: the Coda client engine against our Coda server session, in-process."""

from __future__ import annotations

from typing import Any

import pytest
from tts_replay import audio_of

from bridge.engine import Event
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    TurnDone,
    TurnFailed,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.server_base import ServerOptions
from telcodec import g711

PCM_24K = AudioFormat("pcm_s16le", 24000)
PCM_16K = AudioFormat("pcm_s16le", 16000)
VOICES = frozenset({"lyra", "joe"})


def of_turn(events: list[Event], turn_id: str) -> list[Event]:
    return [e for e in events if getattr(e, "turn_id", None) == turn_id]


def expected_speech(
    coda: Any, texts: list[str], sample_rate_hz: int
) -> tuple[bytes, tuple[WordTiming, ...]]:
    """What the fake synthesizer renders for the jobs ``texts``, joined into one context."""
    pcm, words = b"", []
    for text in texts:
        job_pcm, job_words = coda.render(text, sample_rate_hz)
        offset_s = len(pcm) / 2 / sample_rate_hz
        words += [WordTiming(w.word, offset_s + w.start_s, offset_s + w.end_s) for w in job_words]
        pcm += job_pcm
    return pcm, tuple(words)


def test_full_streaming_turn_pcm_with_word_timings(coda: Any) -> None:
    pair = coda.make_pair()
    assert pair.events == [ConnectionReady()]
    pair.client.open_turn("t1", coda.turn(PCM_24K), pair.now)
    for token in ["Hello", " there.", " How can", " I help you", " today?"]:
        pair.client.send_text("t1", token, pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    pair.run()
    texts = [r.text for r in pair.requests]
    assert texts == ["Hello there.", "How can I help you today?"]  # sentences, accumulated
    pcm, words = expected_speech(coda, texts, 24000)
    events = pair.events[1:]
    assert events[0] == TurnStarted("t1", provider_ref="coda-request-1")
    assert audio_of(events, "t1") == pcm
    assert all(e.audio_format == PCM_24K for e in events if isinstance(e, AudioReceived))
    (timed,) = [e for e in events if isinstance(e, WordsTimed)]
    assert [w.word for w in timed.words] == [
        "Hello",
        "there.",
        "How",
        "can",
        "I",
        "help",
        "you",
        "today?",
    ]
    assert _close_words(timed.words, words)
    assert events[-1] == TurnDone("t1")
    assert pair.client.open_turns() == 0


def _close_words(got: tuple[WordTiming, ...], want: tuple[WordTiming, ...]) -> bool:
    """Durations travel as proto3 strings rounded to the nanosecond."""
    return len(got) == len(want) and all(
        g.word == w.word and abs(g.start_s - w.start_s) < 1e-9 and abs(g.end_s - w.end_s) < 1e-9
        for g, w in zip(got, want, strict=True)
    )


def test_mulaw_8k_passes_through(coda: Any) -> None:
    pair = coda.make_pair()
    pair.client.open_turn("t1", coda.turn(MULAW_8K), pair.now)
    pair.client.send_text("t1", "Press one for sales. ", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    pair.run()
    pcm, _ = expected_speech(coda, ["Press one for sales."], 8000)
    assert pair.requests[0].sample_rate_hz == 8000
    received = [e for e in pair.events if isinstance(e, AudioReceived)]
    assert {e.audio_format for e in received} == {MULAW_8K}
    assert b"".join(e.audio for e in received) == g711.ulaw_encode(pcm)
    assert pair.events[-1] == TurnDone("t1")


def test_complete_text_turn(coda: Any) -> None:
    pair = coda.make_pair()
    settings = coda.turn(PCM_16K, input_mode="complete")
    pair.client.open_turn("t1", settings, pair.now)
    pair.client.send_text("t1", "Your balance is ", pair.now)
    pair.client.send_text("t1", "forty two dollars.", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    start = pair.client_frames[-1]
    assert start["start"]["text"] == "Your balance is forty two dollars."
    pair.run()
    pcm, words = expected_speech(coda, ["Your balance is forty two dollars."], 16000)
    assert audio_of(pair.events, "t1") == pcm
    (timed,) = [e for e in pair.events if isinstance(e, WordsTimed)]
    assert _close_words(timed.words, words)
    assert pair.events[-1] == TurnDone("t1")


def test_cancel_mid_utterance_no_audio_after_cancel(coda: Any) -> None:
    pair = coda.make_pair()
    pair.client.open_turn("t1", coda.turn(PCM_24K), pair.now)
    pair.client.send_text("t1", "One sentence here. And a second one. ", pair.now)
    pair.pump()
    pair.step_synthesis()  # first chunk reaches the client
    heard = len(audio_of(pair.events, "t1"))
    assert heard > 0
    pair.step_synthesis(deliver=False)  # second chunk is in transit
    pair.client.cancel("t1", pair.now)
    marker = len(pair.events)
    pair.pump()  # the in-transit audio arrives after the cancel
    pair.run()
    after = pair.events[marker:]
    assert not any(isinstance(e, AudioReceived) for e in after)
    assert after == [TurnDone("t1", cancelled=True)]
    assert pair.cancelled_jobs == [pair.requests[0].job_id]
    assert len(pair.requests) == 1  # the second sentence was never synthesised
    assert {"contextId": "1-t1", "cancelled": {}} in pair.server_frames
    # the connection carries on
    pair.client.open_turn("t2", coda.turn(PCM_24K), pair.now)
    pair.client.send_text("t2", "Next.", pair.now)
    pair.client.end_turn("t2", pair.now)
    pair.pump()
    pair.run()
    assert of_turn(pair.events, "t2")[-1] == TurnDone("t2")


def test_concurrent_turns_keep_their_own_audio(coda: Any) -> None:
    pair = coda.make_pair()
    texts = {"a": "Alpha turn.", "b": "Bravo turn speaks longer.", "c": "Charlie."}
    for turn_id, text in texts.items():
        pair.client.open_turn(turn_id, coda.turn(PCM_16K), pair.now)
        pair.client.send_text(turn_id, text, pair.now)
        pair.client.end_turn(turn_id, pair.now)
    pair.pump()
    assert len(pair.jobs) == 3  # one job per context, all running at once
    # deliver the chunks round-robin so the contexts' frames interleave
    while pair.jobs:
        for job_id in list(pair.jobs):
            pair.step_job(job_id)
        pair.pump()
    for turn_id, text in texts.items():
        pcm, _ = expected_speech(coda, [text], 16000)
        assert audio_of(pair.events, turn_id) == pcm
        assert of_turn(pair.events, turn_id)[-1] == TurnDone(turn_id)
    turns_in_order = [e.turn_id for e in pair.events if isinstance(e, AudioReceived)]
    assert turns_in_order[:3] == ["a", "b", "c"]


def test_unknown_voice_is_a_turn_failure(coda: Any) -> None:
    pair = coda.make_pair()
    pair.client.open_turn("t1", coda.turn(PCM_24K, voice="nobody"), pair.now)
    pair.pump()
    assert pair.events[-1] == TurnFailed("t1", "invalid_input", "unknown voice 'nobody'", False)
    assert pair.client.ready


def test_synthesis_failure_is_a_turn_failure_with_request_id(coda: Any) -> None:
    pair = coda.make_pair()
    pair.client.open_turn("t1", coda.turn(PCM_24K), pair.now)
    pair.client.send_text("t1", "Break. ", pair.now)
    pair.pump()
    pair.server.synthesis_failed(pair.requests[0].job_id, "engine crashed", pair.now)
    pair.pump()
    assert pair.events[-1] == TurnFailed(
        "t1", "internal", "engine crashed (requestId coda-request-1)", True
    )


def test_server_context_limit_surfaces_as_resource_exhausted(coda: Any) -> None:
    pair = coda.make_pair(ServerOptions(voices=VOICES, max_contexts=2))
    for turn_id in ("t1", "t2", "t3"):
        pair.client.open_turn(turn_id, coda.turn(PCM_24K), pair.now)
    pair.pump()
    assert pair.events[-1] == TurnFailed(
        "t3", "resource_exhausted", "the connection already has 2 open contexts", True
    )
    assert pair.client.open_turns() == 2


def test_wrong_key_is_provider_failed(coda: Any) -> None:
    options = ServerOptions(voices=VOICES, api_keys=frozenset({"the-real-key"}))
    pair = coda.make_pair(options, coda.make_client(api_key="a-wrong-key"))
    failed = [e for e in pair.events if isinstance(e, ProviderFailed)]
    assert failed == [ProviderFailed("unauthenticated", "invalid API key", (), False)]
    assert not pair.client.ready
    assert all("a-wrong-key" not in repr(e) for e in pair.events)


def test_credentials_in_config_for_a_direct_engine(coda: Any) -> None:
    options = ServerOptions(voices=VOICES, api_keys=frozenset({coda.API_KEY}))
    pair = coda.make_pair(options, coda.make_client(auth="config"))
    assert pair.client_frames[0]["config"]["authorization"] == coda.API_KEY
    pair.client.open_turn("t1", coda.turn(PCM_24K), pair.now)
    pair.client.send_text("t1", "Authenticated.", pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    pair.run()
    assert pair.events[-1] == TurnDone("t1")


def test_text_over_64_kib_is_accepted_in_pieces(coda: Any) -> None:
    pair = coda.make_pair()
    settings = coda.turn(AudioFormat("pcm_s16le", 8000), split_strategy="SPLIT_STRATEGY_NONE")
    pair.client.open_turn("t1", settings, pair.now)
    text = "word " * 30_000
    pair.client.send_text("t1", text, pair.now)
    pair.client.end_turn("t1", pair.now)
    pair.pump()
    assert not any("error" in f for f in pair.server_frames)
    pieces = [f["text"] for f in pair.client_frames if "text" in f]
    assert len(pieces) == 3 and "".join(pieces) == text


def test_language_outside_ready_languages_fails_the_turn(coda: Any) -> None:
    from bridge.providers.base import TurnSettings

    pair = coda.make_pair()
    assert pair.client.languages == ("en",)
    pair.client.open_turn("t1", TurnSettings("lyra", PCM_24K, language="ja"), pair.now)
    pair.pump()
    failed = pair.events[-1]
    assert isinstance(failed, TurnFailed) and failed.kind == "invalid_input"


def test_speed_becomes_time_scale_factor(coda: Any) -> None:
    from bridge.providers.base import TurnSettings

    pair = coda.make_pair()
    pair.client.open_turn("t1", TurnSettings("lyra", PCM_24K, speed=2.0), pair.now)
    pair.client.send_text("t1", "Fast. ", pair.now)
    pair.pump()
    assert pair.requests[0].speed == pytest.approx(2.0)

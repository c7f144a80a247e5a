"""KugelAudio server session: error frames, ordering rules and the happy path.

Driven with literal times and fake synthesis results; nothing sleeps.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import CloseConnection, SendText
from bridge.providers.base import WordTiming
from bridge.providers.kugelaudio.server import PATHS, SESSION, KugelAudioServerSession
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

CONFIG = {"voice_id": "joe", "sample_rate": 8000, "word_timestamps": True}


def tone(samples: int, seed: int = 1) -> bytes:
    return bytes((seed * 3 + i) % 256 for i in range(samples * 2))


def session(config: dict[str, Any] | None = None, **options: Any) -> KugelAudioServerSession:
    s = SESSION(ServerOptions(**options))
    s.connection_made(PATHS[0], {}, {}, 0.0)
    if config is not None:
        send(s, config, 0.0)
        assert drain(s) == []  # a config is not acknowledged
    return s


def send(s: KugelAudioServerSession, msg: Any, now: float) -> None:
    s.receive_text(msg if isinstance(msg, str) else json.dumps(msg), now)


def drain(s: KugelAudioServerSession) -> list[Any]:
    """Actions with ``SendText`` frames parsed, the rest as they are."""
    return [json.loads(a.text) if isinstance(a, SendText) else a for a in s.actions_to_send()]


def frames(s: KugelAudioServerSession) -> list[dict[str, Any]]:
    return [a for a in drain(s) if isinstance(a, dict)]


def only_job(actions: list[Any]) -> Synthesize:
    (job,) = [a for a in actions if isinstance(a, Synthesize)]
    return job


def error(message: str, error_code: str = "VALIDATION_ERROR", code: int = 400) -> dict[str, Any]:
    return {"error": message, "error_code": error_code, "code": code}


# --------------------------------------------------------------- happy path


def test_happy_path_two_chunks_with_offset_word_timestamps() -> None:
    s = session(CONFIG)
    send(s, {"text": "Hello there. How"}, 0.0)
    actions = drain(s)
    assert actions[0] == {"generation_started": True, "chunk_id": 0, "text": "Hello there."}
    job = only_job(actions)
    assert (job.text, job.voice, job.sample_rate_hz, job.speed) == (
        "Hello there.",
        "joe",
        8000,
        1.0,
    )

    pcm = tone(2000)  # 250 ms: cut into 200 ms frames
    words = (WordTiming("Hello", 0.0, 0.1), WordTiming("there.", 0.1, 0.25))
    s.synthesis_audio(job.job_id, pcm, words, 0.1)
    audio = frames(s)
    assert [(f["idx"], f["samples"], f["chunk_id"]) for f in audio] == [(0, 1600, 0), (1, 400, 0)]
    assert b"".join(base64.b64decode(f["audio"]) for f in audio) == pcm
    assert {(f["enc"], f["sr"]) for f in audio} == {("pcm_s16le", 8000)}

    s.synthesis_done(job.job_id, 0.3)
    assert frames(s) == [
        {
            "word_timestamps": [
                {
                    "word": "Hello",
                    "start_ms": 0,
                    "end_ms": 100,
                    "char_start": 0,
                    "char_end": 5,
                    "score": 1.0,
                },
                {
                    "word": "there.",
                    "start_ms": 100,
                    "end_ms": 250,
                    "char_start": 6,
                    "char_end": 12,
                    "score": 1.0,
                },
            ],
            "chunk_id": 0,
        },
        {"chunk_complete": True, "chunk_id": 0, "audio_seconds": 0.25, "gen_ms": 300},
    ]

    send(s, {"text": " are you?"}, 0.4)
    assert drain(s) == []  # no whitespace after "?": the sentence may go on
    send(s, {"flush": True}, 0.5)
    actions = drain(s)
    assert actions[0] == {"generation_started": True, "chunk_id": 1, "text": "How are you?"}
    job = only_job(actions)
    s.synthesis_audio(job.job_id, tone(800, 2), (WordTiming("How", 0.0, 0.05),), 0.55)
    s.synthesis_done(job.job_id, 0.6)
    out = frames(s)
    assert out[0]["idx"] == 2 and out[0]["chunk_id"] == 1
    assert out[1]["word_timestamps"][0]["start_ms"] == 250  # offset by chunk 0's audio
    assert out[1]["word_timestamps"][0]["end_ms"] == 300
    assert out[-2:] == [
        {
            "final": True,
            "total_audio_seconds": 0.35,
            "total_text_chunks": 2,
            "total_audio_chunks": 3,
        },
        {
            "session_closed": True,
            "total_audio_seconds": 0.35,
            "total_text_chunks": 2,
            "total_audio_chunks": 3,
            "usage": {
                "audio_seconds": 0.35,
                "characters": len("Hello there.") + len("How are you?"),
                "cost_cents": None,
                "cost_unavailable": True,
                "currency": "eur",
                "model_id": "kugel-3",
            },
        },
    ]


def test_word_timestamps_only_when_asked() -> None:
    s = session({"voice_id": "joe"})
    send(s, {"text": "Hi.", "flush": True}, 0.0)
    job = only_job(drain(s))
    assert job.sample_rate_hz == 24000  # the documented default
    s.synthesis_audio(job.job_id, tone(240), (WordTiming("Hi.", 0.0, 0.01),), 0.1)
    s.synthesis_done(job.job_id, 0.1)
    assert [next(iter(f)) for f in frames(s)] == [
        "audio",
        "chunk_complete",
        "final",
        "session_closed",
    ]


# ------------------------------------------------------------- error frames


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{nope", error("Invalid request")),
        ("[1, 2]", error("Invalid request")),
        (json.dumps({"foo": 1}), error("Invalid request")),
        (
            json.dumps({"text": "Hi."}),
            error("Invalid request: send the config message before text"),
        ),
        (json.dumps({"voice_id": "nobody"}), error("Voice not found", "NOT_FOUND", 404)),
        (
            json.dumps({"voice_id": True}),
            error("Invalid request: voice_id must be an integer or a voice name"),
        ),
        (
            json.dumps({"model_id": ""}),
            error("Invalid request: model_id must be a non-empty string"),
        ),
        (
            json.dumps({"sample_rate": 44100}),
            error("Invalid request: sample_rate must be one of [8000, 16000, 22050, 24000]"),
        ),
        (
            json.dumps({"temperature": 1.5}),
            error("Invalid request: temperature must be between 0.0 and 1.0"),
        ),
        (json.dumps({"speed": 2}), error("Invalid request: speed must be between 0.8 and 1.2")),
        (
            json.dumps({"max_new_tokens": 4096}),
            error("Invalid request: max_new_tokens must be between 1 and 2048"),
        ),
        (
            json.dumps({"max_new_tokens": 0}),
            error("Invalid request: max_new_tokens must be between 1 and 2048"),
        ),
        (
            json.dumps({"word_timestamps": "yes"}),
            error("Invalid request: word_timestamps must be a boolean"),
        ),
        (
            json.dumps({"flush_timeout_ms": -1}),
            error("Invalid request: flush_timeout_ms must be between 0 and None"),
        ),
        (
            json.dumps({"max_buffer_length": 1.5}),
            error("Invalid request: max_buffer_length must be an integer"),
        ),
        (
            json.dumps({"output_format": "mp3_44100_128"}),
            error("Invalid request: unsupported output_format 'mp3_44100_128' (only pcm_s16le)"),
        ),
        (
            json.dumps({"dictionary_ids": [1]}),
            error("Invalid request: dictionary_ids requires project_id"),
        ),
        (
            json.dumps({"dictionary_ids": [1], "project_id": 5}),
            error("Dictionary not found", "NOT_FOUND", 404),
        ),
        (
            json.dumps({"dictionary_ids": "1"}),
            error("Invalid request: dictionary_ids must be a list of integers"),
        ),
        (json.dumps({"cancel": "yes"}), error("Invalid request: cancel must be true")),
        (
            json.dumps({"update_settings": [1]}),
            error("Invalid request: update_settings must be an object"),
        ),
        (
            json.dumps({"update_settings": {"voice_id": 1}}),
            error(
                "Invalid request: voice_id cannot be changed with update_settings;"
                " send a config message between turns"
            ),
        ),
        (
            json.dumps({"update_settings": {"sample_rate": 8000, "output_format": "pcm_s16le"}}),
            error(
                "Invalid request: output_format, sample_rate cannot be changed with"
                " update_settings; send a config message between turns"
            ),
        ),
        (
            json.dumps({"update_settings": {"pitch": 1}}),
            error("Invalid request: unknown setting(s) pitch"),
        ),
        (
            json.dumps({"update_settings": {"speed": 5}}),
            error("Invalid request: speed must be between 0.8 and 1.2"),
        ),
    ],
)
def test_bad_input_gets_the_documented_error_frame(raw: str, expected: dict[str, Any]) -> None:
    s = session()
    s.receive_text(raw, 0.0)
    assert drain(s) == [expected]  # the socket stays open: no CloseConnection
    send(s, {"voice_id": "joe"}, 0.1)
    send(s, {"text": "Still here. "}, 0.2)
    assert any(isinstance(a, Synthesize) for a in drain(s))


def test_invalid_config_is_not_applied_at_all() -> None:
    s = session(CONFIG)
    send(s, {"voice_id": "tone", "speed": 9}, 0.0)
    assert frames(s) == [error("Invalid request: speed must be between 0.8 and 1.2")]
    send(s, {"text": "Hi. "}, 0.1)
    assert only_job(drain(s)).voice == "joe"


def test_binary_frame_is_refused() -> None:
    s = session(CONFIG)
    s.receive_bytes(b"\x00\x01", 0.0)
    assert drain(s) == [error("Invalid request: binary frames are not accepted")]


def test_text_and_flush_type_errors() -> None:
    s = session(CONFIG)
    send(s, {"text": 5}, 0.0)
    send(s, {"flush": "yes"}, 0.0)
    assert drain(s) == [
        error("Invalid request: text must be a string"),
        error("Invalid request: flush must be a boolean"),
    ]


def test_config_change_mid_turn_is_refused_but_same_values_pass() -> None:
    s = session(CONFIG)
    send(s, {"text": "Hello"}, 0.0)
    send(s, {"voice_id": "tone"}, 0.1)
    assert drain(s) == [error("Invalid request: settings can only change between turns")]
    send(s, {"voice_id": "joe", "text": " world"}, 0.2)
    assert drain(s) == []


def test_cfg_scale_is_clamped_and_update_settings_acknowledged() -> None:
    s = session(CONFIG)
    send(s, {"update_settings": {"cfg_scale": 9, "language": "de"}}, 0.0)
    assert drain(s) == [
        {
            "settings_updated": True,
            "settings": {
                "cfg_scale": 2.5,
                "temperature": None,
                "max_new_tokens": 2048,
                "language": "de",
                "normalize": True,
                "speed": 1.0,
            },
        }
    ]


def test_unauthorized_key_closes_with_policy_violation() -> None:
    s = SESSION(ServerOptions(api_keys=frozenset({"good"})))
    s.connection_made("/ws/tts/stream", {"api_key": "bad"}, {}, 0.0)
    assert drain(s) == [
        error("Unauthorized", "UNAUTHORIZED", 401),
        CloseConnection(1008, "Unauthorized"),
    ]
    send(s, CONFIG, 0.1)
    assert drain(s) == []
    ok = SESSION(ServerOptions(api_keys=frozenset({"good"})))
    ok.connection_made("/ws/tts/stream", {"api_key": "good"}, {}, 0.0)
    assert drain(ok) == []


def test_unknown_path_is_refused() -> None:
    s = SESSION(ServerOptions())
    s.connection_made("/ws/tts", {}, {}, 0.0)
    assert drain(s) == [error("Not found", "NOT_FOUND", 404), CloseConnection(1008, "Not found")]


def test_synthesis_failure_is_an_internal_error_and_ends_the_turn() -> None:
    s = session(CONFIG)
    send(s, {"text": "Hi.", "flush": True}, 0.0)
    job = only_job(drain(s))
    s.synthesis_failed(job.job_id, "piper crashed", 0.1)
    assert frames(s) == [error("Generation failed", "INTERNAL_ERROR", 500)]
    s.synthesis_audio(job.job_id, tone(100), (), 0.2)  # late output is dropped
    assert drain(s) == []
    send(s, {"text": "Again. "}, 0.3)
    assert only_job(drain(s)).job_id != job.job_id


# ----------------------------------------------------------- ordering rules


def test_chunks_are_synthesised_one_after_another() -> None:
    s = session(CONFIG)
    send(s, {"text": "One. Two. Thr"}, 0.0)
    first = only_job(drain(s))
    assert first.text == "One."
    s.synthesis_audio(first.job_id, tone(80), (), 0.1)
    s.synthesis_done(first.job_id, 0.1)
    actions = drain(s)
    second = only_job(actions)
    assert second.text == "Two."
    assert [a.get("chunk_id") for a in actions if isinstance(a, dict)] == [0, 0, 1]


def test_frames_after_flush_wait_for_session_closed() -> None:
    s = session(CONFIG)
    send(s, {"text": "First turn. "}, 0.0)
    job = only_job(drain(s))
    send(s, {"flush": True}, 0.1)
    send(s, {"text": "Second turn. "}, 0.2)  # the next turn's text, sent early
    assert drain(s) == []
    s.synthesis_audio(job.job_id, tone(80), (), 0.3)
    s.synthesis_done(job.job_id, 0.3)
    out = drain(s)
    kinds = [next(iter(a)) if isinstance(a, dict) else type(a).__name__ for a in out]
    assert kinds == [
        "audio",
        "chunk_complete",
        "final",
        "session_closed",
        "generation_started",
        "Synthesize",
    ]
    assert out[4] == {"generation_started": True, "chunk_id": 0, "text": "Second turn."}


def test_cancel_stops_the_job_and_drops_held_frames() -> None:
    s = session(CONFIG)
    send(s, {"text": "A long story. "}, 0.0)
    job = only_job(drain(s))
    s.synthesis_audio(job.job_id, tone(80), (), 0.1)
    drain(s)
    send(s, {"flush": True}, 0.15)
    send(s, {"text": "Held."}, 0.16)
    send(s, {"cancel": True}, 0.2)
    assert drain(s) == [CancelSynthesis(job.job_id), {"interrupted": True}]
    s.synthesis_audio(job.job_id, tone(80), (), 0.25)
    s.synthesis_done(job.job_id, 0.26)
    assert drain(s) == []  # no final / session_closed after a cancel
    assert s.next_deadline() is None


def test_cancel_when_idle_is_still_acknowledged() -> None:
    s = session(CONFIG)
    send(s, {"cancel": True}, 0.0)
    assert drain(s) == [{"interrupted": True}]


@pytest.mark.parametrize("message", [{"close": True}, {"end_session": True}])
def test_close_and_end_session_end_the_turn_gracefully(message: dict[str, Any]) -> None:
    s = session(CONFIG)
    send(s, {"text": "Bye"}, 0.0)
    send(s, message, 0.1)
    job = only_job(drain(s))
    s.synthesis_done(job.job_id, 0.2)
    assert [next(iter(f)) for f in frames(s)] == ["chunk_complete", "final", "session_closed"]


def test_close_socket_finishes_the_turn_then_closes() -> None:
    s = session(CONFIG)
    send(s, {"text": "Bye. "}, 0.0)
    job = only_job(drain(s))
    send(s, {"close_socket": True}, 0.1)
    assert drain(s) == []
    s.synthesis_done(job.job_id, 0.2)
    out = drain(s)
    assert out[-1] == CloseConnection(1000, "close_socket")
    assert [next(iter(a)) for a in out[:-1]] == ["chunk_complete", "final", "session_closed"]


def test_close_socket_when_idle_closes_at_once() -> None:
    s = session(CONFIG)
    send(s, {"close_socket": True}, 0.0)
    assert drain(s) == [CloseConnection(1000, "close_socket")]


def test_flush_timeout_then_idle_auto_end_with_warning() -> None:
    s = session({**CONFIG, "flush_timeout_ms": 200})
    send(s, {"text": "Let me check"}, 1.0)
    assert drain(s) == []
    assert s.next_deadline() == pytest.approx(1.2)
    s.handle_timer(1.2)
    job = only_job(drain(s))
    assert job.text == "Let me check"
    s.synthesis_done(job.job_id, 1.3)
    drain(s)
    send(s, {"text": ""}, 3.0)  # empty text is not new text
    assert s.next_deadline() == pytest.approx(6.0)
    s.handle_timer(6.0)
    out = frames(s)
    assert "warning" in out[0] and "5s of inactivity" in out[0]["warning"]
    assert [next(iter(f)) for f in out[1:]] == ["final", "session_closed"]
    assert s.next_deadline() is None


def test_sentence_split_keeps_closing_quotes() -> None:
    s = session(CONFIG)
    send(s, {"text": 'He said "hi." Then left.\n'}, 0.0)
    job = only_job(drain(s))
    assert job.text == 'He said "hi."'


def test_max_buffer_length_forces_a_chunk() -> None:
    s = session({**CONFIG, "max_buffer_length": 10})
    send(s, {"text": "abcdefghij"}, 0.0)
    assert only_job(drain(s)).text == "abcdefghij"


def test_update_settings_applies_from_the_next_turn() -> None:
    s = session(CONFIG)
    send(s, {"text": "One. Two. "}, 0.0)
    first = only_job(drain(s))
    send(s, {"update_settings": {"speed": 1.2}}, 0.05)
    assert frames(s)[0]["settings"]["speed"] == 1.2
    s.synthesis_done(first.job_id, 0.1)
    assert only_job(drain(s)).speed == 1.0  # same turn: old settings
    send(s, {"flush": True}, 0.2)
    s.synthesis_done("ka1.1", 0.3)
    drain(s)
    send(s, {"text": "Three. "}, 0.4)
    assert only_job(drain(s)).speed == 1.2


def test_connection_lost_cancels_the_running_job() -> None:
    s = session(CONFIG)
    send(s, {"text": "Hi. "}, 0.0)
    job = only_job(drain(s))
    s.connection_lost(0.1)
    assert drain(s) == [CancelSynthesis(job.job_id)]
    send(s, {"text": "ignored"}, 0.2)
    assert drain(s) == []


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = st.sampled_from(
    [
        "text",
        "flush",
        "cancel",
        "close",
        "end_session",
        "close_socket",
        "update_settings",
        "voice_id",
        "sample_rate",
        "speed",
        "word_timestamps",
        "dictionary_ids",
        "project_id",
        "flush_timeout_ms",
        "max_buffer_length",
        "output_format",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_KEYS, _VALUES, max_size=4) | st.text(max_size=20), max_size=8))
def test_fuzzed_client_frames_never_raise(frames_in: list[Any]) -> None:
    s = session(CONFIG)
    for i, frame in enumerate(frames_in):
        s.receive_text(frame if isinstance(frame, str) else json.dumps(frame), 0.1 * i)
        for action in drain(s):
            if isinstance(action, Synthesize):
                s.synthesis_audio(action.job_id, tone(33), (WordTiming("w", 0.0, 0.01),), 0.1 * i)
                s.synthesis_done(action.job_id, 0.1 * i)
        deadline = s.next_deadline()
        if deadline is not None:
            s.handle_timer(deadline)
        drain(s)

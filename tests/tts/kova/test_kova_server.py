"""The Kova server session driven frame by frame with literal times and fake synthesis."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bridge.engine import Action, CloseConnection, SendText
from bridge.providers.base import WordTiming
from bridge.providers.kova.server import (
    MAX_AUDIO_CHUNK_BYTES,
    MAX_FRAME_CHARS,
    MAX_PENDING_CHARS,
    MAX_TEXT_CHARS,
    PATHS,
    SESSION,
    KovaServerSession,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from telcodec import g711

OPTIONS = ServerOptions(voices=frozenset({"cal", "joe"}), max_contexts=3)
START = {"voice_id": "cal", "model_id": "default"}


def session(options: ServerOptions = OPTIONS) -> KovaServerSession:
    s = KovaServerSession(options)
    s.connection_made(PATHS[0], {}, {}, 0.0)
    assert s.actions_to_send() == []
    return s


def send(s: KovaServerSession, frame: object, now: float = 0.0) -> list[Action]:
    s.receive_text(json.dumps(frame), now)
    return s.actions_to_send()


def frames(actions: list[Action]) -> list[dict[str, Any]]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def jobs(actions: list[Action]) -> list[Synthesize]:
    return [a for a in actions if isinstance(a, Synthesize)]


def started(s: KovaServerSession, context_id: str | None = "c1", **fields: object) -> None:
    frame: dict[str, object] = {"start_context": {**START, **fields}}
    if context_id is not None:
        frame["context_id"] = context_id
    (reply,) = frames(send(s, frame))
    assert "context_started" in reply


def pcm_of(n_samples: int, start: int = 0) -> bytes:
    return b"".join(
        ((start + i) % 1000).to_bytes(2, "little", signed=True) for i in range(n_samples)
    )


def test_module_attributes() -> None:
    assert SESSION is KovaServerSession
    assert PATHS == ("/v1/ws/kova",)
    assert KovaServerSession.protocol_name == "kova"
    assert session().next_deadline() is None


def test_happy_path_ordering_and_offsets() -> None:
    s = session()
    reply = frames(send(s, {"start_context": {**START, "timestamps": True}, "context_id": "c1"}))
    assert reply == [
        {
            "context_started": {
                "voice_id": "cal",
                "model_id": "default",
                "timestamps": True,
                "response_format": {"encoding": "pcm", "sample_rate": 32000},
            },
            "context_id": "c1",
        }
    ]
    actions = send(s, {"send_text": "Hello world. How", "context_id": "c1"})
    assert actions == [Synthesize("kova-1", "Hello world.", "cal", 32000)]
    assert send(s, {"send_text": " are you", "context_id": "c1"}) == []
    assert send(s, {"flush": True, "context_id": "c1", "flush_id": "f1"}) == []

    first = pcm_of(3200)  # 0.1 s at 32 kHz
    s.synthesis_audio("kova-1", first, (WordTiming("Hello", 0.0, 0.05),), 0.1)
    s.synthesis_audio("kova-1", b"", (WordTiming("world.", 0.05, 0.1),), 0.1)
    out = frames(s.actions_to_send())
    assert out == [
        {"audio_chunk": base64.b64encode(first).decode(), "context_id": "c1"},
        {
            "timestamps": {"words": ["Hello"], "start_seconds": [0.0], "end_seconds": [0.05]},
            "context_id": "c1",
        },
        {
            "timestamps": {"words": ["world."], "start_seconds": [0.05], "end_seconds": [0.1]},
            "context_id": "c1",
        },
    ]
    s.synthesis_done("kova-1", 0.2)
    assert s.actions_to_send() == [Synthesize("kova-2", "How are you", "cal", 32000)]
    second = pcm_of(1600)
    s.synthesis_audio("kova-2", second, (WordTiming("How", 0.0, 0.02),), 0.3)
    s.synthesis_done("kova-2", 0.3)
    out = frames(s.actions_to_send())
    assert [next(iter(f)) for f in out] == ["audio_chunk", "timestamps", "flush_completed"]
    assert out[1]["timestamps"]["start_seconds"] == [0.1]  # offset by the first job's 0.1 s
    assert out[1]["timestamps"]["end_seconds"] == [0.12]
    assert out[2] == {"flush_completed": True, "flush_id": "f1", "context_id": "c1"}
    assert frames(send(s, {"close_context": True, "context_id": "c1"})) == [
        {"context_closed": True, "context_id": "c1"}
    ]


def test_timestamps_only_when_asked() -> None:
    s = session()
    started(s)
    (job,) = jobs(send(s, {"send_text": "Hi. ", "context_id": "c1"}))
    s.synthesis_audio(job.job_id, pcm_of(10), (WordTiming("Hi.", 0.0, 0.1),), 0.1)
    assert [next(iter(f)) for f in frames(s.actions_to_send())] == ["audio_chunk"]


@pytest.mark.parametrize(
    ("encoding", "encode"), [("mulaw", g711.ulaw_encode), ("alaw", g711.alaw_encode)]
)
def test_g711_output(encoding: str, encode: Any) -> None:
    s = session()
    started(s, response_format={"encoding": encoding})
    (job,) = jobs(send(s, {"send_text": "Hi. ", "context_id": "c1"}))
    assert job.sample_rate_hz == 8000
    pcm = pcm_of(160)
    s.synthesis_audio(job.job_id, pcm[:101], (), 0.1)  # odd split: the byte is carried
    s.synthesis_audio(job.job_id, pcm[101:], (), 0.1)
    audio = b"".join(base64.b64decode(f["audio_chunk"]) for f in frames(s.actions_to_send()))
    assert audio == encode(pcm)


@pytest.mark.parametrize("encoding", ["pcm", "linear16"])
def test_pcm_at_requested_rate(encoding: str) -> None:
    s = session()
    started(s, response_format={"encoding": encoding, "sample_rate": 16000})
    (job,) = jobs(send(s, {"send_text": "Hi. ", "context_id": "c1"}))
    assert job.sample_rate_hz == 16000
    pcm = pcm_of(MAX_AUDIO_CHUNK_BYTES)  # twice the chunk limit in bytes
    s.synthesis_audio(job.job_id, pcm, (), 0.1)
    chunks = [base64.b64decode(f["audio_chunk"]) for f in frames(s.actions_to_send())]
    assert len(chunks) == 2 and b"".join(chunks) == pcm


def test_echo_keeps_optional_fields() -> None:
    s = session()
    fmt = {"encoding": "pcm", "sample_rate": 24000, "bitrate": "128k"}
    (reply,) = frames(
        send(s, {"start_context": {**START, "temperature": None, "response_format": fmt}})
    )
    assert reply == {
        "context_started": {
            "voice_id": "cal",
            "model_id": "default",
            "temperature": None,
            "timestamps": False,
            "response_format": fmt,
        }
    }


def test_default_context_without_context_id() -> None:
    s = session()
    started(s, context_id=None)
    (job,) = jobs(send(s, {"send_text": "Hello. "}))
    assert frames(send(s, {"flush": True})) == []
    s.synthesis_audio(job.job_id, pcm_of(4), (), 0.1)
    s.synthesis_done(job.job_id, 0.1)
    out = frames(s.actions_to_send())
    assert out[-1] == {"flush_completed": True, "flush_id": "flush-1"}
    assert all("context_id" not in f for f in out)
    assert frames(send(s, {"close_context": True})) == [{"context_closed": True}]


def test_empty_flush_completes_at_once_and_in_order() -> None:
    s = session()
    started(s)
    assert frames(send(s, {"flush": True, "context_id": "c1", "flush_id": "a"})) == [
        {"flush_completed": True, "flush_id": "a", "context_id": "c1"}
    ]
    (job,) = jobs(send(s, {"send_text": "One. ", "context_id": "c1"}))
    assert send(s, {"flush": True, "context_id": "c1", "flush_id": "b"}) == []
    assert send(s, {"flush": True, "context_id": "c1", "flush_id": "c"}) == []
    s.synthesis_done(job.job_id, 0.1)
    assert [f["flush_id"] for f in frames(s.actions_to_send())] == ["b", "c"]


def test_close_context_cancels_and_drops_late_output() -> None:
    s = session()
    started(s)
    (job,) = jobs(send(s, {"send_text": "A long sentence. Another one. ", "context_id": "c1"}))
    send(s, {"flush": True, "context_id": "c1", "flush_id": "f1"})
    s.synthesis_audio(job.job_id, pcm_of(8), (), 0.1)
    assert len(frames(s.actions_to_send())) == 1
    actions = send(s, {"close_context": True, "context_id": "c1"}, 0.2)
    assert actions == [
        CancelSynthesis(job.job_id),
        SendText('{"context_closed":true,"context_id":"c1"}'),
    ]
    s.synthesis_audio(job.job_id, pcm_of(8), (WordTiming("x", 0.0, 0.1),), 0.3)
    s.synthesis_done(job.job_id, 0.3)
    assert s.actions_to_send() == []  # nothing after context_closed (rule 4)
    assert frames(send(s, {"send_text": "more", "context_id": "c1"})) == [
        {"error": "unknown context: c1", "context_id": "c1"}
    ]


def test_synthesis_failure_reports_the_flush_and_moves_on() -> None:
    s = session()
    started(s)
    (job,) = jobs(send(s, {"send_text": "Broken. ", "context_id": "c1"}))
    send(s, {"flush": True, "context_id": "c1", "flush_id": "f1"})
    send(s, {"send_text": "Next. ", "context_id": "c1"})
    send(s, {"flush": True, "context_id": "c1", "flush_id": "f2"})
    s.synthesis_failed(job.job_id, "engine crashed", 0.1)
    actions = s.actions_to_send()
    assert frames(actions) == [
        {"error": "synthesis failed: engine crashed", "context_id": "c1", "flush_id": "f1"}
    ]
    (next_job,) = jobs(actions)
    assert next_job.text == "Next."
    s.synthesis_done(next_job.job_id, 0.2)
    assert frames(s.actions_to_send()) == [
        {"flush_completed": True, "flush_id": "f2", "context_id": "c1"}
    ]


def test_contexts_run_independently() -> None:
    s = session()
    started(s, "a", timestamps=True)
    started(s, "b", timestamps=True, response_format={"encoding": "pcm", "sample_rate": 16000})
    (job_a,) = jobs(send(s, {"send_text": "One. ", "context_id": "a"}))
    (job_b,) = jobs(send(s, {"send_text": "Two. ", "context_id": "b"}))
    assert (job_a.sample_rate_hz, job_b.sample_rate_hz) == (32000, 16000)
    s.synthesis_audio(job_b.job_id, pcm_of(4), (WordTiming("Two.", 0.0, 0.1),), 0.1)
    s.synthesis_audio(job_a.job_id, pcm_of(4), (WordTiming("One.", 0.0, 0.1),), 0.1)
    assert [f["context_id"] for f in frames(s.actions_to_send())] == ["b", "b", "a", "a"]


def test_long_text_without_sentence_end_is_cut() -> None:
    s = session()
    started(s)
    text = "word " * (MAX_PENDING_CHARS // 5 + 1)
    (job,) = jobs(send(s, {"send_text": text, "context_id": "c1"}))
    assert job.text == text.strip()


def test_whitespace_only_text_makes_no_job() -> None:
    s = session()
    started(s)
    assert send(s, {"send_text": "   ", "context_id": "c1"}) == []
    assert frames(send(s, {"flush": True, "context_id": "c1", "flush_id": "f"})) == [
        {"flush_completed": True, "flush_id": "f", "context_id": "c1"}
    ]


def _bad(frame: object) -> str:
    return frame if isinstance(frame, str) else json.dumps(frame)


BAD_FRAMES: list[tuple[object, dict[str, object]]] = [
    ("{not json", {"error": "invalid JSON"}),
    ("[1, 2]", {"error": "frame must be a JSON object"}),
    ({"hello": 1}, {"error": "unknown frame type"}),
    ({"hello": 1, "context_id": "c1"}, {"error": "unknown frame type", "context_id": "c1"}),
    (
        {"send_text": "x", "flush": True, "context_id": "c1"},
        {"error": "ambiguous frame: send_text, flush", "context_id": "c1"},
    ),
    ({"send_text": "x", "context_id": 7}, {"error": "invalid field: context_id"}),
    ({"start_context": "cal"}, {"error": "invalid field: start_context"}),
    ({"start_context": {"model_id": "m"}}, {"error": "missing field: voice_id"}),
    ({"start_context": {"voice_id": 3, "model_id": "m"}}, {"error": "invalid field: voice_id"}),
    ({"start_context": {"voice_id": "cal"}}, {"error": "missing field: model_id"}),
    ({"start_context": {**START, "voice_id": "zed"}}, {"error": "unknown voice: zed"}),
    ({"start_context": {**START, "temperature": "hot"}}, {"error": "invalid field: temperature"}),
    ({"start_context": {**START, "temperature": -1}}, {"error": "invalid field: temperature"}),
    ({"start_context": {**START, "temperature": True}}, {"error": "invalid field: temperature"}),
    ({"start_context": {**START, "timestamps": "yes"}}, {"error": "invalid field: timestamps"}),
    (
        {"start_context": {**START, "response_format": "pcm"}},
        {"error": "invalid field: response_format"},
    ),
    (
        {"start_context": {**START, "response_format": {"sample_rate": 8000}}},
        {"error": "invalid field: response_format.encoding"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "flac"}}},
        {"error": "invalid field: response_format.encoding"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "mp3"}}},
        {"error": "unsupported encoding: mp3"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "wav"}}},
        {"error": "unsupported encoding: wav"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "opus", "bitrate": 32000}}},
        {"error": "unsupported encoding: opus"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "pcm", "sample_rate": "8k"}}},
        {"error": "invalid field: response_format.sample_rate"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "pcm", "sample_rate": 0}}},
        {"error": "invalid field: response_format.sample_rate"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "pcm", "sample_rate": 12345}}},
        {"error": "unsupported sample_rate for pcm: 12345"},
    ),
    (
        {
            "start_context": {
                **START,
                "response_format": {"encoding": "mulaw", "sample_rate": 16000},
            },
            "context_id": "x",
        },
        {"error": "unsupported sample_rate for mulaw: 16000", "context_id": "x"},
    ),
    (
        {"start_context": {**START, "response_format": {"encoding": "pcm", "bitrate": [1]}}},
        {"error": "invalid field: response_format.bitrate"},
    ),
    (
        {"send_text": 5, "context_id": "c1"},
        {"error": "invalid field: send_text", "context_id": "c1"},
    ),
    (
        {"send_text": "hi", "context_id": "nope"},
        {"error": "unknown context: nope", "context_id": "nope"},
    ),
    ({"send_text": "hi"}, {"error": "unknown context: None"}),
    (
        {"send_text": "x" * (MAX_TEXT_CHARS + 1), "context_id": "c1"},
        {"error": f"text too long (max {MAX_TEXT_CHARS} characters)", "context_id": "c1"},
    ),
    ({"flush": 1, "context_id": "c1"}, {"error": "invalid field: flush", "context_id": "c1"}),
    (
        {"flush": True, "context_id": "c1", "flush_id": 9},
        {"error": "invalid field: flush_id", "context_id": "c1"},
    ),
    (
        {"flush": True, "context_id": "nope", "flush_id": "f1"},
        {"error": "unknown context: nope", "context_id": "nope", "flush_id": "f1"},
    ),
    (
        {"close_context": "yes", "context_id": "c1"},
        {"error": "invalid field: close_context", "context_id": "c1"},
    ),
    (
        {"close_context": True, "context_id": "nope"},
        {"error": "unknown context: nope", "context_id": "nope"},
    ),
    (
        {"start_context": START, "context_id": "c1"},
        {"error": "context already exists: c1", "context_id": "c1"},
    ),
]


@pytest.mark.parametrize(("frame", "error"), BAD_FRAMES)
def test_bad_input_gets_an_error_frame(frame: object, error: dict[str, object]) -> None:
    s = session()
    started(s)
    s.receive_text(_bad(frame), 1.0)
    actions = s.actions_to_send()
    assert frames(actions) == [error]
    assert not [a for a in actions if not isinstance(a, SendText)]
    # the socket stays usable: the open context still works
    assert jobs(send(s, {"send_text": "Still here. ", "context_id": "c1"}))


def test_too_many_contexts() -> None:
    s = session()
    for name in ("a", "b", "c"):
        started(s, name)
    assert frames(send(s, {"start_context": START, "context_id": "d"})) == [
        {"error": "too many contexts (max 3)", "context_id": "d"}
    ]
    send(s, {"close_context": True, "context_id": "a"})
    started(s, "d")


def test_frame_too_large_and_binary() -> None:
    s = session()
    s.receive_text(" " * (MAX_FRAME_CHARS + 1), 0.0)
    s.receive_bytes(b"\x00\x01", 0.0)
    assert frames(s.actions_to_send()) == [
        {"error": f"frame too large (max {MAX_FRAME_CHARS} characters)"},
        {"error": "binary frames are not supported"},
    ]


def test_authorization_bearer() -> None:
    options = ServerOptions(voices=frozenset({"cal"}), api_keys=frozenset({"k1"}))
    good = KovaServerSession(options)
    good.connection_made(PATHS[0], {}, {"authorization": "Bearer k1"}, 0.0)
    assert good.actions_to_send() == []
    bad = KovaServerSession(options)
    bad.connection_made(PATHS[0], {}, {"authorization": "Bearer nope"}, 0.0)
    assert bad.actions_to_send() == [
        SendText('{"error":"unauthorized"}'),
        CloseConnection(1008, "unauthorized"),
    ]
    bad.receive_text(json.dumps({"start_context": START}), 0.1)
    assert bad.actions_to_send() == []
    missing = KovaServerSession(options)
    missing.connection_made(PATHS[0], {}, {}, 0.0)
    assert isinstance(missing.actions_to_send()[-1], CloseConnection)


def test_connection_lost_cancels_running_jobs() -> None:
    s = session()
    started(s, "a")
    started(s, "b")
    (job_a,) = jobs(send(s, {"send_text": "One. ", "context_id": "a"}))
    (job_b,) = jobs(send(s, {"send_text": "Two. ", "context_id": "b"}))
    s.connection_lost(1.0)
    assert sorted(
        a.job_id for a in s.actions_to_send() if isinstance(a, CancelSynthesis)
    ) == sorted([job_a.job_id, job_b.job_id])
    s.synthesis_audio(job_a.job_id, pcm_of(4), (), 1.1)
    s.receive_text(json.dumps({"start_context": START}), 1.1)
    assert s.actions_to_send() == []


def test_unknown_job_results_are_ignored() -> None:
    s = session()
    s.synthesis_audio("nope", pcm_of(4), (), 0.0)
    s.synthesis_done("nope", 0.0)
    s.synthesis_failed("nope", "x", 0.0)
    assert s.actions_to_send() == []


@pytest.mark.parametrize("context_id", [None, "c1", 'q"uo\\te', "naïve ✓", "tab\tnl\n"])
def test_audio_frame_text_is_what_the_json_encoder_writes(context_id: str | None) -> None:
    """``audio_chunk`` frames are built without the JSON encoder: the same text, byte for byte."""
    s = session()
    started(s, context_id)
    frame: dict[str, object] = {"send_text": "Hi. There"}
    if context_id is not None:
        frame["context_id"] = context_id
    (job,) = jobs(send(s, frame))
    pcm = pcm_of(800)
    s.synthesis_audio(job.job_id, pcm, (), 0.1)
    texts = [a.text for a in s.actions_to_send() if isinstance(a, SendText)]
    want: dict[str, object] = {"audio_chunk": base64.b64encode(pcm).decode("ascii")}
    if context_id is not None:
        want["context_id"] = context_id
    assert texts == [json.dumps(want, separators=(",", ":"))]

"""The zwst server engine, driven with literal times and fake synthesis results."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

import pytest

from bridge.engine import Action, CloseConnection, SendBytes, SendText
from bridge.providers.base import WordTiming
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.zwst.server import (
    CONTEXT_IDLE_TIMEOUT_S,
    MAX_TEXT_CHARS,
    PATHS,
    SESSION,
    SESSION_ROUTE,
    SLOW_READER_CLOSE_S,
    TOKEN_TTL_S,
    ZwstServerSession,
    handle_session_request,
    split_segments,
)
from bridge.providers.zwst.wire import AudioFrameHeader, unpack_frame_header

OPTIONS = ServerOptions(voices=frozenset({"maichi", "joe"}), default_voice="maichi", max_contexts=2)
RATE = 8000
FRAME_BYTES = RATE * 40 // 1000 * 2  # 40 ms frames


def session_url(
    body: dict[str, object] | None = None, options: ServerOptions = OPTIONS, now: float = 0.0
) -> str:
    props = {"voice_id": "maichi", "sample_rate": RATE, "word_timestamps": True, **(body or {})}
    status, answer = handle_session_request(
        json.dumps(props).encode(), options, "http://127.0.0.1:9000", now=now
    )
    assert status == 200, answer
    url = json.loads(answer)["url"]
    assert isinstance(url, str)
    return url


def open_session(
    url: str | None = None, options: ServerOptions = OPTIONS, now: float = 0.0
) -> ZwstServerSession:
    parts = urlsplit(url or session_url(options=options))
    session = SESSION(options)
    session.connection_made(parts.path, dict(parse_qsl(parts.query)), {}, now)
    assert session.actions_to_send() == []
    return session


def send(session: ZwstServerSession, now: float, **frame: object) -> list[Action]:
    session.receive_text(json.dumps(frame), now)
    return session.actions_to_send()


def texts(actions: list[Action]) -> list[dict[str, object]]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def frames(actions: list[Action]) -> list[tuple[AudioFrameHeader, bytes]]:
    return [(unpack_frame_header(a.data), a.data[12:]) for a in actions if isinstance(a, SendBytes)]


def jobs(actions: list[Action]) -> list[Synthesize]:
    return [a for a in actions if isinstance(a, Synthesize)]


def error(cid: str | None, message_part: str, actions: list[Action]) -> None:
    [frame] = texts(actions)
    assert frame["type"] == "error" and frame["context_id"] == cid
    assert message_part in str(frame["message"])


def pcm(n_samples: int, value: int = 1000) -> bytes:
    return value.to_bytes(2, "little", signed=True) * n_samples


# ------------------------------------------------------------ session route


def test_paths_and_session_route() -> None:
    assert PATHS == ("/v1/stream",) and SESSION_ROUTE == "/v1/sessions"


def test_session_route_answers_the_connect_url() -> None:
    status, body = handle_session_request(
        b'{"voice_id": "joe", "sample_rate": 16000, "normalize_text": false}',
        OPTIONS,
        "http://gw.test:8080",
    )
    answer = json.loads(body)
    assert status == 200 and answer["expires_in"] == TOKEN_TTL_S
    parts = urlsplit(answer["url"])
    assert (parts.scheme, parts.netloc, parts.path) == ("ws", "gw.test:8080", "/v1/stream")
    assert parse_qsl(parts.query) == [
        ("token", answer["token"]),
        ("voice_id", "joe"),
        ("format", "pcm_s16le"),
        ("sample_rate", "16000"),
        ("normalize_text", "false"),
        ("word_timestamps", "false"),  # opt-in
    ]
    assert answer["token"].startswith("zwst_1.")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"voice_id": "nobody"}', 400, "unknown_voice"),
        (b'{"voice_id": 7}', 400, "invalid_field"),
        (b'{"sample_rate": "8000"}', 400, "invalid_field"),
        (b'{"sample_rate": 12345}', 400, "invalid_field"),
        (b'{"format": "mulaw"}', 400, "invalid_field"),
        (b'{"word_timestamps": "yes"}', 400, "invalid_field"),
    ],
)
def test_session_route_rejects_bad_properties(body: bytes, status: int, code: str) -> None:
    got_status, answer = handle_session_request(body, OPTIONS, "ws://127.0.0.1:1")
    assert (got_status, json.loads(answer)["error"]) == (status, code)


def test_session_route_checks_the_api_key() -> None:
    keyed = ServerOptions(voices=frozenset({"maichi"}), api_keys=frozenset({"k-1"}))
    body = b'{"voice_id": "maichi"}'
    assert handle_session_request(body, keyed, "ws://h")[0] == 401
    assert (
        handle_session_request(body, keyed, "ws://h", headers={"authorization": "Bearer no"})[0]
        == 401
    )
    status, _ = handle_session_request(
        body, keyed, "ws://h", headers={"authorization": "Bearer k-1"}
    )
    assert status == 200


# ----------------------------------------------------------------- connect


def refused(url: str, now: float = 0.0, options: ServerOptions = OPTIONS) -> list[Action]:
    parts = urlsplit(url)
    session = SESSION(options)
    session.connection_made(parts.path, dict(parse_qsl(parts.query)), {}, now)
    actions = session.actions_to_send()
    assert send(session, now, type="ping") == []  # a refused session answers nothing
    return actions


def test_connect_refuses_bad_tokens_and_edited_urls() -> None:
    url = session_url(now=100.0)
    assert refused(url, now=100.0 + TOKEN_TTL_S + 1) == [CloseConnection(1008, "invalid_token")]
    assert refused(url.replace("voice_id=maichi", "voice_id=joe"), 100.0) == [
        CloseConnection(1008, "invalid_token")
    ]
    assert refused(url.replace("token=zwst_1.", "token=zwst_1.x"), 100.0) == [
        CloseConnection(1008, "invalid_token")
    ]
    other_key = ServerOptions(voices=OPTIONS.voices, api_keys=frozenset({"k"}))
    assert refused(url, 100.0, other_key) == [CloseConnection(1008, "invalid_token")]
    assert refused(url.replace("sample_rate=8000", "sample_rate=abc"), 100.0) == [
        CloseConnection(1008, "invalid_field")
    ]
    assert refused(url.replace("/v1/stream", "/v2/stream"), 100.0) == [
        CloseConnection(1008, "not_found")
    ]
    assert refused("ws://h/v1/stream?voice_id=maichi&format=pcm_s16le&sample_rate=8000") == [
        CloseConnection(1008, "invalid_token")
    ]


def test_connect_accepts_the_route_url_before_expiry() -> None:
    session = open_session(session_url(now=100.0), now=100.0 + TOKEN_TTL_S - 1)
    assert session.properties is not None and session.properties.voice_id == "maichi"


# ---------------------------------------------------------------- happy path


def test_a_turn_end_to_end() -> None:
    s = open_session()
    actions = send(s, 0.0, type="synthesize", context_id="turn-7", text="Xin chào.")
    assert texts(actions) == [
        {"type": "context_start", "context_id": "turn-7"},
        {"type": "segment_start", "context_id": "turn-7", "queue_depth": 0},
    ]
    [job] = jobs(actions)
    assert (job.text, job.voice, job.sample_rate_hz, job.speed) == (
        "Xin chào.",
        "maichi",
        RATE,
        1.0,
    )

    words = (WordTiming("Xin", 0.04, 0.29), WordTiming("chào", 0.31, 0.72))
    audio = pcm(320, 1) + pcm(320, 2) + pcm(160, 3)  # 100 ms
    s.synthesis_audio(job.job_id, audio, words, 0.1)
    actions = s.actions_to_send()
    assert texts(actions) == [
        {
            "type": "timestamps",
            "context_id": "turn-7",
            "words": ["Xin", "chào"],
            "start": [0.04, 0.31],
            "end": [0.29, 0.72],
        }
    ]
    sent = frames(actions)  # the last 20 ms are held back until we know if they are final
    assert [(h.sequence, h.pts_ms, h.final, h.context_ordinal) for h, _ in sent] == [
        (0, 0, False, 0),
        (1, 40, False, 0),
    ]
    assert [p for _, p in sent] == [pcm(320, 1), pcm(320, 2)]

    assert send(s, 0.2, type="end", context_id="turn-7") == []
    s.synthesis_done(job.job_id, 0.3)
    actions = s.actions_to_send()
    [(last, payload)] = frames(actions)
    assert (last.sequence, last.pts_ms, last.final, payload) == (2, 80, True, pcm(160, 3))
    assert texts(actions) == [
        {"type": "segment_done", "context_id": "turn-7"},
        {"type": "context_done", "context_id": "turn-7"},
    ]
    assert isinstance(actions[0], SendBytes)  # the final frame comes before segment_done
    assert s.next_deadline() is None


def test_segments_share_one_timeline() -> None:
    s = open_session()
    long_text = " ".join(f"Sentence number {i} is here." for i in range(12))  # > 15 s budget
    actions = send(s, 0.0, type="synthesize", context_id="c", text=long_text)
    [start] = [f for f in texts(actions) if f["type"] == "segment_start"]
    assert start["queue_depth"] == 1
    [first] = jobs(actions)
    s.synthesis_audio(first.job_id, pcm(4000), (WordTiming("Sentence", 0.0, 0.3),), 0.1)
    s.synthesis_done(first.job_id, 0.2)
    actions = s.actions_to_send()
    assert [f["type"] for f in texts(actions)] == ["timestamps", "segment_done", "segment_start"]
    assert texts(actions)[-1]["queue_depth"] == 0
    [second] = jobs(actions)
    assert first.text + " " + second.text == long_text

    s.synthesis_audio(second.job_id, pcm(400), (WordTiming("Sentence", 0.1, 0.4),), 0.3)
    actions = s.actions_to_send()
    [stamps] = texts(actions)
    assert (stamps["start"], stamps["end"]) == ([0.6], [0.9])  # offset by the 0.5 s segment
    sequences = [h.sequence for h, _ in frames(actions)]
    assert sequences == [13]  # the held frame of segment 2's first chunk: seq 0..12 went before
    s.synthesis_done(second.job_id, 0.4)
    [(h, _)] = frames(s.actions_to_send())
    assert (h.sequence, h.pts_ms, h.final) == (14, 540, False)  # no end yet: not final


def test_end_after_the_last_segment_sends_an_empty_final_frame() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    s.synthesis_audio(job.job_id, pcm(80), (), 0.1)
    s.synthesis_done(job.job_id, 0.2)
    assert [f["type"] for f in texts(s.actions_to_send())] == ["segment_done"]
    assert s.next_deadline() == 0.2 + CONTEXT_IDLE_TIMEOUT_S
    actions = send(s, 1.0, type="end", context_id="c")
    [(h, payload)] = frames(actions)
    assert (h.sequence, h.pts_ms, h.final, payload) == (1, 10, True, b"")
    assert texts(actions) == [{"type": "context_done", "context_id": "c"}]


def test_a_context_without_end_is_released_after_the_idle_timeout() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    s.synthesis_done(job.job_id, 0.5)
    s.actions_to_send()
    deadline = s.next_deadline()
    assert deadline == 0.5 + CONTEXT_IDLE_TIMEOUT_S
    s.handle_timer(deadline - 0.01)
    assert s.actions_to_send() == []
    s.handle_timer(deadline)
    actions = s.actions_to_send()
    assert [h.final for h, _ in frames(actions)] == [True]
    assert texts(actions) == [{"type": "context_done", "context_id": "c"}]


def test_contexts_run_concurrently_with_their_own_ordinals() -> None:
    s = open_session()
    [a] = jobs(send(s, 0.0, type="synthesize", context_id="a", text="A."))
    [b] = jobs(send(s, 0.0, type="synthesize", context_id="b", text="B."))
    s.synthesis_audio(b.job_id, pcm(400), (), 0.1)
    s.synthesis_audio(a.job_id, pcm(400), (), 0.1)
    ordinals = [h.context_ordinal for h, _ in frames(s.actions_to_send())]
    assert ordinals == [1, 0]


def test_config_sets_speed_before_the_context_starts() -> None:
    s = open_session()
    assert send(s, 0.0, type="config", context_id="turn-8", speed=1.1) == []
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="turn-8", text="Nhanh."))
    assert job.speed == 1.1


def test_ping_is_answered_with_pong() -> None:
    assert texts(send(open_session(), 0.0, type="ping")) == [{"type": "pong"}]


def test_no_timestamps_unless_opted_in() -> None:
    s = open_session(session_url({"word_timestamps": False}))
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    s.synthesis_audio(job.job_id, pcm(400), (WordTiming("Một", 0.0, 0.2),), 0.1)
    assert texts(s.actions_to_send()) == []


# ------------------------------------------------------------ error frames


@pytest.mark.parametrize(
    ("frame", "cid", "message"),
    [
        ({"type": "synthesize", "text": "x"}, None, "context_id"),
        ({"type": "synthesize", "context_id": "", "text": "x"}, None, "context_id"),
        ({"type": "synthesize", "context_id": "c", "text": "  "}, "c", "non-empty"),
        ({"type": "synthesize", "context_id": "c", "text": 5}, "c", "non-empty"),
        ({"type": "synthesize", "context_id": "c", "text": "x", "segment_mode": "x"}, "c", "mode"),
        (
            {"type": "synthesize", "context_id": "c", "text": "x" * (MAX_TEXT_CHARS + 1)},
            "c",
            "longer",
        ),
        ({"type": "end", "context_id": "never"}, "never", "unknown context"),
        ({"type": "config", "context_id": "c", "speed": "fast"}, "c", "number"),
        ({"type": "config", "context_id": "c", "speed": 9}, "c", "between"),
        ({"type": "flush", "context_id": "c"}, "c", "unknown message type"),
        ({"context_id": "c"}, "c", "unknown message type"),
    ],
)
def test_invalid_frames_get_error_frames(
    frame: dict[str, object], cid: str | None, message: str
) -> None:
    s = open_session()
    error(cid, message, send(s, 0.0, **frame))
    assert texts(send(s, 0.1, type="ping")) == [{"type": "pong"}]  # the socket survives


def test_non_json_and_binary_input_get_error_frames() -> None:
    s = open_session()
    s.receive_text("{oops", 0.0)
    error(None, "invalid JSON", s.actions_to_send())
    s.receive_text("[1]", 0.0)
    error(None, "JSON object", s.actions_to_send())
    s.receive_bytes(b"\x01\x00", 0.0)
    error(None, "binary", s.actions_to_send())


def test_ordering_rules() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    error("c", "not started yet", send(s, 0.0, type="config", context_id="c", speed=1.2))
    send(s, 0.0, type="end", context_id="c")
    error("c", "ended", send(s, 0.1, type="synthesize", context_id="c", text="Hai."))
    s.synthesis_done(job.job_id, 0.2)
    assert texts(s.actions_to_send())[-1] == {"type": "context_done", "context_id": "c"}
    error("c", "finished", send(s, 0.3, type="synthesize", context_id="c", text="Ba."))
    error("c", "already finished", send(s, 0.3, type="end", context_id="c"))


def test_context_limit() -> None:
    s = open_session()  # max_contexts=2
    send(s, 0.0, type="synthesize", context_id="a", text="A.")
    send(s, 0.0, type="synthesize", context_id="b", text="B.")
    error("c", "too many open contexts", send(s, 0.0, type="synthesize", context_id="c", text="C."))
    send(s, 0.1, type="cancel", context_id="a")
    assert texts(send(s, 0.2, type="synthesize", context_id="c", text="C."))[0] == {
        "type": "context_start",
        "context_id": "c",
    }


def test_segment_mode_none_over_the_limit_closes_with_4003() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="a", text="A."))
    actions = send(s, 0.1, type="synthesize", context_id="b", text="x" * 501, segment_mode="none")
    assert actions == [CloseConnection(4003, "segment_too_long"), CancelSynthesis(job.job_id)]
    s.synthesis_audio(job.job_id, pcm(400), (), 0.2)
    assert s.actions_to_send() == []


def test_segment_mode_none_within_the_limit_is_one_segment() -> None:
    s = open_session()
    text = "Một. Hai. Ba."
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text=text, segment_mode="none"))
    assert job.text == text


# ------------------------------------------------------------------ cancel


def test_cancel_stops_the_job_and_drops_everything_queued() -> None:
    s = open_session()
    long_text = " ".join(f"Sentence number {i} is here." for i in range(12))
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text=long_text))
    s.synthesis_audio(job.job_id, pcm(500), (), 0.1)
    assert len(frames(s.actions_to_send())) == 1  # one sent, one held
    assert send(s, 0.2, type="cancel", context_id="c") == [CancelSynthesis(job.job_id)]
    s.synthesis_audio(job.job_id, pcm(500), (), 0.25)
    s.synthesis_done(job.job_id, 0.3)
    assert s.actions_to_send() == []  # no held frame, no next segment, no context_done
    assert send(s, 0.4, type="cancel", context_id="c") == []  # racing cancel: a no-op
    assert send(s, 0.4, type="cancel", context_id="never-seen") == []


def test_failed_synthesis_is_resumed_once_then_reported() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    s.synthesis_failed(job.job_id, "worker lost", 0.1)
    actions = s.actions_to_send()
    assert texts(actions) == [{"type": "resumed"}]
    [retry] = jobs(actions)
    assert retry.text == job.text and retry.job_id != job.job_id
    s.synthesis_failed(retry.job_id, "worker lost again", 0.2)
    error("c", "worker lost again", s.actions_to_send())
    error("c", "finished", send(s, 0.3, type="synthesize", context_id="c", text="Hai."))


def test_failure_after_audio_is_an_error_frame() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    s.synthesis_audio(job.job_id, pcm(400), (), 0.1)
    s.actions_to_send()
    s.synthesis_failed(job.job_id, "boom", 0.2)
    error("c", "boom", s.actions_to_send())


# ------------------------------------------------------------- slow reader


def test_slow_reader_has_frames_dropped_then_is_closed_with_1008() -> None:
    s = open_session()
    [job] = jobs(send(s, 0.0, type="synthesize", context_id="c", text="Một."))
    limit_bytes = 2 * RATE * 2  # about two seconds of audio
    s.transport_backlog(limit_bytes + 1, 1.0)
    s.synthesis_audio(job.job_id, pcm(3200), (), 1.0)  # 400 ms: 10 frames
    assert frames(s.actions_to_send()) == []
    assert s.frames_dropped == 9  # the tenth is held back
    s.transport_backlog(0, 2.0)  # the reader caught up
    s.synthesis_audio(job.job_id, pcm(320), (), 2.0)
    sent = frames(s.actions_to_send())
    assert [h.sequence for h, _ in sent] == [9]  # sequence numbers show the gap
    s.transport_backlog(limit_bytes * 2, 3.0)
    assert s.next_deadline() == 3.0 + SLOW_READER_CLOSE_S
    s.transport_backlog(limit_bytes * 2, 4.0)  # still behind, not yet sustained
    assert s.actions_to_send() == []
    s.handle_timer(3.0 + SLOW_READER_CLOSE_S)
    assert s.actions_to_send() == [
        CloseConnection(1008, "slow_reader"),
        CancelSynthesis(job.job_id),
    ]


def test_connection_lost_stops_every_job() -> None:
    s = open_session()
    [a] = jobs(send(s, 0.0, type="synthesize", context_id="a", text="A."))
    [b] = jobs(send(s, 0.0, type="synthesize", context_id="b", text="B."))
    s.connection_lost(1.0)
    assert s.actions_to_send() == [CancelSynthesis(a.job_id), CancelSynthesis(b.job_id)]


# ------------------------------------------------------------- segmenting


def test_split_segments_packs_sentences_toward_the_budget() -> None:
    assert split_segments("Một. Hai! Ba? Bốn.", 10, 500) == ["Một. Hai!", "Ba? Bốn."]
    assert split_segments("  Một.  ", 10, 500) == ["Một."]
    long_sentence = " ".join(["word"] * 30)  # 149 chars, over a 40-char model limit
    parts = split_segments(long_sentence, 40, 40)
    assert all(len(p) <= 40 for p in parts) and " ".join(parts) == long_sentence
    assert split_segments("x" * 25, 10, 10) == ["x" * 10, "x" * 10, "x" * 5]

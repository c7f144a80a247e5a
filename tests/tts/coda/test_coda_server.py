"""The Coda server session: ready, every error frame for bad input, ordering rules, happy path."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest

from bridge.engine import Action, CloseConnection, SendText
from bridge.providers.base import WordTiming
from bridge.providers.coda.server import (
    PATHS,
    SESSION,
    SUBPROTOCOLS,
    CodaServerSession,
    select_subprotocol,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from telcodec import g711

KEY = "server-key-1"
PCM = {"audioFormat": "audio/pcm", "samplingRate": 16000}


class Session:
    """A server session with its output split into frames and other actions."""

    def __init__(
        self, api_keys: frozenset[str] = frozenset(), headers: dict[str, str] | None = None
    ) -> None:
        options = ServerOptions(voices=frozenset({"lyra", "joe"}), api_keys=api_keys)
        self.engine = CodaServerSession(options)
        self.engine.connection_made("/ws", {}, headers or {}, 0.0)
        self.frames: list[Any] = []
        self.others: list[Action] = []
        self.drain()

    def drain(self) -> list[Any]:
        new: list[Any] = []
        for action in self.engine.actions_to_send():
            if isinstance(action, SendText):
                new.append(json.loads(action.text))
            else:
                self.others.append(action)
        self.frames.extend(new)
        return new

    def send(self, message: object, now: float = 0.1) -> list[Any]:
        self.engine.receive_text(json.dumps(message), now)
        return self.drain()

    def jobs(self) -> list[Synthesize]:
        self.drain()
        jobs = [a for a in self.others if isinstance(a, Synthesize)]
        self.others = [a for a in self.others if not isinstance(a, Synthesize)]
        return jobs

    def start(self, context_id: str = "c1", **fields: Any) -> list[Any]:
        body = {"speaker": "lyra", "audioParameters": dict(PCM), **fields}
        return self.send({"contextId": context_id, "start": body})


def error(kind: str, message: str, context_id: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"error": {"kind": kind, "message": message}}
    if context_id is not None:
        frame["contextId"] = context_id
    return frame


def tone(n_samples: int, value: int = 1000) -> bytes:
    return struct.pack(f"<{n_samples}h", *([value] * n_samples))


# ---------------------------------------------------------- connection


def test_module_attributes() -> None:
    assert SESSION is CodaServerSession
    assert CodaServerSession.protocol_name == "coda"
    assert PATHS == ("/ws", "/v1/ws/coda")
    assert SUBPROTOCOLS == ("rime.v1.json",)


@pytest.mark.parametrize(
    ("offered", "selected"),
    [
        (["rime.v1.json"], "rime.v1.json"),
        (["rime.v1.binary", "rime.v1.json"], "rime.v1.json"),  # no Protobuf here
        (["chat", "rime.v1.json"], "rime.v1.json"),
        (["chat"], None),
        ([], None),
    ],
)
def test_select_subprotocol(offered: list[str], selected: str | None) -> None:
    assert select_subprotocol(offered) == selected


def test_ready_comes_first_with_protocol_1() -> None:
    s = Session()
    assert s.frames == [{"ready": {"protocol": 1, "languages": ["en"], "defaultLanguage": "en"}}]
    assert s.engine.next_deadline() is None


# ------------------------------------------------------------ happy path


def test_streaming_context_with_timestamps_offset_across_jobs() -> None:
    s = Session()
    assert s.start(timestamps={"enable": True}) == [
        {"contextId": "c1", "started": {"requestId": "coda-request-1"}}
    ]
    s.send({"contextId": "c1", "text": "Hello there. "})
    (job1,) = s.jobs()
    assert job1 == Synthesize("coda-1", "Hello there.", "lyra", 16000, 1.0)
    s.send({"contextId": "c1", "text": "How are you?"})
    assert s.jobs() == []  # one job at a time per context
    words1 = (WordTiming("Hello", 0.0, 0.25), WordTiming("there.", 0.25, 0.5))
    s.engine.synthesis_audio("coda-1", tone(4000), words1[:1], 0.2)
    s.engine.synthesis_audio("coda-1", tone(4000), words1[1:], 0.3)
    audio = s.drain()
    assert audio == [
        {"contextId": "c1", "audio": base64.b64encode(tone(4000)).decode()},
        {"contextId": "c1", "audio": base64.b64encode(tone(4000)).decode()},
    ]
    s.engine.synthesis_done("coda-1", 0.4)
    assert s.drain() == []  # input still open
    s.send({"contextId": "c1", "end": {}})
    (job2,) = s.jobs()
    assert job2.text == "How are you?"
    s.engine.synthesis_audio(job2.job_id, tone(8000), (WordTiming("How", 0.0, 0.1),), 0.5)
    s.engine.synthesis_audio(job2.job_id, tone(2000), (WordTiming("you?", 0.3, 0.6125),), 0.5)
    s.engine.synthesis_done(job2.job_id, 0.6)
    done = s.drain()[-1]
    assert done == {
        "contextId": "c1",
        "done": {
            "timestamps": {
                "status": {},
                "spans": [
                    {"text": "Hello", "start": "0s", "end": "0.250s"},
                    {"text": "there.", "start": "0.250s", "end": "0.500s"},
                    # the second job starts after 8000 samples at 16 kHz
                    {"text": "How", "start": "0.500s", "end": "0.600s"},
                    {"text": "you?", "start": "0.800s", "end": "1.112500s"},
                ],
            }
        },
    }
    s.send({"contextId": "c1", "text": "after done"})
    assert s.frames[-1] == error("invalid_input", "text outside an open streaming input ('c1')")


def test_complete_text_context_finishes_without_end() -> None:
    s = Session()
    s.start(text="Hello. How can I help you?", timestamps={"enable": False})
    (job,) = s.jobs()
    assert job.text == "Hello. How can I help you?"
    s.engine.synthesis_audio(job.job_id, tone(10), (), 0.2)
    s.engine.synthesis_done(job.job_id, 0.3)
    assert s.drain()[-1] == {"contextId": "c1", "done": {}}
    s.send({"contextId": "c1", "end": {}})  # end for a finished/complete context: no effect
    assert s.drain() == []


def test_mulaw_and_time_scale_factor() -> None:
    s = Session()
    audio = {"audioFormat": "audio/pcmu", "samplingRate": 8000, "timeScaleFactor": 5.0}
    s.send({"contextId": "t", "start": {"speaker": "joe", "text": "Hi.", "audioParameters": audio}})
    (job,) = s.jobs()
    assert job.sample_rate_hz == 8000
    assert job.speed == pytest.approx(1 / 2.5)  # timeScaleFactor clamped to 2.5
    pcm = tone(160, 3000) + b"\x01"  # half a sample is kept for the next chunk
    s.engine.synthesis_audio(job.job_id, pcm, (), 0.2)
    (frame,) = s.drain()
    assert base64.b64decode(frame["audio"]) == g711.ulaw_encode(tone(160, 3000))


def test_wav_header_once_and_unknown_format_falls_back_to_wav() -> None:
    s = Session()
    audio = {"audioFormat": "audio/x-something", "samplingRate": 22050}
    s.send(
        {"contextId": "w", "start": {"speaker": "lyra", "text": "Hi.", "audioParameters": audio}}
    )
    (job,) = s.jobs()
    s.engine.synthesis_audio(job.job_id, tone(4), (), 0.2)
    s.engine.synthesis_audio(job.job_id, tone(4), (), 0.2)
    first, second = (base64.b64decode(f["audio"]) for f in s.drain())
    assert first[:4] == b"RIFF" and first[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", first[24:28]) == (22050,)
    assert first[44:] == tone(4)
    assert second == tone(4)


def test_large_audio_is_cut_into_frames_under_64_kib() -> None:
    s = Session()
    s.start(text="Long.")
    (job,) = s.jobs()
    s.engine.synthesis_audio(job.job_id, tone(60_000), (), 0.2)
    frames = s.drain()
    assert len(frames) == 3
    assert b"".join(base64.b64decode(f["audio"]) for f in frames) == tone(60_000)
    assert all(len(json.dumps(f)) <= 64 * 1024 for f in frames)


def test_defaults_merge_at_the_top_level() -> None:
    s = Session()
    defaults = {
        "speaker": "joe",
        "text": "ignored",
        "audioParameters": {"audioFormat": "audio/pcm"},
    }
    assert s.send({"config": {"defaults": defaults}}) == []  # not acknowledged
    s.send({"contextId": "a", "start": {"text": "One."}})
    (job,) = s.jobs()
    assert (job.voice, job.sample_rate_hz, job.text) == ("joe", 24000, "One.")
    # start.audioParameters replaces the default object: no audioFormat left
    assert s.send({"contextId": "b", "start": {"audioParameters": {"samplingRate": 8000}}}) == [
        error("invalid_input", "audioParameters.audioFormat is required", "b")
    ]


def test_default_context_id() -> None:
    s = Session()
    assert s.send({"start": {"speaker": "lyra", "audioParameters": PCM}}) == [
        {"contextId": "default", "started": {"requestId": "coda-request-1"}}
    ]
    s.send({"contextId": "", "text": "Hi. "})
    assert len(s.jobs()) == 1
    assert s.send({"cancel": {}}) == [{"contextId": "default", "cancelled": {}}]


# ------------------------------------------------------- split strategies


def test_split_none_one_job_per_message() -> None:
    s = Session()
    s.start(splitStrategy="SPLIT_STRATEGY_NONE")
    s.send({"contextId": "c1", "text": "Hello world. And more"})
    s.send({"contextId": "c1", "text": "   "})
    s.send({"contextId": "c1", "end": {}})
    texts = []
    while jobs := s.jobs():
        texts.append(jobs[0].text)
        s.engine.synthesis_done(jobs[0].job_id, 0.2)
    assert texts == ["Hello world. And more"]
    assert s.frames[-1] == {"contextId": "c1", "done": {}}


def test_split_sentence_splits_each_message() -> None:
    s = Session()
    s.start(splitStrategy="SPLIT_STRATEGY_SENTENCE")
    s.send({"contextId": "c1", "text": "One. Two? Three"})
    s.send({"contextId": "c1", "text": "Four."})
    s.send({"contextId": "c1", "end": {}})
    texts = []
    while jobs := s.jobs():
        texts.append(jobs[0].text)
        s.engine.synthesis_done(jobs[0].job_id, 0.2)
    assert texts == ["One.", "Two?", "Three", "Four."]


def test_accumulate_sentence_joins_tokens_unchanged() -> None:
    s = Session()
    s.start(splitStrategy="SPLIT_STRATEGY_ACCUMULATE_SENTENCE")
    for token in ["Hello", "world.", " How", " are", " you? I", " am"]:
        s.send({"contextId": "c1", "text": token})
    (job,) = s.jobs()
    assert job.text == "Helloworld."  # the seed's own example: no space added
    s.engine.synthesis_done(job.job_id, 0.2)
    (job,) = s.jobs()
    assert job.text == "How are you?"
    s.engine.synthesis_done(job.job_id, 0.3)
    s.send({"contextId": "c1", "end": {}})
    (job,) = s.jobs()
    assert job.text == "I am"


def test_text_lookahead_holds_the_first_job() -> None:
    s = Session()
    s.start(splitStrategy="SPLIT_STRATEGY_NONE", codaParameters={"textLookaheadTokens": 3})
    s.send({"contextId": "c1", "text": "First sentence."})
    assert s.jobs() == []
    s.send({"contextId": "c1", "text": "Two more"})
    assert s.jobs() == []
    s.send({"contextId": "c1", "text": "tokens"})
    (job,) = s.jobs()
    assert job.text == "First sentence."
    s2 = Session()
    s2.start(splitStrategy="SPLIT_STRATEGY_NONE", codaParameters={"textLookaheadTokens": 50})
    s2.send({"contextId": "c1", "text": "Only this."})
    s2.send({"contextId": "c1", "end": {}})  # capped at the tokens available
    assert [j.text for j in s2.jobs()] == ["Only this."]


# ------------------------------------------------------------ error frames


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"audioParameters": {}}, "audioParameters.audioFormat is required"),
        ({"audioParameters": {"audioFormat": ""}}, "audioParameters.audioFormat is required"),
        ({"speaker": "nobody"}, "unknown voice 'nobody'"),
        ({"language": "ja"}, "unsupported language 'ja'; see ready.languages"),
        (
            {"audioParameters": {"audioFormat": "audio/mpeg"}},
            "audio format 'audio/mpeg' is not supported by this server",
        ),
        ({"speaker": 5}, "start.speaker must be a string"),
        ({"text": ["x"]}, "start.text must be a string"),
        ({"audioParameters": []}, "start.audioParameters must be an object"),
        (
            {"audioParameters": {"audioFormat": "audio/pcm", "samplingRate": "8000"}},
            "start.audioParameters.samplingRate is invalid",
        ),
        (
            {"audioParameters": {"audioFormat": "audio/pcm", "samplingRate": 0}},
            "start.audioParameters.samplingRate is invalid",
        ),
        (
            {"audioParameters": {"audioFormat": "audio/pcm", "timeScaleFactor": "fast"}},
            "start.audioParameters.timeScaleFactor is invalid",
        ),
        ({"splitStrategy": "WORDS"}, "start.splitStrategy 'WORDS' is not a split strategy"),
        (
            {"codaParameters": {"textLookaheadTokens": -1}},
            "start.codaParameters.textLookaheadTokens is invalid",
        ),
        ({"timestamps": {"enable": "yes"}}, "start.timestamps.enable is invalid"),
    ],
)
def test_invalid_start_fails_its_context(fields: dict[str, Any], message: str) -> None:
    s = Session()
    assert s.start("bad", **fields) == [error("invalid_input", message, "bad")]
    assert s.start("good") == [{"contextId": "good", "started": {"requestId": "coda-request-1"}}]


def test_start_must_be_an_object() -> None:
    s = Session()
    assert s.send({"contextId": "x", "start": "go"}) == [
        error("invalid_input", "start must be an object", "x")
    ]


def test_duplicate_start_is_a_connection_error_and_the_context_continues() -> None:
    s = Session()
    s.start()
    assert s.start() == [error("invalid_input", "duplicate start for open context 'c1'")]
    s.send({"contextId": "c1", "text": "Still here. "})
    assert len(s.jobs()) == 1


def test_seventeenth_context_is_resource_exhausted() -> None:
    s = Session()
    for i in range(16):
        s.start(f"c{i}")
    assert s.start("c16") == [
        error("resource_exhausted", "the connection already has 16 open contexts")
    ]
    s.send({"contextId": "c0", "cancel": {}})
    assert s.start("c16")[0]["started"]


@pytest.mark.parametrize(
    "message",
    [
        {"contextId": "nope", "text": "Hi"},
        {"contextId": "complete", "text": "Hi"},
        {"contextId": "ended", "text": "Hi"},
    ],
)
def test_text_outside_an_open_streaming_input(message: dict[str, Any]) -> None:
    s = Session()
    s.start("complete", text="Whole text.")
    s.start("ended")
    s.send({"contextId": "ended", "end": {}})
    context_id = message["contextId"]
    assert s.send(message) == [
        error("invalid_input", f"text outside an open streaming input ({context_id!r})")
    ]


def test_text_must_be_a_string() -> None:
    s = Session()
    s.start()
    assert s.send({"contextId": "c1", "text": 7}) == [
        error("invalid_input", "text must be a string")
    ]


def test_end_repeated_or_unknown_has_no_effect() -> None:
    s = Session()
    s.start()
    s.send({"contextId": "c1", "text": "Hi."})
    s.send({"contextId": "c1", "end": {}})
    assert s.send({"contextId": "c1", "end": {}}) == []
    assert s.send({"contextId": "zzz", "end": {}}) == []


def test_config_rules() -> None:
    s = Session()
    assert s.send({"config": {"defaults": {"speaker": 3}}}) == [
        error("invalid_input", "config.defaults.speaker must be a string")
    ]
    assert s.send({"config": {}}) == [
        error("invalid_input", "send at most one config, before the first start")
    ]
    s2 = Session()
    s2.start()
    assert s2.send({"config": {}}) == [
        error("invalid_input", "send at most one config, before the first start")
    ]
    s3 = Session()
    assert s3.send({"config": "x"}) == [error("invalid_input", "config must be an object")]
    s4 = Session()
    assert s4.send({"config": {"license": 5}}) == [
        error("invalid_input", "config.license must be a string")
    ]


def test_cancel_stops_the_job_and_drops_its_output() -> None:
    s = Session()
    s.start()
    s.send({"contextId": "c1", "text": "Speak. "})
    (job,) = s.jobs()
    assert s.send({"contextId": "c1", "cancel": {}}) == [{"contextId": "c1", "cancelled": {}}]
    assert s.others == [CancelSynthesis(job.job_id)]
    s.engine.synthesis_audio(job.job_id, tone(100), (), 0.2)
    s.engine.synthesis_done(job.job_id, 0.3)
    assert s.drain() == []
    # unknown or finished contexts still get cancelled, as often as asked
    assert s.send({"contextId": "c1", "cancel": {}}) == [{"contextId": "c1", "cancelled": {}}]
    assert s.send({"contextId": "x", "cancel": {}}) == [{"contextId": "x", "cancelled": {}}]


def test_synthesis_failure_is_an_internal_context_error() -> None:
    s = Session()
    s.start()
    s.send({"contextId": "c1", "text": "Speak. "})
    (job,) = s.jobs()
    s.engine.synthesis_failed(job.job_id, "voice crashed", 0.2)
    assert s.drain() == [
        {
            "contextId": "c1",
            "error": {
                "kind": "internal",
                "message": "voice crashed",
                "requestId": "coda-request-1",
            },
        }
    ]


def test_long_audio_gets_a_status_instead_of_spans() -> None:
    s = Session()
    s.start(text="Long.", timestamps={"enable": True})
    (job,) = s.jobs()
    s.engine.synthesis_audio(job.job_id, tone(16000 * 181), (WordTiming("Long.", 0, 181),), 0.2)
    s.engine.synthesis_done(job.job_id, 0.3)
    assert s.drain()[-1] == {
        "contextId": "c1",
        "done": {
            "timestamps": {
                "status": {"code": 11, "message": "audio longer than 180 s is not aligned"}
            }
        },
    }


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '"text"', '{"contextId": 5, "cancel": {}}', '{"start": {}, "end": {}}'],
)
def test_undecodable_envelope_closes_1007(text: str) -> None:
    s = Session()
    s.engine.receive_text(text, 0.1)
    new = s.drain()
    assert len(new) == 1 and new[0]["error"]["kind"] == "invalid_input"
    assert "contextId" not in new[0]
    assert s.others == [CloseConnection(1007, "undecodable envelope")]
    s.engine.receive_text('{"cancel": {}}', 0.2)
    assert s.drain() == []


def test_binary_message_closes_1007() -> None:
    s = Session()
    s.engine.receive_bytes(b"\x0a\x03abc", 0.1)
    assert s.drain()[0]["error"]["kind"] == "invalid_input"
    assert s.others == [CloseConnection(1007, "undecodable envelope")]


def test_message_over_64_kib_is_refused() -> None:
    s = Session()
    s.start()
    s.send({"contextId": "c1", "text": "x" * (64 * 1024 - 40)})  # fits with the envelope
    assert len(s.jobs()) == 1
    s.engine.receive_text(json.dumps({"contextId": "c1", "text": "x" * 64 * 1024}), 0.2)
    assert s.drain() == [error("invalid_input", "message exceeds 65536 bytes")]
    assert s.others == [CloseConnection(1009, "message too big"), CancelSynthesis("coda-1")]


def test_messages_without_a_payload_and_long_context_ids() -> None:
    s = Session()
    assert s.send({"type": "start", "payload": {"text": "hi"}}) == [
        error("invalid_input", "message has no payload (config, start, text, end, cancel)")
    ]
    assert s.send({"contextId": "x" * 129, "cancel": {}}) == [
        error("invalid_input", "contextId exceeds 128 bytes")
    ]
    assert s.others == []  # the connection stays open


def test_connection_lost_stops_every_job() -> None:
    s = Session()
    s.start("a", text="One.")
    s.start("b", text="Two.")
    jobs = s.jobs()
    assert len(jobs) == 2  # contexts synthesise concurrently
    s.engine.connection_lost(1.0)
    s.drain()
    assert s.others == [CancelSynthesis(j.job_id) for j in jobs]
    s.engine.synthesis_audio(jobs[0].job_id, tone(10), (), 1.1)
    assert s.drain() == []


# --------------------------------------------------------------- credentials


def test_bearer_header_accepted() -> None:
    s = Session(frozenset({KEY}), {"authorization": f"Bearer {KEY}"})
    assert s.start()[0]["started"]


def test_wrong_bearer_header_closes_1008_after_ready() -> None:
    s = Session(frozenset({KEY}), {"authorization": "Bearer wrong"})
    assert s.frames[0]["ready"]["protocol"] == 1
    assert s.frames[1:] == [error("unauthenticated", "invalid API key")]
    assert s.others == [CloseConnection(1008, "invalid credentials")]


def test_config_authorization_within_ten_seconds() -> None:
    s = Session(frozenset({KEY}))
    assert s.engine.next_deadline() == 10.0
    assert s.send({"config": {"authorization": KEY}}, 3.0) == []
    assert s.engine.next_deadline() is None
    assert s.start()[0]["started"]


def test_no_credentials_within_ten_seconds_closes() -> None:
    s = Session(frozenset({KEY}))
    s.engine.handle_timer(9.9)
    assert s.drain() == []
    s.engine.handle_timer(10.0)
    assert s.drain() == [error("unauthenticated", "no credentials within 10 s")]
    assert s.others == [CloseConnection(1008, "invalid credentials")]


def test_start_before_credentials_closes() -> None:
    s = Session(frozenset({KEY}))
    assert s.start() == [error("unauthenticated", "credentials required before start")]
    assert s.others == [CloseConnection(1008, "invalid credentials")]


def test_credentials_in_header_and_config_close() -> None:
    s = Session(frozenset(), {"authorization": "Bearer anything"})
    assert s.send({"config": {"authorization": "anything"}}) == [
        error("unauthenticated", "credentials in both the upgrade header and config")
    ]
    assert s.others == [CloseConnection(1008, "invalid credentials")]


def test_wrong_config_authorization_closes() -> None:
    s = Session(frozenset({KEY}))
    assert s.send({"config": {"authorization": "guess"}}) == [
        error("unauthenticated", "invalid config.authorization")
    ]
    assert s.others == [CloseConnection(1008, "invalid credentials")]

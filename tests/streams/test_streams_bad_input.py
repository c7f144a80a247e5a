"""Bad carrier input for every dialect: closes cleanly, never raises; Hypothesis fuzz."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.engine import CloseConnection
from bridge.streams import DIALECTS
from bridge.streams.base import (
    MediaStreamProtocol,
    ProtocolViolation,
    StreamSettings,
    StreamState,
    StreamStopped,
)

#: A valid start message per dialect (Vonage: websocket:connected).
STARTS: dict[str, dict[str, Any]] = {
    "/twilio": {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ1",
        "start": {"streamSid": "MZ1", "callSid": "CA1", "accountSid": "AC1"},
    },
    "/telnyx": {
        "event": "start",
        "sequence_number": "1",
        "stream_id": "T1",
        "start": {
            "call_control_id": "v3:1",
            "media_format": {"encoding": "PCMU", "sample_rate": 8000},
        },
    },
    "/plivo": {
        "event": "start",
        "sequenceNumber": 1,
        "start": {
            "callId": "P1",
            "streamId": "PS1",
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
        },
    },
    "/exotel": {
        "event": "start",
        "sequence_number": "1",
        "stream_sid": "E1",
        "start": {"stream_sid": "E1", "call_sid": "EC1", "account_sid": "EA1"},
    },
    "/vonage": {"event": "websocket:connected", "content-type": "audio/l16;rate=8000"},
}

#: A media message per dialect that is only legal after start.
MEDIA: dict[str, str | bytes] = {
    "/twilio": json.dumps({"event": "media", "media": {"payload": "AAAA"}}),
    "/telnyx": json.dumps({"event": "media", "media": {"payload": "AAAA"}}),
    "/plivo": json.dumps({"event": "media", "media": {"payload": "AAAA"}}),
    "/exotel": json.dumps({"event": "media", "media": {"payload": "AAAA"}}),
    "/vonage": bytes(320),
}

PATHS = sorted(DIALECTS)


def started(path: str, **kw: Any) -> MediaStreamProtocol:
    engine = DIALECTS[path](StreamSettings(**kw))
    engine.connection_made(0.0)
    engine.receive_text(json.dumps(STARTS[path]), 0.0)
    events = engine.events_received()
    assert engine.state is StreamState.STREAMING, events
    return engine


def assert_closed(engine: MediaStreamProtocol, code: int, reason_part: str) -> None:
    actions = engine.actions_to_send()
    events = engine.events_received()
    assert len(actions) == 1 and isinstance(actions[0], CloseConnection)
    assert actions[0].code == code
    assert isinstance(events[0], ProtocolViolation) and reason_part in events[0].reason
    assert events[-1] == StreamStopped("protocol_violation")
    assert engine.state is StreamState.CLOSED


@pytest.mark.parametrize("path", PATHS)
def test_non_json_text_closes_1007(path: str) -> None:
    engine = started(path)
    engine.receive_text("{not json", 1.0)
    assert_closed(engine, 1007, "not JSON")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("text", ["[]", "42", '"start"', "null"])
def test_json_that_is_not_an_object_closes_1002(path: str, text: str) -> None:
    engine = started(path)
    engine.receive_text(text, 1.0)
    assert_closed(engine, 1002, "must be an object")


@pytest.mark.parametrize("path", PATHS)
def test_unknown_events_are_ignored_and_logged_once(path: str, caplog: Any) -> None:
    engine = started(path)
    with caplog.at_level(logging.DEBUG, logger="bridge.streams.base"):
        for _ in range(3):
            engine.receive_text('{"event": "future-thing", "x": 1}', 1.0)
    assert engine.events_received() == [] and engine.actions_to_send() == []
    assert engine.state is StreamState.STREAMING
    assert sum("future-thing" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("path", PATHS)
def test_oversized_messages_close_1009(path: str) -> None:
    engine = started(path, max_message_bytes=1024)
    engine.receive_text(json.dumps({"event": "media", "pad": "x" * 2000}), 1.0)
    assert_closed(engine, 1009, "exceeds 1024")
    engine = started(path, max_message_bytes=1024)
    engine.receive_bytes(bytes(2048), 1.0)
    assert_closed(engine, 1009, "exceeds 1024")


@pytest.mark.parametrize("path", PATHS)
def test_media_before_start_closes_1002(path: str) -> None:
    engine = DIALECTS[path]()
    engine.connection_made(0.0)
    media = MEDIA[path]
    if isinstance(media, bytes):
        engine.receive_bytes(media, 0.1)
    else:
        engine.receive_text(media, 0.1)
    assert_closed(engine, 1002, "before start")


@pytest.mark.parametrize("path", [p for p in PATHS if p != "/vonage"])
def test_binary_on_a_json_dialect_closes_1003(path: str) -> None:
    engine = started(path)
    engine.receive_bytes(b"\x00\x01", 1.0)
    assert_closed(engine, 1003, "binary message")


@pytest.mark.parametrize("path", PATHS)
def test_second_start_is_a_violation(path: str) -> None:
    engine = started(path)
    engine.receive_text(json.dumps(STARTS[path]), 1.0)
    actions = engine.actions_to_send()
    assert isinstance(actions[0], CloseConnection) and actions[0].code == 1002


MISSING_OR_WRONG = [
    ("/twilio", {"event": "start", "start": {"callSid": "CA1"}}, "streamSid"),
    ("/twilio", {"event": "start", "start": {"streamSid": "MZ1"}}, "callSid"),
    ("/twilio", {"event": "start", "start": {"streamSid": 7, "callSid": "CA1"}}, "streamSid"),
    (
        "/twilio",
        {"event": "start", "start": {"streamSid": "MZ1", "callSid": "CA1", "tracks": "inbound"}},
        "tracks",
    ),
    (
        "/twilio",
        {
            "event": "start",
            "start": {"streamSid": "MZ1", "callSid": "CA1", "customParameters": ["a"]},
        },
        "customParameters",
    ),
    ("/twilio", {"event": "start", "start": "MZ1"}, "start"),
    ("/twilio", {"event": "start", "sequenceNumber": "one", "start": {}}, "sequenceNumber"),
    ("/twilio", {"event": "start", "sequenceNumber": True, "start": {}}, "sequenceNumber"),
    ("/twilio", {"event": 5}, "event"),
    ("/twilio", {"no": "event"}, "event"),
    (
        "/telnyx",
        {"event": "start", "stream_id": "T", "start": {"call_control_id": "c"}},
        "media_format",
    ),
    (
        "/plivo",
        {
            "event": "start",
            "start": {
                "callId": "c",
                "streamId": "s",
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": "fast"},
            },
        },
        "sampleRate",
    ),
    (
        "/exotel",
        {
            "event": "start",
            "start": {"stream_sid": "S", "call_sid": "C", "custom_parameters": {"a": 1}},
        },
        "custom_parameters.a",
    ),
    ("/vonage", {"event": "websocket:connected"}, "content-type"),
]


@pytest.mark.parametrize(("path", "msg", "field"), MISSING_OR_WRONG)
def test_missing_fields_and_wrong_types_close_with_a_clear_reason(
    path: str, msg: dict[str, Any], field: str
) -> None:
    engine = DIALECTS[path]()
    engine.receive_text(json.dumps(msg), 0.0)
    assert_closed(engine, 1002, field)


STREAMING_BAD = [
    ("/twilio", {"event": "media", "media": {"payload": "!!not base64!!"}}, 1007, "base64"),
    ("/twilio", {"event": "media", "media": {}}, 1002, "payload"),
    (
        "/twilio",
        {"event": "media", "media": {"payload": "AAAA", "timestamp": -5}},
        1002,
        "timestamp",
    ),
    (
        "/twilio",
        {"event": "media", "streamSid": "MZ-other", "media": {"payload": "AAAA"}},
        1002,
        "MZ-other",
    ),
    ("/twilio", {"event": "dtmf", "dtmf": {"digit": "x"}}, 1002, "DTMF"),
    ("/twilio", {"event": "mark", "mark": {}}, 1002, "name"),
    ("/twilio", {"event": "connected"}, 1002, "connected after start"),
    ("/telnyx", {"event": "error", "payload": {"code": None}}, 1002, "code"),
    ("/plivo", {"event": "playedStream"}, 1002, "name"),
    ("/exotel", {"event": "media", "media": {"payload": "AA=="}}, 1007, "odd-length"),
    ("/vonage", {"event": "websocket:notify", "payload": "v1"}, 1002, "payload"),
]


@pytest.mark.parametrize(("path", "msg", "code", "part"), STREAMING_BAD)
def test_bad_messages_while_streaming(path: str, msg: dict[str, Any], code: int, part: str) -> None:
    engine = started(path)
    engine.receive_text(json.dumps(msg), 1.0)
    assert_closed(engine, code, part)


@pytest.mark.parametrize("path", PATHS)
def test_mark_echo_for_an_unknown_name_is_ignored(path: str) -> None:
    engine = started(path)
    echo = {
        "/twilio": {"event": "mark", "mark": {"name": "ghost"}},
        "/telnyx": {"event": "mark", "mark": {"name": "ghost"}},
        "/plivo": {"event": "playedStream", "name": "ghost"},
        "/exotel": {"event": "mark", "mark": {"name": "ghost"}},
        "/vonage": {"event": "websocket:notify", "payload": {"name": "ghost"}},
    }[path]
    engine.receive_text(json.dumps(echo), 1.0)
    assert engine.events_received() == [] and engine.actions_to_send() == []


# ------------------------------------------------------------------ fuzzing

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["1", "8000", "AAAA", "audio/x-mulaw", "PCMU", "inbound"]),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "event",
                    "start",
                    "media",
                    "payload",
                    "streamSid",
                    "stream_id",
                    "name",
                    "sequenceNumber",
                    "sequence_number",
                    "mark",
                    "dtmf",
                    "digit",
                    "content-type",
                    "mediaFormat",
                    "media_format",
                    "encoding",
                    "sampleRate",
                    "callSid",
                ]
            )
            | st.text(max_size=6),
            children,
            max_size=6,
        )
    ),
    max_leaves=20,
)
EVENT_NAMES = st.sampled_from(
    [
        "connected",
        "start",
        "media",
        "dtmf",
        "mark",
        "stop",
        "error",
        "playedStream",
        "clearedAudio",
        "websocket:connected",
        "websocket:dtmf",
        "websocket:notify",
        "websocket:cleared",
        "bogus",
    ]
)
MESSAGE = st.one_of(
    st.text(max_size=64),
    JSON_VALUE.map(json.dumps),
    st.builds(
        lambda e, body: json.dumps({"event": e, **body}),
        EVENT_NAMES,
        st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=4),
    ),
)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.one_of(MESSAGE, st.binary(max_size=700)), max_size=8), begin=st.booleans()
)
def test_fuzzed_input_never_raises(path: str, messages: list[str | bytes], begin: bool) -> None:
    engine = started(path) if begin else DIALECTS[path]()
    for i, message in enumerate(messages):
        if isinstance(message, bytes):
            engine.receive_bytes(message, i * 0.02)
        else:
            engine.receive_text(message, i * 0.02)
        engine.handle_timer(i * 0.02)
    events = engine.events_received()
    actions = engine.actions_to_send()
    closes = [a for a in actions if isinstance(a, CloseConnection)]
    assert len(closes) <= 1
    assert sum(isinstance(e, StreamStopped) for e in events) <= 1
    if closes:
        assert engine.state is StreamState.CLOSED
        assert len(closes[0].reason.encode()) <= 123

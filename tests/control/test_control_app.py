"""The application protocol: codec against its JSON Schema and docs, and the AppSession engine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from control_jsonschema import errors, is_valid
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.commands import (
    Answer,
    CallEnded,
    CallEvent,
    CallStarted,
    Cancel,
    Command,
    CommandRejected,
    DtmfHeard,
    HandOver,
    Hangup,
    ProviderBacklog,
    ProviderErrored,
    Reject,
    Say,
    SendDtmf,
    SpeechStarted,
    SpeechStopped,
    Transfer,
    TurnBegan,
    TurnFinished,
    TurnInterrupted,
)
from bridge.config import load_config
from bridge.control.app import (
    COMMAND_TYPES,
    EVENT_TYPES,
    MAX_MESSAGE_BYTES,
    AppConnected,
    AppError,
    AppLost,
    AppSession,
    AppState,
    decode_command,
    encode_error,
    encode_event,
)
from bridge.control.flow import fallback_runner
from bridge.engine import CloseConnection, LocalProtocolError, SendText

ROOT = Path(__file__).resolve().parents[2]
SCHEMA: dict[str, Any] = json.loads((ROOT / "bridge/control/app_schema.json").read_text())
DEFS = SCHEMA["$defs"]
DOC = (ROOT / "docs/app-protocol.md").read_text()
COMMAND = {"$ref": "#/$defs/command"}
EVENT = {"$ref": "#/$defs/event"}


def valid(value: Any, schema: dict[str, Any]) -> bool:
    return is_valid(value, schema, SCHEMA)


def message_defs(kind: str) -> dict[str, dict[str, Any]]:
    """Schema definitions of every command or event, keyed by their ``type``."""
    refs = [r["$ref"].split("/")[-1] for r in DEFS[kind]["oneOf"]]
    return {DEFS[r]["properties"]["type"]["const"]: DEFS[r] for r in refs}


STARTED = CallStarted("c-1", "sip", "sip:alice@127.0.0.1", "sip:bot@127.0.0.1", {"x": "1"})
EVENTS: list[CallEvent] = [
    STARTED,
    DtmfHeard("5"),
    SpeechStarted(1.5),
    SpeechStopped(2.5),
    TurnBegan("t1"),
    TurnInterrupted("t1", 840, "Let me check", "speech"),
    TurnFinished("t2", 2120, "Hello there"),
    ProviderErrored("t3", "local", "unknown_voice", "no voice 'jo'"),
    ProviderErrored("", "agent", "server_error", "boom"),
    ProviderBacklog("t4", 4),
    CallEnded("remote_bye"),
]


# ------------------------------------------------------------ the schema


def test_schema_lists_exactly_the_protocol_messages() -> None:
    assert sorted(message_defs("command")) == sorted(COMMAND_TYPES)
    assert sorted(message_defs("event")) == sorted(EVENT_TYPES)


def test_every_schema_example_is_valid_for_its_message() -> None:
    count = 0
    for kind in ("command", "event"):
        for definition in message_defs(kind).values():
            for example in definition["examples"]:
                assert errors(example, definition, SCHEMA) == []
                assert valid(example, {"$ref": f"#/$defs/{kind}"})
                count += 1
    assert count >= 20


def test_schema_examples_of_commands_decode() -> None:
    for definition in message_defs("command").values():
        for example in definition["examples"]:
            assert isinstance(decode_command(json.dumps(example)), Command), example


def test_events_encode_to_schema_valid_messages() -> None:
    seen = set()
    for event in EVENTS:
        msg = json.loads(encode_event(event))
        assert errors(msg, EVENT, SCHEMA) == [], msg
        seen.add(msg["type"])
    assert seen == set(EVENT_TYPES) - {"error"}
    assert json.loads(encode_event(STARTED)) == {
        "type": "call.started",
        "call_id": "c-1",
        "leg": "sip",
        "from": "sip:alice@127.0.0.1",
        "to": "sip:bot@127.0.0.1",
        "custom_parameters": {"x": "1"},
    }
    assert json.loads(encode_event(TurnInterrupted("t1", 840, "Let me", "dtmf"))) == {
        "type": "turn.interrupted",
        "turn_id": "t1",
        "heard_ms": 840,
        "heard_text": "Let me",
        "reason": "dtmf",
    }


def test_non_protocol_events_are_our_mistake() -> None:
    with pytest.raises(LocalProtocolError):
        encode_event(CommandRejected("Say", "t1", "turn_closed"))


def test_errors_encode_to_schema_valid_messages() -> None:
    for error in (
        AppError("$", "not JSON"),
        AppError("text", "missing", "c-1", "say"),
        AppError("turn_id", "refused", None, "cancel"),
    ):
        msg = json.loads(encode_error(error))
        assert valid(msg, EVENT), msg
        assert msg["field"] == error.field and msg.get("id") == error.command_id


# ------------------------------------------------------------ decoding


def test_decode_every_command() -> None:
    assert decode_command('{"type":"say","turn_id":"t1","text":"Hi"}') == Say("t1", "Hi")
    assert decode_command(
        json.dumps(
            {
                "type": "say",
                "turn_id": "t2",
                "text": "Let me ",
                "final": False,
                "interruptible": False,
                "replace": True,
                "cacheable": True,
                "provider": "local",
                "voice": "joe",
                "id": "x",
            }
        )
    ) == Say("t2", "Let me ", False, False, True, "local", "joe", True)
    assert decode_command('{"type":"cancel","turn_id":"t2"}') == Cancel("t2")
    assert decode_command('{"type":"hangup"}') == Hangup("app_hangup")
    assert decode_command('{"type":"hangup","reason":"done"}') == Hangup("done")
    assert decode_command('{"type":"transfer","target":"tel:+1555"}') == Transfer("tel:+1555")
    assert decode_command('{"type":"transfer","target":"tel:+1555","trunk":"carrier"}') == (
        Transfer("tel:+1555", "carrier")
    )
    assert decode_command('{"type":"dtmf","digits":"12#*AD"}') == SendDtmf("12#*AD")
    assert decode_command(b'{"type":"dtmf","digits":"1"}') == SendDtmf("1")
    assert decode_command('{"type":"answer","id":"a"}') == Answer()
    assert decode_command('{"type":"reject"}') == Reject(486, "")
    assert decode_command('{"type":"reject","status":603}') == Reject(603)
    assert decode_command('{"type":"reject","status":480,"reason":"Closed"}') == Reject(
        480, "Closed"
    )


@pytest.mark.parametrize(
    ("text", "field", "needle"),
    [
        ("not json", "$", "not JSON"),
        ("[1]", "$", "expected a JSON object, got an array"),
        ('{"turn_id":"t"}', "type", "missing"),
        ('{"type":3}', "type", "expected a string"),
        ('{"type":"dance"}', "type", "unknown command 'dance'"),
        ('{"type":"say","turn_id":"t"}', "text", "missing"),
        ('{"type":"say","turn_id":"t","text":"x","interuptible":false}', "interuptible", "unknown"),
        ('{"type":"say","turn_id":"t","text":"x","final":1}', "final", "true or false"),
        ('{"type":"say","turn_id":"t","text":"x","final":"true"}', "final", "true or false"),
        ('{"type":"say","turn_id":"has space","text":"x"}', "turn_id", "1-64 characters"),
        ('{"type":"say","turn_id":"","text":"x"}', "turn_id", "1-64 characters"),
        ('{"type":"say","turn_id":"t","text":null}', "text", "got null"),
        ('{"type":"say","turn_id":"t","text":"x","voice":""}', "voice", "1-64"),
        ('{"type":"cancel","turn_id":"t","turn_id":"u"}', "turn_id", "duplicate key"),
        ('{"type":"transfer","target":"http://x"}', "target", "sip:"),
        ('{"type":"transfer","target":"sip:a b"}', "target", "sip:"),
        ('{"type":"transfer","target":"tel:+1555","trunk":"a b"}', "trunk", "1-64"),
        ('{"type":"dtmf","digits":"12x"}', "digits", "0-9"),
        ('{"type":"dtmf","digits":"1\\n"}', "digits", "0-9"),
        ('{"type":"dtmf","digits":""}', "digits", "0-9"),
        ('{"type":"hangup","reason":"\\u00e9"}', "reason", "printable ASCII"),
        ('{"type":"hangup","reason":NaN}', "$", "NaN"),
        ('{"type":"say","turn_id":"t","text":"\\ud800"}', "text", "lone surrogate"),
        ('{"type":"hangup","id":""}', "id", "1-128"),
        ('{"type":"answer","status":486}', "status", "unknown field for 'answer'"),
        ('{"type":"reject","status":200}', "status", "from 400 to 699"),
        ('{"type":"reject","status":700}', "status", "from 400 to 699"),
        ('{"type":"reject","status":"486"}', "status", "expected an integer, got a string"),
        ('{"type":"reject","status":486.0}', "status", "expected an integer, got a number"),
        ('{"type":"reject","status":true}', "status", "expected an integer, got a boolean"),
        ('{"type":"reject","status":null}', "status", "got null"),
        ('{"type":"reject","reason":""}', "reason", "printable ASCII"),
        ('{"type":"reject","reason":"a\\r\\nVia: x"}', "reason", "printable ASCII"),
        ('{"type":"reject","code":486}', "code", "unknown field for 'reject'"),
    ],
)
def test_decode_refuses_naming_the_field(text: str, field: str, needle: str) -> None:
    result = decode_command(text)
    assert isinstance(result, AppError), result
    assert result.field == field
    assert needle in result.message


def test_error_echoes_a_valid_id_and_type() -> None:
    result = decode_command('{"type":"say","id":"c-18","turn_id":"t"}')
    assert result == AppError("text", "missing", "c-18", "say")
    msg = json.loads(encode_error(result))
    assert msg == {
        "type": "error",
        "code": "invalid_command",
        "field": "text",
        "message": "missing",
        "id": "c-18",
        "command": "say",
    }
    bad_id = decode_command('{"type":"hangup","id":7}')
    assert isinstance(bad_id, AppError) and bad_id.field == "id" and bad_id.command_id is None


def test_size_limits_text_in_characters_message_in_utf8_bytes() -> None:
    head = '{"type":"say","turn_id":"t","text":"'
    wide = head + "é" * 4096 + '"}'  # 4096 characters, 8192 bytes: fine
    assert decode_command(wide) == Say("t", "é" * 4096)
    longer = head + "a" * 4097 + '"}'
    assert decode_command(longer) == AppError("text", "longer than 4096 characters", None, "say")
    # 40000 characters but 80000 bytes: refused whole, before parsing.
    huge = head + "é" * 40000 + '"}'
    assert len(huge) < MAX_MESSAGE_BYTES < len(huge.encode())
    result = decode_command(huge)
    assert isinstance(result, AppError) and result.field == "$" and "byte limit" in result.message
    deep = "[" * 30000 + "]" * 30000
    result = decode_command(deep)
    assert isinstance(result, AppError) and result.field == "$"


# Cases where the schema and decode_command must agree (beyond the message size
# and lone-surrogate rules, which a schema cannot state).
AGREEMENT_CASES: list[Any] = [
    {"type": "say", "turn_id": "t1", "text": ""},
    {"type": "say", "turn_id": "t1", "text": "x" * 4096},
    {"type": "say", "turn_id": "t1", "text": "x" * 4097},
    {"type": "say", "turn_id": "a" * 64, "text": "x"},
    {"type": "say", "turn_id": "a" * 65, "text": "x"},
    {"type": "say", "turn_id": "flow-demo:1.x_y", "text": "x"},
    {"type": "say", "turn_id": "t\n", "text": "x"},
    {"type": "say", "turn_id": "t", "text": "x", "final": 0},
    {"type": "say", "turn_id": "t", "text": "x", "provider": None},
    {"type": "say", "turn_id": "t", "text": "x", "extra": 1},
    {"type": "say", "turn_id": 5, "text": "x"},
    {"type": "say", "text": "x"},
    {"type": "cancel", "turn_id": "t"},
    {"type": "cancel"},
    {"type": "cancel", "turn_id": "t", "text": "x"},
    {"type": "hangup"},
    {"type": "hangup", "reason": ""},
    {"type": "hangup", "reason": "r" * 128},
    {"type": "hangup", "reason": "r" * 129},
    {"type": "hangup", "reason": "tab\there"},
    {"type": "hangup", "id": "x" * 128},
    {"type": "hangup", "id": "x" * 129},
    {"type": "hangup", "id": "a\u0001"},
    {"type": "hangup", "id": "ünïcode ok"},
    {"type": "transfer", "target": "sips:op@pbx"},
    {"type": "transfer", "target": "sip:"},
    {"type": "transfer", "target": "sip:" + "a" * 250},
    {"type": "transfer", "target": "sip:" + "a" * 251},
    {"type": "transfer", "target": "SIP:op@pbx"},
    {"type": "dtmf", "digits": "0123456789*#ABCD"},
    {"type": "dtmf", "digits": "1" * 33},
    {"type": "dtmf", "digits": "abcd"},
    {"type": "dtmf", "digits": ["1"]},
    {"type": "answer"},
    {"type": "answer", "reason": "x"},
    {"type": "reject"},
    {"type": "reject", "status": 400},
    {"type": "reject", "status": 699, "reason": "r" * 128},
    {"type": "reject", "status": 399},
    {"type": "reject", "status": 700},
    {"type": "reject", "status": 486.0},
    {"type": "reject", "status": False},
    {"type": "reject", "status": "486"},
    {"type": "reject", "reason": "r" * 129},
    {"type": "reject", "target": "sip:a@b"},
    {"type": "call.started"},
    {"type": "Say", "turn_id": "t", "text": "x"},
    {},
    [],
    "say",
    None,
]


@pytest.mark.parametrize("case", AGREEMENT_CASES, ids=range(len(AGREEMENT_CASES)))
def test_decode_accepts_exactly_what_the_schema_accepts(case: Any) -> None:
    decoded = decode_command(json.dumps(case))
    assert isinstance(decoded, Command) == valid(case, COMMAND), (case, decoded)


def test_agreement_cases_cover_both_answers() -> None:
    answers = [valid(c, COMMAND) for c in AGREEMENT_CASES]
    assert 10 <= sum(answers) <= len(answers) - 10


_KEYS = ["type", "id", "turn_id", "text", "final", "interruptible", "replace", "cacheable",
         "provider", "voice", "reason", "target", "digits", "status", "other"]  # fmt: skip
_STRINGS = st.one_of(
    st.sampled_from([*COMMAND_TYPES, "", "t1", "sip:a@b", "tel:+1", "12#", "joe", "a b"]),
    st.text(alphabet="aZ09._:-#*ABD \n\x01é", max_size=70),
)
_VALUES: st.SearchStrategy[Any] = st.one_of(
    _STRINGS,
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([399, 400, 486, 699, 700, 486.0]),
    st.none(),
    st.just([]),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=6), st.sampled_from(COMMAND_TYPES))
def test_decode_agrees_with_schema_on_generated_messages(obj: dict[str, Any], ctype: str) -> None:
    obj.setdefault("type", ctype)
    decoded = decode_command(json.dumps(obj))
    assert isinstance(decoded, Command) == valid(obj, COMMAND), (obj, decoded)


# ------------------------------------------------------------ the doc


def doc_json_blocks() -> list[Any]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", DOC, re.S)]


def test_every_doc_example_validates_against_the_schema() -> None:
    blocks = doc_json_blocks()
    assert len(blocks) >= 20
    for block in blocks:
        assert errors(block, SCHEMA, SCHEMA) == [], block


def test_doc_transcript_lines_validate() -> None:
    events = re.findall(r"^> (\{.*\})$", DOC, re.M)
    commands = re.findall(r"^< (\{.*\})$", DOC, re.M)
    assert len(events) >= 8 and len(commands) >= 3
    for line in events:
        assert errors(json.loads(line), EVENT, SCHEMA) == [], line
    for line in commands:
        assert errors(json.loads(line), COMMAND, SCHEMA) == [], line
        assert isinstance(decode_command(line), Command), line


def test_doc_has_a_section_and_field_table_per_message() -> None:
    parts = {
        "command": DOC.split("\n## Commands\n", 1)[1].split("\n## Events\n", 1)[0],
        "event": DOC.split("\n## Events\n", 1)[1],
    }
    for kind, part in parts.items():
        for name, definition in message_defs(kind).items():
            heading = f"### `{name}`"
            assert part.count(heading) == 1, heading
            section = part.split(heading, 1)[1].split("\n### ", 1)[0]
            fields = re.findall(r"^\| `([^`]+)` \|", section, re.M)
            assert fields == list(definition["properties"]), name
            for example in definition["examples"]:
                assert json.dumps(example, ensure_ascii=False) in section


def test_doc_states_the_fallback() -> None:
    assert "fallback_flow" in DOC and "greeting" in DOC


# ------------------------------------------------------------ AppSession


def session(**kw: Any) -> AppSession:
    return AppSession(
        STARTED, "ws://127.0.0.1:9000/app", 10.0, fallback_flow="demo", greeting="Hi", **kw
    )


def texts(s: AppSession) -> list[dict[str, Any]]:
    out = []
    for action in s.actions_to_send():
        assert isinstance(action, SendText)
        out.append(json.loads(action.text))
    return out


def test_events_buffer_until_connected_call_started_first() -> None:
    s = session()
    assert s.state is AppState.CONNECTING and not s.is_connected
    assert s.next_deadline() == 15.0
    s.handle_event(DtmfHeard("1"), 10.5)
    assert s.actions_to_send() == []
    s.connected(11.0)
    assert [m["type"] for m in texts(s)] == ["call.started", "dtmf"]
    assert s.events_received() == [AppConnected("ws://127.0.0.1:9000/app", 11.0)]
    assert s.next_deadline() is None and s.is_connected
    s.handle_event(TurnBegan("t1"), 12.0)
    assert texts(s) == [{"type": "turn.started", "turn_id": "t1"}]


def test_commands_flow_to_the_call_and_errors_back() -> None:
    s = session()
    s.connected(11.0)
    s.actions_to_send()
    s.receive_text('{"type":"say","turn_id":"t1","text":"Hello"}', 11.5)
    s.receive_text('{"type":"say","id":"q","turn_id":"t1"}', 11.6)
    s.receive_bytes(b"\x00\x01", 11.7)
    s.receive_text('{"type":"cancel","turn_id":"t1"}', 11.8)
    assert s.commands_to_send() == [Say("t1", "Hello"), Cancel("t1")]
    errs = texts(s)
    assert [(e["type"], e["field"], e.get("id")) for e in errs] == [
        ("error", "text", "q"),
        ("error", "$", None),
    ]
    assert s.refused_commands == 2


def test_call_rejections_become_error_messages() -> None:
    s = session()
    s.connected(11.0)
    s.actions_to_send()
    s.handle_event(CommandRejected("Cancel", "t9", "no_such_turn"), 12.0)
    (msg,) = texts(s)
    assert valid(msg, EVENT)
    assert msg["code"] == "command_rejected" and msg["field"] == "turn_id"
    assert msg["command"] == "cancel" and "no_such_turn" in msg["message"]


def test_a_rejection_echoes_the_id_its_command_came_with() -> None:
    """Two equal commands with different ids: each refusal names its own; a command
    without an id, or one the app did not send (a flow's), gets none."""
    s = session()
    s.connected(11.0)
    s.actions_to_send()
    s.receive_text('{"type":"cancel","turn_id":"t9","id":"a"}', 11.5)
    s.receive_text('{"type":"cancel","turn_id":"t9","id":"b"}', 11.6)
    s.receive_text('{"type":"cancel","turn_id":"t9"}', 11.7)
    first, second, third = s.commands_to_send()
    assert first == second == third
    for command in (second, first, third, Cancel("t9")):
        s.handle_event(CommandRejected("Cancel", "t9", "no_such_turn", source=command), 12.0)
    assert [m.get("id") for m in texts(s)] == ["b", "a", None, None]


def test_early_media_refusals_become_error_messages() -> None:
    s = session()
    s.connected(11.0)
    s.actions_to_send()
    s.handle_event(CommandRejected("Answer", "", "not_early_media"), 12.0)
    s.handle_event(CommandRejected("Reject", "", "bad_status"), 12.1)
    first, second = texts(s)
    assert valid(first, EVENT) and valid(second, EVENT)
    assert (first["code"], first["command"], first["field"]) == ("command_rejected", "answer", "$")
    assert "not_early_media" in first["message"]
    assert (second["command"], second["field"]) == ("reject", "status")


def test_call_end_sends_call_ended_then_closes() -> None:
    s = session()
    s.connected(11.0)
    s.actions_to_send()
    s.handle_event(CallEnded("remote_bye"), 20.0)
    assert s.actions_to_send() == [
        SendText('{"type":"call.ended","reason":"remote_bye"}'),
        CloseConnection(1000, "call ended"),
    ]
    s.disconnected(1000, "", 20.1)
    s.receive_text('{"type":"hangup"}', 20.2)
    assert s.events_received() == [AppConnected("ws://127.0.0.1:9000/app", 11.0)]
    assert s.commands_to_send() == [] and s.state is AppState.ENDED


def test_connect_timeout_runs_the_fallback() -> None:
    s = session()
    s.handle_timer(14.9)
    assert s.events_received() == []
    s.handle_timer(15.0)
    assert s.actions_to_send() == [CloseConnection(1001, "connect timeout")]
    assert s.events_received() == [AppLost("connect_timeout", False, "demo", "Hi")]
    assert s.next_deadline() is None and s.state is AppState.LOST
    s.connected(15.5)  # too late: ignored
    s.handle_event(DtmfHeard("1"), 16.0)
    assert s.actions_to_send() == [] and s.events_received() == []


def test_connect_failure_runs_the_fallback() -> None:
    s = session()
    s.connect_failed("HTTP 503", 10.2)
    assert s.events_received() == [AppLost("connect_failed: HTTP 503", False, "demo", "Hi")]
    s.disconnected(1006, "", 10.3)
    assert s.events_received() == []


def test_disconnect_mid_call_runs_the_fallback_once() -> None:
    s = session()
    s.connected(11.0)
    s.events_received()
    s.actions_to_send()
    s.disconnected(1011, "app crashed", 30.0)
    assert s.events_received() == [AppLost("disconnected: 1011 app crashed", True, "demo", "Hi")]
    s.disconnected(1011, "app crashed", 30.1)
    s.handle_event(CallEnded("x"), 31.0)
    assert s.events_received() == [] and s.actions_to_send() == []


def test_call_ending_while_connecting_aborts_without_fallback() -> None:
    s = session()
    s.handle_event(CallEnded("remote_cancel"), 10.5)
    assert s.actions_to_send() == [CloseConnection(1001, "call ended")]
    s.connect_failed("refused", 10.6)
    s.handle_timer(99.0)
    assert s.events_received() == [] and s.state is AppState.ENDED


def test_pending_events_are_bounded() -> None:
    s = session(max_pending_events=3)
    for digit in "1234":
        s.handle_event(DtmfHeard(digit), 10.1)
    s.connected(11.0)
    assert [m.get("digit") for m in texts(s)] == [None, "1", "2"]
    assert s.dropped_events == 2


def test_daemon_only_events_are_not_sent() -> None:
    s = session()
    s.connected(11.0)
    s.actions_to_send()

    class Private(CallEvent):
        __slots__ = ()

    s.handle_event(Private(), 12.0)
    assert s.actions_to_send() == []


def test_hand_over_is_not_an_application_command() -> None:
    result = decode_command('{"type":"handover","app":"ws://x"}')
    assert isinstance(result, AppError) and result.field == "type"
    assert not isinstance(result, HandOver)


def test_app_lost_mid_call_hands_the_call_to_its_fallback_flow() -> None:
    config = load_config(ROOT / "config/callbridge.toml")
    s = session()
    s.connected(11.0)
    s.receive_text('{"type":"say","turn_id":"t1","text":"Let me ","final":false}', 12.0)
    assert s.commands_to_send() == [Say("t1", "Let me ", final=False)]
    s.disconnected(1006, "", 13.0)
    (lost,) = [e for e in s.events_received() if isinstance(e, AppLost)]
    runner = fallback_runner(
        config.flow(lost.fallback_flow) if lost.fallback_flow else None,
        lost.greeting,
        13.0,
        replace=lost.mid_call,
    )
    runner.start(13.0)
    first, menu = runner.commands_to_send()
    assert isinstance(first, Say) and first.text == "Hi" and first.replace
    assert isinstance(menu, Say) and menu.text == config.flow("demo").step("menu").say
    assert not menu.replace

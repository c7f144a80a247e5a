"""The Coda client engine replayed against recorded frame sequences (fixtures/*.jsonl)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bridge.engine import CloseConnection, LocalProtocolError, SendText
from bridge.providers.base import (
    ALAW_8K,
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
from bridge.providers.coda.client import ENGINE, CodaProtocol
from bridge.providers.coda.wire import (
    MAX_CONTEXT_ID_BYTES,
    MAX_MESSAGE_BYTES,
    SUBPROTOCOL,
    format_duration,
    parse_duration_s,
    split_text,
)

PCM_24K = AudioFormat("pcm_s16le", 24000)
PCM_8K = AudioFormat("pcm_s16le", 8000)


def b64(text: str) -> bytes:
    return base64.b64decode(text)


def ready_client(coda: Any, **options: str | int | float | bool) -> CodaProtocol:
    engine: CodaProtocol = coda.make_client(**options)
    engine.connection_made(SUBPROTOCOL, 0.0)
    engine.receive_text(json.dumps({"ready": {"protocol": 1, "languages": ["en"]}}), 0.0)
    assert ConnectionReady() in engine.events_received()
    engine.actions_to_send()
    return engine


def sent(engine: CodaProtocol) -> list[Any]:
    out: list[Any] = []
    for action in engine.actions_to_send():
        assert isinstance(action, SendText)
        out.append(json.loads(action.text))
    return out


# ------------------------------------------------------------- fixtures


def test_module_exposes_engine() -> None:
    assert ENGINE is CodaProtocol
    assert CodaProtocol.protocol_name == "coda"
    assert CodaProtocol.max_turns == 16


def test_normal_streaming_turn_with_timestamps(coda: Any) -> None:
    events = coda.replay(
        coda.make_client(),
        "normal_turn.jsonl",
        [
            (0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now)),
            (0.01, lambda e, now: e.send_text("t1", "Hello. ", now)),
            (0.02, lambda e, now: e.send_text("t1", "How can I help you? ", now)),
            (0.03, lambda e, now: e.end_turn("t1", now)),
        ],
    )
    words = (
        WordTiming("Hello.", 0.0, 0.32),  # proto3 JSON omitted the zero start
        WordTiming("How", 0.4, 0.56),
        WordTiming("can", 0.56, 0.7),
        WordTiming("I", 0.7, 0.76),
        WordTiming("help", 0.76, 0.98),
        WordTiming("you?", 0.98, 1.413333333),
    )
    assert events == [
        (0.0, ConnectionReady()),
        (0.05, TurnStarted("t1", provider_ref="request-123")),
        (0.1, AudioReceived("t1", b"\x01\x02", PCM_24K)),  # half a sample kept back
        (0.12, AudioReceived("t1", b"\x03\x04\x05\x06", PCM_24K)),
        (0.2, WordsTimed("t1", words)),
        (0.2, TurnDone("t1")),
    ]


def test_complete_text_mode_mulaw_passthrough_and_doc_timestamps(coda: Any) -> None:
    engine = coda.make_client(language="en", input_mode="complete")
    text = "Dr. Smith paid $42.50 on March 3rd, 2024 at 5:30 PM."
    events = coda.replay(
        engine,
        "complete_text.jsonl",
        [
            (0.01, lambda e, now: e.open_turn("turn-1", coda.turn(MULAW_8K), now)),
            (0.01, lambda e, now: e.send_text("turn-1", text[:20], now)),
            (0.01, lambda e, now: e.send_text("turn-1", text[20:], now)),
            (0.02, lambda e, now: e.end_turn("turn-1", now)),
        ],
    )
    assert events[2] == (0.1, AudioReceived("turn-1", b"\xff" * 5 + b"\x00", MULAW_8K))
    _, timed = events[3]
    assert isinstance(timed, WordsTimed)
    assert [w.word for w in timed.words] == text.split()
    assert timed.words[5] == WordTiming("March", 2.8, 3.413333333)
    assert timed.words[-1] == WordTiming("PM.", 5.36, 5.84)
    assert events[4] == (0.2, TurnDone("turn-1"))
    assert engine.languages == ("en",)
    assert engine.default_language == "en"


def test_cancel_mid_utterance_drops_late_audio(coda: Any) -> None:
    events = coda.replay(
        coda.make_client(),
        "cancel_mid_utterance.jsonl",
        [
            (0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now)),
            (
                0.01,
                lambda e, now: e.send_text("t1", "Hello there, how can I help you today? ", now),
            ),
            (0.01, lambda e, now: e.end_turn("t1", now)),
            (0.3, lambda e, now: e.cancel("t1", now)),
            (0.3, lambda e, now: e.cancel("t1", now)),  # twice: one cancel frame
            (0.31, lambda e, now: e.send_text("t1", "late text", now)),  # moot after cancel
            (0.4, lambda e, now: e.open_turn("t2", coda.turn(PCM_24K), now)),
        ],
    )
    assert events == [
        (0.0, ConnectionReady()),
        (0.05, TurnStarted("t1", provider_ref="request-1")),
        (0.1, AudioReceived("t1", b64("AAABAAIAAwA="), PCM_24K)),
        (0.35, TurnDone("t1", cancelled=True)),
        (0.45, TurnStarted("t2", provider_ref="request-2")),
    ]


def test_cancel_racing_done_reports_cancelled_without_words(coda: Any) -> None:
    engine = coda.make_client()
    events = coda.replay(
        engine,
        "cancel_races_done.jsonl",
        [
            (0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now)),
            (0.01, lambda e, now: e.send_text("t1", "Short. ", now)),
            (0.01, lambda e, now: e.end_turn("t1", now)),
            (0.1, lambda e, now: e.cancel("t1", now)),
        ],
    )
    assert [e for _, e in events][-1] == TurnDone("t1", cancelled=True)
    assert not any(isinstance(e, WordsTimed) for _, e in events)
    assert engine.open_turns() == 0


def test_context_errors_fail_only_their_turn(coda: Any) -> None:
    engine = coda.make_client()

    def open_all(e: CodaProtocol, now: float) -> None:
        for turn_id in ("t1", "t2", "t3", "t4"):
            e.open_turn(turn_id, coda.turn(PCM_24K), now)

    events = coda.replay(
        engine,
        "turn_errors.jsonl",
        [(0.01, open_all), (0.05, lambda e, now: e.cancel("t3", now))],
    )
    assert events == [
        (0.0, ConnectionReady()),
        (0.02, TurnFailed("t1", "invalid_input", "Unknown speaker (requestId request-9)", False)),
        (0.03, TurnStarted("t2", provider_ref="request-10")),
        (0.04, TurnFailed("t2", "unavailable", "engine restarting", True)),
        (0.06, TurnDone("t3", cancelled=True)),  # error after cancel: the run ended
        (0.07, TurnFailed("t4", "cancelled", "the provider cancelled the context", True)),
    ]
    assert engine.ready
    assert engine.open_turns() == 0


def test_connection_error_fails_every_open_turn(coda: Any) -> None:
    engine = coda.make_client()

    def open_two(e: CodaProtocol, now: float) -> None:
        e.open_turn("t1", coda.turn(PCM_24K), now)
        e.open_turn("t2", coda.turn(PCM_24K), now)

    events = coda.replay(engine, "connection_error.jsonl", [(0.01, open_two)])
    assert events[-1] == (
        0.05,
        ProviderFailed("unavailable", "server at capacity", ("t1", "t2"), retryable=True),
    )
    assert not engine.ready
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t3", coda.turn(PCM_24K), 0.1)


def test_connection_level_invalid_input_and_resource_exhausted(coda: Any) -> None:
    engine = coda.make_client()

    def open_two(e: CodaProtocol, now: float) -> None:
        e.open_turn("t2", coda.turn(PCM_24K), now)
        e.open_turn("t3", coda.turn(PCM_24K), now)

    events = coda.replay(
        engine,
        "connection_level_errors.jsonl",
        [(0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now)), (0.03, open_two)],
    )
    assert events == [
        (0.0, ConnectionReady()),
        (0.02, TurnStarted("t1", provider_ref="request-1")),
        (0.05, TurnFailed("t3", "resource_exhausted", "too many open contexts", True)),
        (0.06, TurnStarted("t2", provider_ref="request-2")),
        (0.08, AudioReceived("t1", b"\x00\x00", PCM_24K)),
    ]
    assert engine.ready
    assert engine.open_turns() == 2


def test_unauthenticated_is_fatal_and_the_key_is_scrubbed(coda: Any) -> None:
    engine = coda.make_client()
    events = coda.replay(
        engine,
        "unauthenticated.jsonl",
        [(0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now))],
    )
    failed = [e for _, e in events if isinstance(e, ProviderFailed)]
    assert failed == [ProviderFailed("unauthenticated", "bad key ***", ("t1",), retryable=False)]
    assert all(coda.API_KEY not in repr(e) for _, e in events)


def test_socket_closing_before_terminal_event_interrupts_turns(coda: Any) -> None:
    def open_two(e: CodaProtocol, now: float) -> None:
        e.open_turn("t1", coda.turn(PCM_24K), now)
        e.open_turn("t2", coda.turn(PCM_24K), now)

    events = coda.replay(coda.make_client(), "connection_lost.jsonl", [(0.01, open_two)])
    assert events[-2:] == [
        (0.04, TurnDone("t2")),
        (0.05, ProviderFailed("connection_lost", "connection closed (code 1006)", ("t1",))),
    ]


def test_invalid_json_fails_the_connection(coda: Any) -> None:
    events = coda.replay(
        coda.make_client(),
        "malformed_json.jsonl",
        [(0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now))],
    )
    assert events[-1] == (
        0.02,
        ProviderFailed("malformed", "frame is not a JSON object", ("t1",), True),
    )


def test_malformed_payloads_fail_their_turn_unknown_frames_are_ignored(coda: Any) -> None:
    def open_two(e: CodaProtocol, now: float) -> None:
        e.open_turn("t1", coda.turn(PCM_24K), now)
        e.open_turn("t2", coda.turn(PCM_24K), now)

    events = coda.replay(coda.make_client(), "malformed_payloads.jsonl", [(0.01, open_two)])
    assert events == [
        (0.0, ConnectionReady()),
        (0.02, TurnFailed("t1", "malformed", "audio payload is not valid base64", True)),
        (0.03, TurnFailed("t2", "malformed", "audio payload is not valid base64", True)),
        (0.09, ProviderFailed("malformed", "frame is not a JSON object", (), True)),
    ]


def test_binary_frame_on_json_subprotocol_fails_the_connection(coda: Any) -> None:
    events = coda.replay(
        coda.make_client(),
        "binary_frame.jsonl",
        [(0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now))],
    )
    failed = events[-1][1]
    assert isinstance(failed, ProviderFailed)
    assert failed.kind == "malformed"
    assert failed.turn_ids == ("t1",)


@pytest.mark.parametrize("name", ["bad_protocol.jsonl", "ready_omits_protocol.jsonl"])
def test_ready_with_wrong_protocol_version_fails(coda: Any, name: str) -> None:
    events = coda.replay(coda.make_client(), name, [])
    assert len(events) == 1
    failed = events[0][1]
    assert isinstance(failed, ProviderFailed)
    assert failed.kind == "protocol_version"
    assert failed.retryable is False


def test_ready_timeout_is_a_timer(coda: Any) -> None:
    engine = coda.make_client()
    engine.connection_made(SUBPROTOCOL, 0.0)
    assert engine.next_deadline() == 10.0
    events = coda.replay(coda.make_client(), "ready_timeout.jsonl", [])
    assert events == [(10.0, ProviderFailed("timeout", "no ready within 10 s"))]


def test_response_timeout_only_while_waiting_on_the_server(coda: Any) -> None:
    engine = coda.make_client()
    events = coda.replay(
        engine,
        "response_timeout.jsonl",
        [
            (0.01, lambda e, now: e.open_turn("t1", coda.turn(PCM_24K), now)),
            (45.0, lambda e, now: e.send_text("t1", "Still there? ", now)),
            (45.0, lambda e, now: e.end_turn("t1", now)),
        ],
    )
    assert [type(e) for _, e in events] == [
        ConnectionReady,
        TurnStarted,
        AudioReceived,
        ProviderFailed,
    ]
    t, failed = events[-1]
    assert t == 80.0
    assert isinstance(failed, ProviderFailed)
    assert (failed.kind, failed.turn_ids) == ("timeout", ("t1",))


def test_interleaved_contexts_are_routed_by_context_id(coda: Any) -> None:
    def open_two(e: CodaProtocol, now: float) -> None:
        e.open_turn("a", coda.turn(PCM_24K), now)
        e.send_text("a", "First turn. ", now)
        e.end_turn("a", now)
        e.open_turn("b", coda.turn(MULAW_8K, timestamps=False), now)
        e.send_text("b", "Second turn. ", now)
        e.end_turn("b", now)

    events = coda.replay(coda.make_client(), "interleaved.jsonl", [(0.01, open_two)])
    assert events == [
        (0.0, ConnectionReady()),
        (0.02, TurnStarted("b", provider_ref="request-b")),
        (0.03, TurnStarted("a", provider_ref="request-a")),
        (0.04, AudioReceived("b", b"\xff\xff", MULAW_8K)),
        (0.05, AudioReceived("a", b"\x01\x00\x02\x00", PCM_24K)),
        (0.06, TurnDone("b")),
        (0.07, AudioReceived("a", b"\x03\x00\x04\x00", PCM_24K)),
        (0.08, TurnDone("a")),  # a non-empty status: no spans, audio unaffected
    ]


# ------------------------------------------------------ connection rules


def test_connect_params_bearer_header_and_subprotocol(coda: Any) -> None:
    params = coda.make_client().connect_params()
    assert params.url == "wss://coda.example/ws"
    assert params.headers == (("Authorization", f"Bearer {coda.API_KEY}"),)
    assert params.subprotocols == ("rime.v1.json",)
    assert coda.make_client().session_request() is None


def test_direct_engine_credentials_go_in_the_first_config(coda: Any) -> None:
    engine = coda.make_client(auth="config", license='{"id": 7}', language="en")
    assert engine.connect_params().headers == ()
    engine.connection_made(SUBPROTOCOL, 0.0)
    engine.receive_text('{"ready": {"protocol": 1}}', 0.0)
    assert sent(engine) == [
        {
            "config": {
                "defaults": {"speaker": "lyra", "language": "en"},
                "authorization": coda.API_KEY,
                "license": '{"id": 7}',
            }
        }
    ]


def test_no_config_when_there_is_nothing_to_configure(coda: Any) -> None:
    from bridge.providers.base import ProviderSettings

    engine = CodaProtocol(ProviderSettings(name="c", protocol="coda", url=""))
    assert engine.connect_params().url == "wss://coda.api.rime.ai/ws"
    assert engine.connect_params().headers == ()
    engine.connection_made(SUBPROTOCOL, 0.0)
    engine.receive_text('{"ready": {"protocol": 1}}', 0.0)
    assert engine.actions_to_send() == []
    engine.open_turn("t1", coda.turn(PCM_8K, voice=""), 0.0)
    (start,) = sent(engine)
    assert "speaker" not in start["start"]


@pytest.mark.parametrize("negotiated", [None, "rime.v1.binary", "chat"])
def test_subprotocol_mismatch_fails_and_closes(coda: Any, negotiated: str | None) -> None:
    engine = coda.make_client()
    engine.connection_made(negotiated, 0.0)
    assert engine.actions_to_send() == [CloseConnection(1002, "subprotocol")]
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed)
    assert failed.kind == "subprotocol"
    assert not engine.ready
    engine.receive_text('{"ready": {"protocol": 1}}', 0.1)
    assert engine.events_received() == []


def test_open_turn_needs_ready_and_respects_sixteen_contexts(coda: Any) -> None:
    engine = coda.make_client()
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t0", coda.turn(PCM_24K), 0.0)
    engine = ready_client(coda)
    for i in range(16):
        engine.open_turn(f"t{i}", coda.turn(PCM_24K), 0.0)
    assert engine.open_turns() == 16
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t16", coda.turn(PCM_24K), 0.0)
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t3", coda.turn(PCM_24K), 0.0)
    engine.cancel("t0", 0.1)  # a cancelled context still counts until cancelled arrives
    assert engine.open_turns() == 16
    contexts = {m["contextId"] for m in sent(engine)}
    assert len(contexts) == 16  # a fresh context id per turn, never "default"
    engine.receive_text('{"contextId": "1-t0", "cancelled": {}}', 0.2)
    assert engine.open_turns() == 15
    engine.open_turn("t16", coda.turn(PCM_24K), 0.3)


def test_context_ids_fit_128_bytes_and_stay_unique(coda: Any) -> None:
    engine = ready_client(coda)
    long_id = "é" * 200
    engine.open_turn(long_id, coda.turn(PCM_24K), 0.0)
    engine.cancel(long_id, 0.0)
    engine.receive_text(json.dumps({"contextId": sent(engine)[0]["contextId"], "done": {}}), 0.1)
    engine.open_turn(long_id, coda.turn(PCM_24K), 0.2)
    (start,) = sent(engine)
    context_id = start["contextId"]
    assert len(context_id.encode()) <= MAX_CONTEXT_ID_BYTES
    assert context_id.startswith("2-é")


def test_send_text_and_end_turn_after_end_are_handled(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K), 0.0)
    engine.send_text("t1", "", 0.0)  # nothing to send
    engine.send_text("t1", " ", 0.0)  # spaces are tokens too
    engine.end_turn("t1", 0.0)
    engine.end_turn("t1", 0.0)
    assert [m for m in sent(engine) if "start" not in m] == [
        {"contextId": "1-t1", "text": " "},
        {"contextId": "1-t1", "end": {}},
    ]
    with pytest.raises(LocalProtocolError):
        engine.send_text("t1", "more", 0.1)
    engine.send_text("unknown", "x", 0.1)
    engine.end_turn("unknown", 0.1)
    engine.cancel("unknown", 0.1)
    assert engine.actions_to_send() == []


def test_long_text_is_split_under_64_kib(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K), 0.0)
    text = ('Ünïcode wörds and "quotes" \\ and\ttabs. ' * 4000)[:150_000]
    engine.send_text("t1", text, 0.0)
    frames = [a for a in engine.actions_to_send() if isinstance(a, SendText)][1:]
    assert len(frames) >= 3
    assert all(len(f.text.encode()) <= MAX_MESSAGE_BYTES for f in frames)
    pieces = [json.loads(f.text)["text"] for f in frames]
    assert "".join(pieces) == text
    assert all(p.endswith(" ") for p in pieces[:-1])  # cut between words


def test_complete_text_too_big_for_one_frame_is_streamed(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K, input_mode="complete"), 0.0)
    assert engine.actions_to_send() == []  # complete mode: nothing before end_turn
    text = "word " * 20_000
    engine.send_text("t1", text, 0.0)
    engine.end_turn("t1", 0.0)
    frames = sent(engine)
    assert frames[0]["start"]["text"] == ""
    assert "".join(f["text"] for f in frames[1:-1]) == text
    assert frames[-1] == {"contextId": "1-t1", "end": {}}


def test_blank_complete_text_is_streamed_and_ended(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K, input_mode="complete"), 0.0)
    engine.end_turn("t1", 0.0)
    frames = sent(engine)
    assert [sorted(f) for f in frames] == [["contextId", "start"], ["contextId", "end"]]


def test_cancel_before_anything_was_sent_is_local(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K, input_mode="complete"), 0.0)
    engine.send_text("t1", "Never said.", 0.0)
    engine.cancel("t1", 0.1)
    assert engine.actions_to_send() == []
    assert engine.events_received() == [TurnDone("t1", cancelled=True)]
    assert engine.open_turns() == 0


def test_start_fields_follow_turn_settings(coda: Any) -> None:
    from bridge.providers.base import TurnSettings

    engine = ready_client(coda, split_strategy="SPLIT_STRATEGY_NONE", text_lookahead_tokens=4)
    settings = TurnSettings(
        voice="astra",
        audio_format=ALAW_8K,
        language="fr",
        speed=4.0,
        temperature=0.9,
        word_timestamps=False,
        extra=(("split_strategy", "SPLIT_STRATEGY_SENTENCE"),),
    )
    engine.open_turn("t1", settings, 0.0)
    (start,) = sent(engine)
    assert start == {
        "contextId": "1-t1",
        "start": {
            "speaker": "astra",
            "language": "fr",
            "text": "",
            # Coda has no A-law: PCM at 8 kHz, timeScaleFactor clamped to 0.4
            "audioParameters": {
                "audioFormat": "audio/pcm",
                "samplingRate": 8000,
                "timeScaleFactor": 0.4,
            },
            "splitStrategy": "SPLIT_STRATEGY_SENTENCE",
            "codaParameters": {"textLookaheadTokens": 4},
        },
    }
    engine.receive_text('{"contextId": "1-t1", "audio": "AAEC"}', 0.1)
    (audio,) = engine.events_received()
    assert audio == AudioReceived("t1", b"\x00\x01", PCM_8K)


def test_config_is_sent_once_and_duplicate_ready_is_ignored(coda: Any) -> None:
    engine = coda.make_client()
    engine.connection_made(SUBPROTOCOL, 0.0)
    engine.receive_text('{"ready": {"protocol": 1}}', 0.0)
    engine.receive_text('{"ready": {"protocol": 1}}', 0.1)
    assert [m for m in sent(engine) if "config" in m] == [
        {"config": {"defaults": {"speaker": "lyra"}}}
    ]
    assert engine.events_received() == [ConnectionReady()]


def test_local_close_reports_closed_once(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K), 0.0)
    engine.actions_to_send()
    engine.close(1.0)
    assert engine.actions_to_send() == [CloseConnection(1000, "")]
    assert not engine.ready
    assert engine.next_deadline() is None
    engine.receive_text('{"contextId": "1-t1", "audio": "AAA="}', 1.1)  # closing: dropped
    engine.connection_lost(1000, "", 1.2)
    assert engine.events_received() == [
        ProviderFailed("closed", "connection closed (code 1000)", ("t1",))
    ]
    engine.connection_lost(1000, "", 1.3)
    assert engine.events_received() == []


def test_local_close_with_no_turn_left_is_silent(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K), 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    engine.end_turn("t1", 0.0)
    context_id = sent(engine)[0]["contextId"]
    engine.receive_text(json.dumps({"contextId": context_id, "done": {}}), 0.5)
    assert any(isinstance(e, TurnDone) for e in engine.events_received())
    engine.close(1.0)
    assert engine.actions_to_send()[-1] == CloseConnection(1000, "")
    engine.connection_lost(1000, "", 1.2)
    assert engine.events_received() == []
    assert not engine.ready


def test_close_1008_means_bad_credentials(coda: Any) -> None:
    engine = ready_client(coda)
    engine.connection_lost(1008, "conflicting credentials", 1.0)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed)
    assert (failed.kind, failed.retryable) == ("unauthenticated", False)


def test_frames_never_raise_on_odd_input(coda: Any) -> None:
    engine = ready_client(coda)
    engine.open_turn("t1", coda.turn(PCM_24K), 0.0)
    for text in [
        '{"contextId": "1-t1", "started": "yes"}',
        '{"contextId": "1-t1", "done": {"timestamps": {"spans": [1, {"text": 3}, '
        '{"text": "ok", "start": "-1s"}, {"text": "fine", "start": "1.5s", "end": 2}]}}}',
    ]:
        engine.receive_text(text, 0.1)
    assert engine.events_received() == [
        TurnStarted("t1", provider_ref=""),
        WordsTimed("t1", (WordTiming("fine", 1.5, 2.0),)),
        TurnDone("t1"),
    ]
    engine.receive_text('{"contextId": 5, "done": {}}', 0.2)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed)


# ------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.080s", 0.08), ("3.413333333s", 3.413333333), ("0s", 0.0), ("12s", 12.0), (1.5, 1.5)],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["0.08", "-1s", "nans", "infs", "xs", None, True, [1]])
def test_parse_duration_rejects(bad: object) -> None:
    assert parse_duration_s(bad) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.08, "0.080s"),
        (4.64, "4.640s"),
        (1.000001, "1.000001s"),
        (3.413333333, "3.413333333s"),
    ],
)
def test_format_duration_is_proto3_json(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration_s(text) == pytest.approx(seconds)


def test_split_text_respects_budget_with_escapes() -> None:
    text = '\x01"é😀 ab' * 50
    pieces = split_text(text, 40)
    assert "".join(pieces) == text
    assert all(len(json.dumps(p, ensure_ascii=False).encode()) - 2 <= 40 for p in pieces)

"""The Kletso client engine against recorded frame sequences (``fixtures/*.jsonl``).

Fixture lines are ``{"t": seconds, "dir": "in"|"out", "msg": ...}``. ``msg`` is
a JSON frame (sent as its serialisation), ``{"b64": ...}`` for a binary
frame, ``{"raw": ...}`` for text sent exactly as written (malformed input),
and, on "out" lines, ``{"close": code}`` for a ``CloseConnection``. The
commands a test issues (``open_turn``, ``cancel``...) are listed in the test
with their times. ``replay`` steps time forward to each command, inbound
line or engine deadline (whichever is first) and returns the outbound frames
(with their times) and the events; every test asserts both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import tts_replay
from tts_replay import pcm

from bridge.engine import CloseConnection, Event, LocalProtocolError, SendBytes, SendText
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    UsageReported,
)
from bridge.providers.kletso.client import (
    ENGINE,
    MAX_FRAME_BYTES,
    PCM_24K,
    KletsoProtocol,
    TranscriptReceived,
    VoiceEnded,
    VoiceFailed,
    VoiceInterrupted,
    VoiceLimits,
    VoiceStarted,
    VoiceStateChanged,
    VoiceUsage,
)

FIXTURES = Path(__file__).parent / "fixtures"
SETTINGS = TurnSettings(voice="joe", audio_format=MULAW_8K)
Call = tuple[float, Callable[[KletsoProtocol, float], None]]


def make_engine(**options: str | int | float | bool) -> KletsoProtocol:
    settings = ProviderSettings(
        name="kletso",
        protocol="kletso",
        url="",
        api_key="sk-secret-123",
        options=tuple(options.items()),
    )
    return KletsoProtocol(settings)


def load(name: str) -> list[dict[str, Any]]:
    return tts_replay.load_jsonl(FIXTURES / name)


def _close_code(action: CloseConnection) -> object:
    return {"close": action.code}


def replay(
    engine: KletsoProtocol, name: str, calls: list[Call]
) -> tuple[list[tuple[float, object]], list[Event]]:
    """Drive ``engine`` through the fixture; assert the "out" lines; return both sides."""
    run = tts_replay.replay_steps(
        engine,
        load(name),
        calls,
        connect=lambda engine, now: engine.connection_made(None, now),
        time_digits=6,
        to_msg=partial(tts_replay.action_to_msg, close=_close_code),
    )
    return [(round(t, 6), msg) for t, msg in run.sent], [e for _, e in run.events]


def of_type(events: list[Event], kind: type) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


# ------------------------------------------------------------------ fixtures


def test_normal_turn_streams_audio_and_reports_played_position() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Hello ", now)),
        (0.02, lambda e, now: e.send_text("t1", "there.", now)),
        (0.02, lambda e, now: e.end_turn("t1", now)),
        (0.6, lambda e, now: e.set_played_position("item_2", 250)),
        (1.25, lambda e, now: e.set_played_position("item_2", 700)),
    ]
    _, events = replay(engine, "normal_turn.jsonl", calls)
    assert events == [
        ConnectionReady(),
        VoiceStarted("vs_1", "kletso-voice-1", "joe", VoiceLimits(600.0, 60.0)),
        VoiceStateChanged("idle"),
        VoiceStateChanged("thinking"),
        TurnStarted("t1", "item_2"),
        VoiceStateChanged("speaking"),
        AudioReceived("t1", pcm(1, 2), PCM_24K),
        AudioReceived("t1", pcm(3, 4), PCM_24K),
        AudioReceived("t1", pcm(5, 6), PCM_24K),
        VoiceStateChanged("idle"),
        TurnDone("t1"),
    ]
    assert engine.open_turns() == 0
    assert engine.next_deadline() is None


def test_cancel_mid_utterance_drops_late_frames_and_next_turn_works() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Tell me a story.", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
        (0.35, lambda e, now: e.set_played_position("item_2", 40)),
        (0.4, lambda e, now: e.cancel("t1", now)),
        (0.7, lambda e, now: e.open_turn("t2", SETTINGS, now)),
        (0.7, lambda e, now: e.send_text("t2", "Second.", now)),
        (0.7, lambda e, now: e.end_turn("t2", now)),
    ]
    _, events = replay(engine, "cancel_mid_utterance.jsonl", calls)
    t1 = [e for e in events if getattr(e, "turn_id", None) == "t1"]
    assert t1 == [
        TurnStarted("t1", "item_2"),
        AudioReceived("t1", pcm(1, 2), PCM_24K),
        AudioReceived("t1", pcm(3, 4), PCM_24K),
        TurnDone("t1", cancelled=True),
    ]
    t2 = [e for e in events if getattr(e, "turn_id", None) == "t2"]
    assert t2 == [
        TurnStarted("t2", "item_4"),
        AudioReceived("t2", pcm(7), PCM_24K),
        TurnDone("t2"),
    ]


def test_cancel_before_reply_drops_the_whole_reply() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Never mind.", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
        (0.16, lambda e, now: e.cancel("t1", now)),
    ]
    _, events = replay(engine, "cancel_before_reply.jsonl", calls)
    turn_events = [e for e in events if hasattr(e, "turn_id")]
    assert turn_events == [TurnDone("t1", cancelled=True)]
    assert not of_type(events, AudioReceived)


def test_turn_error_fails_the_turn_and_a_new_turn_restarts_the_session() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Hello.", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
        (0.5, lambda e, now: e.open_turn("t2", SETTINGS, now)),
    ]
    _, events = replay(engine, "turn_error.jsonl", calls)
    message = "synthesis failed: upstream 503"
    assert of_type(events, TurnFailed) == [TurnFailed("t1", "voice_provider_error", message, True)]
    assert of_type(events, VoiceFailed) == [VoiceFailed("voice_provider_error", message, True)]
    assert of_type(events, VoiceEnded) == [VoiceEnded("error", VoiceUsage(0.0, 0.0, 0))]
    assert of_type(events, UsageReported) == [
        UsageReported(None, {"audioInSeconds": 0, "audioOutSeconds": 0, "costMicros": 0})
    ]
    assert not of_type(events, ProviderFailed)
    assert engine.open_turns() == 1


def test_not_configured_is_a_connection_error_and_closes() -> None:
    engine = make_engine()
    calls: list[Call] = [(0.0, lambda e, now: e.open_turn("t1", SETTINGS, now))]
    _, events = replay(engine, "connection_error.jsonl", calls)
    assert events[1:] == [
        ProviderFailed("not_configured", "no OpenAI key on the agent", ("t1",), False)
    ]
    assert not engine.ready
    engine.connection_lost(1000, "", 0.1)
    assert engine.events_received() == []


def test_malformed_json_fails_the_connection_but_unknown_frames_are_ignored() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Hi.", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
    ]
    _, events = replay(engine, "malformed.jsonl", calls)
    failed = of_type(events, ProviderFailed)
    assert failed == [ProviderFailed("protocol_error", "malformed JSON frame", ("t1",), True)]
    assert not of_type(events, VoiceStateChanged)  # "dreaming" ignored; after failure nothing


def test_voice_agent_session_with_server_interruption() -> None:
    engine = make_engine()
    silence = bytes(8)
    calls: list[Call] = [
        (0.0, lambda e, now: e.start_voice("vad", "agent-7", now)),
        (0.02, lambda e, now: e.send_audio(silence, now)),
        (0.06, lambda e, now: e.send_audio(silence, now)),
        (0.06, lambda e, now: e.commit(now)),
        (0.85, lambda e, now: e.set_played_position("item_2", 130)),
        (1.5, lambda e, now: e.stop_voice("user", now)),
    ]
    _, events = replay(engine, "voice_agent.jsonl", calls)
    assert events == [
        ConnectionReady(),
        VoiceStarted("vs_9", "kletso-voice-1", "joe", VoiceLimits(300.0, 30.0)),
        VoiceStateChanged("listening"),
        TranscriptReceived("user", "[speech, 1.2 s]", True),
        VoiceStateChanged("thinking"),
        TurnStarted("voice-1", "item_2"),
        VoiceStateChanged("speaking"),
        AudioReceived("voice-1", pcm(1, 2), PCM_24K),
        VoiceInterrupted("item_2", 120),
        TurnDone("voice-1", cancelled=True),
        VoiceStateChanged("listening"),
        VoiceStateChanged("idle"),
        VoiceEnded("user", VoiceUsage(1.5, 0.1, 175)),
        UsageReported(None, {"audioInSeconds": 1.5, "audioOutSeconds": 0.1, "costMicros": 175}),
    ]


def test_rate_limited_start_fails_the_held_turn_as_retryable() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Hi.", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
        (1.0, lambda e, now: e.open_turn("t2", SETTINGS, now)),
    ]
    _, events = replay(engine, "rate_limited.jsonl", calls)
    message = "too many voice sessions, retry later"
    assert events[1:] == [
        TurnFailed("t1", "voice_rate_limited", message, True),
        VoiceFailed("voice_rate_limited", message, True),
    ]


def test_conflict_means_a_session_runs_so_held_text_goes_out() -> None:
    engine = make_engine()
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Still there?", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
    ]
    _, events = replay(engine, "conflict.jsonl", calls)
    assert events[1:] == [VoiceFailed("conflict", "a voice session is already running", False)]
    assert engine.open_turns() == 1


def test_reply_timeout_fails_the_turn_and_the_late_reply_is_dropped() -> None:
    engine = make_engine(reply_timeout_s=2.0)
    calls: list[Call] = [
        (0.0, lambda e, now: e.open_turn("t1", SETTINGS, now)),
        (0.0, lambda e, now: e.send_text("t1", "Anyone?", now)),
        (0.0, lambda e, now: e.end_turn("t1", now)),
    ]
    _, events = replay(engine, "reply_timeout.jsonl", calls)
    turn_events = [e for e in events if hasattr(e, "turn_id")]
    assert turn_events == [TurnFailed("t1", "timeout", "no reply within 2.0 s", True)]


# ------------------------------------------------------------------ unit rules


def ready_engine(**options: str | int | float | bool) -> KletsoProtocol:
    engine = make_engine(**options)
    engine.connection_made(None, 0.0)
    engine.start_voice("ptt", "c1", 0.0)
    started = {"voiceSessionId": "vs", "model": "m", "voice": "v", "limits": {}}
    engine.receive_text(json.dumps({"type": "voice.started", "data": started}), 0.0)
    engine.actions_to_send()
    engine.events_received()
    return engine


def test_connect_params_carry_the_key_only_in_the_header() -> None:
    params = make_engine().connect_params()
    assert params.url == "wss://api.kletso.ai/v1/realtime"
    assert params.headers == (("Authorization", "Bearer sk-secret-123"),)
    assert make_engine().session_request() is None
    assert ENGINE is KletsoProtocol
    assert KletsoProtocol.max_turns == 1


def test_api_key_is_redacted_from_server_messages() -> None:
    engine = ready_engine()
    frame = {"type": "error", "code": "voice_unavailable", "message": "bad key sk-secret-123"}
    engine.receive_text(json.dumps(frame), 1.0)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed)
    assert "sk-secret-123" not in failed.message
    assert failed.message == "bad key ***"


def test_send_audio_splits_into_frames_of_at_most_16_kb() -> None:
    engine = ready_engine()
    engine.send_audio(bytes(40000), 0.1)
    frames = [a for a in engine.actions_to_send() if isinstance(a, SendBytes)]
    assert [len(f.data) for f in frames] == [16383, 16383, 40000 - 2 * 16382 + 1]
    assert all(len(f.data) <= MAX_FRAME_BYTES and f.data[0] == 0x01 for f in frames)
    assert b"".join(f.data[1:] for f in frames) == bytes(40000)


def test_audio_held_while_starting_is_bounded() -> None:
    engine = make_engine()
    engine.connection_made(None, 0.0)
    engine.start_voice("vad", "c1", 0.0)
    engine.actions_to_send()
    for _ in range(10):
        engine.send_audio(bytes(19200), 0.01)  # 400 ms each; only 2 s are held
    assert engine.actions_to_send() == []
    started = {"voiceSessionId": "vs", "model": "m", "voice": "v", "limits": {}}
    engine.receive_text(json.dumps({"type": "voice.started", "data": started}), 0.1)
    held = engine.actions_to_send()
    assert sum(len(a.data) - 1 for a in held if isinstance(a, SendBytes)) == 96000


@pytest.mark.parametrize(
    "frame",
    [
        bytes([0x02, 1]),  # odd PCM length
        bytes([0x02]) + bytes(MAX_FRAME_BYTES),  # over 16 KB
    ],
)
def test_bad_audio_frames_are_protocol_errors(frame: bytes) -> None:
    engine = ready_engine()
    engine.receive_bytes(frame, 1.0)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.kind == "protocol_error"
    assert engine.actions_to_send() == [CloseConnection(1002, "protocol_error")]


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        '{"type": 5}',
        '{"type": "voice.state", "data": {"state": 3}}',
        '{"type": "voice.transcript", "data": {"role": "user", "text": "x", "final": "yes"}}',
        '{"type": "voice.interrupted", "data": {"itemId": "i"}}',
        '{"type": "voice.ended", "data": {"reason": "user", "usage": {"costMicros": "free"}}}',
        '{"type": "voice.started", "data": "x"}',
        "[" * 100000,
    ],
)
def test_malformed_frames_become_provider_failed(text: str) -> None:
    engine = ready_engine()
    engine.receive_text(text, 1.0)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.kind == "protocol_error"


def test_connection_lost_fails_open_turns() -> None:
    engine = ready_engine()
    engine.open_turn("t1", SETTINGS, 0.0)
    engine.connection_lost(1006, "abnormal", 1.0)
    assert engine.events_received() == [
        ProviderFailed("connection_closed", "connection closed (code 1006): abnormal", ("t1",))
    ]
    assert not engine.ready


def test_our_own_close_of_an_idle_connection_reports_nothing() -> None:
    engine = ready_engine()
    engine.close(1.0)
    assert engine.actions_to_send() == [CloseConnection(1000, "client closing")]
    engine.connection_lost(1000, "", 1.1)
    assert engine.events_received() == []


def test_misuse_raises_local_protocol_error() -> None:
    engine = make_engine()
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t1", SETTINGS, 0.0)  # not connected
    engine = ready_engine()
    engine.open_turn("t1", SETTINGS, 0.0)
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t2", SETTINGS, 0.0)  # one turn at a time
    with pytest.raises(LocalProtocolError):
        engine.start_voice("ptt", "c", 0.0)  # a session already runs
    with pytest.raises(LocalProtocolError):
        engine.stop_voice("bored", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_audio(b"\x00", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_text("nope", "x", 0.0)


def test_empty_turn_is_done_at_once_and_sends_nothing() -> None:
    engine = ready_engine()
    engine.open_turn("t1", SETTINGS, 0.0)
    engine.end_turn("t1", 0.0)
    assert engine.actions_to_send() == []
    assert engine.events_received() == [TurnDone("t1")]


def test_played_sends_now_and_defaults_to_current() -> None:
    engine = ready_engine()
    engine.played("", 480, 2.0)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendText)
    assert json.loads(action.text) == {"type": "voice.played", "itemId": "current", "ms": 480}


def test_turn_opened_while_stopping_restarts_the_session_after_voice_ended() -> None:
    engine = ready_engine()
    engine.stop_voice("background", 1.0)
    engine.open_turn("t1", SETTINGS, 1.1)
    engine.send_text("t1", "Back again.", 1.1)
    engine.end_turn("t1", 1.1)
    sent = [json.loads(a.text) for a in engine.actions_to_send() if isinstance(a, SendText)]
    assert sent == [{"type": "voice.stop", "reason": "background"}]
    usage = {"audioInSeconds": 0, "audioOutSeconds": 0, "costMicros": 0}
    ended = {"type": "voice.ended", "data": {"reason": "user", "usage": usage}}
    engine.receive_text(json.dumps(ended), 1.2)
    assert not of_type(engine.events_received(), TurnFailed)
    restart = [json.loads(a.text) for a in engine.actions_to_send() if isinstance(a, SendText)]
    assert [f["type"] for f in restart] == ["voice.start"]
    started = {"voiceSessionId": "vs2", "model": "m", "voice": "v", "limits": {}}
    engine.receive_text(json.dumps({"type": "voice.started", "data": started}), 1.3)
    (text,) = engine.actions_to_send()
    assert isinstance(text, SendText)
    assert json.loads(text.text) == {"type": "voice.text", "text": "Back again."}


def test_cancel_of_a_reply_streamed_whole_still_reports_what_was_played() -> None:
    """A reply the agent streamed faster than real time is done here while the caller still
    hears it: a barge-in then still sends ``voice.played`` (issue 31), and only that."""
    engine = ready_engine()
    engine.open_turn("t1", SETTINGS, 0.0)
    engine.send_text("t1", "Hello.", 0.0)
    engine.end_turn("t1", 0.0)
    created = {"type": "message.created", "data": {"itemId": "item_7", "role": "assistant"}}
    engine.receive_text(json.dumps(created), 0.1)
    engine.receive_text(json.dumps({"type": "voice.state", "data": {"state": "speaking"}}), 0.1)
    engine.receive_bytes(bytes([0x02]) + b"\x00\x00" * 2400, 0.1)
    engine.receive_text(json.dumps({"type": "voice.state", "data": {"state": "idle"}}), 0.12)
    assert of_type(engine.events_received(), TurnDone) == [TurnDone("t1")]
    engine.actions_to_send()
    engine.set_played_position("", 60)  # what the call heard when the caller cut in
    engine.cancel("t1", 0.2)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendText)
    assert json.loads(action.text) == {"type": "voice.played", "itemId": "item_7", "ms": 60}
    assert engine.events_received() == []  # the turn was done already
    engine.cancel("t1", 0.3)  # reported once
    assert engine.actions_to_send() == []

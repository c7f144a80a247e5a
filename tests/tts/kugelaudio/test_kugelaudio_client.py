"""KugelAudio client engine, driven by recorded frame sequences (``fixtures/*.jsonl``).

The replay helper feeds the fixture's ``in`` frames and the test's commands
at their times, fires the engine's timers at ``next_deadline()``, and checks
that the engine's outbound frames equal the fixture's ``out`` lines (parsed
JSON and times). Time is a number; nothing sleeps.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import tts_replay
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import CloseConnection, Event, LocalProtocolError
from bridge.providers.base import (
    MULAW_8K,
    PCM_8K,
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    UsageReported,
    WordsTimed,
    WordTiming,
)
from bridge.providers.kugelaudio.client import ENGINE, KugelAudioProtocol

FIXTURES = Path(__file__).parent / "fixtures"
PCM_24K = AudioFormat("pcm_s16le", 24000)
API_KEY = "ka-secret-123"
TURN = TurnSettings(voice="1071", audio_format=PCM_24K, model="kugel-3", language="en")

Command = tuple[float, str, tuple[Any, ...]]


def make_engine(**options: str | int | float | bool) -> KugelAudioProtocol:
    merged: dict[str, str | int | float | bool] = {"cfg_scale": 2.0, **options}
    return ENGINE(
        ProviderSettings(
            name="ka",
            protocol="kugelaudio",
            url="wss://api.kugelaudio.com",
            api_key=API_KEY,
            options=tuple(merged.items()),
        )
    )


# ------------------------------------------------------------------ replay


@dataclass
class Replay:
    events: list[tuple[float, Event]]
    inbound: list[tuple[float, Any]]

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for _, e in self.events if isinstance(e, kind)]

    def at(self, kind: type[Event]) -> list[float]:
        return [t for t, e in self.events if isinstance(e, kind)]

    def inbound_audio(self, start: float = 0.0, end: float = 1e9) -> list[bytes]:
        return [
            base64.b64decode(m["audio"])
            for t, m in self.inbound
            if isinstance(m, dict) and "audio" in m and start <= t <= end
        ]


def _ws_close(action: CloseConnection) -> object:
    return {"ws_close": {"code": action.code, "reason": action.reason}}


_action_msg = partial(tts_replay.action_to_msg, close=_ws_close)


def replay(
    engine: KugelAudioProtocol, name: str, commands: list[Command], until: float | None = None
) -> Replay:
    lines = tts_replay.load_jsonl(FIXTURES / f"{name}.jsonl")
    run = tts_replay.replay_steps(
        engine,
        lines,
        [(t, _calls(op, args)) for t, op, args in commands],
        connect=lambda engine, now: engine.connection_made(None, now),
        settle_at_end=False,
        until=until,
        time_digits=6,
        feed_line=partial(tts_replay.feed, close_key="ws_close"),
        to_msg=_action_msg,
    )
    inbound = [(line["t"], line["msg"]) for line in lines if line["dir"] == "in"]
    return Replay(run.events, inbound)


def _calls(op: str, args: tuple[Any, ...]) -> tts_replay.Command:
    """A command calling ``engine.<op>(*args, now)``."""
    return lambda engine, now: getattr(engine, op)(*args, now)


def turn_commands(
    turn_id: str, texts: list[tuple[float, str]], end_at: float | None
) -> list[Command]:
    commands: list[Command] = [(t, "send_text", (turn_id, text)) for t, text in texts]
    if end_at is not None:
        commands.append((end_at, "end_turn", (turn_id,)))
    return commands


# ------------------------------------------------------------ fixture tests


def test_normal_turn_with_word_timestamps() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands(
        "t1", [(0.01, "Hello, "), (0.02, "this is streaming. "), (0.03, "Goodbye.")], 0.04
    )
    r = replay(engine, "normal_turn", commands)

    assert r.of(ConnectionReady) == [ConnectionReady()]
    assert r.of(TurnStarted) == [TurnStarted("t1")]
    assert r.at(TurnStarted) == [0.30]
    audio = r.of(AudioReceived)
    assert [a.audio for a in audio] == r.inbound_audio()
    assert {a.audio_format for a in audio} == {PCM_24K}
    assert r.of(WordsTimed) == [
        WordsTimed(
            "t1",
            (
                WordTiming("Hello,", 0.0, 0.04),
                WordTiming("this", 0.045, 0.06),
                WordTiming("is", 0.06, 0.07),
            ),
        ),
        WordsTimed("t1", (WordTiming("Goodbye.", 0.1, 0.15),)),
    ]
    assert r.of(TurnDone) == [TurnDone("t1")]
    assert r.at(TurnDone) == [0.60]
    (usage,) = r.of(UsageReported)
    assert usage.turn_id == "t1"
    assert usage.usage["audio_seconds"] == 0.15
    assert usage.usage["cost_cents"] == 0.01
    assert usage.usage["total_audio_chunks"] == 3
    assert engine.ready and engine.open_turns() == 0


def test_cancel_drops_late_frames_and_connection_is_reused() -> None:
    engine = make_engine()
    commands: list[Command] = [
        (0.0, "open_turn", ("t1", TURN)),
        (0.01, "send_text", ("t1", "Tell me a long story. ")),
        (0.30, "cancel", ("t1",)),
        (0.40, "open_turn", ("t2", TURN)),  # same settings: no config (sticky)
        (0.41, "send_text", ("t2", "Okay.")),
        (0.42, "end_turn", ("t2",)),
    ]
    r = replay(engine, "cancel_then_next_turn", commands)

    t1_audio = [e for e in r.of(AudioReceived) if e.turn_id == "t1"]
    assert [a.audio for a in t1_audio] == r.inbound_audio(end=0.30)
    late = [e for t, e in r.events if 0.30 < t < 0.34]
    assert late == []
    assert r.of(TurnDone) == [TurnDone("t1", cancelled=True), TurnDone("t2")]
    assert r.at(TurnDone) == [0.34, 0.70]
    t2_audio = [e.audio for e in r.of(AudioReceived) if e.turn_id == "t2"]
    assert t2_audio == r.inbound_audio(start=0.6)
    assert r.of(TurnFailed) == [] and r.of(ProviderFailed) == []


def test_turn_error_fails_the_turn_and_resyncs_with_cancel() -> None:
    engine = make_engine()
    commands: list[Command] = [
        (0.0, "open_turn", ("t1", TurnSettings("9999", PCM_24K, "kugel-3", "en")))
    ]
    commands += turn_commands("t1", [(0.01, "Hi.")], 0.02)
    commands += [(0.20, "open_turn", ("t2", TURN))]  # config sent again in full
    commands += turn_commands("t2", [(0.21, "Hi.")], 0.22)
    r = replay(engine, "turn_error", commands)

    assert r.of(TurnFailed) == [TurnFailed("t1", "NOT_FOUND", "Voice not found", retryable=True)]
    assert r.of(TurnDone) == [TurnDone("t2")]
    assert [e.turn_id for e in r.of(AudioReceived)] == ["t2"]
    assert r.of(ProviderFailed) == []


def test_connection_error_frame_fails_the_connection_once() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN)), (0.01, "send_text", ("t1", "Hi."))]
    r = replay(engine, "connection_error", commands)

    assert r.of(ProviderFailed) == [ProviderFailed("UNAUTHORIZED", "Unauthorized", ("t1",))]
    assert not engine.ready


def test_connection_lost_mid_turn_lists_the_turn() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands("t1", [(0.01, "Hi there.")], 0.02)
    r = replay(engine, "connection_lost", commands)

    (failed,) = r.of(ProviderFailed)
    assert failed.kind == "connection_closed" and failed.turn_ids == ("t1",)
    assert "1011" in failed.message
    assert r.of(TurnDone) == []
    assert not engine.ready


def test_malformed_frame_fails_connection_unknown_and_binary_ignored() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN)), (0.01, "send_text", ("t1", "Hi."))]
    r = replay(engine, "malformed", commands)

    assert [e for t, e in r.events if 0.0 < t < 0.12] == []  # binary + unknown ignored
    (failed,) = r.of(ProviderFailed)
    assert failed.kind == "protocol_error" and failed.turn_ids == ("t1",)
    assert r.of(AudioReceived) == []  # the frame after the failure is not delivered


def test_idle_flush_timer_splits_the_turn_into_two_sessions() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands("t1", [(0.10, "Let me check that for you"), (6.0, "Found it.")], 6.1)
    r = replay(engine, "idle_flush", commands)  # the flush at 4.10 comes from the timer

    assert r.of(TurnDone) == [TurnDone("t1")]
    assert r.at(TurnDone) == [6.50]
    second = r.of(WordsTimed)[1]
    assert second.words == (WordTiming("Found", 0.1, 0.12), WordTiming("it.", 0.12, 0.15))
    assert [u.turn_id for u in r.of(UsageReported)] == ["t1", "t1"]


def test_server_idle_auto_flush_warning_is_understood() -> None:
    engine = make_engine(idle_flush_s=0)
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands("t1", [(0.10, "Let me check")], 6.0)
    r = replay(engine, "server_auto_flush", commands)  # no flush is sent at 6.0

    assert r.of(TurnDone) == [TurnDone("t1")]
    assert r.at(TurnDone) == [6.0]
    assert len(r.of(AudioReceived)) == 1
    assert engine.ready


def test_mulaw_turn_asks_for_8khz_pcm() -> None:
    engine = make_engine()
    settings = TurnSettings("1071", MULAW_8K, "kugel-3", "en")
    commands: list[Command] = [(0.0, "open_turn", ("t1", settings))]
    commands += turn_commands("t1", [(0.01, "Press one.")], 0.02)
    r = replay(engine, "mulaw_request", commands)

    (audio,) = r.of(AudioReceived)
    assert audio.audio_format == PCM_8K
    assert audio.audio == r.inbound_audio()[0]


def test_settings_changes_use_update_settings_or_a_fresh_config() -> None:
    engine = make_engine()
    german = TurnSettings("1071", PCM_24K, "kugel-3", "de", speed=1.1)
    other_voice = TurnSettings("268", PCM_24K, "kugel-3", "de", speed=1.1)
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands("t1", [(0.01, "One.")], 0.02)
    commands += [(1.0, "open_turn", ("t2", german))]
    commands += turn_commands("t2", [(1.10, "Zwei.")], 1.11)
    commands += [(2.0, "open_turn", ("t3", other_voice))]
    commands += turn_commands("t3", [(2.01, "Drei.")], None)
    r = replay(engine, "update_settings", commands)

    assert r.of(TurnDone) == [TurnDone("t1"), TurnDone("t2")]
    assert r.of(TurnFailed) == []


def test_chunk_relative_timestamps_are_offset_by_the_chunk_start() -> None:
    engine = make_engine()
    commands: list[Command] = [(0.0, "open_turn", ("t1", TURN))]
    commands += turn_commands("t1", [(0.01, "First part. Second part.")], 0.02)
    r = replay(engine, "chunk_relative_timestamps", commands)

    assert [w.words for w in r.of(WordsTimed)] == [
        (WordTiming("First", 0.0, 0.04), WordTiming("part.", 0.04, 0.1)),
        (WordTiming("Second", 0.1, 0.15), WordTiming("part.", 0.15, 0.2)),
    ]


# --------------------------------------------------------------- unit tests


def opened(**options: str | int | float | bool) -> KugelAudioProtocol:
    engine = make_engine(**options)
    engine.connection_made(None, 0.0)
    engine.events_received()
    return engine


def texts(engine: KugelAudioProtocol) -> list[Any]:
    return [_action_msg(a) for a in engine.actions_to_send()]


def test_connect_params_put_the_key_in_the_query_only() -> None:
    params = make_engine().connect_params()
    assert params.url == f"wss://api.kugelaudio.com/ws/tts/stream?api_key={API_KEY}"
    assert params.headers == () and params.subprotocols == ()
    engine = ENGINE(
        ProviderSettings("ka", "kugelaudio", "ws://127.0.0.1:9000/ws/tts/stream?x=1", "a b")
    )
    assert engine.connect_params().url == "ws://127.0.0.1:9000/ws/tts/stream?x=1&api_key=a+b"


def test_api_key_is_scrubbed_from_error_messages() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    msg = {"error": f"bad key {API_KEY}", "error_code": "RATE_LIMITED", "code": 429}
    engine.receive_text(json.dumps(msg), 0.1)
    (failed,) = [e for e in engine.events_received() if isinstance(e, TurnFailed)]
    assert API_KEY not in failed.message and failed.retryable
    engine.connection_lost(1006, f"gone {API_KEY}", 0.2)
    (lost,) = engine.events_received()
    assert isinstance(lost, ProviderFailed) and API_KEY not in lost.message


def test_validation_error_is_not_retryable() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    msg = {"error": "Invalid request", "error_code": "VALIDATION_ERROR", "code": 400}
    engine.receive_text(json.dumps(msg), 0.1)
    assert engine.events_received() == [
        TurnFailed("t1", "VALIDATION_ERROR", "Invalid request", retryable=False)
    ]


def test_open_turn_refused_unless_ready() -> None:
    engine = make_engine()
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t1", TURN, 0.0)  # not connected yet
    engine.connection_made(None, 0.0)
    engine.open_turn("t1", TURN, 0.0)
    assert not engine.ready and engine.open_turns() == 1
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t2", TURN, 0.0)  # one turn per connection


def test_connection_busy_until_session_closed() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    engine.end_turn("t1", 0.0)
    engine.receive_text(json.dumps({"final": True}), 0.5)
    assert engine.events_received()[-1] == TurnDone("t1")
    assert not engine.ready and engine.open_turns() == 1
    engine.cancel("t1", 0.55)  # nothing left to cancel
    engine.receive_text(json.dumps({"session_closed": True, "usage": {"cost_cents": None}}), 0.6)
    assert engine.events_received() == [UsageReported("t1", {"cost_cents": None})]
    assert engine.ready and engine.open_turns() == 0
    assert texts(engine)[-1] == {"flush": True}


def test_empty_turn_is_done_without_traffic() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.end_turn("t1", 0.1)
    assert engine.events_received() == [TurnStarted("t1"), TurnDone("t1")]
    assert [m for m in texts(engine) if "voice_id" not in m] == []
    assert engine.ready


def test_response_timeout_then_unacknowledged_cancel() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    engine.end_turn("t1", 1.0)
    texts(engine)
    assert engine.next_deadline() == 16.0
    engine.handle_timer(16.0)
    (failed,) = engine.events_received()
    assert isinstance(failed, TurnFailed) and failed.kind == "timeout"
    assert texts(engine) == [{"cancel": True}]
    assert engine.next_deadline() == 21.0
    engine.handle_timer(21.0)
    (lost,) = engine.events_received()
    assert isinstance(lost, ProviderFailed) and lost.kind == "timeout"
    assert lost.turn_ids == ()  # t1 already got its TurnFailed
    assert isinstance(engine.actions_to_send()[-1], CloseConnection)
    assert engine.next_deadline() is None


def test_cancel_then_connection_lost_reports_the_turn() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    engine.cancel("t1", 0.1)
    assert engine.next_deadline() == pytest.approx(5.1)
    engine.connection_lost(1006, "", 0.2)
    (lost,) = engine.events_received()
    assert isinstance(lost, ProviderFailed) and lost.turn_ids == ("t1",)


def test_close_of_a_connection_that_never_carried_a_turn_is_a_websocket_close() -> None:
    """The protocol's first message is the config: a pooled spare closed before any turn
    sends nothing at all, just the WebSocket close (issue 31)."""
    engine = opened()
    engine.close(1.0)
    assert texts_and_close(engine) == [("close", 1000)]
    assert not engine.ready
    assert engine.next_deadline() is None
    engine.close(1.05)  # a second close changes nothing
    assert engine.actions_to_send() == []
    engine.connection_lost(1000, "", 1.1)
    assert engine.events_received() == []


def test_close_when_idle_after_a_turn_sends_close_socket_and_closes() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Hi.", 0.0)
    engine.end_turn("t1", 0.0)
    engine.receive_text(json.dumps({"final": True}), 0.3)
    engine.receive_text(json.dumps({"session_closed": True}), 0.31)
    assert engine.ready
    first = texts_and_close(engine)
    assert "voice_id" in first[0]  # the config went first
    engine.close(1.0)
    assert texts_and_close(engine) == [{"close_socket": True}, ("close", 1000)]
    engine.connection_lost(1000, "", 1.1)
    assert [type(e) for e in engine.events_received()] == [TurnStarted, TurnDone, UsageReported]


def test_close_with_an_open_turn_finishes_it_first() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.send_text("t1", "Bye.", 0.0)
    engine.close(0.1)
    assert texts_and_close(engine)[-2:] == [{"flush": True}, {"close_socket": True}]
    engine.receive_text(json.dumps({"final": True}), 0.3)
    engine.receive_text(json.dumps({"session_closed": True}), 0.31)
    assert texts_and_close(engine) == [("close", 1000)]
    assert [type(e) for e in engine.events_received()] == [TurnStarted, TurnDone, UsageReported]


def texts_and_close(engine: KugelAudioProtocol) -> list[Any]:
    out: list[Any] = []
    for action in engine.actions_to_send():
        if isinstance(action, CloseConnection):
            out.append(("close", action.code))
        else:
            out.append(_action_msg(action))
    return out


def test_unknown_encoding_fails_the_turn() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    texts(engine)
    frame = {"audio": "AAAA", "enc": "mp3", "sr": 44100, "idx": 0, "chunk_id": 0}
    engine.receive_text(json.dumps(frame), 0.1)
    (failed,) = engine.events_received()
    assert isinstance(failed, TurnFailed) and failed.kind == "unsupported_encoding"
    assert texts(engine) == [{"cancel": True}]


@pytest.mark.parametrize(
    "frame",
    [
        '["audio"]',
        '"final"',
        json.dumps({"audio": "%%%", "enc": "pcm_s16le", "sr": 24000}),
        json.dumps({"audio": "AAAA", "enc": "pcm_s16le", "sr": 24000}),  # 3 bytes: odd
        json.dumps({"audio": "AAAA", "enc": "pcm_s16le", "sr": "24000"}),
        json.dumps({"audio": "AAAA", "enc": "pcm_s16le", "sr": 24000, "idx": "0"}),
        json.dumps({"audio": 5, "enc": "pcm_s16le", "sr": 24000}),
        json.dumps({"audio": "\x80"}),  # non-ASCII base64 (found by Hypothesis)
        json.dumps({"word_timestamps": "Hello"}),
    ],
)
def test_malformed_frames_become_provider_failed(frame: str) -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    engine.receive_text(frame, 0.1)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.kind == "protocol_error"
    assert failed.turn_ids == ("t1",)


def test_bad_word_entries_are_skipped() -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    entries = [{"word": "ok", "start_ms": 0, "end_ms": 10}, {"word": 1}, "x", {"word": "b"}]
    engine.receive_text(json.dumps({"word_timestamps": entries, "chunk_id": 0}), 0.1)
    assert engine.events_received() == [WordsTimed("t1", (WordTiming("ok", 0.0, 0.01),))]


def test_options_and_extra_reach_the_config() -> None:
    engine = opened(dictionary_ids="3, 4", project_id=7, normalize="false", idle_flush_s=2.5)
    settings = TurnSettings("joe", PCM_24K, extra=(("max_new_tokens", "512"),))
    engine.open_turn("t1", settings, 0.0)
    (config,) = texts(engine)
    assert config == {
        "voice_id": "joe",
        "sample_rate": 24000,
        "word_timestamps": True,
        "cfg_scale": 2.0,
        "dictionary_ids": [3, 4],
        "project_id": 7,
        "normalize": False,
        "max_new_tokens": 512,
    }
    engine.send_text("t1", "x", 1.0)
    assert engine.next_deadline() == 3.5


def test_bad_option_is_a_local_error() -> None:
    engine = opened(max_buffer_length="lots")
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t1", TURN, 0.0)


def test_unsupported_rate_falls_back_to_the_configured_rate() -> None:
    engine = opened(sample_rate=16000)
    engine.open_turn("t1", TurnSettings("1071", AudioFormat("pcm_s16le", 48000)), 0.0)
    assert texts(engine)[0]["sample_rate"] == 16000


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = st.sampled_from(
    [
        "audio",
        "enc",
        "sr",
        "idx",
        "chunk_id",
        "word_timestamps",
        "final",
        "session_closed",
        "interrupted",
        "error",
        "error_code",
        "warning",
        "usage",
        "generation_started",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_KEYS, _JSON, max_size=4) | st.text(max_size=20), max_size=6))
def test_fuzzed_frames_never_raise(frames: list[Any]) -> None:
    engine = opened()
    engine.open_turn("t1", TURN, 0.0)
    for i, frame in enumerate(frames):
        engine.receive_text(frame if isinstance(frame, str) else json.dumps(frame), 0.1 * i)
        for event in engine.events_received():
            assert API_KEY not in repr(event)
    engine.actions_to_send()

"""The Kova client engine replayed against recorded frame sequences (fixtures/*.jsonl)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bridge.engine import CloseConnection, LocalProtocolError, SendText
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
from bridge.providers.kova.client import ENGINE, KovaProtocol

PCM_16K = AudioFormat("pcm_s16le", 16000)


def connected(kova: Any, **options: str | int | float | bool) -> KovaProtocol:
    engine: KovaProtocol = kova.make_client(**options)
    engine.connection_made(None, 0.0)
    assert engine.events_received() == [ConnectionReady()]
    assert engine.ready
    return engine


def b64(text: str) -> bytes:
    return base64.b64decode(text)


def test_module_exposes_engine() -> None:
    assert ENGINE is KovaProtocol
    assert KovaProtocol.protocol_name == "kova"
    assert KovaProtocol.max_turns >= 16


def test_connect_params_carry_bearer_key(kova: Any) -> None:
    engine = kova.make_client()
    params = engine.connect_params()
    assert params.url == "wss://kova.example/v1/ws"
    assert params.headers == (("Authorization", f"Bearer {kova.API_KEY}"),)
    assert params.subprotocols == ()
    assert engine.session_request() is None


def test_normal_turn_with_timestamps(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "normal_turn.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now)),
            (0.0, lambda e, now: e.send_text("t1", "Welcome to Kova. ", now)),
            (0.01, lambda e, now: e.end_turn("t1", now)),
        ],
    )
    assert events == [
        (0.05, TurnStarted("t1", provider_ref="c1")),
        (0.1, AudioReceived("t1", b64("AAABAAIAAwA="), PCM_16K)),
        (
            0.1,
            WordsTimed("t1", (WordTiming("Welcome", 0.0, 0.35), WordTiming("to", 0.35, 0.5))),
        ),
        (0.15, AudioReceived("t1", b64("CAkKCwwNDg8="), PCM_16K)),
        (0.15, WordsTimed("t1", (WordTiming("Kova.", 0.5, 0.9),))),
        (0.2, TurnDone("t1")),
    ]
    assert engine.open_turns() == 0
    assert engine.next_deadline() is None


def test_cancel_mid_utterance_drops_late_frames(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "cancel_mid_utterance.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(MULAW_8K), now)),
            (0.0, lambda e, now: e.send_text("t1", "Hello there, how can I help you today? ", now)),
            (0.2, lambda e, now: e.cancel("t1", now)),
            (0.31, lambda e, now: e.cancel("t1", now)),  # a second cancel sends nothing
        ],
    )
    assert events == [
        (0.05, TurnStarted("t1", provider_ref="c1")),
        (0.1, AudioReceived("t1", b"\xff" * 8, MULAW_8K)),
        (
            0.12,
            WordsTimed("t1", (WordTiming("Hello", 0.0, 0.3), WordTiming("there,", 0.3, 0.6))),
        ),
        (0.3, TurnDone("t1", cancelled=True)),
    ]
    assert not [e for t, e in events if t > 0.2 and isinstance(e, AudioReceived)]
    assert engine.open_turns() == 0


def test_per_turn_errors_keep_the_connection(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "turn_errors.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K, voice="nobody"), now)),
            (0.0, lambda e, now: e.send_text("t1", "Hi. ", now)),
            (0.1, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
            (0.1, lambda e, now: e.send_text("t2", "Fine. ", now)),
            (0.1, lambda e, now: e.end_turn("t2", now)),
        ],
    )
    assert events == [
        (0.02, TurnFailed("t1", "error", "unknown voice: nobody")),
        (0.15, TurnStarted("t2", provider_ref="c2")),
        (0.2, AudioReceived("t2", b64("AAABAAIAAwA="), PCM_16K)),
        (0.25, TurnFailed("t2", "error", "synthesis failed: engine crashed")),
    ]
    assert engine.ready
    assert engine.open_turns() == 0


def test_unattributed_error_fails_the_connection(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "connection_error.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now)),
            (0.0, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
        ],
    )
    assert events == [
        (0.05, TurnStarted("t1", provider_ref="c1")),
        (0.1, ProviderFailed("error", "provider error: server overloaded", ("t1", "t2"))),
    ]
    assert not engine.ready
    engine.connection_lost(1002, "error", 0.3)
    assert engine.events_received() == []  # already reported once
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t3", kova.turn(PCM_16K), 0.4)


def test_connection_lost_lists_open_turns_only(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "connection_lost.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now)),
            (0.0, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
            (0.0, lambda e, now: e.end_turn("t2", now)),
            (0.2, lambda e, now: e.connection_lost(1006, "", now)),
        ],
    )
    assert events[-2:] == [
        (0.1, TurnDone("t2")),
        (
            0.2,
            ProviderFailed("connection_closed", "connection closed (code=1006 reason='')", ("t1",)),
        ),
    ]
    assert not engine.ready


def test_malformed_input_never_raises(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "malformed.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now)),
            (0.2, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
            (0.3, lambda e, now: e.open_turn("t3", kova.turn(PCM_16K), now)),
        ],
    )
    kinds = [(t, type(e).__name__, getattr(e, "kind", "")) for t, e in events]
    assert kinds == [
        (0.05, "TurnStarted", ""),
        (0.09, "AudioReceived", ""),
        (0.1, "TurnFailed", "malformed_frame"),
        (0.21, "TurnStarted", ""),
        (0.22, "TurnFailed", "malformed_frame"),
        (0.35, "ProviderFailed", "malformed_frame"),
    ]
    failed = events[-1][1]
    assert isinstance(failed, ProviderFailed) and failed.turn_ids == ("t3",)


def test_audio_before_context_started_breaks_ordering_rule_1(kova: Any) -> None:
    engine = connected(kova)
    events = kova.replay(
        engine,
        "audio_before_start.jsonl",
        [(0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now))],
    )
    assert len(events) == 1
    t, event = events[0]
    assert t == 0.05 and isinstance(event, TurnFailed)
    assert event.kind == "malformed_frame" and "ordering rule 1" in event.message
    assert engine.open_turns() == 0  # the error while closing released it


def test_timers_expire_unanswered_contexts(kova: Any) -> None:
    engine = connected(kova)

    def check_deadline(expected: float) -> Any:
        def command(e: KovaProtocol, now: float) -> None:
            assert e.next_deadline() == pytest.approx(expected)

        return command

    events = kova.replay(
        engine,
        "timeouts.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(PCM_16K), now)),
            (0.0, check_deadline(10.0)),
            (15.0, lambda e, now: None),
            (20.0, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
            (20.1, lambda e, now: e.end_turn("t2", now)),
            (20.1, check_deadline(30.1)),
            (36.0, lambda e, now: None),
            (40.0, lambda e, now: e.open_turn("t3", kova.turn(PCM_16K), now)),
            (40.1, lambda e, now: e.cancel("t3", now)),
            (40.1, check_deadline(45.1)),
            (45.1, lambda e, now: None),
        ],
    )
    assert events == [
        (10.0, TurnFailed("t1", "timeout", "no context_started in time")),
        (20.05, TurnStarted("t2", provider_ref="c2")),
        (21.0, AudioReceived("t2", b64("AAABAAIAAwA="), PCM_16K)),
        (31.0, TurnFailed("t2", "timeout", "no frame for the flushed context in time")),
        (45.1, TurnDone("t3", cancelled=True)),
    ]
    assert engine.open_turns() == 0
    assert engine.next_deadline() is None


def test_interleaved_contexts_formats_and_sample_carry(kova: Any) -> None:
    engine = connected(kova)
    pcm_24k = AudioFormat("pcm_s16le", 24000)
    pcm_22k = AudioFormat("pcm_s16le", 22050)
    events = kova.replay(
        engine,
        "interleaved.jsonl",
        [
            (0.0, lambda e, now: e.open_turn("t1", kova.turn(pcm_24k), now)),
            (0.0, lambda e, now: e.open_turn("t2", kova.turn(PCM_16K), now)),
            (0.13, lambda e, now: e.end_turn("t1", now)),
            (0.13, lambda e, now: e.end_turn("t2", now)),
        ],
    )
    assert events == [
        (0.05, TurnStarted("t2", provider_ref="c2")),
        (0.06, TurnStarted("t1", provider_ref="c1")),
        (0.1, AudioReceived("t1", b"\x10\x00", pcm_24k)),
        (0.11, AudioReceived("t2", b64("AAABAAIAAwA="), pcm_22k)),
        (0.12, AudioReceived("t1", b"\x20\x00\x30\x00", pcm_24k)),
        (0.21, TurnDone("t2")),
        (0.22, TurnDone("t1")),
    ]
    assert engine.open_turns() == 0


def test_g711_at_other_rates_asks_for_pcm(kova: Any) -> None:
    engine = connected(kova)
    engine.open_turn("t1", kova.turn(AudioFormat("alaw", 16000)), 0.0)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendText)
    assert '"response_format":{"encoding":"pcm","sample_rate":16000}' in action.text


def test_alaw_8k_passes_through(kova: Any) -> None:
    engine = connected(kova)
    alaw = AudioFormat("alaw", 8000)
    engine.open_turn("t1", kova.turn(alaw, timestamps=False), 0.0)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendText)
    assert '"timestamps":false' in action.text
    assert '"response_format":{"encoding":"alaw","sample_rate":8000}' in action.text
    engine.receive_text('{"context_started": {}, "context_id": "c1"}', 0.1)
    engine.receive_text('{"audio_chunk": "1dXV", "context_id": "c1"}', 0.2)
    assert engine.events_received()[-1] == AudioReceived("t1", b"\xd5\xd5\xd5", alaw)


def test_unsupported_echoed_encoding_fails_the_turn(kova: Any) -> None:
    engine = connected(kova)
    engine.open_turn("t1", kova.turn(PCM_16K), 0.0)
    engine.actions_to_send()
    engine.receive_text(
        '{"context_started": {"response_format": {"encoding": "mp3"}}, "context_id": "c1"}', 0.1
    )
    assert engine.events_received() == [
        TurnFailed("t1", "unsupported_encoding", "server chose mp3")
    ]
    assert [a.text for a in engine.actions_to_send() if isinstance(a, SendText)] == [
        '{"close_context":true,"context_id":"c1"}'
    ]


def test_api_key_never_surfaces(kova: Any) -> None:
    engine = connected(kova)
    engine.open_turn("t1", kova.turn(PCM_16K), 0.0)
    engine.receive_text(f'{{"error": "bad key {kova.API_KEY} for voice", "context_id": "c1"}}', 0.1)
    engine.receive_text(f'{{"error": "key {kova.API_KEY} revoked"}}', 0.2)
    events = engine.events_received()
    assert len(events) == 2
    for event in events:
        assert kova.API_KEY not in repr(event)
    assert kova.API_KEY not in repr(engine.actions_to_send())


def test_command_misuse(kova: Any) -> None:
    engine = kova.make_client()
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t1", kova.turn(PCM_16K), 0.0)  # not connected yet
    engine.connection_made(None, 0.0)
    engine.open_turn("t1", kova.turn(PCM_16K), 0.0)
    with pytest.raises(LocalProtocolError):
        engine.open_turn("t1", kova.turn(PCM_16K), 0.0)
    engine.end_turn("t1", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_text("t1", "more", 0.0)
    engine.actions_to_send()
    engine.send_text("unknown", "text", 0.0)
    engine.end_turn("unknown", 0.0)
    engine.cancel("unknown", 0.0)
    engine.send_text("t1", "", 0.0)
    assert engine.actions_to_send() == []


def test_max_turns_is_enforced(kova: Any) -> None:
    engine = connected(kova)
    for n in range(KovaProtocol.max_turns):
        engine.open_turn(f"t{n}", kova.turn(PCM_16K), 0.0)
    assert engine.open_turns() == KovaProtocol.max_turns
    with pytest.raises(LocalProtocolError):
        engine.open_turn("one-too-many", kova.turn(PCM_16K), 0.0)


def test_close_releases_contexts_then_socket(kova: Any) -> None:
    engine = connected(kova)
    engine.open_turn("t1", kova.turn(PCM_16K), 0.0)
    engine.actions_to_send()
    engine.close(1.0)
    actions = engine.actions_to_send()
    assert [getattr(a, "text", None) for a in actions[:1]] == [
        '{"close_context":true,"context_id":"c1"}'
    ]
    assert type(actions[-1]).__name__ == "CloseConnection"
    assert not engine.ready
    engine.connection_lost(1000, "", 1.1)
    (failed,) = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.turn_ids == ("t1",)


def test_clean_close_without_turns_is_silent(kova: Any) -> None:
    engine = connected(kova)
    engine.close(1.0)
    assert engine.actions_to_send() == [CloseConnection(1000, "client closing")]
    engine.connection_lost(1000, "", 1.1)
    assert engine.events_received() == []
    assert not engine.ready

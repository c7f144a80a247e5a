"""The zwst client engine against recorded frame sequences (``fixtures/*.jsonl``).

Each fixture line is ``{"t": s, "dir": "in"|"out", "msg": ...}``: ``in`` is
what the gateway sent (a JSON frame, ``{"b64": ...}`` for a binary frame,
``{"raw": ...}`` for text that is not JSON, ``{"close": {code, reason}}`` for
the socket closing), ``out`` is what the client must send (JSON frames, or
``{"close": ...}`` for a close it initiates). Commands (open_turn, send_text,
end_turn, cancel) come from the test at given times, before the ``in`` lines
of the same time. Timers fire at their deadlines in between. The replay
compares every outbound frame, with its time, to the ``out`` lines.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tts_replay
from tts_replay import pcm

from bridge.engine import CloseConnection, Event, LocalProtocolError, SendText
from bridge.providers.base import (
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    HttpRequest,
    ProviderFailed,
    ProviderSettings,
    QueueDepthChanged,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.zwst.client import (
    ENGINE,
    HeaderByteOrderSwitched,
    ProviderNoticed,
    ZwstProtocol,
    pool_key,
    settings_for,
)

FIXTURES = Path(__file__).parent / "fixtures"
API_KEY = "sk-zwst-secret-0123456789"
PCM_24K = AudioFormat("pcm_s16le", 24000)

Command = Callable[[ZwstProtocol, float], None]


def make_settings(**options: str | int | float | bool) -> ProviderSettings:
    opts = {"sample_rate": 24000, **options}
    return ProviderSettings(
        name="zwst-test",
        protocol="zwst",
        url="https://gw.zwst.test",
        api_key=API_KEY,
        voice="maichi",
        options=tuple(opts.items()),
    )


def turn_settings(speed: float | None = None, words: bool = True) -> TurnSettings:
    return TurnSettings(voice="maichi", audio_format=PCM_24K, speed=speed, word_timestamps=words)


def connected(settings: ProviderSettings | None = None) -> ZwstProtocol:
    engine = ZwstProtocol(settings or make_settings())
    engine.session_request()
    url = "wss://gw.zwst.test/v1/stream?token=zwst_1.abc.def&voice_id=maichi"
    engine.session_response(200, json.dumps({"url": url, "token": "zwst_1.abc.def"}).encode(), 0.0)
    engine.connection_made(None, 0.0)
    assert engine.events_received() == [ConnectionReady()]
    assert engine.actions_to_send() == []
    return engine


@dataclass
class Replay:
    engine: ZwstProtocol
    sent: list[tuple[float, object]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


def replay(
    name: str,
    commands: list[tuple[float, Command]],
    engine: ZwstProtocol | None = None,
) -> Replay:
    """Drive a connected engine through ``fixtures/name`` and check its ``out`` lines."""
    engine = engine or connected()
    lines = tts_replay.load_jsonl(FIXTURES / name)
    run = tts_replay.replay_steps(engine, lines, commands)
    return Replay(engine, run.sent, [e for _, e in run.events])


def open_and_say(turn_id: str, text: str, speed: float | None = None) -> Command:
    def command(engine: ZwstProtocol, now: float) -> None:
        engine.open_turn(turn_id, turn_settings(speed), now)
        engine.send_text(turn_id, text, now)

    return command


def say(turn_id: str, text: str) -> Command:
    return lambda engine, now: engine.send_text(turn_id, text, now)


def end(turn_id: str) -> Command:
    return lambda engine, now: engine.end_turn(turn_id, now)


def cancel(turn_id: str) -> Command:
    return lambda engine, now: engine.cancel(turn_id, now)


# ------------------------------------------------------------------- tests


def test_normal_turn_end_to_end() -> None:
    run = replay(
        "normal_turn.jsonl",
        [
            (0.0, open_and_say("t1", "Xin chào.")),
            (0.1, say("t1", "Tôi có thể giúp gì cho bạn?")),
            (0.3, end("t1")),
        ],
    )
    assert run.events == [
        TurnStarted("t1", provider_ref="c1"),
        QueueDepthChanged("t1", 0),
        WordsTimed("t1", (WordTiming("Xin", 0.04, 0.29), WordTiming("chào", 0.31, 0.72))),
        AudioReceived("t1", pcm(100, -100, 200, -200), PCM_24K),
        AudioReceived("t1", pcm(300, -300), PCM_24K),
        WordsTimed("t1", (WordTiming("Tôi", 0.98, 1.15), WordTiming("có", 1.2, 1.4))),
        AudioReceived("t1", pcm(400, -400, 500), PCM_24K),
        TurnDone("t1"),
    ]
    assert run.engine.open_turns() == 0


def test_cancel_mid_utterance_drops_late_frames() -> None:
    run = replay(
        "cancel_late_frames.jsonl",
        [
            (0.0, open_and_say("t1", "Một câu rất dài sắp bị ngắt.")),
            (0.3, cancel("t1")),
            (0.5, open_and_say("t2", "Vâng?")),
        ],
    )
    audio = [e for e in run.of(AudioReceived) if isinstance(e, AudioReceived)]
    assert [(a.turn_id, a.audio) for a in audio] == [("t1", pcm(1, 2, 3, 4)), ("t2", pcm(9, 10))]
    assert run.of(WordsTimed) == []
    assert run.of(TurnDone) == [TurnDone("t1", cancelled=True), TurnDone("t2")]
    # the cancelled turn's done arrives right at the cancel, before any late frame
    assert run.events.index(TurnDone("t1", cancelled=True)) == 3


def test_per_turn_error_keeps_the_socket() -> None:
    run = replay(
        "turn_error.jsonl",
        [(0.0, open_and_say("t1", "Xin chào.")), (1.0, open_and_say("t2", "Thử lại."))],
    )
    assert run.of(TurnFailed) == [
        TurnFailed("t1", "provider_error", "synthesis failed: worker out of memory")
    ]
    assert run.of(ProviderNoticed) == [ProviderNoticed("error", "unknown message type 'x'")]
    assert [
        (e.turn_id, e.audio) for e in run.of(AudioReceived) if isinstance(e, AudioReceived)
    ] == [("t2", pcm(2, 2))]
    assert run.of(TurnDone) == [TurnDone("t2")]
    assert run.of(ProviderFailed) == []
    assert run.engine.ready


def test_close_4003_segment_too_long() -> None:
    engine = connected(make_settings(segment_mode="none"))
    run = replay("close_segment_too_long.jsonl", [(0.0, open_and_say("t1", "Một đoạn."))], engine)
    failed = run.of(ProviderFailed)
    assert len(failed) == 1 and isinstance(failed[0], ProviderFailed)
    assert (failed[0].kind, failed[0].turn_ids, failed[0].retryable) == (
        "segment_too_long",
        ("t1",),
        False,
    )
    assert not run.engine.ready


def test_segment_mode_none_falls_back_to_auto_over_the_limit() -> None:
    engine = connected(make_settings(segment_mode="none", max_segment_chars=10))
    engine.open_turn("t1", turn_settings(), 0.0)
    engine.send_text("t1", "short", 0.0)
    engine.send_text("t1", "much longer than ten characters", 0.0)
    modes = [
        json.loads(a.text)["segment_mode"]
        for a in engine.actions_to_send()
        if isinstance(a, SendText)
    ]
    assert modes == ["none", "auto"]


def test_close_1008_names_its_cause() -> None:
    run = replay("close_slow_reader.jsonl", [(0.0, open_and_say("t1", "Xin chào."))])
    failed = run.of(ProviderFailed)
    assert len(failed) == 1 and isinstance(failed[0], ProviderFailed)
    assert (failed[0].kind, failed[0].turn_ids) == ("slow_reader", ("t1",))
    assert "1008" in failed[0].message


@pytest.mark.parametrize(
    "fixture",
    ["malformed_json.jsonl", "malformed_fields.jsonl", "malformed_audio.jsonl"],
)
def test_malformed_input_fails_the_connection_without_raising(fixture: str) -> None:
    run = replay(fixture, [(0.0, open_and_say("t1", "Xin chào."))])
    failed = run.of(ProviderFailed)
    assert len(failed) == 1 and isinstance(failed[0], ProviderFailed)
    assert (failed[0].kind, failed[0].turn_ids) == ("protocol_error", ("t1",))
    assert run.of(AudioReceived) == [] and run.of(TurnDone) == []
    assert not run.engine.ready


def test_unknown_messages_and_fields_are_ignored() -> None:
    run = replay("unknown_messages.jsonl", [(0.0, open_and_say("t1", "Xin chào."))])
    assert run.events == [
        TurnStarted("t1", provider_ref="c1"),
        ProviderNoticed("resumed", "session rebound to another worker"),
        QueueDepthChanged("t1", 0),
        AudioReceived("t1", pcm(7, -7), PCM_24K),
        TurnDone("t1"),
    ]


def test_heartbeat_every_20_s_and_pong_timeout() -> None:
    run = replay("heartbeat.jsonl", [])
    failed = run.of(ProviderFailed)
    assert len(failed) == 1 and isinstance(failed[0], ProviderFailed)
    assert failed[0].kind == "heartbeat_timeout"
    assert run.engine.next_deadline() is None


def test_header_byte_order_is_verified_and_switched() -> None:
    run = replay("little_endian_header.jsonl", [(0.0, open_and_say("t1", "Xin chào."))])
    switched = run.of(HeaderByteOrderSwitched)
    assert len(switched) == 1 and isinstance(switched[0], HeaderByteOrderSwitched)
    assert switched[0].byte_order == "little"
    audio = [e.audio for e in run.of(AudioReceived) if isinstance(e, AudioReceived)]
    assert audio == [pcm(10, 11), pcm(12, 13), pcm(14, 15)]
    assert run.events[-1] == TurnDone("t1")


def test_big_endian_header_is_confirmed_without_a_warning() -> None:
    run = replay(
        "normal_turn.jsonl",
        [
            (0.0, open_and_say("t1", "Xin chào.")),
            (0.1, say("t1", "Tôi có thể giúp gì cho bạn?")),
            (0.3, end("t1")),
        ],
    )
    assert run.of(HeaderByteOrderSwitched) == []


def test_multiplexed_contexts_route_by_ordinal_with_config_and_queue_depth() -> None:
    run = replay(
        "multiplexed_contexts.jsonl",
        [
            (0.0, open_and_say("a", "Câu một. Câu hai. Câu ba.", speed=1.1)),
            (0.01, open_and_say("b", "Khác.")),
            (0.31, end("a")),
        ],
    )
    audio = [(e.turn_id, e.audio) for e in run.of(AudioReceived) if isinstance(e, AudioReceived)]
    assert audio == [
        ("b", pcm(21, 22)),
        ("a", pcm(11, 12)),
        ("b", pcm(23, 24)),
        ("a", pcm(13, 14)),
        ("a", pcm(15, 16)),
    ]
    assert run.of(QueueDepthChanged) == [
        QueueDepthChanged("b", 0),
        QueueDepthChanged("a", 2),
        QueueDepthChanged("a", 1),
        QueueDepthChanged("a", 0),
    ]
    assert run.of(TurnDone) == [TurnDone("b"), TurnDone("a")]


# ------------------------------------------------ session route and commands


def test_session_request_posts_the_properties_with_the_key_in_a_header() -> None:
    engine = ZwstProtocol(make_settings(normalize_text=False))
    request = engine.session_request()
    assert isinstance(request, HttpRequest)
    assert (request.method, request.url) == ("POST", "https://gw.zwst.test/v1/sessions")
    assert ("Authorization", f"Bearer {API_KEY}") in request.headers
    assert json.loads(request.body) == {
        "voice_id": "maichi",
        "format": "pcm_s16le",
        "sample_rate": 24000,
        "normalize_text": False,
        "word_timestamps": True,
    }
    assert API_KEY not in request.url and API_KEY.encode() not in request.body


def test_session_rejection_never_leaks_the_key() -> None:
    engine = ZwstProtocol(make_settings())
    body = json.dumps({"error": "unauthorized", "message": f"bad key {API_KEY}"}).encode()
    engine.session_response(401, body, 0.0)
    [failed] = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.kind == "session_rejected"
    assert API_KEY not in repr(failed) and "401" in failed.message
    with pytest.raises(LocalProtocolError):
        engine.connect_params()


def test_session_answer_without_a_websocket_url_fails() -> None:
    engine = ZwstProtocol(make_settings())
    engine.session_response(200, b'{"url": "https://not-a-socket"}', 0.0)
    [failed] = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.kind == "protocol_error"


def test_turn_without_text_never_reaches_the_wire() -> None:
    engine = connected()
    engine.open_turn("t1", turn_settings(), 0.0)
    engine.end_turn("t1", 0.0)
    engine.open_turn("t2", turn_settings(), 0.0)
    engine.cancel("t2", 0.0)
    assert engine.actions_to_send() == []
    assert engine.events_received() == [TurnDone("t1"), TurnDone("t2", cancelled=True)]


def test_pooling_is_per_voice_and_wire_format() -> None:
    base = make_settings()
    mulaw_turn = TurnSettings(voice="", audio_format=AudioFormat("mulaw", 8000))
    voice, fmt = pool_key(base, mulaw_turn)
    assert (voice, fmt) == ("maichi", AudioFormat("pcm_s16le", 8000))
    engine = ENGINE(settings_for(base, voice, fmt))
    assert engine.audio_format == AudioFormat("pcm_s16le", 8000)
    engine.session_request()
    engine.session_response(200, b'{"url": "ws://127.0.0.1:1/v1/stream?token=t"}', 0.0)
    engine.connection_made(None, 0.0)
    assert engine.events_received() == [ConnectionReady()]
    engine.open_turn("t1", mulaw_turn, 0.0)  # same key: accepted
    engine.open_turn("t2", turn_settings(), 0.0)  # 24 kHz needs another connection
    [failed] = engine.events_received()
    assert isinstance(failed, TurnFailed)
    assert (failed.turn_id, failed.kind) == ("t2", "unsupported_settings")
    engine.send_text("t2", "ignored: the turn is not open", 0.0)
    engine.end_turn("t2", 0.0)
    assert engine.actions_to_send() == [] and engine.open_turns() == 1


def test_max_turns_and_misuse_raise_local_errors() -> None:
    engine = connected()
    for i in range(ZwstProtocol.max_turns):
        engine.open_turn(f"t{i}", turn_settings(), 0.0)
    with pytest.raises(LocalProtocolError):
        engine.open_turn("one-too-many", turn_settings(), 0.0)
    engine.send_text("t0", "Xin chào.", 0.0)
    engine.end_turn("t0", 0.0)
    with pytest.raises(LocalProtocolError):
        engine.send_text("t0", "after end", 0.0)


def test_close_fails_open_turns_and_stops_the_heartbeat() -> None:
    engine = connected()
    engine.open_turn("t1", turn_settings(), 0.0)
    engine.send_text("t1", "Xin chào.", 0.0)
    engine.actions_to_send()
    engine.close(1.0)
    assert engine.actions_to_send() == [CloseConnection(1000, "conversation over")]
    [failed] = engine.events_received()
    assert isinstance(failed, ProviderFailed) and failed.turn_ids == ("t1",)
    assert engine.next_deadline() is None
    engine.connection_lost(1000, "", 1.1)
    assert engine.events_received() == []


def test_bytes_fed_one_frame_at_a_time_never_raise() -> None:
    """Every prefix of a valid frame: an event or a protocol error, never an exception."""
    frame = base64.b64decode(
        json.loads((FIXTURES / "normal_turn.jsonl").read_text().splitlines()[5])["msg"]["b64"]
    )
    for cut in range(len(frame) + 1):
        engine = connected()
        engine.open_turn("t1", turn_settings(), 0.0)
        engine.send_text("t1", "x", 0.0)
        engine.receive_bytes(frame[:cut], 0.1)
        events = engine.events_received()
        if cut >= 12 and cut % 2 == 0:
            assert all(isinstance(e, AudioReceived) for e in events)
        else:
            assert [type(e) for e in events] == [ProviderFailed]

"""One call's voice-agent session (``bridge.providers.agent``) with a scripted engine
and numbers for time: what reaches the engine, where its events go, and how a text
turn the agent cannot take fails to its owner instead of raising."""

from __future__ import annotations

from typing import Any, cast

from bridge.engine import Event, LocalProtocolError
from bridge.providers.agent import VoiceAgent
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    TtsProtocol,
    TurnDone,
    TurnFailed,
    TurnSettings,
)
from bridge.providers.connection import ProviderConnection
from bridge.providers.pool import Backoff, Placement

PCM_24K = AudioFormat("pcm_s16le", 24000)
SETTINGS = TurnSettings("agent", MULAW_8K)


class Engine:
    """A voice agent's engine surface: calls recorded, one text turn at a time."""

    max_turns = 1

    def __init__(self) -> None:
        self.ready = True
        self.calls: list[tuple[Any, ...]] = []
        self.events: list[Event] = []
        self.turn: str | None = None
        self.positions: dict[str, int] = {}

    def __getattr__(self, method: str) -> Any:
        def record(*args: Any) -> None:
            self.calls.append((method, *args))

        return record

    def open_turns(self) -> int:
        return 0 if self.turn is None else 1

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        if self.turn is not None:
            raise LocalProtocolError("one turn at a time")
        self.turn = turn_id
        self.calls.append(("open_turn", turn_id, now))

    def cancel(self, turn_id: str, now: float) -> None:
        if turn_id != self.turn:
            raise LocalProtocolError("no such turn")
        self.calls.append(("cancel", turn_id, now))

    def set_played_position(self, item_id: str, ms: int) -> None:
        self.positions[item_id] = ms

    def events_received(self) -> list[Event]:
        events, self.events = self.events, []
        return events


class Pool:
    def __init__(self) -> None:
        self.backoff = Backoff()
        self.flow_high_s: float | None = None
        self.flow_low_s = 0.5
        self.turn_stall_s, self.turn_base_s, self.turn_s_per_char = 10.0, 15.0, 0.25
        self.placement: Placement[Any] = Placement(None, 1)
        self.errors: list[str] = []

    def note_error(self, kind: str) -> None:
        self.errors.append(kind)

    def arm_idle_close(self, at: float | None = None) -> None:
        pass


def _agent() -> tuple[VoiceAgent, Engine, list[Event]]:
    engine = Engine()
    conn = ProviderConnection(Pool(), cast(TtsProtocol, engine))
    caught: list[Event] = []
    conn.catch_all = caught.append
    return VoiceAgent(conn), engine, caught


def test_the_session_reaches_the_engine_with_the_time_given() -> None:
    agent, engine, _ = _agent()
    assert agent.ready
    agent.stop("user", 0.5)  # not started: nothing to stop
    agent.start("vad", "call-1", 1.0)
    agent.send_audio(b"\x00\x01", 1.02)
    agent.commit(1.04)
    agent.played("item", 200, 1.1)
    agent.set_played_position("item", 240)
    agent.stop("user", 2.0)
    agent.stop("user", 2.1)  # once
    assert engine.calls == [
        ("start_voice", "vad", "call-1", 1.0),
        ("send_audio", b"\x00\x01", 1.02),
        ("commit", 1.04),
        ("played", "item", 200, 1.1),
        ("stop_voice", "user", 2.0),
    ]
    assert engine.positions == {"item": 240} and not agent.started


def test_the_agents_replies_go_to_the_calls_sink_and_a_text_turn_to_its_own() -> None:
    agent, engine, caught = _agent()
    spoken: list[Event] = []
    agent.say("t1", "Hello.", SETTINGS, spoken.append, 1.0)
    assert [c[0] for c in engine.calls] == ["open_turn", "send_text", "end_turn"]
    engine.events = [AudioReceived("reply", b"\x01", PCM_24K), TurnDone("t1")]
    agent.conn.pump(2.0)
    assert caught == [AudioReceived("reply", b"\x01", PCM_24K)]
    assert spoken == [TurnDone("t1")] and agent.conn.sinks == {}


def test_a_turn_the_agent_cannot_take_fails_to_its_owner_once() -> None:
    agent, engine, caught = _agent()
    first: list[Event] = []
    second: list[Event] = []
    agent.open_turn("t1", SETTINGS, first.append, 1.0)
    agent.open_turn("t2", SETTINGS, second.append, 1.5)  # busy with t1
    agent.send_text("t2", "ignored", 1.6)  # a refused turn's later commands: dropped
    agent.end_turn("t2", 1.7)
    agent.cancel("t2", 1.8)
    [failed] = second
    assert isinstance(failed, TurnFailed) and failed.turn_id == "t2"
    assert failed.kind == "agent_busy" and failed.retryable
    assert [c[:2] for c in engine.calls] == [("open_turn", "t1")]
    assert first == [] and caught == [] and "t2" not in agent.conn.sinks
    agent.cancel("unknown", 2.0)  # an unknown turn's cancel is a no-op


def test_a_closed_connection_takes_no_command() -> None:
    agent, engine, _ = _agent()
    agent.start("vad", "call-1", 1.0)
    agent.conn.closed = True
    assert not agent.ready
    agent.send_audio(b"\x00", 2.0)
    agent.goodbye(3.0)
    assert engine.calls == [("start_voice", "vad", "call-1", 1.0)]


def test_goodbye_stops_a_started_session() -> None:
    agent, engine, _ = _agent()
    agent.goodbye(0.5)  # not started: nothing
    agent.start("ptt", "call-2", 1.0)
    agent.goodbye(4.0)
    assert engine.calls[-1] == ("stop_voice", "user", 4.0)

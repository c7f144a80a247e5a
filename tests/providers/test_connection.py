"""A provider connection's routing (``bridge.providers.connection``) with a scripted
engine and numbers for time: which turn an event is for, under which id it reaches
its owner, what the pool counts, and how a turn's commands wait for the connection.
No socket, no loop, no sleep."""

from __future__ import annotations

from typing import Any, cast

from bridge.engine import Event, LocalProtocolError
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ProviderFailed,
    TtsProtocol,
    TurnDone,
    TurnFailed,
    TurnSettings,
    WordsTimed,
    WordTiming,
)
from bridge.providers.connection import ProviderConnection, TurnCommands, retag
from bridge.providers.pool import Backoff, Placement


class Engine:
    """The engine surface the routing uses: calls recorded, events scripted."""

    max_turns = 4

    def __init__(self) -> None:
        self.ready = True
        self.calls: list[tuple[Any, ...]] = []
        self.events: list[Event] = []
        self.refuse_open = False

    def open_turns(self) -> int:
        return len({c[1] for c in self.calls if c[0] == "open"}) - len(
            {c[1] for c in self.calls if c[0] == "done"}
        )

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        if self.refuse_open:
            raise LocalProtocolError("full")
        self.calls.append(("open", turn_id, now))

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        self.calls.append(("text", turn_id, text, now))

    def end_turn(self, turn_id: str, now: float) -> None:
        self.calls.append(("end", turn_id, now))

    def cancel(self, turn_id: str, now: float) -> None:
        self.calls.append(("cancel", turn_id, now))

    def events_received(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    deadline: float | None = None
    lost: tuple[int | None, str, float] | None = None

    def next_deadline(self) -> float | None:
        return self.deadline

    def handle_timer(self, now: float) -> None:
        self.calls.append(("timer", now))
        self.deadline = None
        self.events.append(TurnFailed("x~1", "timeout", "late", True))

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        if self.lost is not None:
            raise LocalProtocolError("already failed")
        self.lost = (code, reason, now)
        self.events.append(ProviderFailed("closed", reason, ()))


class Pool:
    """What a connection reads and tells of its pool."""

    def __init__(self, flow_high_s: float | None = None) -> None:
        self.backoff = Backoff(attempt=3)
        self.flow_high_s = flow_high_s
        self.flow_low_s = 0.5
        self.turn_stall_s, self.turn_base_s, self.turn_s_per_char = 10.0, 15.0, 0.25
        self.placement: Placement[Any] = Placement(None, Engine.max_turns)
        self.errors: list[str] = []
        self.idle_checks = 0

    def note_error(self, kind: str) -> None:
        self.errors.append(kind)

    def arm_idle_close(self, at: float | None = None) -> None:
        self.idle_checks += 1


class Conn(ProviderConnection):
    """The shell's hooks, recorded."""

    def __init__(self, pool: Pool, engine: Engine) -> None:
        super().__init__(pool, cast(TtsProtocol, engine))
        self.readied = 0
        self.watch_timers = 0
        self.resumes = 0

    def on_ready(self) -> None:
        self.readied += 1

    def arm_watch_timer(self) -> None:
        self.watch_timers += 1

    def resume(self) -> None:
        self.resumes += 1
        super().resume()


FMT = MULAW_8K


def _conn(flow_high_s: float | None = None) -> tuple[Conn, Engine, Pool]:
    engine, pool = Engine(), Pool(flow_high_s)
    return Conn(pool, engine), engine, pool


def _bind(conn: Conn, wire_id: str, turn_id: str, direct: bool = True) -> list[Any]:
    got: list[Any] = []
    conn.bind_turn(
        wire_id,
        turn_id,
        got.append,
        (lambda a, f: got.append(("audio", a, f))) if direct else None,
        (lambda w: got.append(("words", w))) if direct else None,
    )
    return got


def test_events_reach_their_turn_under_the_owners_id() -> None:
    conn, engine, pool = _conn()
    a, b = _bind(conn, "t~1", "t"), _bind(conn, "t~2", "t", direct=False)
    words = (WordTiming("hi", 0.0, 0.2),)
    engine.events = [
        AudioReceived("t~1", b"\x01", FMT),
        AudioReceived("t~2", b"\x02", FMT),
        WordsTimed("t~1", words),
        WordsTimed("t~2", words),
        TurnDone("t~2"),
    ]
    conn.pump(1.0)
    assert a == [("audio", b"\x01", FMT), ("words", words)]
    assert b == [AudioReceived("t", b"\x02", FMT), WordsTimed("t", words), TurnDone("t")]
    assert set(conn.sinks) == {"t~1"} and set(conn.audio_sinks) == {"t~1"}
    assert pool.backoff.attempt == 0  # a turn carried to its end resets the backoff


def test_a_cancelled_turns_done_does_not_reset_the_backoff() -> None:
    conn, engine, pool = _conn()
    got = _bind(conn, "x~1", "x")
    engine.events = [TurnDone("x~1", cancelled=True)]
    conn.pump(0.0)
    assert got == [TurnDone("x", cancelled=True)] and pool.backoff.attempt == 3


def test_a_failed_turn_is_counted_and_forgotten() -> None:
    conn, engine, pool = _conn()
    got = _bind(conn, "x~1", "x")
    engine.events = [TurnFailed("x~1", "rate_limited", "slow down", True)]
    conn.pump(0.0)
    assert got == [TurnFailed("x", "rate_limited", "slow down", True)]
    assert pool.errors == ["rate_limited"] and conn.sinks == {}


def test_a_provider_failure_fails_each_of_its_turns_once() -> None:
    conn, engine, pool = _conn()
    a, b = _bind(conn, "a~1", "a"), _bind(conn, "b~2", "b")
    engine.events = [ProviderFailed("closed", "gone", ())]  # no list: every turn
    conn.pump(0.0)
    assert a == [ProviderFailed("closed", "gone", ("a",))]
    assert b == [ProviderFailed("closed", "gone", ("b",))]
    assert conn.engine_failed and pool.errors == ["closed"] and conn.sinks == {}


def test_ready_is_noted_with_its_time() -> None:
    conn, engine, _ = _conn()
    engine.events = [ConnectionReady()]
    conn.pump(7.5)
    assert conn.readied == 1 and conn.ready_at == 7.5


def test_events_of_no_turn_go_to_a_dedicated_connections_catch_all() -> None:
    conn, engine, _ = _conn()
    caught: list[Event] = []
    conn.catch_all = caught.append
    engine.events = [AudioReceived("reply", b"\x01", FMT), TurnDone("unknown")]
    conn.pump(0.0)
    assert caught == [AudioReceived("reply", b"\x01", FMT), TurnDone("unknown")]
    assert not conn.has_room() and not conn.is_open() and not conn.is_idle()


def test_late_events_of_a_dropped_turn_are_dropped() -> None:
    conn, engine, _ = _conn()
    got = _bind(conn, "x~1", "x")
    conn.drop_turn("x~1", 0.0)
    engine.events = [AudioReceived("x~1", b"\x01", FMT), TurnDone("x~1")]
    conn.pump(0.0)
    assert got == []


def test_an_idle_connection_is_listed_once_with_the_time_it_went_idle() -> None:
    conn, _, pool = _conn()
    _bind(conn, "x~1", "x")
    assert not conn.is_idle() and conn.load() == 1
    conn.drop_turn("x~1", 4.0)
    assert conn.is_idle() and conn.listed_idle and conn.idle_since == 4.0
    assert pool.placement.idle == [conn] and pool.idle_checks == 1
    conn.pump(5.0)  # already listed: not again
    assert pool.idle_checks == 1 and conn.idle_since == 4.0


def test_turn_deadlines_fail_a_stalled_turn_and_queue_its_cancel() -> None:
    conn, engine, pool = _conn()
    got = _bind(conn, "x~1", "x", direct=False)
    conn.note_text("x~1", 10, 1.0)
    conn.note_text("x~1", 10, 2.0)
    assert conn.watch_timers == 1  # one timer for the connection's first watch
    engine.events = [AudioReceived("x~1", b"\x01", FMT)]
    conn.pump(5.0)  # an answer: nothing owed
    conn.note_text("x~1", 5, 6.0)  # owed again from 6 s
    assert conn.late_turns(15.9) == []
    [(wire_id, why)] = conn.late_turns(16.0)
    assert wire_id == "x~1" and why.startswith("no audio")
    sink = conn.fail_turn(wire_id, 16.0)
    assert sink is not None and ("cancel", "x~1", 16.0) in engine.calls
    assert pool.errors == ["timeout"] and conn.watches == {} and conn.sinks == {}
    assert got == [AudioReceived("x", b"\x01", FMT)]
    conn.note_text("x~1", 5, 16.0)  # a forgotten turn is not watched again
    assert conn.watches == {}


def test_flow_control_clocks_count_each_turns_audio() -> None:
    conn, engine, _ = _conn(flow_high_s=2.0)
    _bind(conn, "x~1", "x")
    assert conn.resumes == 1  # the new turn needs its first audio
    engine.events = [AudioReceived("x~1", b"\xff" * 8000, FMT)]  # 1 s of mu-law
    conn.pump(0.0)
    assert conn.clocks["x~1"].due_at == 1.0  # it runs out 1 s from its arrival
    conn.paused = True  # (the shell paused its reading)
    conn.drop_turn("x~1", 1.0)
    assert conn.clocks == {} and conn.resumes == 2 and not conn.paused  # nothing left to hold back


def test_commands_wait_for_the_connection_then_go_in_order() -> None:
    conn, engine, _ = _conn()
    engine.ready = False
    _bind(conn, "x~1", "x")
    turn = TurnCommands(conn, "x~1")
    assert turn.open(TurnSettings("v", FMT), 1.0) is True  # the shell must wait
    assert turn.send_text("Hello.", 2.0) is False  # already waiting
    assert turn.end(3.0) is False and engine.calls == []
    engine.ready = True
    turn.ready_or_failed(4.0)
    assert engine.calls == [
        ("open", "x~1", 4.0),
        ("text", "x~1", "Hello.", 4.0),
        ("end", "x~1", 4.0),
    ]
    assert turn.cancel(5.0) is False and engine.calls[-1] == ("cancel", "x~1", 5.0)


def test_a_turn_whose_connection_never_opens_fails_to_its_owner() -> None:
    conn, engine, _ = _conn()
    engine.ready = False
    got = _bind(conn, "x~1", "x")
    turn = TurnCommands(conn, "x~1")
    assert turn.open(TurnSettings("v", FMT), 0.0) is True
    conn.closed = True
    turn.ready_or_failed(1.0)
    assert got == [ProviderFailed("connect_failed", "provider unreachable", ("x",))]
    assert engine.calls == [] and conn.sinks == {}


def test_a_live_turns_commands_go_straight_to_the_engine() -> None:
    conn, engine, _ = _conn()
    _bind(conn, "x~1", "x")
    turn = TurnCommands(conn, "x~1")
    assert turn.open(TurnSettings("v", FMT), 0.0) is False and turn.live
    turn.send_text("Hi.", 1.0)
    conn.closed = True
    turn.end(2.0)  # a closed connection takes nothing more
    assert engine.calls == [("open", "x~1", 0.0), ("text", "x~1", "Hi.", 1.0)]


def test_retag_keeps_everything_but_the_id() -> None:
    fmt = AudioFormat("pcm_s16le", 16000)
    assert retag(AudioReceived("w~1", b"\x01", fmt), "w") == AudioReceived("w", b"\x01", fmt)
    assert retag(TurnFailed("w~1", "k", "m", False), "w") == TurnFailed("w", "k", "m", False)
    assert retag(ProviderFailed("k", "m", ("w~1",)), "w") == ProviderFailed("k", "m", ("w",))
    ready = ConnectionReady()
    assert retag(ready, "w") is ready


def test_the_engines_timer_runs_when_due_and_is_looked_at_again_when_it_moved() -> None:
    conn, engine, _ = _conn()
    got = _bind(conn, "x~1", "x")
    assert conn.timer_due(1.0) is None  # no deadline
    engine.deadline = 5.0
    assert conn.timer_due(4.0) == 5.0 and engine.calls == []  # moved later: look again
    assert conn.timer_due(5.0) is None
    assert engine.calls == [("timer", 5.0)] and got == [TurnFailed("x", "timeout", "late", True)]
    engine.deadline = 6.0
    conn.closed = True
    assert conn.timer_due(7.0) is None and engine.calls == [("timer", 5.0)]


def test_an_ended_connection_fails_its_turns_and_resets_the_backoff_only_if_it_lasted() -> None:
    for ready_at, now, attempt in ((0.0, 29.9, 3), (0.0, 30.0, 0), (None, 100.0, 3)):
        conn, engine, pool = _conn()
        got = _bind(conn, "x~1", "x")
        conn.ready_at = ready_at
        conn.ended(None, "reset", now)
        assert conn.closed and engine.lost == (None, "reset", now)
        assert got == [ProviderFailed("closed", "reset", ("x",))]
        assert pool.backoff.attempt == attempt, (ready_at, now)
        conn.ended(1000, "again", now)  # an engine that failed itself already: no raise
        assert engine.lost == (None, "reset", now)

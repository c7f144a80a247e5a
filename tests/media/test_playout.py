"""PlayoutQueue: turns, generations, marks, barge-in, truncate; time is a plain number."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import Event, LocalProtocolError
from bridge.media.playout import (
    MarkReached,
    PlayoutConfig,
    PlayoutFrame,
    PlayoutQueue,
    TurnCut,
    TurnPlaybackStarted,
    TurnPlayed,
)

SPF = 160  # samples per 20 ms frame at 8 kHz


def frame(turn_id: str, i: int) -> bytes:
    return f"{turn_id}:{i}".encode().ljust(SPF, b"\xff")


def push_frames(q: PlayoutQueue, turn_id: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        assert q.push(turn_id, frame(turn_id, i))


def pop_frames(q: PlayoutQueue, count: int, now: float = 0.0) -> list[PlayoutFrame]:
    frames: list[PlayoutFrame] = []
    for k in range(count):
        f = q.pop(now + k * 0.020)
        assert f is not None
        frames.append(f)
    return frames


def of_type(events: list[Event], kind: type[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


def test_turn_plays_in_order_with_exact_positions() -> None:
    q = PlayoutQueue()
    gen = q.begin_turn("a", now=0.0)
    push_frames(q, "a", 3)
    q.end_turn("a")
    frames = pop_frames(q, 3, now=1.0)
    assert [f.payload for f in frames] == [frame("a", i) for i in range(3)]
    assert [f.position_samples for f in frames] == [0, 160, 320]
    assert {(f.turn_id, f.generation) for f in frames} == {("a", gen)}
    assert q.events_received() == [
        TurnPlaybackStarted("a", gen, 1.0),
        TurnPlayed("a", 480),
    ]
    assert q.pop(1.06) is None
    assert q.stats().underruns == 0
    assert q.played_samples("a") == 480


def test_barge_in_bumps_generation_and_drops_old_frames() -> None:
    q = PlayoutQueue()
    gen_a = q.begin_turn("a", now=0.0)
    push_frames(q, "a", 5)
    pop_frames(q, 2)
    cuts = q.barge_in(now=0.05)
    assert cuts == [TurnCut("a", gen_a, 320, 0, 3, (), "barge_in", 0.05)]
    assert q.generation > gen_a
    assert q.pop(0.06) is None
    assert q.current_turn_id is None
    assert not q.push("a", frame("a", 5))  # late provider audio for the cut turn
    assert q.stats().stale_frames_dropped == 1
    assert q.stats().queued_frames == 0
    gen_b = q.begin_turn("b", now=0.07)
    assert gen_b > q.generation - 1 > gen_a
    push_frames(q, "b", 1)
    popped = q.pop(0.08)
    assert popped is not None
    assert (popped.turn_id, popped.generation, popped.payload) == ("b", gen_b, frame("b", 0))


def test_sample_accounting_exact_across_mid_turn_barge_in() -> None:
    q = PlayoutQueue(PlayoutConfig(samples_per_frame=320, sample_rate_hz=16000))
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 50)
    pop_frames(q, 17)
    (cut,) = q.barge_in(now=0.34)
    assert cut.played_samples == 17 * 320
    assert cut.dropped_frames == 33
    assert q.played_samples("a") == 17 * 320
    assert not any(isinstance(e, TurnPlayed) for e in q.events_received())


def test_turn_queued_behind_plays_after_current() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    q.begin_turn("b", now=0.0)
    push_frames(q, "b", 2)
    push_frames(q, "a", 2)
    q.end_turn("a")
    q.end_turn("b")
    assert [f.turn_id for f in pop_frames(q, 4)] == ["a", "a", "b", "b"]
    played = of_type(q.events_received(), TurnPlayed)
    assert played == [TurnPlayed("a", 320), TurnPlayed("b", 320)]


def test_replace_cuts_every_queued_turn() -> None:
    q = PlayoutQueue()
    gen_a = q.begin_turn("a", now=0.0, interruptible=False)
    gen_b = q.begin_turn("b", now=0.0)
    push_frames(q, "a", 4)
    push_frames(q, "b", 2)
    pop_frames(q, 1)
    q.events_received()
    gen_c = q.begin_turn("c", now=0.5, replace=True)
    assert q.events_received() == [
        TurnCut("a", gen_a, 160, 0, 3, (), "replaced", 0.5),
        TurnCut("b", gen_b, 0, 0, 2, (), "replaced", 0.5),
    ]
    push_frames(q, "c", 1)
    popped = q.pop(0.52)
    assert popped is not None
    assert (popped.turn_id, popped.generation) == ("c", gen_c)


def test_non_interruptible_turn_survives_barge_in() -> None:
    q = PlayoutQueue()
    q.begin_turn("legal", now=0.0, interruptible=False)
    q.begin_turn("chat", now=0.0)
    push_frames(q, "legal", 4)
    push_frames(q, "chat", 3)
    q.end_turn("legal")
    pop_frames(q, 1)
    cuts = q.barge_in(now=0.02)
    assert [(c.turn_id, c.played_samples, c.dropped_frames) for c in cuts] == [("chat", 0, 3)]
    rest = pop_frames(q, 3, now=0.04)
    assert [f.payload for f in rest] == [frame("legal", i) for i in (1, 2, 3)]
    assert TurnPlayed("legal", 640) in q.events_received()
    assert q.pop(0.2) is None


def test_marks_reached_when_frame_before_is_popped() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 2)
    assert q.mark("a", "m1")
    push_frames(q, "a", 1, start=2)
    assert q.mark("a", "m2")
    q.end_turn("a")
    pop_frames(q, 1)
    assert of_type(q.events_received(), MarkReached) == []
    pop_frames(q, 1)
    assert of_type(q.events_received(), MarkReached) == [MarkReached("m1", "a", 320)]
    pop_frames(q, 1)
    assert q.events_received() == [MarkReached("m2", "a", 480), TurnPlayed("a", 480)]


def test_mark_on_played_position_is_reached_at_once() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 1)
    pop_frames(q, 1)
    q.events_received()
    assert q.mark("a", "now")
    assert q.events_received() == [MarkReached("now", "a", 160)]
    with pytest.raises(LocalProtocolError):
        q.mark("a", "now")  # still awaiting its echo


def test_mark_at_start_of_queued_turn_waits_for_that_turn() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    q.begin_turn("b", now=0.0)
    assert q.mark("b", "b-start")
    push_frames(q, "a", 1)
    q.end_turn("a")
    assert q.events_received() == []
    pop_frames(q, 1)  # the last frame of "a" is the frame before the mark
    assert q.events_received() == [
        TurnPlaybackStarted("a", 1, 0.0),
        TurnPlayed("a", 160),
        MarkReached("b-start", "b", 0),
    ]
    assert q.pop(0.02) is None  # "b" waits for audio
    assert q.events_received() == []


def test_marks_of_cut_turn_are_reported_dropped() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 2)
    q.mark("a", "m1")
    (cut,) = q.barge_in(now=0.0)
    assert cut.dropped_marks == ("m1",)
    assert not q.mark("a", "m2")  # the turn is over


def test_underruns_counted_only_after_first_frame() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    assert q.pop(0.00) is None  # waiting for first audio: not an underrun
    assert q.pop(0.02) is None
    assert q.stats().underruns == 0
    push_frames(q, "a", 1)
    pop_frames(q, 1, now=0.04)
    assert q.pop(0.06) is None
    assert q.pop(0.08) is None
    assert q.stats().underruns == 2
    push_frames(q, "a", 1, start=1)
    q.end_turn("a")
    pop_frames(q, 1, now=0.10)
    assert q.pop(0.12) is None  # the turn is over: idle, not an underrun
    assert q.stats().underruns == 2
    assert TurnPlayed("a", 320) in q.events_received()


def test_end_turn_after_last_frame_popped_finishes_at_once() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 2)
    pop_frames(q, 2)
    q.events_received()
    q.end_turn("a")
    assert q.events_received() == [TurnPlayed("a", 320)]
    q.end_turn("a")  # repeated: ignored
    q.end_turn("unknown")
    assert q.events_received() == []


def test_truncate_drops_audio_beyond_position() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 10)  # 200 ms
    q.mark("a", "end")
    pop_frames(q, 2)
    assert q.truncate("a", audio_end_ms=90) == 5  # keep frames starting before 720 samples
    assert not q.push("a", frame("a", 10))  # truncation ends the turn
    rest = pop_frames(q, 3, now=0.04)
    assert [f.position_samples for f in rest] == [320, 480, 640]
    events = q.events_received()
    assert TurnPlayed("a", 800) in events
    assert not of_type(events, MarkReached)  # the mark was beyond the cut
    assert q.pop(0.1) is None


def test_truncate_behind_played_position_finishes_turn() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 6)
    pop_frames(q, 3)
    q.events_received()
    assert q.truncate("a", audio_end_ms=20) == 3
    assert q.events_received() == [TurnPlayed("a", 480)]
    assert q.truncate("a", audio_end_ms=0) == 0
    assert q.stats().queued_frames == 0


def test_acknowledged_marks_set_heard_position_and_clear_voids_the_rest() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    for k in range(3):
        push_frames(q, "a", 5, start=5 * k)
        q.mark("a", f"m{k}")
    push_frames(q, "a", 5, start=15)
    pop_frames(q, 16)  # all three marks reached (sent to the carrier)
    assert q.acknowledge_mark("m0")
    assert q.heard_samples("a") == 800
    (cut,) = q.barge_in(now=0.32)
    assert (cut.played_samples, cut.heard_samples) == (16 * 160, 800)
    assert q.carrier_cleared() == ["m1", "m2"]
    # Twilio echoes every pending mark on clear: they must not count.
    assert not q.acknowledge_mark("m1")
    assert not q.acknowledge_mark("m2")
    assert not q.acknowledge_mark("never-sent")
    assert not q.acknowledge_mark("m0")  # echoed twice
    assert q.heard_samples("a") == 800
    assert q.carrier_cleared() == []


def test_marks_echoed_in_order_advance_heard_position() -> None:
    q = PlayoutQueue()
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 2)
    q.mark("a", "x")
    push_frames(q, "a", 2, start=2)
    q.mark("a", "y")
    q.end_turn("a")
    pop_frames(q, 4)
    assert q.acknowledge_mark("x")
    assert q.acknowledge_mark("y")
    assert q.heard_samples("a") == 640  # late echo after the turn finished still counts


def test_overflow_limit_drops_and_counts() -> None:
    q = PlayoutQueue(PlayoutConfig(max_queued_frames=3))
    q.begin_turn("a", now=0.0)
    push_frames(q, "a", 3)
    assert not q.push("a", frame("a", 3))
    assert q.stats().overflow_frames_dropped == 1
    pop_frames(q, 1)
    assert q.push("a", frame("a", 3))


def test_misuse_raises_local_protocol_error() -> None:
    q = PlayoutQueue(PlayoutConfig(max_turn_history=1))
    q.begin_turn("a", now=0.0)
    with pytest.raises(LocalProtocolError):
        q.begin_turn("a", now=0.0)
    with pytest.raises(LocalProtocolError):
        q.played_samples("nope")
    q.end_turn("a")
    q.begin_turn("b", now=0.0)
    q.end_turn("b")
    q.pop(0.0)
    assert q.played_samples("b") == 0
    with pytest.raises(LocalProtocolError):
        q.played_samples("a")  # forgotten: history keeps one finished turn
    assert not q.push("a", frame("a", 0))


def test_interruptible_flag_and_current_turn() -> None:
    q = PlayoutQueue()
    assert q.current_turn_id is None
    q.begin_turn("a", now=0.0, interruptible=False)
    q.begin_turn("b", now=0.0)
    assert q.current_turn_id == "a"
    assert not q.is_interruptible("a")
    assert q.is_interruptible("b")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["begin", "push", "push", "push", "pop", "pop", "end", "barge", "trunc"]),
        max_size=80,
    )
)
def test_every_pushed_frame_is_played_dropped_or_queued(ops: list[str]) -> None:
    q = PlayoutQueue(PlayoutConfig(max_turn_history=len(ops) + 1))
    pushed: dict[str, int] = {}
    played: dict[str, int] = {}
    dropped: dict[str, int] = {}
    turn = ""
    for i, op in enumerate(ops):
        if op == "begin":
            turn = f"t{i}"
            q.begin_turn(turn, now=i * 0.02, interruptible=i % 3 != 0)
        elif op == "push" and turn and q.push(turn, frame(turn, i)):
            pushed[turn] = pushed.get(turn, 0) + 1
        elif op == "pop" and (f := q.pop(i * 0.02)) is not None:
            assert f.position_samples == played.get(f.turn_id, 0) * SPF
            played[f.turn_id] = played.get(f.turn_id, 0) + 1
        elif op == "end" and turn:
            q.end_turn(turn)
        elif op == "barge":
            for cut in q.barge_in(i * 0.02):
                dropped[cut.turn_id] = dropped.get(cut.turn_id, 0) + cut.dropped_frames
        elif op == "trunc" and turn:
            n = q.truncate(turn, audio_end_ms=(i % 7) * 20)
            dropped[turn] = dropped.get(turn, 0) + n
    queued = q.stats().queued_frames
    accounted = sum(played.values()) + sum(dropped.values()) + queued
    assert accounted == sum(pushed.values())
    for turn_id, frames in played.items():
        assert q.played_samples(turn_id) == frames * SPF


def test_has_frame_is_pure_and_follows_the_front_turn() -> None:
    q = PlayoutQueue()
    assert not q.has_frame()
    q.begin_turn("a", 0.0)
    assert not q.has_frame()  # waiting for the provider
    q.push("a", b"\xff" * 160)
    assert q.has_frame() and q.has_frame()  # asking twice changes nothing
    assert q.pop(0.02) is not None
    assert not q.has_frame()
    q.end_turn("a")
    q.begin_turn("b", 0.04)
    q.push("b", b"\x00" * 160)
    assert q.has_frame()  # a finished front turn does not hide the next one


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=8),
    limit=st.integers(min_value=1, max_value=20),
    end_after=st.integers(min_value=0, max_value=8),
)
def test_push_many_is_push_of_each_frame(sizes: list[int], limit: int, end_after: int) -> None:
    """Same frames kept, same positions, same drop counts as one ``push`` per frame."""
    one, many = (PlayoutQueue(PlayoutConfig(max_queued_frames=limit)) for _ in range(2))
    for q in (one, many):
        q.begin_turn("a", 0.0)
    i = 0
    for k, size in enumerate(sizes):
        if k == end_after:
            one.end_turn("a")  # later pushes are stale
            many.end_turn("a")
        batch = [frame("a", i + j) for j in range(size)]
        i += size
        kept = sum(one.push("a", f) for f in batch)
        assert many.push_many("a", batch) == kept
        assert one.stats() == many.stats()
    popped = [(f.payload, f.position_samples) for f in iter(lambda: one.pop(1.0), None)]
    assert popped == [(f.payload, f.position_samples) for f in iter(lambda: many.pop(1.0), None)]
    assert many.push_many("nope", [frame("a", 0)]) == 0
    assert many.stats().stale_frames_dropped == one.stats().stale_frames_dropped + 1


def test_pop_payload_is_pop_without_the_frame_object() -> None:
    # The call's tick uses ``pop_payload`` + ``popped_turn_id``: same frames,
    # same events, same positions as ``pop`` (marks, turn changes, an underrun).
    queues = PlayoutQueue(), PlayoutQueue()
    for q in queues:
        q.begin_turn("a", now=0.0)
        push_frames(q, "a", 3)
        q.mark("a", "m1")
        push_frames(q, "a", 2, start=3)
        q.end_turn("a")
        q.begin_turn("b", now=0.0)
        push_frames(q, "b", 2)
    by_frame, by_payload = queues
    assert by_payload.popped_turn_id is None
    for k in range(9):
        now = k * 0.020
        f = by_frame.pop(now)
        payload = by_payload.pop_payload(now)
        assert (None if f is None else f.payload) == payload, k
        if f is not None:
            assert by_payload.popped_turn_id == f.turn_id
            assert by_payload.played_samples(f.turn_id) == f.position_samples + SPF
        assert by_payload.events_received() == by_frame.events_received(), k
    assert by_payload.stats() == by_frame.stats()
    assert by_payload.stats().underruns == 2

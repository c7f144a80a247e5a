"""Flow control's decisions (``bridge.providers.flow``) with numbers for time: when a read
pauses the connection, until when, and when a turn's arrival or end resumes it."""

from __future__ import annotations

from bridge.providers.base import MULAW_8K, AudioFormat
from bridge.providers.flow import FLOW_PAUSE_MAX_S, FlowControl, TurnClock

PCM_24K = AudioFormat("pcm_s16le", 24_000)
ONE_S_MULAW = 8000  # bytes


def test_a_turn_clock_counts_audio_from_its_arrival_without_gaps() -> None:
    clock = TurnClock()
    clock.add(ONE_S_MULAW, MULAW_8K, now=100.0)
    assert clock.due_at == 101.0
    clock.add(ONE_S_MULAW // 2, MULAW_8K, now=100.2)  # queued behind the first second
    assert clock.due_at == 101.5
    clock.add(ONE_S_MULAW, MULAW_8K, now=103.0)  # ran out meanwhile: starts at its arrival
    assert clock.due_at == 104.0
    clock.add(48_000, PCM_24K, now=103.0)  # one second of 24 kHz 16-bit
    assert clock.due_at == 105.0


def _ahead(flow: FlowControl, turn_id: str, seconds: float, now: float) -> None:
    flow.audio(turn_id, int(seconds * ONE_S_MULAW), MULAW_8K, now)


def test_a_read_pauses_only_when_every_turn_is_well_ahead() -> None:
    flow = FlowControl()
    assert flow.open_turn("a") is False and flow.open_turn("b") is False
    _ahead(flow, "a", 10.0, 1000.0)
    _ahead(flow, "b", 3.0, 1000.0)
    assert flow.after_read(1000.0, 2, True, 4.0, 2.0) is None  # b needs audio
    _ahead(flow, "b", 3.0, 1000.0)  # b: 6 s ahead
    resume_at = flow.after_read(1000.0, 2, True, 4.0, 2.0)
    assert resume_at == 1004.0 and flow.paused  # when b is down to 2 s ahead
    assert flow.after_read(1000.0, 2, True, 4.0, 2.0) is None  # paused already


def test_a_pause_lasts_at_most_pause_max_s() -> None:
    flow = FlowControl()
    flow.open_turn("a")
    _ahead(flow, "a", 60.0, 0.0)
    assert flow.after_read(0.0, 1, True, 4.0, 2.0) == FLOW_PAUSE_MAX_S


def test_no_pause_while_off_unable_or_a_turn_has_no_clock() -> None:
    flow = FlowControl()
    flow.open_turn("a")
    _ahead(flow, "a", 60.0, 0.0)
    assert flow.after_read(0.0, 1, True, None, 2.0) is None  # flow control off
    assert flow.after_read(0.0, 1, False, 4.0, 2.0) is None  # a ping awaits its pong
    assert flow.after_read(0.0, 2, True, 4.0, 2.0) is None  # an agent's turn: no clock
    assert not flow.paused
    assert FlowControl().after_read(0.0, 0, True, 4.0, 2.0) is None  # no turn at all


def test_a_new_turn_or_the_last_turn_ending_resumes_reading() -> None:
    flow = FlowControl()
    flow.open_turn("a")
    _ahead(flow, "a", 60.0, 0.0)
    assert flow.after_read(0.0, 1, True, 4.0, 2.0) is not None
    assert flow.open_turn("b") is True  # b needs its first audio
    assert flow.resumed() is True and not flow.paused
    assert flow.resumed() is False
    _ahead(flow, "b", 60.0, 0.0)
    assert flow.after_read(0.0, 2, True, 4.0, 2.0) is not None
    assert flow.drop_turn("a") is False  # b is still held back
    assert flow.drop_turn("b") is True  # nothing left to hold back
    assert flow.clocks == {}

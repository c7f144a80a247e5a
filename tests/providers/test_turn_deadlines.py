"""Turn deadlines (``bridge.providers.turn_deadlines``) with numbers for time: a stalled
turn and a trickling turn fail; one whose provider keeps answering does not."""

from __future__ import annotations

from bridge.providers.base import MULAW_8K
from bridge.providers.turn_deadlines import TurnDeadlines

STALL_S, BASE_S, S_PER_CHAR = 10.0, 15.0, 0.25


def _late(deadlines: TurnDeadlines, now: float) -> list[str]:
    return [turn_id for turn_id, _ in deadlines.late(now, STALL_S, BASE_S, S_PER_CHAR)]


def test_a_turn_owed_a_reply_fails_after_the_stall_time() -> None:
    deadlines = TurnDeadlines()
    watch, first = deadlines.watch("t", 0.0)
    assert first is True and deadlines.watch("t", 1.0) == (watch, False)
    assert _late(deadlines, 100.0) == []  # owed nothing yet
    watch.text(10, 1.0)
    assert _late(deadlines, 10.9) == []
    [(turn_id, message)] = deadlines.late(11.0, STALL_S, BASE_S, S_PER_CHAR)
    assert turn_id == "t" and "10 s" in message


def test_a_reply_moves_the_stall_deadline_and_audio_extends_the_total() -> None:
    deadlines = TurnDeadlines()
    watch, _ = deadlines.watch("t", 0.0)
    watch.text(20, 0.0)  # total: 15 + 20 * 0.25 = 20 s after its last text
    watch.end(0.0)
    for now in range(2, 20, 2):  # a frame of audio every 2 s: never stalled
        deadlines.progress("t", float(now), b"\xff" * 160, MULAW_8K)
        assert _late(deadlines, float(now)) == []
    deadlines.progress("t", 20.0, b"\xff" * 16_000, MULAW_8K)  # 2 s more to play
    assert _late(deadlines, 21.9) == []
    [(_, message)] = deadlines.late(22.5, STALL_S, BASE_S, S_PER_CHAR)
    assert message.startswith("not done")


def test_an_ended_turn_stays_owed_and_a_dropped_one_is_forgotten() -> None:
    deadlines = TurnDeadlines()
    watch, _ = deadlines.watch("t", 0.0)
    watch.end(0.0)
    deadlines.progress("t", 5.0, None, None)  # words, not the end: still owed
    assert watch.owed_since == 0.0
    assert _late(deadlines, 15.0) == ["t"]
    deadlines.drop("t")
    assert not deadlines and _late(deadlines, 100.0) == []
    deadlines.progress("t", 101.0, None, None)  # late events of a dropped turn: ignored
    assert not deadlines

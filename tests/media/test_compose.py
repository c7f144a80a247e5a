"""The three media pieces composed the way a call uses them, all on fake time."""

from __future__ import annotations

from bridge.media.bargein import BargeInDetector, BargeInTriggered
from bridge.media.clock import Ticker, TickerConfig
from bridge.media.playout import PlayoutQueue, TurnPlaybackStarted

BOT_DBFS = -12.0


def test_caller_interrupts_a_paced_turn_and_played_samples_match_frames_sent() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=20))
    ticker.add("other", now=0.0)  # takes slot 0
    clock = ticker.add("call", now=0.0, ts0=4000)  # slot 1: 1 ms phase
    queue = PlayoutQueue()
    detector = BargeInDetector()
    queue.begin_turn("t1", now=0.0)
    for _ in range(100):  # 2 s of bot audio
        queue.push("t1", b"\xff" * 160)
    queue.end_turn("t1")

    sent: list[tuple[int, int]] = []  # (rtp timestamp, position)
    trigger: BargeInTriggered | None = None
    caller_speaks_from_s = 0.5
    while trigger is None:
        now = ticker.next_deadline()
        assert now is not None
        for key in ticker.due(now):
            n = ticker.clock(key).tick(now)
            if key != "call" or n is None:
                continue
            frame = queue.pop(now)
            detector.set_bot_speaking(queue.current_turn_id is not None)
            if frame is not None:
                sent.append((clock.rtp_timestamp(n), frame.position_samples))
                detector.record_bot_level(BOT_DBFS, now)
            # The caller's inbound frame for this tick: loud speech after 0.5 s.
            loud = now >= caller_speaks_from_s
            trigger = detector.observe(loud, -10.0 if loud else -70.0, now)
            if trigger is not None:
                break

    cuts = queue.barge_in(trigger.now)
    assert [c.turn_id for c in cuts] == ["t1"]
    assert cuts[0].played_samples == 160 * len(sent)
    assert cuts[0].dropped_frames == 100 - len(sent)
    assert trigger.onset_s >= caller_speaks_from_s
    assert trigger.now - trigger.onset_s < 0.16
    # Frames went out on the call's phase with continuous RTP timestamps.
    assert [ts for ts, _ in sent] == [4000 + 160 * i for i in range(len(sent))]
    assert [pos for _, pos in sent] == [160 * i for i in range(len(sent))]
    started = [e for e in queue.events_received() if isinstance(e, TurnPlaybackStarted)]
    assert started[0].now == clock.deadline(0) - clock.config.early_tolerance_s
    assert clock.deadline(0) == 0.001

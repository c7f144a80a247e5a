"""MediaClock and Ticker, driven with plain numbers for time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import LocalProtocolError
from bridge.media.clock import ClockConfig, MediaClock, Ticker, TickerConfig

TOL_S = 0.001


def drain(clock: MediaClock, now: float) -> list[int]:
    """What a shell does on a wake-up: tick until nothing is due."""
    sent: list[int] = []
    while (n := clock.tick(now)) is not None:
        sent.append(n)
    return sent


def test_deadlines_are_absolute_without_drift() -> None:
    clock = MediaClock(origin_s=1000.0)
    assert clock.deadline(0) == 1000.0
    assert clock.deadline(1_000_000) == pytest.approx(21000.0, abs=1e-9)
    # Accumulating 0.020 a million times drifts; the clock does not accumulate.
    accumulated_s = 1000.0
    for _ in range(1_000_000):
        accumulated_s += 0.020
    assert abs(accumulated_s - 21000.0) > 1e-9


def test_million_frames_on_time_with_jittery_wakeups() -> None:
    clock = MediaClock(origin_s=5.0)
    jitter_s = (0.0009, -0.0004, 0.0, 0.0007, -0.0009)  # the shell wakes +-1 ms
    for i in range(1_000_000):
        now = clock.next_deadline() + TOL_S + jitter_s[i % 5]
        assert clock.tick(now) == i
        assert clock.tick(now) is None  # never twice, never ahead
    stats = clock.stats()
    assert stats.frames_sent == 1_000_000
    assert (stats.late_wakeups, stats.skipped_frames, stats.caught_up_frames) == (0, 0, 0)
    assert clock.deadline(clock.next_frame) == pytest.approx(5.0 + 1_000_000 * 0.020, abs=1e-9)


def test_rtp_timestamp_from_index_wraps_mod_2_32() -> None:
    clock = MediaClock(origin_s=0.0, ts0=2**32 - 320)
    assert clock.rtp_timestamp(0) == 2**32 - 320
    assert clock.rtp_timestamp(1) == 2**32 - 160
    assert clock.rtp_timestamp(2) == 0
    assert clock.rtp_timestamp(3) == 160
    for n in range(5):
        assert (clock.rtp_timestamp(n + 1) - clock.rtp_timestamp(n)) % 2**32 == 160
    round_trip = MediaClock(origin_s=0.0, ts0=12345, config=ClockConfig(samples_per_frame=256))
    assert round_trip.rtp_timestamp(2**24) == 12345  # 2**24 frames of 256 = one full wrap
    assert round_trip.rtp_timestamp(2**24 + 1) == 12345 + 256
    wide = MediaClock(origin_s=0.0, ts0=7, config=ClockConfig(samples_per_frame=320))
    assert wide.rtp_timestamp(10) == 7 + 3200


def test_nothing_due_before_origin_or_too_early() -> None:
    clock = MediaClock(origin_s=10.0)
    assert clock.tick(9.5) is None
    assert clock.tick(10.0 - 0.0015) is None  # 1.5 ms early: beyond tolerance
    assert clock.tick(10.0 - 0.0009) == 0  # 0.9 ms early: within tolerance
    assert clock.tick(10.0) is None


def test_early_wake_within_tolerance_counts_as_due() -> None:
    clock = MediaClock(origin_s=0.0, config=ClockConfig(early_tolerance_s=0.0005))
    assert clock.next_deadline() == pytest.approx(-0.0005)
    assert clock.tick(-0.0004) == 0
    assert clock.tick(0.020 - 0.0006) is None
    assert clock.tick(0.020 - 0.0005) == 1


def test_slightly_late_wake_sends_the_one_due_frame() -> None:
    clock = MediaClock(origin_s=0.0)
    assert drain(clock, 0.0) == [0]
    assert drain(clock, 0.020 + 0.015) == [1]  # 15 ms late: still one frame
    assert drain(clock, 0.040 + 0.001) == [2]
    assert clock.stats().late_wakeups == 0


def test_late_by_whole_frames_within_limit_catches_up_without_loss() -> None:
    clock = MediaClock(origin_s=0.0, config=ClockConfig(max_late_frames=2))
    drain(clock, 0.0)
    assert drain(clock, 0.020 + 0.041) == [1, 2, 3]  # frame 1 is 2 whole periods late
    stats = clock.stats()
    assert stats.caught_up_frames == 2
    assert (stats.late_wakeups, stats.skipped_frames) == (0, 0)


def test_no_burst_after_200_ms_stall() -> None:
    clock = MediaClock(origin_s=0.0, ts0=1000, config=ClockConfig(max_late_frames=2))
    assert drain(clock, 0.0) == [0]
    sent = drain(clock, 0.220)  # frame 1 was due at 0.020: 10 periods late
    assert sent == [11]
    assert clock.rtp_timestamp(11) == 1000 + 11 * 160  # time stays continuous
    stats = clock.stats()
    assert stats.late_wakeups == 1
    assert stats.skipped_frames == 10
    assert drain(clock, 0.240) == [12]


def test_stall_with_zero_tolerance_for_lateness_skips_every_late_frame() -> None:
    clock = MediaClock(origin_s=0.0, config=ClockConfig(max_late_frames=0))
    drain(clock, 0.0)
    assert drain(clock, 0.041) == [2]
    assert clock.stats().skipped_frames == 1


def test_invalid_config_is_our_error() -> None:
    with pytest.raises(LocalProtocolError):
        MediaClock(0.0, config=ClockConfig(ptime_s=0.0))
    with pytest.raises(LocalProtocolError):
        MediaClock(0.0, config=ClockConfig(max_late_frames=-1))


def test_ticker_spreads_phases_over_slots() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=20))
    keys = [f"call-{i}" for i in range(40)]
    for key in keys:
        ticker.add(key, now=0.0)
    phases = sorted({round(ticker.phase_s(k), 6) for k in keys})
    assert phases == [round(i * 0.001, 6) for i in range(20)]
    # Each 1 ms wake-up serves two of the forty calls, never all of them.
    for i in range(20):
        now = ticker.next_deadline()
        assert now is not None
        assert now == pytest.approx(i * 0.001 - TOL_S)
        due = ticker.due(now)
        assert len(due) == 2
        for key in due:
            assert ticker.clock(key).tick(now) == 0


def test_ticker_reuses_freed_slot() -> None:
    ticker: Ticker[int] = Ticker(TickerConfig(slots=4))
    for k in range(4):
        ticker.add(k, now=0.0)
    ticker.remove(2)
    ticker.add(99, now=0.0)
    assert ticker.phase_s(99) == pytest.approx(ticker.phase_s(1) + 0.005)
    assert len(ticker) == 4


def test_ticker_first_deadline_is_next_slot_time() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=4, epoch_s=0.0))
    ticker.add("a", now=0.0)  # slot 0: 0.000, 0.020, ...
    ticker.add("b", now=0.0)  # slot 1: 0.005, 0.025, ...
    clock = ticker.add("c", now=0.0513)  # slot 2: 0.010 + m * 0.020 >= 0.0513
    assert clock.origin_s == pytest.approx(0.070)
    assert clock.origin_s - 0.0513 <= 0.020


def test_ticker_next_deadline_and_due_order() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=4))
    assert ticker.next_deadline() is None
    assert ticker.due(1.0) == []
    for key in ("a", "b", "c"):
        ticker.add(key, now=0.0)
    assert ticker.next_deadline() == pytest.approx(0.0 - TOL_S)
    assert ticker.due(0.0) == ["a"]
    ticker.clock("a").tick(0.0)
    assert ticker.next_deadline() == pytest.approx(0.005 - TOL_S)
    # A late wake: everything due comes out earliest deadline first.
    assert ticker.due(0.0205) == ["b", "c", "a"]


def test_ticker_keeps_a_stream_due_until_it_is_ticked() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=1))
    ticker.add("a", now=0.0)
    assert ticker.due(0.0) == ["a"]
    assert ticker.due(0.0) == ["a"]  # not ticked: still due
    ticker.clock("a").tick(0.0)
    assert ticker.due(0.0) == []
    assert ticker.next_deadline() == pytest.approx(0.020 - TOL_S)


def test_ticker_early_wake_within_tolerance() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=2))
    ticker.add("a", now=0.0)
    ticker.add("b", now=0.0)  # deadlines at 0.010 + m * 0.020
    ticker.clock("a").tick(0.0)  # out of band: the ticker copes
    assert ticker.due(0.010 - 0.0015) == []
    assert ticker.due(0.010 - 0.0008) == ["b"]
    assert ticker.clock("b").tick(0.010 - 0.0008) == 0


def test_ticker_removed_stream_is_never_due() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=2))
    ticker.add("a", now=0.0)
    ticker.add("b", now=0.0)
    ticker.remove("a")
    ticker.remove("unknown")
    assert ticker.due(0.1) == ["b"]
    ticker.remove("b")
    assert ticker.next_deadline() is None
    ticker.add("c", now=0.0)
    with pytest.raises(LocalProtocolError):
        ticker.add("c", now=0.0)


def test_ticker_drives_many_streams_without_loss() -> None:
    ticker: Ticker[int] = Ticker(TickerConfig(slots=20))
    for k in range(50):
        ticker.add(k, now=0.0)
    sent: dict[int, list[int]] = {k: [] for k in range(50)}
    wakeups = 0
    while wakeups < 20 * 50:
        wake_s = ticker.next_deadline()
        assert wake_s is not None
        now = wake_s + 0.0007  # the timer fires a little late
        for key in ticker.due(now):
            while (n := ticker.clock(key).tick(now)) is not None:
                sent[key].append(n)
        wakeups += 1
    frames = min(len(v) for v in sent.values())
    assert frames >= 49
    for k in range(50):
        assert sent[k][:frames] == list(range(frames))
        assert ticker.clock(k).stats().late_wakeups == 0


def test_start_talkspurt_sends_the_next_frame_now_with_contiguous_timestamps() -> None:
    clock = MediaClock(origin_s=100.0, ts0=1000)
    assert clock.tick(100.0) == 0
    assert clock.tick(100.020) == 1
    # a turn's first audio exists at 100.0265: 13.5 ms before frame 2's slot
    now = 100.0265
    assert clock.tick(now) is None
    shift = clock.start_talkspurt(now)
    assert abs(shift - 0.0135) < 1e-9
    n = clock.tick(now)
    assert n == 2
    assert clock.rtp_timestamp(n) == 1000 + 2 * 160  # no overlap, no gap
    assert abs(clock.deadline(3) - (now + 0.020)) < 1e-9  # later frames follow the new grid
    assert clock.tick(now + 0.0185) is None  # not due before its tolerance window
    assert clock.tick(now + 0.020) == 3
    assert clock.stats().rephased == 1


def test_start_talkspurt_never_moves_a_due_frame_or_the_grid_later() -> None:
    clock = MediaClock(origin_s=0.0)
    assert clock.tick(0.0) == 0
    before = clock.deadline(1)
    assert clock.start_talkspurt(0.0195) == 0.0  # frame 1 is already due (tolerance)
    assert clock.deadline(1) == before
    assert clock.stats().rephased == 0


def test_ticker_start_talkspurt_makes_the_stream_due_now() -> None:
    ticker: Ticker[str] = Ticker()
    clock = ticker.add("a", now=0.0)
    deadline = ticker.next_deadline()
    assert deadline is not None
    assert ticker.due(deadline) == ["a"]
    assert clock.tick(deadline) == 0
    now = deadline + 0.005
    assert ticker.due(now) == []
    ticker.start_talkspurt("a", now)
    assert ticker.next_deadline() is not None and ticker.next_deadline() <= now
    assert ticker.due(now) == ["a"]
    assert clock.tick(now) == 1


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "talkspurt", "wake", "tick_outside"]),
            st.integers(0, 4),
            st.one_of(st.just(0.0), st.floats(0.0, 0.002), st.floats(0.0, 0.045)),
        ),
        max_size=80,
    )
)
def test_ticker_buckets_agree_with_every_clock(ops: list[tuple[str, int, float]]) -> None:
    """Whatever the order of adds, removals, re-phases and wakes, ``due`` and
    ``next_deadline`` say what the clocks themselves say (a brute-force scan)."""
    ticker: Ticker[int] = Ticker(TickerConfig(slots=5, epoch_s=0.0005))
    live: set[int] = set()
    ticked_outside = False  # then next_deadline() may be early (a spare wake-up), never late
    now = 0.0
    for op, key, step in ops:
        now += step
        if op == "add":
            if key not in live:
                ticker.add(key, now)
                live.add(key)
        elif op == "remove":
            ticker.remove(key)
            live.discard(key)
        elif op == "talkspurt":
            if key in live:
                clock = ticker.clock(key)
                own_s = clock.deadline(clock.next_frame)
                due_s = ticker.start_talkspurt(key, now)
                assert due_s == pytest.approx(clock.deadline(clock.next_frame), abs=1e-12)
                assert due_s <= own_s + 1e-12  # never later than its own grid
                # due now (or already), or held by at most one bucket plus the phase
                assert clock.next_deadline() <= now or due_s <= now + 0.0015 + 1e-9
        elif op == "tick_outside":
            if key in live:
                ticked_outside = ticker.clock(key).tick(now) is not None or ticked_outside
        else:
            wakes = [ticker.clock(k).next_deadline() for k in live]
            earliest = ticker.next_deadline()
            if not wakes:
                assert earliest is None
            else:
                assert earliest is not None and earliest <= min(wakes)
                assert ticked_outside or earliest == min(wakes)
            due = ticker.due(now)
            assert len(due) == len(set(due))
            assert set(due) == {k for k in live if ticker.clock(k).next_deadline() <= now + 1e-9}
            for k in due:
                if step < 0.01:  # sometimes a due stream is not ticked: it stays due
                    assert ticker.clock(k).tick(now) is not None
    assert len(ticker) == len(live)


def test_ticker_removing_the_earliest_stream_of_a_bucket() -> None:
    # talkspurt_buckets=1: the re-phases below must land where they are asked
    ticker: Ticker[str] = Ticker(TickerConfig(slots=1, talkspurt_buckets=1))
    ticker.add("a", now=0.0)
    ticker.add("b", now=0.0)
    ticker.start_talkspurt("b", -0.0103)  # b's wake-up lands in the same 1 ms as a's
    ticker.start_talkspurt("a", -0.0106)  # ... a's earlier in it
    assert ticker.next_deadline() == pytest.approx(-0.0106 - TOL_S)
    ticker.remove("a")
    assert ticker.next_deadline() == pytest.approx(-0.0103 - TOL_S)
    ticker.remove("b")
    assert ticker.next_deadline() is None


def test_ticker_a_stream_removed_and_added_again_while_due_is_queued_once() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=1))
    ticker.add("a", now=0.0)
    assert ticker.due(0.0) == ["a"]
    ticker.remove("a")  # the call ended in its frame callback ...
    ticker.add("a", now=0.005)  # ... and a new one took the same key
    assert ticker.due(0.021) == ["a"]
    assert ticker.due(0.021) == ["a"]  # not ticked: still due, and only once
    assert len(ticker) == 1


def test_start_talkspurt_at_a_later_time_moves_the_grid_there_and_never_later() -> None:
    clock = MediaClock(origin_s=0.0, ts0=500)
    assert clock.tick(0.0) == 0
    # frame 1 is due at 0.020; a talkspurt asked at 0.0052 to leave at 0.0065
    assert clock.start_talkspurt(0.0052, 0.0065) == pytest.approx(0.0135)
    assert clock.deadline(1) == pytest.approx(0.0065)
    assert clock.tick(0.0052) is None  # held: not due before its tolerance window
    assert clock.tick(0.0065) == 1
    assert clock.rtp_timestamp(1) - clock.rtp_timestamp(0) == 160
    assert clock.deadline(2) == pytest.approx(0.0265)
    # an instant at or after the grid's own next deadline changes nothing
    assert clock.start_talkspurt(0.010, 0.0265) == 0.0
    assert clock.start_talkspurt(0.010, 0.030) == 0.0
    assert clock.deadline(2) == pytest.approx(0.0265)
    assert clock.stats().rephased == 1


def _spread_ticker(streams: int, buckets: int = 2, share: float = 1.25) -> Ticker[int]:
    """Streams on 20 slots of 1 ms, half a millisecond into it (the shell's phases)."""
    config = TickerConfig(epoch_s=0.0005, talkspurt_buckets=buckets, talkspurt_share=share)
    ticker: Ticker[int] = Ticker(config)
    for k in range(streams):
        ticker.add(k, now=0.0)  # stream k on slot k % 20: due at 0.0005 + (k % 20) * 0.001
    return ticker


def _bucket_sizes(ticker: Ticker[int], keys: range) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for k in keys:
        b = math.floor(ticker.clock(k).next_deadline() / 0.001)
        sizes[b] = sizes.get(b, 0) + 1
    return sizes


def test_a_cluster_of_talkspurt_starts_spreads_over_the_next_bucket() -> None:
    ticker = _spread_ticker(40, share=0)  # two streams per 1 ms bucket; the two-bucket rule
    now = 0.0102  # a frame due now waits in bucket 9 (wake-up 9.2 ms): 2 streams there
    cluster = [k for k in range(40) if k % 20 >= 15]  # own grids 15.5-19.5 ms: far off
    due_at = [ticker.start_talkspurt(k, now + i * 10e-6) for i, k in enumerate(cluster)]
    # at once or in the next bucket, on the slot phase of its millisecond: never later
    assert sorted({round(t, 7) for t in due_at}) == [
        round(now + i * 10e-6, 7) for i in (0, 2, 4, 6, 8)
    ] + [0.0115]
    assert all(t - now <= 0.0015 + 1e-9 for t in due_at)
    sizes = _bucket_sizes(ticker, range(40))
    assert sizes[9] == sizes[10] == 7  # 2 + 5 each, where the old rule made it 12 and 2
    at_once = {k for k, t in zip(cluster, due_at, strict=True) if t < 0.011}
    assert set(ticker.due(now + 0.0001)) & set(cluster) == at_once

    old_rule = _spread_ticker(40, buckets=1)
    for i, k in enumerate(cluster):
        assert old_rule.start_talkspurt(k, now + i * 10e-6) == pytest.approx(now + i * 10e-6)
    assert _bucket_sizes(old_rule, range(40))[9] == 12


def test_a_cluster_over_the_next_buckets_share_goes_on_to_a_bucket_within_it() -> None:
    ticker = _spread_ticker(40)  # two streams per bucket; a bucket's share: ceil(2.5) + 1 = 4
    now = 0.0102  # as above: bucket 9 holds 2 streams, bucket 10 holds 2
    cluster = [k for k in range(40) if k % 20 >= 15]  # own grids 15.5-19.5 ms
    own = {k: ticker.clock(k).next_deadline() + ticker.clock(k)._tolerance_s for k in cluster}
    due_at = {k: ticker.start_talkspurt(k, now + i * 10e-6) for i, k in enumerate(cluster)}
    sizes = _bucket_sizes(ticker, range(40))
    assert max(sizes.values()) <= 4  # no bucket over its share
    assert sizes[9] == sizes[10] == 4  # the nearest two filled to their share first
    assert all(due_at[k] <= own[k] + 1e-9 for k in cluster)  # never later than its own grid
    # the first four leave at once or in the next bucket, as under the two-bucket rule
    assert sorted(due_at.values())[:4] == pytest.approx([now, now + 20e-6, 0.0115, 0.0115])


def _phase_locked_turns(share: float) -> tuple[dict[int, int], list[float]]:
    """60 streams (3 per bucket), each starting a turn at the same phase of the period one
    after the other (one every two periods, as a load generator's 25 calls/s, or a flow's
    gather timeout a whole number of periods after the turn before): the buckets' sizes
    afterwards, and how much later than asked each first frame is due."""
    ticker = _spread_ticker(60, share=share)
    held: list[float] = []
    for step in range(60 * 40 + 40):
        now = step * 0.001 + 0.0007
        for key in ticker.due(now):
            assert ticker.clock(key).tick(now) is not None
        if step % 40 == 0 and step // 40 < 60:
            key = step // 40
            own_s = ticker.clock(key).next_deadline() + ticker.clock(key)._tolerance_s
            due_s = ticker.start_talkspurt(key, now)
            assert due_s <= own_s + 1e-9  # never later than its own grid
            held.append(due_s - now)
    per_phase: dict[int, int] = {}
    for k in range(60):
        b = math.floor(ticker.clock(k).next_deadline() / 0.001) % 20
        per_phase[b] = per_phase.get(b, 0) + 1
    return per_phase, held


def test_turns_starting_at_the_same_phase_stay_spread_over_the_period() -> None:
    two_buckets, _ = _phase_locked_turns(share=0)
    assert max(two_buckets.values()) >= 25  # the two-bucket rule piles them up (30 and 30)
    spread, held = _phase_locked_turns(share=1.25)
    assert max(spread.values()) <= 5  # ceil(1.25 * 3) + 1: within the share
    assert sum(spread.values()) == 60 and len(spread) >= 12
    assert sum(h < 0.0015 for h in held) >= 5  # the first of them left at once or next ms


def test_a_held_first_frame_leaves_at_the_chosen_time_on_a_grid_anchored_there() -> None:
    ticker = _spread_ticker(40)
    while (wake_s := ticker.next_deadline()) is not None and wake_s < 0.0194:  # one period
        for key in ticker.due(wake_s + 0.0007):
            assert ticker.clock(key).tick(wake_s + 0.0007) is not None
    now = 0.0302  # a frame due now joins bucket 29 (slot 10's, 30.5 ms); bucket 30 is slot 11's
    assert ticker.start_talkspurt(15, now) == pytest.approx(now)  # 2 against 2: at once
    assert 15 in ticker.due(now) and ticker.clock(15).tick(now) == 1
    clock = ticker.clock(16)  # slot 16: frame 1 due at 36.5 ms
    assert ticker.start_talkspurt(16, now) == pytest.approx(0.0315)  # 3 against 2: held 1.3 ms
    assert 16 not in ticker.due(now)
    assert clock.tick(0.0315 - 0.0012) is None  # not before its tolerance window
    assert 16 in ticker.due(0.0315 - 0.0007)
    n = clock.tick(0.0315 - 0.0007)
    assert n == 1
    assert clock.rtp_timestamp(n) - clock.rtp_timestamp(n - 1) == 160  # no gap, no overlap
    assert clock.deadline(n) == pytest.approx(0.0315)  # the grid: anchored on the chosen time
    assert clock.deadline(n + 1) == pytest.approx(0.0515)
    assert clock.stats().rephased == 1


def test_a_talkspurt_on_an_idle_ticker_or_in_the_lightest_bucket_leaves_now() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(epoch_s=0.0005))
    clock = ticker.add("a", now=0.0)
    assert clock.tick(0.0005) == 0
    assert ticker.start_talkspurt("a", 0.0071) == pytest.approx(0.0071)
    assert ticker.due(0.0071) == ["a"] and clock.tick(0.0071) == 1
    # a start whose bucket is lighter than the next one, or as light, leaves now
    light = _spread_ticker(22)  # slots 0 and 1 hold 2 streams each, the others 1
    light.remove(20)  # slot 0 (0.5 ms, bucket -1): 1 stream; slot 1 (bucket 0): 2
    assert light.start_talkspurt(15, 0.0006) == pytest.approx(0.0006)  # 1 against 2
    assert light.start_talkspurt(16, 0.0006) == pytest.approx(0.0006)  # 2 against 2
    assert set(light.due(0.0006)) >= {15, 16}


def test_a_stream_whose_own_grid_comes_first_keeps_it() -> None:
    ticker = _spread_ticker(40)
    clock = ticker.clock(11)  # slot 11: due at 11.5 ms, waiting in bucket 10 with stream 31
    # now: bucket 9 (slot 10) holds 2; the next bucket is its own, holding 1 besides it
    assert ticker.start_talkspurt(11, 0.0101) == pytest.approx(0.0115)
    assert clock.stats().rephased == 0 and clock.deadline(0) == pytest.approx(0.0115)


def test_talkspurt_buckets_must_be_positive() -> None:
    with pytest.raises(LocalProtocolError):
        Ticker(TickerConfig(talkspurt_buckets=0))


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "talkspurt", "wake", "wake", "tick_outside"]),
            st.integers(0, 5),
            st.one_of(st.just(0.0), st.floats(0.0, 0.002), st.floats(0.0, 0.065)),
        ),
        max_size=120,
    ),
    st.integers(0, 2),
)
def test_tick_due_is_due_then_tick_of_each_stream(
    ops: list[tuple[str, int, float]], max_late_frames: int
) -> None:
    """``tick_due(now)`` hands out what ``due(now)`` and one ``tick(now)`` per due
    stream hand out (the way ``MediaTicker`` used them), in the same order, and
    leaves the same schedule: the same next deadlines, buckets and clocks."""
    config = TickerConfig(ClockConfig(max_late_frames=max_late_frames), slots=5, epoch_s=0.0005)
    _check_tick_due_against_due_and_tick(config, ops)


def test_tick_due_queues_a_caught_up_stream_behind_the_tail_of_its_bucket() -> None:
    """A stream caught up by one frame is still due: it goes back into the bucket
    being served, behind the streams of that bucket that were not due yet (as
    ``due()`` then the next call queued them)."""
    config = TickerConfig(
        ClockConfig(max_late_frames=2), slots=1, epoch_s=0.0005, talkspurt_buckets=1
    )
    ops = [("wake", 0, 0.0), ("wake", 0, 0.062285364207011196), ("add", 0, 0.0019603392697842828)]
    ops += [("talkspurt", 2, 0.02607578524256209), ("wake", 2, 0.057110969579385155)]
    ops += [("wake", 1, 0.001822514682354495), ("talkspurt", 2, 0.035629902278299506)]
    ops += [("wake", 2, 0.005848571042312201), ("talkspurt", 1, 0.00013571387342937235)]
    ops += [("talkspurt", 2, 0.0), ("add", 1, 0.012888230743372623)]
    ops += [("add", 1, 0.004962022381480836), ("wake", 2, 0.0011956952615211887)]
    ops += [("wake", 0, 0.0), ("talkspurt", 0, 0.0), ("wake", 2, 0.00047945229369114476)]
    ops += [("wake", 0, 0.017133448083109404), ("add", 0, 0.04798930154741013)]
    ops += [("talkspurt", 0, 0.03181219488452285), ("wake", 0, 0.0017954069315511587)]
    ops += [("talkspurt", 2, 0.0), ("wake", 0, 0.009852344389578702)]
    ops += [("wake", 2, 0.05370188762698536), ("talkspurt", 2, 8.767909515754169e-05)]
    ops += [("add", 2, 0.003545440556322976), ("wake", 2, 0.02065369640160298)]
    ops += [("wake", 0, 0.0018072145829310078), ("wake", 2, 0.0006043338975136607)]
    ops += [("talkspurt", 2, 0.0), ("wake", 2, 0.0)]
    _check_tick_due_against_due_and_tick(config, ops)


def _check_tick_due_against_due_and_tick(
    config: TickerConfig, ops: list[tuple[str, int, float]]
) -> None:
    reference: Ticker[int] = Ticker(config)
    fused: Ticker[int] = Ticker(config)
    live: set[int] = set()
    now = 0.0
    for op, key, step in ops:
        now += step
        if op == "add":
            if key not in live:
                reference.add(key, now)
                fused.add(key, now)
                live.add(key)
        elif op == "remove":
            reference.remove(key)
            fused.remove(key)
            live.discard(key)
        elif op == "talkspurt":
            if key in live:
                assert reference.start_talkspurt(key, now) == fused.start_talkspurt(key, now)
        elif op == "tick_outside":
            if key in live:
                assert reference.clock(key).tick(now) == fused.clock(key).tick(now)
        else:
            expected_keys: list[int] = []
            expected_frames: list[int] = []
            for k in reference.due(now):
                n = reference.clock(k).tick(now)
                if n is not None:
                    expected_keys.append(k)
                    expected_frames.append(n)
            assert fused.tick_due(now) == (expected_keys, expected_frames)
        assert fused.next_deadline() == reference.next_deadline()
        assert fused._buckets == reference._buckets
        assert fused._where == reference._where
        for k in live:
            assert fused.clock(k).stats() == reference.clock(k).stats()
            assert fused.clock(k).next_deadline() == reference.clock(k).next_deadline()


def test_tick_due_hands_out_one_frame_per_due_stream_and_skips_after_a_stall() -> None:
    ticker: Ticker[str] = Ticker(TickerConfig(slots=2, epoch_s=0.0005))
    ticker.add("a", now=0.0)
    ticker.add("b", now=0.0)
    assert ticker.tick_due(0.0) == (["a"], [0])  # b's slot is 10 ms later
    assert ticker.tick_due(0.0105) == (["b"], [0])
    assert ticker.tick_due(0.0105) == ([], [])  # nothing handed out twice
    assert ticker.tick_due(0.1) == (["a", "b"], [5, 4])  # a stall: skip ahead, never burst
    assert ticker.clock("a").stats().skipped_frames == 4
    assert ticker.clock("b").stats().skipped_frames == 3
    assert ticker.next_deadline() == pytest.approx(0.0105 + 5 * 0.02 - TOL_S)  # b's frame 5

"""Stall attribution (loadgen/hostspeed.py, bench_ivr.py): late packets grouped, stalls matched."""

from __future__ import annotations

from bench.loadgen.hostspeed import chance_pct, episodes_of, stalls_before

MS = 1_000_000


def test_late_packets_close_together_are_one_episode() -> None:
    late = [1000 * MS, 1001 * MS, 1040 * MS, 1200 * MS, 5000 * MS, 1002 * MS]
    assert episodes_of(late) == [(1000 * MS, 4), (1200 * MS, 1), (5000 * MS, 1)]
    assert episodes_of([]) == []


def test_a_stall_just_before_an_episode_is_its_cause_and_one_after_is_not() -> None:
    stalls = [(0.995, 6.4), (2.100, 3.0), (3.0045, 5.0)]  # (monotonic end s, length ms)
    episodes = [1000 * MS, 2000 * MS, 3000 * MS, 4000 * MS]
    # 1.000 s: a stall ended 5 ms before; 2.000 s: the next ends 100 ms after;
    # 3.000 s: one ends 4.5 ms later but had begun before (it overlaps); 4.000 s: none
    assert stalls_before(episodes, stalls) == [6.4, None, 5.0, None]


def test_chance_grows_with_the_stall_rate() -> None:
    assert chance_pct([(1.0, 3.0)] * 48, 60.0) == 2.4  # 48 a minute, 30 ms reach
    assert chance_pct([], 60.0) == 0.0


def test_bench_ivr_excursions_group_late_packets_and_name_their_stall() -> None:
    import numpy as np

    from bench.bench_ivr import excursions

    t0 = 1_000 * MS
    call_a = (
        np.array([t0 + 100 * MS, t0 + 120 * MS, t0 + 140 * MS, t0 + 3000 * MS]),
        np.array([1 * MS, 12 * MS, -15 * MS, 11 * MS]),
    )
    call_b = (np.array([t0 + 150 * MS]), np.array([4 * MS]))  # within the bound: not late
    stalls = [(1.118, 9.0)]  # ended 2 ms before the first late packet
    found = excursions([call_a, call_b], stalls, t0)
    assert found == [
        {
            "at_ms": 120,
            "span_ms": 20,
            "packets": 2,
            "calls": 1,
            "calls_sending": 1,
            "max_ms": 15.0,
            "stall_before_ms": 9.0,
        },
        {
            "at_ms": 3000,
            "span_ms": 0,
            "packets": 1,
            "calls": 1,
            "calls_sending": 1,
            "max_ms": 11.0,
            "stall_before_ms": None,
        },
    ]

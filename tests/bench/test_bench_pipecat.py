"""The peer comparison's verdicts and latency matching (bench/bench_pipecat.py)."""

from __future__ import annotations

from typing import Any

from bench.bench_pipecat import added_latency_ms, fed, no_underrun, peer_meets_bar


def step(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "calls": 10,
        "answered": 10,
        "calls_without_media": 0,
        "carrier_gaps": 0,
        "carrier_dry_ms_per_call_s": 0.0,
        "underruns": 0,
        "pacing": {"packets": 1000, "worst_call_p99_ms": 1.5},
    }
    s.update(over)
    return s


def test_the_bar_needs_pacing_no_underrun_and_no_carrier_gap() -> None:
    assert peer_meets_bar(step())
    assert not peer_meets_bar(step(pacing={"packets": 1000, "worst_call_p99_ms": 2.5}))
    assert not peer_meets_bar(step(carrier_gaps=1))
    assert not peer_meets_bar(step(underruns=1))
    assert not peer_meets_bar(step(calls_without_media=1))


def test_fed_tolerates_tiny_gaps_but_not_silent_calls_and_ignores_pacing() -> None:
    tiny = step(carrier_gaps=7, carrier_dry_ms_per_call_s=0.05, pacing={"packets": 9})
    assert fed(tiny)
    assert not no_underrun(tiny)
    assert not fed(step(carrier_dry_ms_per_call_s=2.5))
    assert not fed(step(calls_without_media=1))
    assert not fed(step(answered=9))


def test_latency_is_from_the_first_ttsd_chunk_inside_the_calls_window() -> None:
    chunks = [0.5, 10.001, 10.05, 20.2]  # 0.5: an earlier call; 10.05: a later job
    got = added_latency_ms([(10.0, 10.004), (20.0, None)], chunks)
    assert got["n"] == 1
    assert got["missing"] == 1
    assert abs(got["p50_ms"] - 3.0) < 1e-6

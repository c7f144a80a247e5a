"""The capacity bar (bench/loadgen/steps.py): underruns count against the daemon only
when it caused them."""

from __future__ import annotations

from typing import Any

from bench.loadgen.steps import meets_bar


def step(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "calls": 10,
        "answered": 10,
        "underruns": 0,
        "underruns_provider": 0,
        "underruns_daemon": 0,
        "pacing": {"packets": 1000, "worst_call_p99_ms": 1.5},
    }
    s.update(over)
    return s


def test_underruns_the_provider_caused_do_not_fail_the_bar_the_daemons_do() -> None:
    assert meets_bar(step())
    assert meets_bar(step(underruns=7, underruns_provider=7, underruns_daemon=0))
    assert not meets_bar(step(underruns=7, underruns_provider=6, underruns_daemon=1))
    assert not meets_bar(step(pacing={"packets": 1000, "worst_call_p99_ms": 2.5}))
    assert not meets_bar(step(answered=9))


def test_a_step_without_the_split_counts_every_underrun() -> None:
    old = step(underruns=1)
    del old["underruns_daemon"], old["underruns_provider"]
    assert not meets_bar(old)

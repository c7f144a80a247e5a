"""The GC policy: freeze while calls are up, thaw and collect when idle or every so often."""

from __future__ import annotations

import gc

import pytest

from bridge.config import ConfigError, parse_config
from bridge.io.gcpolicy import MAX_THAW_EVERY_S, SMALL_FIND, GcPolicy, apply, thaw_described

ROUTE = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""


def _steps(policy: GcPolicy, script: list[tuple[float, int]]) -> list[str | None]:
    return [policy.tick(now, calls) for now, calls in script]


def test_calls_up_freeze_every_period_and_an_idle_daemon_thaws_once() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=600.0)
    script = [(0.0, 0), (5.0, 0), (10.0, 3), (12.0, 3), (15.0, 3), (20.0, 0), (25.0, 0), (30.0, 0)]
    assert _steps(policy, script) == [None, None, "freeze", None, "freeze", "thaw", None, None]


def test_with_calls_up_all_along_a_thaw_comes_every_thaw_period() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    steps = _steps(policy, [(t, 100) for t in range(0, 65, 5)])
    assert steps == [None] + ["freeze"] * 5 + ["thaw"] + ["freeze"] * 5 + ["thaw"]


def test_thaws_that_find_nothing_space_the_busy_thaws_out_and_a_leak_brings_them_back() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    thaws: list[int] = []
    found = {30: 0, 90: 0, 210: 5000, 240: 0}  # what each thaw's collection finds
    for t in range(0, 400, 5):
        if policy.tick(float(t), 100) == "thaw":
            thaws.append(t)
            policy.thawed(found.get(t, 0))
    # 30 s, then 60 (found nothing), 120 (nothing again); a leak: 30 again; then 60
    assert thaws == [30, 90, 210, 240, 300]


def test_an_idle_thaw_that_finds_nothing_counts_too_and_the_interval_is_capped() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=600.0)
    assert policy.thawed(0) == 1200.0
    assert policy.thawed(SMALL_FIND - 1) == 2400.0  # a stray cycle is not a leak
    for _ in range(20):
        interval = policy.thawed(0)
    assert interval == MAX_THAW_EVERY_S
    assert policy.thawed(SMALL_FIND) == 600.0
    assert GcPolicy(5.0, thaw_every_s=2 * MAX_THAW_EVERY_S).thawed(0) == 2 * MAX_THAW_EVERY_S


def test_zero_switches_the_policy_off() -> None:
    policy = GcPolicy(freeze_every_s=0.0)
    assert _steps(policy, [(t, 10) for t in range(0, 1000, 5)]) == [None] * 200


def test_apply_freezes_and_a_thaw_collects_a_frozen_cycle() -> None:
    gc.collect()
    before = gc.get_freeze_count()
    try:
        cycle: list[object] = []
        cycle.append(cycle)
        assert apply("freeze") == 0 and gc.get_freeze_count() > before
        del cycle  # garbage now, but frozen: a plain collection does not see it
        assert gc.collect() == 0
        assert apply("thaw") >= 1  # unfrozen and collected
        assert apply(None) == 0
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(("key", "value"), [("gc_freeze_s", -1), ("gc_thaw_s", 0)])
def test_the_gc_keys_are_checked_by_name(key: str, value: int) -> None:
    cfg = parse_config("[daemon]\n" + ROUTE)
    assert (cfg.daemon.gc_freeze_s, cfg.daemon.gc_thaw_s) == (0.1, 600.0)
    with pytest.raises(ConfigError) as info:
        parse_config(f"[daemon]\n{key} = {value}\n" + ROUTE)
    assert f"daemon.{key}" in str(info.value)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_described_thaw_names_what_it_found_and_frees_it() -> None:
    gc.collect()
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gc.freeze()
        del a, b  # a frozen cycle: garbage only a thaw finds
        found, kinds = thaw_described()
        assert found >= 2
        assert (f"{__name__}._Node", 2) in kinds
        assert gc.get_debug() & gc.DEBUG_SAVEALL == 0 and gc.garbage == []
        gc.unfreeze()
        assert not any(isinstance(o, _Node) for o in gc.get_objects())  # freed, not kept
        assert thaw_described() == (0, [])  # nothing left: one pass, nothing named
    finally:
        gc.unfreeze()

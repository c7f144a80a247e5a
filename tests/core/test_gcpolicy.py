"""The GC policy: freeze while calls are up; thaw and collect when idle, or busy on evidence."""

from __future__ import annotations

import gc
import weakref

import pytest

from bridge.config import ConfigError, parse_config
from bridge.io.gcpolicy import (
    BLIND_THAW_S,
    SMALL_FIND,
    Canary,
    GcPolicy,
    ReleaseWatch,
    YoungFinds,
    apply,
    thaw_described,
)

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
    # idle, the thaw runs whatever the evidence says: it is cheap then
    again = GcPolicy(freeze_every_s=5.0, thaw_every_s=600.0)
    assert _steps(again, [(0.0, 1), (5.0, 1), (6.0, 0)]) == [None, "freeze", "thaw"]


def test_with_calls_up_and_no_evidence_the_busy_thaw_waits_the_blind_interval() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    steps = _steps(policy, [(t, 100) for t in range(0, 700, 5)])
    assert "thaw" not in steps and steps.count("freeze") == 139
    assert policy.busy_interval(False) == BLIND_THAW_S
    assert policy.tick(BLIND_THAW_S, 100) == "thaw"


def test_with_evidence_a_busy_thaw_comes_every_thaw_period() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    steps = [policy.tick(float(t), 100, evidence=True) for t in range(0, 65, 5)]
    assert steps == [None] + ["freeze"] * 5 + ["thaw"] + ["freeze"] * 5 + ["thaw"]


def test_evidence_is_a_call_not_released_or_the_young_passes_finding_enough() -> None:
    policy = GcPolicy()
    assert not policy.evidence(0, 0) and not policy.evidence(0, SMALL_FIND - 1)
    assert policy.evidence(1, 0) and policy.evidence(0, SMALL_FIND)


def test_evidence_counts_from_the_last_thaw_not_from_when_it_appeared() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    steps = [policy.tick(float(t), 100, evidence=t >= 25) for t in range(0, 40, 5)]
    assert steps == [None, "freeze", "freeze", "freeze", "freeze", "freeze", "thaw", "freeze"]


def test_a_thaw_that_finds_a_leak_keeps_busy_thaws_coming_until_one_finds_little() -> None:
    policy = GcPolicy(freeze_every_s=5.0, thaw_every_s=30.0)
    thaws: list[int] = []
    found = {30: 5000, 60: SMALL_FIND, 90: SMALL_FIND - 1}  # what each thaw's collection finds
    for t in range(0, 400, 5):
        if policy.tick(float(t), 100, evidence=t == 30) == "thaw":
            thaws.append(t)
            policy.thawed(found.get(t, 0))
    assert thaws == [30, 60, 90]  # then no evidence: the next is a day away
    assert policy.busy_interval(False) == BLIND_THAW_S
    assert GcPolicy(5.0, thaw_every_s=2 * BLIND_THAW_S).busy_interval(False) == 2 * BLIND_THAW_S


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


class _Call:
    """What holds a call's canary (the runner, in the daemon)."""

    def __init__(self) -> None:
        self.canary = Canary()
        self.me: _Call | None = None


def test_a_call_freed_when_it_ends_is_not_a_suspect() -> None:
    watch = ReleaseWatch(grace_s=10.0)
    call = _Call()
    watch.ended("a", call.canary, now=100.0)
    del call
    assert watch.check(109.0) == [] and watch.check(200.0) == []
    assert watch.suspects == 0 and watch.after_thaw() == ([], [])


@pytest.mark.usefixtures("no_cyclic_gc")
def test_a_call_left_in_a_cycle_is_a_suspect_after_the_grace_and_a_thaw_frees_it() -> None:
    watch = ReleaseWatch(grace_s=10.0)
    leaked, held, freed = _Call(), _Call(), _Call()
    leaked.me = leaked  # a reference cycle: only the collector frees it
    for i, call in enumerate((leaked, held, freed)):
        watch.ended(f"call-{i}", call.canary, now=100.0 + i)
    del leaked, freed, call  # `held` stays referenced: a leak no collection reclaims
    assert watch.check(109.9) == []  # within the grace: still being released
    assert watch.check(111.0) == ["call-0", "call-1"]
    assert watch.check(150.0) == [] and watch.suspects == 2  # each counted once
    gc.collect()
    assert watch.after_thaw() == (["call-0"], ["call-1"])
    assert watch.suspects == 0


def test_young_finds_counts_what_the_collectors_passes_find_until_taken() -> None:
    gc.collect()
    young = YoungFinds()
    assert young.found == 0
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    probe = weakref.ref(a)
    del a, b
    gc.collect(0)  # a young pass, as the collector runs them
    assert probe() is None
    assert young.found >= 2
    assert young.take() >= 2 and young.found == 0
    assert young.take() == 0


def test_release_free_heap_gives_fragmented_free_pages_back() -> None:
    """Buffers over Python's small-object size come from ``malloc``; freed between kept
    ones they stay in the process until ``malloc_trim`` (glibc, as on every Debian host)."""
    from bridge.io.gcpolicy import release_free_heap

    blocks = [bytes(4096) + bytes([i % 251]) for i in range(16_384)]  # about 64 MiB
    kept = blocks[::16]  # one block in 16 stays: the heap's top is never free
    del blocks
    released = release_free_heap()
    assert released >= 32 * 2**20, released  # most of the 60 MiB freed in the middle
    assert len(kept) == 1024
    assert release_free_heap() < 4 * 2**20  # nothing left to give back a second time

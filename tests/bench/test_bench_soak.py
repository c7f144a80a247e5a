"""The soak's verdicts from the daemon's log: CDRs, barge-ins, digits, and which
warnings the injected faults explain; its checkpoints' bookkeeping
(``bench/bench_soak.py``)."""

from __future__ import annotations

from typing import Any

from bench.bench_soak import FALLBACK_PROMPT, cdr_figures, unexplained


def test_a_warning_is_explained_only_when_it_names_the_killed_provider() -> None:
    events = [
        {"event": "tts.open_refused", "level": "warning", "provider": "flaky"},
        {"event": "tts.open_refused", "level": "warning", "provider": "fast"},
        {"event": "call.tick_failed", "level": "error", "call_id": "flaky-looking-id"},
        {"event": "tts.reconnect", "level": "info", "provider": "fast"},
    ]
    explained, other = unexplained(events)
    assert dict(explained) == {"tts.open_refused": 1}
    assert dict(other) == {"tts.open_refused": 1, "call.tick_failed": 1}


def test_a_warning_about_a_turn_a_fault_hit_is_explained_by_that_fault() -> None:
    events = [
        {"event": "provider.error", "level": "warning", "turn_id": "k7", "kind": "timeout"},
        {"event": "provider.error", "level": "warning", "turn_id": "k8", "kind": "timeout"},
    ]
    explained, other = unexplained(events, frozenset({"k7"}))
    assert dict(explained) == {"provider.error": 1}
    assert dict(other) == {"provider.error": 1}


def test_cdrs_barge_ins_and_digits_are_counted_by_route() -> None:
    events: list[dict[str, Any]] = [
        {"event": "call.started", "call_id": "a", "route": "long"},
        {"event": "call.started", "call_id": "b", "route": "ivr"},
        {"event": "call.dtmf", "call_id": "b"},
        {"event": "call.ended", "call_id": "a", "cdr": True, "reason": "stop",
         "barge_ins": {"speech": 1}, "provider_errors": 0},
        {"event": "call.ended", "call_id": "b", "cdr": True, "reason": "remote-bye",
         "barge_ins": {}, "provider_errors": 2},
    ]  # fmt: skip
    assert cdr_figures(events) == {
        "calls": 2,
        "dtmf_by_route": {"ivr": 1},
        "end_reasons": {"stop": 1, "remote-bye": 1},
        "bargeins_by_route": {"long": {"speech": 1}},
        "provider_errors_by_route": {"long": 0, "ivr": 2},
    }


def test_every_turn_a_fault_hit_is_classed_by_how_it_recovered() -> None:
    from types import SimpleNamespace

    from bench.bench_soak import turn_fault_figures

    proxy = SimpleNamespace(
        fraction=0.5,
        injected={"stall": 1, "drop": 1},
        faulted=[
            ("stall", "k1"),
            ("drop", "k2"),
            ("drop", "k3"),
            ("drop", "k4"),
            ("stall", "k6"),
            ("stall", "k7"),
        ],
        collateral_untokened=1,
        connections=2,
        upstream_failures=0,
    )
    turns = {
        "k1": ["turn.finished"],
        "k2": ["provider.error", "turn.finished"],
        "k3": ["turn.interrupted"],
        "k4": ["turn.finished"],
        "k5": ["turn.finished"],
        "k6": ["provider.error", "turn.started", "turn.interrupted"],
        "k7": ["provider.error", "turn.started", "turn.interrupted"],
    }
    interrupted = {
        "k3": ("provider_error", ""),
        "k6": ("provider_error", FALLBACK_PROMPT),  # the fallback heard whole: recovered
        "k7": ("provider_error", FALLBACK_PROMPT[:5]),  # cut short: not recovered
    }
    events = [
        {"event": "tts.failover", "turn_id": "k1", "provider": "flaky"},
        {"event": "tts.fallback_prompt", "turn_id": "k2", "provider": "fast"},
        {"event": "tts.failover", "turn_id": "k3", "provider": "flaky"},
        {"event": "tts.fallback_prompt", "turn_id": "k6", "provider": "flaky"},
        {"event": "tts.fallback_prompt", "turn_id": "k7", "provider": "flaky"},
    ]
    peers = SimpleNamespace(proxy=proxy, turns=turns, interrupted=interrupted)
    got = turn_fault_figures(peers, events)  # type: ignore[arg-type]
    assert got["turns_hit"] == 6
    assert got["turns_hit_by_kind"] == {
        "stall": {"failed_over": 1, "fell_back": 1, "not_recovered": 1},
        "drop": {"fell_back": 1, "not_recovered": 1, "finished_unexplained": 1},
    }
    assert got["not_recovered"] == [
        "drop k3: ['turn.interrupted']",
        "stall k7: ['provider.error', 'turn.started', 'turn.interrupted']",
    ]
    assert got["dyn_turns_finished_with_warmup"] == 4


def test_the_calls_are_cut_in_equal_parts_the_first_ones_longer_by_one() -> None:
    from bench.bench_soak import part_sizes

    assert part_sizes(10_000, 5) == [2000] * 5
    assert part_sizes(10, 3) == [4, 3, 3]
    assert part_sizes(10_000, 1) == [10_000]
    assert part_sizes(2, 5) == [1, 1]  # no empty part
    assert part_sizes(0, 3) == [0]


def test_each_part_s_rss_growth_is_taken_from_the_checkpoint_before_it() -> None:
    from bench.bench_soak import growth_by_part, plateau

    rss = [[0, 69.4], [2000, 80.4], [4000, 81.0], [6000, 80.7], [8000, 81.9], [10000, 82.1]]
    parts = growth_by_part(rss)
    assert [p["calls"] for p in parts] == [2000] * 5
    assert [p["rss_growth_mib"] for p in parts] == [11.0, 0.6, -0.3, 1.2, 0.2]
    assert parts[0]["kb_per_call"] == round(11.0 * 2**20 / 1000 / 2000, 2)
    assert plateau(rss) is True  # grew in the first part, within 2 MiB of it after
    linear = [[0, 69.4], [2000, 72.5], [4000, 75.6], [6000, 78.7], [8000, 81.8], [10000, 84.9]]
    assert plateau(linear) is False
    assert plateau([[0, 69.4], [10000, 84.9]]) is None  # one part: nothing to tell


def test_the_parts_call_outcomes_add_up() -> None:
    from bench.bench_soak import merge_calls

    got = merge_calls(
        [
            {"placed": {"sip:greet": 2, "sip:ivr": 1}, "ok": {"sip:greet": 2}, "failed": {}},
            {"placed": {"sip:greet": 1}, "ok": {"sip:greet": 1}, "failed": {"sip:ivr: x": 1}},
        ]
    )
    assert got == {
        "placed": {"sip:greet": 3, "sip:ivr": 1},
        "ok": {"sip:greet": 3},
        "failed": {"sip:ivr: x": 1},
    }


def test_rss_is_split_by_the_kind_of_mapping_it_is_in() -> None:
    from bench.bench_soak import rss_by_mapping

    smaps = """\
55d0c0a00000-55d0c0b00000 rw-p 00000000 00:00 0                          [heap]
Size:               1024 kB
Rss:                 512 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Rss:                1024 kB
7f0000200000-7f0000300000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Rss:                 256 kB
7f0000400000-7f0000500000 r-xp 00000000 08:01 99   /opt/a dir/with space.so
Rss:                 256 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                 132 kB
"""
    assert rss_by_mapping(smaps) == {"heap": 0.5, "anon": 1.0, "file": 0.5, "other": 0.13}

"""The soak's verdicts from the daemon's log: CDRs, barge-ins, digits, and which
warnings the injected faults explain (``bench/bench_soak.py``)."""

from __future__ import annotations

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
    events = [
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

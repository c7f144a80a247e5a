"""A load step's time-to-first-audio figures from the CDR lines (bench/loadgen/steps.py)."""

from __future__ import annotations

from bench.loadgen.steps import ttfa_figures


def test_later_turns_leave_out_each_calls_first_turn() -> None:
    lines = [
        {"call_id": "a", "time_to_first_audio_ms": [4.0, 900.0, 30.0]},
        {"call_id": "b", "time_to_first_audio_ms": [6.0, 2500.0]},
        {"call_id": "c", "time_to_first_audio_ms": [5.0]},
    ]
    f = ttfa_figures(lines)
    assert f["ttfa_ms_p50"] == 30.0  # of 4, 5, 6, 30, 900, 2500
    assert f["ttfa_ms_p99"] == 2500.0
    assert f["ttfa_later_turns_ms_p50"] == 900.0  # of 30, 900, 2500
    assert f["ttfa_later_turns_ms_max"] == 2500.0


def test_no_cdr_lines_give_no_figures() -> None:  # a peer without CDRs (Pipecat)
    assert set(ttfa_figures([]).values()) == {None}

"""The host-speed figures recorded with every capacity run (bench/loadgen/hostspeed.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from loadgen.hostspeed import FIGURES, describe, host_speed


def test_every_figure_is_measured_once_per_run_and_summarised() -> None:
    figures = host_speed(core=0, reader_core=1, reps=2)
    for key in FIGURES:
        runs = figures["runs"][key]
        assert len(runs) == 2
        assert all(math.isfinite(v) and v > 0 for v in runs)
        assert min(runs) <= figures[key] <= max(runs)
    # a step of the chase waits for a load the gather issues in parallel
    assert figures["memory_chase_ns"] > figures["memory_gather_ns"]
    text = describe(figures)
    assert "memory chase" in text and "(4 MB:" in text and "200 sockets" in text


def test_a_core_the_machine_lacks_is_left_unpinned() -> None:
    figures = host_speed(core=4096, reader_core=4096, reps=1)
    assert figures["core"] is None
    assert figures["tcp_write_us"] > 0

"""The host-speed figures recorded with every capacity run (bench/loadgen/hostspeed.py)."""

from __future__ import annotations

import math
import multiprocessing
import time

import pytest

from bench.loadgen.hostspeed import FIGURES, describe, host_speed, watch


def test_every_figure_is_measured_once_per_run_and_summarised() -> None:
    figures = host_speed(core=0, reader_core=1, reps=2, stall_s=0.5)
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
    figures = host_speed(core=4096, reader_core=4096, reps=1, stall_s=0)
    assert figures["core"] is None
    assert figures["tcp_write_us"] > 0
    assert figures["stalls_per_min"] is None  # not watched


@pytest.mark.needs("cap_sys_nice", why="the stall watch runs at SCHED_FIFO")
def test_the_stall_watch_sees_a_core_that_did_not_run() -> None:
    figures = host_speed(core=0, reader_core=1, reps=1, stall_s=0.5)
    assert figures["stalls_per_min"] is not None and figures["stalls_per_min"] >= 0
    assert "stalls over" in describe(figures)
    # nothing can take a real-time thread's core away on demand: a 1 ms sleep that
    # lasts 10 ms stands in for the core not running
    done = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child() -> None:
        real_sleep = time.sleep
        calls = iter(range(1_000_000))

        def sleep(s: float) -> None:
            real_sleep(0.010 if next(calls) == 3 else s)

        time.sleep = sleep
        try:
            done[1].send(watch(0.05, 0.0025, 0))
        except PermissionError:
            done[1].send(None)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    stalls = done[0].recv()
    proc.join(10)
    assert stalls is not None
    assert any(ms >= 10 for _, ms in stalls)

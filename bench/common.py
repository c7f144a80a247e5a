"""Shared bits of the benchmarks: machine/commit metadata, percentiles, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "commit": commit,
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``): the VM's host can change between runs."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def time_per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean wall time of one ``fn()``, in microseconds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def print_us_per_frame(timings: dict[str, float], width: int) -> None:
    """The codec benchmarks' table: one operation a line, µs per 20 ms frame."""
    print(f"{'operation':{width}s} {'us / 20 ms frame':>16s}")
    for name, us in timings.items():
        print(f"{name:{width}s} {us:16.2f}")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """``report`` as JSON at ``path`` (its directory made), and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def summary_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3) if ms else float("nan"),
        "p95_ms": round(pct(ms, 95), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


def results_path(name: str) -> Path:
    """Where ``write(name, ...)`` puts its JSON: ``bench/results/<name>.json`` for a bare name;
    a name with a directory or a ``.json`` suffix (``--out bench/results/x.json``) is a path."""
    given = Path(name)
    if given.suffix == ".json" or given.parent != Path("."):
        return given if given.suffix == ".json" else given.with_name(given.name + ".json")
    return RESULTS / f"{name}.json"


def write(name: str, figures: dict[str, Any], settings: dict[str, Any]) -> Path:
    path = results_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"machine": machine(), "settings": settings, "figures": figures}, indent=2)
        + "\n"
    )
    return path

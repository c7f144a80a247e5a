"""bench/loadgen/traced/sitecustomize.py: a process started with it traces its heap and
writes a snapshot on each SIGUSR1 (what ``bench/diag_heap_per_call.py`` reads)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

SITE = Path(__file__).resolve().parents[2] / "bench" / "loadgen" / "traced"

CHILD = """
import os, signal, tracemalloc
assert tracemalloc.is_tracing()
kept = [bytearray(1000) for _ in range(100)]
os.kill(os.getpid(), signal.SIGUSR1)
"""


def test_a_snapshot_per_sigusr1(tmp_path: Path) -> None:
    env = {**os.environ, "TM_DIR": str(tmp_path), "PYTHONPATH": str(SITE)}
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=60)
    assert (tmp_path / "done1").exists()
    snap = tracemalloc.Snapshot.load(str(tmp_path / "snap1.tm"))
    held = sum(s.size for s in snap.statistics("filename") if s.traceback[0].filename == "<string>")
    assert held >= 100 * 1000  # the child's 100 KB of bytearrays, seen where they were made


def test_without_tm_dir_nothing_is_traced(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SITE)}
    env.pop("TM_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", "import tracemalloc; print(tracemalloc.is_tracing())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False"

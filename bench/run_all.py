"""Run every benchmark in bench/ (``make bench``; ``--quick`` for ``make bench-quick``).

Each benchmark prints its figures and writes bench/results/<name>.json; then
``plot_results`` renders the PNGs from those JSON files. Each runs as a module of
the ``bench`` package from the repository root (``python -m bench.bench_NAME``).

    python -m bench.run_all [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> int:
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name} {' '.join(quick)}", flush=True)
        module = f"bench.{script.stem}"
        rc = subprocess.run([sys.executable, "-m", module, *quick], cwd=ROOT).returncode
        if rc:
            failed.append(script.name)
    print("\n=== plot_results", flush=True)
    if subprocess.run([sys.executable, "-m", "bench.plot_results"], cwd=ROOT).returncode:
        failed.append("plot_results")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

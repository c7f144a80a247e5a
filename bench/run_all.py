"""Run every benchmark in bench/ (``make bench``; ``--quick`` for ``make bench-quick``).

Each benchmark prints its figures and writes bench/results/<name>.json; then
``plot_results.py`` renders the PNGs from those JSON files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name} {' '.join(quick)}", flush=True)
        rc = subprocess.run([sys.executable, str(script), *quick]).returncode
        if rc:
            failed.append(script.name)
    print("\n=== plot_results.py", flush=True)
    if subprocess.run([sys.executable, str(HERE / "plot_results.py")]).returncode:
        failed.append("plot_results.py")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

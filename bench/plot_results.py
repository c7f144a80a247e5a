"""Render PNG plots from the JSON files already in ``bench/results/``, without rerunning.

For each ``<name>.json`` with a plotter in ``bench/plots.py`` (``PLOTTERS``:
capacity, bargein, latency, memory, tts) the figures are read and PNGs written
next to it (``bench/results/<name>_*.png``). The JSON files are not changed.
``bench_pacing.py`` draws its own plots (they need the raw deviations).

    python -m bench.plot_results [name ...]
"""

from __future__ import annotations

import argparse
import json

from bench import plots


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help=f"default: all of {', '.join(plots.PLOTTERS)}")
    args = ap.parse_args()
    for name in args.names or list(plots.PLOTTERS):
        path = plots.RESULTS / f"{name}.json"
        plotter = plots.PLOTTERS.get(name)
        if plotter is None or not path.exists():
            print(f"{name}: {'no plotter' if plotter is None else 'no ' + str(path)}")
            continue
        figures = json.loads(path.read_text())["figures"]
        written = plotter(figures)
        for key, png in written.items():
            print(f"{name}.{key}: {png}")
        if not written:
            print(f"{name}: nothing to plot in {path.name}")


if __name__ == "__main__":
    main()

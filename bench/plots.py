"""Shared plotting helpers for the benchmarks: PNGs next to the JSON in ``bench/results/``.

matplotlib (Agg backend, no display) is in the ``bench`` extra. Every helper
takes plain numbers (no benchmark objects), writes one PNG and returns its
path relative to the repository root, which the caller puts in its JSON
(``"plots": {...}``):

* ``cdf``: the distribution of several samples (e.g. pacing deviation per
  set-up, barge-in latency per group): CDF on the left, the tail as a
  log-scale CCDF on the right, optional goal lines.
* ``lines``: y against x per series with an optional spread (e.g. capacity:
  CPU per call-second against the number of calls), optional goal line.
* ``quantile_bars``: grouped bars of summary figures (p50/p95/max...) when
  only summaries were kept.
* ``over_time``: a long run's signed values binned over time (median, p1-p99
  band, max |value|) with a fitted slope (e.g. pacing drift).

``bench/plot_results.py`` uses them to render plots from existing JSON files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
_DPI = 110


def _save(fig: Any, name: str) -> str:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (name if name.endswith(".png") else f"{name}.png")
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return str(path.relative_to(ROOT))


def _goal_lines(
    ax: Any, goals: Mapping[str, float] | None, vertical: bool = True, symmetric: bool = False
) -> None:
    """Goal lines; ``symmetric`` also draws each at minus its value (one legend entry)."""
    for i, (label, value) in enumerate((goals or {}).items()):
        style = {"color": "red" if i == 0 else "darkred", "ls": "--" if i == 0 else ":", "lw": 1}
        draw = ax.axvline if vertical else ax.axhline
        draw(value, label=label, **style)
        if symmetric:
            draw(-value, label="_nolegend_", **style)


def cdf(
    samples: Mapping[str, Sequence[float] | np.ndarray],
    name: str,
    *,
    title: str,
    xlabel: str,
    goals: Mapping[str, float] | None = None,
    logx: bool = False,
) -> str:
    """CDF (left) and tail CCDF on log axes (right) of each labelled sample set.

    The legend gives each set's n, p50 and p99. ``goals`` maps a label to an
    x value drawn as a vertical line on both panels (e.g. ``{"goal p99 2 ms": 2}``).
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for label, values in samples.items():
        x = np.sort(np.asarray(values, dtype=float))
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        p50, p99 = np.percentile(x, 50), np.percentile(x, 99)
        legend = f"{label} (n={x.size}, p50 {p50:.2f}, p99 {p99:.2f})"
        (line,) = left.plot(x, y, lw=1.5, label=legend)
        tail = 1.0 - y + 1.0 / x.size  # P(X >= x), never 0 on a log axis
        right.plot(np.maximum(x, 1e-3), tail, lw=1.5, color=line.get_color(), label=label)
    for ax in (left, right):
        _goal_lines(ax, goals)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel(xlabel)
    if logx:
        left.set_xscale("log")
        left.set_xlim(left=0.01)  # zeros (a talkspurt's anchor packet) are off a log axis
    left.set_ylabel("fraction of samples <= x")
    left.set_ylim(0, 1.01)
    left.set_title(title)
    left.legend(fontsize=8, loc="lower right")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_ylabel("fraction of samples >= x (tail)")
    right.set_title("tail (log-log)")
    right.legend(fontsize=8, loc="lower left")
    return _save(fig, name)


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    name: str,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    spread: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    goals: Mapping[str, float] | None = None,
    logy: bool = False,
) -> str:
    """One line per series through its (x, y) points; ``spread`` gives (low, high) per point
    (drawn as error bars); ``goals`` are horizontal lines."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label, points in series.items():
        if not points:
            continue
        x = [p[0] for p in points]
        y = [p[1] for p in points]
        bounds = (spread or {}).get(label)
        if bounds:
            lo = [max(0.0, yi - b[0]) for yi, b in zip(y, bounds, strict=True)]
            hi = [max(0.0, b[1] - yi) for yi, b in zip(y, bounds, strict=True)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=4, label=label)
        else:
            ax.plot(x, y, marker="o", label=label)
    _goal_lines(ax, goals, vertical=False)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, name)


def quantile_bars(
    groups: Mapping[str, Mapping[str, float]],
    name: str,
    *,
    title: str,
    ylabel: str,
    goals: Mapping[str, float] | None = None,
    logy: bool = False,
) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per figure in it (p50, p95...)."""
    labels = list(groups)
    figures: list[str] = []
    for g in groups.values():
        figures += [k for k in g if k not in figures]
    width = 0.8 / max(1, len(figures))
    fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(labels) + 2), 4.8))
    x = np.arange(len(labels))
    for i, fig_name in enumerate(figures):
        values = [groups[g].get(fig_name, np.nan) for g in labels]
        bars = ax.bar(x + (i - (len(figures) - 1) / 2) * width, values, width, label=fig_name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
    _goal_lines(ax, goals, vertical=False)
    if logy:
        ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, name)


def over_time(
    t_s: np.ndarray,
    values: np.ndarray,
    name: str,
    *,
    title: str,
    ylabel: str,
    bin_s: float = 5.0,
    goals: Mapping[str, float] | None = None,
) -> str:
    """Signed ``values`` at times ``t_s`` (seconds from the start), binned: median, p1-p99
    band and max |value| per bin, and the least-squares slope per minute. ``goals`` are
    drawn at plus and minus their value."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(values, dtype=float)
    fig, ax = plt.subplots(figsize=(11, 4.6))
    if t.size:
        b = np.floor(t / bin_s).astype(np.int64)
        order = np.argsort(b, kind="stable")
        b, vs = b[order], v[order]
        edges = np.flatnonzero(np.diff(b)) + 1
        centres, med, lo, hi, peak = [], [], [], [], []
        for chunk_b, chunk in zip(np.split(b, edges), np.split(vs, edges), strict=True):
            centres.append((chunk_b[0] + 0.5) * bin_s / 60)
            med.append(np.median(chunk))
            lo.append(np.percentile(chunk, 1))
            hi.append(np.percentile(chunk, 99))
            peak.append(np.abs(chunk).max())
        ax.fill_between(centres, lo, hi, alpha=0.3, label=f"p1..p99 per {bin_s:g} s")
        ax.plot(centres, med, lw=1.5, label="median")
        ax.plot(centres, peak, lw=0.8, ls=":", color="grey", label="max |value|")
        slope, icept = np.polyfit(t / 60, v, 1)
        ax.plot(
            [0, t.max() / 60],
            [icept, icept + slope * t.max() / 60],
            color="black",
            lw=1,
            label=f"fit: {slope:+.4f} {ylabel.split('(')[-1].rstrip(')')} per minute",
        )
    _goal_lines(ax, goals, vertical=False, symmetric=True)
    ax.set_xlabel("time since start of the window (minutes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, name)

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

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import matplotlib.ticker
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


def _plain_log(axis: Any) -> None:
    """Log-scale ticks as plain numbers (2, 5, 10, 20...) instead of 2x10^0."""

    def minor(v: float, _: Any) -> str:
        lead = round(v / 10 ** np.floor(np.log10(v))) if v > 0 else 0
        return f"{v:g}" if lead in (2, 5) else ""

    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def _short(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


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
        _plain_log(ax.yaxis)
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
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(labels) + 2), 4.8))
    x = np.arange(len(labels))
    for i, fig_name in enumerate(figures):
        values = [groups[g].get(fig_name, np.nan) for g in labels]
        bars = ax.bar(x + (i - (len(figures) - 1) / 2) * width, values, width, label=fig_name)
        ax.bar_label(bars, labels=[_short(v) for v in values], fontsize=7, padding=1)
    _goal_lines(ax, goals, vertical=False)
    if logy:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    ax.margins(y=0.1)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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


# ----------------------------------------------------------- per-benchmark figures
# Each takes the "figures" dict a benchmark writes to its JSON and returns
# {plot name: PNG path}; a benchmark can call it before ``common.write`` and put
# the result under "plots", and ``bench/plot_results.py`` calls it on old JSON.


def capacity_plots(figures: Mapping[str, Any], prefix: str = "capacity") -> dict[str, str]:
    """CPU per call-second and worst call's pacing p99 against concurrent calls, per config."""
    cpu: dict[str, list[tuple[float, float]]] = {}
    cpu_spread: dict[str, list[tuple[float, float]]] = {}
    worst: dict[str, list[tuple[float, float]]] = {}
    worst_spread: dict[str, list[tuple[float, float]]] = {}
    for key, cfg in figures.items():
        if not isinstance(cfg, Mapping) or "steps" not in cfg:
            continue
        steps = cfg["steps"]
        cpu[key] = [(s["calls"], s["cpu_us_per_call_s_median"]) for s in steps]
        cpu_spread[key] = [tuple(s["cpu_us_per_call_s_spread"]) for s in steps]
        worst[key] = [(s["calls"], s["worst_call_p99_ms_median"]) for s in steps]
        worst_spread[key] = [tuple(s["worst_call_p99_ms_spread"]) for s in steps]
    if not cpu:
        return {}
    goal = figures.get("goal", {})
    return {
        "cpu": lines(
            cpu,
            f"{prefix}_cpu",
            title="Daemon CPU per call-second against concurrent calls (median, [min, max])",
            xlabel="concurrent calls",
            ylabel="CPU µs per call-second (/proc/<pid>/stat)",
            spread=cpu_spread,
        ),
        "pacing": lines(
            worst,
            f"{prefix}_pacing",
            title="Worst call's pacing p99 against concurrent calls (median, [min, max])",
            xlabel="concurrent calls",
            ylabel="worst call's p99 |deviation| (ms)",
            spread=worst_spread,
            goals={f"goal p99 {goal.get('p99_ms', 2.0):g} ms": float(goal.get("p99_ms", 2.0))},
            logy=True,
        ),
    }


def bargein_plots(
    figures: Mapping[str, Any],
    latencies_ms: Mapping[str, Sequence[float]] | None = None,
    prefix: str = "bargein",
) -> dict[str, str]:
    """Barge-in latency: a CDF when the raw latencies are given (``{group: [ms, ...]}``),
    else grouped bars of the p50/p95/max each ``onsets`` group of the JSON kept."""
    out: dict[str, str] = {}
    if latencies_ms:
        out["latency_cdf"] = cdf(
            latencies_ms,
            f"{prefix}_latency_cdf",
            title="Barge-in latency: true speech onset → bot audio stopped",
            xlabel="latency (ms)",
            logx=True,
        )
    for key, section in figures.items():
        onsets = section.get("onsets") if isinstance(section, Mapping) else None
        if not isinstance(onsets, Mapping):
            continue
        groups = {
            f"{g} (n={v.get('n', '?')})": {
                q: v[q] for q in ("p50_ms", "p95_ms", "max_ms") if q in v
            }
            for g, v in onsets.items()
            if isinstance(v, Mapping)
        }
        out[f"{key}_latency"] = quantile_bars(
            groups,
            f"{prefix}_{key}_latency",
            title=f"Barge-in latency by group ({key})",
            ylabel="onset → bot stopped (ms)",
            logy=True,
        )
    return out


def latency_plots(figures: Mapping[str, Any], prefix: str = "latency") -> dict[str, str]:
    """Added latency p50/p99 per figure and leg (medians over runs), with the goals."""
    groups = {
        key: {"p50 ms": v["p50_ms_median"], "p99 ms": v["p99_ms_median"]}
        for key, v in figures.items()
        if isinstance(v, Mapping) and "p50_ms_median" in v
    }
    if not groups:
        return {}
    goal = figures.get("goal", {})
    return {
        "added_latency": quantile_bars(
            groups,
            f"{prefix}_added",
            title="Added latency: first provider audio byte → first frame on the wire",
            ylabel="ms (median over runs)",
            goals={
                f"goal p50 {goal.get('p50_ms', 2.0):g} ms": float(goal.get("p50_ms", 2.0)),
                f"goal p99 {goal.get('p99_ms', 5.0):g} ms": float(goal.get("p99_ms", 5.0)),
            },
        )
    }


def memory_plots(figures: Mapping[str, Any], prefix: str = "memory") -> dict[str, str]:
    """RSS per active call and RSS growth per completed call, each against its goal."""
    active, churn = figures.get("active", {}), figures.get("churn", {})
    goal = figures.get("goal", {})
    out: dict[str, str] = {}
    if "rss_per_active_call_kb" in active:
        g = float(goal.get("rss_per_active_call_kb", 200))
        out["rss_per_call"] = quantile_bars(
            {
                f"{active.get('calls', '?')} active calls": {
                    "measured": active["rss_per_active_call_kb"]
                }
            },
            f"{prefix}_rss_per_call",
            title="RSS per active call",
            ylabel="KB per call",
            goals={f"goal {g:g} KB": g},
        )
    if "rss_growth_per_call_bytes" in churn:
        g = float(goal.get("rss_growth_per_call_bytes", 1024))
        out["growth_per_call"] = quantile_bars(
            {
                f"{churn.get('calls', '?')} completed calls": {
                    "measured": churn["rss_growth_per_call_bytes"]
                }
            },
            f"{prefix}_growth_per_call",
            title="RSS growth per completed call",
            ylabel="bytes per call",
            goals={f"goal < {g:g} B": g},
        )
    return out


def tts_plots(figures: Mapping[str, Any], prefix: str = "tts") -> dict[str, str]:
    """Time to first audio per protocol / voice (p50, p95)."""
    groups = {
        f"{k} (n={v.get('n', '?')})": {"p50 ms": v["p50_ms"], "p95 ms": v["p95_ms"]}
        for k, v in figures.items()
        if isinstance(v, Mapping) and "p50_ms" in v and "p95_ms" in v
    }
    if not groups:
        return {}
    return {
        "first_audio": quantile_bars(
            groups,
            f"{prefix}_first_audio",
            title="TTS client: speak() → first audio chunk (warm connection, loopback)",
            ylabel="ms",
            logy=True,
        )
    }


PLOTTERS: dict[str, Callable[[Mapping[str, Any]], dict[str, str]]] = {
    "capacity": capacity_plots,
    "bargein": bargein_plots,
    "latency": latency_plots,
    "memory": memory_plots,
    "tts": tts_plots,
}

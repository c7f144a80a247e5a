"""Pacing figures from arrival times: deviation from the 20 ms grid, per talkspurt, and drift.

RTP: a talkspurt starts at a packet with the marker bit (or the first packet);
frame ``k`` of it is the RTP timestamp difference / 160, due at
``first_arrival + k * 20 ms`` (the grid fitted from the first packet of the
talkspurt, as a receiver's playout would). Media streams have no timestamps:
a talkspurt starts after a gap of more than ``gap_s``; its first up to
``lead_frames + 1`` messages may leave together (the bounded lead, sent only
if that much audio is ready), so the grid of a talkspurt is fitted as the
median of ``arrival_i - i * 20 ms`` over the messages after the lead, and
those messages are measured against it.

Drift: the slope of (arrival - grid) against time, over every talkspurt of a
call, in parts per million and in ms per minute (1 ppm = 0.06 ms per minute;
a clock running 100 ppm slow is 60 ms late after 10 minutes). The daemon's
RTP timestamps follow its media clock's frame index and it sends silence
between turns, so a continuous call is one talkspurt and its slope is the
drift of the sender's 20 ms grid against the receiver's kernel clock.

Per call: ``per_call_figures`` gives each call's p50/p99/max |deviation| and
drift; ``pacing_summary`` gives the figures over all packets of all calls and
the median/worst of the per-call ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

PTIME_NS = 20_000_000


def rtp_deviations_ns(
    arrival_ns: Iterable[int], rtp_ts: Iterable[int], marker: Iterable[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival time, deviation from the grid) of every packet of one call, in ns.

    A talkspurt starts at a marker bit; each packet's slot on the talkspurt's
    grid comes from its RTP timestamp. The grid's offset is the median of
    ``arrival - slot * 20 ms`` over the talkspurt, not the first packet's
    arrival: anchoring on one packet turns that packet's own jitter (a
    talkspurt's first frame leaves at once, on a loaded core a few ms off
    the grid the rest follows) into a constant deviation of every later
    packet, which is the anchor's error, not theirs.
    """
    a = np.asarray(arrival_ns, dtype=np.int64)
    if a.size == 0:
        return a, a
    ts = np.asarray(rtp_ts, dtype=np.int64)
    m = np.asarray(marker, dtype=bool).copy()
    m[0] = True
    starts = np.flatnonzero(m)
    seg = np.cumsum(m) - 1
    k = ((ts - ts[starts][seg]) % (1 << 32)) // 160
    raw = a - k * PTIME_NS
    ends = np.append(starts[1:], a.size)
    offset = np.empty(a.size, dtype=np.int64)
    for s, e in zip(starts, ends, strict=True):
        offset[s:e] = int(np.median(raw[s:e]))
    return a, raw - offset


def ws_deviations_ns(
    arrival_ns: Iterable[int], lead_frames: int, gap_ns: int = 50_000_000
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival, deviation) of every media message after each talkspurt's lead burst."""
    a = np.asarray(arrival_ns, dtype=np.int64)
    if a.size == 0:
        return a, a
    start = np.ones(a.size, dtype=bool)
    start[1:] = np.diff(a) > gap_ns
    starts = np.flatnonzero(start)
    seg = np.cumsum(start) - 1
    i = np.arange(a.size) - starts[seg]
    raw = a - i * PTIME_NS
    keep = i > lead_frames
    return a[keep], talkspurt_median_fit(raw, keep, seg, starts.size)[keep]


def talkspurt_median_fit(
    raw: np.ndarray, keep: np.ndarray, seg: np.ndarray, talkspurts: int
) -> np.ndarray:
    """``raw`` (arrival - slot) minus its talkspurt's median over the kept messages."""
    dev = np.zeros(raw.size, dtype=np.int64)
    for s in range(talkspurts):
        mask = keep & (seg == s)
        if mask.any():
            dev[mask] = raw[mask] - int(np.median(raw[mask]))
    return dev


def drift_ppm(arrival: np.ndarray, dev: np.ndarray) -> float:
    if arrival.size < 100:
        return float("nan")
    t = (arrival - arrival[0]) / 1e9
    if t[-1] <= 0:
        return float("nan")
    slope = np.polyfit(t, dev / 1e9, 1)[0]
    return float(slope * 1e6)


PPM_TO_MS_PER_MIN = 60.0 * 1e3 / 1e6


def rtp_gap_frames(rtp_ts: Iterable[int], max_gap: int = 3000) -> int:
    """Frames never received in one call: RTP timestamp steps of more than one frame.

    The deviation figures cannot show these (a frame the sender skipped after a
    late wake-up, or a lost packet, has no arrival); steps larger than
    ``max_gap`` frames (a new SSRC/timestamp base, reordering) are ignored.
    """
    ts = np.asarray(rtp_ts, dtype=np.int64)
    if ts.size < 2:
        return 0
    step = (np.diff(ts) % (1 << 32)) // 160
    gaps = step[(step > 1) & (step <= max_gap)] - 1
    return int(gaps.sum())


def per_call_figures(per_call: list[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, Any]]:
    """p50/p99/max |deviation| (ms) and drift (ppm, ms per minute) of each call with packets."""
    out: list[dict[str, Any]] = []
    for a, d in per_call:
        if not d.size:
            continue
        absms = np.abs(d) / 1e6
        ppm = drift_ppm(a, d)
        out.append(
            {
                "packets": int(d.size),
                "p50_ms": round(float(np.percentile(absms, 50)), 3),
                "p99_ms": round(float(np.percentile(absms, 99)), 3),
                "max_ms": round(float(absms.max()), 3),
                "drift_ppm": round(ppm, 3) if ppm == ppm else None,
                "drift_ms_per_min": round(ppm * PPM_TO_MS_PER_MIN, 4) if ppm == ppm else None,
            }
        )
    return out


def pacing_summary(per_call: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """p50/p99/max of |deviation| over every packet of every call, worst call, drift."""
    devs = [d for _, d in per_call if d.size]
    if not devs:
        return {"packets": 0}
    allabs = np.abs(np.concatenate(devs)) / 1e6
    call_p99 = [float(np.percentile(np.abs(d) / 1e6, 99)) for d in devs]
    call_p50 = [float(np.percentile(np.abs(d) / 1e6, 50)) for d in devs]
    call_max = [float(np.abs(d).max() / 1e6) for d in devs]
    drifts = [drift_ppm(a, d) for a, d in per_call if d.size]
    drifts = [x for x in drifts if x == x]
    drift_med = float(np.median(drifts)) if drifts else None
    drift_abs = float(np.max(np.abs(drifts))) if drifts else None
    return {
        "packets": int(allabs.size),
        "calls": len(devs),
        "p50_ms": round(float(np.percentile(allabs, 50)), 3),
        "p99_ms": round(float(np.percentile(allabs, 99)), 3),
        "p999_ms": round(float(np.percentile(allabs, 99.9)), 3),
        "max_ms": round(float(allabs.max()), 3),
        "worst_call_p99_ms": round(max(call_p99), 3),
        "calls_over_2ms_p99": sum(1 for x in call_p99 if x > 2.0),
        "call_p50_ms_median": round(float(np.median(call_p50)), 3),
        "call_p99_ms_median": round(float(np.median(call_p99)), 3),
        "call_max_ms_median": round(float(np.median(call_max)), 3),
        "drift_ppm_median": round(drift_med, 3) if drift_med is not None else None,
        "drift_ppm_max_abs": round(drift_abs, 3) if drift_abs is not None else None,
        "drift_ms_per_min_median": (
            round(drift_med * PPM_TO_MS_PER_MIN, 4) if drift_med is not None else None
        ),
        "drift_ms_per_min_max_abs": (
            round(drift_abs * PPM_TO_MS_PER_MIN, 4) if drift_abs is not None else None
        ),
    }

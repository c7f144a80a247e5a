"""``heard_ms`` of an interrupted turn against the caller's own recording (issue 6).

What is measured: the real daemon in-process (``tests/e2e/harness.py``)
against ``ttsd`` with the ``tone`` engine (Kova). Per call, an application
(one WebSocket server per call, its own route) says a long turn; the caller
(``bridge.io.caller.place_call``, the code behind ``callbridge call``)
speaks over it (``speech_mulaw`` from the harness) at a time between 0.5 and
3 s after the answer, the daemon cuts the turn and the application receives
``turn.interrupted`` with ``heard_ms``. Both legs go through ``place_call``:

* SIP/RTP: ``CallResult.heard_pcm_s16le`` is the caller's jitter-buffer
  playout (the ``--record`` WAV), 20 ms per frame from the answer;
* Twilio media stream: the carrier emulator's ``heard_audio()`` (audio at the
  times the emulated carrier played it, silence elsewhere).

The truth, from the recording alone. The tone engine is deterministic, so
the turn's audio is rendered here too (``ToneEngine(8000)``, through mu-law
like the call) and aligned with the recording on the first audible sample.
The last audible sample of the recording bounds the cut from below; the first
sample after it where the recording stops matching the rendered turn bounds
it from above. Mid-word the two are a sample or so apart; a cut that fell in
one of the 40 ms word gaps is only known to lie somewhere in that gap (the
caller heard silence either way). The figures:

* ``error_ms``: distance from ``heard_ms`` to that interval (0 inside it);
* ``error_last_audible_ms``: ``|heard_ms - last audible sample|``, the naive
  truth (over-counts by up to a gap when the cut fell in one);
* ``mismatch_samples``: samples before the cut where the recording differs
  from the rendered turn (0 when the recording is the turn, unshifted; a
  late RTP frame replaced by silence would show here).

    python -m bench.bench_heard [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import pct, write
from bridge.io.caller import CallerOptions, SpeakClip, place_call
from bridge.ttsd.synth import ToneEngine
from telcodec import g711
from tests.e2e.harness import (
    AppServer,
    free_port,
    speech_mulaw,
    stack,
)

HERE = Path(__file__).resolve().parent

TEXT = " ".join(f"word{i}" for i in range(30)) + "."
RATE_HZ = 8000
AUDIBLE = 64
"""|sample| above this (s16) is audible; decoded mu-law silence is 0."""
GOAL_MS = 40.0
AFTER_CUT_S = 1.5
"""The call goes on this long after the caller starts speaking."""

Samples = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Truth:
    lo_ms: float
    hi_ms: float
    last_audible_ms: float
    mismatch_samples: int


def rendered_turn() -> Samples:
    """The tone engine's audio for ``TEXT`` at 8 kHz, through mu-law like the call's."""
    pcm = b"".join(c.pcm for c in ToneEngine(RATE_HZ).synthesize(TEXT, "tone"))
    return np.frombuffer(g711.ulaw_decode(g711.ulaw_encode(pcm)), "<i2").astype(np.int32)


def truth_from_recording(heard_pcm_s16le: bytes, ref: Samples) -> Truth | None:
    """Where the cut fell in the turn, from what the caller heard (see the module docstring)."""
    rec = np.frombuffer(heard_pcm_s16le, "<i2").astype(np.int32)
    loud_rec = np.flatnonzero(np.abs(rec) > AUDIBLE)
    loud_ref = np.flatnonzero(np.abs(ref) > AUDIBLE)
    if loud_rec.size == 0 or loud_ref.size == 0:
        return None
    offset = int(loud_rec[0] - loud_ref[0])
    if offset < 0:
        return None
    last = int(loud_rec[-1]) - offset  # in the turn's samples
    if last >= ref.size:
        return None
    n = min(ref.size, rec.size - offset)
    seg = rec[offset : offset + n]
    mismatch = int(np.count_nonzero(seg[: last + 1] != ref[: last + 1]))
    diverged = np.flatnonzero(seg[last + 1 :] != ref[last + 1 : n])
    hi = last + 1 + (int(diverged[0]) if diverged.size else n - last - 1)
    return Truth(
        lo_ms=(last + 1) * 1000 / RATE_HZ,
        hi_ms=hi * 1000 / RATE_HZ,
        last_audible_ms=(last + 1) * 1000 / RATE_HZ,
        mismatch_samples=mismatch,
    )


def app_routes(apps: list[AppServer]) -> str:
    return "".join(
        f'\n[[routes]]\nmatch = "c{i}"\nprovider = "main"\napp = "{app.url}"\n'
        for i, app in enumerate(apps)
    )


def speak_times(n: int) -> list[float]:
    """``n`` times spread over 0.5..3 s (a fixed, irregular step so phases vary)."""
    return [round(0.5 + (i * 0.617) % 2.5, 3) for i in range(n)]


async def one_call(
    leg: str, target: str, index: int, at_s: float, app: AppServer, ref: Samples
) -> dict[str, Any]:
    speech = g711.ulaw_decode(speech_mulaw(1.5))
    opts = CallerOptions(
        target=target,
        speak=(SpeakClip("speech", at_s, speech),),
        duration_s=at_s + AFTER_CUT_S,
        route=f"c{index}" if leg == "twilio" else None,
    )
    result = await place_call(opts)
    await asyncio.sleep(0.2)  # the app's last events
    cut = app.of("turn.interrupted")
    row: dict[str, Any] = {"leg": leg, "speak_at_s": at_s}
    if not cut:
        row["failure"] = "no turn.interrupted" if app.of("turn.started") else "no turn"
        return row
    heard = int(str(cut[0]["heard_ms"]))
    truth = truth_from_recording(result.heard_pcm_s16le, ref)
    row["heard_ms"] = heard
    row["reason"] = cut[0].get("reason")
    if truth is None:
        row["failure"] = "no turn audio in the recording"
        return row
    lo, hi = truth.lo_ms, truth.hi_ms
    row.update(
        truth_lo_ms=lo,
        truth_hi_ms=hi,
        error_ms=round(max(0.0, lo - heard, heard - hi), 3),
        signed_error_ms=round(heard - lo if heard < lo else max(0.0, heard - hi), 3),
        error_last_audible_ms=round(abs(heard - truth.last_audible_ms), 3),
        mismatch_samples=truth.mismatch_samples,
    )
    return row


def batches(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def run_leg(leg: str, n: int, concurrent: int) -> list[dict[str, Any]]:
    ref = rendered_turn()
    times = speak_times(n)
    rows: list[dict[str, Any]] = []
    async with AsyncExitStack() as es:
        apps = [await es.enter_async_context(AppServer()) for _ in range(n)]
        for app in apps:
            app.on_started = [{"type": "say", "turn_id": "long", "text": TEXT, "final": True}]
        sip = free_port(socket.SOCK_DGRAM)
        st = await es.enter_async_context(stack(app_routes(apps), sip=str(sip)))
        # place_call's Twilio carrier has one fixed callSid and the daemon keys media
        # clocks by it: Twilio calls go one at a time.
        size = concurrent if leg == "sip" else 1
        for batch in batches(list(range(n)), size):
            calls = []
            for i in batch:
                target = (
                    f"sip:c{i}@127.0.0.1:{sip}"
                    if leg == "sip"
                    else f"ws://127.0.0.1:{st.ms_port}/twilio"
                )
                calls.append(one_call(leg, target, i, times[i], apps[i], ref))
            rows.extend(await asyncio.gather(*calls))
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error_ms" in r]
    out: dict[str, Any] = {"calls": len(rows), "measured": len(ok)}
    out["failures"] = [r["failure"] for r in rows if "failure" in r]
    if not ok:
        return out
    for key in ("error_ms", "error_last_audible_ms"):
        v = [float(r[key]) for r in ok]
        out[key] = {
            "p50": round(statistics.median(v), 2),
            "p95": round(pct(v, 95), 2),
            "max": round(max(v), 2),
        }
    signed = [float(r["signed_error_ms"]) for r in ok]
    out["signed_error_ms_mean"] = round(statistics.fmean(signed), 2)
    out["cut_in_gap"] = sum(1 for r in ok if r["truth_hi_ms"] - r["truth_lo_ms"] > 5)
    out["mismatch_samples_max"] = max(int(r["mismatch_samples"]) for r in ok)
    out["within_goal"] = sum(1 for r in ok if float(r["error_ms"]) <= GOAL_MS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 6 if args.quick else 20
    concurrent = 6 if args.quick else 5
    figures: dict[str, Any] = {}
    print(
        f"{'leg':<7} {'calls':>5} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}"
        f" {'naive p95':>9} {'in gap':>6} {'mismatch':>8}"
    )
    for leg in ("sip", "twilio"):
        rows = asyncio.run(run_leg(leg, n, concurrent))
        s = summarize(rows)
        figures[leg] = {**s, "rows": rows}
        e = s.get("error_ms", {})
        naive = s.get("error_last_audible_ms", {})
        print(
            f"{leg:<7} {s['measured']:>5} {e.get('p50')!s:>7} {e.get('p95')!s:>7}"
            f" {e.get('max')!s:>7} {naive.get('p95')!s:>9} {s.get('cut_in_gap')!s:>6}"
            f" {s.get('mismatch_samples_max')!s:>8}",
            flush=True,
        )
        if s["failures"]:
            print(f"  {leg}: {len(s['failures'])} calls not measured: {s['failures']}")
    figures["goal_ms"] = GOAL_MS
    path = write(
        "heard",
        figures,
        {
            "calls_per_leg": n,
            "concurrent": {"sip": concurrent, "twilio": 1},
            "text": TEXT,
            "speak_at_s": speak_times(n),
            "speech": "harness.speech_mulaw(1.5)",
            "provider": "kova, tone engine, in-process ttsd; daemon in-process (asyncio)",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""SIP barge-in on the wire over loopback: the test caller talks over the greeting.

The daemon in-process (``tests/e2e/harness.py``: the real SIP leg, the ttsd with the
``tone`` engine) and ``callbridge call``'s SIP UAC (``bridge.io.caller``) in the same
process; each call's caller starts a voiced, speech-like clip at a random time 1.6-3.2 s
after the answer while the greeting plays. ``barge_in_ms`` is the caller's own report
(``docs/test-caller.md``): from the clip's first frame sent to the end of the last bot
speech frame received. Wall-clock figures on a shared host: they move with its load
(``uptime`` is recorded), so compare two versions in the same sitting.

    python -m bench.bench_bargein_wire [--quick] [--calls N] [--seed N] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import pct, write

HERE = Path(__file__).resolve().parent

GREETING = " ".join(f"word{i}" for i in range(60)) + "."


async def run(calls: int, seed: int) -> dict[str, Any]:
    from bridge.control.report import build_report
    from bridge.io.caller import CallerOptions, SpeakClip, place_call
    from bridge.logs import configure
    from telcodec import g711
    from tests.e2e.harness import free_sip_port, speech_mulaw, stack

    rng = np.random.default_rng(seed)
    speech = g711.ulaw_decode(speech_mulaw(1.0))
    route = f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{GREETING}"\n'
    sip = free_sip_port()
    ms: list[float] = []
    outcomes: dict[str, int] = {}
    async with stack(route, sip=str(sip)) as st:
        configure("warning", "json")
        for _ in range(calls):
            at_s = float(rng.uniform(1.6, 3.2))
            opts = CallerOptions(
                target=f"sip:demo@127.0.0.1:{st.sip_port}",
                speak=(SpeakClip("speech", at_s, speech),),
                duration_s=at_s + 2.0,
            )
            result = await asyncio.wait_for(place_call(opts), at_s + 30)
            for b in build_report(result.recording).barge_ins:
                outcomes[b.outcome] = outcomes.get(b.outcome, 0) + 1
                if b.barge_in_ms is not None and b.outcome == "stopped":
                    ms.append(b.barge_in_ms)
    return {
        "calls": calls,
        "outcomes": outcomes,
        "stopped": len(ms),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p95_ms": round(pct(ms, 95), 1) if ms else None,
        "max_ms": round(max(ms), 1) if ms else None,
        "all_ms": [round(v, 1) for v in ms],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="8 calls (make bench-quick)")
    ap.add_argument("--calls", type=int, default=None, help="calls (default 30, quick 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--name", default=None, help="default: bargein_wire[_quick]")
    args = ap.parse_args()
    args.calls = args.calls or (8 if args.quick else 30)
    args.name = args.name or ("bargein_wire_quick" if args.quick else "bargein_wire")
    load_before = os.getloadavg()[0]
    fig = asyncio.run(run(args.calls, args.seed))
    fig["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(
        f"SIP barge-in on the wire, {fig['stopped']} of {fig['calls']} stopped: "
        f"p50 {fig['p50_ms']} p95 {fig['p95_ms']} max {fig['max_ms']} ms; "
        f"outcomes {fig['outcomes']}; load {fig['loadavg_1min']}"
    )
    print("wrote", write(args.name, {"sip_wire": fig}, {"calls": args.calls, "seed": args.seed}))


if __name__ == "__main__":
    main()

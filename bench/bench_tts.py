"""Time to first audio through the local TTS server, per provider protocol.

``speak()`` → first ``AudioReceived`` at the Call's sink, over loopback with
a warm connection: the client's own overhead (tone engine: synthesis is
instant). Then Piper's time to first audio for a one-sentence greeting.

    python bench/bench_tts.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, write

from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.tts_client import ProviderPool, Speaker
from bridge.io.ttsd_server import start_tts_server
from bridge.tts.base import (
    MULAW_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)

GREETING = "Welcome to callbridge, the open source telephony bridge."


async def ttfa(protocol: str, engine: str, turns: int, voice: str) -> list[float]:
    server = await start_tts_server(engine=engine)
    url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS[protocol]}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{server.port}"
    pool = ProviderPool(ProviderSettings("b", protocol, url, api_key="k", voice=voice))
    if not await pool.start():
        raise RuntimeError(f"{protocol}: warm connection failed")
    speaker = Speaker([pool])
    loop = asyncio.get_running_loop()
    out: list[float] = []
    for i in range(turns):
        first = loop.create_future()
        done = asyncio.Event()
        t0 = loop.time()

        def sink(
            e: Event, first: asyncio.Future[float] = first, done: asyncio.Event = done
        ) -> None:
            if isinstance(e, AudioReceived) and not first.done():
                first.set_result(loop.time())
            if isinstance(e, TurnDone | TurnFailed | ProviderFailed):
                done.set()

        speaker.speak(f"t{i}", GREETING, TurnSettings(voice, MULAW_8K), sink)
        out.append(await asyncio.wait_for(first, 30) - t0)
        await asyncio.wait_for(done.wait(), 60)
    await pool.close()
    await server.close()
    return out


def _row(protocol: str, engine: str, s: dict[str, float]) -> None:
    print(
        f"{protocol:<12} {engine:<6} {s['n']:>5} {s['p50_ms']:>8} {s['p95_ms']:>8} {s['p99_ms']:>8}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    turns = 20 if args.quick else 200
    figures: dict[str, object] = {}
    print(f"{'protocol':<12} {'engine':<6} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for protocol in ["kova", "kugelaudio", "coda", "zwst"]:
        s = summary_ms(asyncio.run(ttfa(protocol, "tone", turns, "tone")))
        figures[f"{protocol}_tone"] = s
        _row(protocol, "tone", s)
    try:
        s = summary_ms(asyncio.run(ttfa("kova", "piper", 3 if args.quick else 10, "joe")))
        figures["kova_piper_greeting"] = s
        _row("kova", "piper", s)
    except ImportError as e:
        print(f"piper not installed ({e}); install the local-tts extra")
    path = write("tts", figures, {"turns": turns, "text": GREETING, "format": "mulaw/8000"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

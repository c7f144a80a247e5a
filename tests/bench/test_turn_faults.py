"""The soak's mid-turn fault proxy (``bench/loadgen/turn_faults.py``) in front of the real
tts-server: a turn with a token is hit at its first audio, one without passes untouched."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.loadgen.turn_faults import TurnFaultProxy
from bridge.io.provider_pool import ProviderPool, Speaker
from bridge.io.ttsd_server import start_tts_server
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


async def _speak(pool: ProviderPool, turn_id: str, text: str) -> list[object]:
    events: list[object] = []
    done = asyncio.Event()

    def sink(e: object) -> None:
        events.append(e)
        if isinstance(e, TurnDone | TurnFailed | ProviderFailed):
            done.set()

    Speaker([pool]).speak(turn_id, text, TurnSettings("tone", MULAW_8K), sink)
    await asyncio.wait_for(done.wait(), 20 * FACTOR)
    return events


@pytest.mark.parametrize("kind", ["drop", "garbage"])
def test_a_tokened_turn_fails_at_its_first_audio_and_an_untokened_one_plays(kind: str) -> None:
    async def main() -> None:
        tts = await start_tts_server(engine="tone")
        proxy = TurnFaultProxy(f"ws://127.0.0.1:{tts.port}/v1/ws/kova", 1.0, (kind,), seed=1)
        await proxy.start()
        try:
            url = f"ws://127.0.0.1:{proxy.port}/v1/ws/kova"
            pool = ProviderPool(ProviderSettings("flaky", "kova", url, voice="tone"))
            pool.backoff.base_s = 0.05
            assert await pool.start(10 * FACTOR)
            proxy.armed = True
            plain = await _speak(pool, "t1", "No token in this one.")
            assert any(isinstance(e, AudioReceived) for e in plain)
            assert isinstance(plain[-1], TurnDone)
            hit = await _speak(pool, "t2", "Turn k7 is here.")
            assert not any(isinstance(e, AudioReceived) for e in hit)
            assert isinstance(hit[-1], TurnFailed | ProviderFailed), hit
            assert proxy.faulted == [(kind, "k7")]
            assert proxy.injected[kind] == 1
            await pool.close()
        finally:
            await proxy.close()
            await tts.close()

    asyncio.run(asyncio.wait_for(main(), 60 * FACTOR))

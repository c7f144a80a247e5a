"""Prompts rendered once, end to end: the real daemon, the real ttsd (``tone`` engine, its
syntheses counted), calls over the Twilio media-stream leg.

The daemon renders the greeting before it is ready; the test then empties the prompt cache
(as an eviction would) so that the calls placed at once all find the greeting cold: one of
them starts its render, the others join it, and the engine synthesises it once. Waits are
bounded by timeouts scaled with ``CALLBRIDGE_TEST_TIME_FACTOR``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server
from bridge.providers.prompts import PromptCache
from bridge.ttsd.synth import SynthChunk, ToneEngine

from .harness import FACTOR, AppServer, TwilioCall, app_route, config_text, stack, tone_turn_ms

GREETING = "Hello and welcome to the prompt test."
CALLS = 20
ROUTE = f"""
[[routes]]
match = "*"
provider = "main"
greeting = "{GREETING}"
"""


class CountingTone(ToneEngine):
    """The tone engine, counting the syntheses it starts (shared by its rate variants)."""

    def __init__(self, native_rate_hz: int = 24000, texts: list[str] | None = None) -> None:
        super().__init__(native_rate_hz)
        self.texts: list[str] = [] if texts is None else texts

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        return CountingTone(sample_rate_hz, self.texts)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        self.texts.append(text)
        return super().synthesize(text, voice, speed)


async def _until(pred: object, timeout_s: float) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


def test_calls_arriving_together_on_a_cold_greeting_cause_one_synthesis() -> None:
    async def body() -> None:
        engine = CountingTone()
        tts = await start_tts_server(engine=engine)
        daemon = Daemon(parse_config(config_text(tts.port, ROUTE), "test.toml"))
        await daemon.start()
        try:
            assert engine.texts == [GREETING]  # rendered before it was ready
            assert daemon.runtime is not None
            daemon.runtime.cache = PromptCache()  # evicted: the next calls find it cold
            engine.texts.clear()
            leg = next(leg for leg in daemon.legs if leg.name == "media_streams")
            port = int(leg.port)  # type: ignore[attr-defined]
            frames = tone_turn_ms(GREETING) // 20
            async with contextlib.AsyncExitStack() as calls:
                placed = [TwilioCall(port) for _ in range(CALLS)]
                await asyncio.gather(*(calls.enter_async_context(c) for c in placed))
                await _until(
                    lambda: all(len(c.carrier.arrival_times()) >= frames for c in placed), 30
                )
                heard = [
                    b"".join(m for _, m in c.carrier.received_media()[:frames]) for c in placed
                ]
                assert all(c.carrier.errors() == [] for c in placed)
            assert engine.texts == [GREETING]  # one synthesis for every call
            cache = daemon.runtime.cache
            assert cache.renders == 1 and cache.joins + cache.hits == CALLS - 1
            assert len(set(heard)) == 1 and len(heard[0]) == frames * 160
        finally:
            await daemon.drain_and_stop()
            await daemon.close()
            await tts.close()

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))


class _CrashingTone(ToneEngine):
    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        raise RuntimeError("the voice crashed")


def test_a_turn_the_provider_fails_plays_the_fallback_prompt_and_the_app_learns_it() -> None:
    fallback = "Sorry, one moment please."
    route = f'fallback_prompt = "{fallback}"'

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "t1", "text": "Your balance is ten.", "final": True}
            ]
            async with stack(app_route(app.url, route)) as st:
                # the fallback was rendered at start-up; from now on every synthesis fails
                tone = st.tts.engine
                assert isinstance(tone, ToneEngine)
                tone.at_rate = lambda rate: _CrashingTone(rate)  # type: ignore[method-assign,assignment]
                async with TwilioCall(st.ms_port) as call:
                    error = await app.wait_for("provider.error")
                    assert error["turn_id"] == "t1"
                    ended = await app.wait_for("turn.interrupted")
                    assert ended["turn_id"] == "t1" and ended["reason"] == "provider_error"
                    frames = tone_turn_ms(fallback) // 20
                    await _until(lambda: len(call.carrier.arrival_times()) >= frames - 3, 10)
                    # what the caller heard is the fallback, not silence
                    assert abs(int(ended["heard_ms"]) - tone_turn_ms(fallback)) <= 60  # type: ignore[call-overload]

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

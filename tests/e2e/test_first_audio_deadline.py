"""A provider that accepts a turn and never answers: the caller hears the fallback prompt after
the first-audio deadline (``[daemon] first_audio_timeout_s``, 1 s by default), not silence until
the provider's own 10 s timeout, and the app learns it as ``provider.error`` with kind
``first_audio_timeout``. The real daemon and ttsd (``tone`` engine) over the Twilio leg; the
engine's synthesis of the app's turn blocks (on a synthesis worker) until the test ends. Waits
are bounded by timeouts scaled with ``CALLBRIDGE_TEST_TIME_FACTOR``; nothing asserts a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import SynthLimits, start_tts_server
from bridge.ttsd.synth import SynthChunk, ToneEngine

from .harness import FACTOR, AppServer, TwilioCall, app_route, config_text, tone_turn_ms

FALLBACK = "Sorry, one moment please."
TURN = "Your balance is ten."


class _HangingTone(ToneEngine):
    """The tone engine on synthesis workers (not inline: a hang must not stop the loop); a
    synthesis of ``TURN`` starts and sends nothing until ``release`` is set."""

    inline = False

    def __init__(self, native_rate_hz: int, release: threading.Event, started: list[str]) -> None:
        super().__init__(native_rate_hz)
        self.release = release
        self.started = started

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        return _HangingTone(sample_rate_hz, self.release, self.started)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        if text == TURN:
            self.started.append(text)
            self.release.wait(120 * FACTOR)
        yield from super().synthesize(text, voice, speed)


async def _until(pred: object, timeout_s: float) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


def test_a_provider_that_never_answers_gives_way_to_the_fallback_prompt() -> None:
    release = threading.Event()
    started: list[str] = []

    async def body() -> None:
        limits = SynthLimits(workers=2, queue=4, max_wait_s=60.0)
        tts = await start_tts_server(engine=_HangingTone(24000, release, started), limits=limits)
        try:
            async with AppServer() as app:
                app.on_started = [{"type": "say", "turn_id": "t1", "text": TURN, "final": True}]
                route = app_route(app.url, f'fallback_prompt = "{FALLBACK}"')
                daemon = Daemon(parse_config(config_text(tts.port, route), "test.toml"))
                await daemon.start()  # the fallback prompt is rendered before it is ready
                try:
                    leg = next(leg for leg in daemon.legs if leg.name == "media_streams")
                    async with TwilioCall(int(leg.port)) as call:  # type: ignore[attr-defined]
                        error = await app.wait_for("provider.error")
                        assert error["turn_id"] == "t1"
                        # given up at the first-audio deadline, not at the provider's timeout
                        assert error["kind"] == "first_audio_timeout"
                        ended = await app.wait_for("turn.interrupted")
                        assert ended["turn_id"] == "t1" and ended["reason"] == "provider_error"
                        frames = tone_turn_ms(FALLBACK) // 20
                        await _until(lambda: len(call.carrier.arrival_times()) >= frames - 3, 10)
                        # the caller heard the fallback while the provider still had not answered
                        assert started == [TURN] and not release.is_set()
                        heard = int(ended["heard_ms"])  # type: ignore[call-overload]
                        assert abs(heard - tone_turn_ms(FALLBACK)) <= 60
                        assert call.carrier.errors() == []
                        assert len(app.of("provider.error")) == 1
                        assert app.of("turn.finished") == []
                finally:
                    release.set()  # let the blocked synthesis thread end
                    await daemon.drain_and_stop()
                    await daemon.close()
        finally:
            release.set()
            await tts.close()

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

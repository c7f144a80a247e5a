"""Opus on a SIP call end to end: the caller offers Opus first, the daemon (``[sip] codecs``
preferring it) answers Opus at the caller's payload type with telephone-event/48000, and
the caller hears the greeting decoded from Opus at 16 kHz; RFC 4733 DTMF on the 48 kHz
clock still reaches the app; a G.711-only caller still gets PCMU (issue 34). The provider
is ttsd's deterministic tone engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call
from telcodec import opus

from .harness import FACTOR, AppServer, app_route, stack, tone_turn_ms

pytestmark = pytest.mark.skipif(not opus.available(), reason="PyAV with libopus not installed")

PREFER_OPUS = 'codecs = ["OPUS", "PCMU", "PCMA"]'


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


def test_an_opus_call_is_answered_in_opus_and_hears_the_greeting() -> None:
    greeting = "Hello over Opus."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": greeting, "final": True}]
            async with stack(app_route(app.url), sip_extra=PREFER_OPUS) as st:
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{st.sip_port}",
                    codecs=("OPUS", "PCMU"),
                    dtmf=((1.5, "7"),),
                    duration_s=2.5 * FACTOR,  # the whole greeting heard before the caller's BYE
                )
                result = await place_call(opts)
                report = build_report(result.recording)
                assert report.answered
                assert result.codec == "OPUS"
                wide = np.frombuffer(result.heard_wideband_pcm_s16le, dtype="<i2")
                assert len(wide) % 320 == 0 and len(wide) >= 16000  # 16 kHz, 320 a tick
                frames = wide.reshape(-1, 320).astype(np.float64)
                rms = np.sqrt(np.mean(frames**2, axis=1))
                loud_ms = int(np.sum(rms > 300)) * 20  # the greeting's tones, decoded
                assert abs(loud_ms - tone_turn_ms(greeting)) <= 300, loud_ms
                speech_ms = report.speech_frames_received * 20
                assert abs(speech_ms - tone_turn_ms(greeting)) <= 300
                assert [e["digit"] for e in app.of("dtmf")] == ["7"]
                finished = app.of("turn.finished")
                assert finished and finished[0]["turn_id"] == "g"

    run(body())


def test_a_g711_caller_still_gets_pcmu_where_opus_is_preferred() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": "Hi.", "final": True}]
            async with stack(app_route(app.url), sip_extra=PREFER_OPUS) as st:
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{st.sip_port}", duration_s=1.5 * FACTOR
                )
                result = await place_call(opts)
                assert build_report(result.recording).answered
                assert result.codec == "PCMU"
                assert result.heard_wideband_pcm_s16le == b""

    run(body())


def test_a_routes_prerendered_greeting_is_heard_on_an_opus_call() -> None:
    """The route's greeting is rendered at start-up at 16 kHz too (``[sip] codecs`` prefers
    OPUS), the format an Opus call asks for."""
    greeting = "Hello from the bridge."
    route = f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{greeting}"\n'

    async def body() -> None:
        async with stack(route, sip_extra=PREFER_OPUS) as st:
            opts = CallerOptions(
                target=f"sip:demo@127.0.0.1:{st.sip_port}",
                codecs=("OPUS",),
                duration_s=2.5 * FACTOR,
            )
            result = await place_call(opts)
            report = build_report(result.recording)
            assert report.answered and result.codec == "OPUS"
            speech_ms = report.speech_frames_received * 20
            assert abs(speech_ms - tone_turn_ms(greeting)) <= 300

    run(body())

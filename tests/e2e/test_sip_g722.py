"""A wideband SIP call end to end: the caller offers G.722 first, the daemon (``[sip]
codecs`` preferring it) answers G.722, and the caller hears the greeting decoded from
G.722 at 16 kHz (issue 34). The provider is ttsd's deterministic tone engine."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call

from .harness import FACTOR, AppServer, app_route, stack, tone_turn_ms

WIDEBAND = 'codecs = ["G722", "PCMU", "PCMA"]'


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


def test_a_g722_call_is_answered_in_g722_and_hears_the_greeting() -> None:
    greeting = "Hello in wideband."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": greeting, "final": True}]
            async with stack(app_route(app.url), sip_extra=WIDEBAND) as st:
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{st.sip_port}",
                    codecs=("G722", "PCMU"),
                    dtmf=((1.5, "7"),),
                    duration_s=2.5 * FACTOR,  # the whole greeting heard before the caller's BYE
                )
                result = await place_call(opts)
                report = build_report(result.recording)
                assert report.answered
                assert result.codec == "G722"
                wide = np.frombuffer(result.heard_wideband_pcm_s16le, dtype="<i2")
                # 16 kHz: 320 samples a tick, for as long as the call lasted
                assert len(wide) % 320 == 0 and len(wide) >= 16000
                frames = wide[: len(wide) // 320 * 320].reshape(-1, 320).astype(np.float64)
                rms = np.sqrt(np.mean(frames**2, axis=1))
                loud_ms = int(np.sum(rms > 300)) * 20  # the tones, not G.722's idle noise
                assert abs(loud_ms - tone_turn_ms(greeting)) <= 300, loud_ms
                speech_ms = report.speech_frames_received * 20
                assert abs(speech_ms - tone_turn_ms(greeting)) <= 300
                assert len(result.heard_pcm_s16le) > 0  # the 8 kHz recording too
                assert [e["digit"] for e in app.of("dtmf")] == ["7"]
                finished = app.of("turn.finished")
                assert finished and finished[0]["turn_id"] == "g"

    run(body())


def test_a_g711_caller_still_gets_g711_where_g722_is_preferred() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": "Hi.", "final": True}]
            async with stack(app_route(app.url), sip_extra=WIDEBAND) as st:
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{st.sip_port}", duration_s=1.5 * FACTOR
                )
                result = await place_call(opts)
                assert build_report(result.recording).answered
                assert result.codec == "PCMU"
                assert result.heard_wideband_pcm_s16le == b""

    run(body())


def test_a_routes_prerendered_greeting_is_heard_on_a_g722_call() -> None:
    """The route's greeting is rendered at start-up at 16 kHz too (``[sip] codecs`` prefers
    G722), the format a G.722 call asks for."""
    greeting = "Hello from the bridge."
    route = f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{greeting}"\n'

    async def body() -> None:
        async with stack(route, sip_extra=WIDEBAND) as st:
            opts = CallerOptions(
                target=f"sip:demo@127.0.0.1:{st.sip_port}",
                codecs=("G722",),
                duration_s=2.5 * FACTOR,
            )
            result = await place_call(opts)
            report = build_report(result.recording)
            assert report.answered and result.codec == "G722"
            speech_ms = report.speech_frames_received * 20
            assert abs(speech_ms - tone_turn_ms(greeting)) <= 300

    run(body())

"""What the wideband SIP calls end to end share (``test_sip_g722``, ``test_sip_opus``): the
daemon's ``[sip] codecs`` preferring the codec, a caller offering it (answered in it, the
greeting heard decoded at 16 kHz), a G.711-only caller (still PCMU) and a route's
prerendered greeting. The provider is ttsd's deterministic tone engine."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, CallResult, place_call

from .harness import FACTOR, AppServer, app_route, stack, tone_turn_ms


def prefer(codec: str) -> str:
    """The ``[sip]`` line that makes the daemon prefer ``codec`` (G.711 after it)."""
    return f'codecs = ["{codec}", "PCMU", "PCMA"]'


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def greeting_call(codec: str, greeting: str) -> CallResult:
    """A caller offering ``codec`` then PCMU, pressing 7 at 1.5 s: answered in ``codec``,
    the greeting's tones heard decoded at 16 kHz and as speech for as long as the turn,
    the digit and the finished turn reported to the app. The call's result, for what
    else the codec's test checks."""
    async with AppServer() as app:
        app.on_started = [{"type": "say", "turn_id": "g", "text": greeting, "final": True}]
        async with stack(app_route(app.url), sip_extra=prefer(codec)) as st:
            opts = CallerOptions(
                target=f"sip:demo@127.0.0.1:{st.sip_port}",
                codecs=(codec, "PCMU"),
                dtmf=((1.5, "7"),),
                duration_s=2.5 * FACTOR,  # the whole greeting heard before the caller's BYE
            )
            result = await place_call(opts)
            report = build_report(result.recording)
            assert report.answered
            assert result.codec == codec
            wide = np.frombuffer(result.heard_wideband_pcm_s16le, dtype="<i2")
            assert len(wide) % 320 == 0 and len(wide) >= 16000  # 16 kHz, 320 a tick
            frames = wide.reshape(-1, 320).astype(np.float64)
            rms = np.sqrt(np.mean(frames**2, axis=1))
            loud_ms = int(np.sum(rms > 300)) * 20  # the tones, not the codec's idle noise
            assert abs(loud_ms - tone_turn_ms(greeting)) <= 300, loud_ms
            speech_ms = report.speech_frames_received * 20
            assert abs(speech_ms - tone_turn_ms(greeting)) <= 300
            assert [e["digit"] for e in app.of("dtmf")] == ["7"]
            finished = app.of("turn.finished")
            assert finished and finished[0]["turn_id"] == "g"
            return result


async def g711_caller_gets_pcmu(codec: str) -> None:
    """A caller offering only PCMU where the daemon prefers ``codec``: answered in PCMU,
    nothing heard at 16 kHz."""
    async with AppServer() as app:
        app.on_started = [{"type": "say", "turn_id": "g", "text": "Hi.", "final": True}]
        async with stack(app_route(app.url), sip_extra=prefer(codec)) as st:
            opts = CallerOptions(
                target=f"sip:demo@127.0.0.1:{st.sip_port}", duration_s=1.5 * FACTOR
            )
            result = await place_call(opts)
            assert build_report(result.recording).answered
            assert result.codec == "PCMU"
            assert result.heard_wideband_pcm_s16le == b""


async def prerendered_greeting_is_heard(codec: str) -> None:
    """The route's greeting, rendered at start-up at 16 kHz too (``[sip] codecs`` prefers
    ``codec``), heard whole by a caller offering only ``codec``."""
    greeting = "Hello from the bridge."
    route = f'[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "{greeting}"\n'
    async with stack(route, sip_extra=prefer(codec)) as st:
        opts = CallerOptions(
            target=f"sip:demo@127.0.0.1:{st.sip_port}", codecs=(codec,), duration_s=2.5 * FACTOR
        )
        result = await place_call(opts)
        report = build_report(result.recording)
        assert report.answered and result.codec == codec
        speech_ms = report.speech_frames_received * 20
        assert abs(speech_ms - tone_turn_ms(greeting)) <= 300

"""Calls over the SIP/RTP leg, end to end, placed by `callbridge call`'s own UAC.

The daemon runs in-process against the real ttsd (tone engine); the caller is
`bridge.io.caller.place_call` (a SIP UAC over UDP with RTP), the same code a
user runs as `callbridge call sip:...`.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, SpeakClip, place_call
from telcodec import g711

from .harness import (
    FACTOR,
    AppServer,
    app_route,
    speech_mulaw,
    stack,
    tone_turn_ms,
)

LONG = " ".join(f"word{i}" for i in range(60)) + "."


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["kova", "kugelaudio", "kletso", "coda", "zwst"])
def test_sip_caller_speech_barges_in_with_every_provider_protocol(protocol: str) -> None:
    speech = g711.ulaw_decode(speech_mulaw(1.5))

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "long", "text": LONG, "final": True}]
            async with stack(app_route(app.url), protocol=protocol) as st:
                sip = st.sip_port
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{sip}",
                    speak=(SpeakClip("speech", 1.0, speech),),
                    duration_s=3.0 * FACTOR,  # the cut must come before the caller hangs up
                )
                result = await place_call(opts)
                report = build_report(result.recording)
                assert report.answered
                assert report.first_audio_ms is not None
                cut = app.of("turn.interrupted")
                assert cut and cut[0]["reason"] == "speech"
                heard_s = int(cut[0]["heard_ms"]) / 1000.0  # type: ignore[call-overload]
                (barge,) = report.barge_ins
                assert barge.outcome == "stopped", barge
                assert barge.stopped_s is not None and barge.onset_s >= 1.0 - 0.001
                # how fast it stops is bench_bargein's; here: the turn played from its first
                # frame until the cut, which came after the caller's speech (order, not time),
                # within a few frames of transit and jitter buffer either way
                first_audio_s = report.first_audio_ms / 1000.0
                assert barge.onset_s - first_audio_s - 0.1 <= heard_s <= barge.stopped_s + 0.1

    run(body())


def test_sip_call_hears_the_greeting_and_dtmf_reaches_the_app() -> None:
    greeting = "Hello from the bridge."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": greeting, "final": True}]
            async with stack(app_route(app.url)) as st:
                sip = st.sip_port
                opts = CallerOptions(
                    target=f"sip:demo@127.0.0.1:{sip}",
                    dtmf=((1.5, "7"),),
                    duration_s=2.5 * FACTOR,  # the whole greeting heard before the caller's BYE
                )
                result = await place_call(opts)
                report = build_report(result.recording)
                assert report.answered and report.setup_ms is not None
                speech_ms = report.speech_frames_received * 20
                assert abs(speech_ms - tone_turn_ms(greeting)) <= 200
                assert report.pacing is not None
                assert [e["digit"] for e in app.of("dtmf")] == ["7"]
                finished = app.of("turn.finished")
                assert finished and finished[0]["turn_id"] == "g"

    run(body())


def test_app_transfer_and_hangup_commands_reach_the_sip_dialog() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "hangup", "reason": "bye"}]
            async with stack(app_route(app.url)) as st:
                sip = st.sip_port
                opts = CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=5.0)
                result = await place_call(opts)
                report = build_report(result.recording)
                assert report.answered
                assert report.ended_by == "remote-bye"  # the daemon hung up, not our 5 s
                leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
                assert leg.active_calls() == 0
                assert leg.ports.allocated_count == 0  # the RTP port pair was released

    run(body())


def test_app_dtmf_command_is_sent_as_rfc4733_events_the_caller_receives() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "dtmf", "digits": "42#"}]
            async with stack(app_route(app.url)) as st:
                sip = st.sip_port
                opts = CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=2.5 * FACTOR)
                report = build_report((await place_call(opts)).recording)
                assert report.answered
                assert report.dtmf_received == "42#"

    run(body())


@pytest.mark.needs("ipv6")
def test_sip_over_ipv6_loopback() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": "Over IPv6.", "final": True}]
            async with stack(app_route(app.url), sip_host="[::1]") as st:
                sip = st.sip_port
                opts = CallerOptions(target=f"sip:demo@[::1]:{sip}", duration_s=2.0 * FACTOR)
                report = build_report((await place_call(opts)).recording)
                assert report.answered and report.speech_frames_received > 10
                assert app.of("turn.finished")

    run(body())


def test_the_sip_udp_socket_asks_for_a_receive_buffer_that_holds_a_burst() -> None:
    """A burst of hang-ups beyond the kernel's default buffer (about a hundred datagrams)
    would be dropped unread, leaving those calls up until the RTP timeout."""
    from pathlib import Path

    from bridge.io.legs.sip import SipLeg

    default = int(Path("/proc/sys/net/core/rmem_default").read_text())

    async def body() -> None:
        async with stack(app_route("ws://127.0.0.1:9/app")) as st:
            leg = next(leg for leg in st.daemon.legs if isinstance(leg, SipLeg))
            udp = next(r for r in leg.runners if r.kind == "UDP")
            assert udp.udp is not None
            sock = udp.udp.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) > default

    run(body())


def test_the_stacks_sip_listener_binds_port_0_and_reports_the_port_it_got() -> None:
    """The harness never chooses the daemon's SIP port (one free a moment ago could be
    taken by another process before the daemon binds it): port 0, read back."""

    async def body() -> None:
        async with stack(app_route("ws://127.0.0.1:9/app")) as st:
            assert tuple(st.config.sip.listen) == ("127.0.0.1:0",)
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # the daemon holds both
                with socket.socket(socket.AF_INET, kind) as s, pytest.raises(OSError):
                    s.bind(("127.0.0.1", st.sip_port))

    run(body())

"""Overload: new calls are refused, the calls in progress keep going.

``tests/ops/test_refusals.py`` checks that every refusal is answered and
counted. This test checks the other half of the promise: while the daemon
refuses new work (``max_calls`` reached, or the media clock lagging beyond
``max_loop_lag_ms``), the calls already up, one SIP call and one Twilio
media stream, keep receiving frames through the whole refusal window and
end cleanly when their callers hang up. The refusals carry ``Retry-After``
(SIP 503) or are an HTTP 503 (WebSocket upgrade). No pacing figure is
asserted: frames keep arriving, that is all.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import uuid

import pytest
import websockets

from bench.loadgen.faultrelay import Faults, SipRtpRelay
from bridge.config import parse_config
from bridge.io import caller
from bridge.io.caller import CallerOptions, CallResult, place_call
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server

from .conftest import FACTOR
from .inprocess import Overloaded, with_daemon

LONG = " ".join(f"word{i}" for i in range(120)) + "."
SDP = (
    "v=0\r\no=c 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)
CALL_S = 9.0


async def invite_answer(target: tuple[str, int]) -> str:
    """Send one INVITE from 127.0.0.1 and return its final answer's head (status and headers)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    host, port = sock.getsockname()
    branch = "z9hG4bK" + uuid.uuid4().hex[:16]
    msg = (
        f"INVITE sip:demo@{target[0]}:{target[1]} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {host}:{port};branch={branch};rport\r\n"
        f"From: <sip:c@{host}>;tag={uuid.uuid4().hex[:8]}\r\nTo: <sip:demo@{target[0]}>\r\n"
        f"Call-ID: {uuid.uuid4().hex}\r\nCSeq: 1 INVITE\r\n"
        f"Contact: <sip:c@{host}:{port}>\r\nMax-Forwards: 70\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(SDP)}\r\n\r\n{SDP}"
    )
    try:
        sock.sendto(msg.encode(), target)
        while True:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65535), 10 * FACTOR)
            head = data.decode("utf-8", "replace").partition("\r\n\r\n")[0]
            m = re.match(r"SIP/2\.0 (\d{3})", head)
            if m and int(m.group(1)) >= 200:
                return head
    finally:
        sock.close()


async def upgrade_status(url: str) -> int:
    try:
        async with websockets.connect(url):
            return 101
    except websockets.InvalidStatus as e:
        return int(e.response.status_code)


def frames_between(result: CallResult, start: float, end: float) -> int:
    rec = result.recording
    frames = rec.heard_frames if rec.heard_frames is not None else rec.frames
    return sum(1 for f in frames if start <= f.at_s <= end and f.level_dbfs > -40)


def test_refused_while_full_or_lagging_and_the_calls_in_progress_keep_their_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(caller, "HANGUP_GRACE_S", 5.0)

    async def body() -> None:
        await with_daemon(config, "overload.toml", steps)

    async def steps(daemon: Daemon) -> None:
        sip_leg = next(leg for leg in daemon.legs if leg.name == "sip")
        streams = next(leg for leg in daemon.legs if leg.name == "media_streams")
        ms_port = streams.port  # type: ignore[attr-defined]
        target = sip_leg.runners[0].udp.get_extra_info("sockname")[:2]  # type: ignore[attr-defined]
        relay = SipRtpRelay(target, Faults(), seed=0)
        await relay.start()
        loop = asyncio.get_running_loop()
        try:
            host, port = relay.sip_front
            sip_call = asyncio.ensure_future(
                place_call(CallerOptions(target=f"sip:demo@{host}:{port}", duration_s=CALL_S))
            )
            ws_call = asyncio.ensure_future(
                place_call(
                    CallerOptions(target=f"ws://127.0.0.1:{ms_port}/twilio", duration_s=CALL_S)
                )
            )
            deadline = loop.time() + 10 * FACTOR
            while sip_leg.active_calls() + streams.active_calls() < 2 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert sip_leg.active_calls() == 1 and streams.active_calls() == 1
            window_start = loop.time()
            # max_calls (1) reached: 503 with Retry-After
            full = await invite_answer(target)
            # the media clock lags: new SIP calls and new streams are refused
            real = daemon.services.ticker
            daemon.services.ticker = Overloaded(real)  # type: ignore[assignment]
            try:
                lagging_status = await upgrade_status(f"ws://127.0.0.1:{ms_port}/twilio")
                lagging = await invite_answer(target)
                await asyncio.sleep(2.0)  # an observation window, not a wait for an event
            finally:
                daemon.services.ticker = real
            window_end = loop.time()
            sip_result, ws_result = await sip_call, await ws_call
        finally:
            relay.close()
        assert full.startswith("SIP/2.0 503"), full
        assert re.search(r"\r\nRetry-After: *\d+", full), full
        assert lagging_status == 503
        assert lagging.startswith("SIP/2.0 503") and "\r\nRetry-After:" in lagging, lagging
        for result in (sip_result, ws_result):
            rec = result.recording
            assert rec.answered_at_s is not None and rec.failure is None, rec.failure
            assert rec.ended_by in ("local-hangup", "stop"), rec.ended_by
            # speech frames kept arriving through the refusal window
            assert frames_between(result, window_start, window_end) > 0, rec.transport

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


def config(tts_port: int, streams_extra: str = "") -> str:
    base = random.randrange(30000, 39800, 200)
    return f"""
[daemon]
log_format = "json"
event_loop = "asyncio"
drain_timeout_s = 1

[sip]
listen = ["127.0.0.1:0"]
transports = ["udp"]
rtp_ports = "{base}-{base + 199}"
max_calls = 1

[media_streams]
listen = "127.0.0.1:0"
{streams_extra}

[api]
listen = "127.0.0.1:0"

[providers.main]
protocol = "kova"
url = "ws://127.0.0.1:{tts_port}/v1/ws/kova"
api_key = "k"
voice = "tone"

[[routes]]
match = "*"
provider = "main"
greeting = "{LONG}"
"""


async def upgrade_refusal(url: str) -> tuple[int, str | None]:
    """The HTTP status of a refused upgrade and its Retry-After (101, None if accepted)."""
    try:
        async with websockets.connect(url):
            return 101, None
    except websockets.InvalidStatus as e:
        return int(e.response.status_code), e.response.headers.get("Retry-After")


def test_beyond_the_stream_cap_an_upgrade_is_refused_and_the_open_stream_keeps_its_frames() -> None:
    async def body() -> None:
        tts = await start_tts_server(engine="tone")
        daemon = Daemon(parse_config(config(tts.port, "max_streams = 1"), "overload.toml"))
        await daemon.start()
        try:
            streams = next(leg for leg in daemon.legs if leg.name == "media_streams")
            url = f"ws://127.0.0.1:{streams.port}/twilio"  # type: ignore[attr-defined]
            loop = asyncio.get_running_loop()
            call = asyncio.ensure_future(place_call(CallerOptions(target=url, duration_s=CALL_S)))
            deadline = loop.time() + 10 * FACTOR
            while streams.active_calls() < 1 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert streams.active_calls() == 1
            window_start = loop.time()
            status, retry_after = await upgrade_refusal(url)
            await asyncio.sleep(2.0)  # an observation window, not a wait for an event
            window_end = loop.time()
            result = await call
        finally:
            await daemon.drain_and_stop()
            await daemon.close()
            await tts.close()
        assert status == 503 and retry_after is not None and retry_after.isdigit()
        rec = result.recording
        assert rec.answered_at_s is not None and rec.failure is None, rec.failure
        assert rec.ended_by == "stop", rec.ended_by
        assert frames_between(result, window_start, window_end) > 0

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

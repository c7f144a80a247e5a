"""The caller's media-stream side over loopback, against an in-test Twilio-stream server.

The server is ``bridge.streams.twilio`` (our engine) behind ``bridge.io.httpws``:
on ``start`` it plays a paced 3 s greeting (200 ms of lead, a mark every
25 frames) and sends ``clear`` on the first inbound frame at or above
-40 dBFS. Waits are bounded by ``TIMEOUT_S`` (scaled by
``CALLBRIDGE_TEST_TIME_FACTOR``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import math
import os
import struct
from collections.abc import Awaitable, Callable

from bridge.control.report import build_report, level_dbfs
from bridge.engine import CloseConnection, SendText
from bridge.io.caller import CallerOptions, CallResult, SpeakClip, place_call, run_media_clock
from bridge.io.httpws import HttpRequest, HttpResponse, WsConnection, serve_http_ws
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    StreamStarted,
    StreamStopped,
)
from bridge.streams.twilio import TwilioStreamProtocol
from telcodec import g711

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 15.0 * FACTOR
GREETING_FRAMES = 150
LEAD_FRAMES = 10
MARK_EVERY_FRAMES = 25


def tone_pcm(frames: int, amplitude: float, freq_hz: float) -> bytes:
    samples = frames * 160
    return struct.pack(
        f"<{samples}h",
        *(
            round(amplitude * 32767 * math.sin(2 * math.pi * freq_hz * n / 8000))
            for n in range(samples)
        ),
    )


class GreetingServer:
    """One Twilio stream per connection: greeting, barge-in by ``clear``, optional hang-up."""

    def __init__(self, hangup_after_frames: int | None = None) -> None:
        self.greeting = g711.ulaw_encode(tone_pcm(GREETING_FRAMES, 0.3, 440.0))
        self.hangup_after_frames = hangup_after_frames
        self.started: StreamStarted | None = None
        self.digits: list[str] = []
        self.marks: list[MarkPlayed] = []
        self.clear_sent_at: float | None = None
        self.stopped: StreamStopped | None = None
        self.frames_sent = 0
        self.done = asyncio.Event()

    async def route(self, request: HttpRequest) -> Callable[[WsConnection], Awaitable[None]]:
        return self.handle

    async def handle(self, conn: WsConnection) -> None:
        loop = asyncio.get_running_loop()
        engine = TwilioStreamProtocol()
        engine.connection_made(loop.time())
        speaking = False
        greeter: asyncio.Task[int] | None = None

        async def flush() -> None:
            for action in engine.actions_to_send():
                if isinstance(action, SendText):
                    await conn.send_text(action.text)
                elif isinstance(action, CloseConnection):
                    await conn.close(action.code, action.reason)

        async def tick(n: int, now: float) -> bool:
            nonlocal speaking
            if not speaking:
                return False
            if self.hangup_after_frames is not None and n >= self.hangup_after_frames:
                engine.hangup(now)
                await flush()
                return False
            for index in range(n, n + LEAD_FRAMES) if n == 0 else [n + LEAD_FRAMES - 1]:
                if index >= GREETING_FRAMES:
                    speaking = False
                    break
                engine.send_frame(self.greeting[index * 160 : (index + 1) * 160], now)
                self.frames_sent += 1
                if (index + 1) % MARK_EVERY_FRAMES == 0:
                    engine.mark(f"m{index + 1}", now)
            await flush()
            return speaking

        async for message in conn:
            now = loop.time()
            assert isinstance(message, str)
            engine.receive_text(message, now)
            for event in engine.events_received():
                if isinstance(event, StreamStarted):
                    self.started, speaking = event, True
                    greeter = loop.create_task(run_media_clock(now, tick))
                elif isinstance(event, AudioReceived) and speaking:
                    if level_dbfs(g711.ulaw_decode(event.payload)) >= -40.0:
                        speaking = False
                        engine.clear(now)
                        self.clear_sent_at = now
                elif isinstance(event, DtmfReceived):
                    self.digits.append(event.digit)
                elif isinstance(event, MarkPlayed):
                    self.marks.append(event)
                elif isinstance(event, StreamStopped):
                    self.stopped = event
            await flush()
        if greeter is not None:
            greeter.cancel()
        self.done.set()


async def call_server(
    server: GreetingServer, opts_for: Callable[[int], CallerOptions]
) -> CallResult:
    async def not_found(request: HttpRequest) -> HttpResponse:
        return HttpResponse.text(404, "not found")

    listener = await serve_http_ws("127.0.0.1", 0, http=not_found, ws=server.route)
    try:
        result = await asyncio.wait_for(place_call(opts_for(listener.port)), TIMEOUT_S)
        await asyncio.wait_for(server.done.wait(), TIMEOUT_S)
        return result
    finally:
        await listener.close()


def speech_frames(pcm: bytes) -> list[int]:
    return [i for i in range(len(pcm) // 320) if level_dbfs(pcm[i * 320 : (i + 1) * 320]) >= -40]


def test_twilio_call_greeting_barge_in_clear_dtmf_and_recording() -> None:
    server = GreetingServer()
    # The caller speaks from 0.9 s (10 quiet frames, then a 300 Hz tone) after the socket opens.
    speech = bytes(320 * 10) + tone_pcm(25, 0.2, 300.0)

    def opts(port: int) -> CallerOptions:
        return CallerOptions(
            target=f"ws://127.0.0.1:{port}/twilio",
            speak=(SpeakClip("speech.wav", 0.7, speech),),
            dtmf=((0.4, "7"),),
            duration_s=2.5,
            route="demo",
        )

    result = asyncio.run(call_server(server, opts))
    report = build_report(result.recording)
    assert report.answered and report.ended_by == "stop" and report.protocol_errors == ()
    # The server saw our start (with the route), the digit, and our stop.
    assert server.started is not None and server.started.route == "demo"
    assert server.started.custom_parameters == {"route": "demo"}
    assert server.digits == ["7"]
    assert server.stopped is not None and server.stopped.reason == "stop"
    # Setup: socket open -> first outbound media (how long it takes: bench_streams.py).
    assert report.setup_ms is not None and report.setup_ms > 0
    assert report.first_audio_ms == report.setup_ms
    assert report.frames_received == server.frames_sent
    assert report.pacing is not None and report.pacing.intervals >= GREETING_FRAMES // 4
    # Barge-in: the caller's speech starts at frame 45 (0.9 s; never early, later only if
    # its loop woke late), the server clears, and the greeting stops at the clear.
    assert server.clear_sent_at is not None
    (barge,) = report.barge_ins
    assert barge.onset_s >= 0.9 - 0.001
    assert barge.outcome == "cleared" and report.clears_received == 1
    assert barge.stopped_s is not None and barge.stopped_s >= barge.onset_s
    assert barge.barge_in_ms is not None
    # Marks, one every 25 frames sent: those due to play before the clear arrived
    # were played, the rest echoed by the clear (within a frame of it, either).
    sent = [25 * (k + 1) for k in range(server.frames_sent // MARK_EVERY_FRAMES)]
    assert [m.name for m in server.marks] == [f"m{k}" for k in sent] and len(sent) >= 2
    first_played_s = report.setup_ms / 1000.0
    for mark, k in zip(server.marks, sent, strict=True):
        due_s = first_played_s + k * 0.020
        if due_s < barge.stopped_s - 0.020:
            assert not mark.cleared, (mark, due_s, barge.stopped_s)
        elif due_s > barge.stopped_s + 0.020:
            assert mark.cleared, (mark, due_s, barge.stopped_s)
    assert server.marks[0].cleared is False  # m25 is due long before the onset
    # What the caller heard: the greeting from its first frame until the clear, then silence.
    heard = speech_frames(result.heard_pcm_s16le)
    assert abs(len(result.heard_pcm_s16le) // 320 - 125) <= 1
    assert heard == list(range(heard[0], heard[-1] + 1))
    assert heard[0] <= report.setup_ms / 20.0 + 2
    assert abs(heard[-1] + 1 - round(barge.stopped_s / 0.020)) <= 2  # cut at the clear


def test_server_hanging_up_ends_the_call() -> None:
    server = GreetingServer(hangup_after_frames=15)

    def opts(port: int) -> CallerOptions:
        return CallerOptions(target=f"ws://127.0.0.1:{port}/twilio", duration_s=5.0)

    result = asyncio.run(call_server(server, opts))
    report = build_report(result.recording)
    assert report.ended_by == "closed-by-server"  # not the caller's own 5 s
    assert report.frames_received == server.frames_sent == 15 + LEAD_FRAMES - 1


def test_refused_websocket_is_an_unanswered_call() -> None:
    async def main() -> CallResult:
        async def forbidden(request: HttpRequest) -> HttpResponse:
            return HttpResponse.text(403, "no")

        listener = await serve_http_ws("127.0.0.1", 0, http=forbidden, ws=forbidden)
        try:
            opts = CallerOptions(target=f"ws://127.0.0.1:{listener.port}/twilio", duration_s=1)
            return await asyncio.wait_for(place_call(opts), TIMEOUT_S)
        finally:
            await listener.close()

    report = build_report(asyncio.run(main()).recording)
    assert not report.answered
    assert report.failure is not None and "403" in report.failure

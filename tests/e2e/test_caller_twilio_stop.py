"""The caller's ``stop`` ends a Twilio call clean (issue 31: the README's own example ended
with ``protocol error: media outside a started stream``).

A server cannot know the carrier stopped until it reads ``stop``: what it sent before is
in flight. Twilio drops it; so does the caller. The server here makes that deterministic:
it answers the caller's ``stop`` with a media frame and a mark. Waits are bounded by
``TIMEOUT_S`` (scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from bridge.control.report import build_report
from bridge.engine import CloseConnection, SendText
from bridge.io.caller import CallerOptions, place_call
from bridge.io.httpws import HttpRequest, HttpResponse, WsConnection, serve_http_ws
from bridge.streams.base import StreamStarted, StreamStopped
from bridge.streams.twilio import TwilioStreamProtocol

from .harness import stack

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 30.0 * FACTOR
FRAME = b"\x7f" * 160


class FloodServer:
    """Sends media as fast as the socket takes it, never waiting for the caller: whenever
    the caller sends ``stop``, frames the server sent before reading it are in flight."""

    def __init__(self) -> None:
        self.stopped_at_frame: int | None = None
        self.sent = 0
        self.done = asyncio.Event()

    async def route(self, request: HttpRequest) -> Callable[[WsConnection], Awaitable[None]]:
        return self.handle

    async def handle(self, conn: WsConnection) -> None:
        loop = asyncio.get_running_loop()
        engine = TwilioStreamProtocol()
        engine.connection_made(loop.time())
        flooder: asyncio.Task[None] | None = None

        async def flush() -> None:
            for action in engine.actions_to_send():
                if isinstance(action, SendText):
                    await conn.send_text(action.text)
                elif isinstance(action, CloseConnection):
                    await conn.close(action.code, action.reason)

        async def flood() -> None:
            while self.stopped_at_frame is None:
                engine.send_frame(FRAME, loop.time())
                self.sent += 1
                await flush()
                await asyncio.sleep(0)

        try:
            async for message in conn:
                now = loop.time()
                assert isinstance(message, str)
                engine.receive_text(message, now)
                for event in engine.events_received():
                    if isinstance(event, StreamStarted):
                        flooder = loop.create_task(flood())
                    elif isinstance(event, StreamStopped):
                        self.stopped_at_frame = self.sent
                await flush()
        except ConnectionError:
            pass
        finally:
            if flooder is not None:
                flooder.cancel()
            self.done.set()


def test_frames_in_flight_at_stop_are_no_protocol_error() -> None:
    server = FloodServer()

    async def not_found(request: HttpRequest) -> HttpResponse:
        return HttpResponse.text(404, "not found")

    async def body() -> None:
        listener = await serve_http_ws("127.0.0.1", 0, http=not_found, ws=server.route)
        try:
            target = f"ws://127.0.0.1:{listener.port}/twilio"
            result = await asyncio.wait_for(
                place_call(CallerOptions(target=target, duration_s=0.5)), TIMEOUT_S
            )
            await asyncio.wait_for(server.done.wait(), TIMEOUT_S)
        finally:
            await listener.close()
        report = build_report(result.recording)
        assert server.stopped_at_frame is not None
        assert report.answered and report.ended_by == "stop"
        # (the frames the server sent before it read stop and the caller had not read
        # yet are dropped: without that, this call ended with protocol errors)
        assert 0 < report.frames_received <= server.stopped_at_frame
        assert report.protocol_errors == ()

    asyncio.run(body())


GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello and welcome. This greeting goes on, sentence after sentence, long after \
the caller has hung up on it."
"""


def test_the_readme_example_against_a_daemon_ends_clean() -> None:
    """``callbridge call ws://.../twilio --duration N`` stopping while the daemon speaks:
    the call is answered, heard, and ends by our ``stop`` with no protocol error."""

    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            target = f"ws://127.0.0.1:{st.ms_port}/twilio"
            for duration_s in (1.0, 1.5, 2.0):
                result = await asyncio.wait_for(
                    place_call(CallerOptions(target=target, duration_s=duration_s)), TIMEOUT_S
                )
                report = build_report(result.recording)
                assert report.answered and report.ended_by == "stop", report
                assert report.frames_received > 0
                assert report.protocol_errors == (), report.protocol_errors

    asyncio.run(body())

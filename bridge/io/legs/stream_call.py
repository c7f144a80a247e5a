"""One carrier WebSocket of the media-stream leg: its dialect engine, messages in, frames out.

The per-message half of the media-stream leg (``bridge.io.legs.streams`` has
the rest: the listener, the upgrade's checks, starting a call at the
stream's ``start``). A carrier sends each call's caller audio as one message
every 20 ms, and the media ticker sends the call's frame back as one message
every 20 ms: ``StreamCall._on_message`` and ``StreamLeg.send_frame`` run
50 times a second for every call. This module is compiled with mypyc
(``bridge/native.py``); what runs once per call stays interpreted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from bridge.engine import CloseConnection, SendBytes, SendText
from bridge.logs import get_logger
from bridge.streams.base import (
    AudioReceived,
    DtmfReceived,
    MarkPlayed,
    MediaStreamProtocol,
    ProtocolViolation,
    SendEncodedText,
    SequenceGap,
    StreamStarted,
    StreamStopped,
)
from telcodec.framing import FrameCutter

__all__ = ["CallerSide", "CarrierSocket", "StreamCall", "StreamLeg"]

log = get_logger("callbridge.streams")


class CallerSide(Protocol):
    """What a stream hands the caller's audio, digits, mark echoes and end to.

    Its ``CallRunner``; typed by this protocol so a test's recording stand-in fits.
    """

    @property
    def finished(self) -> bool: ...

    def caller_audio(self, frame: bytes) -> None: ...

    def caller_dtmf(self, digit: str) -> None: ...

    def mark_echoed(self, name: str, cleared: bool) -> None: ...

    def leg_ended(self, reason: str) -> None: ...


class CarrierSocket(Protocol):
    """What a stream writes its messages to and reads them from: its ``WsConnection``.

    Typed by this protocol so a test's recording stand-in fits (the connection
    is compiled too, and mypyc checks the type of an attribute of its own classes).
    """

    def send_encoded_text_nowait(self, data: bytes) -> None: ...

    def send_text_nowait(self, text: str) -> None: ...

    def send_bytes_nowait(self, data: bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...

    async def serve(self, on_message: Callable[[str | bytes], None]) -> None: ...


class StreamLeg:
    """``LegAdapter`` for one media-stream socket: what its call sends goes through the engine."""

    def __init__(self, stream: StreamCall) -> None:
        self.stream = stream
        self.kind: str = stream.engine.DIALECT

    def send_frame(self, frame: bytes | None, n: int, now: float) -> None:
        if frame is not None:
            stream = self.stream
            data = stream.engine.frame_message(frame)
            if data is not None:  # the per-frame path: one message, nothing queued to pump
                stream.conn.send_encoded_text_nowait(data)
                return
            stream.engine.send_frame(frame, now)
            stream.pump()

    def send_mark(self, name: str) -> None:
        self.stream.engine.mark(name, self.stream.now())
        self.stream.pump()

    def clear(self) -> None:
        self.stream.engine.clear(self.stream.now())
        self.stream.pump()

    def hangup(self, reason: str) -> None:
        self.stream.engine.hangup(self.stream.now())
        self.stream.pump()

    def transfer(self, target: str, trunk: str = "") -> None:
        # the call refuses a transfer on a media stream (``LegProfile.can_transfer``)
        log.warning("streams.transfer_unsupported", dialect=self.kind, target=target)

    def send_dtmf(self, digits: str) -> None:
        # only dialects with a DTMF message get here: the call refuses it on the others
        # (``LegProfile.can_send_dtmf``), and the engine raises if one did
        self.stream.engine.send_dtmf(digits, self.stream.now())
        self.stream.pump()


class StreamCall:
    """One carrier WebSocket: its engine, and its call once started.

    ``on_started`` is called with the stream and the engine's ``StreamStarted``;
    it sets ``call`` and ``cutter`` (or has the engine refuse the stream).
    ``preempt`` is called before each message (``_on_message``).
    """

    def __init__(
        self,
        conn: CarrierSocket,
        engine: MediaStreamProtocol,
        loop: asyncio.AbstractEventLoop,
        preempt: Callable[[], None],
        on_started: Callable[[StreamCall, StreamStarted], None],
    ) -> None:
        self.conn = conn
        self.engine = engine
        self.loop = loop
        self.call: CallerSide | None = None
        self.cutter: FrameCutter | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.connected_at = loop.time()
        self.preempt = preempt
        """Called before each message: frames due meanwhile leave first (``_on_message``)."""
        self.on_started = on_started

    def now(self) -> float:
        return self.loop.time()

    def pump(self) -> None:
        engine = self.engine
        for action in engine.actions_to_send():
            if type(action) is SendEncodedText:  # outbound media: the hot path
                self.conn.send_encoded_text_nowait(action.data)
            elif isinstance(action, SendText):
                self.conn.send_text_nowait(action.text)
            elif isinstance(action, SendBytes):
                self.conn.send_bytes_nowait(action.data)
            elif isinstance(action, CloseConnection):
                self.loop.create_task(self.conn.close(action.code, action.reason))
        for event in engine.events_received():
            if type(event) is AudioReceived:  # inbound media: the hot path
                self._on_audio(event.payload)
            else:
                self._on_event(event)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        deadline = engine.next_deadline()
        if deadline is not None:
            self.timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.engine.handle_timer(self.now())
        self.pump()

    def _on_audio(self, payload: bytes) -> None:
        call, cutter = self.call, self.cutter
        if call is None or cutter is None:
            return
        if len(payload) == cutter.frame_bytes and not cutter.pending_bytes:
            call.caller_audio(payload)  # one whole frame, nothing held: what push would give
            return
        for frame in cutter.push(payload):
            call.caller_audio(frame)

    def _on_event(self, event: object) -> None:
        if isinstance(event, AudioReceived):
            self._on_audio(event.payload)
        elif isinstance(event, StreamStarted):
            self.on_started(self, event)
        elif isinstance(event, DtmfReceived):
            if self.call is not None:
                self.call.caller_dtmf(event.digit)
        elif isinstance(event, MarkPlayed):
            if self.call is not None:
                self.call.mark_echoed(event.name, event.cleared)
        elif isinstance(event, StreamStopped):
            if self.call is not None:
                self.call.leg_ended(event.reason)
        elif isinstance(event, SequenceGap):
            log.info("streams.sequence_gap", expected=event.expected, got=event.got)
        elif isinstance(event, ProtocolViolation):
            log.warning("streams.protocol_violation", reason=event.reason, path=self.engine.PATH)

    def _on_message(self, msg: str | bytes) -> None:
        # A preemption point (bridge.io.ticker, "run_if_due"): the loop runs every
        # connection that became readable before it looks at its timers, and
        # at hundreds of calls one pass over the carriers' messages (each
        # with its VAD) outlasts a millisecond; the frames due meanwhile
        # leave here instead of after all of them. Not due: one clock read.
        self.preempt()
        if isinstance(msg, str):
            audio = self.engine.take_media_text(msg)
            if audio is not None:  # the per-message path: nothing queued to pump
                self._on_audio(audio)
                return
            self.engine.receive_text(msg, self.loop.time())
        else:
            self.engine.receive_bytes(msg, self.loop.time())
        self.pump()

    async def run(self) -> None:
        self.connected_at = self.now()
        self.engine.connection_made(self.connected_at)
        self.pump()
        try:
            await self.conn.serve(self._on_message)
        finally:
            if self.timer is not None:
                self.timer.cancel()
            if getattr(self.conn, "stalled", False) and self.call is not None:
                self.call.leg_ended("carrier_stalled")  # cut off by WsConnection.guard_stall
            self.engine.connection_lost(self.now())
            with contextlib.suppress(Exception):
                self.pump()
            if self.call is not None and not self.call.finished:
                self.call.leg_ended("connection_lost")

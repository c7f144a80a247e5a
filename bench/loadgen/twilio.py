"""Many Twilio media streams from one process: a lean carrier per WebSocket.

What Twilio does, trimmed to what a load test needs (the full emulator,
``bridge.streams.carrier.TwilioCarrier``, parses and buffers every message,
which costs more CPU than the daemon under test): ``connected`` + ``start``
from ``TwilioCarrier``; then one inbound ``media`` message per call every
20 ms (quiet noise; calls spread over 20 one-millisecond phases); outbound
``media`` is only timestamped on arrival (``time.monotonic_ns()``), and each
``mark`` is echoed when the audio sent before it has played at real time
(the daemon's turns end on the final mark's echo).

For a peer whose ``media`` messages are not 20 ms (Pipecat sends 137.5 ms),
``sized_media=True`` reads each message's payload length and plays it for its
own duration, and keeps the sizes (``WsCall.sizes``). Every call also counts
``clear`` messages (the buffer is flushed) and ``gaps``: the buffer ran dry
while recording with no ``mark`` since the last ``media`` (an underrun mid-turn;
a turn that ended with a mark is not one), and ``dry_s``, how long it was dry.
Playout starts when a talkspurt's first message arrives, with no jitter buffer:
a server that keeps no lead has a gap whenever a message is late at all.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from array import array
from dataclasses import dataclass, field

import websockets

from bridge.streams.carrier import TwilioCarrier

from .rtp import noise_payload

# the daemon writes compact JSON; Pipecat writes json.dumps' default (a space after ':')
_MEDIA_PREFIX = ('{"event":"media"', '{"event": "media"')
_MARK_PREFIX = ('{"event":"mark"', '{"event": "mark"')
_CLEAR_PREFIX = ('{"event":"clear"', '{"event": "clear"')
_PAYLOAD_KEY = '"payload":'
_SERIAL = itertools.count(1)  # stream and call sids unique in the process (CDR lines by call)


@dataclass
class WsCall:
    index: int
    ws: websockets.ClientConnection
    stream_sid: str
    seq: int = 1
    """The last ``sequenceNumber`` sent (``start`` is 1; ``connected`` has none)."""
    chunk: int = 0
    t0: float = 0.0
    played_until: float = 0.0
    arrival_ns: array[int] = field(default_factory=lambda: array("q"))
    first_media_s: list[float] = field(default_factory=list)
    sizes: array[int] = field(default_factory=lambda: array("i"))
    """Payload bytes of each recorded ``media`` (``sized_media`` only)."""
    clears_ns: array[int] = field(default_factory=lambda: array("q"))
    gaps: int = 0
    dry_s: float = 0.0
    """How long the buffer was dry in those gaps, in total."""
    marked: bool = False
    """A ``mark`` came after the last ``media`` (the turn ended: not an underrun)."""
    closed: bool = False


def payload_bytes(msg: str) -> int:
    """Decoded size of a ``media`` message's base64 payload (0 if it has none)."""
    i = msg.find(_PAYLOAD_KEY)
    if i < 0:
        return 0
    i = msg.find('"', i + len(_PAYLOAD_KEY)) + 1
    j = msg.find('"', i)
    if i <= 0 or j < 0:
        return 0
    return (j - i) * 3 // 4 - msg[max(i, j - 2) : j].count("=")


class TwilioLoad:
    """Opens media streams on the daemon's ``/twilio`` and runs them."""

    def __init__(self, port: int, route: str = "talk", sized_media: bool = False) -> None:
        self.url = f"ws://127.0.0.1:{port}/twilio"
        self.route = route
        self.sized_media = sized_media
        self.calls: list[WsCall] = []
        self.recording = False
        self.payload_b64 = base64.b64encode(noise_payload()).decode()
        self._tasks: list[asyncio.Task[None]] = []
        self._sender: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        self.failed: list[str] = []
        """Why each call that could not be placed was not (its socket or handshake failed):
        the step then fails the bar as unanswered, and the bench goes on."""

    async def place(self, n: int, rate_per_s: float = 200.0) -> None:
        for _ in range(n):
            i = next(_SERIAL)
            sid = f"MZ{i:032d}"
            carrier = TwilioCarrier(
                stream_sid=sid, call_sid=f"CA{i:032d}", custom_parameters={"route": self.route}
            )
            try:
                ws = await websockets.connect(self.url, compression=None, max_size=None)
            except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                now = self.loop.time()
                carrier.connect(now)
                call = WsCall(i, ws, sid, t0=now)
                for text in carrier.frames_to_send(now):
                    await ws.send(text)
                self.calls.append(call)
                self._tasks.append(self.loop.create_task(self._receive(call)))
                if self._sender is None:
                    self._sender = self.loop.create_task(self._send_loop())
            await asyncio.sleep(1.0 / rate_per_s)

    async def _receive(self, call: WsCall) -> None:
        ws = call.ws
        try:
            async for msg in ws:
                if not isinstance(msg, str):
                    continue
                if msg.startswith(_MEDIA_PREFIX):
                    t_ns = time.monotonic_ns()
                    t = t_ns / 1e9
                    if call.played_until < t:
                        call.first_media_s.append(t)  # a talkspurt starts on an idle buffer
                        if self.recording and call.played_until and not call.marked:
                            call.gaps += 1
                            call.dry_s += t - call.played_until
                        call.played_until = t
                    call.marked = False
                    if self.sized_media:
                        size = payload_bytes(msg)
                        call.played_until += size / 8000
                        if self.recording:
                            call.sizes.append(size)
                    else:
                        call.played_until += 0.02
                    if self.recording:
                        call.arrival_ns.append(t_ns)
                elif msg.startswith(_CLEAR_PREFIX):
                    t_ns = time.monotonic_ns()
                    call.played_until = t_ns / 1e9  # the buffer is flushed
                    call.marked = True  # what follows a clear is a new turn, not an underrun
                    if self.recording:
                        call.clears_ns.append(t_ns)
                elif msg.startswith(_MARK_PREFIX):
                    call.marked = True
                    name = json.loads(msg)["mark"]["name"]
                    delay = max(0.0, call.played_until - time.monotonic())
                    self.loop.call_later(delay, self._echo, call, name)
        except websockets.ConnectionClosed:
            pass
        call.closed = True

    def _echo(self, call: WsCall, name: str) -> None:
        if call.closed:
            return
        call.seq += 1
        text = (
            f'{{"event":"mark","sequenceNumber":"{call.seq}","streamSid":"{call.stream_sid}",'
            f'"mark":{{"name":{json.dumps(name)}}}}}'
        )
        self.loop.create_task(self._send(call, text))

    async def _send(self, call: WsCall, text: str) -> None:
        try:
            await call.ws.send(text)
        except websockets.ConnectionClosed:
            call.closed = True

    async def _send_loop(self) -> None:
        origin = self.loop.time()
        slot = 0
        while True:
            slot += 1
            await asyncio.sleep(max(0.0, origin + slot * 0.001 - self.loop.time()))
            for call in self.calls[slot % 20 :: 20]:
                if call.closed:
                    continue
                call.seq += 1
                call.chunk += 1
                ts_ms = round((self.loop.time() - call.t0) * 1000)
                text = (
                    f'{{"event":"media","sequenceNumber":"{call.seq}","media":{{"track":"inbound",'
                    f'"chunk":"{call.chunk}","timestamp":"{ts_ms}","payload":"{self.payload_b64}"}},'
                    f'"streamSid":"{call.stream_sid}"}}'
                )
                try:
                    await call.ws.send(text)
                except websockets.ConnectionClosed:
                    call.closed = True

    def active(self) -> int:
        return sum(1 for c in self.calls if not c.closed)

    async def hangup_all(self, settle_s: float = 1.0) -> None:
        for call in self.calls:
            if call.closed:
                continue
            call.seq += 1
            stop = {
                "event": "stop",
                "sequenceNumber": str(call.seq),
                "stop": {"accountSid": "AC", "callSid": f"CA{call.index:032d}"},
                "streamSid": call.stream_sid,
            }
            try:
                await call.ws.send(json.dumps(stop))
                await call.ws.close()
            except websockets.ConnectionClosed:
                pass
            call.closed = True
        await asyncio.sleep(settle_s)

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(
            *self._tasks, *([self._sender] if self._sender else []), return_exceptions=True
        )
        self.calls.clear()
        self._tasks.clear()
        self._sender = None

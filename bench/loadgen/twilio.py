"""Many Twilio media streams from one process: a lean carrier per WebSocket.

What Twilio does, trimmed to what a load test needs (the full emulator,
``bridge.streams.carrier.TwilioCarrier``, parses and buffers every message,
which costs more CPU than the daemon under test): ``connected`` + ``start``
from ``TwilioCarrier``; then one inbound ``media`` message per call every
20 ms (quiet noise; calls spread over 20 one-millisecond phases); outbound
``media`` is only timestamped on arrival (``time.monotonic_ns()``), and each
``mark`` is echoed when the audio sent before it has played at real time
(the daemon's turns end on the final mark's echo).
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

_MEDIA_PREFIX = '{"event":"media"'
_MARK_PREFIX = '{"event":"mark"'
_SERIAL = itertools.count(1)  # stream and call sids unique in the process (CDR lines by call)


@dataclass
class WsCall:
    index: int
    ws: websockets.ClientConnection
    stream_sid: str
    seq: int = 2
    chunk: int = 0
    t0: float = 0.0
    played_until: float = 0.0
    arrival_ns: array[int] = field(default_factory=lambda: array("q"))
    first_media_s: list[float] = field(default_factory=list)
    closed: bool = False


class TwilioLoad:
    """Opens media streams on the daemon's ``/twilio`` and runs them."""

    def __init__(self, port: int, route: str = "talk") -> None:
        self.url = f"ws://127.0.0.1:{port}/twilio"
        self.route = route
        self.calls: list[WsCall] = []
        self.recording = False
        self.payload_b64 = base64.b64encode(noise_payload()).decode()
        self._tasks: list[asyncio.Task[None]] = []
        self._sender: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()

    async def place(self, n: int, rate_per_s: float = 200.0) -> None:
        for _ in range(n):
            i = next(_SERIAL)
            sid = f"MZ{i:032d}"
            carrier = TwilioCarrier(
                stream_sid=sid, call_sid=f"CA{i:032d}", custom_parameters={"route": self.route}
            )
            ws = await websockets.connect(self.url, compression=None, max_size=None)
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
                        call.played_until = t
                    call.played_until += 0.02
                    if self.recording:
                        call.arrival_ns.append(t_ns)
                elif msg.startswith(_MARK_PREFIX):
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

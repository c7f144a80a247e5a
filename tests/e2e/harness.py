"""Run the real daemon in-process against the real ttsd, and drive it as a carrier would."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import websockets

from bridge.config import Config, parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import TtsServer, start_tts_server
from bridge.streams.carrier import TwilioCarrier
from telcodec import g711

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free now, for a peer that must be told its port up front (it may be taken
    again before the peer binds: start the peer again on "address in use")."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_sip_port() -> int:
    """A port free a moment ago for both UDP and TCP, for a SIP peer that must be told its
    port up front (the daemon's own SIP listener binds port 0: ``bound_sip_port``)."""
    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free for both UDP and TCP")


def _rtp_window() -> str:
    """A random 200-port RTP range, so parallel test runs do not share ports."""
    import random

    base = random.randrange(30000, 39800, 200)
    return f"{base}-{base + 199}"


def config_text(tts_port: int, extra: str = "", protocol: str = "kova", **kw: str) -> str:
    path = {
        "kova": "/v1/ws/kova",
        "kugelaudio": "/ws/tts/stream",
        "coda": "/ws",
        "kletso": "/v1/realtime",
    }.get(protocol, "/v1/ws/kova")
    url = f"ws://127.0.0.1:{tts_port}{path}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{tts_port}"
    return f"""
[daemon]
log_format = "json"
event_loop = "asyncio"
drain_timeout_s = 2

[sip]
listen = ["{kw.get("sip_host", "127.0.0.1")}:{kw.get("sip", 0)}"]
rtp_ports = "{kw.get("rtp", _rtp_window())}"
{kw.get("sip_extra", "")}

[media_streams]
listen = "127.0.0.1:{kw.get("ms", 0)}"
{kw.get("ms_extra", "")}

[api]
listen = "127.0.0.1:{kw.get("api", 0)}"
{kw.get("api_extra", "")}

[providers.main]
protocol = "{protocol}"
url = "{url}"
api_key = "k"
voice = "tone"
{kw.get("provider_extra", "")}

{extra}
"""


def app_route(url: str, extra: str = "") -> str:
    """A catch-all route whose calls are driven by the application at ``url``."""
    return f"""
[[routes]]
match = "*"
provider = "main"
app = "{url}"
{extra}
"""


@dataclass
class Stack:
    tts: TtsServer
    daemon: Daemon
    config: Config

    @property
    def ms_port(self) -> int:
        """The media-stream listener's port (bound to port 0: no race with other tests)."""
        leg = next(leg for leg in self.daemon.legs if leg.name == "media_streams")
        return int(leg.port)  # type: ignore[attr-defined]

    @property
    def sip_port(self) -> int:
        """The SIP listener's port (the first ``[sip] listen`` address, as bound: port 0
        binds any free one)."""
        return bound_sip_port(self.daemon)

    @property
    def api_port(self) -> int:
        assert self.daemon.api is not None
        return self.daemon.api.port


async def api_post(
    port: int, path: str, body: dict[str, object] | None = None
) -> tuple[int, dict[str, object]]:
    """One HTTP/1.1 POST to the daemon's API on loopback, without blocking the loop the
    daemon runs on: (status, JSON body). ``body`` None sends no body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = b"" if body is None else json.dumps(body).encode()
    kind = "" if body is None else "Content-Type: application/json\r\n"
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{kind}Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    raw = await asyncio.wait_for(reader.read(), 30 * FACTOR)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest)


def bound_sip_port(daemon: Daemon) -> int:
    """The port a started daemon's first ``[sip] listen`` address bound (port 0: any free one)."""
    leg = next(leg for leg in daemon.legs if leg.name == "sip")
    return int(leg.runners[0].ua.settings.local_port)  # type: ignore[attr-defined]


@asynccontextmanager
async def stack(routes: str, protocol: str = "kova", **kw: str) -> AsyncIterator[Stack]:
    """The daemon and its ttsd. Every listener binds port 0 unless the test names a port
    (``sip=...``); ``Stack.sip_port``, ``ms_port`` and ``api_port`` say what they bound."""
    tts = await start_tts_server(engine="tone")
    try:
        cfg = parse_config(config_text(tts.port, routes, protocol, **kw), "test.toml")
        daemon = Daemon(cfg)
        try:
            await daemon.start()
        except BaseException:
            await daemon.close()
            raise
    except BaseException:
        await tts.close()
        raise
    try:
        yield Stack(tts, daemon, cfg)
    finally:
        await daemon.drain_and_stop()
        await daemon.close()
        await tts.close()


def speech_mulaw(seconds: float, level: float = 8000.0) -> bytes:
    """A voiced, speech-like signal (harmonics with a moving pitch) that webrtcvad accepts."""
    t = np.arange(int(8000 * seconds)) / 8000
    f0 = 140 + 30 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 8000
    wave = sum(np.sin(k * phase) / k for k in range(1, 8))
    pcm = (wave / np.max(np.abs(wave)) * level).astype("<i2").tobytes()
    return g711.ulaw_encode(pcm)


class TwilioCall:
    """A real WebSocket to the daemon's /twilio, driven by the sans-I/O carrier emulator."""

    def __init__(self, port: int, custom: dict[str, str] | None = None) -> None:
        self.port = port
        self.carrier = TwilioCarrier(custom_parameters=custom or {})
        self.loop = asyncio.get_running_loop()
        self.ws: websockets.ClientConnection | None = None
        self.closed = asyncio.Event()
        self.speech: bytes = b""
        self.speech_at: float | None = None
        self.dtmf: list[tuple[float, str]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> TwilioCall:
        self.ws = await websockets.connect(f"ws://127.0.0.1:{self.port}/twilio")
        self.t0 = self.loop.time()
        self.carrier.connect(self.t0)
        self._tasks = [
            self.loop.create_task(self._sender()),
            self.loop.create_task(self._receiver()),
        ]
        return self

    def now(self) -> float:
        return self.loop.time()

    async def _flush(self) -> None:
        assert self.ws is not None
        for text in self.carrier.frames_to_send(self.now()):
            await self.ws.send(text)

    async def _sender(self) -> None:
        """Caller audio every 20 ms (silence, or the speech queued with speak_at)."""
        n = 0
        while True:
            now = self.now()
            elapsed = now - self.t0
            frame = b"\xff" * 160
            if self.speech_at is not None and elapsed >= self.speech_at:
                offset = int((elapsed - self.speech_at) * 8000) // 160 * 160
                if offset < len(self.speech):
                    frame = self.speech[offset : offset + 160].ljust(160, b"\xff")
            for at, digit in list(self.dtmf):
                if elapsed >= at:
                    self.carrier.send_dtmf(digit, now)
                    self.dtmf.remove((at, digit))
            self.carrier.send_audio(frame, now)
            await self._flush()
            n += 1
            await asyncio.sleep(max(0.0, self.t0 + n * 0.02 - self.now()))

    async def _receiver(self) -> None:
        assert self.ws is not None
        try:
            async for msg in self.ws:
                self.carrier.receive(str(msg), self.now())
                await self._flush()
        except websockets.ConnectionClosed:
            pass
        self.closed.set()

    def speak_at(self, at_s: float, audio: bytes) -> None:
        self.speech, self.speech_at = audio, at_s

    def press_at(self, at_s: float, digit: str) -> None:
        self.dtmf.append((at_s, digit))

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks = []  # a task's coroutine holds this object: no cycle left behind
        if self.ws is not None:
            self.carrier.send_stop(self.now())
            for text in self.carrier.frames_to_send(self.now()):
                try:
                    await self.ws.send(text)
                except websockets.ConnectionClosed:
                    break
            await self.ws.close()


class AppServer:
    """An application server: the daemon dials it per call (route ``app = ws://...``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []
        self.conns: list[websockets.ServerConnection] = []
        self.on_started: list[dict[str, object]] = []
        self.close_after_start = False
        self.server: websockets.Server | None = None
        self.changed = asyncio.Event()

    async def __aenter__(self) -> AppServer:
        self.server = await websockets.serve(self._handler, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = next(iter(self.server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/app"

    async def _handler(self, ws: websockets.ServerConnection) -> None:
        import json

        self.conns.append(ws)
        async for msg in ws:
            event = json.loads(msg)
            self.events.append(event)
            self.changed.set()
            if event.get("type") == "call.started":
                if self.close_after_start:
                    await ws.close()
                    return
                for cmd in self.on_started:
                    await ws.send(json.dumps(cmd))

    async def send(self, cmd: dict[str, object]) -> None:
        import json

        await self.conns[-1].send(json.dumps(cmd))

    def of(self, kind: str) -> list[dict[str, object]]:
        return [e for e in self.events if e.get("type") == kind]

    async def wait_for(
        self, kind: str, timeout_s: float = 10.0, count: int = 1
    ) -> dict[str, object]:
        async def until() -> None:
            while len(self.of(kind)) < count:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), timeout_s * FACTOR)
        return self.of(kind)[count - 1]


def tone_turn_ms(text: str) -> int:
    """How long the tone engine's audio for ``text`` is, in ms (words + gaps)."""
    from bridge.ttsd.synth import TONE_GAP_S, ToneEngine, split_words

    engine = ToneEngine(8000)
    return round(1000 * sum(engine.word_duration_s(w) + TONE_GAP_S for w in split_words(text)))

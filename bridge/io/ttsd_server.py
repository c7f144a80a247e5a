"""``callbridge tts-server``: every provider protocol on one port, over a synthesis engine.

The shell around the sans-I/O server sessions of ``bridge/ttsd/<protocol>.py``:
it accepts WebSockets, routes them by path to a session of the right
protocol, moves messages in and actions out, runs ``Synthesize`` jobs on the
engine (``tone`` inline, ``piper`` on one worker thread so two sessions do not
fight over two cores), and serves zwst's session route (``POST``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bridge.config import split_hostport
from bridge.engine import CloseConnection, SendBytes, SendText
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, WsConnection, serve_http_ws
from bridge.logs import configure, get_logger
from bridge.ttsd.base import CancelSynthesis, ServerOptions, ServerSession, Synthesize
from bridge.ttsd.synth import SynthChunk, SynthEngine, ToneEngine, render

__all__ = ["PROTOCOL_MODULES", "TtsServer", "run_tts_server", "start_tts_server"]

log = get_logger("callbridge.ttsd")

PROTOCOL_MODULES = ("kova", "kugelaudio", "kletso", "coda", "zwst")


def _load_protocols() -> dict[str, ModuleType]:
    mods: dict[str, ModuleType] = {}
    for name in PROTOCOL_MODULES:
        try:
            mods[name] = importlib.import_module(f"bridge.ttsd.{name}")
        except ImportError as e:  # a protocol missing from this build is reported, not fatal
            log.warning("ttsd.protocol_unavailable", protocol=name, error=str(e))
    return mods


def make_engine(name: str) -> SynthEngine:
    if name == "tone":
        return ToneEngine()
    from bridge.ttsd.piper_engine import PiperEngine

    return PiperEngine()


@dataclass
class TtsServer:
    """A running TTS server (what tests and the daemon's supervisor hold)."""

    http: HttpWsServer
    engine: SynthEngine
    paths: dict[str, str]

    @property
    def port(self) -> int:
        return self.http.port

    def url(self, protocol: str) -> str:
        for path, proto in self.paths.items():
            if proto == protocol:
                return f"ws://127.0.0.1:{self.port}{path}"
        raise KeyError(protocol)

    async def close(self) -> None:
        await self.http.close()


class _SessionRunner:
    """Pumps one server session: messages in, actions out, synthesis jobs, one timer."""

    def __init__(
        self,
        conn: WsConnection,
        session: ServerSession,
        engine: SynthEngine,
        pool: concurrent.futures.Executor | None,
    ) -> None:
        self.conn = conn
        self.session = session
        self.engine = engine
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.backlog: Callable[[int, float], None] | None = getattr(
            session, "transport_backlog", None
        )
        """The session's own slow-reader rule, fed the send backlog; None: jobs wait instead."""

    def now(self) -> float:
        return self.loop.time()

    def pump(self) -> None:
        for action in self.session.actions_to_send():
            if isinstance(action, SendText):
                self.conn.send_text_nowait(action.text)
            elif isinstance(action, SendBytes):
                self.conn.send_bytes_nowait(action.data)
            elif isinstance(action, CloseConnection):
                self.closing = True
                self.loop.create_task(self.conn.close(action.code, action.reason))
            elif isinstance(action, Synthesize):
                self.jobs[action.job_id] = self.loop.create_task(self._run_job(action))
            elif isinstance(action, CancelSynthesis):
                task = self.jobs.pop(action.job_id, None)
                if task is not None:
                    task.cancel()
        backlog = self.backlog
        if backlog is not None:
            backlog(self.conn.write_buffer_bytes, self.now())
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        deadline = self.session.next_deadline()
        if deadline is not None and not self.closing:
            self.timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.session.handle_timer(self.now())
        self.pump()

    async def _next_chunk(self, it: Iterator[SynthChunk]) -> SynthChunk | None:
        if self.pool is None:
            return next(it, None)
        return await self.loop.run_in_executor(self.pool, next, it, None)

    async def _run_job(self, job: Synthesize) -> None:
        it = render(self.engine, job)
        try:
            while (chunk := await self._next_chunk(it)) is not None:
                self.session.synthesis_audio(job.job_id, chunk.pcm, chunk.words, self.now())
                self.pump()
                # Make no more while the client is not reading what is sent: its audio
                # waits in its socket, not in our write buffer (which would grow without
                # bound, and where a new context's first audio would queue behind every
                # other context's). Jobs blocked here resume together, a chunk each.
                # A protocol with its own rule for a slow reader (zwst: drop, then 1008)
                # sees its backlog instead (``transport_backlog``, in ``pump``).
                if self.backlog is None:
                    await self.conn.drain()
                await asyncio.sleep(0)  # let other sessions and readers run between chunks
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine failed: the session reports it in its protocol
            log.exception("ttsd.synthesis_failed", job_id=job.job_id)
            self.session.synthesis_failed(job.job_id, str(e), self.now())
        else:
            self.session.synthesis_done(job.job_id, self.now())
        finally:
            self.jobs.pop(job.job_id, None)
        self.pump()

    async def run(self) -> None:
        req = self.conn.request
        self.session.connection_made(req.path, req.query, req.headers, self.now())
        self.pump()
        try:
            async for msg in self.conn:
                if isinstance(msg, str):
                    self.session.receive_text(msg, self.now())
                else:
                    self.session.receive_bytes(msg, self.now())
                self.pump()
        finally:
            for task in self.jobs.values():
                task.cancel()
            if self.timer is not None:
                self.timer.cancel()
            self.session.connection_lost(self.now())
            with contextlib.suppress(Exception):
                self.pump()


async def start_tts_server(
    host: str = "127.0.0.1",
    port: int = 0,
    engine: SynthEngine | str = "tone",
    options: ServerOptions | None = None,
) -> TtsServer:
    """Start serving every available protocol; returns once listening."""
    synth = make_engine(engine) if isinstance(engine, str) else engine
    opts = options or ServerOptions()
    pool = concurrent.futures.ThreadPoolExecutor(1, "piper") if synth.name == "piper" else None
    mods = _load_protocols()
    by_path: dict[str, str] = {}
    for name, mod in mods.items():
        for path in getattr(mod, "PATHS", ()):
            by_path[path] = name

    def subprotocols(request: HttpRequest) -> tuple[str, ...]:
        name = by_path.get(request.path)
        return tuple(getattr(mods[name], "SUBPROTOCOLS", ())) if name else ()

    session_routes = {
        mod.SESSION_ROUTE: mod for mod in mods.values() if hasattr(mod, "SESSION_ROUTE")
    }

    async def http(request: HttpRequest) -> HttpResponse:
        mod = session_routes.get(request.path)
        if mod is not None and request.method == "POST":
            host_hdr = request.headers.get("host", f"127.0.0.1:{server.port}")
            status, body = mod.handle_session_request(
                request.body,
                opts,
                f"ws://{host_hdr}",
                headers=request.headers,
                now=asyncio.get_running_loop().time(),
            )
            return HttpResponse.json(status, body)
        if request.path == "/healthz":
            return HttpResponse.json(200, json.dumps({"engine": synth.name}).encode())
        return HttpResponse.text(404, "not found")

    async def ws(request: HttpRequest) -> Any:
        name = by_path.get(request.path)
        if name is None:
            return HttpResponse.text(404, f"no protocol at {request.path}")

        async def handler(conn: WsConnection) -> None:
            session: ServerSession = mods[name].SESSION(opts)
            await _SessionRunner(conn, session, synth, pool).run()

        return handler

    http_server = await serve_http_ws(
        host, port, http=http, ws=ws, subprotocols=subprotocols, max_message_bytes=1 << 20
    )
    server = TtsServer(http_server, synth, by_path)
    log.info("ttsd.listening", port=server.port, engine=synth.name, paths=sorted(by_path))
    return server


class _UntilEof(asyncio.Protocol):
    """Sets ``stop`` when the pipe it reads closes (its writer has gone, however it went)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop.set()


def run_tts_server(
    listen: str,
    engine: str,
    api_keys: tuple[str, ...] = (),
    port_file: str | None = None,
    exit_with_stdin: bool = False,
) -> int:
    """The ``callbridge tts-server`` command: serve until SIGTERM/SIGINT.

    ``exit_with_stdin``: also stop when standard input reaches its end. The
    daemon starts its embedded server with a pipe there and keeps the other
    end: if the daemon dies, even by SIGKILL, the pipe closes and its child
    stops instead of living on as an orphan holding the port.
    """
    configure("info", "auto")
    host, port = split_hostport(listen)

    async def main() -> None:
        opts = ServerOptions(api_keys=frozenset(api_keys))
        server = await start_tts_server(host, port, engine, opts)
        if port_file:
            Path(port_file).write_text(f"{server.port}\n")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if exit_with_stdin:
            await loop.connect_read_pipe(lambda: _UntilEof(stop), sys.stdin)
        await stop.wait()
        await server.close()

    asyncio.run(main())
    return 0

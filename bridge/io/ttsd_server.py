"""``callbridge tts-server``: every provider protocol on one port, over a synthesis engine.

The shell around the sans-I/O server sessions of ``bridge/providers/<protocol>/server.py``:
it accepts WebSockets, routes them by path to a session of the right
protocol, moves messages in and actions out, runs ``Synthesize`` jobs on the
engine, and serves zwst's session route (``POST``).

Synthesis capacity (``SynthLimits``): the ``tone`` engine runs inline (it
costs next to nothing); any other engine (``piper``) runs on ``workers``
threads. A job renders a chunk (a clause) at a time, and the threads serve
the chunks of every job in progress first come, first served, so the jobs
take turns: a call's next sentence never waits for another call's whole
text. At most ``workers + queue`` jobs are in progress; one more is refused
at once, and so is a job whose first chunk no thread has begun within
``max_wait_s``, with the protocol's own error frame
(``ServerSession.synthesis_refused``): the client fails over in milliseconds
instead of waiting for its own timeout. Threads, not processes: onnxruntime
releases the GIL inside ``session.run``, which is 99 % of a Piper
rendering's CPU time (measured with ``time.thread_time`` around it: 5.21 of
5.26 s), Piper's phonemizer has its own lock, and each run uses one
intra-op thread (``PiperEngine``), so N workers keep N cores busy without
oversubscribing them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from bridge.config import split_hostport
from bridge.engine import CloseConnection, SendBytes, SendText
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, WsConnection, serve_http_ws
from bridge.logs import configure, get_logger
from bridge.providers import registry
from bridge.providers.server_base import CancelSynthesis, ServerOptions, ServerSession, Synthesize
from bridge.ttsd.synth import SynthChunk, SynthEngine, ToneEngine, render

__all__ = [
    "PROTOCOL_MODULES",
    "SynthLimits",
    "TtsServer",
    "default_workers",
    "lower_priority",
    "pin_cpus",
    "run_tts_server",
    "start_tts_server",
]

log = get_logger("callbridge.ttsd")

PROTOCOL_MODULES = registry.PROTOCOLS


def _load_protocols() -> dict[str, ModuleType]:
    mods: dict[str, ModuleType] = {}
    for name in PROTOCOL_MODULES:
        try:
            mods[name] = registry.server_module(name)
        except ImportError as e:  # a protocol missing from this build is reported, not fatal
            log.warning("ttsd.protocol_unavailable", protocol=name, error=str(e))
    return mods


def make_engine(name: str) -> SynthEngine:
    if name == "tone":
        return ToneEngine()
    from bridge.ttsd.piper_engine import PiperEngine

    return PiperEngine()


def default_workers() -> int:
    """Synthesis workers by default: the cores this process may run on, less one (>= 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


@dataclass(frozen=True, slots=True)
class SynthLimits:
    """How much synthesis the server takes on (engines that run on workers)."""

    workers: int = field(default_factory=default_workers)
    """Threads rendering at once (one chunk of one job each)."""
    queue: int = 1
    """Jobs in progress beyond one per worker; one more is refused at once."""
    max_wait_s: float = 1.0
    """A job whose first chunk has not started this long after it asked is refused."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.queue < 0:
            raise ValueError(f"queue must be 0 or more, got {self.queue}")
        if not self.max_wait_s > 0:
            raise ValueError(f"max_wait_s must be more than 0, got {self.max_wait_s}")

    @property
    def max_jobs(self) -> int:
        return self.workers + self.queue


class _Expired:
    """What ``_Workers.first_chunk`` returns when the job's first chunk did not start in time."""


_EXPIRED = _Expired()


class _Workers:
    """The synthesis workers: ``workers`` threads, at most ``max_jobs`` jobs in progress.

    Every job asks for one chunk at a time; the thread pool serves the asks in
    the order they came (first in, first out), so jobs in progress take turns a
    chunk (a clause) each rather than one job's whole text holding a worker
    while another turn's next sentence waits behind it.
    """

    def __init__(self, limits: SynthLimits) -> None:
        self.limits = limits
        self.pool = concurrent.futures.ThreadPoolExecutor(limits.workers, "synth")
        self.jobs = 0
        self.refused = 0

    def admit(self) -> str | None:
        """Take a job on (None), or say why not: every place is taken."""
        if self.jobs >= self.limits.max_jobs:
            self.refused += 1
            return f"server busy: {self.jobs} renderings in progress"
        self.jobs += 1
        return None

    def release(self) -> None:
        self.jobs -= 1

    async def first_chunk(self, it: Iterator[SynthChunk]) -> SynthChunk | _Expired | None:
        """The job's first chunk, or ``_EXPIRED`` if no worker began it within ``max_wait_s``."""
        loop = asyncio.get_running_loop()
        ask = self.pool.submit(next, it, None)
        expired: list[bool] = []
        # Future.cancel() succeeds only while the ask waits for a thread
        timer = loop.call_later(self.limits.max_wait_s, lambda: expired.append(ask.cancel()))
        try:
            return await asyncio.wrap_future(ask)
        except asyncio.CancelledError:
            if any(expired):
                self.refused += 1
                return _EXPIRED
            raise
        finally:
            timer.cancel()

    async def next_chunk(self, it: Iterator[SynthChunk]) -> SynthChunk | None:
        return await asyncio.get_running_loop().run_in_executor(self.pool, next, it, None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class TtsServer:
    """A running TTS server (what tests and the daemon's supervisor hold)."""

    http: HttpWsServer
    engine: SynthEngine
    paths: dict[str, str]
    workers: _Workers | None = None
    """The synthesis workers (None: the engine runs inline)."""

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
        if self.workers is not None:
            self.workers.close()


class _SessionRunner:
    """Pumps one server session: messages in, actions out, synthesis jobs, one timer."""

    def __init__(
        self,
        conn: WsConnection,
        session: ServerSession,
        engine: SynthEngine,
        workers: _Workers | None,
    ) -> None:
        self.conn = conn
        self.session = session
        self.engine = engine
        self.workers = workers
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
        if self.workers is None:
            return next(it, None)
        return await self.workers.next_chunk(it)

    def _refuse(self, job: Synthesize, reason: str) -> None:
        log.warning("ttsd.synthesis_refused", job_id=job.job_id, reason=reason)
        self.jobs.pop(job.job_id, None)
        self.session.synthesis_refused(job.job_id, reason, self.now())
        self.pump()

    async def _run_job(self, job: Synthesize) -> None:
        workers = self.workers
        if workers is not None and (refused := workers.admit()) is not None:
            self._refuse(job, refused)
            return
        it = render(self.engine, job)
        try:
            if workers is None:
                chunk = next(it, None)
            else:
                first = await workers.first_chunk(it)
                if isinstance(first, _Expired):
                    wait_s = workers.limits.max_wait_s
                    self._refuse(job, f"server busy: no synthesis worker free within {wait_s:g} s")
                    return
                chunk = first
            while chunk is not None:
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
                chunk = await self._next_chunk(it)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine failed: the session reports it in its protocol
            log.exception("ttsd.synthesis_failed", job_id=job.job_id)
            self.session.synthesis_failed(job.job_id, str(e), self.now())
        else:
            self.session.synthesis_done(job.job_id, self.now())
        finally:
            self.jobs.pop(job.job_id, None)
            if workers is not None:
                workers.release()
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
    limits: SynthLimits | None = None,
    unix_path: str = "",
) -> TtsServer:
    """Start serving every available protocol; returns once listening (on ``unix_path``,
    a Unix socket, if given: the daemon's embedded server).

    ``limits`` applies to an engine that runs on workers (any but ``tone``,
    whose jobs run inline).
    """
    synth = make_engine(engine) if isinstance(engine, str) else engine
    opts = options or ServerOptions()
    workers = None if getattr(synth, "inline", False) else _Workers(limits or SynthLimits())
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
            health: dict[str, object] = {"engine": synth.name}
            if workers is not None:  # what the synthesis workers carry, and refused
                health |= {
                    "workers": workers.limits.workers,
                    "max_jobs": workers.limits.max_jobs,
                    "jobs": workers.jobs,
                    "refused": workers.refused,
                }
            return HttpResponse.json(200, json.dumps(health).encode())
        return HttpResponse.text(404, "not found")

    async def ws(request: HttpRequest) -> Any:
        name = by_path.get(request.path)
        if name is None:
            return HttpResponse.text(404, f"no protocol at {request.path}")

        async def handler(conn: WsConnection) -> None:
            session: ServerSession = mods[name].SESSION(opts)
            await _SessionRunner(conn, session, synth, workers).run()

        return handler

    http_server = await serve_http_ws(
        host,
        port,
        http=http,
        ws=ws,
        subprotocols=subprotocols,
        max_message_bytes=1 << 20,
        unix_path=unix_path,
    )
    server = TtsServer(http_server, synth, by_path, workers)
    log.info(
        "ttsd.listening",
        port=server.port,
        unix_socket=unix_path or None,
        engine=synth.name,
        paths=sorted(by_path),
        workers=workers.limits.workers if workers else 0,
        max_jobs=workers.limits.max_jobs if workers else 0,
    )
    return server


class _UntilEof(asyncio.Protocol):
    """Sets ``stop`` when the pipe it reads closes (its writer has gone, however it went)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.ended = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.stop.set()


def lower_priority(steps: int) -> None:
    """Lower the CPU priority of every thread of this process by ``steps`` (nice).

    Linux keeps a nice value per thread and ``os.nice`` changes only the
    caller's; threads already started (numpy's BLAS pool starts at import)
    are lowered one by one, and threads started later (the synthesis workers,
    onnxruntime's) inherit the main thread's.
    """
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        os.nice(steps)
        return
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + steps))


def pin_cpus(cpus: frozenset[int]) -> None:
    """Run every thread of this process (and those it starts later) on ``cpus`` only."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def run_tts_server(
    listen: str,
    engine: str,
    api_keys: tuple[str, ...] = (),
    port_file: str | None = None,
    exit_with_stdin: bool = False,
    limits: SynthLimits | None = None,
    nice: int = 0,
    cpus: frozenset[int] = frozenset(),
    unix_path: str = "",
    remove_socket_dir: bool = False,
) -> int:
    """The ``callbridge tts-server`` command: serve until SIGTERM/SIGINT.

    ``unix_path``: listen on that Unix socket instead of ``listen`` (the daemon's
    embedded server: in a private directory, so no other user can take its place);
    ``port_file`` then gets the path instead of the port. The socket is removed at exit;
    with ``remove_socket_dir``, when the exit is standard input's end (the daemon gone: it
    restarts no child then, and may have died before removing it), its directory too if
    nothing else is in it.

    ``exit_with_stdin``: also stop when standard input reaches its end. The
    daemon starts its embedded server with a pipe there and keeps the other
    end: if the daemon dies, even by SIGKILL, the pipe closes and its child
    stops instead of living on as an orphan holding the port.

    ``nice``: lower this process's CPU priority by that much first (see
    ``lower_priority``); ``cpus``: run on those CPUs only (``pin_cpus``).
    """
    configure("info", "auto")
    if nice > 0:
        lower_priority(nice)
    if cpus:
        pin_cpus(cpus)
    host, port = ("", 0) if unix_path else split_hostport(listen)

    async def main() -> None:
        opts = ServerOptions(api_keys=frozenset(api_keys))
        server = await start_tts_server(host, port, engine, opts, limits, unix_path)
        if port_file:  # written whole, then renamed: a reader never sees it half-written
            tmp = Path(f"{port_file}.tmp")
            tmp.write_text(f"{unix_path or server.port}\n")
            tmp.replace(port_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        stdin = _UntilEof(stop)
        if exit_with_stdin:
            await loop.connect_read_pipe(lambda: stdin, sys.stdin)
        await stop.wait()
        await server.close()
        if unix_path:
            with contextlib.suppress(OSError):
                os.unlink(unix_path)
            if remove_socket_dir and stdin.ended:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(unix_path))

    asyncio.run(main())
    return 0

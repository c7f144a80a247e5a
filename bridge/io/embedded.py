"""The embedded provider: ``callbridge tts-server`` as a supervised child process.

A provider with ``url = "embedded"`` gets its URL, socket and key from here.
One child per synthesis engine (``piper`` or ``tone``) serves every protocol
on one Unix socket, ``<engine>.sock`` in a directory only the daemon's user
may enter (made with mode 0700 in the daemon's ``RuntimeDirectory`` under
systemd, ``$RUNTIME_DIRECTORY``, else in the temp directory; removed at
stop). No other local user can connect to it or take its place while the
child restarts, which a loopback TCP port allowed. A restarted child binds
the same path again (replacing its predecessor's socket file), so the
provider pools simply reconnect. The child is restarted with capped backoff
whenever it dies, and stopped with SIGTERM on shutdown.

The child also requires a secret made at each daemon start on every
connection (as the provider's API key, in each protocol's own way), passed to
it in its environment, never on its command line. It runs ``nice`` steps
below the daemon's CPU priority (it lowers its own priority as it starts:
``tts-server --nice``), so a burst of synthesis never delays the daemon's
frames; its synthesis workers, queue and wait bound, and the CPUs it may run
on, are the ``[daemon] embedded_tts_*`` keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from bridge.logs import get_logger

__all__ = ["KEY_ENV", "PROTOCOL_PATHS", "EmbeddedTts"]

log = get_logger("callbridge.embedded")

# Where ttsd serves each protocol (the seeds' paths; Kova names none).
PROTOCOL_PATHS = {
    "kova": "/v1/ws/kova",
    "kugelaudio": "/ws/tts/stream",
    "kletso": "/v1/realtime",
    "coda": "/ws",
    "zwst": "/v1/stream",
}
KEY_ENV = "CALLBRIDGE_TTS_SERVER_KEY"
"""The child's environment variable holding the key it requires."""
UNIX_PATH_MAX = 107
"""The longest Unix socket path Linux binds (``sun_path`` less its terminating NUL)."""


def private_dir() -> Path:
    """A new directory only this user may enter (0700): in systemd's ``RuntimeDirectory``
    (``$RUNTIME_DIRECTORY``, its first entry) when there is one, else in the temp directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(tempfile.mkdtemp(prefix="tts-", dir=runtime or None))


class EmbeddedTts:
    """One supervised ``callbridge tts-server`` child."""

    def __init__(
        self,
        engine: str,
        startup_timeout_s: float = 60.0,
        *,
        workers: int = 0,
        queue: int = 1,
        max_wait_s: float = 1.0,
        nice: int = 10,
        cpus: str = "",
    ) -> None:
        self.engine = engine
        self.socket_path = ""
        """The Unix socket the child listens on ("" before ``start``); every restart binds
        it again."""
        self._dir: Path | None = None
        self.api_key = secrets.token_urlsafe(32)
        """What the child requires of every connection (the embedded providers' key)."""
        self.startup_timeout_s = startup_timeout_s
        self.workers = workers
        self.queue = queue
        self.max_wait_s = max_wait_s
        self.nice = nice
        self.cpus = cpus
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    def url(self, protocol: str) -> str:
        """The protocol's URL on the child (reached over ``socket_path``: the host is a
        name for the ``Host`` header only)."""
        if not self.socket_path:
            raise RuntimeError("the embedded TTS server has not started")
        return f"ws://localhost{PROTOCOL_PATHS[protocol]}"

    def command(self, port_file: str) -> list[str]:
        """The child's command line (no secret on it: that is in its environment)."""
        return [
            *(sys.executable, "-m", "bridge.cli", "tts-server"),
            *("--unix-socket", self.socket_path, "--remove-socket-dir", "--engine", self.engine),
            *("--port-file", port_file, "--api-key-env", KEY_ENV),
            *("--workers", str(self.workers), "--queue", str(self.queue)),
            *("--max-wait-s", repr(self.max_wait_s), "--nice", str(self.nice)),
            *(("--cpus", self.cpus) if self.cpus else ()),
            # our end of its stdin pipe closes when this process ends, however it
            # ends (SIGKILL included): the child stops then, never an orphan
            "--exit-with-stdin",
        ]

    def _make_socket_dir(self) -> None:
        if self._dir is None:
            self._dir = private_dir()
            path = str(self._dir / f"{self.engine}.sock")
            if len(os.fsencode(path)) > UNIX_PATH_MAX:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
                raise RuntimeError(
                    f"socket path {path!r} is longer than {UNIX_PATH_MAX} bytes "
                    "(RUNTIME_DIRECTORY or TMPDIR too deep)"
                )
            self.socket_path = path

    async def _spawn(self) -> None:
        self._make_socket_dir()
        with tempfile.TemporaryDirectory() as d:
            port_file = Path(d) / "port"
            self.proc = await asyncio.create_subprocess_exec(
                *self.command(str(port_file)),
                env={**os.environ, "PYTHONUNBUFFERED": "1", KEY_ENV: self.api_key},
                stdin=asyncio.subprocess.PIPE,
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.startup_timeout_s
            while not port_file.exists():
                if self.proc.returncode is not None:
                    raise RuntimeError(f"tts-server exited with {self.proc.returncode}")
                if loop.time() > deadline:
                    raise RuntimeError("tts-server did not start in time")
                await asyncio.sleep(0.05)
        log.info(
            "embedded.started",
            engine=self.engine,
            socket=self.socket_path,
            pid=self.proc.pid,
            nice=self.nice,
            workers=self.workers or "auto",
        )

    async def start(self) -> None:
        """Start the child and return once it listens; then supervise it."""
        await self._spawn()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        delay_s = 0.5
        while not self._stopping:
            assert self.proc is not None
            rc = await self.proc.wait()
            if self._stopping:
                return
            log.error("embedded.died", engine=self.engine, returncode=rc, restart_in_s=delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 30.0)
            try:
                await self._spawn()
                self.restarts += 1
                delay_s = 0.5
            except (RuntimeError, OSError) as e:
                log.error("embedded.restart_failed", engine=self.engine, error=str(e))

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

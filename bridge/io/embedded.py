"""The embedded provider: ``callbridge tts-server`` as a supervised child process.

A provider with ``url = "embedded"`` gets its URL from here. One child per
synthesis engine (``piper`` or ``tone``) serves every protocol on one
loopback port, chosen once so that a restarted child comes back on the same
URL and the provider pools simply reconnect. The child is restarted with
capped backoff whenever it dies, and stopped with SIGTERM on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from bridge.logs import get_logger

__all__ = ["PROTOCOL_PATHS", "EmbeddedTts"]

log = get_logger("callbridge.embedded")

# Where ttsd serves each protocol (the seeds' paths; Kova names none).
PROTOCOL_PATHS = {
    "kova": "/v1/ws/kova",
    "kugelaudio": "/ws/tts/stream",
    "kletso": "/v1/realtime",
    "coda": "/ws",
    "zwst": "/v1/stream",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedTts:
    """One supervised ``callbridge tts-server`` child."""

    def __init__(self, engine: str, startup_timeout_s: float = 60.0) -> None:
        self.engine = engine
        self.port = _free_port()
        self.startup_timeout_s = startup_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    def url(self, protocol: str) -> str:
        return f"ws://127.0.0.1:{self.port}{PROTOCOL_PATHS[protocol]}"

    async def _spawn(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            port_file = Path(d) / "port"
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bridge.cli",
                "tts-server",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--engine",
                self.engine,
                "--port-file",
                str(port_file),
                # our end of its stdin pipe closes when this process ends, however it
                # ends (SIGKILL included): the child stops then, never an orphan
                "--exit-with-stdin",
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
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
        log.info("embedded.started", engine=self.engine, port=self.port, pid=self.proc.pid)

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

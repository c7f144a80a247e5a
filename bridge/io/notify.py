"""sd_notify without libsystemd: one datagram to ``$NOTIFY_SOCKET`` per state change.

The watchdog ping is sent from a task on the event loop itself, and only
when that loop has kept its own heartbeat recently: a loop blocked by a
runaway call cannot ping, so systemd's ``WatchdogSec`` restarts the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

__all__ = ["Notifier"]


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING/RELOADING to systemd (a no-op without it)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        e = os.environ if env is None else env
        self.path = e.get("NOTIFY_SOCKET", "")
        usec = e.get("WATCHDOG_USEC", "")
        pid = e.get("WATCHDOG_PID", "")
        self.watchdog_s = (
            int(usec) / 1e6 if usec.isascii() and usec.isdigit() and int(usec) > 0 else 0.0
        )
        if pid.isascii() and pid.isdigit() and int(pid) != os.getpid():
            self.watchdog_s = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def send(self, *fields: str) -> None:
        if not self.path:
            return
        addr = self.path
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto("\n".join(fields).encode(), addr)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self, status: str = "draining") -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def start_watchdog(self) -> None:
        """Ping at half the watchdog interval, from the loop, while the loop is healthy."""
        if self.watchdog_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watchdog())

    async def _watchdog(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.watchdog_s / 2
        expected = loop.time() + interval
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            # A ping that comes far later than scheduled means the loop was blocked:
            # skip it; if the loop stays blocked no ping goes out and systemd acts.
            if now - expected < self.watchdog_s / 2:
                self.send("WATCHDOG=1")
            expected = now + interval

    def stop_watchdog(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

"""Helpers to run the real daemon as a process with a generated config."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free a moment ago, for a peer that must be told it up front (prefer port 0
    and ``api_port``: a port chosen here may be taken before the daemon binds it)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_config(
    tmp: Path, greeting: str = "Hello.", *, sip_enabled: bool = True, **ports: int
) -> Path:
    """A daemon config; ``api=0``/``media_streams=0`` bind port 0 (read it with
    ``api_port``), ``sip_enabled=False`` leaves the SIP leg out (SIP cannot bind port 0:
    it names its port in every message)."""
    api = ports.get("api")
    api = free_port() if api is None else api
    ms = ports.get("media_streams")
    ms = free_port() if ms is None else ms
    sip = (ports.get("sip") or free_port(socket.SOCK_DGRAM)) if sip_enabled else 0
    text = f"""
[daemon]
drain_timeout_s = {ports.get("drain", 5)}
log_format = "json"
event_loop = "asyncio"

[sip]
enabled = {str(sip_enabled).lower()}
listen = ["127.0.0.1:{sip}"]
rtp_ports = "{ports.get("rtp_lo", 31000)}-{ports.get("rtp_hi", 31999)}"

[media_streams]
listen = "127.0.0.1:{ms}"

[api]
listen = "127.0.0.1:{api}"

[providers.local]
protocol = "kova"
url = "embedded"
engine = "tone"
voice = "tone"

[[routes]]
match = "*"
provider = "local"
greeting = "{greeting}"
"""
    path = tmp / "callbridge.toml"
    path.write_text(text)
    return path


def _listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def api_port(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """The port of the daemon's HTTP API (bound to port 0): the one of its listening ports
    that answers ``/healthz``."""
    deadline = time.monotonic() + timeout_s * FACTOR
    while time.monotonic() < deadline:
        for port in sorted(_listening_tcp_ports(proc.pid)):
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{port}/healthz"
                with urllib.request.urlopen(url, timeout=2 * FACTOR) as r:
                    if r.status == 200 and json.loads(r.read()) == {"ok": True}:
                        return port
        assert proc.poll() is None, f"the daemon exited ({proc.returncode})"
        time.sleep(0.05)
    raise AssertionError("the daemon's API never answered on any port it listens on")


@pytest.fixture
def run_daemon() -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        config: Path, env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """The daemon's output goes to a pipe, or to `log` when the test makes more
        of it than a pipe holds unread (a full pipe would block the daemon)."""
        with contextlib.ExitStack() as files:
            out = files.enter_context(log.open("wb")) if log is not None else subprocess.PIPE
            p = subprocess.Popen(
                [sys.executable, "-m", "bridge.cli", "serve", "--config", str(config)],
                env={**os.environ, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()

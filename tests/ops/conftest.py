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
from dataclasses import dataclass
from pathlib import Path

import pytest

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free a moment ago, only for an external peer that must be told it up front
    (Kamailio, HAProxy, SIPp): start the peer again if it finds the port taken. The
    daemon binds port 0 (``daemon_config``'s default) and ``listeners`` reads it back."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_config(
    tmp: Path, greeting: str = "Hello.", *, sip_enabled: bool = True, **ports: int
) -> Path:
    """A daemon config whose listeners bind port 0 unless a port is given (read the ports
    back with ``listeners``); ``sip_enabled=False`` leaves the SIP leg out."""
    api = ports.get("api", 0)
    ms = ports.get("media_streams", 0)
    sip = ports.get("sip", 0) if sip_enabled else 0
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


def _socket_ports(pid: int, tables: tuple[str, ...], state: str) -> set[int]:
    """The local ports of process ``pid``'s sockets in state ``state`` of the /proc/net
    ``tables`` (its sockets' inodes)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in tables:
        with contextlib.suppress(OSError), open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == state and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on."""
    return _socket_ports(pid, ("tcp", "tcp6"), "0A")  # LISTEN


@dataclass(frozen=True)
class Listeners:
    """The ports a daemon bound (0: that listener is not enabled)."""

    api: int
    sip: int
    media_streams: int


def listeners(
    proc: subprocess.Popen[bytes],
    *,
    sip: bool = True,
    media_streams: bool = True,
    timeout_s: float = 30.0,
) -> Listeners:
    """The ports a daemon started with ``daemon_config`` (port 0) bound, once every listener
    asked for is up: the API answers ``/healthz``, SIP is the port bound for both UDP and
    TCP, media streams the remaining TCP listener. Read from /proc, so the daemon's
    output is left for the test."""
    api = api_port(proc, timeout_s)
    deadline = time.monotonic() + timeout_s * FACTOR
    while True:
        tcp = _listening_tcp_ports(proc.pid) - {api}
        udp = _socket_ports(proc.pid, ("udp", "udp6"), "07")  # unconnected
        sips = (udp & tcp) if sip else set()
        rest = tcp - sips
        if len(sips) == int(sip) and len(rest) == int(media_streams):
            return Listeners(api, min(sips, default=0), min(rest, default=0))
        assert proc.poll() is None, _exited(proc)
        assert time.monotonic() < deadline, f"listeners never all up: tcp {tcp}, udp {udp}"
        time.sleep(0.05)


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
        assert proc.poll() is None, _exited(proc)
        time.sleep(0.05)
    raise AssertionError("the daemon's API never answered on any port it listens on")


def _exited(proc: subprocess.Popen[bytes]) -> str:
    """Why the daemon exited: its code and the end of its output (when it went to a pipe)."""
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    return f"the daemon exited ({proc.returncode}): {out[-3000:]}"


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

"""Helpers to run the real daemon as a process with a generated config."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_config(tmp: Path, greeting: str = "Hello.", **ports: int) -> Path:
    api = ports.get("api") or free_port()
    ms = ports.get("media_streams") or free_port()
    sip = ports.get("sip") or free_port(socket.SOCK_DGRAM)
    text = f"""
[daemon]
drain_timeout_s = {ports.get("drain", 5)}
log_format = "json"
event_loop = "asyncio"

[sip]
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

"""Descriptors exhausted, then freed: calls are refused meanwhile, and work again after.

The daemon as a process limited to 200 descriptors, with a range of two RTP
port pairs. Idle connections held open to its API take every descriptor it
has left: a call then gets 503 (the RTP bind fails with EMFILE, logged),
and, the connections closed, the next call is answered. Before the fix the
failed binds marked the pairs unusable for the life of the process, and
every later call got 503.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call

from .conftest import FACTOR, daemon_config, listeners
from .test_systemd import NotifyReceiver

NOFILE = 200


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _call(sip: int, duration_s: float = 1.0) -> tuple[bool, str | None]:
    opts = CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=duration_s)
    report = build_report(asyncio.run(place_call(opts)).recording)
    return report.answered, report.failure


def _readyz(api: int) -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", api), 2 * FACTOR) as s:
            s.settimeout(2 * FACTOR)
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return None
    parts = head.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def test_a_call_refused_for_want_of_descriptors_leaves_the_ports_usable(tmp_path: Path) -> None:
    # two port pairs: a pair another process holds is skipped (EADDRINUSE), not a failure;
    # before the fix, the failed binds of one call wrote off both
    base = 41000 + 4 * (os.getpid() % 1000)
    path = daemon_config(tmp_path, rtp_lo=base, rtp_hi=base + 3)
    text = path.read_text().replace(
        "[api]\n",
        "[api]\nheader_timeout_s = 3600\n",  # the idle ones stay
    )
    path.write_text(text)
    rx = NotifyReceiver(tmp_path / "notify.sock")
    log_path = tmp_path / "daemon.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "serve", "--config", str(path)],
        env={**os.environ, "NOTIFY_SOCKET": str(rx.path)},
        # a file, not a pipe: a pipe nobody reads until the end fills with the accept
        # errors' tracebacks and blocks the daemon's log writes (and so its loop)
        stdout=log_file,
        stderr=subprocess.STDOUT,
        preexec_fn=_limit_descriptors,
    )
    held: list[socket.socket] = []
    try:
        rx.poll(lambda: rx.seen("READY") >= 1 or proc.poll() is not None, 60)
        assert rx.seen("READY") == 1, (rx.messages, log_path.read_text()[-4000:])
        ports = listeners(proc)
        api, sip = ports.api, ports.sip
        answered, failure = _call(sip)
        assert answered, failure  # the port pair works

        for _ in range(NOFILE + 50):  # more than the daemon has descriptors for
            s = socket.create_connection(("127.0.0.1", api), 5 * FACTOR)
            held.append(s)
        answered, failure = _call(sip, 5.0 * FACTOR)  # the loop is busy failing accepts
        assert not answered and failure is not None and "503" in failure, failure

        for s in held:
            s.close()
        held.clear()
        deadline = time.monotonic() + 30 * FACTOR
        while _readyz(api) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _readyz(api) == 200  # no port pair was written off
        answered, failure = _call(sip)
        assert answered, failure
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30 * FACTOR) == 0
    finally:
        for s in held:
            s.close()
        rx.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_file.close()
    out = log_path.read_text(errors="replace")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("event") == "sip.rtp_bind_failed"]
    assert failed and failed[0]["error"] in ("EMFILE", "ENFILE"), out[-3000:]

"""The daemon's embedded TTS server does not outlive the daemon, however the daemon ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .conftest import FACTOR, daemon_config


def _state(pid: int) -> str:
    """The process's state letter (``Z``: exited, not yet reaped), or ``""`` if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_embedded_child_stops_when_the_daemon_is_killed(
    tmp_path: Path, run_daemon: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """A daemon killed outright (SIGKILL: no drain, no stop) leaves no tts-server behind, and
    no socket directory (the child removes it as it goes)."""
    config = daemon_config(tmp_path, api=0, media_streams=0, sip_enabled=False)
    daemon = run_daemon(config)  # its provider: url = "embedded"
    child_pid = None
    socket_dir = None
    try:
        assert daemon.stdout is not None
        for line in daemon.stdout:
            if b'"embedded.started"' in line:
                started = json.loads(line)
                child_pid, socket_dir = int(started["pid"]), Path(started["socket"]).parent
            if b'"daemon.ready"' in line:
                break
        assert child_pid is not None, "the daemon did not start its embedded server"
        daemon.kill()
        daemon.wait()
        deadline = time.monotonic() + 10 * FACTOR
        while _state(child_pid) not in ("", "Z"):
            assert time.monotonic() < deadline, "the embedded tts-server outlived the daemon"
            time.sleep(0.05)
        assert socket_dir is not None and not socket_dir.exists()
    finally:
        if child_pid is not None and _state(child_pid) not in ("", "Z"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)

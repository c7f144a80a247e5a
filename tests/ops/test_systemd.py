"""The units verify and score well; the daemon speaks sd_notify correctly."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.io.notify import Notifier

from .conftest import FACTOR, api_port, daemon_config

ROOT = Path(__file__).resolve().parents[2]
UNITS = ["callbridge.service", "callbridge@.service"]
needs_systemd = pytest.mark.needs("systemd-analyze")


@needs_systemd
@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    exe = shutil.which("callbridge") or str(Path(os.sys.executable).with_name("callbridge"))
    text = (ROOT / "systemd" / unit).read_text().replace("/opt/callbridge/venv/bin/callbridge", exe)
    name = unit.replace("@.", "@ci.")
    (tmp_path / unit).write_text(text)
    (tmp_path / name).write_text(text)
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / name)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr


@needs_systemd
@pytest.mark.parametrize("unit", UNITS)
def test_unit_hardening_scores_2_or_better(unit: str) -> None:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--threshold=20", unit],
        cwd=ROOT / "systemd",
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
    assert m and float(m.group(1)) <= 2.0, out.stdout[-500:]


def test_unit_has_the_required_directives() -> None:
    text = (ROOT / "systemd" / "callbridge.service").read_text()
    for directive in [
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=",
        "Restart=on-failure",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "LoadCredential=",
        "StateDirectory=",
        "CacheDirectory=",
        "ConfigurationDirectory=",
        "DynamicUser=yes",
    ]:
        assert directive in text, directive
    stop_s = int(re.search(r"TimeoutStopSec=(\d+)s", text).group(1))  # type: ignore[union-attr]
    assert stop_s > 30, "TimeoutStopSec must exceed the default drain_timeout_s"
    families = re.search(r"RestrictAddressFamilies=(.*)", text).group(1).split()  # type: ignore[union-attr]
    assert set(families) <= {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


class NotifyReceiver:
    """A fake systemd: an AF_UNIX datagram socket collecting sd_notify messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def poll(self, until: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s * FACTOR
        while time.monotonic() < deadline and not until():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def seen(self, key: str) -> int:
        return sum(1 for _, m in self.messages if key in m)

    def close(self) -> None:
        self.sock.close()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2 * FACTOR) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _not_ready(proc: subprocess.Popen[bytes], rx: NotifyReceiver) -> str:
    """What to say when the daemon never notified READY: its messages, exit and output."""
    if proc.poll() is None:
        proc.kill()
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    return f"messages {rx.messages}, exit {proc.wait()}, output:\n{out[-4000:]}"


def test_notify_sequence_reload_and_stop(
    tmp_path: Path, run_daemon: Callable[..., subprocess.Popen[bytes]]
) -> None:
    cfg = daemon_config(tmp_path, api=0, media_streams=0, sip_enabled=False)
    rx = NotifyReceiver(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(rx.path), "WATCHDOG_USEC": "400000"}
    proc = run_daemon(cfg, env)
    try:
        rx.poll(lambda: rx.seen("READY") >= 1 or proc.poll() is not None, 60)
        assert rx.seen("READY") == 1, _not_ready(proc, rx)
        api = api_port(proc)
        at = next(i for i, (_, m) in enumerate(rx.messages) if "READY" in m)
        ready = rx.messages[at][1]
        assert ready.get("READY") == "1" and "STATUS" in ready
        # before it, only the static prompts' rendering progress
        assert all(m["STATUS"].startswith("rendering prompts") for _, m in rx.messages[:at])
        assert _get(f"http://127.0.0.1:{api}/readyz")[0] == 200
        rx.poll(lambda: rx.seen("WATCHDOG") >= 3, 10)
        assert rx.seen("WATCHDOG") >= 3

        # SIGHUP with a good config: RELOADING=1 with MONOTONIC_USEC, then READY=1 again
        cfg.write_text(cfg.read_text().replace('greeting = "Hello."', 'greeting = "Reloaded."'))
        proc.send_signal(signal.SIGHUP)
        rx.poll(lambda: rx.seen("READY") >= 2, 30)
        reload_msgs = [m for _, m in rx.messages if "RELOADING" in m]
        assert len(reload_msgs) == 1 and reload_msgs[0]["MONOTONIC_USEC"].isdigit()
        assert rx.seen("READY") == 2

        # SIGHUP with a broken config: rejected, the old one stays, and READY=1
        # follows RELOADING=1 again (systemd would otherwise wait out its timeout)
        good = cfg.read_text()
        cfg.write_text(good.replace('protocol = "kova"', 'protocol = "kovaa"'))
        proc.send_signal(signal.SIGHUP)
        rx.poll(lambda: rx.seen("READY") >= 3, 30)
        states = [k for _, m in rx.messages for k in ("READY", "RELOADING") if k in m]
        assert states == ["READY", "RELOADING", "READY", "RELOADING", "READY"], rx.messages
        last = [m for _, m in rx.messages if "READY" in m][-1]
        assert "reload rejected" in last["STATUS"]
        assert _get(f"http://127.0.0.1:{api}/readyz")[0] == 200

        proc.send_signal(signal.SIGTERM)
        rx.poll(lambda: rx.seen("STOPPING") >= 1, 10)
        assert rx.seen("STOPPING") == 1
        assert proc.wait(30 * FACTOR) == 0
    finally:
        rx.close()
    log = proc.stdout.read().decode() if proc.stdout else ""
    assert "config.reload_rejected" in log and "kovaa" in log


def test_watchdog_stops_while_the_loop_is_blocked(tmp_path: Path) -> None:
    rx = NotifyReceiver(tmp_path / "wd.sock")

    async def pings(at_least: int) -> int:
        """Pings received until ``at_least`` came (or a generous timeout: a loaded
        runner may pause this process, which the watchdog rightly skips a ping for)."""
        got = 0
        deadline = time.monotonic() + 5.0 * FACTOR
        while got < at_least and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            got += len(_drain(rx))
        return got

    async def main() -> tuple[int, int, int]:
        notifier = Notifier({"NOTIFY_SOCKET": str(rx.path), "WATCHDOG_USEC": "200000"})
        notifier.start_watchdog()
        before = await pings(3)
        _drain(rx)
        time.sleep(1.0)  # the event loop is stalled: a runaway call
        during = len(_drain(rx))
        after = await pings(2)
        notifier.stop_watchdog()
        return before, during, after

    before, during, after = asyncio.run(main())
    rx.close()
    assert before >= 3, "pings every 100 ms while healthy"
    assert during == 0, "no ping may be sent by a blocked loop"
    assert after >= 2, "pings resume when the loop recovers"


def _drain(rx: NotifyReceiver) -> list[bytes]:
    out = []
    rx.sock.setblocking(False)
    try:
        while True:
            out.append(rx.sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        rx.sock.settimeout(0.1)
    return out

"""The daemon's embedded voice over its private Unix socket, end to end.

The daemon starts ``callbridge tts-server`` (tone engine) as its child; calls
come in over the Twilio media-stream leg and an application says dynamic text
(not a cached prompt), so every turn here is synthesized by the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.embedded import EmbeddedTts

from .harness import FACTOR, AppServer, TwilioCall


def config_text(app_url: str) -> str:
    return f"""
[daemon]
log_format = "json"
event_loop = "asyncio"
drain_timeout_s = 2

[sip]
enabled = false

[media_streams]
listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[providers.main]
protocol = "kova"
url = "embedded"
engine = "tone"
voice = "tone"

[[routes]]
match = "*"
provider = "main"
app = "{app_url}"
"""


@contextlib.asynccontextmanager
async def embedded_daemon(app_url: str) -> AsyncIterator[Daemon]:
    daemon = Daemon(parse_config(config_text(app_url), "test.toml"))
    try:
        await daemon.start()
        yield daemon
    finally:
        await daemon.drain_and_stop()
        await daemon.close()


def ms_port(daemon: Daemon) -> int:
    leg = next(leg for leg in daemon.legs if leg.name == "media_streams")
    return int(leg.port)  # type: ignore[attr-defined]


def child_of(daemon: Daemon) -> EmbeddedTts:
    return daemon.embedded["tone"]


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


async def until(pred: object, what: str, timeout_s: float = 20.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(loop(), timeout_s * FACTOR)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def say_and_finish(app: AppServer, conn: int, turn_id: str, text: str) -> dict[str, object]:
    """Say ``text`` on the app's connection ``conn``; the turn's one report."""
    await app.conns[conn].send(
        f'{{"type": "say", "turn_id": "{turn_id}", "text": "{text}", "final": true}}'
    )

    def report() -> dict[str, object] | None:
        for e in app.events:
            if e.get("turn_id") == turn_id and e.get("type") in (
                "turn.finished",
                "turn.interrupted",
            ):
                return e
        return None

    await until(lambda: report() is not None, f"the report of turn {turn_id}")
    got = report()
    assert got is not None
    return got


def heard_audio(call: TwilioCall) -> int:
    """Frames the carrier got that are not digital silence."""
    return sum(1 for _, p in call.carrier.received_media() if p.strip(b"\xff"))


def test_the_embedded_voice_is_served_over_a_private_unix_socket() -> None:
    async def body() -> None:
        async with AppServer() as app, embedded_daemon(app.url) as daemon:
            child = child_of(daemon)
            path = Path(child.socket_path)
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            assert path.parent.stat().st_uid == os.getuid()
            assert daemon.runtime is not None
            assert daemon.runtime.pools["main"].settings.unix_socket == str(path)
            assert child.proc is not None
            assert listening_tcp_ports(child.proc.pid) == set()  # no port to squat
            async with TwilioCall(ms_port(daemon)) as call:
                await app.wait_for("call.started", 10)
                report = await say_and_finish(app, 0, "t1", "Over the socket.")
                assert report["type"] == "turn.finished"
                assert not app.of("provider.error")
                await until(lambda: heard_audio(call) > 10, "the turn's audio")
        assert not path.parent.exists()  # removed at stop

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


_INTRUDER = """
import socket, sys
path = sys.argv[1]
for what, target in (("connect", path), ("take", path), ("bind", path + ".squat")):
    s = socket.socket(socket.AF_UNIX)
    try:
        if what == "connect":
            s.connect(target)
        else:
            s.bind(target)
        print(what, "ok")
    except PermissionError:
        print(what, "refused")
    finally:
        s.close()
"""


SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python another user may run (the test's own may sit in root's home)."""


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no {SYSTEM_PYTHON}")
def test_another_local_user_can_neither_reach_nor_take_the_childs_socket() -> None:
    """The squat the loopback port allowed: while the child is down (killed, not restarted
    yet), another user connects to its socket, binds its path, or binds beside it. All
    refused (the directory is the daemon user's, 0700); the restarted child takes its path
    back and serves the calls."""

    async def body() -> None:
        async with AppServer() as app, embedded_daemon(app.url) as daemon:
            child = child_of(daemon)
            path, old = child.socket_path, child.proc
            assert old is not None
            os.kill(old.pid, signal.SIGKILL)
            await until(lambda: old.returncode is not None, "the child's death")
            out = await asyncio.to_thread(
                subprocess.run,
                [SYSTEM_PYTHON, "-I", "-c", _INTRUDER, child.socket_path],
                user=65534,  # nobody
                group=65534,
                extra_groups=[],
                cwd="/",
                env={},
                capture_output=True,
                text=True,
                timeout=30 * FACTOR,
                check=True,
            )
            assert out.stdout.split("\n")[:3] == ["connect refused", "take refused", "bind refused"]
            assert daemon.runtime is not None
            pool = daemon.runtime.pools["main"]
            await until(
                lambda: child.restarts == 1 and any(c.engine.ready for c in pool.connections),
                "the child's restart and the pool's reconnect",
                30,
            )
            assert child.socket_path == path
            async with TwilioCall(ms_port(daemon)):
                await app.wait_for("call.started", 10)
                report = await say_and_finish(app, 0, "t1", "Still ours.")
                assert report["type"] == "turn.finished"

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


def test_a_killed_child_comes_back_on_the_same_socket_and_calls_go_on() -> None:
    """The child is killed while a call is up: the call stays up, the child is restarted on
    the same path, and both that call and a new one are served by it."""

    async def body() -> None:
        async with AppServer() as app, embedded_daemon(app.url) as daemon:
            child = child_of(daemon)
            assert daemon.runtime is not None
            pool = daemon.runtime.pools["main"]
            path = child.socket_path
            async with TwilioCall(ms_port(daemon)) as first:
                await app.wait_for("call.started", 10)
                assert (await say_and_finish(app, 0, "a1", "Before."))["type"] == "turn.finished"
                assert child.proc is not None
                old_pid = child.proc.pid
                os.kill(old_pid, signal.SIGKILL)
                await until(
                    lambda: (
                        child.restarts >= 1
                        and child.proc is not None
                        and child.proc.pid != old_pid
                        and any(c.engine.ready for c in pool.connections)
                    ),
                    "the child's restart and the pool's reconnect",
                    30,
                )
                assert child.socket_path == path
                assert not first.closed.is_set()  # the call in progress was not lost
                again = await say_and_finish(app, 0, "a2", "After the restart.")
                assert again["type"] == "turn.finished"
                async with TwilioCall(ms_port(daemon)) as second:
                    await app.wait_for("call.started", 10, count=2)
                    new = await say_and_finish(app, 1, "b1", "A new call.")
                    assert new["type"] == "turn.finished"
                    await until(lambda: heard_audio(second) > 10, "the new call's audio")
            assert not app.of("provider.error")

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))


def test_the_socket_path_is_checked_for_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(deep))
    child = EmbeddedTts("tone")
    with pytest.raises(RuntimeError, match="longer than 107 bytes"):
        asyncio.run(child.start())
    assert child.proc is None  # no child started
    assert not any(deep.iterdir())  # nothing left behind


def test_the_socket_directory_is_made_in_systemds_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", f"{tmp_path}:/elsewhere")

    async def body() -> None:
        child = EmbeddedTts("tone")
        await child.start()
        try:
            assert Path(child.socket_path).parent.parent == tmp_path
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(child.socket_path)
        finally:
            await child.stop()
        assert list(tmp_path.iterdir()) == []

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

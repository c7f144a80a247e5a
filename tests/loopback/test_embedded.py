"""The embedded provider: `callbridge tts-server` as a supervised child, restarted if it dies."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.io.embedded import KEY_ENV, PROTOCOL_PATHS, EmbeddedTts
from bridge.io.provider_pool import ProviderPool, Speaker
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


async def _speak(pool: ProviderPool, turn_id: str) -> list[object]:
    events: list[object] = []
    done = asyncio.Event()

    def sink(e: object) -> None:
        events.append(e)
        if type(e).__name__ in ("TurnDone", "TurnFailed", "ProviderFailed"):
            done.set()

    Speaker([pool]).speak(turn_id, "Still speaking.", TurnSettings("tone", MULAW_8K), sink)
    await asyncio.wait_for(done.wait(), 20 * FACTOR)
    return events


def test_embedded_child_serves_and_is_restarted_on_the_same_socket_after_it_dies() -> None:
    async def main() -> None:
        child = EmbeddedTts("tone")
        await child.start()
        try:
            settings = ProviderSettings(
                "local",
                "kova",
                child.url("kova"),
                api_key=child.api_key,
                voice="tone",
                unix_socket=child.socket_path,
            )
            pool = ProviderPool(settings)
            pool.backoff.base_s = 0.05
            assert await pool.start(10 * FACTOR)
            first = await _speak(pool, "t1")
            assert isinstance(first[-1], TurnDone)
            assert child.proc is not None
            old_pid, path = child.proc.pid, child.socket_path
            os.kill(old_pid, signal.SIGKILL)  # the child crashes
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30 * FACTOR
            while child.restarts < 1 or not any(c.engine.ready for c in pool.connections):
                assert loop.time() < deadline, "the child was not restarted"
                await asyncio.sleep(0.05)
            assert child.proc.pid != old_pid and child.socket_path == path
            again = await _speak(pool, "t2")
            assert any(isinstance(e, AudioReceived) for e in again)
            assert isinstance(again[-1], TurnDone)
            await pool.close()
        finally:
            await child.stop()
        assert child.proc is not None and child.proc.returncode is not None

    asyncio.run(main())


def test_tts_server_with_exit_with_stdin_stops_when_its_stdin_ends(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "bridge.cli", "tts-server", "--engine", "tone"),
            *("--listen", "127.0.0.1:0", "--port-file", str(port_file), "--exit-with-stdin"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30 * FACTOR
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "did not start"
            time.sleep(0.05)
        assert proc.poll() is None  # serving while the pipe is open
        assert proc.stdin is not None
        proc.stdin.close()  # what the parent's death does to the pipe
        assert proc.wait(10 * FACTOR) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except ProcessLookupError:  # a thread that ended while we looked
        return None


def _frozen(cpus: set[int] | None) -> frozenset[int] | None:
    return None if cpus is None else frozenset(cpus)


def _nice_of_threads(pid: int) -> set[int]:
    """The nice value of every thread of ``pid`` (Linux keeps one per thread)."""
    out = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread may end while we look
            out.add(int(stat.read_text().rsplit(")", 1)[1].split()[16]))
    return out


def test_the_child_runs_lower_on_its_cpus_with_its_secret_off_its_command_line() -> None:
    cpu = max(os.sched_getaffinity(0))

    async def main() -> None:
        child = EmbeddedTts("tone", nice=5, workers=2, queue=3, cpus=str(cpu))
        await child.start()
        try:
            assert child.proc is not None
            pid = child.proc.pid
            ours = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + 5)
            assert _nice_of_threads(pid) == {min(19, ours + 5)}
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
            assert tids and {_frozen(_affinity(t)) for t in tids} <= {frozenset({cpu}), None}
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"--nice" in cmdline and b"--workers" in cmdline
            assert child.api_key.encode() not in b" ".join(cmdline)
            assert f"{KEY_ENV}=".encode() not in b" ".join(cmdline)
        finally:
            await child.stop()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_PATHS))
def test_the_child_refuses_a_connection_without_its_secret(protocol: str) -> None:
    async def main() -> None:
        child = EmbeddedTts("tone")
        await child.start()
        try:
            url = child.url(protocol)
            if protocol == "zwst":  # the session route, then the socket it names
                url = url.removesuffix(PROTOCOL_PATHS["zwst"])
            for key, served in (("", False), ("not-the-secret", False), (child.api_key, True)):
                pool = ProviderPool(
                    ProviderSettings(
                        "p", protocol, url, api_key=key, voice="tone", unix_socket=child.socket_path
                    )
                )
                pool.backoff.base_s = 60.0  # one attempt: no reconnect during the turn
                await pool.start(2 * FACTOR)
                events = await _speak(pool, f"t-{served}")
                await pool.close()
                heard = any(isinstance(e, AudioReceived) for e in events)
                if served:
                    assert heard and isinstance(events[-1], TurnDone), events
                else:
                    assert not heard, f"{protocol} served audio with key {key!r}"
                    assert isinstance(events[-1], TurnFailed | ProviderFailed), events
        finally:
            await child.stop()

    asyncio.run(main())


def test_tts_server_refuses_a_missing_key_variable_and_bad_limits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bridge.cli import EXIT_CONFIG, main

    monkeypatch.delenv("CB_TEST_NO_SUCH_KEY", raising=False)
    base = ["tts-server", "--engine", "tone", "--listen", "127.0.0.1:0"]
    assert main([*base, "--api-key-env", "CB_TEST_NO_SUCH_KEY"]) == EXIT_CONFIG
    assert "--api-key-env: $CB_TEST_NO_SUCH_KEY is not set" in capsys.readouterr().err
    assert main([*base, "--queue", "-1"]) == EXIT_CONFIG
    assert "queue must be 0 or more" in capsys.readouterr().err

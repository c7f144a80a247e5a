"""The embedded provider: `callbridge tts-server` as a supervised child, restarted if it dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bridge.io.embedded import EmbeddedTts
from bridge.io.tts_client import ProviderPool, Speaker
from bridge.tts.base import MULAW_8K, AudioReceived, ProviderSettings, TurnDone, TurnSettings

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


def test_embedded_child_serves_and_is_restarted_on_the_same_port_after_it_dies() -> None:
    async def main() -> None:
        child = EmbeddedTts("tone")
        await child.start()
        try:
            pool = ProviderPool(ProviderSettings("local", "kova", child.url("kova"), voice="tone"))
            pool.backoff.base_s = 0.05
            assert await pool.start(10 * FACTOR)
            first = await _speak(pool, "t1")
            assert isinstance(first[-1], TurnDone)
            assert child.proc is not None
            old_pid, port = child.proc.pid, child.port
            os.kill(old_pid, signal.SIGKILL)  # the child crashes
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30 * FACTOR
            while child.restarts < 1 or not any(c.engine.ready for c in pool.connections):
                assert loop.time() < deadline, "the child was not restarted"
                await asyncio.sleep(0.05)
            assert child.proc.pid != old_pid and child.port == port
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

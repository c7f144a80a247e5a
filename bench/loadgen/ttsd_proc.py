"""The reference TTS server (``tone`` engine) for the benchmarks, in its own process.

Same server as ``callbridge tts-server --engine tone``; the engine also notes
``time.monotonic()`` when each job's first chunk is produced (the instant
before the session sends it), and the list is written as JSON on SIGTERM, so
a benchmark can compare it with when the first ``media`` reached the carrier
(CLOCK_MONOTONIC is shared by every process on the host). For every job that
ran to its end it also notes how far its production fell behind real time
(``<RECORD_JSON stem>.jobs.json``: first chunk time, audio seconds, and the
largest ``(t_k - t_0) - audio before chunk k``): a turn the server produced
slower than it plays can run dry at the daemon through no fault of the daemon.

    python bench/loadgen/ttsd_proc.py PORT_FILE RECORD_JSON
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bridge.io.ttsd_server import start_tts_server
from bridge.ttsd.base import ServerOptions
from bridge.ttsd.synth import SynthChunk, ToneEngine


class RecordingToneEngine(ToneEngine):
    """``ToneEngine`` that records (text, monotonic time) of every job's first chunk."""

    def __init__(
        self,
        native_rate_hz: int = 24000,
        log: list[tuple[str, float]] | None = None,
        jobs: list[tuple[float, float, float]] | None = None,
    ):
        super().__init__(native_rate_hz)
        self.log: list[tuple[str, float]] = [] if log is None else log
        self.jobs: list[tuple[float, float, float]] = [] if jobs is None else jobs
        """(first chunk time, audio s, most behind real time s) of every finished job."""

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        return RecordingToneEngine(sample_rate_hz, self.log, self.jobs)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        t0, audio_s, behind_s = 0.0, 0.0, 0.0
        bytes_per_s = 2.0 * self.native_rate_hz
        for chunk in super().synthesize(text, voice, speed):
            now = time.monotonic()
            if not audio_s:
                t0 = now
                self.log.append((text, now))
            else:
                behind_s = max(behind_s, (now - t0) - audio_s)
            audio_s += len(chunk.pcm) / bytes_per_s
            yield chunk
        self.jobs.append((t0, audio_s, behind_s))


async def main(port_file: Path, record: Path) -> None:
    engine = RecordingToneEngine()
    # the reference server holds 16 contexts per socket; the daemon's Kova client packs up
    # to 64 turns on one (the seed sets no limit): allow what the client uses
    server = await start_tts_server(engine=engine, options=ServerOptions(max_contexts=256))
    port_file.write_text(f"{server.port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    record.write_text(json.dumps(engine.log))
    record.with_suffix(".jobs.json").write_text(json.dumps(engine.jobs))
    await server.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
    except ImportError:
        asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))

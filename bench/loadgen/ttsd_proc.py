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

With ``TTSD_RECORD_CHUNKS=1`` in its environment it also notes every Kova
``audio_chunk`` it sends (``<RECORD_JSON stem>.chunks.json``, rows ``[t_produced,
t_written, "<client port>/<context_id>", samples, write_buffer_bytes,
kernel_unsent_bytes]``, monotonic seconds; context ids are per connection, the
client's port names it) and every job's end (samples -1): when
the server wrote the message a daemon's underrun waited for, and whether its
own socket was backed up then (the transport's buffer above the kernel's, and
``TIOCOUTQ``: bytes the kernel holds that the peer has not taken).

    python -m bench.loadgen.ttsd_proc PORT_FILE RECORD_JSON
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import sys
import termios
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bridge.io.ttsd_server as ttsd_server
import bridge.providers.kova.server as kova_server
from bridge.io.ttsd_server import start_tts_server
from bridge.providers.base import WordTiming
from bridge.providers.server_base import ServerOptions
from bridge.ttsd.synth import SynthChunk, ToneEngine

CHUNKS: list[list[Any]] = []
"""[t_produced, t_written, "<client port>/<context_id>", samples, write_buffer_bytes,
kernel_unsent_bytes]"""


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


class RecordingKovaSession(kova_server.KovaServerSession):
    """Kova's server session noting each job's audio (``CHUNKS``) before it is sent."""

    def __init__(self, options: ServerOptions) -> None:
        super().__init__(options)
        self.unsent: list[list[Any]] = []
        """Rows of this pump, completed by ``RecordingRunner.pump`` once written."""

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        ctx = self._jobs.get(job_id)
        if ctx is not None:
            self.unsent.append([time.monotonic(), 0.0, ctx.context_id, len(pcm) // 2, 0, 0])
        super().synthesis_audio(job_id, pcm, words, now)

    def synthesis_done(self, job_id: str, now: float) -> None:
        ctx = self._jobs.get(job_id)
        if ctx is not None:
            self.unsent.append([time.monotonic(), 0.0, ctx.context_id, -1, 0, 0])
        super().synthesis_done(job_id, now)


_OUTQ = array("i", [0])


class RecordingRunner(ttsd_server._SessionRunner):
    """The server's session pump, completing ``RecordingKovaSession``'s rows after the write."""

    def pump(self) -> None:
        super().pump()
        session = self.session
        if not isinstance(session, RecordingKovaSession) or not session.unsent:
            return
        t = time.monotonic()
        buffered = self.conn.write_buffer_bytes
        unsent, port = -1, 0
        try:
            transport = self.conn._transport
            port = transport.get_extra_info("peername")[1]
            fcntl.ioctl(transport.get_extra_info("socket").fileno(), termios.TIOCOUTQ, _OUTQ, True)
            unsent = int(_OUTQ[0])
        except (OSError, AttributeError, TypeError):
            pass
        for row in session.unsent:
            row[1], row[2], row[4], row[5] = t, f"{port}/{row[2]}", buffered, unsent
        CHUNKS.extend(session.unsent)
        session.unsent = []


async def main(port_file: Path, record: Path) -> None:
    engine = RecordingToneEngine()
    if os.environ.get("TTSD_RECORD_CHUNKS") == "1":
        kova_server.SESSION = RecordingKovaSession  # type: ignore[misc]
        ttsd_server._SessionRunner = RecordingRunner  # type: ignore[misc]
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
    if CHUNKS:
        record.with_suffix(".chunks.json").write_text(json.dumps(CHUNKS))
    await server.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
    except ImportError:
        asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))

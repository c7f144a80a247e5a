"""``callbridge tts-server`` knows its limits: N workers, a bounded queue, refusals at once.

A gated fake engine (the ``tone`` audio behind a gate the test opens, run on
the server's synthesis workers like Piper) makes the workers and the queue
fill deterministically; it records how many jobs render at once. The
clients are the daemon's own provider pools and engines, over loopback.
Every wait is bounded by ``TIMEOUT_S`` (scaled by
``CALLBRIDGE_TEST_TIME_FACTOR``); nothing asserts a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest

from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.httpws import WsConnection
from bridge.io.provider_pool import ProviderPool, Speaker
from bridge.io.ttsd_server import SynthLimits, TtsServer, _Expired, _Workers, start_tts_server
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)
from bridge.ttsd.synth import SynthChunk, ToneEngine

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 10.0 * FACTOR

#: What each protocol's refusal becomes in the daemon's client engine: the
#: protocol's own error (kind) and whether the protocol says to retry it.
#: What each protocol's refusal frame holds (the server's own words, as sent).
REFUSAL_FRAMES = {
    "kova": {'{"error":', '"context_id":'},
    "kugelaudio": {'"error_code":"SERVICE_UNAVAILABLE"', '"code":503'},
    "kletso": {'"type":"error"', '"code":"voice_rate_limited"'},
    "coda": {'"kind":"unavailable"', '"contextId"'},
    "zwst": {'"type":"error"', '"context_id"'},
}

REFUSAL_KINDS = {
    "kova": "error",  # Kova's per-context ``error`` frame has no code
    "kugelaudio": "SERVICE_UNAVAILABLE",
    "kletso": "voice_rate_limited",
    "coda": "unavailable",
    "zwst": "provider_error",  # zwst's ``error`` frame has no code either
}


class GatedEngine:
    """Tone audio, each job's first chunk held until the gate opens; counts chunks rendered
    at once (``peak``) and jobs begun (``started``)."""

    name = "gated"
    native_rate_hz = 24000

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.cond = threading.Condition()
        self.running = 0
        self.peak = 0
        self.started = 0

    def _enter(self, first: bool) -> None:
        with self.cond:
            self.running += 1
            self.started += first
            self.peak = max(self.peak, self.running)
            self.cond.notify_all()

    def _leave(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        self._enter(first=True)
        if not self.gate.wait(TIMEOUT_S):
            self._leave()
            raise RuntimeError("the test never opened the gate")
        first = True
        for chunk in ToneEngine(self.native_rate_hz).synthesize(text, voice, speed):
            if not first:
                self._enter(first=False)
            first = False
            self._leave()  # the chunk is made: the thread hands it over
            yield chunk

    async def started_at_least(self, n: int) -> None:
        """Return once ``n`` jobs have started (waits in a thread: the jobs run in threads)."""

        def wait() -> bool:
            with self.cond:
                return self.cond.wait_for(lambda: self.started >= n, TIMEOUT_S)

        assert await asyncio.to_thread(wait), f"{n} jobs never started ({self.started})"


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.done.set()

    @property
    def last(self) -> Event:
        return self.events[-1]


def _settings(server: TtsServer, protocol: str, name: str) -> ProviderSettings:
    url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS[protocol]}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{server.port}"
    return ProviderSettings(name=name, protocol=protocol, url=url, api_key="k", voice="tone")


def _run(
    engine: GatedEngine, limits: SynthLimits, body: Callable[[TtsServer], Awaitable[None]]
) -> None:
    async def main() -> None:
        server = await start_tts_server(engine=engine, limits=limits)  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(body(server), TIMEOUT_S)
        finally:
            engine.gate.set()
            await server.close()

    asyncio.run(main())


async def _health(server: TtsServer) -> dict[str, object]:
    """The server's ``GET /healthz`` answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = await reader.read()
    writer.close()
    body: dict[str, object] = json.loads(raw.partition(b"\r\n\r\n")[2])
    return body


async def _until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds (looked at every few ms; the test's timeout bounds it)."""
    while not condition():
        await asyncio.sleep(0.002)


async def _speak(server: TtsServer, protocol: str, name: str, text: str) -> Collector:
    pool = ProviderPool(_settings(server, protocol, name))
    assert await pool.start(), f"{name}: warm connection not ready"
    sink = Collector()
    Speaker([pool]).speak(name, text, TurnSettings("tone", MULAW_8K), sink)
    sink.pool = pool  # type: ignore[attr-defined]
    return sink


@pytest.mark.parametrize("workers", [1, 3])
def test_n_workers_render_n_jobs_at_once(workers: int) -> None:
    engine = GatedEngine()
    turns = workers + 2

    async def body(server: TtsServer) -> None:
        text = "Hello there, how are you today?"
        sinks = [await _speak(server, "kova", f"t{i}", text) for i in range(turns)]
        pool = server.workers
        assert pool is not None
        await _until(lambda: pool.jobs == turns)  # every job taken on
        await engine.started_at_least(workers)
        # every worker renders a job's first chunk; the other jobs' first chunks wait
        assert engine.started == workers and engine.running == workers
        engine.gate.set()
        for sink in sinks:
            await sink.done.wait()
            await sink.pool.close()  # type: ignore[attr-defined]
        assert [type(s.last) for s in sinks] == [TurnDone] * turns
        assert engine.peak == workers  # never more chunks at once than workers
        assert engine.started == turns
        assert pool.jobs == 0 and pool.refused == 0

    _run(engine, SynthLimits(workers=workers, queue=8, max_wait_s=TIMEOUT_S), body)


@pytest.mark.parametrize("protocol", sorted(REFUSAL_KINDS))
def test_a_full_queue_is_refused_at_once_with_the_protocols_error(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = GatedEngine()
    sent: list[str] = []
    send = WsConnection.send_text_nowait

    def recorded(conn: WsConnection, text: str) -> None:
        sent.append(text)
        send(conn, text)

    monkeypatch.setattr(WsConnection, "send_text_nowait", recorded)

    async def body(server: TtsServer) -> None:
        first = await _speak(server, protocol, "first", "Hello there.")
        await engine.started_at_least(1)
        refused = await _speak(server, protocol, "second", "How are you?")
        await refused.done.wait()
        # refused while the only worker is still held: no timeout, no worker freed
        assert not engine.gate.is_set() and engine.running == 1
        failed = refused.last
        assert isinstance(failed, TurnFailed), refused.events
        assert failed.turn_id == "second"
        assert failed.kind == REFUSAL_KINDS[protocol]
        assert failed.retryable
        assert not any(isinstance(e, AudioReceived) for e in refused.events)
        assert engine.started == 1  # the refused job never reached the engine
        frames = [t for t in sent if "busy" in t]
        assert len(frames) == 1, sent
        health = await _health(server)
        assert (health["jobs"], health["max_jobs"], health["refused"]) == (1, 1, 1), health
        assert all(part in frames[0] for part in REFUSAL_FRAMES[protocol]), frames
        engine.gate.set()
        await first.done.wait()
        assert isinstance(first.last, TurnDone), first.events
        assert any(isinstance(e, AudioReceived) for e in first.events)
        # the refused turn's connection serves the next turn
        again = Collector()
        pool = refused.pool  # type: ignore[attr-defined]
        Speaker([pool]).speak("third", "Fine.", TurnSettings("tone", MULAW_8K), again)
        await again.done.wait()
        assert isinstance(again.last, TurnDone), again.events
        for sink in (first, refused):
            await sink.pool.close()  # type: ignore[attr-defined]

    _run(engine, SynthLimits(workers=1, queue=0, max_wait_s=TIMEOUT_S), body)


def test_a_job_that_waits_too_long_is_refused() -> None:
    engine = GatedEngine()

    async def body(server: TtsServer) -> None:
        first = await _speak(server, "coda", "first", "Hello there.")
        await engine.started_at_least(1)
        waited = await _speak(server, "coda", "second", "How are you?")
        await waited.done.wait()  # its place in the queue ran out before a worker freed
        assert not engine.gate.is_set()
        assert isinstance(waited.last, TurnFailed) and waited.last.kind == "unavailable"
        assert server.workers is not None and server.workers.jobs == 1
        engine.gate.set()
        await first.done.wait()
        assert isinstance(first.last, TurnDone)
        assert engine.started == 1
        for sink in (first, waited):
            await sink.pool.close()  # type: ignore[attr-defined]

    _run(engine, SynthLimits(workers=1, queue=4, max_wait_s=0.05), body)


def test_admission_and_a_first_chunk_that_waits_too_long() -> None:
    """The admission rules alone: ``workers + queue`` jobs in progress, one more refused;
    a first chunk no thread began in time expires (and never runs), one begun does not."""

    async def main() -> None:
        gate = threading.Event()
        ran: list[str] = []

        def held(name: str) -> Iterator[SynthChunk]:
            ran.append(name)
            gate.wait(TIMEOUT_S)
            yield SynthChunk(b"\0\0", ())

        workers = _Workers(SynthLimits(workers=1, queue=1, max_wait_s=0.05))
        try:
            assert workers.admit() is None and workers.admit() is None
            refusal = workers.admit()
            assert refusal is not None and "busy" in refusal
            first = asyncio.create_task(workers.first_chunk(held("a")))
            await _until(lambda: ran == ["a"])  # a thread runs "a" and is held there
            second = await workers.first_chunk(held("b"))  # waits behind "a": expires
            assert isinstance(second, _Expired)
            gate.set()
            chunk = await first  # begun in time: it finishes, however long it takes
            assert isinstance(chunk, SynthChunk)
            assert ran == ["a"]  # the expired ask never ran
            assert workers.refused == 2
            workers.release()
            workers.release()
            assert workers.jobs == 0 and workers.admit() is None
        finally:
            gate.set()
            workers.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="workers"):
        SynthLimits(workers=0)
    with pytest.raises(ValueError, match="queue"):
        SynthLimits(queue=-1)
    with pytest.raises(ValueError, match="max_wait_s"):
        SynthLimits(max_wait_s=0)


def test_a_refused_turn_fails_over_to_the_next_provider_at_once() -> None:
    """The route's chain: the busy embedded voice refuses, the next provider speaks the turn."""
    engine = GatedEngine()

    async def body(server: TtsServer) -> None:
        backup_server = await start_tts_server(engine="tone")
        try:
            first = await _speak(server, "kova", "first", "Hello there.")
            await engine.started_at_least(1)
            busy = ProviderPool(_settings(server, "kova", "busy"))
            backup = ProviderPool(_settings(backup_server, "coda", "backup"))
            assert await busy.start() and await backup.start()
            speaker = Speaker([busy, backup])
            sink = Collector()
            speaker.speak("second", "How are you?", TurnSettings("tone", MULAW_8K), sink)
            await sink.done.wait()
            # spoken whole by the backup while the busy voice's only worker is still held
            assert not engine.gate.is_set()
            assert isinstance(sink.last, TurnDone), sink.events
            assert any(isinstance(e, AudioReceived) for e in sink.events)
            assert speaker.failovers == 1
            engine.gate.set()
            await first.done.wait()
            for pool in (busy, backup, first.pool):  # type: ignore[attr-defined]
                await pool.close()
        finally:
            await backup_server.close()

    _run(engine, SynthLimits(workers=1, queue=0, max_wait_s=TIMEOUT_S), body)

"""Every provider protocol: the real client shell against the real ttsd, over loopback.

Deterministic ``tone`` engine; times are bounded by ``TIMEOUT_S`` (scaled by
``CALLBRIDGE_TEST_TIME_FACTOR`` on slow CI machines), never slept on.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
from collections.abc import Awaitable, Callable

import pytest

from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.provider_pool import PromptCache, ProviderPool, Speaker
from bridge.io.provider_ws import Connection
from bridge.io.ttsd_server import TtsServer, start_tts_server
from bridge.providers.base import (
    MULAW_8K,
    PCM_8K,
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    WordsTimed,
)

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 10.0 * FACTOR
TTS_PROTOCOLS = ["kova", "kugelaudio", "coda", "zwst"]
ALL_PROTOCOLS = [*TTS_PROTOCOLS, "kletso"]


def _run(coro_fn: Callable[[TtsServer], Awaitable[None]]) -> None:
    async def main() -> None:
        server = await start_tts_server(engine="tone")
        try:
            await asyncio.wait_for(coro_fn(server), TIMEOUT_S)
        finally:
            await server.close()

    asyncio.run(main())


def _settings(server: TtsServer, protocol: str, name: str = "p") -> ProviderSettings:
    url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS[protocol]}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{server.port}"
    return ProviderSettings(name=name, protocol=protocol, url=url, api_key="k", voice="tone")


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.done.set()

    def audio(self) -> bytes:
        return b"".join(e.audio for e in self.events if isinstance(e, AudioReceived))

    def formats(self) -> set[AudioFormat]:
        return {e.audio_format for e in self.events if isinstance(e, AudioReceived)}

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS)
@pytest.mark.parametrize("fmt", [MULAW_8K, PCM_8K], ids=["mulaw8k", "pcm8k"])
def test_full_turn(protocol: str, fmt: AudioFormat) -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, protocol))
        assert await pool.start(), "warm connection not ready"
        sink = Collector()
        Speaker([pool]).speak("t1", "Hello there. How are you?", TurnSettings("tone", fmt), sink)
        await sink.done.wait()
        await pool.close()
        assert isinstance(sink.events[-1], TurnDone), sink.kinds()
        # tone engine: 5 words of >= 80 ms plus gaps: well over half a second of audio
        expected_rate = fmt.sample_rate_hz * fmt.bytes_per_sample
        assert len(sink.audio()) >= 0.5 * expected_rate
        assert sink.formats() <= {fmt, PCM_8K, AudioFormat("pcm_s16le", 24000)}
        words = [w.word for e in sink.events if isinstance(e, WordsTimed) for w in e.words]
        if words:
            assert words == ["Hello", "there.", "How", "are", "you?"]

    _run(body)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS)
def test_plain_audio_messages_go_straight_to_the_turn(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every protocol's audio messages come out of the engine's one receive contract
    as ``AudioReceived`` and reach the turn, all of them and in order, through the
    connection's dispatch (``ProviderConnection.dispatch``)."""
    direct: list[int] = []
    route = Connection.dispatch

    def counted(conn: Connection, event: Event, now: float) -> None:
        if isinstance(event, AudioReceived):
            direct.append(len(event.audio))
        route(conn, event, now)

    monkeypatch.setattr(Connection, "dispatch", counted)

    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, protocol))
        assert await pool.start(), "warm connection not ready"
        sink = Collector()
        Speaker([pool]).speak(
            "t1", "Hello there. How are you?", TurnSettings("tone", MULAW_8K), sink
        )
        await sink.done.wait()
        await pool.close()
        assert isinstance(sink.events[-1], TurnDone), sink.kinds()
        audio = [len(e.audio) for e in sink.events if isinstance(e, AudioReceived)]
        assert audio and direct == audio  # every piece of audio, in order, took the route

    _run(body)


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
def test_the_reader_offers_the_media_ticker_a_pass_after_every_message(protocol: str) -> None:
    """A burst of provider messages is read without a return to the loop; the
    pool's ``preempt`` (``MediaTicker.run_if_due`` in the daemon) runs between
    two messages, after the first one's events reached the turn."""

    async def body(server: TtsServer) -> None:
        timeline: list[str] = []
        pool = ProviderPool(_settings(server, protocol), preempt=lambda: timeline.append("pass"))
        assert await pool.start(), "warm connection not ready"
        sink = Collector()

        def record(event: Event) -> None:
            timeline.append(type(event).__name__)
            sink(event)

        text = "one two three four five six seven eight"
        Speaker([pool]).speak("t1", text, TurnSettings("tone", MULAW_8K), record)
        await sink.done.wait()
        await pool.close()
        assert isinstance(sink.events[-1], TurnDone), sink.kinds()
        audio_at = [i for i, kind in enumerate(timeline) if kind == "AudioReceived"]
        assert len(audio_at) >= 2, timeline
        for a, b in itertools.pairwise(audio_at):
            assert "pass" in timeline[a:b], timeline  # no two messages' audio back to back

    _run(body)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS)
def test_cancel_mid_utterance_drops_late_audio(protocol: str) -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, protocol))
        assert await pool.start()
        speaker = Speaker([pool])
        sink = Collector()
        long_text = " ".join(["word"] * 200) + "."
        speaker.open_turn("t1", TurnSettings("tone", MULAW_8K), sink)
        speaker.send_text("t1", long_text)
        speaker.end_turn("t1")
        while not any(isinstance(e, AudioReceived) for e in sink.events):
            await asyncio.sleep(0.001)
        speaker.cancel("t1")
        n = len(sink.events)
        # a second turn on the same pool still works after the cancel
        sink2 = Collector()
        speaker.speak("t2", "Still here.", TurnSettings("tone", MULAW_8K), sink2)
        await sink2.done.wait()
        assert isinstance(sink2.events[-1], TurnDone), sink2.kinds()
        assert len(sink.events) == n, "events for a cancelled turn reached the call"
        await pool.close()

    _run(body)


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)  # Kletso has no voice selection
def test_unknown_voice_is_a_turn_error_and_connection_survives(protocol: str) -> None:
    async def body(server: TtsServer) -> None:
        settings = _settings(server, protocol)
        pool = ProviderPool(settings)
        assert await pool.start()
        speaker = Speaker([pool])
        bad = Collector()
        speaker.speak("t1", "Hi.", TurnSettings("no-such-voice", MULAW_8K), bad)
        await bad.done.wait()
        assert isinstance(bad.events[-1], TurnFailed | ProviderFailed), bad.kinds()
        good = Collector()
        speaker.speak("t2", "Hi.", TurnSettings("tone", MULAW_8K), good)
        await good.done.wait()
        assert isinstance(good.events[-1], TurnDone), good.kinds()
        await pool.close()

    _run(body)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS)
def test_failover_to_next_provider_before_first_audio(protocol: str) -> None:
    async def body(server: TtsServer) -> None:
        dead = ProviderSettings("dead", "kova", "ws://127.0.0.1:9/nothing", voice="tone")
        dead_pool = ProviderPool(dead)
        live_pool = ProviderPool(_settings(server, protocol, "live"))
        assert await live_pool.start()
        speaker = Speaker([dead_pool, live_pool])
        sink = Collector()
        speaker.speak("t1", "Failover works.", TurnSettings("tone", MULAW_8K), sink)
        await sink.done.wait()
        assert isinstance(sink.events[-1], TurnDone), sink.kinds()
        assert speaker.failovers == 1
        assert sink.audio()
        await dead_pool.close()
        await live_pool.close()

    _run(body)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS)
def test_dropped_connection_mid_turn_ends_turn_with_error_and_pool_recovers(protocol: str) -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, protocol))
        pool.backoff.base_s = 0.01
        assert await pool.start()
        speaker = Speaker([pool])
        sink = Collector()
        speaker.open_turn("t1", TurnSettings("tone", MULAW_8K), sink)
        speaker.send_text("t1", " ".join(["word"] * 300))
        speaker.end_turn("t1")
        while not any(isinstance(e, AudioReceived) for e in sink.events):
            await asyncio.sleep(0.001)
        conn = pool.connections[0]
        assert conn.ws is not None
        conn.ws.transport.abort()  # the network drops the socket under the turn
        await sink.done.wait()
        assert isinstance(sink.events[-1], ProviderFailed), sink.kinds()
        # recovered: by a reconnect, or by the spare a one-turn protocol's pool opened
        # when the turn took its only connection
        while conn in pool.connections or not any(c.engine.ready for c in pool.connections):
            await asyncio.sleep(0.005)
        assert pool.reconnects >= 1 or pool.engine_cls.max_turns == 1
        again = Collector()
        speaker.speak("t2", "Back again.", TurnSettings("tone", MULAW_8K), again)
        await again.done.wait()
        assert isinstance(again.events[-1], TurnDone)
        await pool.close()

    _run(body)


def test_prompt_cache_replays_without_provider_round_trip() -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "kova"))
        assert await pool.start()
        cache = PromptCache(1 << 20)
        speaker = Speaker([pool], cache)
        first = Collector()
        speaker.speak("g1", "Welcome.", TurnSettings("tone", MULAW_8K), first, cacheable=True)
        await first.done.wait()
        await pool.close()  # the provider is gone: a cache hit must not need it
        second = Collector()
        speaker.speak("g2", "Welcome.", TurnSettings("tone", MULAW_8K), second, cacheable=True)
        assert second.done.is_set()
        assert second.audio() == first.audio()
        assert all(getattr(e, "turn_id", "g2") == "g2" for e in second.events)
        assert (cache.hits, cache.misses) == (1, 1)

    _run(body)


def test_many_turns_share_one_multiplexed_connection() -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "kova"))
        assert await pool.start()
        speaker = Speaker([pool])
        sinks = [Collector() for _ in range(8)]
        for i, s in enumerate(sinks):
            speaker.speak(f"t{i}", f"Turn number {i}.", TurnSettings("tone", MULAW_8K), s)
        await asyncio.gather(*(s.done.wait() for s in sinks))
        assert all(isinstance(s.events[-1], TurnDone) for s in sinks)
        assert len(pool.connections) == 1
        await pool.close()

    _run(body)


def test_one_turn_per_session_protocol_opens_more_connections() -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "kugelaudio"))
        assert await pool.start()
        speaker = Speaker([pool])
        sinks = [Collector() for _ in range(3)]
        for i, s in enumerate(sinks):
            speaker.speak(f"t{i}", f"Turn number {i}.", TurnSettings("tone", MULAW_8K), s)
        await asyncio.gather(*(s.done.wait() for s in sinks))
        assert all(isinstance(s.events[-1], TurnDone) for s in sinks), [s.kinds() for s in sinks]
        assert len(pool.connections) >= 2
        await pool.close()

    _run(body)


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
def test_idle_connections_are_closed_down_to_a_spare(
    protocol: str, cyclic_garbage: Callable[[], list[str]]
) -> None:
    """One turn per connection opens one per turn; once idle they are closed but the spare."""

    async def body(server: TtsServer) -> None:
        after_s = 0.3 * FACTOR
        pool = ProviderPool(
            _settings(server, protocol), turns_per_connection=1, close_idle_after_s=after_s
        )
        assert await pool.start()
        speaker = Speaker([pool])
        sinks = [Collector() for _ in range(4)]
        for i, s in enumerate(sinks):
            speaker.speak(f"t{i}", f"Turn number {i}.", TurnSettings("tone", MULAW_8K), s)
        await asyncio.gather(*(s.done.wait() for s in sinks))
        assert all(isinstance(s.events[-1], TurnDone) for s in sinks), [s.kinds() for s in sinks]
        opened = len(pool.connections)
        assert opened >= 4  # one per turn in progress, and the spare

        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT_S / 2
        cyclic_garbage()
        gc.disable()  # a closed connection must go by reference counting (no cycle)
        try:
            tasks = [c.task for c in pool.connections if c.task is not None]
            while len(pool.connections) > 1 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            closed = [t for t in tasks if all(c.task is not t for c in pool.connections)]
            await asyncio.wait(closed, timeout=TIMEOUT_S / 2)  # their tasks finish
            assert all(t.done() for t in closed)
            left = [name for name in cyclic_garbage() if name.endswith(".provider_ws.Connection")]
        finally:
            gc.enable()
        assert left == []
        assert len(pool.connections) == 1, [c.load() for c in pool.connections]
        assert pool.idle_closed == opened - 1
        assert pool.errors == {}  # closed politely: no connection counted as failed
        assert pool.reconnects == 0

        # the spare left takes the next turn at once, and a second one opens another
        again = [Collector() for _ in range(2)]
        for i, s in enumerate(again):
            speaker.speak(f"u{i}", "Once more.", TurnSettings("tone", MULAW_8K), s)
        await asyncio.gather(*(s.done.wait() for s in again))
        assert all(isinstance(s.events[-1], TurnDone) for s in again)
        await pool.close()

    _run(body)


def test_kletso_voice_session_answers_caller_audio_and_is_interrupted() -> None:
    import numpy as np

    from bridge.providers.kletso.client import VoiceEnded, VoiceInterrupted, VoiceStarted

    def speech_24k(seconds: float) -> bytes:
        t = np.arange(int(24000 * seconds)) / 24000
        wave = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 720), 1))
        return (wave * 6000).astype("<i2").tobytes()

    silence = bytes(2 * 24000)

    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "kletso"))
        events: list[Event] = []
        replied = asyncio.Event()
        ended = asyncio.Event()

        def sink(e: Event) -> None:
            events.append(e)
            if isinstance(e, AudioReceived):
                replied.set()
            if isinstance(e, VoiceEnded):
                ended.set()

        agent = await pool.open_agent(sink)
        assert agent.ready
        agent.start("vad")
        for piece in (speech_24k(1.0), silence):  # one caller utterance, then a pause
            for i in range(0, len(piece), 960 * 2):
                agent.send_audio(piece[i : i + 960 * 2])
        await replied.wait()
        assert any(isinstance(e, VoiceStarted) for e in events)
        reply = [e for e in events if isinstance(e, AudioReceived)]
        assert reply[0].audio_format == AudioFormat("pcm_s16le", 24000)
        # the caller talks over the reply: the agent interrupts itself
        agent.played("current", 200)
        for i in range(0, 24000 * 2, 960 * 2):
            agent.send_audio(speech_24k(1.0)[i : i + 960 * 2])
        while not any(isinstance(e, VoiceInterrupted) for e in events):
            await asyncio.sleep(0.005)
        agent.stop()
        await ended.wait()
        await agent.close()
        await pool.close()

    _run(body)


def test_zwst_pools_connections_per_voice_and_format() -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "zwst"))
        assert await pool.start()
        speaker = Speaker([pool])
        a, b = Collector(), Collector()
        speaker.speak("a", "Narrowband.", TurnSettings("tone", MULAW_8K), a)
        speaker.speak("b", "Wideband.", TurnSettings("tone", AudioFormat("pcm_s16le", 16000)), b)
        await asyncio.gather(a.done.wait(), b.done.wait())
        assert isinstance(a.events[-1], TurnDone) and isinstance(b.events[-1], TurnDone)
        assert a.formats() == {PCM_8K}
        assert b.formats() == {AudioFormat("pcm_s16le", 16000)}
        assert len({c.key for c in pool.connections}) == 2
        await pool.close()

    _run(body)


def test_zwst_slow_reader_is_closed_with_1008(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that stops reading: the server drops frames, then closes with 1008.

    Driven with websockets' sans-I/O client over a plain socket with a tiny
    receive buffer, so that "not reading" really backs up the server. The rule
    itself (how long over the limit) is the session engine's, tested with a fake
    clock (``tests/tts/zwst/test_zwst_server.py``); here it is shortened to 1 s:
    this checks that the shell feeds the backlog and fires the timer.
    """
    from bridge.providers.zwst import server as zwst

    monkeypatch.setattr(zwst, "SLOW_READER_CLOSE_S", 1.0)
    import json
    import socket

    from websockets.client import ClientProtocol
    from websockets.frames import Close
    from websockets.uri import parse_uri

    from bridge.io.session_http import http_request
    from bridge.providers.base import HttpRequest

    async def body(server: TtsServer) -> None:
        props = {"voice_id": "tone", "format": "pcm_s16le", "sample_rate": 24000}
        status, raw = await http_request(
            HttpRequest(
                "POST",
                f"http://127.0.0.1:{server.port}/v1/sessions",
                (("Content-Type", "application/json"),),
                json.dumps(props).encode(),
            )
        )
        assert status == 200, raw
        proto = ClientProtocol(parse_uri(json.loads(raw)["url"]), max_size=None)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", server.port))
        proto.send_request(proto.connect())
        for chunk in proto.data_to_send():
            await loop.sock_sendall(sock, chunk)
        while proto.state.name == "CONNECTING":
            proto.receive_data(await loop.sock_recv(sock, 65536))
        assert proto.state.name == "OPEN", proto.handshake_exc
        proto.events_received()
        text = " ".join(["reading"] * 500)  # within the server's 5000-character limit
        for _ in range(8):  # about 17 minutes of audio, queued at once
            msg = {"type": "synthesize", "context_id": "c1", "text": text}
            proto.send_text(json.dumps(msg).encode())
        proto.send_text(json.dumps({"type": "end", "context_id": "c1"}).encode())
        for chunk in proto.data_to_send():
            await loop.sock_sendall(sock, chunk)
        await asyncio.sleep(3 * FACTOR)  # stop reading for longer than SLOW_READER_CLOSE_S
        audio_frames = 0
        while True:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10 * FACTOR)
            if not data:
                break
            proto.receive_data(data)
            for frame in proto.events_received():
                if getattr(frame, "opcode", None) is not None and frame.opcode.name == "BINARY":
                    audio_frames += 1
        sock.close()
        assert proto.close_rcvd == Close(1008, "slow_reader")
        # ~1000 s of audio (25 000 frames of 40 ms) were asked for; with the queue
        # bounded, only what fit in the socket buffers before the drops got through
        assert 0 < audio_frames < 25_000 // 4

    async def main() -> None:
        server = await start_tts_server(engine="tone")
        try:
            await asyncio.wait_for(body(server), 40 * FACTOR)
        finally:
            await server.close()

    asyncio.run(main())


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
def test_provider_messages_are_written_at_once_without_a_task_each(protocol: str) -> None:
    """A message to the provider goes to the socket in the call that queued it, in order."""

    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, protocol))
        assert await pool.start()
        loop = asyncio.get_running_loop()
        created: list[object] = []
        real_create_task = loop.create_task

        def counting_create_task(coro: object, **kw: object) -> object:
            created.append(coro)
            return real_create_task(coro, **kw)  # type: ignore[arg-type]

        sinks = [Collector() for _ in range(4)]
        speaker = Speaker([pool])
        loop.create_task = counting_create_task  # type: ignore[method-assign,assignment]
        try:
            for i, sink in enumerate(sinks):
                settings = TurnSettings("tone", MULAW_8K)
                speaker.open_turn(f"t{i}", settings, sink)
                speaker.send_text(f"t{i}", "One two ")
                speaker.send_text(f"t{i}", "three.")
                speaker.end_turn(f"t{i}")
        finally:
            loop.create_task = real_create_task  # type: ignore[method-assign]
        sent = [c for c in pool.connections if c.ws is not None]
        assert created == [] or protocol == "kugelaudio"  # one session per turn: connects
        assert all(not c.outbox for c in sent)
        await asyncio.gather(*(s.done.wait() for s in sinks))
        for sink in sinks:
            assert isinstance(sink.events[-1], TurnDone), sink.kinds()
            assert len(sink.audio()) > 0
        await pool.close()

    _run(body)

"""Every provider protocol: the real client shell against the real ttsd, over loopback.

Deterministic ``tone`` engine; times are bounded by ``TIMEOUT_S`` (scaled by
``CALLBRIDGE_TEST_TIME_FACTOR`` on slow CI machines), never slept on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest

from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.tts_client import PromptCache, ProviderPool, Speaker
from bridge.io.ttsd_server import TtsServer, start_tts_server
from bridge.tts.base import (
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


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
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


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
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


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
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


@pytest.mark.parametrize("protocol", TTS_PROTOCOLS)
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


def test_dropped_connection_mid_turn_ends_turn_with_error_and_pool_recovers() -> None:
    async def body(server: TtsServer) -> None:
        pool = ProviderPool(_settings(server, "kova"))
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
        while pool.reconnects < 1 or not any(c.engine.ready for c in pool.connections):
            await asyncio.sleep(0.005)
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

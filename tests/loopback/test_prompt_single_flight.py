"""Prompts rendered once, against the real ttsd (``tone`` engine, syntheses counted).

Many calls (one ``Speaker`` each, as ``CallRunner`` makes them) asking for the same
cold prompt at once cause one synthesis, and every one of them hears the same audio;
a refused render plays the fallback prompt. Waits are bounded by ``TIMEOUT_S``
(scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``), never slept on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator

from bridge.engine import Event, LocalProtocolError
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.provider_pool import PromptCache, ProviderPool, Speaker
from bridge.io.ttsd_server import TtsServer, start_tts_server
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)
from bridge.providers.prompts import TurnFellBack
from bridge.ttsd.synth import SynthChunk, ToneEngine

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 20.0 * FACTOR
PROMPT = "Welcome to the demo line, press one for sales."  # one sentence: one synthesis


class CountingTone(ToneEngine):
    """The tone engine, counting the syntheses it starts (shared by its rate variants)."""

    def __init__(self, native_rate_hz: int = 24000, counts: list[str] | None = None) -> None:
        super().__init__(native_rate_hz)
        self.texts: list[str] = [] if counts is None else counts

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        return CountingTone(sample_rate_hz, self.texts)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        self.texts.append(text)
        return super().synthesize(text, voice, speed)


class Turn:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.done.set()

    def audio(self) -> bytes:
        return b"".join(e.audio for e in self.events if isinstance(e, AudioReceived))


def _run(body: Callable[[TtsServer, CountingTone], Awaitable[None]]) -> None:
    async def main() -> None:
        engine = CountingTone()
        server = await start_tts_server(engine=engine)
        try:
            await asyncio.wait_for(body(server, engine), TIMEOUT_S)
        finally:
            await server.close()

    asyncio.run(main())


def _pool(server: TtsServer) -> ProviderPool:
    url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS['kova']}"
    return ProviderPool(ProviderSettings("local", "kova", url, api_key="k", voice="tone"))


def test_a_hundred_calls_asking_for_one_cold_prompt_cause_one_synthesis() -> None:
    async def body(server: TtsServer, engine: CountingTone) -> None:
        pool = _pool(server)
        assert await pool.start()
        cache = PromptCache()
        turns = [Turn() for _ in range(100)]
        for turn in turns:  # a hundred calls' greetings, in the same loop iteration
            Speaker([pool], cache).speak(
                "greeting", PROMPT, TurnSettings("tone", MULAW_8K), turn, cacheable=True
            )
        await asyncio.gather(*(t.done.wait() for t in turns))
        assert engine.texts == [PROMPT]
        assert (cache.renders, cache.joins) == (1, 99)
        first = turns[0].audio()
        assert len(first) > 8000  # seconds of audio, not an empty turn
        assert all(t.audio() == first for t in turns)
        assert all(isinstance(t.events[-1], TurnDone) for t in turns)
        await pool.close()

    _run(body)


def test_a_call_joining_mid_render_hears_the_prompt_from_its_start() -> None:
    async def body(server: TtsServer, engine: CountingTone) -> None:
        pool = _pool(server)
        assert await pool.start()
        cache = PromptCache()
        first, second = Turn(), Turn()
        settings = TurnSettings("tone", MULAW_8K)
        late = Speaker([pool], cache)
        heard_at_join: list[bytes] = []

        def first_sink(event: Event) -> None:
            first(event)
            if isinstance(event, AudioReceived) and not heard_at_join:
                # the second call arrives just after the first's first audio
                late.speak("greeting", PROMPT, settings, second, cacheable=True)
                heard_at_join.append(second.audio())

        Speaker([pool], cache).speak("greeting", PROMPT, settings, first_sink, cacheable=True)
        await asyncio.gather(first.done.wait(), second.done.wait())
        assert engine.texts == [PROMPT] and cache.joins == 1
        first_chunk = next(e.audio for e in first.events if isinstance(e, AudioReceived))
        assert heard_at_join == [first_chunk]  # the start of the audio, at once
        assert second.audio() == first.audio() and len(first.audio()) > 8000
        await pool.close()

    _run(body)


def test_the_leaders_call_hanging_up_does_not_stop_the_render() -> None:
    async def body(server: TtsServer, engine: CountingTone) -> None:
        pool = _pool(server)
        assert await pool.start()
        cache = PromptCache()
        leader, follower = Turn(), Turn()
        settings = TurnSettings("tone", MULAW_8K)
        lead = Speaker([pool], cache)
        lead.speak("greeting", PROMPT, settings, leader, cacheable=True)
        Speaker([pool], cache).speak("greeting", PROMPT, settings, follower, cacheable=True)
        lead.cancel("greeting")  # the leader's caller hung up
        await follower.done.wait()
        assert leader.events == []
        assert isinstance(follower.events[-1], TurnDone) and len(follower.audio()) > 8000
        assert engine.texts == [PROMPT]
        assert len(cache) == 1  # the render went on to fill the cache
        await pool.close()

    _run(body)


class _RefusingPool:
    """A provider whose engine refuses every turn (a full queue, a closing connection)."""

    def __init__(self) -> None:
        self.settings = ProviderSettings("down", "kova", "ws://127.0.0.1:9/", voice="tone")
        self.name = "down"
        self.prompt_identity: str | None = None
        self.opened = 0

    def open_turn(self, *args: object) -> object:
        self.opened += 1
        raise LocalProtocolError("no free context")


def test_a_refused_render_plays_the_cached_fallback_prompt() -> None:
    async def body(server: TtsServer, engine: CountingTone) -> None:
        pool = _pool(server)
        assert await pool.start()
        cache = PromptCache()
        fallback = "Sorry, we cannot say that right now."
        settings = TurnSettings("tone", MULAW_8K)
        warm = Turn()  # the fallback prompt, rendered as the daemon does at start-up
        Speaker([pool], cache).speak("warm", fallback, settings, warm, cacheable=True)
        await warm.done.wait()
        down = _RefusingPool()
        # the route's provider is down; the fallback was rendered on it before it went
        # down, which is what the cache key says: simulate with the same identity
        down.settings = pool.settings
        down.name = pool.name
        heard = Turn()
        speaker = Speaker([down], cache, fallback, "tone")  # type: ignore[list-item]
        speaker.speak("menu", "Press two for support.", settings, heard, cacheable=True)
        assert down.opened == 2  # the render and its one retry, both refused at once
        kinds = [type(e) for e in heard.events]
        assert kinds[0] is TurnFellBack and kinds[-1] is TurnDone
        fell = heard.events[0]
        assert isinstance(fell, TurnFellBack) and fell.kind == "open_refused"
        assert heard.audio() == warm.audio() and heard.audio()  # no silence: the fallback
        assert {getattr(e, "turn_id", "") for e in heard.events} == {"menu"}
        assert speaker.fallbacks == 1 and engine.texts == [fallback]
        # a streamed (not cacheable) turn falls back the same way
        streamed = Turn()
        speaker.open_turn("app-1", settings, streamed)
        assert type(streamed.events[0]) is TurnFellBack and streamed.audio() == warm.audio()
        await pool.close()

    _run(body)


def test_without_a_cached_fallback_a_refused_turn_fails_as_before() -> None:
    down = _RefusingPool()
    cache = PromptCache()
    failed: list[Event] = []
    speaker = Speaker([down], cache, "Sorry.", "tone")  # type: ignore[list-item]
    speaker.speak("menu", "Press two.", TurnSettings("tone", MULAW_8K), failed.append, True)
    assert [type(e) for e in failed] == [TurnFailed] and speaker.fallbacks == 0


class _FeedPool:
    """A provider whose turn events the test feeds by hand."""

    def __init__(self) -> None:
        self.settings = ProviderSettings("p", "kova", "ws://127.0.0.1:9/", voice="tone")
        self.name = "p"
        self.prompt_identity: str | None = None
        self.sinks: list[Callable[[Event], None]] = []

    def open_turn(self, turn_id: str, settings: object, sink: Callable[[Event], None]) -> object:
        self.sinks.append(sink)

        class _Handle:
            def send_text(self, text: str) -> None:
                pass

            def end(self) -> None:
                pass

        return _Handle()


class _Call:
    """Stands for the call runner a turn's sink belongs to."""

    def sink(self, event: Event) -> None:
        pass


def test_a_finished_or_cancelled_prompt_turn_is_freed_by_reference_counting() -> None:
    import gc
    import weakref

    pool, cache = _FeedPool(), PromptCache()
    gc.disable()
    try:
        calls = [_Call(), _Call()]
        refs = [weakref.ref(c) for c in calls]
        speakers = [Speaker([pool], cache) for _ in calls]  # type: ignore[list-item]
        for speaker, call in zip(speakers, calls, strict=True):
            speaker.speak("greeting", PROMPT, TurnSettings("tone", MULAW_8K), call.sink, True)
        speakers[1].cancel("greeting")  # one caller hangs up mid-render
        (render,) = pool.sinks
        render(AudioReceived("w", b"\x01" * 160, MULAW_8K))
        render(TurnDone("w"))
        del calls, speakers, speaker, call
        assert [r() for r in refs] == [None, None]  # no cycle kept either call
    finally:
        gc.enable()

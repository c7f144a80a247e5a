"""A plain audio message goes from the engine to its turn (``Connection._on_message``).

Every message goes through the engine's one receive contract and one pump;
the connection hands a turn's audio and word timings to the turn's audio and
words sinks. These drive a real ``ProviderPool``/``Speaker`` over a
socket that writes nowhere and check that the call's sink sees the same
events: its own turn id, the order of audio, word
timings and the end, a cancelled turn's audio dropped, a cacheable turn's
audio recorded for the prompt cache.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

from provider_socket import open_provider_socket

from bridge.engine import Event
from bridge.io.provider_pool import PromptCache, ProviderPool, Speaker
from bridge.io.provider_ws import Connection
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderSettings,
    TurnDone,
    TurnSettings,
    WordsTimed,
    WordTiming,
)

URL = "ws://127.0.0.1:9/v1/kova"


def kova_pool() -> tuple[ProviderPool, Connection]:
    """A pool with one ready Kova connection whose socket writes nowhere."""
    settings = ProviderSettings("p", "kova", URL, api_key="k", voice="v")
    pool = ProviderPool(settings)
    conn = Connection(pool, pool.engine_cls(settings))
    pool.connections.append(conn)
    conn.ws = open_provider_socket(conn._on_message, URL)
    conn.early = None
    conn.engine.connection_made(None, conn.now())
    conn.pump()
    return pool, conn


def frame(body: dict[str, object], context_id: str = "c1") -> str:
    return json.dumps({**body, "context_id": context_id}, separators=(",", ":"))


def chunk(data: bytes, context_id: str = "c1") -> str:
    return frame({"audio_chunk": base64.b64encode(data).decode()}, context_id)


STAMPS = {"timestamps": {"words": ["hi"], "start_seconds": [0.0], "end_seconds": [0.2]}}


def run(body: Callable[[], None]) -> None:
    async def main() -> None:
        body()

    asyncio.run(main())


def count_pumps(conn: Connection) -> list[int]:
    pumps = [0]
    pump = conn.pump

    def counted() -> None:
        pumps[0] += 1
        pump()

    conn.pump = counted  # type: ignore[method-assign]
    return pumps


def test_plain_audio_reaches_the_turn_with_one_pump_per_message_and_in_order() -> None:
    def body() -> None:
        pool, conn = kova_pool()
        events: list[Event] = []
        Speaker([pool]).speak("greeting", "hello", TurnSettings("v", MULAW_8K), events.append)
        conn._on_message(frame({"context_started": {}}))
        pumps = count_pumps(conn)
        conn._on_message(chunk(b"\x01\x02"))
        conn._on_message(chunk(b"\x03"))
        conn._on_message(frame(STAMPS))
        conn._on_message(chunk(b"\x04"))
        assert pumps == [4]  # one receive contract: every message is pumped once
        conn._on_message(frame({"flush_completed": True, "flush_id": "f1"}))
        assert pumps == [5]
        kinds = [type(e).__name__ for e in events]
        assert kinds == [
            "TurnStarted",
            "AudioReceived",
            "AudioReceived",
            "WordsTimed",
            "AudioReceived",
            "TurnDone",
        ]
        audio = [e for e in events if isinstance(e, AudioReceived)]
        assert audio == [
            AudioReceived("greeting", b"\x01\x02", MULAW_8K),
            AudioReceived("greeting", b"\x03", MULAW_8K),
            AudioReceived("greeting", b"\x04", MULAW_8K),
        ]
        assert isinstance(events[3], WordsTimed) and events[3].turn_id == "greeting"
        assert events[-1] == TurnDone("greeting")
        assert conn.sinks == {} and conn.audio_sinks == {}  # the finished turn is forgotten

    run(body)


def test_a_cancelled_turn_gets_no_more_audio() -> None:
    def body() -> None:
        pool, conn = kova_pool()
        events: list[Event] = []
        speaker = Speaker([pool])
        speaker.open_turn("t1", TurnSettings("v", MULAW_8K), events.append)
        speaker.send_text("t1", "hello")
        conn._on_message(frame({"context_started": {}}))
        conn._on_message(chunk(b"\x01"))
        speaker.cancel("t1")
        conn._on_message(chunk(b"\x02"))
        assert [e for e in events if isinstance(e, AudioReceived)] == [
            AudioReceived("t1", b"\x01", MULAW_8K)
        ]
        assert conn.audio_sinks == {}

    run(body)


def test_audio_of_a_turn_the_speaker_dropped_is_not_delivered() -> None:
    """The turn's direct sinks check the Speaker still holds the turn (as ``_on_event`` does)."""

    def body() -> None:
        pool, conn = kova_pool()
        events: list[Event] = []
        speaker = Speaker([pool])
        speaker.open_turn("t1", TurnSettings("v", MULAW_8K), events.append)
        conn._on_message(frame({"context_started": {}}))
        speaker.turns.clear()
        conn._on_message(chunk(b"\x01"))
        conn._on_message(frame(STAMPS))
        assert [type(e).__name__ for e in events] == ["TurnStarted"]

    run(body)


def test_a_cacheable_turn_records_its_audio_for_the_cache() -> None:
    def body() -> None:
        pool, conn = kova_pool()
        cache = PromptCache()
        events: list[Event] = []
        speaker = Speaker([pool], cache)
        speaker.speak("menu", "press one", TurnSettings("v", MULAW_8K), events.append, True)
        conn._on_message(frame({"context_started": {}}))
        conn._on_message(chunk(b"\x01\x02"))
        conn._on_message(frame(STAMPS))
        conn._on_message(frame({"flush_completed": True, "flush_id": "f1"}))
        kinds = [type(e).__name__ for e in events]
        assert kinds == ["TurnStarted", "AudioReceived", "WordsTimed", "TurnDone"]
        replayed: list[Event] = []
        speaker.speak("menu2", "press one", TurnSettings("v", MULAW_8K), replayed.append, True)
        assert cache.hits == 1
        assert [e for e in replayed if isinstance(e, AudioReceived)] == [
            AudioReceived("menu2", b"\x01\x02", MULAW_8K)
        ]
        assert [type(e).__name__ for e in replayed] == kinds[1:]

    run(body)


def test_a_turn_opened_on_the_pool_without_an_audio_sink_gets_audio_as_events() -> None:
    def body() -> None:
        pool, conn = kova_pool()
        events: list[Any] = []
        handle = pool.open_turn("t1", TurnSettings("v", MULAW_8K), events.append)
        handle.send_text("hello")
        conn._on_message(frame({"context_started": {}}))
        conn._on_message(chunk(b"\x07"))
        assert events[-1] == AudioReceived("t1", b"\x07", MULAW_8K)
        conn._on_message(frame(STAMPS))
        assert events[-1] == WordsTimed("t1", (WordTiming("hi", 0.0, 0.2),))

    run(body)

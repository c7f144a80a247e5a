"""Two calls may number their turns alike: a shared provider connection keeps them apart."""

from __future__ import annotations

import asyncio

from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.provider_pool import ProviderPool
from bridge.io.ttsd_server import start_tts_server
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)


def test_two_owners_open_the_same_turn_id_on_one_connection() -> None:
    async def main() -> dict[str, list[Event]]:
        server = await start_tts_server(engine="tone")
        url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS['kova']}"
        pool = ProviderPool(ProviderSettings("p", "kova", url, api_key="k", voice="tone"))
        assert await pool.start()
        seen: dict[str, list[Event]] = {"a": [], "b": []}
        done = {k: asyncio.Event() for k in seen}

        def sink_for(owner: str) -> object:
            def sink(e: Event) -> None:
                seen[owner].append(e)
                if isinstance(e, TurnDone | TurnFailed):
                    done[owner].set()

            return sink

        handles = []
        for owner, text in (("a", "alpha bravo"), ("b", "charlie delta echo")):
            h = pool.open_turn("greeting", TurnSettings("tone", MULAW_8K), sink_for(owner))  # type: ignore[arg-type]
            h.send_text(text)
            h.end()
            handles.append(h)
        await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done.values())), 10)
        assert len(pool.connections) == 1
        await pool.close()
        await server.close()
        return seen

    seen = asyncio.run(main())
    for events in seen.values():
        assert any(isinstance(e, AudioReceived) for e in events)
        assert isinstance(events[-1], TurnDone)
        assert {getattr(e, "turn_id", "greeting") for e in events} == {"greeting"}
    audio_a = sum(len(e.audio) for e in seen["a"] if isinstance(e, AudioReceived))
    audio_b = sum(len(e.audio) for e in seen["b"] if isinstance(e, AudioReceived))
    assert audio_b > audio_a  # each owner got its own text's audio (three words vs two)


def test_turns_cancelled_but_not_yet_released_by_the_server_leave_no_room() -> None:
    """A Kova context stays held until the server confirms its cancel; a connection full of
    such contexts has no room, so the next turn goes to another connection instead of
    failing with "no free context" (which ended the call)."""

    async def main() -> tuple[int, list[Event]]:
        server = await start_tts_server(engine="tone")
        url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS['kova']}"
        pool = ProviderPool(ProviderSettings("p", "kova", url, api_key="k", voice="tone"))
        assert await pool.start()
        settings = TurnSettings("tone", MULAW_8K)
        events: list[Event] = []
        next_ended = asyncio.Event()

        def next_sink(e: Event) -> None:
            events.append(e)
            if isinstance(e, TurnDone | TurnFailed):
                next_ended.set()

        full = [
            pool.open_turn(f"t{i}", settings, events.append)  # type: ignore[arg-type]
            for i in range(64)
        ]
        for h in full:
            h.send_text("alpha bravo charlie")
        for h in full:
            h.cancel()  # released by the server later, not now
        nxt = pool.open_turn("next", settings, next_sink)  # type: ignore[arg-type]
        nxt.send_text("delta")
        nxt.end()
        await asyncio.wait_for(next_ended.wait(), 5)
        connections = len(pool.connections)
        await pool.close()
        await server.close()
        return connections, [e for e in events if getattr(e, "turn_id", "") == "next"]

    connections, nxt = asyncio.run(main())
    assert connections >= 1
    assert any(isinstance(e, AudioReceived) for e in nxt)
    assert isinstance(nxt[-1], TurnDone)

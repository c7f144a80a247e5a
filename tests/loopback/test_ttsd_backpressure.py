"""``callbridge tts-server`` makes no more audio while its client does not read.

A client that stops reading must hold back the synthesis (its audio waits in
the socket, not in an unbounded write buffer of ours), and the audio must all
come once it reads again. Real loopback sockets, the ``tone`` engine; every
wait is bounded by ``TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

from websockets.asyncio.client import connect

from bridge.io.ttsd_server import start_tts_server
from bridge.ttsd.synth import SynthChunk, ToneEngine

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 20.0 * FACTOR
WORDS = 600  # about 100 s of 24 kHz PCM: ~6 MB of base64, more than the sockets buffer


class CountingTone(ToneEngine):
    """The tone engine, counting the chunks (one per word) it has produced."""

    def __init__(self, native_rate_hz: int = 24000, counter: list[int] | None = None) -> None:
        super().__init__(native_rate_hz)
        self.counter = [0] if counter is None else counter

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        return CountingTone(sample_rate_hz, self.counter)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        for chunk in super().synthesize(text, voice, speed):
            self.counter[0] += 1
            yield chunk


async def _settled(counter: list[int]) -> int:
    """The count once it has not moved for 0.3 s (scaled: the job is held, or done)."""
    last, still = -1, 0
    while still < 6:
        await asyncio.sleep(0.05 * FACTOR)
        still = still + 1 if counter[0] == last else 0
        last = counter[0]
    return last


def test_a_client_that_does_not_read_holds_the_synthesis_back() -> None:
    async def main() -> None:
        engine = CountingTone()
        server = await start_tts_server(engine=engine)
        try:
            url = f"ws://127.0.0.1:{server.port}/v1/ws/kova?api_key=k"
            # max_queue: websockets stops reading the socket after 4 unread messages
            async with connect(url, max_queue=4, max_size=1 << 22) as ws:
                fmt = {"encoding": "pcm", "sample_rate": 24000}
                start = {"voice_id": "tone", "model_id": "default", "response_format": fmt}
                await ws.send(json.dumps({"start_context": start, "context_id": "c1"}))
                text = " ".join(["word"] * WORDS)
                await ws.send(json.dumps({"send_text": text, "context_id": "c1"}))
                await ws.send(json.dumps({"flush": True, "context_id": "c1", "flush_id": "f"}))
                held = await asyncio.wait_for(_settled(engine.counter), TIMEOUT_S)
                assert 0 < held < WORDS, f"{held} of {WORDS} chunks made while nothing was read"
                audio_chunks, done = 0, False
                while not done:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                    audio_chunks += "audio_chunk" in msg
                    done = "flush_completed" in msg or "error" in msg
                assert "error" not in msg
                assert engine.counter[0] == WORDS
                assert audio_chunks >= WORDS
        finally:
            await server.close()

    asyncio.run(main())

"""Text pacing through the daemon: a long turn reaches each TTS protocol a sentence at a
time while it plays, and the caller hears all of it. (Kletso, a voice agent, answers a
turn's text once it is complete: pacing is off for it by default, tests/config.)

The real daemon, the reference TTS server (tone engine) for each protocol, a media-stream
call and an application; what the daemon sends the provider is recorded at the Speaker.
Timings are bounded by timeouts scaled with CALLBRIDGE_TEST_TIME_FACTOR.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bridge.io import provider_pool

from .harness import FACTOR, AppServer, TwilioCall, app_route, stack, tone_turn_ms

SENTENCES = [f"Sentence {word} has five words. " for word in ("one", "two", "three", "four")]
TEXT = "".join(SENTENCES)
PROVIDER_AHEAD = "text_ahead_s = 0.5"


@pytest.mark.parametrize("protocol", ["kova", "kugelaudio", "coda", "zwst"])
def test_a_long_turn_reaches_the_provider_in_sentences_and_is_heard_whole(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[float, str]] = []
    send_text = provider_pool.Speaker.send_text

    def recording(self: provider_pool.Speaker, turn_id: str, text: str) -> None:
        if turn_id == "long":
            sent.append((time.monotonic(), text))
        send_text(self, turn_id, text)

    monkeypatch.setattr(provider_pool.Speaker, "send_text", recording)

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "long", "text": TEXT, "final": True}]
            async with (
                stack(app_route(app.url), protocol=protocol, provider_extra=PROVIDER_AHEAD) as st,
                TwilioCall(st.ms_port),
            ):
                assert st.config.provider("main").text_ahead_s == 0.5
                finished = await app.wait_for("turn.finished", timeout_s=30)
                assert finished["turn_id"] == "long"
                # every word heard, in order, and the turn's whole length played
                assert finished["heard_text"] == TEXT.strip()
                assert abs(int(finished["heard_ms"]) - tone_turn_ms(TEXT)) <= 80  # type: ignore[call-overload]

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))
    assert "".join(text for _, text in sent) == TEXT
    assert [text for _, text in sent] == SENTENCES
    # the last sentence went out once the first ones had played, not with them
    assert sent[-1][0] - sent[0][0] >= 0.5 * tone_turn_ms("".join(SENTENCES[:2])) / 1000

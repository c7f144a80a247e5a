"""bench/bench_ttsd.py's per-request figures: first audio, real-time factor, the longest gap."""

from __future__ import annotations

import asyncio

from bench.bench_ttsd import Request
from bridge.providers.base import PCM_8K, AudioReceived, TurnDone

ONE_S = b"\0\0" * 8000  # one second of 8 kHz PCM


def _request(arrivals: list[tuple[float, int]]) -> Request:
    """A request opened at 10.0 s whose chunks of ``seconds`` of audio came at ``t``."""

    async def make() -> Request:  # the request's done flag is an asyncio.Event
        req = Request(opened=10.0)
        for t, seconds in arrivals:
            req.received(AudioReceived("t", ONE_S * seconds, PCM_8K), t)
        req.received(TurnDone("t"), arrivals[-1][0])
        return req

    return asyncio.run(make())


def test_audio_ahead_of_playout_has_no_gap() -> None:
    fig = _request([(10.2, 1), (10.9, 2), (12.5, 1)]).figures()
    assert fig["result"] == "TurnDone"
    assert fig["ttfa_s"] == 0.2 and fig["audio_s"] == 4.0
    assert fig["gap_s"] == 0.0  # 2nd chunk due at 11.2, 3rd at 13.2: both early
    assert fig["rtf"] == round(2.5 / 4.0, 3)


def test_a_chunk_later_than_the_audio_before_it_is_a_gap() -> None:
    # played from 10.2: one second, so the next chunk is due at 11.2; it came at 11.7
    fig = _request([(10.2, 1), (11.7, 1), (12.0, 1)]).figures()
    assert fig["gap_s"] == 0.5

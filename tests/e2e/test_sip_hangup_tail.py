"""A flow that hangs up right after speaking: the BYE leaves after the goodbye has had time
to play out of the phone's jitter buffer (issue 31, docs/sip.md).

The daemon keeps the line up ``HANGUP_TAIL_S`` (300 ms: the last frame's 20 ms and a
280 ms jitter-buffer allowance) after the goodbye's last frame, sending comfort silence,
then sends BYE. Asserted as what the caller receives, in order: every frame of the
goodbye, then comfort frames, then the BYE.
"""

from __future__ import annotations

import asyncio

from bridge.io.caller import CallerOptions, place_call
from bridge.io.callrun import HANGUP_TAIL_S
from bridge.ttsd.synth import TONE_GAP_S, ToneEngine, split_words

from .harness import FACTOR, TwilioCall, stack

GOODBYE = "Goodbye and thanks for calling."
FLOW = f"""
[[routes]]
match = "*"
provider = "main"
flow = "bye"

[flows.bye]
start = "bye"

[flows.bye.steps.bye]
say = "{GOODBYE}"
hangup = true
"""
FRAME_S = 0.020
SPEECH_DBFS = -50.0


def test_the_bye_follows_the_goodbye_and_a_tail_of_comfort_frames() -> None:
    words = split_words(GOODBYE)
    engine = ToneEngine(8000)
    trailing_gap_frames = round(TONE_GAP_S / FRAME_S)  # the turn's own end: its last gap
    tail_frames = round(HANGUP_TAIL_S / FRAME_S)

    async def body() -> None:
        async with stack(FLOW) as s:
            opts = CallerOptions(target=f"sip:bye@127.0.0.1:{s.sip_port}", duration_s=10.0)
            result = await asyncio.wait_for(place_call(opts), 30 * FACTOR)
        rec = result.recording
        assert rec.ended_by == "remote-bye"  # the daemon hung up, well before our 10 s
        frames = rec.frames
        speech = [i for i, f in enumerate(frames) if f.level_dbfs > SPEECH_DBFS]
        # Every word of the goodbye arrived before the BYE (a word's tone is whole frames
        # give or take the one it starts or ends in).
        word_frames = sum(engine.word_duration_s(w) / FRAME_S for w in words)
        assert abs(len(speech) - word_frames) <= len(words)
        # After its last word: the turn's trailing gap, then the tail's comfort frames, and
        # only then the BYE. 15 are due; a loop that slips under load skips some, never all.
        after = len(frames) - 1 - speech[-1]
        assert after - trailing_gap_frames >= tail_frames // 3, (after, trailing_gap_frames)
        assert all(f.level_dbfs <= SPEECH_DBFS for f in frames[speech[-1] + 1 :])
        assert all(f.at_s <= rec.ended_at_s for f in frames)

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


def test_a_media_stream_call_closes_only_after_the_goodbye_played() -> None:
    """The media-stream leg needs no tail: a turn there finishes when the carrier echoes
    its last mark (the audio has played), so the flow's hang-up follows the playout."""

    async def body() -> None:
        async with stack(FLOW) as st, TwilioCall(st.ms_port) as call:
            await asyncio.wait_for(call.closed.wait(), 30 * FACTOR)
            closed_at = call.now()
            carrier = call.carrier
            assert carrier.errors() == []
            echoes = carrier.marks_echoed()
            assert echoes and not any(m.cleared for m in echoes)
            # nothing of the goodbye was left in the carrier's buffer when the daemon closed
            assert carrier.buffered_ms(closed_at) == 0
            played_frames = len(carrier.played_audio()) // 160
            word_frames = sum(ToneEngine(8000).word_duration_s(w) for w in split_words(GOODBYE))
            assert played_frames >= word_frames / FRAME_S

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

"""A route whose provider is a ``kletso`` voice agent (issue 31): the call is the agent's
conversation. Its replies are played, the caller's audio goes up as on a ``voice_agent``
flow step, and a barge-in stops playout and tells the agent what was played
(``voice.played``, seed 002).

The daemon runs in-process against the real ttsd's Kletso session with the tone engine
(it answers ``voice.text`` with "You wrote: ..." and caller speech with "I heard you
speak for N seconds."); the caller is ``callbridge call``'s SIP UAC. Waits are bounded
and scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``; the assertions are on what was heard and
sent, in order.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bridge.control.report import build_report
from bridge.engine import SendText
from bridge.io.caller import CallerOptions, CallResult, SpeakClip, place_call
from bridge.providers.kletso.client import KletsoProtocol
from telcodec import g711

from .harness import FACTOR, speech_mulaw, stack, tone_turn_ms

GREETING = "Hello from the agent route."
LONG_GREETING = " ".join(f"word{i}" for i in range(40)) + "."
SPEECH_DBFS = -50.0
FRAME_S = 0.020


def route(greeting: str) -> str:
    return f"""
[[routes]]
match = "*"
provider = "main"
greeting = "{greeting}"
"""


async def call(greeting: str, speak_at_s: float, speak_s: float, duration_s: float) -> CallResult:
    speech = g711.ulaw_decode(speech_mulaw(speak_s))
    async with stack(route(greeting), protocol="kletso") as s:
        opts = CallerOptions(
            target=f"sip:agent@127.0.0.1:{s.sip_port}",
            speak=(SpeakClip("speech", speak_at_s, speech),),
            duration_s=duration_s,
        )
        return await asyncio.wait_for(place_call(opts), (duration_s + 30) * FACTOR)


def speech_frames(result: CallResult, after_s: float = 0.0) -> int:
    """Frames heard at or above the speech level, arriving ``after_s`` after the answer."""
    rec = result.recording
    assert rec.answered_at_s is not None
    return sum(
        1
        for f in rec.frames
        if f.level_dbfs > SPEECH_DBFS and f.at_s - rec.answered_at_s >= after_s
    )


def test_the_greeting_is_played_and_the_caller_is_answered_by_the_agent() -> None:
    """The greeting goes to the agent as ``voice.text`` in the caller's session; after it,
    the caller's speech goes up and the agent's spoken answer is played."""
    greeting_s = tone_turn_ms(f"You wrote: {GREETING}") / 1000
    answer_s = tone_turn_ms("I heard you speak for 1.0 seconds.") / 1000
    speak_at_s = greeting_s + 2.0 * FACTOR  # after the greeting, with room for a slow start
    duration_s = speak_at_s + 1.0 + 0.6 + answer_s + 1.5 * FACTOR
    result = asyncio.run(call(GREETING, speak_at_s, 1.0, duration_s))
    report = build_report(result.recording)
    assert report.answered and report.protocol_errors == ()
    greeting_heard = speech_frames(result) - speech_frames(result, after_s=speak_at_s)
    # the greeting, whole: its words are most of its frames (the rest are its gaps)
    assert greeting_heard >= 0.6 * greeting_s / FRAME_S, greeting_heard
    # the answer to the caller's speech: only an agent that heard the caller speaks it
    answered = speech_frames(result, after_s=speak_at_s + 1.0)
    assert answered >= 0.6 * answer_s / FRAME_S, (answered, answer_s)


def test_a_barge_in_stops_playout_and_tells_the_agent_what_was_played(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reports: list[int] = []
    original = KletsoProtocol.cancel

    def cancel(self: KletsoProtocol, turn_id: str, now: float) -> None:
        before = len(self._actions)
        original(self, turn_id, now)
        for action in self._actions[before:]:
            if isinstance(action, SendText):
                frame: dict[str, Any] = json.loads(action.text)
                if frame["type"] == "voice.played":
                    reports.append(int(frame["ms"]))

    monkeypatch.setattr(KletsoProtocol, "cancel", cancel)
    greeting_s = tone_turn_ms(f"You wrote: {LONG_GREETING}") / 1000
    speak_at_s = 2.0 * FACTOR  # once the greeting plays, with room for a slow start
    assert greeting_s > speak_at_s + 2.0  # the caller talks over the greeting
    result = asyncio.run(call(LONG_GREETING, speak_at_s, 1.0, speak_at_s + 2.0))
    report = build_report(result.recording)
    assert report.answered and report.protocol_errors == ()
    (barge,) = report.barge_ins
    assert barge.outcome == "stopped", barge
    # playout stopped: from the stop until the caller's speech ended, nothing was heard
    assert barge.stopped_s is not None and barge.stopped_s < speak_at_s + 1.0
    assert speech_frames(result, after_s=barge.stopped_s + 0.1) <= speech_frames(
        result, after_s=speak_at_s + 1.0
    )
    # and the agent was told how much of its reply was played: one report, at the cut
    assert len(reports) == 1, reports
    (played_ms,) = reports
    assert 0 < played_ms <= 1000 * (speak_at_s + 0.5), played_ms

"""CallBridge early media (issue 34): the turn source's ``Answer``/``Reject`` decide once,
else the first turn's end or the cap applies the route's rule; outside early media both
are refused and change nothing."""

from __future__ import annotations

import pytest
from call_harness import SIP, Harness, of_type, tone_ulaw_frames

from bridge.commands import (
    Answer,
    CallEnded,
    Command,
    CommandRejected,
    Hangup,
    Reject,
    TurnFinished,
    TurnInterrupted,
)
from bridge.media.call_types import AnswerLeg, HangupLeg, RejectLeg

RULE_GREETING = AnswerLeg()
RULE_ONLY = RejectLeg(480)


def playing(then: AnswerLeg | RejectLeg = RULE_GREETING) -> Harness:
    """A SIP call in early media whose first turn ``t1`` (10 frames) is sounding."""
    h = Harness(SIP)
    h.call.early_media(then, 0.0)
    assert h.call.in_early_media
    h.say("t1")
    h.frames("t1", tone_ulaw_frames(10), now=0.01)
    h.done("t1", now=0.01)
    for n in range(1, 4):
        h.tick(n)
    h.take()
    return h


def play_out(h: Harness) -> list[object]:
    """Tick to the turn's end; what the bridge queued meanwhile."""
    for n in range(4, 14):
        h.tick(n)
    actions, events = h.take()
    return [*actions, *events]


@pytest.mark.parametrize("then", [RULE_GREETING, RULE_ONLY])
def test_without_a_decision_the_first_turns_end_applies_the_route_rule(
    then: AnswerLeg | RejectLeg,
) -> None:
    h = playing(then)
    out = play_out(h)
    assert of_type(out, TurnFinished) and [a for a in out if a == then] == [then]
    assert not h.call.in_early_media
    h.say("t2")  # the second turn's end decides nothing
    h.frames("t2", tone_ulaw_frames(2), now=0.3)
    h.done("t2", now=0.3)
    for n in range(14, 20):
        h.tick(n)
    actions, _ = h.take()
    assert not of_type(actions, AnswerLeg) and not of_type(actions, RejectLeg)


def test_answer_during_early_media_answers_now_and_the_turn_goes_on() -> None:
    h = playing(RULE_ONLY)
    h.call.execute(Answer(), 0.07)
    actions, events = h.take()
    assert actions == [AnswerLeg()] and events == []
    assert not h.call.in_early_media
    out = play_out(h)  # the turn plays to its end; its end decides nothing now
    assert of_type(out, TurnFinished) == [TurnFinished("t1", 200, "")]
    assert not of_type(out, AnswerLeg) and not of_type(out, RejectLeg)


def test_reject_during_early_media_sends_its_status_and_ends_as_rejected() -> None:
    h = playing()
    h.call.execute(Reject(603, "Decline"), 0.07)
    actions, _ = h.take()
    assert actions == [RejectLeg(603, "Decline")]
    h.call.execute(Answer(), 0.08)  # decided: refused
    h.call.hangup_received("rejected", 0.1)  # the shell, once the leg sent it
    actions, events = h.take()
    assert not of_type(actions, AnswerLeg)
    assert of_type(events, CommandRejected) == [CommandRejected("Answer", "", "not_early_media")]
    assert of_type(events, TurnInterrupted)[0].reason == "call_ended"
    assert of_type(events, CallEnded) == [CallEnded("rejected")]


def test_reject_defaults_to_486() -> None:
    h = playing()
    h.call.execute(Reject(), 0.07)
    actions, _ = h.take()
    assert actions == [RejectLeg(486, "")]


def test_the_cap_applies_the_rule_once_and_a_decision_before_it_wins() -> None:
    h = playing(RULE_ONLY)
    h.call.early_media_expired(0.07)
    actions, _ = h.take()
    assert actions == [RULE_ONLY]
    h.call.execute(Answer(), 0.08)
    actions, events = h.take()
    assert actions == [] and of_type(events, CommandRejected)
    h2 = playing()
    h2.call.execute(Answer(), 0.07)
    h2.call.early_media_expired(0.08)
    actions, _ = h2.take()
    assert actions == [AnswerLeg()]


@pytest.mark.parametrize("command", [Answer(), Reject(), Reject(404, "Nobody")])
def test_outside_early_media_the_commands_are_refused_and_change_nothing(
    command: Command,
) -> None:
    h = Harness(SIP)  # answered at once: never in early media
    h.say("t1")
    h.frames("t1", tone_ulaw_frames(3), now=0.01)
    h.done("t1", now=0.01)
    h.take()
    h.call.execute(command, 0.02)
    actions, events = h.take()
    assert actions == []
    assert events == [CommandRejected(type(command).__name__, "", "not_early_media")]
    frames = [h.tick(n) for n in range(1, 5)]
    assert frames[:3] == tone_ulaw_frames(3)  # the turn plays as before
    _, events = h.take()
    assert of_type(events, TurnFinished)


@pytest.mark.parametrize("status", [200, 399, 700, 0, -486])
def test_a_bad_status_is_refused_and_early_media_goes_on(status: int) -> None:
    h = playing()
    h.call.execute(Reject(status), 0.07)
    actions, events = h.take()
    assert actions == [] and events == [CommandRejected("Reject", "", "bad_status")]
    assert h.call.in_early_media


def test_a_hangup_in_early_media_decides_too() -> None:
    """``Hangup`` ends the leg as before (an unanswered SIP call: 480); the first turn's end
    during the hangup's tail must not answer it."""
    h = playing()
    h.call.execute(Hangup("app_hangup"), 0.07)
    out = play_out(h)
    assert [a for a in out if isinstance(a, HangupLeg | AnswerLeg | RejectLeg)] == [
        HangupLeg("app_hangup")
    ]
    assert not h.call.in_early_media


def test_early_media_after_the_call_ended_is_ignored() -> None:
    h = Harness(SIP)
    h.call.hangup_received("remote-bye", 0.0)
    h.call.early_media(AnswerLeg(), 0.0)
    assert not h.call.in_early_media
    h.call.early_media_expired(0.1)
    actions, _ = h.take()
    assert actions == []

"""A turn's text goes to the provider a sentence at a time, ahead of playout.

The provider here is a model: each ``SendTurnText`` comes back as audio
``LATENCY_S`` later, at ``CHARS_PER_S`` characters a second of speech, all at
once (faster than real time, as TTS providers send); ``EndTurn`` comes back as
``TurnDone`` after the last audio. Time is the tick count; nothing sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from call_harness import SIP, TWILIO, Harness, at, of_type

from bridge.commands import TurnFinished, TurnInterrupted
from bridge.media.call_types import (
    CallOptions,
    CancelTurn,
    EndTurn,
    LegProfile,
    SendMark,
    SendTurnText,
)
from bridge.media.text_pacing import EST_CHARS_PER_S, STALL_S

LATENCY_S = 0.3
CHARS_PER_S = 15.0
SENTENCES = [
    f"This is sentence number {i} of a long prompt read to the caller. " for i in range(12)
]
TEXT = "".join(SENTENCES)  # 12 sentences of 63 characters: 4.2 s of speech each, 50.4 s in all
AHEAD_S = CallOptions().text_ahead_s


@dataclass
class ModelProvider:
    """Answers text with audio after ``LATENCY_S``; records what it was sent, when."""

    h: Harness
    texts: list[tuple[float, str]] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    cancels: list[float] = field(default_factory=list)
    due: list[tuple[float, str, bytes | None]] = field(default_factory=list)
    received_s: float = 0.0
    answering: bool = True

    def take(self, now: float) -> None:
        """Read the call's actions (as the shell would) and answer what is due."""
        self.h.drain()
        actions, self.h.actions = self.h.actions, []
        self.h.actions += [a for a in actions if not isinstance(a, SendTurnText | EndTurn)]
        for action in actions:
            if isinstance(action, SendTurnText):
                self.texts.append((now, action.text))
                audio = b"\x55" * round(len(action.text) / CHARS_PER_S * 8000)
                if self.answering:
                    self.due.append((now + LATENCY_S, action.turn_id, audio))
            elif isinstance(action, EndTurn):
                self.ends.append(now)
                self.due.append((now + LATENCY_S, action.turn_id, None))
            elif isinstance(action, CancelTurn):
                self.cancels.append(now)
        for item in [d for d in self.due if d[0] <= now]:
            self.due.remove(item)
            _, turn_id, audio = item
            if audio is None:
                self.h.done(turn_id, now)
            else:
                self.received_s += len(audio) / 8000
                self.h.audio(turn_id, audio, now)

    @property
    def sent(self) -> str:
        return "".join(text for _, text in self.texts)


def run_turn(leg: LegProfile) -> tuple[Harness, ModelProvider, float, float]:
    """Play the whole turn; return the harness, the provider and the most audio held
    (ahead of playout): over the first 10 s, and after."""
    h = Harness(leg)
    provider = ModelProvider(h)
    h.say("t1", TEXT, now=0.0)
    provider.take(0.0)
    held_at_start_s = most_held_s = 0.0
    frames = 0
    for n in range(1, 4000):
        provider.take(at(n))
        if h.tick(n) is not None:
            frames += 1
        provider.take(at(n))
        held_s = provider.received_s - frames * 0.020
        if n <= 500:
            held_at_start_s = max(held_at_start_s, held_s)
        else:
            most_held_s = max(most_held_s, held_s)
        if provider.ends and not provider.due and not h.call.frame_ready():
            break
    return h, provider, held_at_start_s, most_held_s


@pytest.mark.parametrize("leg", [SIP, TWILIO], ids=["sip", "twilio"])
def test_a_long_turn_goes_out_a_sentence_at_a_time_and_plays_without_a_gap(
    leg: LegProfile,
) -> None:
    h, provider, held_at_start_s, most_held_s = run_turn(leg)
    assert provider.sent == TEXT  # every character, in order, once
    assert [t for _, t in provider.texts] == SENTENCES  # one sentence a message
    sent_at_once = [t for when, t in provider.texts if when == 0.0]
    assert sent_at_once == SENTENCES[:2]  # 4.2 s estimated (at 30 a second): past 3 s
    assert len(provider.ends) == 1 and provider.ends[0] >= provider.texts[-1][0]
    assert provider.texts[-1][0] > 40.0  # the last sentence went out late in the turn
    assert h.call.stats().underruns == 0
    # at first, what the estimate lets out: 3 s at 30 characters a second and a sentence
    first_s = (AHEAD_S * EST_CHARS_PER_S + len(SENTENCES[0])) / CHARS_PER_S
    assert 8.0 < held_at_start_s <= first_s + 0.1
    # then at most a sentence's audio (4.2 s) past the lead
    assert 4.2 < most_held_s <= AHEAD_S + len(SENTENCES[0]) / CHARS_PER_S + 0.1
    if leg is SIP:
        finished = of_type(h.events, TurnFinished)
        assert [e.turn_id for e in finished] == ["t1"]
    else:  # the turn finishes on its final mark's echo: everything was sent
        assert of_type(h.actions, SendMark)
    assert h.call.next_deadline() is None


def test_the_whole_turn_is_held_without_pacing() -> None:
    h = Harness(SIP, options=CallOptions(text_ahead_s=0.0))
    h.say("t1", TEXT, now=0.0)
    actions, _ = h.take()
    assert [a.text for a in of_type(actions, SendTurnText)] == [TEXT]
    assert len(of_type(actions, EndTurn)) == 1
    assert h.call.next_deadline() is None


def test_a_cacheable_turn_is_sent_whole_unless_nothing_is_cached() -> None:
    h = Harness(SIP)
    h.say("t1", TEXT, now=0.0, cacheable=True)
    actions, _ = h.take()
    assert [a.text for a in of_type(actions, SendTurnText)] == [TEXT]
    assert len(of_type(actions, EndTurn)) == 1
    h = Harness(SIP, options=CallOptions(cache_prompts=False))
    h.say("t1", TEXT, now=0.0, cacheable=True)
    actions, _ = h.take()
    assert [a.text for a in of_type(actions, SendTurnText)] == SENTENCES[:2]
    assert of_type(actions, EndTurn) == []


def test_a_provider_named_in_the_options_uses_its_own_figure() -> None:
    h = Harness(SIP, options=CallOptions(provider_text_ahead_s=(("whole", 0.0), ("paced", 3.0))))
    h.say("a", TEXT, now=0.0, provider="whole")
    h.say("b", TEXT, now=0.0, provider="paced")
    h.say("c", TEXT, now=0.0)  # names none: the call's figure
    actions, _ = h.take()
    texts = of_type(actions, SendTurnText)
    assert [a.text for a in texts if a.turn_id == "a"] == [TEXT]
    assert [a.text for a in texts if a.turn_id == "b"] == SENTENCES[:2]
    assert [a.text for a in texts if a.turn_id == "c"] == SENTENCES[:2]
    with pytest.raises(ValueError, match="text_ahead_s"):
        Harness(SIP, options=CallOptions(text_ahead_s=-1.0))


def test_barge_in_drops_the_held_text_and_nothing_more_is_sent() -> None:
    h = Harness(SIP)
    provider = ModelProvider(h)
    h.say("t1", TEXT, now=0.0)
    provider.take(0.0)
    for n in range(1, 150):  # 3 s: the turn is playing its first sentence
        h.tick(n)
        provider.take(at(n))
    h.call.barge_in("speech", at(150))
    provider.take(at(150))
    sent_before = provider.sent
    assert provider.cancels == [at(150)]
    assert len(sent_before) < len(TEXT) // 2
    for n in range(151, 1500):  # 27 s more: nothing of the turn goes out
        h.tick(n)
        provider.take(at(n))
    assert provider.sent == sent_before
    assert provider.ends == []
    assert h.call.stats().text_chars_unsent == len(TEXT) - len(sent_before)
    interrupted = of_type(h.events, TurnInterrupted)
    assert [(e.turn_id, e.reason) for e in interrupted] == [("t1", "speech")]
    assert h.call.next_deadline() is None


def test_hangup_drops_the_held_text() -> None:
    h = Harness(SIP)
    provider = ModelProvider(h)
    h.say("t1", TEXT, now=0.0)
    provider.take(0.0)
    h.call.hangup_received("bye", 0.5)
    provider.take(0.5)
    assert provider.cancels == [0.5]
    assert provider.sent == SENTENCES[0] + SENTENCES[1]
    assert h.call.next_deadline() is None


def test_a_provider_that_answers_nothing_gets_the_rest_after_the_stall_time() -> None:
    h = Harness(SIP)
    provider = ModelProvider(h, answering=False)
    h.say("t1", TEXT, now=0.0)
    provider.take(0.0)
    assert provider.sent == SENTENCES[0] + SENTENCES[1]
    deadline = h.call.next_deadline()
    assert deadline is not None and deadline <= STALL_S
    while provider.sent != TEXT:  # what the shell's timer does
        deadline = h.call.next_deadline()
        assert deadline is not None and deadline <= STALL_S + 1e-9
        h.call.handle_timer(deadline)
        provider.take(deadline)
    assert provider.texts[-1] == (pytest.approx(STALL_S), "".join(SENTENCES[2:]))
    assert len(provider.ends) == 1


def test_streamed_text_goes_as_it_comes_until_the_turn_is_ahead() -> None:
    h = Harness(SIP)
    provider = ModelProvider(h)
    tokens = ["Sure", ", let", " me", " check", " that", " for", " you", ". "]
    for i, token in enumerate(tokens):
        h.say("t1", token, now=i * 0.01, final=False)
        provider.take(i * 0.01)
    assert [t for _, t in provider.texts] == tokens  # short: each goes at once
    h.say("t1", "".join(SENTENCES[:3]), now=0.1, final=True)
    provider.take(0.1)
    assert provider.sent == "".join(tokens) + SENTENCES[0]  # then it is ahead
    assert provider.ends == []


def test_a_queued_turn_holds_its_text_until_it_plays() -> None:
    h = Harness(SIP)
    provider = ModelProvider(h)
    h.say("first", SENTENCES[0], now=0.0)
    h.say("second", TEXT, now=0.0)
    provider.take(0.0)
    assert [t for _, t in provider.texts] == [SENTENCES[0], SENTENCES[0], SENTENCES[1]]
    second_started = None
    for n in range(1, 1000):
        h.tick(n)
        provider.take(at(n))
        if second_started is None and h.call.stats().turns_finished == 1:
            second_started = at(n)
            sent_while_queued = provider.sent
    assert second_started is not None
    # while the first turn played (4.2 s), the second sent no more than at first
    assert sent_while_queued == SENTENCES[0] * 2 + SENTENCES[1]
    assert len(provider.sent) > len(sent_while_queued)

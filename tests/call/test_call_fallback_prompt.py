"""A turn no provider could render: the caller hears the fallback prompt in its place.

The Speaker sends ``TurnFellBack`` and then the fallback's audio under the turn's id
(``tests/loopback/test_prompt_single_flight.py``); the call reports the provider error
as for a failed turn and plays that audio without a gap.
"""

from __future__ import annotations

from call_harness import Harness, at, tone_ulaw_frames

from bridge.commands import ProviderErrored, TurnBegan, TurnFinished, TurnInterrupted
from bridge.providers.prompts import TurnFellBack


def test_the_fallback_prompt_plays_in_place_of_the_failed_turn_and_the_error_is_reported() -> None:
    h = Harness()
    h.say("t1", provider="kova", cacheable=True)
    h.say("t2")
    fallback = tone_ulaw_frames(3, 660.0)
    h.provide(TurnFellBack("t1", "refused", "queue full"), now=0.01)
    h.frames("t1", fallback, now=0.011)
    h.done("t1", now=0.011)
    after = tone_ulaw_frames(1, 880.0)
    h.frames("t2", after, now=0.012)
    h.done("t2", now=0.012)
    sent = [h.tick(n) for n in range(1, 6)]
    assert sent == [*fallback, after[0], None]  # the fallback, at once, then the next turn
    _, events = h.take()
    assert events == [
        ProviderErrored("t1", "kova", "refused", "queue full"),
        TurnBegan("t1"),
        TurnInterrupted("t1", 60, "", "provider_error"),
        TurnBegan("t2"),
        TurnFinished("t2", 20, ""),
    ]
    assert h.call.stats().provider_errors == 1


def test_a_fallback_for_a_turn_already_over_changes_nothing() -> None:
    h = Harness()
    h.say("t1")
    h.frames("t1", tone_ulaw_frames(1), now=0.0)
    h.done("t1", now=0.0)
    assert h.tick(1) is not None
    h.provide(TurnFellBack("t1", "refused", "late"), now=at(1) + 0.001)
    h.provide(TurnFellBack("nobody", "refused", "unknown turn"), now=at(1) + 0.001)
    h.tick(2)
    _, events = h.take()
    assert events == [TurnBegan("t1"), TurnFinished("t1", 20, "")]
    assert h.call.stats().provider_errors == 0

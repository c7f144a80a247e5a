"""Whose underrun (``bridge.media.underrun``): the call's ledger fed facts in order (dry
ticks, silent ticks, the carrier's lead, unread bytes), the verdict from what waited
unread, and a watched verdict settled by the byte offsets handed over later."""

from __future__ import annotations

import pytest

from bridge.media.underrun import DryWatches, Underruns, dry_verdict


@pytest.mark.parametrize(
    ("kernel", "unconsumed", "encrypted", "window", "verdict"),
    [
        (0, 0, False, 1000, "provider"),  # nothing waited: the provider had not sent it
        (0, 0, True, None, "provider"),
        (10, 0, False, 1000, "watch"),
        (0, 10, False, 1000, "watch"),
        (10, 0, True, 1000, "daemon"),  # TLS: the kernel counts encrypted bytes
        (1000, 0, False, 1000, "daemon"),  # the window may have held the provider back
        (10, 0, False, None, "daemon"),  # the window is unknown
    ],
)
def test_the_verdict_from_what_waited_unread(
    kernel: int, unconsumed: int, encrypted: bool, window: int | None, verdict: str
) -> None:
    assert dry_verdict(kernel, unconsumed, encrypted, window) == verdict


def test_a_watch_settles_to_the_provider_once_its_bytes_held_other_audio() -> None:
    settled: list[str] = []
    watches = DryWatches()
    watches.add("a", 500, lambda: settled.append("a"))
    watches.add("b", 800, lambda: settled.append("b"))
    watches.settle(499)
    assert settled == [] and watches
    watches.settle(500)  # everything that waited for a is handed over, none of it a's
    assert settled == ["a"]
    watches.audio("b")  # b's audio was among the bytes: stays the daemon's
    watches.settle(10_000)
    assert settled == ["a"] and not watches


FRAME = 160  # samples per 20 ms frame at 8 kHz


def test_a_dry_tick_is_the_providers_when_it_had_not_handed_over_the_next_frame() -> None:
    u = Underruns()
    u.dry("t", received_samples=3 * FRAME, played_samples=3 * FRAME, frame_samples=FRAME)
    assert (u.ticks, u.provider, u.suspect) == (1, 1, "t")
    u.silent_tick()
    # the audio had arrived (held in a filter or a backlog): the daemon's
    u.dry("t", received_samples=5 * FRAME, played_samples=3 * FRAME, frame_samples=FRAME)
    assert (u.ticks, u.provider, u.suspect) == (2, 1, None)
    u.dry(None, 0.0, 0, 0)  # the head turn is gone: counted, nobody's to blame
    assert (u.ticks, u.provider, u.heard) == (3, 1, 3)


def test_the_shell_asks_once_and_unread_bytes_make_it_the_daemons() -> None:
    u = Underruns()
    u.dry("t", 0.0, 0, FRAME)
    assert u.silent_tick() == "t"  # the shell asks the turn's connection about unread bytes
    assert u.silent_tick() is None  # once
    u.unread()  # they waited: the daemon's
    assert (u.heard, u.provider) == (1, 0)
    u.provider_after_all()  # the watch settled: none of those bytes were the turn's audio
    assert (u.heard, u.provider, u.provider_busy) == (1, 1, 1)


def test_the_carriers_lead_covers_dry_ticks_until_it_is_spent() -> None:
    u = Underruns()
    u.lead_sent(2)
    assert u.silent_tick() is None  # between turns: the carrier plays a held frame
    assert u.carrier_ahead == 1 and u.covered == 0
    u.dry("t", 0.0, 0, FRAME)
    assert u.silent_tick() is None  # covered: no gap, and nothing to ask the shell
    assert (u.ticks, u.covered, u.heard, u.provider) == (1, 1, 0, 0)
    u.dry("t", 0.0, 0, FRAME)
    assert u.silent_tick() == "t"  # the lead is spent: the caller hears this one
    assert (u.ticks, u.covered, u.heard, u.provider) == (2, 1, 1, 1)
    u.lead_sent(3)
    u.carrier_cleared()  # a barge-in's clear: the carrier dropped what it held
    u.dry("t", 0.0, 0, FRAME)
    assert u.silent_tick() == "t"
    assert (u.heard, u.provider) == (2, 2)

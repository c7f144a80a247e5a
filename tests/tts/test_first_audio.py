"""``FirstAudioDeadlines``: the pure part of the first-audio deadline (time is passed in)."""

from __future__ import annotations

from bridge.providers.first_audio import FirstAudioDeadlines


def test_a_deadline_expires_once_at_its_time_earliest_first() -> None:
    d = FirstAudioDeadlines()
    assert d.arm("b", 10.0, 2.0) and d.arm("a", 10.5, 1.0)
    assert d.next_deadline() == 11.5
    assert d.expired(11.4) == []
    assert d.expired(12.0) == ["a", "b"]
    assert d.expired(99.0) == [] and d.next_deadline() is None and len(d) == 0


def test_disarmed_at_first_audio_and_re_armed_from_the_new_time() -> None:
    d = FirstAudioDeadlines()
    d.arm("t", 0.0, 1.0)
    d.disarm("t")
    assert "t" not in d and d.expired(5.0) == []
    d.arm("t", 5.0, 1.0)
    assert d.next_deadline() == 6.0
    assert d.expired(5.9) == [] and d.expired(6.0) == ["t"]


def test_one_budget_per_turn_whatever_provider_it_is_on() -> None:
    d = FirstAudioDeadlines()
    d.arm("t", 0.0, 1.0)
    d.arm("t", 0.3, 1.0)  # the first provider failed fast: the next one gets what is left
    assert d.next_deadline() == 1.0
    assert d.expired(1.0) == ["t"] and "t" in d  # expired, its budget still spent
    d.arm("t", 1.0, 0.5)  # armed again after the deadline: already due
    assert d.expired(1.0) == ["t"]
    d.restart("t")  # spent with nothing to fall back to: the next provider starts afresh
    assert "t" not in d
    d.arm("t", 1.0, 1.0)
    assert d.next_deadline() == 2.0
    d.disarm("t")
    assert "t" not in d and d.next_deadline() is None


def test_zero_is_off_and_drops_an_earlier_deadline() -> None:
    d = FirstAudioDeadlines()
    d.arm("t", 0.0, 1.0)
    assert not d.arm("t", 0.0, 0.0)
    assert d.next_deadline() is None and d.expired(10.0) == []

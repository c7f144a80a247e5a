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
    d.arm("t", 5.5, 1.0)  # armed again (the next provider of the chain): the later time holds
    assert d.next_deadline() == 6.5
    assert d.expired(6.0) == [] and d.expired(6.5) == ["t"]


def test_zero_is_off_and_drops_an_earlier_deadline() -> None:
    d = FirstAudioDeadlines()
    d.arm("t", 0.0, 1.0)
    assert not d.arm("t", 0.0, 0.0)
    assert d.next_deadline() is None and d.expired(10.0) == []

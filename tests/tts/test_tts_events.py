"""The events every provider message builds keep the frozen-dataclass contract.

``AudioReceived``, ``WordsTimed`` and ``WordTiming`` set their slots in a
hand-written ``__init__`` (cheaper than the generated one); they must still
be frozen, compare and hash by value, take keywords, work with
``dataclasses.replace`` and in ``match`` patterns.
"""

from __future__ import annotations

import dataclasses

import pytest

from bridge.providers.base import MULAW_8K, PCM_8K, AudioReceived, WordsTimed, WordTiming


def test_the_hot_events_are_still_frozen_dataclasses() -> None:
    word = WordTiming("hi", 0.0, 0.25)
    audio = AudioReceived("t1", b"\x01", MULAW_8K)
    timed = WordsTimed("t1", (word,))
    for event in (word, audio, timed):
        first = dataclasses.fields(event)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, first, "x")
        assert dataclasses.is_dataclass(event)
    assert not hasattr(audio, "__dict__")  # slotted
    assert audio == AudioReceived(turn_id="t1", audio=b"\x01", audio_format=MULAW_8K)
    assert hash(audio) == hash(AudioReceived("t1", b"\x01", MULAW_8K))
    assert audio != AudioReceived("t1", b"\x01", PCM_8K)
    assert dataclasses.replace(audio, turn_id="t2") == AudioReceived("t2", b"\x01", MULAW_8K)
    assert dataclasses.replace(timed, turn_id="t2").words == (word,)
    assert word == WordTiming(word="hi", start_s=0.0, end_s=0.25)
    assert repr(word) == "WordTiming(word='hi', start_s=0.0, end_s=0.25)"
    match timed:
        case WordsTimed(turn_id=turn_id, words=(WordTiming(word=w),)):
            assert (turn_id, w) == ("t1", "hi")
        case _:
            pytest.fail("no match")
    with pytest.raises(TypeError):
        AudioReceived("t1", b"\x01")  # type: ignore[call-arg]

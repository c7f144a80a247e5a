"""The prompt cache engine (``bridge.providers.prompts``): single flight, LRU, file format."""

from __future__ import annotations

import pytest

from bridge.engine import Event
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    WordsTimed,
    WordTiming,
)
from bridge.providers.prompts import (
    MAGIC,
    PromptCache,
    PromptFileError,
    PromptKey,
    decode_prompt,
    encode_prompt,
    provider_identity,
)


def _key(text: str = "Welcome.", provider: str = "p") -> PromptKey:
    return PromptKey(provider, "id", "v", MULAW_8K, None, text)


def _drop(event: Event) -> None:
    pass


def _audio(events: list[Event]) -> bytes:
    return b"".join(e.audio for e in events if isinstance(e, AudioReceived))


def test_two_turns_one_render_the_second_joins_late_and_hears_it_from_the_start() -> None:
    cache = PromptCache()
    first: list[Event] = []
    second: list[Event] = []
    outcome, lead = cache.request(_key(), "greeting", first.append)
    assert outcome == "lead" and lead is not None
    flight = lead.flight
    cache.flight_event(flight, AudioReceived(flight.wire_id, b"\x01" * 160, MULAW_8K))
    cache.flight_event(flight, WordsTimed(flight.wire_id, (WordTiming("Welcome", 0, 0.4),)))
    outcome, joined = cache.request(_key(), "greeting", second.append)  # mid-stream
    assert outcome == "joined" and joined is not None and joined.flight is flight
    assert _audio(second) == b"\x01" * 160  # what was recorded so far, at once
    cache.flight_event(flight, AudioReceived(flight.wire_id, b"\x02" * 160, MULAW_8K))
    cache.flight_event(flight, TurnDone(flight.wire_id))
    assert cache.renders == 1 and cache.joins == 1
    assert _audio(first) == _audio(second) == b"\x01" * 160 + b"\x02" * 160
    assert [type(e) for e in first] == [type(e) for e in second]
    assert first[-1] == TurnDone("greeting") and second[-1] == TurnDone("greeting")
    assert {e.turn_id for e in first + second} == {"greeting"}  # type: ignore[attr-defined]
    # and now it is a hit, replayed at once
    third: list[Event] = []
    assert cache.request(_key(), "t3", third.append) == ("hit", None)
    assert _audio(third) == _audio(first) and third[-1] == TurnDone("t3")


def test_a_hundred_simultaneous_requests_are_one_render() -> None:
    cache = PromptCache()
    sinks: list[list[Event]] = [[] for _ in range(100)]
    outcomes = [cache.request(_key(), f"t{i}", s.append)[0] for i, s in enumerate(sinks)]
    assert outcomes.count("lead") == 1 and outcomes.count("joined") == 99
    assert cache.renders == 1 and cache.flights == 1
    (flight,) = {w.flight for w in cache._flights[_key().digest()].waiters}
    cache.flight_event(flight, AudioReceived("x", b"abc", MULAW_8K))
    cache.flight_event(flight, TurnDone("x"))
    assert all(_audio(s) == b"abc" and s[-1] == TurnDone(f"t{i}") for i, s in enumerate(sinks))
    assert cache.flights == 0 and cache.holds(_key())
    assert flight.waiters == []  # no waiter <-> flight cycle outlives the render


def test_a_failed_render_is_retried_once_then_its_waiters_fail_together() -> None:
    cache = PromptCache()
    a: list[Event] = []
    b: list[Event] = []
    _, wa = cache.request(_key(), "a", a.append)
    cache.request(_key(), "b", b.append)
    assert wa is not None
    flight = wa.flight
    assert flight.wire_id == "prompt-1-1"
    assert cache.flight_failed(flight, "refused", "queue full", True) is True  # retry
    assert flight.wire_id == "prompt-1-2" and a == [] and b == []
    assert cache.flight_failed(flight, "refused", "queue full", True) is False
    assert a == [TurnFailed("a", "refused", "queue full", True)]
    assert b == [TurnFailed("b", "refused", "queue full", True)]
    assert cache.renders == 2 and cache.failures == 1 and cache.flights == 0
    assert not cache.holds(_key())
    # the next request starts afresh
    assert cache.request(_key(), "c", _drop)[0] == "lead"


def test_the_cache_counts_per_provider_what_it_did() -> None:
    cache = PromptCache()
    _, wa = cache.request(_key(provider="a"), "t1", _drop)  # a miss: a render starts
    cache.request(_key(provider="a"), "t2", _drop)  # joins it
    assert wa is not None
    cache.flight_event(wa.flight, AudioReceived(wa.flight.wire_id, b"\x01" * 160, MULAW_8K))
    cache.flight_event(wa.flight, TurnDone(wa.flight.wire_id))
    cache.request(_key(provider="a"), "t3", _drop)  # a hit
    _, wb = cache.request(_key(provider="b"), "t4", _drop)
    assert wb is not None
    assert cache.flight_failed(wb.flight, "refused", "busy", True) is True  # retried
    assert cache.flight_failed(wb.flight, "refused", "busy", True) is False  # failed for good
    a, b = cache.counts["a"], cache.counts["b"]
    assert (a.hits, a.misses, a.joins, a.renders, a.failures) == (1, 1, 1, 1, 0)
    assert (b.hits, b.misses, b.joins, b.renders, b.failures) == (0, 1, 0, 2, 1)
    assert set(cache.counts) == {"a", "b"}
    assert (cache.hits, cache.misses, cache.joins, cache.renders, cache.failures) == (1, 2, 1, 3, 1)


def test_a_render_that_fails_after_audio_is_not_retried() -> None:
    cache = PromptCache()
    got: list[Event] = []
    _, w = cache.request(_key(), "a", got.append)
    assert w is not None
    cache.flight_event(w.flight, AudioReceived("x", b"\x01", MULAW_8K))
    assert cache.flight_failed(w.flight, "closed", "gone", True) is False
    assert isinstance(got[-1], TurnFailed) and not cache.holds(_key())


def test_a_waiter_that_leaves_leaves_the_render_and_the_others_alone() -> None:
    cache = PromptCache()
    leader: list[Event] = []
    follower: list[Event] = []
    _, wl = cache.request(_key(), "l", leader.append)
    _, wf = cache.request(_key(), "f", follower.append)
    assert wl is not None and wf is not None
    cache.leave(wl)  # the leader's call hung up
    cache.flight_event(wl.flight, AudioReceived("x", b"\x07" * 8, MULAW_8K))
    cache.leave(wf)
    cache.leave(wf)  # twice is harmless
    cache.flight_event(wl.flight, TurnDone("x"))
    assert leader == []
    assert follower == [AudioReceived("f", b"\x07" * 8, MULAW_8K)]
    assert cache.holds(_key())  # the render went on to fill the cache


def test_lru_bounded_in_bytes_and_evictions_listed() -> None:
    cache = PromptCache(max_bytes=10, persist=True)
    for text in ("a", "b", "c"):
        cache.put(_key(text), [AudioReceived("", b"x" * 4, MULAW_8K)])
    assert cache.size_bytes == 8 and not cache.holds(_key("a"))
    assert cache.evicted == [_key("a").digest()]
    assert cache.get(_key("b")) is not None  # b is now the most recent
    cache.put(_key("d"), [AudioReceived("", b"x" * 4, MULAW_8K)])
    assert cache.holds(_key("b")) and not cache.holds(_key("c"))
    assert cache.put(_key("big"), [AudioReceived("", b"x" * 11, MULAW_8K)]) is False
    assert [d for d, _, _ in cache.stored] == [_key(t).digest() for t in "abcd"]


def test_request_without_lead_only_joins_or_hits() -> None:
    cache = PromptCache()
    assert cache.request(_key(), "t", _drop, lead=False) == (None, None)
    assert cache.renders == 0


def test_the_key_names_everything_that_changes_the_audio() -> None:
    base = _key()
    others = [
        PromptKey("q", "id", "v", MULAW_8K, None, "Welcome."),
        PromptKey("p", "id2", "v", MULAW_8K, None, "Welcome."),
        PromptKey("p", "id", "w", MULAW_8K, None, "Welcome."),
        PromptKey("p", "id", "v", MULAW_8K, 1.2, "Welcome."),
        PromptKey("p", "id", "v", MULAW_8K, None, "Welcome!"),
    ]
    assert len({base.digest(), *(k.digest() for k in others)}) == 6


def test_provider_identity_ignores_the_secret_and_timeouts_not_the_voice_options() -> None:
    s = ProviderSettings("p", "kova", "wss://u:pw@h/v1?api_key=SECRET&m=1", api_key="K1")
    same = ProviderSettings("p", "kova", "wss://h/v1?api_key=OTHER&m=1", api_key="K2")
    assert provider_identity(s) == provider_identity(same)
    timeouts = ProviderSettings("p", "kova", "wss://h/v1?m=1", options=(("reply_timeout_s", 3),))
    assert provider_identity(timeouts) == provider_identity(same)
    model = ProviderSettings("p", "kova", "wss://h/v1?m=1", model="m2")
    assert provider_identity(model) != provider_identity(same)
    assert provider_identity(same, "piper:en_US") != provider_identity(same, "tone")
    assert "SECRET" not in provider_identity(s) and len(provider_identity(s)) == 32


def test_file_format_round_trip_and_no_secret_in_it() -> None:
    key = _key("Press 1.")
    events: list[Event] = [
        AudioReceived("", b"\x00\x01" * 80, MULAW_8K),
        WordsTimed("", (WordTiming("Press", 0.0, 0.3), WordTiming("1.", 0.3, 0.5))),
        AudioReceived("", b"\x02" * 3, MULAW_8K),
    ]
    data = encode_prompt(key, events)
    assert data.startswith(MAGIC)
    got_key, got = decode_prompt(data)
    assert got_key == key and got == events
    assert isinstance(got[0], AudioReceived) and got[0].audio_format is MULAW_8K


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda d: d[:10], "truncated header"),
        (lambda d: d[:-5], "length"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum"),
        (lambda d: b"XX" + d[2:], "magic"),
        (lambda d: d[:8] + b"\x00\x09" + d[10:], "version"),
    ],
)
def test_a_damaged_file_is_refused_saying_why(damage: object, why: str) -> None:
    data = encode_prompt(_key(), [AudioReceived("", b"\x01" * 100, MULAW_8K)])
    with pytest.raises(PromptFileError, match=why):
        decode_prompt(damage(data))  # type: ignore[operator]

"""The first-audio deadline in ``Speaker``: a provider that accepts a turn and sends nothing
is given up at ``first_audio_timeout_s`` (a fake clock here, fired by hand) when the turn has a
way out: the next provider, or the cached fallback prompt. Its late audio is dropped; a shared
prompt render is left to fill the cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.engine import Event
from bridge.providers.base import (
    MULAW_8K,
    AudioReceived,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)
from bridge.providers.failover import Speaker, prompt_key
from bridge.providers.first_audio import FIRST_AUDIO_TIMEOUT_KIND
from bridge.providers.prompts import PromptCache, TurnFellBack

FALLBACK = "Sorry, one moment please."
FALLBACK_AUDIO = b"\x7f" * 160
SETTINGS = TurnSettings("v", MULAW_8K)


class _Handle:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send_text(self, text: str) -> None:
        self.log.append(f"text:{text}")

    def end(self) -> None:
        self.log.append("end")

    def cancel(self) -> None:
        self.log.append("cancel")


class _Pool:
    """Accepts every turn and answers only when the test makes it."""

    prompt_identity: str | None = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.settings = ProviderSettings(name, "kova", "ws://127.0.0.1:9/", voice="v")
        self.log: list[str] = []
        self.sinks: dict[str, tuple[Any, ...]] = {}

    def open_turn(
        self, turn_id: str, settings: TurnSettings, sink: Any, *direct_sinks: Any
    ) -> _Handle:
        self.log.append(f"open:{turn_id}")
        self.sinks[turn_id] = (sink, *direct_sinks)
        return _Handle(self.log)

    def audio(self, turn_id: str, audio: bytes) -> None:
        """The provider answering at last (to the direct audio sink where the turn has one)."""
        sink, *direct = self.sinks[turn_id]
        if direct and direct[0] is not None:
            direct[0](audio, MULAW_8K)
        else:
            sink(AudioReceived(turn_id, audio, MULAW_8K))

    def done(self, turn_id: str) -> None:
        self.sinks[turn_id][0](TurnDone(turn_id))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None], _Timer]] = []

    def __call__(self) -> float:
        return self.now

    def call_at(self, at: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer()
        self.timers.append((at, fn, timer))
        return timer

    def armed(self) -> list[float]:
        return [at for at, _, t in self.timers if not t.cancelled]

    def advance(self, to: float) -> None:
        """Move to ``to``, firing the timers due on the way (as the loop would)."""
        self.now = to
        for at, fn, timer in list(self.timers):
            if at <= to and not timer.cancelled:
                timer.cancelled = True
                fn()


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _speaker(
    pools: list[_Pool],
    clock: _Clock,
    cache: PromptCache | None = None,
    timeouts: tuple[float, ...] = (1.0, 1.0),
) -> Speaker:
    return Speaker(
        pools,  # type: ignore[arg-type]
        cache,
        FALLBACK if cache is not None else "",
        "v",
        timeouts[: len(pools)],
        clock=clock,
        call_at=clock.call_at,
    )


def _cached_fallback(pool: _Pool) -> PromptCache:
    cache = PromptCache()
    key = prompt_key(pool, SETTINGS, FALLBACK)  # type: ignore[arg-type]
    cache.put(key, [AudioReceived("", FALLBACK_AUDIO, MULAW_8K)])
    return cache


def test_a_silent_provider_is_given_up_at_the_deadline_and_the_next_one_speaks() -> None:
    slow, good, clock = _Pool("slow"), _Pool("good"), _Clock()
    events: list[Event] = []
    speaker = _speaker([slow, good], clock)
    speaker.speak("t1", "hello", SETTINGS, events.append)
    assert slow.log == ["open:t1", "text:hello", "end"] and good.log == []
    assert clock.armed() == [1.0]
    clock.advance(0.9)
    assert good.log == [] and speaker.first_audio_expired == 0
    clock.advance(1.0)
    assert slow.log[-1] == "cancel"  # the provider turn is cancelled
    assert good.log == ["open:t1", "text:hello", "end"]
    assert speaker.first_audio_expired == 1 and speaker.failovers == 1
    assert events == []  # a failover is silent to the call
    slow.audio("t1", b"late")  # the late provider's audio is dropped
    good.audio("t1", b"good")
    good.done("t1")
    assert events == [AudioReceived("t1", b"good", MULAW_8K), TurnDone("t1")]
    assert clock.armed() == []


def test_the_last_provider_silent_plays_the_cached_fallback_and_reports_the_kind() -> None:
    slow, clock = _Pool("slow"), _Clock()
    events: list[Event] = []
    speaker = _speaker([slow], clock, _cached_fallback(slow))
    speaker.speak("t1", "Your balance is ten.", SETTINGS, events.append)
    clock.advance(1.0)
    assert slow.log[-1] == "cancel"
    assert [type(e) for e in events] == [TurnFellBack, AudioReceived, TurnDone]
    fell_back = events[0]
    assert isinstance(fell_back, TurnFellBack) and fell_back.kind == FIRST_AUDIO_TIMEOUT_KIND
    assert "slow" in fell_back.message
    assert events[1] == AudioReceived("t1", FALLBACK_AUDIO, MULAW_8K)
    slow.audio("t1", b"late")
    slow.done("t1")
    assert len(events) == 3  # nothing from the late provider


def test_audio_before_the_deadline_disarms_it() -> None:
    slow, good, clock = _Pool("slow"), _Pool("good"), _Clock()
    events: list[Event] = []
    speaker = _speaker([slow, good], clock)
    speaker.speak("t1", "hello", SETTINGS, events.append)
    clock.advance(0.5)
    slow.audio("t1", b"a")
    assert clock.armed() == []
    clock.advance(5.0)
    slow.audio("t1", b"b")
    slow.done("t1")
    assert good.log == [] and "cancel" not in slow.log
    assert [type(e) for e in events] == [AudioReceived, AudioReceived, TurnDone]


def test_no_way_out_or_zero_means_no_deadline() -> None:
    clock = _Clock()
    alone = _Pool("alone")  # no next provider, no fallback: the provider's own timeout rules
    _speaker([alone], clock).speak("t1", "hello", SETTINGS, lambda e: None)
    off, other = _Pool("off"), _Pool("other")
    _speaker([off, other], clock, timeouts=(0.0, 1.0)).speak("t2", "hi", SETTINGS, lambda e: None)
    assert clock.timers == []
    clock.advance(100.0)
    assert "cancel" not in alone.log and "cancel" not in off.log and other.log == []


def test_a_streamed_turn_is_armed_once_its_text_is_complete() -> None:
    slow, good, clock = _Pool("slow"), _Pool("good"), _Clock()
    speaker = _speaker([slow, good], clock)
    speaker.open_turn("t1", SETTINGS, lambda e: None)
    speaker.send_text("t1", "hello ")
    clock.advance(5.0)  # the app is still writing: no audio is owed yet
    assert clock.timers == [] and good.log == []
    speaker.send_text("t1", "there")
    speaker.end_turn("t1")
    assert clock.armed() == [6.0]
    clock.advance(6.0)
    assert good.log == ["open:t1", "text:hello there", "end"]


def test_a_shared_prompt_render_goes_on_to_fill_the_cache() -> None:
    slow, clock = _Pool("slow"), _Clock()
    cache = _cached_fallback(slow)
    heard: dict[str, list[Event]] = {"c1": [], "c2": [], "c3": []}
    calls = {name: _speaker([slow], clock, cache) for name in heard}
    calls["c1"].speak("g", "Welcome.", SETTINGS, heard["c1"].append, cacheable=True)
    clock.advance(0.5)
    calls["c2"].speak("g", "Welcome.", SETTINGS, heard["c2"].append, cacheable=True)
    assert slow.log == ["open:prompt-1-1", "text:Welcome.", "end"]  # one render
    clock.advance(1.0)
    assert [type(e) for e in heard["c1"]] == [TurnFellBack, AudioReceived, TurnDone]
    assert heard["c2"] == []  # joined later: its own deadline is later
    clock.advance(1.5)
    assert [type(e) for e in heard["c2"]] == [TurnFellBack, AudioReceived, TurnDone]
    assert "cancel" not in slow.log  # the render was left alone
    slow.audio("prompt-1-1", b"welcome")
    slow.done("prompt-1-1")
    assert len(heard["c1"]) == 3 and len(heard["c2"]) == 3  # the late audio is not played
    calls["c3"].speak("g", "Welcome.", SETTINGS, heard["c3"].append, cacheable=True)
    assert heard["c3"] == [AudioReceived("g", b"welcome", MULAW_8K), TurnDone("g")]
    assert clock.armed() == []


def test_a_chain_of_silent_providers_has_one_budget_then_the_fallback_plays() -> None:
    a, b, c, clock = _Pool("a"), _Pool("b"), _Pool("c"), _Clock()
    events: list[Event] = []
    speaker = _speaker([a, b, c], clock, _cached_fallback(a), timeouts=(1.0, 1.0, 1.0))
    speaker.speak("t1", "hello", SETTINGS, events.append)
    assert clock.armed() == [1.0]
    clock.advance(0.99)
    assert events == []
    clock.advance(1.0)  # one budget, not three: the fallback now, not provider b
    assert a.log[-1] == "cancel" and b.log == [] and c.log == []
    assert [type(e) for e in events] == [TurnFellBack, AudioReceived, TurnDone]
    assert events[1] == AudioReceived("t1", FALLBACK_AUDIO, MULAW_8K)
    assert speaker.first_audio_expired == 1 and clock.armed() == []


def test_a_provider_that_fails_fast_leaves_the_rest_of_the_budget_to_the_next() -> None:
    a, b, c, clock = _Pool("a"), _Pool("b"), _Pool("c"), _Clock()
    events: list[Event] = []
    speaker = _speaker([a, b, c], clock, _cached_fallback(a), timeouts=(1.0, 1.0, 1.0))
    speaker.speak("t1", "hello", SETTINGS, events.append)
    clock.advance(0.3)
    a.sinks["t1"][0](TurnFailed("t1", "refused", "queue full", True))  # a refuses
    assert b.log == ["open:t1", "text:hello", "end"]
    assert clock.armed() == [1.0]  # what is left of the turn's budget, not 1.3
    clock.advance(1.0)
    assert b.log[-1] == "cancel" and c.log == []
    assert [type(e) for e in events] == [TurnFellBack, AudioReceived, TurnDone]


def test_with_no_fallback_cached_the_next_provider_gets_a_deadline_of_its_own() -> None:
    a, b, c, clock = _Pool("a"), _Pool("b"), _Pool("c"), _Clock()
    events: list[Event] = []
    speaker = _speaker([a, b, c], clock, timeouts=(1.0, 1.0, 1.0))
    speaker.speak("t1", "hello", SETTINGS, events.append)
    clock.advance(1.0)
    assert b.log == ["open:t1", "text:hello", "end"]
    assert clock.armed() == [2.0]  # nothing to fall back to: failing over is all there is
    clock.advance(2.0)
    assert c.log == ["open:t1", "text:hello", "end"]
    c.audio("t1", b"c")
    c.done("t1")
    assert events == [AudioReceived("t1", b"c", MULAW_8K), TurnDone("t1")]
    assert speaker.first_audio_expired == 2


def test_a_hang_up_before_the_deadline_cancels_its_timer() -> None:
    slow, good, clock = _Pool("slow"), _Pool("good"), _Clock()
    speaker = _speaker([slow, good], clock)
    speaker.speak("t1", "hello", SETTINGS, lambda e: None)
    assert clock.armed() == [1.0]
    speaker.cancel("t1")
    assert clock.armed() == [] and good.log == []

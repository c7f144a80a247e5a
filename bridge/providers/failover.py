"""The failover speaker, the pure part: one route's providers, its prompts and its fallback.

``Speaker`` sits above the provider pools of one route: a failover chain (a
turn that fails before its first audio is replayed on the next provider with
the text it had so far), the prompt cache (``bridge.providers.prompts``), the
fallback prompt and the first-audio deadline (``bridge.providers.first_audio``).
It sees a pool only through ``Pool`` (open a turn, get a ``TurnHandle``) and
time only through the ``clock`` and ``call_at`` it is given: tests drive it
with fake pools and a fake clock; the shell (``bridge.io.provider_pool``) gives
it the loop's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from bridge.engine import Event, LocalProtocolError
from bridge.logs import get_logger
from bridge.providers.base import (
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    UsageReported,
    WordsTimed,
    WordTiming,
)
from bridge.providers.first_audio import FIRST_AUDIO_TIMEOUT_KIND, FirstAudioDeadlines
from bridge.providers.prompts import (
    Flight,
    PromptCache,
    PromptKey,
    TurnFellBack,
    Waiter,
    provider_identity,
)

__all__ = [
    "AudioSink",
    "Pool",
    "Sink",
    "Speaker",
    "TurnHandle",
    "WordsSink",
    "pool_identity",
    "prompt_key",
    "render_prompt",
]

log = get_logger("callbridge.tts")

Sink = Callable[[Event], None]
AudioSink = Callable[[bytes, AudioFormat], None]
"""A turn's audio, straight from the engine (``receive_*_fast``): no event object, no drain."""
WordsSink = Callable[[tuple[WordTiming, ...]], None]
"""A turn's word timings, straight from the engine, likewise."""


@runtime_checkable
class TurnHandle(Protocol):
    """Commands for one turn on one provider connection."""

    def send_text(self, text: str) -> None: ...

    def end(self) -> None: ...

    def cancel(self) -> None: ...

    def watch_dry(self, on_provider: Callable[[], None]) -> bool:
        """The turn ran dry: whether its connection holds bytes unread (and may call
        ``on_provider`` later: ``bridge.media.underrun``)."""
        ...


class Pool(Protocol):
    """What the speaker uses of one provider's pool."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> ProviderSettings: ...

    prompt_identity: str | None

    def open_turn(
        self,
        turn_id: str,
        settings: TurnSettings,
        sink: Sink,
        audio_sink: AudioSink | None = None,
        words_sink: WordsSink | None = None,
    ) -> TurnHandle: ...


class _Timer(Protocol):
    def cancel(self) -> None: ...


# ------------------------------------------------------------ prompt cache
# The cache itself is ``bridge.providers.prompts.PromptCache``; this starts its renders
# on a pool and feeds their events back to it.


def pool_identity(pool: Pool) -> str:
    """``provider_identity`` of the pool's provider (computed once per pool)."""
    ident = pool.prompt_identity
    if ident is None:
        ident = pool.prompt_identity = provider_identity(pool.settings)
    return ident


def prompt_key(pool: Pool, settings: TurnSettings, text: str) -> PromptKey:
    """What names a prompt's audio, for ``text`` spoken by ``pool`` with ``settings``."""
    voice = settings.voice or pool.settings.voice
    return PromptKey(pool.name, pool_identity(pool), voice, settings.audio_format,
                     settings.speed, text)  # fmt: skip


def _turn_settings(pool: Pool, settings: TurnSettings) -> TurnSettings:
    if not settings.voice and pool.settings.voice:
        return replace(settings, voice=pool.settings.voice)
    return settings


def render_prompt(
    cache: PromptCache,
    pool: Pool,
    settings: TurnSettings,
    text: str,
    turn_id: str,
    sink: Sink,
    *,
    lead: bool = True,
) -> tuple[str | None, Waiter | None]:
    """``text`` as a prompt for turn ``turn_id``: from the cache, by joining the render in
    flight, or by starting one on ``pool`` (``PromptCache.request``'s answer)."""
    outcome, waiter = cache.request(prompt_key(pool, settings, text), turn_id, sink, lead=lead)
    if outcome == "lead" and waiter is not None:
        _start_flight(cache, pool, waiter.flight, _turn_settings(pool, settings), text)
    return outcome, waiter


def _start_flight(
    cache: PromptCache, pool: Pool, flight: Flight, settings: TurnSettings, text: str
) -> None:
    """One attempt at a render; a failure before audio is retried once (the engine says)."""

    def on_event(event: Event) -> None:
        if isinstance(event, TurnFailed | ProviderFailed):
            kind, message, retryable = event.kind, event.message, event.retryable
            if cache.flight_failed(flight, kind, message, retryable):
                log.warning("tts.prompt_retry", provider=pool.name, kind=kind)
                _start_flight(cache, pool, flight, settings, text)
            elif flight.done:
                log.warning("tts.prompt_failed", provider=pool.name, kind=kind)
            return
        if isinstance(event, UsageReported):  # a render shared by many calls: logged once
            log.info("provider.usage", provider=pool.name, prompt=flight.wire_id, usage=event.usage)
            return
        cache.flight_event(flight, event)

    try:
        handle = flight.handle = pool.open_turn(flight.wire_id, settings, on_event)
        handle.send_text(text)
        handle.end()
    except LocalProtocolError as e:
        on_event(TurnFailed(flight.wire_id, "open_refused", str(e), retryable=True))


# ----------------------------------------------------------------- speaker


class _SpokenTurn:
    def __init__(self, turn_id: str, settings: TurnSettings, sink: Sink, cacheable: bool) -> None:
        self.turn_id = turn_id
        self.settings = settings
        self.sink = sink
        self.text: list[str] = []
        self.ended = False
        self.got_audio = False
        self.chain_index = 0
        self.handle: TurnHandle | None = None
        self.cacheable = cacheable
        self.waiter: Waiter | None = None
        """The render this turn waits on (a prompt, or the fallback prompt)."""
        self.fell_back = False
        self.attempt = 0
        """Bumped at each start on a provider and when one is given up: events of an
        earlier attempt (a provider cancelled at its first-audio deadline) are dropped."""


class Speaker:
    """One route's providers: a failover chain, the prompt cache and the fallback prompt.

    A turn that fails (``TurnFailed`` or ``ProviderFailed``) before its first
    audio is replayed on the next provider of the chain with all the text it
    had; one that fails after audio started ends with the failure event (a
    caller cannot un-hear half a sentence). A cacheable turn (a prompt) is
    served by the cache: a hit, a render in flight, or a new render shared
    with every identical request (``bridge.providers.prompts``). A turn that
    fails on every provider before its first audio plays ``fallback_prompt``
    when the cache holds it (or is rendering it): ``TurnFellBack`` first, so
    the call reports the error, then the fallback's audio as the turn's own.

    First-audio deadline (``first_audio_timeouts``, one per pool, 0 or none:
    off): a turn that has somewhere else to go (a next provider in the chain, or
    the fallback prompt in the cache) and still has no audio that long after its
    first provider got its whole text (one budget for the turn, whatever provider
    it is on: ``bridge.providers.first_audio``) is cancelled on that provider
    (late audio is dropped) and fails there with kind ``first_audio_timeout``: it
    falls back at once, or, with no fallback cached, fails over to the next
    provider, which gets a deadline of its own. A prompt render shared with other
    calls is left to go on and fill the cache (``PromptCache.leave``). ``clock`` reads the time and
    ``call_at(when, callback)`` arms the one deadline timer (the shell's are the
    loop's; tests pass a fake clock and fire ``check_deadlines``).
    """

    def __init__(
        self,
        pools: Sequence[Pool],
        cache: PromptCache | None = None,
        fallback_prompt: str = "",
        fallback_voice: str = "",
        first_audio_timeouts: Sequence[float] = (),
        *,
        clock: Callable[[], float],
        call_at: Callable[[float, Callable[[], None]], _Timer],
    ) -> None:
        if not pools:
            raise ValueError("a Speaker needs at least one provider")
        self.pools = pools
        self.cache = cache
        self.fallback_prompt = fallback_prompt
        self.fallback_voice = fallback_voice
        """The voice the fallback prompt was rendered in (the route's: ``static_prompts``)."""
        self.turns: dict[str, _SpokenTurn] = {}
        self.failovers = 0
        self.fallbacks = 0
        self.first_audio_timeouts = tuple(first_audio_timeouts)
        self.first_audio_expired = 0
        """Turns given up on a provider at their first-audio deadline, ever."""
        self._deadlines = FirstAudioDeadlines()
        self._clock = clock
        self._call_at = call_at
        self._timer: _Timer | None = None
        self._timer_at: float | None = None

    def speak(
        self, turn_id: str, text: str, settings: TurnSettings, sink: Sink, cacheable: bool = False
    ) -> None:
        """A complete-text turn (greetings, menus); served from the cache when it can be."""
        turn = _SpokenTurn(turn_id, settings, sink, cacheable and self.cache is not None)
        turn.text.append(text)
        turn.ended = True
        self.turns[turn_id] = turn
        self._start(turn)

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Sink) -> None:
        turn = _SpokenTurn(turn_id, settings, sink, cacheable=False)
        self.turns[turn_id] = turn
        self._start(turn)

    def watch_dry(self, turn_id: str, on_provider: Callable[[], None]) -> bool | None:
        """The turn ran dry: whether its connection holds bytes unread (``TurnHandle.
        watch_dry``, which may call ``on_provider`` later); ``None``: not a turn here."""
        turn = self.turns.get(turn_id)
        if turn is None:
            return None
        handle = turn.handle
        if handle is None and turn.waiter is not None:  # a prompt: its render's turn
            flight_handle = turn.waiter.flight.handle
            handle = flight_handle if isinstance(flight_handle, TurnHandle) else None
        if handle is None:
            return None
        return handle.watch_dry(on_provider)

    def send_text(self, turn_id: str, text: str) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None and turn.handle is not None:
            turn.text.append(text)
            turn.handle.send_text(text)

    def end_turn(self, turn_id: str) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None and turn.handle is not None:
            turn.ended = True
            turn.handle.end()
            self._arm(turn, turn.attempt)

    def cancel(self, turn_id: str) -> None:
        turn = self.turns.pop(turn_id, None)
        if turn is None:
            return
        if turn_id in self._deadlines:
            self._deadlines.disarm(turn_id)
            self._set_timer()
        if turn.handle is not None:
            turn.handle.cancel()
        if turn.waiter is not None and self.cache is not None:
            self.cache.leave(turn.waiter)  # the render goes on for the others and the cache
            turn.waiter = None

    def _start(self, turn: _SpokenTurn) -> None:
        pool = self.pools[turn.chain_index]
        turn.attempt += 1
        attempt = turn.attempt
        if turn.cacheable and self.cache is not None:
            sink = functools.partial(self._on_event, turn)
            _, turn.waiter = render_prompt(
                self.cache, pool, turn.settings, "".join(turn.text), turn.turn_id, sink
            )
            self._arm(turn, attempt)  # a hit has played (and ended) already: nothing armed
            return
        settings = _turn_settings(pool, turn.settings)
        try:
            direct = self._direct_sinks(turn, attempt)
            turn.handle = pool.open_turn(
                turn.turn_id, settings, lambda e: self._on_event(turn, e, attempt), *direct
            )
            text = "".join(turn.text)
            if text:
                turn.handle.send_text(text)
            if turn.ended:
                turn.handle.end()
        except LocalProtocolError as e:
            # the engine refused the turn (no free context, connection closing): a
            # failed turn on this provider, so the next one in the chain gets it and
            # the call hears about it as a provider error rather than ending
            log.warning("tts.open_refused", provider=pool.name, turn_id=turn.turn_id, error=str(e))
            if turn.handle is not None:
                turn.handle.cancel()
                turn.handle = None
            self._on_event(turn, TurnFailed(turn.turn_id, "open_refused", str(e), retryable=True))
            return
        self._arm(turn, attempt)

    def _direct_sinks(
        self, turn: _SpokenTurn, attempt: int
    ) -> tuple[AudioSink | None, WordsSink | None]:
        """The turn's audio and word timings straight to its sink (what ``_on_event``
        does with them)."""
        turns, turn_id, sink = self.turns, turn.turn_id, turn.sink

        def audio_sink(audio: bytes, audio_format: AudioFormat) -> None:
            # else cancelled, or given up at its first-audio deadline: late audio is dropped
            if turns.get(turn_id) is turn and turn.attempt == attempt:
                if not turn.got_audio:
                    self._first_audio(turn)
                sink(AudioReceived(turn_id, audio, audio_format))

        def words_sink(words: tuple[WordTiming, ...]) -> None:
            if turns.get(turn_id) is turn and turn.attempt == attempt:
                sink(WordsTimed(turn_id, words))

        return audio_sink, words_sink

    def _on_event(self, turn: _SpokenTurn, event: Event, attempt: int | None = None) -> None:
        if self.turns.get(turn.turn_id) is not turn:
            return  # cancelled: late events are dropped here too
        if attempt is not None and attempt != turn.attempt:
            return  # a provider given up at its first-audio deadline
        cls = type(event)
        if cls is AudioReceived:  # the bulk of a turn: straight on
            if not turn.got_audio:
                self._first_audio(turn)
            turn.sink(event)
            return
        if cls is WordsTimed:
            turn.sink(event)
            return
        failed = isinstance(event, TurnFailed | ProviderFailed)
        if failed and not turn.got_audio and turn.chain_index + 1 < len(self.pools):
            log.warning(
                "tts.failover",
                turn_id=turn.turn_id,
                provider=self.pools[turn.chain_index].name,
                next=self.pools[turn.chain_index + 1].name,
                kind=getattr(event, "kind", ""),
            )
            self.failovers += 1
            turn.chain_index += 1
            turn.waiter = None
            self._start(turn)
            return
        if failed and not turn.got_audio and self._fall_back(turn, event):
            return
        if isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.turns.pop(turn.turn_id, None)
            turn.waiter = None  # its sink holds the turn: no cycle left behind
            if turn.turn_id in self._deadlines:
                self._deadlines.disarm(turn.turn_id)
                self._set_timer()
        turn.sink(event)

    def _fall_back(self, turn: _SpokenTurn, event: Event) -> bool:
        """Play the fallback prompt as the failed turn's audio, if the cache holds it or is
        rendering it (``TurnFellBack`` first); ``False``: nothing to play, fail as before."""
        pool = self._fallback_pool(turn, cached_only=False)
        if pool is not None and self.cache is not None:
            settings = TurnSettings(self.fallback_voice, turn.settings.audio_format)
            turn.fell_back = True
            self.fallbacks += 1
            if turn.handle is not None:
                turn.handle = None  # failed: the text still to come has nowhere to go
            kind, message = getattr(event, "kind", ""), getattr(event, "message", "")
            log.warning("tts.fallback_prompt", turn_id=turn.turn_id, provider=pool.name, kind=kind)
            turn.sink(TurnFellBack(turn.turn_id, kind, message))
            if self.turns.get(turn.turn_id) is not turn:
                return True  # the call let go of the turn meanwhile
            sink = functools.partial(self._on_event, turn)
            _, turn.waiter = render_prompt(
                self.cache, pool, settings, self.fallback_prompt, turn.turn_id, sink, lead=False
            )
            return True
        return False

    def _fallback_pool(self, turn: _SpokenTurn, cached_only: bool) -> Pool | None:
        """The pool whose rendering of the fallback prompt the cache holds (or, unless
        ``cached_only``, is rendering) for this turn's format; ``None``: none."""
        if turn.fell_back or not self.fallback_prompt or self.cache is None:
            return None
        settings = TurnSettings(self.fallback_voice, turn.settings.audio_format)
        for pool in self.pools:
            key = prompt_key(pool, settings, self.fallback_prompt)
            if self.cache.holds(key) or (not cached_only and self.cache.in_flight(key)):
                return pool
        return None

    # ------------------------------------------------- first-audio deadline

    def _first_audio(self, turn: _SpokenTurn) -> None:
        turn.got_audio = True
        if turn.turn_id in self._deadlines:
            self._deadlines.disarm(turn.turn_id)
            self._set_timer()

    def _has_way_out(self, turn: _SpokenTurn) -> bool:
        """Whether a turn given up on its provider now would be heard anyway: a next
        provider to fail over to, or the fallback prompt in the cache."""
        if turn.chain_index + 1 < len(self.pools):
            return True
        return self._fallback_pool(turn, cached_only=True) is not None

    def _now(self) -> float:
        return self._clock()

    def _arm(self, turn: _SpokenTurn, attempt: int) -> None:
        """Start the turn's first-audio deadline on its current provider, if it has one
        (a timeout set, its whole text given, no audio yet, a way out)."""
        index, timeouts = turn.chain_index, self.first_audio_timeouts
        timeout_s = timeouts[index] if index < len(timeouts) else 0.0
        if (
            timeout_s <= 0
            or not turn.ended
            or turn.got_audio
            or turn.fell_back
            or turn.attempt != attempt
            or self.turns.get(turn.turn_id) is not turn
            or not self._has_way_out(turn)
        ):
            return
        self._deadlines.arm(turn.turn_id, self._now(), timeout_s)
        self._set_timer()

    def _set_timer(self) -> None:
        """One timer, at the earliest deadline armed (none with none)."""
        at = self._deadlines.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is None:
            return
        self._timer = self._call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self.check_deadlines(self._now())

    def check_deadlines(self, now: float) -> None:
        """Give up every turn whose first-audio deadline has passed at ``now`` (the
        timer's callback; tests call it with a fake clock)."""
        for turn_id in self._deadlines.expired(now):
            turn = self.turns.get(turn_id)
            if turn is not None and not turn.got_audio and self._has_way_out(turn):
                self._give_up(turn)
        self._set_timer()

    def _give_up(self, turn: _SpokenTurn) -> None:
        """The turn's provider sent no audio in time: cancel the turn there (a shared
        prompt render is only left: it goes on to fill the cache) and fail it over or
        fall back, as for a failure before audio."""
        index = turn.chain_index
        pool = self.pools[index]
        timeout_s = self.first_audio_timeouts[index]
        turn.attempt += 1  # whatever that provider still sends for the turn is dropped
        if turn.handle is not None:
            turn.handle.cancel()
            turn.handle = None
        if turn.waiter is not None and self.cache is not None:
            self.cache.leave(turn.waiter)
            turn.waiter = None
        if self._fallback_pool(turn, cached_only=True) is not None:
            turn.chain_index = len(self.pools) - 1  # the turn's budget is spent: fall back now
        else:
            self._deadlines.restart(turn.turn_id)  # nothing to play: the next provider's own
        self.first_audio_expired += 1
        log.warning(
            "tts.first_audio_timeout", turn_id=turn.turn_id, provider=pool.name, timeout_s=timeout_s
        )
        message = f"no audio from provider {pool.name} within {timeout_s:g} s"
        self._on_event(turn, TurnFailed(turn.turn_id, FIRST_AUDIO_TIMEOUT_KIND, message, True))

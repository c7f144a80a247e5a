"""``AudioTaking``: the fast receive pair for a provider engine that reports audio in one place.

``receive_text_fast`` / ``receive_bytes_fast`` for an engine whose every
``AudioReceived`` goes through ``_report_audio`` (Coda, KugelAudio, Kletso,
zwst): the message is handled by its ``receive_*`` as usual, and the audio it
reports (or the one ``WordsTimed`` it queued) is returned instead of queued
when nothing else was queued.

Not compiled (``bridge/native.py``): the engines inherit from it and from
``bridge.engine.Outbox``, which is; a class cannot have two compiled bases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from bridge.engine import Action, Event
from bridge.providers.base import AudioFormat, AudioPiece, AudioReceived, TurnPiece, WordsTimed

__all__ = ["AudioTaking"]

M = TypeVar("M", str, bytes)


class AudioTaking:
    """``receive_text_fast`` / ``receive_bytes_fast`` for an engine (an ``Outbox``)
    that reports every ``AudioReceived`` through ``_report_audio``.

    The message goes through the engine's own ``receive_text`` /
    ``receive_bytes``; while it does, the first audio reported is kept aside
    rather than queued. If the message queued nothing else (no event, no
    action) that audio is returned as an ``AudioPiece`` for the shell to hand
    over directly; otherwise it is queued where it would have been, and
    ``None`` says to drain as usual. A message with no audio whose whole
    outcome is one ``WordsTimed`` is returned as a ``WordsPiece``. With anything already queued, the
    message is simply handled (its audio must queue behind it). The engine
    sets ``_taking = False`` while handling a message that creates a
    deadline (none is returned then: the shell must re-arm its timer).
    """

    _events: list[Event]
    _actions: list[Action]
    _taking: bool = False
    _taken: tuple[int, AudioPiece] | None = None

    def receive_text(self, text: str, now: float) -> None:
        raise NotImplementedError

    def receive_bytes(self, data: bytes, now: float) -> None:
        raise NotImplementedError

    def _report_audio(self, turn_id: str, audio: bytes, audio_format: AudioFormat) -> None:
        """Report a turn's audio: kept aside while taking, else queued as ``AudioReceived``."""
        if self._taking and self._taken is None:
            self._taken = (len(self._events), (turn_id, audio, audio_format))
        else:
            self._events.append(AudioReceived(turn_id, audio, audio_format))

    def receive_text_fast(self, text: str, now: float) -> TurnPiece | None:
        return self._take(self.receive_text, text, now)

    def receive_bytes_fast(self, data: bytes, now: float) -> TurnPiece | None:
        return self._take(self.receive_bytes, data, now)

    def _take(self, receive: Callable[[M, float], None], msg: M, now: float) -> TurnPiece | None:
        events = self._events
        if events or self._actions:
            receive(msg, now)
            return None
        self._taking = True
        try:
            receive(msg, now)
        finally:
            clean = self._taking  # not turned off by a deadline the message created
            self._taking = False
            taken, self._taken = self._taken, None
        if taken is None:
            if clean and len(events) == 1 and not self._actions and type(events[0]) is WordsTimed:
                timed: WordsTimed = events.pop()  # type: ignore[assignment]
                return timed.turn_id, timed.words
            return None
        at, piece = taken
        if self._events or self._actions:
            self._events.insert(at, AudioReceived(*piece))
            return None
        return piece

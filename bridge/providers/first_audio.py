"""First-audio deadlines: a turn with a fallback must not leave its caller in silence.

A provider that accepts a turn and then says nothing (hung, overloaded, or just
slow) would keep the caller in silence until that provider's own reply timeout
(10 s or more). A turn that has somewhere else to go (the next provider of its
failover chain, or a cached fallback prompt) gets a *first-audio deadline*
instead: ``first_audio_timeout_s`` after the provider has the turn's whole text,
if no audio for it has arrived, the turn is given up on that provider.

``FirstAudioDeadlines`` is the pure part (no clock, no I/O): the shell arms a
turn with the ``now`` it read, disarms it at its first audio or its end, asks
``next_deadline()`` when to wake up, and ``expired(now)`` which turns are due.
What to do with an expired turn (cancel it on the provider, fail over, play the
fallback prompt) is ``bridge.io.provider_ws.Speaker``'s.
"""

from __future__ import annotations

__all__ = ["FIRST_AUDIO_TIMEOUT_KIND", "FirstAudioDeadlines"]

FIRST_AUDIO_TIMEOUT_KIND = "first_audio_timeout"
"""The error kind a turn given up at its first-audio deadline reports (``provider.error``)."""


class FirstAudioDeadlines:
    """Turn ids, each with the time by which its first audio must have arrived."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._due

    def arm(self, turn_id: str, now: float, timeout_s: float) -> bool:
        """Give ``turn_id`` until ``now + timeout_s``; ``False`` (and nothing armed, an
        earlier deadline of the turn dropped) when ``timeout_s`` is 0: off."""
        if timeout_s <= 0:
            self._due.pop(turn_id, None)
            return False
        self._due[turn_id] = now + timeout_s
        return True

    def disarm(self, turn_id: str) -> None:
        """The turn's first audio arrived, or it ended, failed or was cancelled."""
        self._due.pop(turn_id, None)

    def next_deadline(self) -> float | None:
        """The earliest deadline armed, ``None`` with none."""
        return min(self._due.values()) if self._due else None

    def expired(self, now: float) -> list[str]:
        """The turns whose deadline is at or before ``now``, earliest first; each is
        disarmed (it expires once)."""
        due = sorted((at, turn_id) for turn_id, at in self._due.items() if at <= now)
        for _, turn_id in due:
            del self._due[turn_id]
        return [turn_id for _, turn_id in due]

"""First-audio deadlines: a turn with a fallback must not leave its caller in silence.

A provider that accepts a turn and then says nothing (hung, overloaded, or just
slow) would keep the caller in silence until that provider's own reply timeout
(10 s or more). A turn that has somewhere else to go (the next provider of its
failover chain, or a cached fallback prompt) gets a *first-audio deadline*
instead: ``first_audio_timeout_s`` after the provider has the turn's whole text,
if no audio for it has arrived, the turn is given up on that provider.

The deadline is one budget for the turn, not one per provider: it starts
when the turn's first provider has its whole text, and a provider tried after
another failed (fast, or at the deadline) gets what is left of it, so a chain
of silent providers cannot add up their deadlines before the fallback prompt
plays. Only a turn that has no fallback to play when its budget is spent
starts a new budget on its next provider (``restart``).

``FirstAudioDeadlines`` is the pure part (no clock, no I/O): the shell arms a
turn with the ``now`` it read, disarms it at its first audio or its end, asks
``next_deadline()`` when to wake up, and ``expired(now)`` which turns are due.
What to do with an expired turn (cancel it on the provider, fall back or fail
over) is ``bridge.providers.failover.Speaker``'s.
"""

from __future__ import annotations

__all__ = ["FIRST_AUDIO_TIMEOUT_KIND", "FirstAudioDeadlines"]

FIRST_AUDIO_TIMEOUT_KIND = "first_audio_timeout"
"""The error kind a turn given up at its first-audio deadline reports (``provider.error``)."""


class FirstAudioDeadlines:
    """Turn ids, each with the time by which its first audio must have arrived."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}
        self._start: dict[str, float] = {}
        """When each turn's budget started (kept across its providers until ``disarm``)."""

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, turn_id: object) -> bool:
        """Whether the turn has a deadline armed or a budget started (``disarm`` it)."""
        return turn_id in self._due or turn_id in self._start

    def arm(self, turn_id: str, now: float, timeout_s: float) -> bool:
        """Give ``turn_id`` until ``timeout_s`` after its budget started (at its first arm,
        ``now``; armed again for its next provider, the same start); ``False`` (and nothing
        armed, the turn's deadline and budget dropped) when ``timeout_s`` is 0: off."""
        if timeout_s <= 0:
            self.disarm(turn_id)
            return False
        start = self._start.setdefault(turn_id, now)
        self._due[turn_id] = start + timeout_s
        return True

    def restart(self, turn_id: str) -> None:
        """The turn's budget is spent with no fallback to play: the next ``arm`` starts a
        new one (the next provider gets a deadline of its own)."""
        self._due.pop(turn_id, None)
        self._start.pop(turn_id, None)

    def disarm(self, turn_id: str) -> None:
        """The turn's first audio arrived, or it ended, failed or was cancelled."""
        self._due.pop(turn_id, None)
        self._start.pop(turn_id, None)

    def next_deadline(self) -> float | None:
        """The earliest deadline armed, ``None`` with none."""
        return min(self._due.values()) if self._due else None

    def expired(self, now: float) -> list[str]:
        """The turns whose deadline is at or before ``now``, earliest first; each deadline
        expires once (the turn's budget stays spent until ``disarm`` or ``restart``)."""
        due = sorted((at, turn_id) for turn_id, at in self._due.items() if at <= now)
        for _, turn_id in due:
            del self._due[turn_id]
        return [turn_id for _, turn_id in due]

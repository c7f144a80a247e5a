"""Turn deadlines on a provider connection: a turn the provider does not deliver fails.

A turn fails (``TurnFailed(kind="timeout")``) when the provider owes it a reply
(text sent since its last audio, or the turn ended and not done) and nothing
came for ``stall_s``; and when it is not done ``base_s`` + ``s_per_char`` per
character of its text + the duration of the audio it sent, after its last
text. ``TurnDeadlines`` keeps each turn's progress; the shell calls ``late(now,
...)`` every ``TURN_CHECK_S`` while a turn is watched and fails what it returns.
"""

from __future__ import annotations

from bridge.providers.base import AudioFormat

__all__ = [
    "TURN_BASE_S",
    "TURN_CHECK_S",
    "TURN_STALL_S",
    "TURN_S_PER_CHAR",
    "TurnDeadlines",
    "TurnWatch",
]

TURN_STALL_S = 10.0
"""A turn fails (``TurnFailed(kind="timeout")``) when the provider owes it a reply (text
sent since its last audio, or the turn ended and not done) and nothing came for this long."""
TURN_BASE_S = 15.0
TURN_S_PER_CHAR = 0.25
"""And when it is not done ``TURN_BASE_S`` + this much per character of its text + the
duration of the audio it sent, after its last text: about 4 characters a second, a quarter
of speech's rate, so a provider that trickles a frame every few seconds cannot hold a call
silent for ever, while one that sent a turn's audio has the time it takes to play."""
TURN_CHECK_S = 1.0
"""How often a connection with turns in progress looks at their deadlines."""


class TurnWatch:
    """A turn's progress, for its deadlines."""

    __slots__ = ("audio_s", "chars", "ended", "owed_since", "progress_at", "text_at")

    def __init__(self, now: float) -> None:
        self.chars = 0
        self.text_at = now
        """When it was opened or last given text (or ended)."""
        self.progress_at = now
        """When the provider last sent anything for it."""
        self.owed_since: float | None = None
        """Since when the provider owes a reply (None: it has answered all it was sent)."""
        self.ended = False
        self.audio_s = 0.0
        """Seconds of audio received: the caller listens to that much anyway."""

    def progress(self, now: float, audio: bytes | None, audio_format: AudioFormat | None) -> None:
        self.progress_at = now
        if not self.ended:
            self.owed_since = None
        if audio is not None and audio_format is not None:
            self.audio_s += len(audio) / (
                audio_format.sample_rate_hz * audio_format.bytes_per_sample
            )

    def text(self, chars: int, now: float) -> None:
        """Given ``chars`` characters of text: the provider owes audio."""
        self.chars += chars
        self.text_at = now
        if self.owed_since is None:
            self.owed_since = now

    def end(self, now: float) -> None:
        """Its text is complete: the provider owes the rest and its end."""
        self.ended = True
        self.text_at = now
        if self.owed_since is None:
            self.owed_since = now


class TurnDeadlines:
    """The watched turns of one connection, by wire id."""

    __slots__ = ("watches",)

    def __init__(self) -> None:
        self.watches: dict[str, TurnWatch] = {}

    def watch(self, turn_id: str, now: float) -> tuple[TurnWatch, bool]:
        """The turn's watch, and True if it is the first one watched (arm the check)."""
        watch = self.watches.get(turn_id)
        if watch is not None:
            return watch, False
        first = not self.watches
        watch = self.watches[turn_id] = TurnWatch(now)
        return watch, first

    def progress(
        self, turn_id: str, now: float, audio: bytes | None, audio_format: AudioFormat | None
    ) -> None:
        """The provider sent something for the turn (with its audio, if any)."""
        watch = self.watches.get(turn_id) if self.watches else None
        if watch is not None:
            watch.progress(now, audio, audio_format)

    def drop(self, turn_id: str) -> None:
        self.watches.pop(turn_id, None)

    def late(
        self, now: float, stall_s: float, base_s: float, s_per_char: float
    ) -> list[tuple[str, str]]:
        """The turns past a deadline at ``now``, each with what it waited for."""
        late: list[tuple[str, str]] = []
        for turn_id, w in self.watches.items():
            if w.owed_since is not None and now - max(w.owed_since, w.progress_at) >= stall_s:
                late.append((turn_id, f"no audio from the provider for {stall_s:g} s"))
            elif w.chars and now - w.text_at >= base_s + w.chars * s_per_char + w.audio_s:
                late.append((turn_id, f"not done {now - w.text_at:.0f} s after its last text"))
        return late

    def __bool__(self) -> bool:
        return bool(self.watches)

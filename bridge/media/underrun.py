"""Whose underrun: did the provider not send a turn's next audio, or did the daemon not play it?

An underrun is a tick inside a started, unfinished turn with no frame to send
(silence went out instead). This module is the one place that decides, from
facts the call engine and the shell feed it, how many the caller heard and
whose they were. Pure: counts and byte offsets in, verdicts out.

``Underruns`` (one per call, owned by ``CallBridge``):

* ``dry`` (the call engine, on a dry tick): the provider's when it had
  handed over less audio than the turn's played position plus one frame
  (it had not sent the frame's audio yet); otherwise the daemon held audio it
  had (in a filter or a backlog).
* ``silent_tick`` (the shell, on every tick that sent nothing): a buffering
  carrier that still holds frames of the lead (``lead_sent``) plays one of
  them, so a dry tick then leaves no gap and is no underrun (``covered``).
  It names the turn whose underrun still looks like the provider's; the
  shell asks that turn's provider connection whether the audio was waiting
  unread on it, in the kernel or read and not yet handed over
  (``dry_verdict``): if so it is the daemon's (``unread``).
* A ``"watch"`` verdict is settled later by the connection's ``DryWatches``,
  which follows the byte stream's offsets: once everything that waited at
  the dry tick is handed over without the turn's audio, those bytes were other
  turns' audio and the underrun was the provider's after all
  (``provider_after_all``: head-of-line on a shared connection).

The call record's fields: ``underruns`` (``heard``), ``underruns_provider``
(``provider``), ``underruns_provider_busy`` (``provider_busy``) and
``dry_covered`` (``covered``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["DryWatch", "DryWatches", "Underruns", "Verdict", "dry_verdict"]


class Underruns:
    """One call's underruns and whose they were (see the module's docstring)."""

    __slots__ = (
        "_seen",
        "carrier_ahead",
        "covered",
        "provider",
        "provider_busy",
        "suspect",
        "ticks",
    )

    def __init__(self) -> None:
        self.ticks = 0
        """Dry ticks as they happen: a started, unfinished head turn had no frame."""
        self.provider = 0
        """Of those the caller heard: the provider's (it had not sent the audio)."""
        self.provider_busy = 0
        """Of ``provider``: found after a watch, while the turn's connection held other
        turns' audio unread (head-of-line on a shared connection)."""
        self.covered = 0
        """Dry ticks a buffering carrier covered from the lead it held (no gap heard)."""
        self.carrier_ahead = 0
        """Frames a buffering carrier holds beyond the one it plays: the lead sent at a
        talkspurt's start, one less for each tick that sends none."""
        self.suspect: str | None = None
        """The turn whose tick last ran dry for want of the provider's audio, until the
        next tick that sends nothing (``silent_tick``) hands it to the shell."""
        self._seen = 0
        """``ticks`` as of the last tick that sent nothing (or the last lead)."""

    @property
    def heard(self) -> int:
        """Underruns the caller heard: dry ticks less those the carrier's lead covered."""
        return self.ticks - self.covered

    # facts from the call engine

    def dry(
        self, turn_id: str | None, received_samples: float, played_samples: int, frame_samples: int
    ) -> None:
        """The head turn had no frame this tick. ``received_samples``: the turn's audio
        the provider has handed over, at the leg's rate; ``played_samples``: what the
        turn has played; ``turn_id`` None: the turn is gone (not the provider's)."""
        self.ticks += 1
        if turn_id is not None and received_samples < played_samples + frame_samples - 0.5:
            self.provider += 1
            self.suspect = turn_id

    # facts from the shell

    def lead_sent(self, frames: int) -> None:
        """A buffering carrier was sent ``frames`` frames ahead of the one it plays."""
        self.carrier_ahead += frames
        self._seen = self.ticks

    def carrier_cleared(self) -> None:
        """The carrier dropped what it held (``clear``)."""
        self.carrier_ahead = 0

    def silent_tick(self) -> str | None:
        """This tick sent no frame. Returns the turn whose underrun looks like the
        provider's, for the shell to ask its connection about unread bytes (``unread``
        if they wait), or None."""
        suspect = self.suspect
        self.suspect = None
        ahead = self.carrier_ahead
        if ahead:  # the carrier plays a frame it holds
            self.carrier_ahead = ahead - 1
            if self.ticks != self._seen:  # this tick ran dry, and the caller hears no gap
                self.covered += 1
                if suspect is not None and self.provider:
                    self.provider -= 1
                suspect = None
        self._seen = self.ticks
        return suspect

    def unread(self) -> None:
        """The suspect's audio was waiting unread on its connection: the daemon's underrun."""
        if self.provider:
            self.provider -= 1

    def provider_after_all(self) -> None:
        """An underrun ``unread`` gave the daemon was the provider's after all: the bytes
        waiting unread at its tick held none of the turn's audio (``DryWatches``)."""
        self.provider += 1
        self.provider_busy += 1


Verdict = Literal["provider", "daemon", "watch"]
"""``provider``: nothing waited unread, the provider had not sent it; ``daemon``: bytes
waited and stay the daemon's; ``watch``: the daemon's unless ``DryWatches`` says otherwise."""


def dry_verdict(
    kernel_bytes: int, unconsumed_bytes: int, encrypted: bool, window_bytes: int | None
) -> Verdict:
    """The verdict on a dry tick, from what waited unread on the turn's connection then.

    ``kernel_bytes``: what the kernel held unread; ``unconsumed_bytes``: what
    was read and not yet handed over; ``encrypted``: TLS (the kernel counts
    encrypted bytes); ``window_bytes``: a quarter of the receive buffer (None:
    unknown). It stays the daemon's without a watch when so much waits in the
    kernel that the provider may have been held back by the receive window,
    on TLS, and when the window is unknown.
    """
    if not kernel_bytes and not unconsumed_bytes:
        return "provider"
    if encrypted or window_bytes is None or kernel_bytes >= window_bytes:
        return "daemon"
    return "watch"


@dataclass(slots=True)
class DryWatch:
    """An underrun counted as the daemon's while bytes read later may show otherwise."""

    wire_id: str
    mark: int
    """The stream offset where the bytes waiting unread at the dry tick end."""
    on_provider: Callable[[], None]


class DryWatches:
    """The underruns of one provider connection waiting for their verdict."""

    __slots__ = ("watches",)

    def __init__(self) -> None:
        self.watches: list[DryWatch] = []

    def add(self, wire_id: str, mark: int, on_provider: Callable[[], None]) -> None:
        self.watches.append(DryWatch(wire_id, mark, on_provider))

    def audio(self, wire_id: str) -> None:
        """Audio of ``wire_id`` is being handed over: it was waiting unread at its
        watches' dry ticks, which stay the daemon's."""
        self.watches = [w for w in self.watches if w.wire_id != wire_id]

    def settle(self, consumed: int) -> None:
        """Every message before offset ``consumed`` is handed over: the watches whose
        unread bytes are all handed over without their turn's audio were the provider's."""
        keep: list[DryWatch] = []
        for w in self.watches:
            if w.mark <= consumed:
                w.on_provider()
            else:
                keep.append(w)
        self.watches = keep

    def __bool__(self) -> bool:
        return bool(self.watches)

"""Whose underrun: did the provider not send a turn's next audio, or did the daemon not read it?

When a turn runs dry (the call had no frame of it to play), the shell asks its
provider connection what waited unread: bytes in the kernel (``FIONREAD``) and
bytes read but not yet handed over as messages. ``dry_verdict`` judges from
those figures; a ``"watch"`` verdict is settled later by ``DryWatches``, which
follows the byte stream's offsets: once everything that waited at the dry tick
is handed over without the turn's audio, the bytes were other turns' audio and
the underrun was the provider's after all. Pure: offsets in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["DryWatch", "DryWatches", "Verdict", "dry_verdict"]

Verdict = Literal["provider", "daemon", "watch"]
"""``provider``: nothing waited unread, the provider had not sent it; ``daemon``: bytes
waited and stay the daemon's; ``watch``: the daemon's unless ``DryWatches`` says otherwise."""


def dry_verdict(
    kernel_bytes: int, unconsumed_bytes: int, encrypted: bool, window_bytes: int | None
) -> Verdict:
    """The verdict on a dry tick, from what waited unread then.

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
    """The underruns of one connection waiting for their verdict."""

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

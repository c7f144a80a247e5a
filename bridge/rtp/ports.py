"""RTP port allocation over the ``[sip] rtp_ports`` range.

Theory of operation
-------------------
Each call gets one even port for RTP; the odd port above it is its RTCP port
(RFC 3550 §11), so only even ports whose odd partner is inside the range are
handed out. The allocator is pure bookkeeping: the shell binds the sockets,
and if binding fails because the port is in use by another process
(EADDRINUSE) it calls ``mark_unusable(port, now)`` and allocates again. A
marked port is out of the queue for ``cooldown_s`` only: ``allocate(call,
now)`` puts it back once that has passed (another process's socket is
usually gone by then), so no failure burns the range for good. Other bind
failures (descriptors exhausted: EMFILE, ENFILE, ENOBUFS) say nothing about
the port and must not mark it: the shell releases it and refuses the call.

Free ports sit in a queue, shuffled once at start (ports are not predictable
from the range, reliability notes §2.3 rule 5). ``allocate`` takes a random
one among the ``_PICK_WINDOW`` ports at the head of the queue, and
``release`` appends at the tail, so a port just released is reused as late as
possible: stray packets of a finished call do not land in the next call on
that port while the range has room.

Guarantees: a port is never held by two calls; ``allocate`` returns ``None``
on exhaustion (the SIP layer answers 503); ``allocate`` for a call that
already holds a port returns that port; ``release`` is idempotent and
ignores unknown calls.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Hashable
from typing import Final

__all__ = ["UNUSABLE_COOLDOWN_S", "RtpPortAllocator"]

_PICK_WINDOW: Final = 16
UNUSABLE_COOLDOWN_S: Final = 60.0
"""How long a port another process held stays out of the queue before it is tried again."""


class RtpPortAllocator:
    """Even RTP ports (RTCP = port + 1) out of an inclusive range.

    Args:
        port_range: ``(low, high)`` inclusive, as ``[sip] rtp_ports``.
        rng: Randomness for the shuffle and the pick (inject in tests).

    Raises:
        ValueError: the range holds no even/odd pair.
    """

    __slots__ = ("_by_call", "_cooling", "_free", "_owner", "_rng", "_unusable")

    def __init__(self, port_range: tuple[int, int], rng: random.Random | None = None) -> None:
        low, high = port_range
        first = low + (low & 1)
        ports = list(range(first, high, 2))  # p + 1 <= high
        if not ports or low < 1 or high > 65535:
            raise ValueError(f"RTP port range {low}-{high} holds no even/odd port pair")
        self._rng = rng if rng is not None else random.SystemRandom()
        self._rng.shuffle(ports)
        self._free: deque[int] = deque(ports)
        self._by_call: dict[Hashable, int] = {}
        self._owner: dict[int, Hashable] = {}
        self._unusable: dict[int, float] = {}
        """Marked ports and the time each may be tried again."""
        self._cooling: deque[tuple[float, int]] = deque()
        """``(retry_at, port)`` in marking order; an entry whose time is no longer its
        port's (marked again later) is skipped."""

    @property
    def free_count(self) -> int:
        """Ports that can still be allocated."""
        return len(self._free)

    @property
    def unusable_count(self) -> int:
        """Ports marked unusable and still cooling down."""
        return len(self._unusable)

    def usable_count(self, now: float) -> int:
        """Ports a new call could get at ``now`` (cooled-down ports back in the queue)."""
        self._revive(now)
        return len(self._free)

    @property
    def allocated_count(self) -> int:
        """Ports held by calls."""
        return len(self._by_call)

    def port_of(self, call_id: Hashable) -> int | None:
        """The RTP port held by ``call_id``, if any."""
        return self._by_call.get(call_id)

    def allocate(self, call_id: Hashable, now: float | None = None) -> int | None:
        """An even RTP port for ``call_id`` (its RTCP port is +1), or ``None`` if exhausted.

        With ``now``, ports marked unusable whose cool-down has ended are usable again.
        """
        held = self._by_call.get(call_id)
        if held is not None:
            return held
        if now is not None:
            self._revive(now)
        free = self._free
        if not free:
            return None
        offset = self._rng.randrange(min(len(free), _PICK_WINDOW))
        free.rotate(-offset)
        port = free.popleft()
        free.rotate(offset)
        self._by_call[call_id] = port
        self._owner[port] = call_id
        return port

    def release(self, call_id: Hashable) -> None:
        """Give back the port of ``call_id``; again, or for an unknown call: a no-op."""
        port = self._by_call.pop(call_id, None)
        if port is None:
            return
        del self._owner[port]
        if port not in self._unusable:
            self._free.append(port)

    def mark_unusable(self, port: int, now: float, cooldown_s: float = UNUSABLE_COOLDOWN_S) -> None:
        """``port`` (or ``port + 1``) is in use by someone else (EADDRINUSE): out of the
        queue until ``now + cooldown_s``, then handed out again.

        If a call holds it, the call loses it (allocate again for that call).
        Marking a port already marked pushes its retry time out.
        """
        retry_at = now + cooldown_s
        self._unusable[port] = retry_at
        self._cooling.append((retry_at, port))
        call_id = self._owner.pop(port, None)
        if call_id is not None:
            del self._by_call[call_id]
        elif port in self._free:
            self._free.remove(port)

    def _revive(self, now: float) -> None:
        cooling = self._cooling
        unusable = self._unusable
        while cooling and cooling[0][0] <= now:
            retry_at, port = cooling.popleft()
            if unusable.get(port) != retry_at:
                continue  # marked again later: its newer entry decides
            del unusable[port]
            if port not in self._owner:
                self._free.append(port)

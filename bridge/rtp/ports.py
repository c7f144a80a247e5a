"""RTP port allocation over the ``[sip] rtp_ports`` range.

Theory of operation
-------------------
Each call gets one even port for RTP; the odd port above it is its RTCP port
(RFC 3550 §11), so only even ports whose odd partner is inside the range are
handed out. The allocator is pure bookkeeping: the shell binds the sockets,
and if binding fails it calls ``mark_unusable(port)`` and allocates again.

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

__all__ = ["RtpPortAllocator"]

_PICK_WINDOW: Final = 16


class RtpPortAllocator:
    """Even RTP ports (RTCP = port + 1) out of an inclusive range.

    Args:
        port_range: ``(low, high)`` inclusive, as ``[sip] rtp_ports``.
        rng: Randomness for the shuffle and the pick (inject in tests).

    Raises:
        ValueError: the range holds no even/odd pair.
    """

    __slots__ = ("_by_call", "_free", "_owner", "_rng", "_unusable")

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
        self._unusable: set[int] = set()

    @property
    def free_count(self) -> int:
        """Ports that can still be allocated."""
        return len(self._free)

    @property
    def allocated_count(self) -> int:
        """Ports held by calls."""
        return len(self._by_call)

    def port_of(self, call_id: Hashable) -> int | None:
        """The RTP port held by ``call_id``, if any."""
        return self._by_call.get(call_id)

    def allocate(self, call_id: Hashable) -> int | None:
        """An even RTP port for ``call_id`` (its RTCP port is +1), or ``None`` if exhausted."""
        held = self._by_call.get(call_id)
        if held is not None:
            return held
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

    def mark_unusable(self, port: int) -> None:
        """The shell could not bind ``port`` (or ``port + 1``): never hand it out again.

        If a call holds it, the call loses it (allocate again for that call).
        """
        if port in self._unusable:
            return
        self._unusable.add(port)
        call_id = self._owner.pop(port, None)
        if call_id is not None:
            del self._by_call[call_id]
        elif port in self._free:
            self._free.remove(port)

"""Inbound admission policy: source allowlist and per-source INVITE rate limit.

Theory of operation
-------------------
Pure bookkeeping with ``now`` as a parameter. ``SourceAllowlist`` answers
whether an address may talk to us at all (requests from elsewhere are dropped
silently: a scanner learns nothing, reliability.md §2.1). ``InviteRateLimiter``
keeps one token bucket per source IP (refilled at ``rate_per_s`` up to
``burst``); a new INVITE costs one token and is dropped when none is left.
The bucket table is bounded (``MAX_TRACKED_SOURCES``, oldest evicted) so a
spoofed-source flood cannot grow memory.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["MAX_TRACKED_SOURCES", "InviteRateLimiter", "SourceAllowlist"]

MAX_TRACKED_SOURCES = 10_000
"""Most source IPs with a live token bucket."""


class SourceAllowlist:
    """CIDR allowlist; an empty list allows everyone."""

    def __init__(self, cidrs: Iterable[str]) -> None:
        self._networks = [ipaddress.ip_network(c, strict=False) for c in cidrs]

    def allows(self, host: str) -> bool:
        if not self._networks:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._networks)


class InviteRateLimiter:
    """Per-source token buckets; ``rate_per_s <= 0`` disables the limit."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, host: str, now: float) -> bool:
        """Take one token for ``host``; False when its bucket is empty."""
        if self._rate_per_s <= 0:
            return True
        tokens, last = self._buckets.pop(host, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[host] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_TRACKED_SOURCES:
            self._buckets.popitem(last=False)
        return allowed

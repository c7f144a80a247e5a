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

``TrustedProxies`` names the proxies (Kamailio) whose report of the caller
is believed. Such a proxy writes the address it received the request from
into ``CALLER_HEADER`` (removing any copy the caller sent); for a request
from a trusted proxy the allowlist and the rate limit apply to that caller,
not to the proxy, and the header is ignored on a request from anywhere else.
A proxy's own requests (no header) are not rate-limited: the proxy limits
what it forwards, and starving it would starve every caller behind it.

``REFUSAL_REASONS`` is the fixed set of reasons the SIP engine counts its
refusals under (the shell exports them as ``callbridge_rejected_total``).
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from collections.abc import Iterable

__all__ = [
    "CALLER_HEADER",
    "MAX_TRACKED_SOURCES",
    "REFUSAL_REASONS",
    "AuthFailureLimiter",
    "InviteRateLimiter",
    "SourceAllowlist",
    "TrustedProxies",
]

CALLER_HEADER = "X-Callbridge-Source"
"""Header a trusted proxy sets to the address it received the request from."""

REFUSAL_REASONS = (
    "not_allowed",
    "rate_limited",
    "draining",
    "max_calls",
    "auth_failed",
    "no_codec",
    "srtp_mismatch",
)
"""Reasons the SIP engine counts its refusals under (``UaCore.refusals``)."""

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


class TrustedProxies:
    """CIDRs of proxies whose ``CALLER_HEADER`` is believed; empty trusts none."""

    def __init__(self, cidrs: Iterable[str]) -> None:
        self._networks = [ipaddress.ip_network(c, strict=False) for c in cidrs]

    def trusts(self, host: str) -> bool:
        if not self._networks:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    @staticmethod
    def caller(header: str | None) -> str | None:
        """The caller's address from a trusted proxy's header; None if absent or
        not one IP address (the request is then the proxy's own)."""
        if header is None:
            return None
        try:
            return str(ipaddress.ip_address(header.strip()))
        except ValueError:
            return None


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

    def retry_after_s(self, host: str, now: float) -> int:
        """Whole seconds until ``host`` has a token again (at least 1)."""
        if self._rate_per_s <= 0:
            return 1
        tokens, last = self._buckets.get(host, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate_per_s)
        return max(1, math.ceil((1.0 - tokens) / self._rate_per_s))


class AuthFailureLimiter:
    """Per-source count of failed digest answers in a fixed window.

    ``max_failures`` failures within ``window_s`` of a source's first one
    block the source until that window ends (svcrack: one guess per
    challenge, and then none). ``max_failures <= 0`` disables the limit.
    """

    def __init__(self, max_failures: int = 10, window_s: float = 60.0) -> None:
        self._max = max_failures
        self._window_s = window_s
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def _window(self, host: str, now: float) -> tuple[float, int]:
        start, count = self._windows.get(host, (now, 0))
        return (now, 0) if now - start >= self._window_s else (start, count)

    def blocked(self, host: str, now: float) -> bool:
        """Whether ``host`` is refused without a challenge at ``now``."""
        return self._max > 0 and self._window(host, now)[1] >= self._max

    def failed(self, host: str, now: float) -> bool:
        """Count one failure of ``host``; True if that failure blocks it."""
        start, count = self._window(host, now)
        self._windows.pop(host, None)
        self._windows[host] = (start, count + 1)
        if len(self._windows) > MAX_TRACKED_SOURCES:
            self._windows.popitem(last=False)
        return self._max > 0 and count + 1 == self._max

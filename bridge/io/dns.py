"""Host names in SIP destinations, resolved off the media path.

A SIP destination (an API ``originate`` target, a registrar, a dialog's
remote target from a Contact) may name a host. Nothing sends to a name:
``resolve`` asks the loop's resolver (``loop.getaddrinfo``: A/AAAA, on the
loop's executor thread, never blocking the loop) with a timeout, and
``DnsCache`` keeps answers for ``DNS_CACHE_S`` (failures for
``DNS_NEGATIVE_S``) so a transaction's retransmissions cost no lookup.

SRV records (RFC 3263) are not looked up yet: ``sip:user@example.com``
goes to the A/AAAA address of ``example.com`` on port 5060 (or the URI's
port). No resolver library is a dependency of the project for it.
"""

from __future__ import annotations

import asyncio
import socket

__all__ = ["DNS_TIMEOUT_S", "DnsCache", "DnsError", "is_ip_literal", "resolve"]

DNS_TIMEOUT_S = 5.0
"""A lookup not answered within this time fails."""
DNS_CACHE_S = 60.0
"""How long an answer is used before it is looked up again."""
DNS_NEGATIVE_S = 10.0
"""How long a failed lookup is remembered (sends to that name are dropped meanwhile)."""


class DnsError(Exception):
    """A name that could not be resolved (the message says why, naming the host)."""


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (no lookup needed)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return True
    return False


async def resolve(host: str, family: int = socket.AF_INET, timeout_s: float | None = None) -> str:
    """The first ``family`` address of ``host`` (A for AF_INET, AAAA for AF_INET6).

    Raises:
        DnsError: no such host, no address of that family, or no answer in time.
    """
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(DNS_TIMEOUT_S if timeout_s is None else timeout_s):
            infos = await loop.getaddrinfo(host, None, family=family, type=socket.SOCK_DGRAM)
    except TimeoutError:
        raise DnsError(f"no answer for {host!r} within {timeout_s or DNS_TIMEOUT_S:g} s") from None
    except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DnsError(f"cannot resolve {host!r}: {reason}") from None
    for info in infos:
        address = info[4][0]
        if isinstance(address, str):
            return address
    raise DnsError(f"cannot resolve {host!r}: no address")


class DnsCache:
    """Answers (and failures) by host name, with their expiry on the caller's clock."""

    __slots__ = ("_entries", "family")

    def __init__(self, family: int = socket.AF_INET) -> None:
        self.family = family
        self._entries: dict[str, tuple[float, str | None, str]] = {}
        """host -> (expires_at, address or None for a failure, the failure's message)."""

    def get(self, host: str, now: float) -> tuple[str | None, str] | None:
        """``(address, "")`` or ``(None, why)`` while an entry is fresh; else None."""
        entry = self._entries.get(host)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[host]
            return None
        return entry[1], entry[2]

    async def lookup(self, host: str, now: float) -> str:
        """The address of ``host`` from the cache or a fresh lookup (remembered either way).

        Raises:
            DnsError: as ``resolve``, or a failure still remembered.
        """
        cached = self.get(host, now)
        if cached is not None:
            if cached[0] is None:
                raise DnsError(cached[1])
            return cached[0]
        try:
            address = await resolve(host, self.family)
        except DnsError as e:
            self._entries[host] = (now + DNS_NEGATIVE_S, None, str(e))
            raise
        self._entries[host] = (now + DNS_CACHE_S, address, "")
        if len(self._entries) > 1024:  # bounded: drop the oldest entries
            for old in list(self._entries)[:256]:
                del self._entries[old]
        return address

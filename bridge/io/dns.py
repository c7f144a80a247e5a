"""Host names in SIP destinations, resolved off the media path.

A SIP destination (an API ``originate`` target, a registrar, a dialog's
remote target from a Contact) may name a host. Nothing sends to a name:
``resolve`` asks the loop's resolver (``loop.getaddrinfo``: A/AAAA, on the
loop's executor thread, never blocking the loop) with a timeout, and
``DnsCache`` keeps answers for ``DNS_CACHE_S`` (failures for
``DNS_NEGATIVE_S``) so a transaction's retransmissions cost no lookup.

``SipLocator`` is RFC 3263's server location for a next hop (an ``originate``
target or trunk proxy, a registrar): which queries is ``bridge.sip.locate``'s
(pure) decision; this shell asks them with dnspython's asyncio resolver (SRV,
and A/AAAA of the SRV targets), within ``DNS_TIMEOUT_S`` for the whole lookup,
caching every answer for its TTL (``TtlCache``, bounded). With the system's DNS
configuration (no ``[sip] dns_servers``), a host's own address (no SRV) is still
asked of ``getaddrinfo`` (``/etc/hosts`` and the system's resolver), as before.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.message
import dns.nameserver
import dns.rdatatype
import dns.resolver

from bridge.logs import get_logger
from bridge.sip.locate import (
    Located,
    Randint,
    SrvRecord,
    TtlCache,
    choose_srv,
    dns_server_address,
    expand,
    plan_lookup,
)

__all__ = [
    "DNS_TIMEOUT_S",
    "DnsCache",
    "DnsError",
    "SipLocator",
    "is_ip_literal",
    "make_resolver",
    "resolve",
]

log = get_logger("callbridge.dns")

DNS_TIMEOUT_S = 5.0
"""A lookup not answered within this time fails."""
DNS_CACHE_S = 60.0
"""How long an answer is used before it is looked up again."""
DNS_NEGATIVE_S = 10.0
"""How long a failed lookup is remembered (sends to that name are dropped meanwhile)."""
DNS_MAX_TTL_S = 3600.0
"""A record's TTL beyond this is cut to it (a long-lived daemon still sees changes)."""
DNS_NO_RECORDS_S = 60.0
"""A name with no SRV (or no address) whose answer carries no SOA to say for how long."""


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


def make_resolver(servers: Sequence[str] = ()) -> dns.asyncresolver.Resolver | None:
    """A resolver asking ``servers`` (``"ADDRESS"`` or ``"ADDRESS:PORT"``, an IPv6
    address in brackets when it has a port); none: None (``SipLocator`` then builds one
    from the system's configuration when it first needs it)."""
    if not servers:
        return None
    resolver = dns.asyncresolver.Resolver(configure=False)
    nameservers: list[str | dns.nameserver.Nameserver] = [
        dns.nameserver.Do53Nameserver(*dns_server_address(server)) for server in servers
    ]
    resolver.nameservers = nameservers
    return resolver


class SipLocator:
    """RFC 3263 §4 for a next hop: the places to send to, in the order to try them.

    ``resolver``: the dnspython resolver asked (tests give one pointed at a loopback
    server); None: one built from the system's configuration on first use, and a host's
    own address then comes from ``getaddrinfo`` (``/etc/hosts`` included). ``randint``:
    RFC 2782's weighted draw (``random.Random().randint`` unless given).
    """

    def __init__(
        self,
        resolver: dns.asyncresolver.Resolver | None = None,
        family: int = socket.AF_INET,
        timeout_s: float = DNS_TIMEOUT_S,
        randint: Randint | None = None,
        max_entries: int = 1024,
    ) -> None:
        self._resolver = resolver
        self.system = resolver is None
        """The system's DNS configuration: host addresses by ``getaddrinfo``."""
        self.family = family
        self.timeout_s = timeout_s
        self.randint: Randint = randint or random.Random().randint
        self.srv_cache: TtlCache[str, tuple[SrvRecord, ...]] = TtlCache(max_entries)
        """SRV name -> its records (empty: none), for their TTL."""
        self.address_cache: TtlCache[str, tuple[str, ...]] = TtlCache(max_entries)
        """Host name -> its A (or AAAA) addresses (empty: none), for their TTL."""
        self.queries = 0
        """DNS questions asked (not answered from the cache)."""

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _get_resolver(self) -> dns.asyncresolver.Resolver | None:
        if self._resolver is None:
            try:
                self._resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf
            except dns.exception.DNSException as e:
                log.warning("dns.no_configuration", error=str(e))
                return None
        return self._resolver

    async def locate(
        self,
        host: str,
        port: int | None,
        scheme: str = "sip",
        transport: str | None = None,
        supported: Sequence[str] = ("UDP", "TCP", "TLS"),
    ) -> list[Located]:
        """Where ``scheme:host[:port][;transport=...]`` is reached, best first (the SRV
        order; several addresses of one target one after the other).

        Raises:
            DnsError: no SRV target and no host address resolved, or no answer within
                ``timeout_s`` (naming the host).
        """
        plan = plan_lookup(host, port, scheme, transport, supported)
        if is_ip_literal(plan.host):
            return [Located(plan.host, plan.port, plan.transport)]
        try:
            async with asyncio.timeout(self.timeout_s):
                answers: list[Sequence[SrvRecord] | None] = []
                for query in plan.srv:
                    records = await self._srv(query.name)
                    answers.append(records)
                    if any(r.target not in (".", "") for r in records):
                        break  # the first transport with records is the one used
                chosen = choose_srv(plan, answers, self.randint)
                if chosen is not None:
                    found: dict[str, tuple[str, ...]] = {}
                    for record in chosen[1]:
                        if record.target not in found:
                            found[record.target] = await self._addresses(record.target)
                    located = expand(chosen[0], chosen[1], lambda name: found.get(name, ()))
                    if located:
                        return located
                    names = ", ".join(found)
                    raise DnsError(
                        f"cannot resolve {host!r}: its SRV targets ({names}) have no address"
                    )
                addresses = await self._addresses(plan.host)
        except TimeoutError:
            raise DnsError(f"no answer for {host!r} within {self.timeout_s:g} s") from None
        if not addresses:
            raise DnsError(f"cannot resolve {host!r}: no address")
        return [Located(a, plan.port, plan.transport, plan.host) for a in addresses]

    async def _srv(self, name: str) -> tuple[SrvRecord, ...]:
        cached = self.srv_cache.get(name, self._now())
        if cached is not None:
            return cached
        resolver = self._get_resolver()
        if resolver is None:
            return ()
        self.queries += 1
        try:
            answer = await resolver.resolve(
                name, "SRV", lifetime=self.timeout_s, raise_on_no_answer=False
            )
        except dns.resolver.NXDOMAIN as e:
            self.srv_cache.put(name, (), self._now(), _negative_ttl(e))
            return ()
        except dns.exception.DNSException as e:  # no server answered, a timeout, ...
            log.info("dns.srv_failed", name=name, error=str(e))
            self.srv_cache.put(name, (), self._now(), DNS_NEGATIVE_S)
            return ()
        records = tuple(
            SrvRecord(rr.priority, rr.weight, rr.port, rr.target.to_text(omit_final_dot=True))
            for rr in (answer.rrset or ())
        )
        ttl = min(float(answer.chaining_result.minimum_ttl), DNS_MAX_TTL_S)
        self.srv_cache.put(name, records, self._now(), ttl)
        return records

    async def _addresses(self, name: str) -> tuple[str, ...]:
        """``name``'s addresses of the locator's family (empty: none)."""
        cached = self.address_cache.get(name, self._now())
        if cached is not None:
            return cached
        if is_ip_literal(name):
            return (name,)
        self.queries += 1
        if self.system:
            try:
                addresses: tuple[str, ...] = (await resolve(name, self.family, self.timeout_s),)
            except DnsError:
                addresses = ()
            ttl = DNS_CACHE_S if addresses else DNS_NEGATIVE_S
            self.address_cache.put(name, addresses, self._now(), ttl)
            return addresses
        resolver = self._get_resolver()
        assert resolver is not None  # given
        rdtype = "AAAA" if self.family == socket.AF_INET6 else "A"
        try:
            answer = await resolver.resolve(
                name, rdtype, lifetime=self.timeout_s, raise_on_no_answer=False
            )
        except dns.resolver.NXDOMAIN as e:
            self.address_cache.put(name, (), self._now(), _negative_ttl(e))
            return ()
        except dns.exception.DNSException as e:
            log.info("dns.address_failed", name=name, error=str(e))
            self.address_cache.put(name, (), self._now(), DNS_NEGATIVE_S)
            return ()
        addresses = tuple(rr.address for rr in (answer.rrset or ()))
        ttl = min(float(answer.chaining_result.minimum_ttl), DNS_MAX_TTL_S)
        self.address_cache.put(name, addresses, self._now(), ttl)
        return addresses


def _negative_ttl(e: dns.resolver.NXDOMAIN) -> float:
    """RFC 2308: how long a name's absence is remembered (the SOA's minimum and TTL)."""
    responses: dict[object, dns.message.Message] = e.kwargs.get("responses") or {}
    for response in responses.values():
        for rrset in response.authority:
            if rrset.rdtype == dns.rdatatype.SOA and len(rrset):
                return float(min(rrset.ttl, rrset[0].minimum, DNS_MAX_TTL_S))
    return DNS_NO_RECORDS_S

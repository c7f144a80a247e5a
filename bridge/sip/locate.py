"""Locating a SIP server (RFC 3263 §4) from a next hop's URI: the pure part.

The shell (``bridge.io.dns.SipLocator``) asks the questions; this module says
which ones and what the answers mean:

- ``plan_lookup``: a numeric host, or a name with an explicit port, is looked up
  by A/AAAA only (§4.2); a name without a port gets SRV queries first (no NAPTR:
  §4.1 lets a client without it query SRV for the transports it supports):
  ``_sips._tcp`` for ``sips:`` or ``;transport=tls``, ``_sip._tcp`` for
  ``;transport=tcp``, ``_sip._udp`` for ``;transport=udp``, and with no transport
  named, ``_sip._udp`` / ``_sip._tcp`` / ``_sips._tcp`` in that order, for the
  transports this node listens on. ``localhost`` (RFC 6761) is never queried.
- ``choose_srv``: the first query with usable records wins (its transport is the
  one used); a lone record whose target is ``.`` says the service is not offered
  there (RFC 2782): the next query is tried. No records at all: A/AAAA of the host
  at the default port (5060, 5061 for TLS) over the default transport.
- ``order_srv``: RFC 2782's order: lowest priority first; within a priority a
  weighted random draw (weight 0 records first in the running sum, so they are
  chosen rarely; the rest by name, so the outcome depends on the draw only, not on
  the order of the answer), with an injected ``randint`` so tests choose it.
- ``TtlCache``: answers kept for their TTL (bounded), on the caller's clock.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = [
    "DEFAULT_PORTS",
    "Located",
    "LookupPlan",
    "SrvQuery",
    "SrvRecord",
    "TtlCache",
    "choose_srv",
    "dns_server_address",
    "expand",
    "order_srv",
    "plan_lookup",
]

DEFAULT_PORTS = {"UDP": 5060, "TCP": 5060, "TLS": 5061}
"""RFC 3261 §19.1.2: the port of a transport when neither the URI nor SRV names one."""

_SRV_PREFIX = {"UDP": "_sip._udp", "TCP": "_sip._tcp", "TLS": "_sips._tcp"}
_PREFERENCE = ("UDP", "TCP", "TLS")
"""With no transport named: the order SRV is asked for each (UDP, as RFC 3263 §4.1's
default for ``sip:``; TLS is reached by ``_sips._tcp`` for a ``sip:`` URI too)."""

Randint = Callable[[int, int], int]
"""``random.Random().randint``: a uniform integer in ``[a, b]``, both ends included."""


@dataclasses.dataclass(frozen=True, slots=True)
class SrvRecord:
    """One SRV answer (RFC 2782)."""

    priority: int
    weight: int
    port: int
    target: str
    """The target's name, without the trailing dot (``.``: the service is not offered)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SrvQuery:
    """One SRV name to ask for, and the transport its records are for."""

    name: str
    transport: str


@dataclasses.dataclass(frozen=True, slots=True)
class LookupPlan:
    """What to ask for a next hop (``plan_lookup``)."""

    host: str
    srv: tuple[SrvQuery, ...]
    """Asked in order; empty: A/AAAA of ``host`` only."""
    port: int
    """Where the host's own A/AAAA address is reached (explicit, or the default)."""
    transport: str
    """The transport with no SRV answer (named in the URI, or its scheme's default)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Located:
    """One place to send to: an address, its port and the transport (RFC 3263 §4.3)."""

    address: str
    port: int
    transport: str
    name: str = ""
    """The SRV target or host name the address is of ("" for a numeric host)."""


def dns_server_address(value: str) -> tuple[str, int]:
    """``"ADDRESS"`` or ``"ADDRESS:PORT"`` (IPv6: ``"[ADDRESS]:PORT"``, or bare) as
    (address, port), port 53 by default (``[sip] dns_servers``).

    Raises:
        ValueError: not an IP address, or a port outside 1-65535.
    """
    host, port = value.strip(), "53"
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"not ADDRESS or ADDRESS:PORT: {value!r}")
            port = rest[1:]
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    ipaddress.ip_address(host)  # ValueError names the value
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"not a port: {port!r} in {value!r}")
    return host, int(port)


def _is_numeric(host: str) -> bool:
    h = host.strip("[]")
    if ":" in h:
        return True  # IPv6 (a name has no colon)
    parts = h.split(".")
    return len(parts) == 4 and all(p.isdigit() and p.isascii() for p in parts)


def _is_local_name(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def plan_lookup(
    host: str,
    port: int | None,
    scheme: str = "sip",
    transport: str | None = None,
    supported: Sequence[str] = _PREFERENCE,
) -> LookupPlan:
    """What to look up for a hop ``scheme:host[:port][;transport=...]``.

    Args:
        host: the URI's host (a name or an address).
        port: the URI's port; None when it names none.
        scheme: ``sip`` or ``sips``.
        transport: the URI's ``transport`` parameter (any case); None when absent.
        supported: the transports this node can send on (``UDP``, ``TCP``, ``TLS``):
            with no transport named, SRV is asked only for these.
    """
    secure = scheme.lower() == "sips"
    named = transport.upper() if transport else None
    if secure or named == "TLS":
        fixed: str | None = "TLS"
    else:
        fixed = named
    fallback = fixed or "UDP"
    bare = host.strip("[]")
    default_port = DEFAULT_PORTS.get(fallback, 5060)
    if port is not None or _is_numeric(bare) or _is_local_name(bare):
        return LookupPlan(bare, (), port or default_port, fallback)
    name = bare.rstrip(".")
    kinds = (fixed,) if fixed else tuple(t for t in _PREFERENCE if t in supported)
    queries = tuple(SrvQuery(f"{_SRV_PREFIX[k]}.{name}", k) for k in kinds if k in _SRV_PREFIX)
    return LookupPlan(bare, queries, default_port, fallback)


def order_srv(records: Sequence[SrvRecord], randint: Randint) -> list[SrvRecord]:
    """``records`` in the order to try them (RFC 2782): by priority, lowest first;
    within a priority, drawn one at a time with a chance proportional to weight
    (``randint(0, total)``; a record of weight 0 is first in the running sum, so it
    is drawn only on a 0). A lone ``.`` target (the service is not offered) and any
    other ``.`` targets are left out."""
    usable = [r for r in records if r.target not in (".", "")]
    out: list[SrvRecord] = []
    for priority in sorted({r.priority for r in usable}):
        group = [r for r in usable if r.priority == priority]
        # weight 0 first; then by name and port, so that the draw alone decides (an
        # answer's records come in any order)
        group.sort(key=lambda r: (r.weight != 0, r.target, r.port))
        while group:
            total = sum(r.weight for r in group)
            pick = randint(0, total) if total > 0 else 0
            running = 0
            chosen = len(group) - 1
            for i, r in enumerate(group):
                running += r.weight
                if running >= pick:
                    chosen = i
                    break
            out.append(group.pop(chosen))
    return out


def choose_srv(
    plan: LookupPlan,
    answers: Sequence[Sequence[SrvRecord] | None],
    randint: Randint,
) -> tuple[str, list[SrvRecord]] | None:
    """The transport and the ordered records of the first of ``plan.srv`` with a usable
    answer (``answers[i]`` for ``plan.srv[i]``; None or empty: no records, or the query
    failed); None: no SRV at all, use the host's A/AAAA at ``plan.port``."""
    for query, records in zip(plan.srv, answers, strict=False):
        if not records:
            continue
        ordered = order_srv(records, randint)
        if ordered:
            return query.transport, ordered
    return None


def expand(
    transport: str,
    ordered: Sequence[SrvRecord],
    addresses: Callable[[str], Sequence[str]],
) -> list[Located]:
    """Each record's addresses in order (``addresses(target)``: its A or AAAA answer,
    empty if it has none), each place once."""
    out: list[Located] = []
    seen: set[tuple[str, int]] = set()
    for record in ordered:
        for address in addresses(record.target):
            if (address, record.port) not in seen:
                seen.add((address, record.port))
                out.append(Located(address, record.port, transport, record.target))
    return out


K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values kept until their expiry on the caller's clock, at most ``max_entries``
    (when full, the entry expiring soonest goes first)."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: K, value: V, now: float, ttl_s: float) -> None:
        if ttl_s <= 0:
            self._entries.pop(key, None)
            return
        self._entries.pop(key, None)
        if len(self._entries) >= self.max_entries:
            for k in [k for k, (at, _) in self._entries.items() if at <= now]:
                del self._entries[k]
        while len(self._entries) >= self.max_entries:
            del self._entries[min(self._entries, key=lambda k: self._entries[k][0])]
        self._entries[key] = (now + ttl_s, value)

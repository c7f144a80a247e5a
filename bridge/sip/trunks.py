"""SIP trunks: which trunk a call uses, and each trunk's call limits (pure, ``now`` passed in).

``choose_trunk`` picks the trunk of a call out (the one named, else for a ``tel:``
target the only one there is, else none: ``[sip]``'s own settings apply);
``inbound_trunk`` the trunk an inbound call's source address belongs to;
``trunk_credentials`` what answers a challenge from the trunk's side (to a call out,
and to the in-dialog requests of its calls both ways). ``TrunkLimiter`` holds one
trunk's concurrent calls (``max_calls``) and its outbound pacing
(``calls_per_second``: a token bucket as deep as one second's calls, at least one);
a call beyond either is refused at once, never queued, with the reason and how long
to wait.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.sip.digest import DigestCredentials
from bridge.sip.settings import TrunkConfig
from bridge.sip.uri import TargetError

__all__ = [
    "TrunkError",
    "TrunkLimited",
    "TrunkLimiter",
    "TrunkRefusal",
    "choose_trunk",
    "inbound_trunk",
    "trunk_credentials",
]


class TrunkError(TargetError):
    """No trunk fits the call (an unknown name, a ``tel:`` target with several or none)."""


def choose_trunk(trunks: Sequence[TrunkConfig], name: str, target: str) -> TrunkConfig | None:
    """The trunk a call out to ``target`` uses: ``name`` if given, else the only trunk for
    a ``tel:`` target; None for a ``sip:`` target without a name (``[sip]``'s settings).

    Raises:
        TrunkError: ``name`` is not a trunk, or a ``tel:`` target has several trunks to
            choose from and none named (without trunks it is left to ``[sip]``).
    """
    names = ", ".join(t.name for t in trunks) or "none configured"
    if name:
        for t in trunks:
            if t.name == name:
                return t
        raise TrunkError(f"no trunk {name!r} (trunks: {names})")
    if target.strip().strip("<>").lower().startswith("tel:") and trunks:
        if len(trunks) == 1:
            return trunks[0]
        raise TrunkError(f"a tel: target needs a trunk: name one in 'trunk' (trunks: {names})")
    return None


def inbound_trunk(trunks: Sequence[TrunkConfig], source: str) -> TrunkConfig | None:
    """The first trunk whose ``sources`` hold the address ``source``, or None."""
    try:
        address = ipaddress.ip_address(source.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    for t in trunks:
        for cidr in t.sources:
            network = ipaddress.ip_network(cidr, strict=False)
            if address.version == network.version and address in network:
                return t
    return None


def trunk_credentials(trunk: TrunkConfig | None) -> DigestCredentials | None:
    """The trunk's ``user``/``password`` (bound to its ``realm`` when set), or None
    without both."""
    if trunk is None or not (trunk.user and trunk.password):
        return None
    return DigestCredentials(trunk.user, trunk.password, trunk.realm or None)


@dataclass(frozen=True, slots=True)
class TrunkRefusal:
    """A call the trunk's limits refuse: ``reason`` is ``max_calls`` or
    ``calls_per_second``; ``retry_after_s`` how long until one more would pass."""

    reason: str
    message: str
    retry_after_s: float


class TrunkLimiter:
    """One trunk's concurrent calls and outbound call rate."""

    def __init__(self, name: str, max_calls: int, calls_per_second: float) -> None:
        self.name = name
        self.max_calls = max_calls
        """Concurrent calls; 0: no limit."""
        self.rate = calls_per_second
        """Calls out per second; 0: no limit."""
        self.depth = max(1.0, calls_per_second)
        self.tokens = self.depth
        self.refilled_at: float | None = None
        self.calls: set[str] = set()

    @property
    def active(self) -> int:
        return len(self.calls)

    def admit(self, now: float, outbound: bool = True) -> TrunkRefusal | None:
        """Whether one more call may start now (an outbound one takes a token)."""
        if self.max_calls and len(self.calls) >= self.max_calls:
            return TrunkRefusal(
                "max_calls",
                f"trunk {self.name!r} has max_calls = {self.max_calls} calls up",
                1.0,
            )
        if not (outbound and self.rate):
            return None
        if self.refilled_at is not None:
            self.tokens = min(self.depth, self.tokens + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        if self.tokens < 1.0:
            wait = (1.0 - self.tokens) / self.rate
            return TrunkRefusal(
                "calls_per_second",
                f"trunk {self.name!r} is at calls_per_second = {self.rate:g}; "
                f"try again in {math.ceil(wait * 1000) / 1000:g} s",
                wait,
            )
        self.tokens -= 1.0
        return None

    def give_back(self) -> None:
        """An admitted call out that was never placed (no RTP port): its token back."""
        if self.rate:
            self.tokens = min(self.depth, self.tokens + 1.0)

    def started(self, call_id: str) -> None:
        self.calls.add(call_id)

    def ended(self, call_id: str) -> None:
        self.calls.discard(call_id)


class TrunkLimited(Exception):
    """A call out refused by its trunk's limits (``refusal`` says which, and the wait)."""

    def __init__(self, refusal: TrunkRefusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal

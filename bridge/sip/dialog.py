"""Dialogs (RFC 3261 §12) and the per-call record the user agent keeps.

Theory of operation
-------------------
A :class:`Dialog` is the state RFC 3261 §12 names: Call-ID, local and remote
tags, local and remote URIs, remote target, route set, CSeq counters. It is
created from the dialog-forming request (UAS, §12.1.1) or response (UAC,
§12.1.2) and builds in-dialog requests (§12.2.1.1) with loose routing: the
Request-URI is the remote target and the route set becomes Route headers,
unless the first route lacks ``lr`` (a strict router), in which case the
Request-URI is that route and the remote target is appended.

Where to send (``next_hop``, the rule ``sends_to_flow`` states): over a stream
transport, the dialog's connection, with the target below as the place to open a
new one should it be gone (``Peer.reopen_to``). Over UDP, the first route (or the remote
target) when its host is an IP literal we can reach; otherwise the *flow* the
dialog came in on (``peer``: the caller's source address and port, as RFC 3581's
``received``/``rport`` report it, or the next hop we sent our INVITE to). A host
we cannot reach is a name (sans-I/O code resolves none: the carrier's edge) or
an address that is not globally routable (RFC 1918, CGNAT, loopback,
link-local, ULA, unspecified) outside the network the flow comes from: a caller
behind NAT names its private address in Contact, and only its NAT binding leads
back.

A :class:`Call` bundles the dialog with what the user agent needs for the
call's lifetime: the INVITE transaction key, SDP state, 2xx retransmission
timer data (§13.3.1.4) and session-timer data (RFC 4028 §10):

* UAS 2xx: resend at T1, 2T1, ... capped at T2 until the ACK; give up (BYE)
  after 64*T1.
* UAS early media: the 183 with SDP is sent again every ``early_refresh_s`` (RFC
  3261 §13.3.1.1: a provisional response a minute, reliable provisionals are not
  needed) until a final response or the cap ``early_until``.
* Session timer: the refresher refreshes at half the interval; the other side
  sends BYE at ``interval - min(32, interval / 3)`` without a refresh.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from bridge.addresses import NOT_ROUTABLE
from bridge.sip.digest import DigestClient, DigestCredentials
from bridge.sip.message import SipRequest, SipResponse
from bridge.sip.sdp import NegotiatedAudio
from bridge.sip.uri import NameAddr, parse_name_addr, parse_uri

__all__ = ["Call", "Dialog", "DialogState", "Peer", "ip_literal", "sends_to_flow"]


class DialogState(enum.Enum):
    EARLY = "early"
    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class Peer:
    """Where a message goes: a UDP address, or a stream connection."""

    addr: tuple[str, int]
    conn_id: int | None = None
    reopen_to: tuple[str, int] | None = None
    """A stream connection's request: where a new connection may go if it is gone."""


def ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def sends_to_flow(target_host: str, flow_host: str) -> bool:
    """Whether a request for ``target_host`` (a Contact's or a route's) goes along the
    dialog's flow (``flow_host``, the address the dialog's messages came from) instead:
    the target is a name (resolved by no engine), unspecified, or an address that is not
    globally routable (``NOT_ROUTABLE``) while the flow comes from outside that network
    (a caller behind NAT). A public target, or one in the flow's own private network (a
    PBX on the daemon's LAN naming another of its hosts), is sent to as named."""
    host = target_host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return True
    if ip.is_unspecified:
        return True
    network = next((net for net in NOT_ROUTABLE if ip in net), None)
    if network is None:
        return False
    try:
        return ipaddress.ip_address(flow_host.strip("[]")) not in network
    except ValueError:
        return True


@dataclass(slots=True)
class Dialog:
    call_id: str
    local: NameAddr
    remote: NameAddr
    remote_target: str
    route_set: list[str]
    local_cseq: int
    remote_cseq: int | None
    peer: Peer
    is_uas: bool
    state: DialogState = DialogState.EARLY

    @property
    def local_tag(self) -> str:
        return self.local.tag or ""

    @property
    def remote_tag(self) -> str:
        return self.remote.tag or ""

    @classmethod
    def from_request(cls, request: SipRequest, local_tag: str, peer: Peer) -> Dialog:
        """UAS side (RFC 3261 §12.1.1)."""
        contacts = request.contacts()
        return cls(
            call_id=request.call_id,
            local=request.to().with_tag(local_tag),
            remote=request.from_(),
            remote_target=str(contacts[0].uri) if contacts else str(request.from_().uri),
            route_set=request.get_all("record-route"),
            local_cseq=0,
            remote_cseq=request.cseq().number,
            peer=peer,
            is_uas=True,
        )

    @classmethod
    def from_response(cls, request: SipRequest, response: SipResponse, peer: Peer) -> Dialog:
        """UAC side (RFC 3261 §12.1.2)."""
        contacts = response.contacts()
        return cls(
            call_id=request.call_id,
            local=request.from_(),
            remote=response.to(),
            remote_target=str(contacts[0].uri) if contacts else request.uri,
            route_set=list(reversed(response.get_all("record-route"))),
            local_cseq=request.cseq().number,
            remote_cseq=None,
            peer=peer,
            is_uas=False,
        )

    def update_target(self, message: SipRequest | SipResponse) -> None:
        """A target refresh (re-INVITE, UPDATE or its 2xx) may change the Contact."""
        contacts = message.contacts()
        if contacts:
            self.remote_target = str(contacts[0].uri)

    def build_request(self, method: str, cseq: int | None = None) -> SipRequest:
        """An in-dialog request without Via (RFC 3261 §12.2.1.1).

        ``cseq`` is given for ACK (the INVITE's number); otherwise the local
        CSeq is incremented.
        """
        if cseq is None:
            self.local_cseq += 1
            cseq = self.local_cseq
        routes = list(self.route_set)
        uri = self.remote_target
        if routes and not parse_name_addr(routes[0]).uri.has_param("lr"):
            uri = str(parse_name_addr(routes[0]).uri)  # strict router (§12.2.1.1)
            routes = [*routes[1:], f"<{self.remote_target}>"]
        request = SipRequest(method=method, uri=uri)
        for route in routes:
            request.add("Route", route)
        request.add("Max-Forwards", "70")
        request.add("From", str(self.local))
        request.add("To", str(self.remote))
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{cseq} {method}")
        return request

    def next_hop(self) -> Peer:
        """Where the dialog's next request goes: the first route or the remote target,
        unless ``sends_to_flow`` says it cannot be reached (then the flow, ``peer``)."""
        target = parse_name_addr(self.route_set[0]).uri if self.route_set else None
        if target is None:
            target = parse_uri(self.remote_target)
        if not target.is_sip or sends_to_flow(target.host, self.peer.addr[0]):
            return self.peer
        secure = target.scheme == "sips" or (target.param("transport") or "").lower() == "tls"
        addr = (target.host, target.port or (5061 if secure else 5060))
        if self.peer.conn_id is not None:  # its connection; a new one to the target if gone
            return Peer(self.peer.addr, self.peer.conn_id, addr)
        return Peer(addr)


@dataclass(slots=True)
class Call:
    """Everything the user agent tracks for one call (one INVITE dialog)."""

    call_id: str
    dialog: Dialog
    is_outbound: bool
    invite: SipRequest
    invite_tx_key: tuple[str, ...] = ()
    remote_sdp: str = ""
    local_sdp: str = ""
    local_sdp_version: int = 1
    audio: NegotiatedAudio | None = None
    answered: bool = False
    established: bool = False
    cancel_requested: bool = False
    provisional_seen: bool = False
    digest: DigestClient | None = None
    """Answers 401/407 challenges to the outbound INVITE (and its retries)."""
    credentials: DigestCredentials | None = None
    """What answers a 401/407 to a request we send in the dialog (BYE, re-INVITE,
    REFER, INFO, UPDATE): the INVITE's credentials (a call out), or the trunk's (a
    call in from a trunk with ``user``/``password``); None: such a challenge fails."""
    last_ack: SipRequest | None = None
    session_retry_done: bool = False
    alternates: list[Peer] = field(default_factory=list)
    """A call out: the next servers to try, in order, if the current one fails before
    any early dialog (RFC 3263 §4.3: 503, a failed connection, a timeout)."""
    # UAS 2xx retransmission (RFC 3261 §13.3.1.4)
    ok_response: SipResponse | None = None
    ok_retransmit_at: float | None = None
    ok_interval_s: float = 0.0
    ok_give_up_at: float | None = None
    # Session timer (RFC 4028)
    session_interval_s: int = 0
    we_refresh: bool = False
    refresh_at: float | None = None
    expire_at: float | None = None
    # Offer/answer in progress
    reinvite_pending: bool = False
    reinvite_server_key: tuple[str, ...] | None = None
    # Early media (UAS): the 183 with SDP, re-sent every ``early_refresh_s`` (RFC 3261
    # §13.3.1.1), until the cap ``early_until`` (then ``EarlyMediaExpired``)
    early_response: SipResponse | None = None
    early_refresh_s: float = 60.0
    early_refresh_at: float | None = None
    early_until: float | None = None
    # Early media (UAC): the last provisional reported (status, SDP), not reported twice
    progress_seen: tuple[int, str] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    timer_at: float | None = None
    """Time of this call's earliest entry in the user agent's timer heap."""

    def next_deadline(self) -> float | None:
        """The earliest of the 2xx retransmit and give-up times, the session timers and
        the early media timers."""
        deadline = None
        for t in (
            self.ok_retransmit_at,
            self.ok_give_up_at,
            self.refresh_at,
            self.expire_at,
            self.early_refresh_at,
            self.early_until,
        ):
            if t is not None and (deadline is None or t < deadline):
                deadline = t
        return deadline

    def arm_session_timer(self, now: float) -> None:
        """(Re)start the RFC 4028 §10 timers after a successful (re)negotiation."""
        self.refresh_at = self.expire_at = None
        if self.session_interval_s <= 0:
            return
        if self.we_refresh:
            self.refresh_at = now + self.session_interval_s / 2
        else:
            interval = self.session_interval_s
            self.expire_at = now + interval - min(32.0, interval / 3)

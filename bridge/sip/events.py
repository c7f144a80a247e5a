"""Actions and events of the SIP user agent (the vocabulary the shell and the ``Call`` see)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.engine import Action, Event
from bridge.sip.sdp import SdesCrypto

__all__ = [
    "Address",
    "AuthFailed",
    "CallCancelled",
    "CallEnded",
    "CallEstablished",
    "CallOffered",
    "CloseStream",
    "DtmfInfoReceived",
    "EarlyMediaExpired",
    "HoldChanged",
    "OutboundCallAnswered",
    "OutboundCallFailed",
    "OutboundCallProgress",
    "OutboundCallRetried",
    "RegistrationRetried",
    "RegistrationStateChanged",
    "SendStream",
    "SrtpKeyChanged",
    "TransferProgress",
]

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SendStream(Action):
    """Write ``data`` on the stream connection ``conn_id`` (SIP over TCP)."""

    conn_id: int
    data: bytes
    reopen_to: tuple[str, int] | None = None
    """A request of a dialog: where to open a connection if ``conn_id`` is gone (its
    Contact or route, RFC 3261 §18.1.1); None: nowhere (a caller behind NAT)."""


@dataclass(frozen=True, slots=True)
class CloseStream(Action):
    """Close stream connection ``conn_id`` (its framing is broken beyond repair, or it
    failed: ``flow_failed``)."""

    conn_id: int
    flow_failed: bool = False
    """No pong came to our keep-alive ping (RFC 5626 §4.4.1): the peer may be gone, so
    drop the connection at once (nothing queued is worth waiting to flush) and report
    it lost."""


@dataclass(frozen=True, slots=True)
class CallOffered(Event):
    """A new INVITE passed every check; answer with ``answer()`` or ``reject()``.

    ``offer_sdp`` is empty for a delayed offer (the SDP answer then arrives in
    the ACK, reported by ``CallEstablished.remote_sdp``).
    """

    call_id: str
    from_uri: str
    to_uri: str
    offer_sdp: str = field(repr=False)  # SDES keys (a=crypto): never in a log line
    source: Address
    request_uri: str
    trunk: str = ""
    """The ``[trunks]`` entry the call came from (by source or digest user), or ``""``."""


@dataclass(frozen=True, slots=True)
class CallEstablished(Event):
    """The ACK for our 2xx arrived: media may flow both ways."""

    call_id: str
    remote_sdp: str = field(default="", repr=False)  # SDES keys: never in a log line


@dataclass(frozen=True, slots=True)
class CallCancelled(Event):
    """The caller cancelled before we answered (we sent 487)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class CallEnded(Event):
    """The dialog is over. ``reason``: remote-bye, local-hangup, ack-timeout,
    session-expired, transaction-timeout."""

    call_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class DtmfInfoReceived(Event):
    """A digit sent in SIP INFO (application/dtmf-relay or application/dtmf)."""

    call_id: str
    digit: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class HoldChanged(Event):
    """The peer re-offered media: hold (sendonly/inactive/0.0.0.0), resume or moved.

    ``direction`` is the peer's offered direction; ``remote_rtp_addr`` where RTP
    must go now (None: send nothing).
    """

    call_id: str
    direction: str
    remote_rtp_addr: Address | None


@dataclass(frozen=True, slots=True)
class SrtpKeyChanged(Event):
    """The peer's re-offer of an SRTP call carries a new key for our suite (RFC 4568
    §7.1.4): what arrives from now on is protected with ``remote`` (ours is unchanged)."""

    call_id: str
    remote: SdesCrypto
    """The peer's new key (never in a ``repr``)."""


@dataclass(frozen=True, slots=True)
class RegistrationStateChanged(Event):
    """A REGISTER completed. ``expires_s`` is the granted time when registered."""

    registration_id: str
    registered: bool
    status: int
    expires_s: int = 0


@dataclass(frozen=True, slots=True)
class TransferProgress(Event):
    """A NOTIFY for our REFER: the sipfrag status line of the transferred call."""

    call_id: str
    status: int
    reason: str
    final: bool


@dataclass(frozen=True, slots=True)
class OutboundCallAnswered(Event):
    """Our INVITE got a 2xx (we sent the ACK)."""

    call_id: str
    answer_sdp: str = field(repr=False)  # SDES keys (a=crypto): never in a log line


@dataclass(frozen=True, slots=True)
class OutboundCallProgress(Event):
    """Our INVITE got a provisional response other than 100: ``180`` ringing, ``183``
    session progress. ``early_sdp`` is the far end's early media answer (empty
    without one: ringing, no early media); reported once per status and SDP."""

    call_id: str
    status: int
    reason: str
    early_sdp: str = field(default="", repr=False)  # SDES keys: never in a log line


@dataclass(frozen=True, slots=True)
class EarlyMediaExpired(Event):
    """An inbound call's early media reached its cap (``early_media`` ``max_s``) without
    a final response: the application answers or rejects it now."""

    call_id: str


@dataclass(frozen=True, slots=True)
class RegistrationRetried(Event):
    """A REGISTER failed at its server (``status``: 503 received or a connection that
    could not be opened, 408 a timeout), a first one or a refresh, and went at once to
    the registrar's next server (RFC 3263 §4.3): ``addr``."""

    registration_id: str
    status: int
    addr: tuple[str, int]


@dataclass(frozen=True, slots=True)
class OutboundCallRetried(Event):
    """Our INVITE's server failed (``status``: 503 received or a failed connection, 408
    a timeout) and the INVITE went again, as a new transaction, to the next server the
    call was given (RFC 3263 §4.3): ``addr``."""

    call_id: str
    status: int
    addr: tuple[str, int]


@dataclass(frozen=True, slots=True)
class OutboundCallFailed(Event):
    """Our INVITE ended without a 2xx (final response, timeout or cancel)."""

    call_id: str
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class AuthFailed(Event):
    """An INVITE's digest answer failed (wrong, replayed, foreign nonce or malformed).

    ``blocked``: the source has failed too often and is refused (403) without
    a challenge until its window passes; one event says so, later refusals are
    only counted. ``username`` is what the peer sent, cut to 64 characters.
    """

    source: str
    transport: str
    username: str
    blocked: bool

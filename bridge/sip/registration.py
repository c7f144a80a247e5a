"""Client registrations (RFC 3261 §10) as data: what to send and when to refresh.

Theory of operation
-------------------
One :class:`Registration` per (registrar, address-of-record). The user agent
asks it for the next REGISTER (``build_request``), feeds it the final
response (``granted_expires_s``) and arms ``refresh_at`` at half the granted
time, so the binding is renewed well before it expires. All REGISTERs of one
registration share a Call-ID and From tag and increment CSeq (§10.2).

A registrar found by RFC 3263 may have several servers (``servers``, in the
order SRV gave them). A REGISTER that fails before the binding is up (503, a
timeout, a connection that cannot be opened) goes at once to the next one
(``next_server``, §4.3); once every server has failed it waits
``FAILURE_RETRY_S`` and starts again from the first. A binding that is up stays
on its server: its refreshes and re-registrations after a dropped connection go
there until one of them fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.sip.dialog import Peer
from bridge.sip.digest import DigestClient
from bridge.sip.message import SipRequest, SipResponse
from bridge.sip.uri import ascii_digits, parse_name_addr

__all__ = ["NEXT_SERVER_STATUSES", "Registration"]

MIN_REFRESH_S = 1.0
FAILURE_RETRY_S = 60.0
"""Retry interval after a failed REGISTER (after every server has failed)."""
NEXT_SERVER_STATUSES = frozenset({408, 503})
"""The failures that move a REGISTER to the next server (RFC 3263 §4.3: a 503, or a
transport failure or timeout, which the user agent reports as 503 and 408)."""


@dataclass(slots=True)
class Registration:
    registration_id: str
    registrar_uri: str
    aor: str
    contact: str
    peer: Peer
    call_id: str
    from_tag: str
    expires_s: int
    digest: DigestClient | None = None
    """Answers the registrar's 401/407 (reset at every refresh and after a result)."""
    cseq: int = 0
    registered: bool = False
    refresh_at: float | None = None
    servers: tuple[Peer, ...] = ()
    """Every server of the registrar, in order (``peer`` is one of them); empty: ``peer``
    only."""
    server_index: int = 0

    def next_server(self) -> bool:
        """After a failure (``NEXT_SERVER_STATUSES``): ``peer`` becomes the next server,
        True; False when none is left (``peer`` is the first again, for the retry)."""
        if len(self.servers) < 2:
            return False
        self.server_index = (self.server_index + 1) % len(self.servers)
        self.peer = self.servers[self.server_index]
        return self.server_index != 0

    def build_request(self, expires_s: int | None = None) -> SipRequest:
        """The next REGISTER (no Via: the transaction layer adds it)."""
        self.cseq += 1
        request = SipRequest(method="REGISTER", uri=self.registrar_uri)
        request.add("Max-Forwards", "70")
        request.add("From", f"<{self.aor}>;tag={self.from_tag}")
        request.add("To", f"<{self.aor}>")
        request.add("Call-ID", self.call_id)
        request.add("CSeq", f"{self.cseq} REGISTER")
        request.add("Contact", self.contact)
        request.add("Expires", str(self.expires_s if expires_s is None else expires_s))
        return request

    def granted_expires_s(self, response: SipResponse) -> int:
        """Expiry the registrar granted our contact (Contact param, else Expires)."""
        ours = parse_name_addr(self.contact).uri
        for contact in response.contacts():
            value = contact.param("expires")
            if contact.uri.host_port == ours.host_port and value and ascii_digits(value):
                return int(value)
        header = (response.get("expires") or "").strip()
        return int(header) if ascii_digits(header) else self.expires_s

    def schedule(self, now: float, granted_s: int) -> None:
        self.registered = granted_s > 0
        self.refresh_at = now + max(MIN_REFRESH_S, granted_s / 2) if granted_s > 0 else None

    def schedule_retry(self, now: float) -> None:
        self.registered = False
        self.refresh_at = now + FAILURE_RETRY_S

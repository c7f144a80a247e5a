"""The SIP user agent engine: inbound and outbound calls over one listening transport.

Theory of operation
-------------------
``SipUserAgent`` = :class:`~bridge.sip.ua_core.UaCore` (transport, parsing,
transactions, stateless errors) + :class:`~bridge.sip.uas.UasAgent` (inbound
calls, admission checks, in-dialog requests, 2xx retransmission, session
timers) + this module: the client side.

Calling contract (the shell's pump)::

    ua.receive_datagram(data, source, now)   # or receive_stream(conn_id, ...)
    ua.handle_timer(now)                     # when now >= ua.next_deadline()
    ua.actions_to_send()  -> SendDatagram / SendStream / CloseStream
    ua.events_received()  -> CallOffered, CallEstablished, CallEnded, ...

After every command (``answer``, ``reject``, ``hangup``, ``invite``,
``refer``, ``send_info``, ``register``, ``unregister``) drain both queues too.

Client-side results are dispatched on the kind of request that was sent
(``_RESPONSE_HANDLERS``):

========  ==============================================================
kind      on a response
========  ==============================================================
invite    1xx (not 100): ``OutboundCallProgress`` (180 ringing, 183 with the
          far end's early media SDP), once per status and SDP;
          2xx: dialog, ACK, ``OutboundCallAnswered`` (or BYE if hung up);
          401/407: answered once per challenge (``DigestClient``: a refused
          answer fails unless ``stale=true``, never a loop); 422: one
          retry with Min-SE; else ``OutboundCallFailed``
reinvite  2xx: ACK, session timer re-armed; 408/481: call ends
register  2xx: ``RegistrationStateChanged``, refresh at half the expiry;
          401/407: one retry with credentials; else failure + retry later;
          a result for a REGISTER that is not the latest is ignored
refer     ``TransferProgress`` (202 accepted, or the failure, final)
other     nothing (BYE, CANCEL, INFO, UPDATE)
========  ==============================================================

Before any of these, a 401/407 to a request sent in a dialog (reinvite, refer,
bye, info, update) with the call's credentials is answered once in a new request
(``UasAgent._answer_in_dialog_challenge``); only what comes after is its result.
The ACK for a 2xx carries the INVITE's credentials (RFC 3261 §13.2.2.4).

A stream connection the shell reports lost (``connection_failed``) fails the
outbound calls waiting for an answer on it (503) and makes the registrations
on it register again on the same ``conn_id`` (the shell opens it anew).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from bridge.engine import LocalProtocolError
from bridge.sip.dialog import Call, Dialog, DialogState, Peer
from bridge.sip.digest import DigestClient, DigestCredentials
from bridge.sip.events import (
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgress,
    OutboundCallRetried,
    RegistrationRetried,
    RegistrationStateChanged,
    TransferProgress,
)
from bridge.sip.message import SipRequest, SipResponse
from bridge.sip.registration import FAILURE_RETRY_S, NEXT_SERVER_STATUSES, Registration
from bridge.sip.sdp import CODECS, SdpError, negotiate, parse_sdp
from bridge.sip.settings import SipSettings
from bridge.sip.ua_core import ClientEntry, ServerEntry
from bridge.sip.uas import ALLOWED_METHODS, UasAgent, challenge_values
from bridge.sip.uri import ascii_digits

__all__ = ["SipUserAgent"]

REREGISTER_AFTER_DROP_S = 1.0
"""A registration whose connection dropped while its binding was up registers again this
soon (not at once: a registrar that closes every connection is not hammered)."""

ResponseHandler = Callable[["SipUserAgent", ClientEntry, SipResponse, float], None]


class SipUserAgent(UasAgent):
    """One user agent per listening transport; see the module docstring."""

    def __init__(self, settings: SipSettings, rng: random.Random | None = None) -> None:
        super().__init__(settings, rng)
        self._registrations: dict[str, Registration] = {}

    # --- outbound calls ------------------------------------------------------------------
    def invite(
        self,
        to_uri: str,
        from_uri: str,
        offer_sdp: str,
        destination: tuple[str, int],
        now: float,
        *,
        credentials: tuple[str, str] | DigestCredentials | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        conn_id: int | None = None,
        from_display: str = "",
        alternates: Sequence[Peer] = (),
    ) -> str:
        """Place an outbound call; returns its call id (the SIP Call-ID).

        Args:
            to_uri: Request-URI and To.
            from_uri: our identity (From).
            offer_sdp: the SDP offer (``bridge.sip.sdp.build_offer``).
            destination: next hop (an outbound proxy or the callee).
            credentials: what answers a 401/407 challenge: (username,
                password), or ``DigestCredentials`` (a trunk's, optionally
                bound to its realm). Per call, so each call may use its own; they
                answer the challenges to the call's in-dialog requests too.
            conn_id: the stream connection to send on (an outbound TCP call; the
                dialog keeps using it), None for a datagram.
            from_display: the display name in From (a trunk's caller name), quoted.
            alternates: the next servers to try, in order (RFC 3263 §4.3), when the
                destination answers 503, its connection fails, or the INVITE times out,
                before any early dialog: the INVITE goes again (CSeq+1, a new branch,
                the same Call-ID and From tag) and ``OutboundCallRetried`` says where.
        """
        call_id = f"{self._token()}@{self.settings.local_host}"
        request = SipRequest(method="INVITE", uri=to_uri)
        request.add("Max-Forwards", "70")
        display = "".join(c for c in from_display if c >= " " and c not in '"\\\x7f')
        name = f'"{display}" ' if display else ""
        request.add("From", f"{name}<{from_uri}>;tag={self._token()}")
        request.add("To", f"<{to_uri}>")
        request.add("Call-ID", call_id)
        request.add("CSeq", "1 INVITE")
        request.add("Contact", self._contact(secure=to_uri.lower().startswith("sips:")))
        request.add("Allow", ", ".join(ALLOWED_METHODS))
        request.add("Supported", "timer")
        if self.settings.session_expires_s > 0:
            request.add("Session-Expires", str(self.settings.session_expires_s))
        for name, value in headers:
            request.add(name, value)
        request.add("Content-Type", "application/sdp")
        request.body = offer_sdp.encode()
        peer = Peer(destination, conn_id)
        dialog = Dialog(call_id, request.from_(), request.to(), to_uri, [], 1, None, peer, False)
        call = Call(call_id, dialog, True, request, local_sdp=offer_sdp)
        call.alternates = list(alternates)
        if credentials is not None:
            call.credentials = _as_credentials(credentials)
            call.digest = DigestClient(call.credentials)
        self._calls[call_id] = call
        self._start_client(request, peer, "invite", call_id, now).credentials = call.credentials
        return call_id

    def connection_failed(self, conn_id: int, now: float) -> None:
        """The shell could not open stream connection ``conn_id`` (or lost it): every
        outbound call not answered yet on it fails now, as a 503 (RFC 3261 §8.1.3.1),
        rather than at Timer B; every registration on it registers again (on the same
        ``conn_id``: the shell opens it again), soon if its binding was up (the
        registrar lost its flow back to us), after ``FAILURE_RETRY_S`` if not (the
        registrar cannot be reached), and a REGISTER waiting on it is abandoned."""
        for call in list(self._calls.values()):
            if call.is_outbound and not call.answered and call.dialog.peer.conn_id == conn_id:
                if self._try_next_server(call, 503, now):
                    continue
                self._calls.pop(call.call_id, None)
                self._events.append(OutboundCallFailed(call.call_id, 503, "Service Unavailable"))
        for registration in self._registrations.values():
            if registration.peer.conn_id != conn_id or registration.expires_s == 0:
                continue
            for key, entry in list(self._client_txs.items()):
                if entry.kind == "register" and entry.ref == registration.registration_id:
                    del self._client_txs[key]  # its answer cannot come back on a lost connection
            if registration.registered:
                registration.registered = False
                registration.refresh_at = now + REREGISTER_AFTER_DROP_S
                self._events.append(
                    RegistrationStateChanged(registration.registration_id, False, 503)
                )
            elif registration.refresh_at is None or registration.refresh_at > now + FAILURE_RETRY_S:
                if self._register_next_server(registration, 503, now):
                    continue
                registration.schedule_retry(now)
                self._events.append(
                    RegistrationStateChanged(registration.registration_id, False, 503)
                )

    def hangup(self, call_id: str, now: float) -> None:
        """End a call: BYE once answered, CANCEL (outbound) or 480 (inbound) before."""
        call = self._calls.get(call_id)
        if call is None:
            raise LocalProtocolError(f"no call {call_id!r}")
        if call.answered:
            self._end_call(call, "local-hangup", now, send_bye=True)
        elif not call.is_outbound:
            self.reject(call_id, 480, "Temporarily Unavailable", now)
        else:
            call.cancel_requested = True
            if call.provisional_seen:
                self._send_cancel(call, now)

    def reinvite(self, call_id: str, offer_sdp: str, now: float) -> None:
        """Send a new offer in the dialog (hold, resume, new media address).

        Raises:
            LocalProtocolError: no answered call, or an offer is already pending.
        """
        call = self._answered(call_id)
        if call.reinvite_pending:
            raise LocalProtocolError(f"an offer is already pending on {call_id!r}")
        call.reinvite_pending = True
        call.local_sdp = offer_sdp
        headers = (("Supported", "timer"), ("Content-Type", "application/sdp"))
        self._send_in_dialog(call, "INVITE", now, body=offer_sdp.encode(), headers=headers)

    def _send_cancel(self, call: Call, now: float) -> None:
        """RFC 3261 §9.1: same Request-URI, Call-ID, From, To, CSeq number and top Via."""
        invite = call.invite
        cancel = SipRequest(method="CANCEL", uri=invite.uri)
        cancel.add("Via", invite.get_all("via")[0])
        for route in invite.get_all("route"):
            cancel.add("Route", route)
        cancel.add("Max-Forwards", "70")
        cancel.add("From", invite.get("from") or "")
        cancel.add("To", invite.get("to") or "")
        cancel.add("Call-ID", call.call_id)
        cancel.add("CSeq", f"{invite.cseq().number} CANCEL")
        self._start_client(cancel, call.dialog.peer, "cancel", call.call_id, now, add_via=False)

    def _retry_invite(self, call: Call, now: float, session_expires: int | None) -> None:
        """A new INVITE with CSeq+1 and a new branch, the same Call-ID, From tag and
        Request-URI (RFC 3261 §22.2), answering every challenge held so far."""
        old = call.invite
        request = SipRequest(method="INVITE", uri=old.uri, body=old.body)
        request.headers = [
            h
            for h in old.headers
            if h[0] not in ("via", "cseq", "authorization", "proxy-authorization")
        ]
        number = old.cseq().number + 1
        request.add("CSeq", f"{number} INVITE")
        if call.digest is not None:
            for name, value in call.digest.headers("INVITE", request.uri, self._token()):
                request.add(name, value)
        if session_expires is not None:
            request.set("Session-Expires", str(session_expires))
            request.set("Min-SE", str(session_expires))
        call.invite = request
        call.dialog.local_cseq = number
        entry = self._start_client(request, call.dialog.peer, "invite", call.call_id, now)
        entry.credentials = call.credentials

    def _on_invite_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        call = self._calls.get(entry.ref)
        if call is None or entry.tx.request is not call.invite:
            if 200 <= response.status < 300:
                self._ack_and_bye_stray(entry, response, now)
            return
        if response.status < 200:
            self._on_invite_provisional(call, response, now)
        elif response.status < 300:
            self._on_invite_success(call, entry, response, now)
        elif response.status in (401, 407) and call.digest is not None:
            if call.digest.on_challenge(response.status, challenge_values(response)):
                self._retry_invite(call, now, None)
            else:
                self._fail_outbound(call, response)
        elif response.status == 422 and not call.session_retry_done:
            call.session_retry_done = True
            min_se = (response.get("min-se") or "").split(";")[0].strip()
            if ascii_digits(min_se):
                self._retry_invite(call, now, int(min_se))
            else:
                self._fail_outbound(call, response)
        elif response.status == 503 and self._try_next_server(call, 503, now):
            return
        else:
            self._fail_outbound(call, response)

    def _try_next_server(self, call: Call, status: int, now: float) -> bool:
        """RFC 3263 §4.3: the INVITE again, to the call's next server, when the current
        one failed (``status``) before an early dialog; False: none left (or too late)."""
        if not call.alternates or call.dialog.remote_tag or call.answered:
            return False
        if call.cancel_requested:
            return False
        call.dialog.peer = call.alternates.pop(0)
        if call.credentials is not None:  # the next server's challenges, not this one's
            call.digest = DigestClient(call.credentials)
        self._events.append(OutboundCallRetried(call.call_id, status, call.dialog.peer.addr))
        self._retry_invite(call, now, None)
        return True

    def _on_invite_provisional(self, call: Call, response: SipResponse, now: float) -> None:
        if response.status > 100 and response.to().tag and not call.dialog.remote_tag:
            call.dialog = Dialog.from_response(call.invite, response, call.dialog.peer)
        first = not call.provisional_seen
        call.provisional_seen = True
        if first and call.cancel_requested:
            self._send_cancel(call, now)
            return
        if response.status > 100 and not call.cancel_requested:
            sdp = ""
            content_type = (response.get("content-type") or "application/sdp").split(";")[0]
            if response.body and content_type.strip().lower() == "application/sdp":
                sdp = response.body.decode("utf-8", "replace")
            if call.progress_seen != (response.status, sdp):  # not a retransmission
                call.progress_seen = (response.status, sdp)
                self._events.append(
                    OutboundCallProgress(call.call_id, response.status, response.reason, sdp)
                )

    def _on_invite_success(
        self, call: Call, entry: ClientEntry, response: SipResponse, now: float
    ) -> None:
        if call.answered:
            if response.to().tag != call.dialog.remote_tag:  # another fork answered too
                self._ack_and_bye_stray(entry, response, now)
            elif call.last_ack is not None:  # a retransmitted 2xx: the ACK was lost
                self._send(call.last_ack, call.dialog.next_hop())
            return
        call.dialog = Dialog.from_response(call.invite, response, call.dialog.peer)
        call.dialog.state = DialogState.CONFIRMED
        call.answered = call.established = True
        call.remote_sdp = response.body.decode("utf-8", "replace")
        self._send_ack(call, call.invite)
        self._uac_session_timer(call, response, now)
        try:
            call.audio = (
                # the answer picks from our offer, which had a trunk's codecs (not
                # always [sip]'s): ours first, then any codec we speak
                negotiate(parse_sdp(call.remote_sdp), (*self.settings.codecs, *CODECS))
                if call.remote_sdp
                else None
            )
        except SdpError:
            call.audio = None
        if call.cancel_requested:
            self._end_call(call, "local-hangup", now, send_bye=True)
            return
        self._events.append(OutboundCallAnswered(call.call_id, call.remote_sdp))

    def _send_ack(self, call: Call, invite: SipRequest) -> None:
        """The ACK for a 2xx is a new request of the dialog with the INVITE's CSeq number
        and credentials (RFC 3261 §13.2.2.4)."""
        ack = call.dialog.build_request("ACK", cseq=invite.cseq().number)
        ack.headers.insert(0, ("via", "Via", self._via()))
        ack.headers += [h for h in invite.headers if h[0].endswith("authorization")]
        call.last_ack = ack
        self._send(ack, call.dialog.next_hop())

    def _ack_and_bye_stray(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        """A 2xx for an INVITE we no longer want (hung up, or a forked answer): ACK it and
        end that dialog with a BYE, which answers a challenge with the call's credentials
        (kept on the INVITE's transaction: the call may be gone)."""
        dialog = Dialog.from_response(entry.tx.request, response, entry.peer)
        call = Call(dialog.call_id, dialog, True, entry.tx.request)
        call.credentials = entry.credentials
        self._send_ack(call, entry.tx.request)
        self._send_in_dialog(call, "BYE", now)

    def _uac_session_timer(self, call: Call, response: SipResponse, now: float) -> None:
        value = response.get("session-expires")
        number = (value or "").split(";")[0].strip()
        if value is None or not ascii_digits(number):
            call.session_interval_s = 0
            return
        call.session_interval_s = int(number)
        call.we_refresh = "refresher=uas" not in value.replace(" ", "").lower()
        self._arm_session_timer(call, now)

    def _fail_outbound(self, call: Call, response: SipResponse) -> None:
        self._calls.pop(call.call_id, None)
        self._events.append(OutboundCallFailed(call.call_id, response.status, response.reason))

    # --- in-dialog client results -------------------------------------------------------------
    def _on_reinvite_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        call = self._calls.get(entry.ref)
        if call is None or response.status < 200:
            return
        call.reinvite_pending = False
        if response.status < 300:
            self._send_ack(call, entry.tx.request)
            call.dialog.update_target(response)
            interval = (response.get("session-expires") or "").split(";")[0].strip()
            if ascii_digits(interval):
                call.session_interval_s = int(interval)
            self._arm_session_timer(call, now)
        elif response.status in (408, 481):
            self._end_call(
                call,
                "transaction-timeout" if response.status == 408 else "remote-gone",
                now,
                send_bye=response.status == 408,
            )
        else:
            self._arm_session_timer(call, now)

    def _on_refer_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        if response.status >= 200:
            final = response.status >= 300
            self._events.append(
                TransferProgress(entry.ref, response.status, response.reason, final)
            )

    def _on_other_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        if entry.kind == "update" and 200 <= response.status < 300:
            call = self._calls.get(entry.ref)
            if call is not None:
                self._arm_session_timer(call, now)

    def _on_client_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        if self._answer_in_dialog_challenge(entry, response, now):
            return
        handler = _RESPONSE_HANDLERS.get(entry.kind, SipUserAgent._on_other_response)
        handler(self, entry, response, now)

    def _on_client_timeout(self, entry: ClientEntry, now: float) -> None:
        self._dialog_auth.pop(entry.key, None)
        call = self._calls.get(entry.ref)
        if entry.kind == "invite" and call is not None and entry.tx.request is call.invite:
            if self._try_next_server(call, 408, now):
                return
            self._calls.pop(call.call_id, None)
            self._events.append(OutboundCallFailed(call.call_id, 408, "Request Timeout"))
        elif entry.kind == "reinvite" and call is not None:
            self._end_call(call, "transaction-timeout", now, send_bye=True)
        elif entry.kind == "register" and entry.ref in self._registrations:
            registration = self._registrations[entry.ref]
            if _stale(entry, registration):
                return
            if self._register_next_server(registration, 408, now):
                return
            registration.schedule_retry(now)
            self._events.append(RegistrationStateChanged(entry.ref, False, 408))

    def _on_server_timeout(self, entry: ServerEntry) -> None:
        """Timer H: no ACK for our non-2xx final response; nothing more to do."""

    # --- registrations ---------------------------------------------------------------------
    def register(
        self,
        registrar: tuple[str, int],
        registrar_uri: str,
        aor: str,
        now: float,
        *,
        credentials: tuple[str, str] | DigestCredentials | None = None,
        expires_s: int | None = None,
        conn_id: int | None = None,
        alternates: Sequence[Peer] = (),
    ) -> str:
        """Register ``aor`` with our Contact; returns the registration id. ``conn_id``:
        the stream connection to the registrar (TCP, TLS), kept for every refresh.
        ``alternates``: the registrar's other servers (RFC 3263), tried in turn when one
        fails (``RegistrationRetried``; ``bridge.sip.registration``)."""
        registration_id = self._token()
        registration = Registration(
            registration_id=registration_id,
            registrar_uri=registrar_uri,
            aor=aor,
            contact=self._contact(secure=registrar_uri.lower().startswith("sips:")),
            peer=Peer(registrar, conn_id),
            call_id=f"{self._token()}@{self.settings.local_host}",
            from_tag=self._token(),
            expires_s=expires_s or self.settings.register_expires_s,
            digest=DigestClient(_as_credentials(credentials)) if credentials else None,
        )
        if alternates:
            registration.servers = (registration.peer, *alternates)
        self._registrations[registration_id] = registration
        self._send_register(registration, now)
        return registration_id

    def unregister(self, registration_id: str, now: float) -> None:
        """Remove the binding (Expires: 0) and stop refreshing."""
        registration = self._registrations.get(registration_id)
        if registration is None:
            raise LocalProtocolError(f"no registration {registration_id!r}")
        registration.expires_s = 0
        registration.refresh_at = None
        self._send_register(registration, now)

    def _send_register(self, registration: Registration, now: float) -> None:
        request = registration.build_request()
        if registration.digest is not None:
            for name, value in registration.digest.headers("REGISTER", request.uri, self._token()):
                request.add(name, value)
        self._start_client(
            request, registration.peer, "register", registration.registration_id, now
        )

    def _on_register_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        registration = self._registrations.get(entry.ref)
        if registration is None or response.status < 200 or _stale(entry, registration):
            return
        if 200 <= response.status < 300:
            if registration.digest is not None:
                registration.digest.reset()
            granted = registration.granted_expires_s(response) if registration.expires_s else 0
            registration.schedule(now, granted)
            self._events.append(
                RegistrationStateChanged(entry.ref, granted > 0, response.status, granted)
            )
            if registration.expires_s == 0:
                del self._registrations[entry.ref]
            return
        if (
            response.status in (401, 407)
            and registration.digest is not None
            and registration.digest.on_challenge(response.status, challenge_values(response))
        ):
            self._send_register(registration, now)
            return
        if registration.digest is not None:
            registration.digest.reset()
        if self._register_next_server(registration, response.status, now):
            return
        registration.schedule_retry(now)
        self._events.append(RegistrationStateChanged(entry.ref, False, response.status))

    def _register_next_server(self, registration: Registration, status: int, now: float) -> bool:
        """RFC 3263 §4.3: after a failure (``status`` 503, or 408 for a timeout) the
        REGISTER goes at once to the registrar's next server, whether the binding was up
        (a refresh that failed) or not; False: no next one (the caller retries later, from
        the first). Not for a removal (``Expires: 0``): that binding is where it was."""
        if status not in NEXT_SERVER_STATUSES or registration.expires_s == 0:
            return False
        was_registered = registration.registered
        if not registration.next_server():
            return False
        registration.registered = False
        registration.refresh_at = None
        if registration.digest is not None:
            registration.digest.reset()  # the next server's challenge, not this one's
        if was_registered:
            self._events.append(
                RegistrationStateChanged(registration.registration_id, False, status)
            )
        self._events.append(
            RegistrationRetried(registration.registration_id, status, registration.peer.addr)
        )
        self._send_register(registration, now)
        return True

    # --- timers ---------------------------------------------------------------------------
    def _tu_deadlines(self) -> list[float]:
        return [r.refresh_at for r in self._registrations.values() if r.refresh_at is not None]

    def _tu_handle_timer(self, now: float) -> None:
        super()._tu_handle_timer(now)
        for registration in list(self._registrations.values()):
            if registration.refresh_at is not None and registration.refresh_at <= now:
                registration.refresh_at = None
                if registration.digest is not None:
                    registration.digest.reset()
                self._send_register(registration, now)


_RESPONSE_HANDLERS: dict[str, ResponseHandler] = {
    "invite": SipUserAgent._on_invite_response,
    "reinvite": SipUserAgent._on_reinvite_response,
    "register": SipUserAgent._on_register_response,
    "refer": SipUserAgent._on_refer_response,
}


def _stale(entry: ClientEntry, registration: Registration) -> bool:
    """A REGISTER transaction that is not the registration's latest (a later one was sent
    after its connection dropped): its result says nothing about the binding now."""
    return entry.tx.request.cseq().number != registration.cseq


def _as_credentials(credentials: tuple[str, str] | DigestCredentials) -> DigestCredentials:
    if isinstance(credentials, DigestCredentials):
        return credentials
    return DigestCredentials(credentials[0], credentials[1])

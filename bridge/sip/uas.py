"""The inbound (UAS) half of the SIP user agent and the in-dialog machinery.

Theory of operation
-------------------
``SipUserAgent`` is the transaction user (RFC 3261 §8, §12-§15) above
:class:`~bridge.sip.ua_core.UaCore`. The shell feeds it datagrams or stream
bytes with ``now``, calls ``handle_timer(now)`` at ``next_deadline()``, and
drains ``actions_to_send()`` (``SendDatagram``, ``SendStream``, ``CloseStream``)
and ``events_received()`` (``CallOffered``, ``CallEstablished``...).

Requests are dispatched by method through ``_HANDLERS`` (table below). Before
any handler, out-of-dialog INVITEs pass the admission checks, cheapest first,
so that nothing expensive is created for a request we refuse:

==========================  ============================================
check                       outcome
==========================  ============================================
source not in allowlist     dropped silently (in ``UaCore``)
caller behind a trusted     403 (the caller as the proxy reports it in
proxy not in allowlist      ``X-Callbridge-Source``; see ``bridge.sip.guard``)
over per-source INVITE rate dropped silently; from a trusted proxy 503 +
                            Retry-After (the caller's bucket refills then)
draining                    503 + Retry-After (OPTIONS too: Kamailio drains)
concurrent calls >= limit   503 + Retry-After
unknown Require tag         420 + Unsupported
Request-URI scheme          416
body not application/sdp    415 + Accept
digest (when configured)    401, same challenge for unknown users and bad passwords
Session-Expires < Min-SE    422 + Min-SE
SDP unparseable / no codec  400 / 488
SRTP mismatch               488 + Warning (``sdp.srtp_refusal``: SDES keys
                            over UDP/TCP, SRTP off or required)
==========================  ============================================

The allowlist, rate, drain, call-limit, digest, no-codec and SRTP (488) refusals
are counted in ``refusals`` under a reason of ``guard.REFUSAL_REASONS`` (the
other protocol errors are not); a 401 counts only when the request carried
credentials (a first challenge is not a refusal).

Then 100 Trying, an early dialog with our To tag, and ``CallOffered``. The
application answers with ``answer(call_id, sdp, now)`` (200 OK, retransmitted
at T1, 2T1... capped at T2 until the ACK; no ACK in 64*T1 -> BYE) or
``reject``. In-dialog requests (re-INVITE, UPDATE, BYE, INFO, NOTIFY,
OPTIONS) are matched by Call-ID and tags (481 otherwise). re-INVITEs and
UPDATEs with SDP are answered automatically from our last local SDP with the
direction mirrored (RFC 3264 §6.1, §8.4) and reported as ``HoldChanged``.
Session timers follow RFC 4028 (see ``bridge.sip.dialog``).

Outbound: ``invite`` (digest retry on 401/407, 422 retry with Min-SE),
``hangup`` (BYE, or CANCEL before answer), ``refer``, ``send_info``,
``register`` (refresh at half the granted expiry, digest auth).

Requests we send in a dialog (BYE, re-INVITE, REFER, INFO, UPDATE) answer a
401/407 with the call's ``credentials`` (``Call.credentials``: a call out's, or
the trunk's on a call in from a trunk): each request gets its own
:class:`~bridge.sip.digest.DigestClient` (``DialogAuth``, kept by client
transaction until its final response), so a challenge is answered once (a
``stale=true`` one once more) in a new request of the dialog (fresh CSeq and
branch, same headers and body), and a challenge to that answer is the request's
failure, as any other final response. A BYE's retry goes out after the call
ended locally (the dialog is kept in its ``DialogAuth``). ACK and CANCEL are
never challenged (RFC 3261 §22.1). Without credentials a 401/407 is a failure.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from bridge.engine import LocalProtocolError
from bridge.sip.dialog import Call, Dialog, DialogState, Peer
from bridge.sip.digest import AuthResult, DigestClient, DigestVerifier, parse_auth_params
from bridge.sip.errors import SipParseError
from bridge.sip.events import (
    AuthFailed,
    CallCancelled,
    CallEnded,
    CallEstablished,
    CallOffered,
    DtmfInfoReceived,
    EarlyMediaExpired,
    HoldChanged,
    SrtpKeyChanged,
    TransferProgress,
)
from bridge.sip.guard import (
    CALLER_HEADER,
    AuthFailureLimiter,
    InviteRateLimiter,
    SourceAllowlist,
    TrustedProxies,
)
from bridge.sip.message import SipRequest, SipResponse
from bridge.sip.sdp import (
    NegotiatedAudio,
    SdpError,
    build_answer,
    negotiate,
    parse_sdp,
    srtp_refusal,
)
from bridge.sip.settings import SipSettings, TrunkConfig
from bridge.sip.transaction import State
from bridge.sip.trunks import inbound_trunk, trunk_credentials
from bridge.sip.ua_core import ClientEntry, ServerEntry, TimerHolder, UaCore, server_key
from bridge.sip.uri import ascii_digits, parse_params

__all__ = ["ALLOWED_METHODS", "RATE_LIMITED", "DialogAuth", "UasAgent", "challenge_values"]

ALLOWED_METHODS = ("INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "UPDATE", "NOTIFY")
KNOWN_METHODS = (*ALLOWED_METHODS, "REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "PRACK", "REFER")
SUPPORTED_OPTIONS = ("timer",)
DTMF_DIGITS = "0123456789*#ABCD"
_ALLOW = ("Allow", ", ".join(ALLOWED_METHODS))
_SUPPORTED = ("Supported", ", ".join(SUPPORTED_OPTIONS))
_SDP = ("Content-Type", "application/sdp")
RATE_LIMITED = "Rate Limited"
"""Reason phrase of the 503 to a trusted proxy for a caller over its INVITE rate:
the shipped kamailio.cfg relays it to the caller instead of failing over."""

_REBUILT = frozenset(
    (
        "via", "route", "max-forwards", "from", "to", "call-id", "cseq", "user-agent",
        "authorization", "proxy-authorization", "content-length",
    )
)  # fmt: skip
"""Headers an in-dialog retry gets afresh rather than from the challenged request."""

Handler = Callable[["UasAgent", SipRequest, ServerEntry, Peer, float], None]


@dataclass(slots=True)
class DialogAuth:
    """What answers the challenges to one request we sent in a dialog (and its retry):
    the dialog (which builds the retry, kept even after a BYE ended the call) and the
    request's own digest client."""

    dialog: Dialog
    digest: DigestClient


class UasAgent(UaCore):
    """The inbound half of the user agent; ``bridge.sip.ua.SipUserAgent`` adds the rest."""

    def __init__(self, settings: SipSettings, rng: random.Random | None = None) -> None:
        super().__init__(settings, rng)
        self._calls: dict[str, Call] = {}
        self._rate = InviteRateLimiter(settings.invite_rate_per_s, settings.invite_burst)
        self._dialog_auth: dict[tuple[str, str], DialogAuth] = {}
        """In-dialog requests with credentials waiting for their final response, by
        client transaction key."""
        self._verifier = self._digest_verifier(settings)
        self._auth_failures = AuthFailureLimiter(
            settings.auth_max_failures, settings.auth_failure_window_s
        )
        self.draining = False

    @staticmethod
    def _digest_verifier(settings: SipSettings) -> DigestVerifier | None:
        users = {u.username: u.password for u in settings.auth_users}
        for t in settings.trunks:  # a digest trunk's user authenticates like [sip.auth]'s
            if t.inbound_auth != "source" and t.user:
                users.setdefault(t.user, t.password)
        if not users:
            return None
        return DigestVerifier(
            settings.auth_realm, settings.auth_secret, users, settings.auth_nonce_lifetime_s
        )

    def apply_settings(self, settings: SipSettings) -> None:
        """Take reloaded settings (SIGHUP): the allowlist, the digest users and realm,
        the INVITE rate limit, ``max_calls``, codecs and session timers apply from the
        next request on; calls in progress go on.

        Raises:
            ValueError: the address or transport differs (that needs a new socket).
        """
        old = self.settings
        if (settings.local_host, settings.local_port, settings.transport) != (
            old.local_host,
            old.local_port,
            old.transport,
        ):
            raise ValueError("the address or transport of a user agent cannot change")
        self.settings = settings
        self._allowlist = SourceAllowlist(settings.allowed_sources)
        self._trusted = TrustedProxies(settings.trusted_proxies)
        if (settings.invite_rate_per_s, settings.invite_burst) != (
            old.invite_rate_per_s,
            old.invite_burst,
        ):
            self._rate = InviteRateLimiter(settings.invite_rate_per_s, settings.invite_burst)
        if (
            settings.auth_users,
            settings.auth_realm,
            settings.auth_secret,
            settings.auth_nonce_lifetime_s,
            settings.trunks,
        ) != (
            old.auth_users,
            old.auth_realm,
            old.auth_secret,
            old.auth_nonce_lifetime_s,
            old.trunks,
        ):
            self._verifier = self._digest_verifier(settings)  # a revoked user fails at once

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    def drain(self) -> None:
        """Refuse new calls (503) and answer OPTIONS 503; existing calls go on."""
        self.draining = True

    # --- request dispatch ------------------------------------------------------------
    def _on_request(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        if request.method not in KNOWN_METHODS:
            self._respond(entry, 501, "Not Implemented", now, headers=(_ALLOW,))
            return
        handler = _HANDLERS.get(request.method)
        if handler is None:
            self._respond(entry, 405, "Method Not Allowed", now, headers=(_ALLOW,))
            return
        unsupported = [t for t in request.get_all("require") if t.lower() not in SUPPORTED_OPTIONS]
        if unsupported and request.method not in ("CANCEL", "BYE"):
            headers = (("Unsupported", ", ".join(unsupported)),)
            self._respond(entry, 420, "Bad Extension", now, headers=headers)
            return
        scheme = request.request_uri().scheme
        if scheme not in ("sip", "sips", "tel"):
            self._respond(entry, 416, "Unsupported URI Scheme", now)
            return
        handler(self, request, entry, peer, now)

    def _in_dialog(self, request: SipRequest, entry: ServerEntry, now: float) -> Call | None:
        """The call whose dialog ``request`` belongs to, or None after answering 481/500."""
        call = self._calls.get(request.call_id)
        tag_ok = call is not None and (
            request.to().tag == call.dialog.local_tag
            and request.from_().tag == call.dialog.remote_tag
        )
        if call is None or not tag_ok:
            self._respond(entry, 481, "Call/Transaction Does Not Exist", now)
            return None
        number = request.cseq().number
        if call.dialog.remote_cseq is not None and number < call.dialog.remote_cseq:
            self._respond(entry, 500, "CSeq Out of Order", now)
            return None
        call.dialog.remote_cseq = number
        if call.dialog.is_uas:
            # the caller's latest flow (a NAT that rebound, a new TCP connection): our
            # next requests go back along it (bridge.sip.dialog, "Where to send")
            call.dialog.peer = entry.peer
        return call

    def _on_invite(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        if request.to().tag is not None:
            call = self._in_dialog(request, entry, now)
            if call is not None:
                self._on_reinvite(call, request, entry, now)
            return
        if self._refuse_source(request, entry, peer, now):
            return
        retry = ("Retry-After", str(self.settings.retry_after_s))
        if self.draining:
            self.refusals["draining"] += 1
            self._respond(
                entry, 503, "Service Unavailable", now, to_tag=self._token(), headers=(retry,)
            )
            return
        if request.call_id in self._calls:
            self._respond(entry, 482, "Loop Detected", now, to_tag=self._token())
            return
        if self.settings.max_calls and len(self._calls) >= self.settings.max_calls:
            self.refusals["max_calls"] += 1
            self._respond(
                entry, 503, "Service Unavailable", now, to_tag=self._token(), headers=(retry,)
            )
            return
        refused, audio, trunk = self._refuse_invite(request, entry, now)
        if refused:
            return
        self._respond(entry, 100, "Trying", now)
        local_tag = self._token()
        dialog = Dialog.from_request(request, local_tag, entry.peer)
        call = Call(request.call_id, dialog, False, request, entry.key)
        call.credentials = trunk_credentials(
            next((t for t in self.settings.trunks if trunk and t.name == trunk), None)
        )
        call.remote_sdp = request.body.decode("utf-8", "replace")
        call.audio = audio
        self._calls[call.call_id] = call
        self._events.append(
            CallOffered(
                call.call_id,
                str(request.from_().uri),
                str(request.to().uri),
                call.remote_sdp,
                peer.addr,
                request.uri,
                trunk,
            )
        )

    def _refuse_source(
        self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float
    ) -> bool:
        """Allowlist and INVITE rate of the caller: True if the INVITE was refused.

        From a trusted proxy the caller is the one its ``X-Callbridge-Source``
        names (the last copy: the nearest proxy appends it), refused with 403 or
        503 + Retry-After so the proxy does not take a live node for a dead one;
        without the header the INVITE is the proxy's own and passes. From anyone
        else the caller is the source address, and an INVITE over its rate is
        dropped silently (a flood learns nothing)."""
        source = peer.addr[0]
        if self._trusted.trusts(source):
            reported = request.get_all(CALLER_HEADER)
            caller = TrustedProxies.caller(reported[-1] if reported else None)
            if caller is None:
                return False
            if not self._allowlist.allows(caller):
                self.refusals["not_allowed"] += 1
                self._respond(entry, 403, "Forbidden", now, to_tag=self._token())
                return True
            if self._rate.allow(caller, now):
                return False
            self.refusals["rate_limited"] += 1
            retry = ("Retry-After", str(self._rate.retry_after_s(caller, now)))
            self._respond(entry, 503, RATE_LIMITED, now, to_tag=self._token(), headers=(retry,))
            return True
        if self._rate.allow(source, now):
            return False
        self.refusals["rate_limited"] += 1
        self._server_txs.pop(entry.key, None)
        self.dropped_messages += 1
        return True

    def _refuse_invite(
        self, request: SipRequest, entry: ServerEntry, now: float
    ) -> tuple[bool, NegotiatedAudio | None, str]:
        """Body type, digest, session interval and SDP checks: (True if answered, the
        negotiated audio of the offer or None without one, the trunk's name or "").

        A trunk's call (``bridge.sip.trunks.inbound_trunk``: its source is in the
        trunk's ``sources``) with ``inbound_auth = "source"`` is not challenged; with
        ``both`` it must answer as the trunk's user; a ``digest`` trunk's call is one
        answering as its user from anywhere. Its codecs and SRTP mode apply."""
        tag = self._token()
        trunk = inbound_trunk(self.settings.trunks, entry.peer.addr[0])
        codecs = trunk.codecs if trunk is not None else self.settings.codecs
        srtp = trunk.srtp if trunk is not None else self.settings.security.srtp
        content_type = (request.get("content-type") or "application/sdp").split(";")[0].strip()
        if request.body and content_type.lower() != "application/sdp":
            self._respond(
                entry,
                415,
                "Unsupported Media Type",
                now,
                to_tag=tag,
                headers=(("Accept", "application/sdp"),),
            )
            return True, None, ""
        if self._verifier is not None and (trunk is None or trunk.inbound_auth != "source"):
            source = entry.peer.addr[0]
            if self._auth_failures.blocked(source, now):
                self.refusals["auth_failed"] += 1
                self._respond(entry, 403, "Forbidden", now, to_tag=tag)
                return True, None, ""
            binding = f"{self.settings.transport}|{source}"
            answer = request.get("authorization")
            result = self._verifier.verify(answer, "INVITE", now, binding)
            if result is AuthResult.FAILED and answer is not None:
                self.refusals["auth_failed"] += 1
                blocked = self._auth_failures.failed(source, now)
                username = _auth_username(answer)
                self._events.append(AuthFailed(source, self.settings.transport, username, blocked))
                if blocked:
                    self._respond(entry, 403, "Forbidden", now, to_tag=tag)
                    return True, None, ""
            if result is AuthResult.OK:
                trunk, refused = self._digest_trunk(trunk, _auth_username(answer or ""))
                if refused:  # a trunk's user, not from where that trunk calls from
                    self.refusals["auth_failed"] += 1
                    self._respond(entry, 403, "Forbidden", now, to_tag=tag)
                    return True, None, ""
                codecs = trunk.codecs if trunk is not None else self.settings.codecs
                srtp = trunk.srtp if trunk is not None else self.settings.security.srtp
            else:
                challenges = self._verifier.challenges(
                    now, stale=result is AuthResult.STALE, binding=binding
                )
                headers = tuple(("WWW-Authenticate", c) for c in challenges)
                self._respond(entry, 401, "Unauthorized", now, to_tag=tag, headers=headers)
                return True, None, ""
        interval = _session_expires(request)[0]
        if interval is not None and interval < self.settings.min_se_s:
            self._respond(
                entry,
                422,
                "Session Interval Too Small",
                now,
                to_tag=tag,
                headers=(("Min-SE", str(self.settings.min_se_s)),),
            )
            return True, None, ""
        name = trunk.name if trunk is not None else ""
        if not request.body:
            return False, None, name
        try:
            audio = negotiate(parse_sdp(request.body.decode("utf-8", "replace")), codecs)
        except SdpError:
            self._respond(entry, 400, "Bad SDP", now, to_tag=tag)
            return True, None, ""
        if audio is None:
            self.refusals["no_codec"] += 1
            self._respond(entry, 488, "Not Acceptable Here", now, to_tag=tag)
            return True, None, ""
        why = srtp_refusal(audio, self.settings.transport, srtp)
        if why is not None:
            self.refusals["srtp_mismatch"] += 1
            warning = ("Warning", f'399 callbridge "{why}"')
            self._respond(entry, 488, "Not Acceptable Here", now, to_tag=tag, headers=(warning,))
            return True, None, ""
        return False, audio, name

    def _digest_trunk(
        self, by_source: TrunkConfig | None, username: str
    ) -> tuple[TrunkConfig | None, bool]:
        """After a good digest answer as ``username``: the call's trunk, and whether it is
        refused (a ``both`` trunk's user from outside its sources, or a ``both`` trunk's
        source answering as someone else)."""
        if by_source is not None and by_source.inbound_auth == "both":
            return (by_source, False) if username == by_source.user else (None, True)
        for t in self.settings.trunks:
            if t.inbound_auth != "source" and t.user == username:
                if t.inbound_auth == "digest" or t is by_source:
                    return t, False
                return None, True
        return None, False

    def _on_ack(self, request: SipRequest, peer: Peer, now: float) -> None:
        call = self._calls.get(request.call_id)
        if call is None or not call.answered or call.is_outbound:
            self.dropped_messages += 1
            return
        call.ok_response = None
        call.ok_retransmit_at = call.ok_give_up_at = None
        if not call.established:
            call.established = True
            self._events.append(
                CallEstablished(call.call_id, request.body.decode("utf-8", "replace"))
            )

    def _on_cancel(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        invite_entry = self._server_txs.get((*server_key(request)[:-1], "INVITE"))
        if invite_entry is None:
            self._respond(entry, 481, "Call/Transaction Does Not Exist", now)
            return
        self._respond(entry, 200, "OK", now)
        if invite_entry.tx.state is State.PROCEEDING:
            call = self._calls.pop(request.call_id, None)
            tag = call.dialog.local_tag if call else self._token()
            self._respond(invite_entry, 487, "Request Terminated", now, to_tag=tag)
            if call is not None:
                self._events.append(CallCancelled(call.call_id))

    def _on_bye(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        call = self._in_dialog(request, entry, now)
        if call is None:
            return
        self._respond(entry, 200, "OK", now)
        self._end_call(call, "remote-bye", now, send_bye=False)

    def _on_options(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        if self.draining:
            retry = ("Retry-After", str(self.settings.retry_after_s))
            self._respond(entry, 503, "Service Unavailable", now, headers=(retry,))
            return
        headers = (_ALLOW, ("Accept", "application/sdp"), _SUPPORTED)
        self._respond(entry, 200, "OK", now, to_tag=self._token(), headers=headers)

    def _on_info(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        call = self._in_dialog(request, entry, now)
        if call is None:
            return
        content_type = (request.get("content-type") or "").split(";")[0].strip().lower()
        body = request.body.decode("utf-8", "replace")
        if not body.strip():
            self._respond(entry, 200, "OK", now)
            return
        if content_type not in ("application/dtmf-relay", "application/dtmf"):
            accept = ("Accept", "application/dtmf-relay, application/dtmf")
            self._respond(entry, 415, "Unsupported Media Type", now, headers=(accept,))
            return
        digit, duration_ms = _parse_dtmf_info(content_type, body)
        if digit is None:
            self._respond(entry, 400, "Bad DTMF Body", now)
            return
        self._respond(entry, 200, "OK", now)
        self._events.append(DtmfInfoReceived(call.call_id, digit, duration_ms))

    def _on_notify(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        call = self._in_dialog(request, entry, now)
        if call is None:
            return
        self._respond(entry, 200, "OK", now)
        first = request.body.decode("utf-8", "replace").split("\r\n", 1)[0].split("\n", 1)[0]
        parts = first.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "SIP/2.0" and ascii_digits(parts[1]):
            state = (request.get("subscription-state") or "").split(";")[0].strip().lower()
            final = state == "terminated" or int(parts[1]) >= 200
            reason = parts[2] if len(parts) > 2 else ""
            self._events.append(TransferProgress(call.call_id, int(parts[1]), reason, final))

    def _on_update(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        call = self._in_dialog(request, entry, now)
        if call is not None:
            self._renegotiate(call, request, entry, now)

    def _on_reinvite(self, call: Call, request: SipRequest, entry: ServerEntry, now: float) -> None:
        if call.reinvite_pending:
            self._respond(entry, 491, "Request Pending", now)
            return
        previous = self._server_txs.get(call.reinvite_server_key or ())
        if previous is not None and previous.tx.state is State.PROCEEDING:
            retry = ("Retry-After", str(self._rng.randint(0, 10)))
            self._respond(entry, 500, "Server Internal Error", now, headers=(retry,))
            return
        call.reinvite_server_key = entry.key
        self._renegotiate(call, request, entry, now)

    def _renegotiate(self, call: Call, request: SipRequest, entry: ServerEntry, now: float) -> None:
        """Answer a re-INVITE/UPDATE: new SDP offer (hold/resume/move) and session refresh."""
        if not call.answered:
            self._respond(entry, 491 if request.method == "INVITE" else 200, "Request Pending", now)
            return
        call.dialog.update_target(request)
        body = call.local_sdp
        if request.body:
            answer = self._auto_answer(call, request.body.decode("utf-8", "replace"))
            if answer is None:
                self._respond(entry, 488, "Not Acceptable Here", now)
                return
            body = answer
        elif request.method == "UPDATE":
            body = ""
        interval, refresher = _session_expires(request)
        if interval is not None and interval < self.settings.min_se_s:
            self._respond(
                entry,
                422,
                "Session Interval Too Small",
                now,
                headers=(("Min-SE", str(self.settings.min_se_s)),),
            )
            return
        headers = [
            ("Contact", self._contact(secure=_secure(call))),
            _ALLOW,
            _SUPPORTED,
            *self._uas_timer_headers(call, request, interval, refresher),
        ]
        if body:
            headers.append(_SDP)
        response = self._respond(entry, 200, "OK", now, headers=tuple(headers), body=body.encode())
        self._arm_session_timer(call, now)
        if request.method == "INVITE":
            self._retransmit_ok(call, response, now)

    def _auto_answer(self, call: Call, offer_text: str) -> str | None:
        try:
            offer = parse_sdp(offer_text)
            local = parse_sdp(call.local_sdp) if call.local_sdp else None
        except SdpError:
            return None
        audio = negotiate(offer, self.settings.codecs)
        if audio is None or local is None:
            return None
        ours = next((m for m in local.media if m.media == "audio" and m.port), None)
        # an SRTP call keeps its key (the offer's tag for our suite); it is not
        # dropped, nor taken up, in the middle of a call (488 then)
        crypto = None
        if ours is not None and ours.crypto:
            key = ours.crypto[0]
            theirs = next((c for c in audio.crypto if c.suite == key.suite), None)
            if theirs is None:
                return None
            crypto = dataclasses.replace(key, tag=theirs.tag)
            before = call.audio.crypto if call.audio is not None else ()
            if all(c.key_salt != theirs.key_salt for c in before if c.suite == key.suite):
                self._events.append(SrtpKeyChanged(call.call_id, theirs))
        elif audio.proto == "RTP/SAVP":
            return None
        address = (
            (ours.connection if ours else None) or local.connection or self.settings.local_host
        )
        port = ours.port if ours else 0
        old = call.audio
        if old is None or (old.remote_direction, old.remote_addr) != (
            audio.remote_direction,
            audio.remote_addr,
        ):
            self._events.append(
                HoldChanged(call.call_id, audio.remote_direction, audio.remote_addr)
            )
        call.audio = audio
        session_id = int(local.origin.session_id) if ascii_digits(local.origin.session_id) else 1
        version = local.origin.session_version
        answer = build_answer(offer, audio, address, port, session_id, version, crypto=crypto)
        if _without_origin(answer) != _without_origin(call.local_sdp):
            answer = build_answer(
                offer, audio, address, port, session_id, version + 1, crypto=crypto
            )
        call.local_sdp = answer
        return answer

    # --- UAS commands --------------------------------------------------------------------
    def early_media(
        self,
        call_id: str,
        answer_sdp: str,
        now: float,
        *,
        max_s: float = 150.0,
        refresh_s: float = 60.0,
    ) -> None:
        """Send ``183 Session Progress`` with ``answer_sdp`` (early media, RFC 3960's
        gateway model): media may flow before the call is answered. The 183 is sent
        again every ``refresh_s`` (RFC 3261 §13.3.1.1; no reliable provisionals needed)
        until ``answer`` or ``reject``; after ``max_s`` (the first 183's time, kept
        when called again) ``EarlyMediaExpired`` asks for one of them. ``answer`` must
        then carry the same SDP (RFC 3264: the 183's was the answer).

        Raises:
            LocalProtocolError: unknown call, outbound call, already answered, or an
                INVITE without an offer (a delayed offer has no early answer).
        """
        call = self._inbound_unanswered(call_id)
        if not call.invite.body:
            raise LocalProtocolError(f"no early media without an offer on {call_id!r}")
        entry = self._server_txs[call.invite_tx_key]
        headers = (("Contact", self._contact(secure=_secure(call))), _ALLOW, _SUPPORTED, _SDP)
        call.early_response = self._respond(
            entry,
            183,
            "Session Progress",
            now,
            to_tag=call.dialog.local_tag,
            headers=headers,
            body=answer_sdp.encode(),
        )
        call.local_sdp = answer_sdp
        call.early_refresh_s = refresh_s
        call.early_refresh_at = now + refresh_s
        if call.early_until is None:
            call.early_until = now + max_s
        self._schedule(call)

    def answer(self, call_id: str, answer_sdp: str, now: float) -> None:
        """Send 200 OK with ``answer_sdp`` (an SDP offer if the INVITE had none).

        Raises:
            LocalProtocolError: unknown call, outbound call, or already answered.
        """
        call = self._inbound_unanswered(call_id)
        entry = self._server_txs[call.invite_tx_key]
        interval, refresher = _session_expires(call.invite)
        headers = [("Contact", self._contact(secure=_secure(call))), _ALLOW, _SUPPORTED, _SDP]
        headers += self._uas_timer_headers(call, call.invite, interval, refresher)
        response = self._respond(
            entry,
            200,
            "OK",
            now,
            to_tag=call.dialog.local_tag,
            headers=tuple(headers),
            body=answer_sdp.encode(),
        )
        call.answered = True
        call.local_sdp = answer_sdp
        call.early_response = call.early_refresh_at = call.early_until = None
        call.dialog.state = DialogState.CONFIRMED
        self._arm_session_timer(call, now)
        self._retransmit_ok(call, response, now)

    def reject(
        self,
        call_id: str,
        status: int,
        reason: str,
        now: float,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Answer the INVITE with a final non-2xx response (e.g. 486 Busy Here)."""
        if not 300 <= status <= 699:
            raise LocalProtocolError(f"reject needs a 3xx-6xx status, not {status}")
        call = self._inbound_unanswered(call_id)
        entry = self._server_txs[call.invite_tx_key]
        del self._calls[call_id]
        self._respond(entry, status, reason, now, to_tag=call.dialog.local_tag, headers=headers)

    def _inbound_unanswered(self, call_id: str) -> Call:
        call = self._calls.get(call_id)
        if (
            call is None
            or call.is_outbound
            or call.answered
            or call.invite_tx_key not in self._server_txs
        ):
            raise LocalProtocolError(f"no unanswered inbound call {call_id!r}")
        return call

    def _uas_timer_headers(
        self, call: Call, request: SipRequest, interval: int | None, refresher: str | None
    ) -> list[tuple[str, str]]:
        """RFC 4028 §9: pick the interval and refresher and report them in the 2xx."""
        supports = "timer" in [t.lower() for t in request.get_all("supported")]
        if self.settings.session_expires_s <= 0 or (interval is None and not supports):
            call.session_interval_s = 0
            return []
        chosen = interval if interval is not None else self.settings.session_expires_s
        chosen = max(min(chosen, self.settings.session_expires_s), self.settings.min_se_s)
        if refresher not in ("uac", "uas"):
            refresher = "uac" if supports else "uas"
        if refresher == "uac" and not supports:
            refresher = "uas"
        call.session_interval_s = chosen
        call.we_refresh = refresher == ("uas" if call.dialog.is_uas else "uac")
        headers = [("Session-Expires", f"{chosen};refresher={refresher}")]
        if refresher == "uac" and call.dialog.is_uas:
            headers.append(("Require", "timer"))
        return headers

    def _retransmit_ok(self, call: Call, response: SipResponse, now: float) -> None:
        """RFC 3261 §13.3.1.4: the TU retransmits 2xx until the ACK (UDP only)."""
        call.ok_response = response
        call.ok_interval_s = self.settings.timers.t1_s
        call.ok_retransmit_at = None if self._reliable else now + call.ok_interval_s
        call.ok_give_up_at = now + self.settings.timers.timeout_s
        self._schedule(call)

    def _arm_session_timer(self, call: Call, now: float) -> None:
        call.arm_session_timer(now)
        self._schedule(call)

    # --- generic commands ----------------------------------------------------------------
    def refer(self, call_id: str, target_uri: str, now: float) -> None:
        """Blind transfer (RFC 3515): progress arrives as ``TransferProgress``."""
        call = self._answered(call_id)
        headers = (("Refer-To", f"<{target_uri}>"), ("Referred-By", str(call.dialog.local.uri)))
        self._send_in_dialog(call, "REFER", now, headers=headers)

    def send_info(self, call_id: str, body: str, content_type: str, now: float) -> None:
        call = self._answered(call_id)
        self._send_in_dialog(
            call, "INFO", now, body=body.encode(), headers=(("Content-Type", content_type),)
        )

    def _answered(self, call_id: str) -> Call:
        call = self._calls.get(call_id)
        if call is None or not call.answered:
            raise LocalProtocolError(f"no answered call {call_id!r}")
        return call

    def _send_in_dialog(
        self,
        call: Call,
        method: str,
        now: float,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> ClientEntry:
        request = call.dialog.build_request(method)
        if method in ("INVITE", "UPDATE", "REFER"):
            request.add("Contact", self._contact(secure=_secure(call)))
        for name, value in headers:
            request.add(name, value)
        request.body = body
        kind = "reinvite" if method == "INVITE" else method.lower()
        entry = self._start_client(request, call.dialog.next_hop(), kind, call.call_id, now)
        if call.credentials is not None and self._client_txs.get(entry.key) is entry:
            self._dialog_auth[entry.key] = DialogAuth(call.dialog, DigestClient(call.credentials))
        return entry

    def _answer_in_dialog_challenge(
        self, entry: ClientEntry, response: SipResponse, now: float
    ) -> bool:
        """A final response to a request sent with ``_send_in_dialog``: True if it was a
        401/407 answered by a new request of the dialog (the response is then not the
        request's result); False for anything else (a challenge without credentials, a
        second one after our answer, a challenge we cannot answer: a failure)."""
        if response.status < 200:
            return False
        auth = self._dialog_auth.pop(entry.key, None)
        if auth is None or response.status not in (401, 407):
            return False
        if not auth.digest.on_challenge(response.status, challenge_values(response)):
            return False
        old = entry.tx.request
        request = auth.dialog.build_request(old.method)  # CSeq + 1 (RFC 3261 §22.2)
        request.headers += [h for h in old.headers if h[0] not in _REBUILT]
        request.body = old.body
        for name, value in auth.digest.headers(old.method, request.uri, self._token()):
            request.add(name, value)
        retry = self._start_client(request, entry.peer, entry.kind, entry.ref, now)
        if self._client_txs.get(retry.key) is retry:
            self._dialog_auth[retry.key] = auth
        return True

    def _end_call(self, call: Call, reason: str, now: float, *, send_bye: bool) -> None:
        if send_bye:
            self._send_in_dialog(call, "BYE", now)
        call.dialog.state = DialogState.TERMINATED
        self._calls.pop(call.call_id, None)
        self._events.append(CallEnded(call.call_id, reason))

    # --- timers of the transaction user ------------------------------------------------
    # Calls are timer holders in UaCore's heap; ``_schedule(call)`` follows everything
    # that arms a call timer (``_retransmit_ok``, ``_arm_session_timer``, ``_tu_fire``).
    def _tu_deadlines(self) -> list[float]:
        return []

    def _tu_handle_timer(self, now: float) -> None:
        return None

    def _tu_deadline_of(self, holder: TimerHolder) -> float | None:
        assert isinstance(holder, Call)
        return holder.next_deadline()

    def _tu_is_live(self, holder: TimerHolder) -> bool:
        assert isinstance(holder, Call)
        return self._calls.get(holder.call_id) is holder

    def _tu_holder_count(self) -> int:
        return len(self._calls)

    def _tu_fire(self, holder: TimerHolder, now: float) -> None:
        assert isinstance(holder, Call)
        self._call_timers(holder, now)

    def _call_timers(self, call: Call, now: float) -> None:
        if call.early_until is not None and call.early_until <= now:
            call.early_response = call.early_refresh_at = call.early_until = None
            self._events.append(EarlyMediaExpired(call.call_id))
        if call.early_refresh_at is not None and call.early_refresh_at <= now:
            call.early_refresh_at = now + call.early_refresh_s
            entry = self._server_txs.get(call.invite_tx_key)
            if entry is not None and call.early_response is not None:
                entry.tx.respond(call.early_response, now)  # the same 183 again
                self._pump_server(entry)
        if call.ok_give_up_at is not None and call.ok_give_up_at <= now:
            call.ok_response = None
            call.ok_retransmit_at = call.ok_give_up_at = None
            self._end_call(call, "ack-timeout", now, send_bye=True)
            return
        if call.ok_retransmit_at is not None and call.ok_retransmit_at <= now and call.ok_response:
            self._send(call.ok_response, call.dialog.peer)
            call.ok_interval_s = min(call.ok_interval_s * 2, self.settings.timers.t2_s)
            call.ok_retransmit_at = now + call.ok_interval_s
        if call.expire_at is not None and call.expire_at <= now:
            self._end_call(call, "session-expired", now, send_bye=True)
            return
        if call.refresh_at is not None and call.refresh_at <= now:
            call.refresh_at = None
            self._refresh_session(call, now)

    def _refresh_session(self, call: Call, now: float) -> None:
        """RFC 4028 §7.4: re-INVITE with the unchanged SDP (same o= version)."""
        headers = (
            (
                "Session-Expires",
                f"{call.session_interval_s};refresher={'uas' if call.dialog.is_uas else 'uac'}",
            ),
            _SUPPORTED,
            _SDP,
        )
        call.reinvite_pending = True
        self._send_in_dialog(call, "INVITE", now, body=call.local_sdp.encode(), headers=headers)


def _session_expires(request: SipRequest) -> tuple[int | None, str | None]:
    """(interval, refresher) from Session-Expires (compact ``x``), or (None, None)."""
    value = request.get("session-expires")
    if value is None:
        return None, None
    number, _, params = value.partition(";")
    number = number.strip()
    if not ascii_digits(number) or len(number) > 10:
        return None, None
    refresher = None
    try:
        for key, val in parse_params(params) if params.strip() else ():
            if key.lower() == "refresher" and val is not None:
                refresher = val.lower()
    except SipParseError:
        refresher = None
    return int(number), refresher


def _parse_dtmf_info(content_type: str, body: str) -> tuple[str | None, int]:
    if content_type == "application/dtmf":
        digit = body.strip().upper()
        return (digit if len(digit) == 1 and digit in DTMF_DIGITS else None), 250
    fields: dict[str, str] = {}
    for line in body.splitlines():
        key, _, value = line.partition("=")
        fields[key.strip().lower()] = value.strip()
    signal = fields.get("signal", "").upper()
    duration = fields.get("duration", "250")
    if len(signal) != 1 or signal not in DTMF_DIGITS:
        return None, 0
    return signal, int(duration) if ascii_digits(duration) and len(duration) < 7 else 250


def _auth_username(answer: str) -> str:
    """The ``username`` of a digest answer, cut for a log line ("" if unreadable)."""
    try:
        return parse_auth_params(answer)[1].get("username", "")[:64]
    except SipParseError:
        return ""


def challenge_values(response: SipResponse) -> list[str]:
    """The challenge values of a 401 (WWW-Authenticate) or 407 (Proxy-Authenticate)."""
    return response.get_lines(
        "proxy-authenticate" if response.status == 407 else "www-authenticate"
    )


def _without_origin(sdp: str) -> str:
    return "\n".join(line for line in sdp.splitlines() if not line.startswith("o="))


_HANDLERS: dict[str, Handler] = {
    "INVITE": UasAgent._on_invite,
    "CANCEL": UasAgent._on_cancel,
    "BYE": UasAgent._on_bye,
    "OPTIONS": UasAgent._on_options,
    "INFO": UasAgent._on_info,
    "NOTIFY": UasAgent._on_notify,
    "UPDATE": UasAgent._on_update,
}


def _secure(call: Call) -> bool:
    """The call's dialog is a ``sips:`` one (its INVITE's Request-URI, RFC 3261 §12.1)."""
    return call.invite.uri.lower().startswith("sips:")

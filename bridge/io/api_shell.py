"""The HTTP API on ``[api] listen``: ``bridge.control.api`` over the daemon's calls.

``Directory`` is the ``CallDirectory`` the pure handlers need: it looks the
calls up in every leg, places outbound calls through the SIP leg, and runs
``say``/``hangup`` on a call's ``CallRunner``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

from bridge.commands import Command, Say
from bridge.config import ApiConfig, Config
from bridge.control.api import REFUSALS, CallInfo, DirectoryError, authorized, handle
from bridge.io.callrun import CallRunner
from bridge.io.dns import DnsError, is_ip_literal
from bridge.io.httpws import HttpRequest, HttpResponse
from bridge.sip.locate import Located
from bridge.sip.trunks import TrunkError, TrunkLimited
from bridge.sip.uri import OutboundTarget, TargetError
from bridge.streams.auth import TokenBook

__all__ = ["ApiHost", "Directory", "api_handler", "metrics_refusal"]


class NamedLeg(Protocol):
    @property
    def name(self) -> str: ...


class ApiHost(Protocol):
    """What the API reads of the daemon (which passes itself): its legs, whether it is
    draining, its config."""

    @property
    def legs(self) -> Sequence[NamedLeg]: ...

    @property
    def draining(self) -> bool: ...

    @property
    def config(self) -> Config: ...


class Directory:
    """The daemon's calls, as the API handlers see them."""

    def __init__(
        self, daemon: ApiHost, resolved: dict[str, list[Located] | DnsError] | None = None
    ) -> None:
        self.daemon = daemon
        self.resolved = resolved
        """Next hops of ``originate`` named by a host name, located (RFC 3263: the places
        found, or the failure), by host; None: not yet, and the hop to locate is left in
        ``lookup`` (with the transport it must use, None: any)."""
        self.lookup: tuple[OutboundTarget, str | None] | None = None

    def _runners(self) -> dict[str, CallRunner]:
        out: dict[str, CallRunner] = {}
        for leg in self.daemon.legs:
            for call_id, call in getattr(leg, "calls", {}).items():
                runner = call if isinstance(call, CallRunner) else getattr(call, "runner", None)
                if isinstance(runner, CallRunner):
                    out[call_id] = runner
        return out

    def _info(self, r: CallRunner) -> CallInfo:
        leg_call = next(
            (c for leg in self.daemon.legs for c in getattr(leg, "calls", {}).values()
             if getattr(c, "runner", None) is r),
            None,
        )  # fmt: skip
        outbound = bool(getattr(leg_call, "outbound", False))
        return CallInfo(
            call_id=r.call_id,
            leg=r.leg.kind,
            direction="outbound" if outbound else "inbound",
            from_=r.started_info.from_,
            to=r.started_info.to,
            state="ending" if r.finished else "active",
            duration_s=r.loop.time() - r.started_at,
            turn_source=r.turn_source,
        )

    def _unanswered(self) -> dict[str, CallInfo]:
        """Outbound SIP calls not answered yet (``ringing``, or ``early_media``)."""
        out: dict[str, CallInfo] = {}
        for leg in self.daemon.legs:
            pending = getattr(leg, "pending_calls", None)
            if pending is None:
                continue
            for call_id, from_, to, state, age_s in pending(asyncio.get_running_loop().time()):
                out[call_id] = CallInfo(call_id, "sip", "outbound", from_, to, state, age_s)
        return out

    def list_calls(self) -> list[CallInfo]:
        return [self._info(r) for r in self._runners().values()] + list(self._unanswered().values())

    def get_call(self, call_id: str) -> CallInfo | None:
        r = self._runners().get(call_id)
        return self._unanswered().get(call_id) if r is None else self._info(r)

    def originate(self, to: str, from_: str, route: str, trunk: str = "") -> str | DirectoryError:
        sip = next((leg for leg in self.daemon.legs if leg.name == "sip"), None)
        if sip is None or self.daemon.draining:
            return DirectoryError(503, "unavailable", "the SIP leg is not available")
        # the next hop: the target's host, the outbound proxy, a trunk's proxy...
        hop = sip.outbound_hop(to, trunk)  # type: ignore[attr-defined]
        located: list[Located] | None = None
        if hop is not None and not is_ip_literal(hop[0].host):
            host = hop[0].host
            found = None if self.resolved is None else self.resolved.get(host)
            if found is None:  # located by api_handler, which then asks again
                self.lookup = hop
                return DirectoryError(503, "resolving", f"looking up {host!r}", "to")
            if isinstance(found, DnsError):
                return DirectoryError(422, "cannot_resolve", str(found), "trunk" if trunk else "to")
            located = found
        try:
            return str(sip.originate(to, from_, route, located, trunk=trunk))  # type: ignore[attr-defined]
        except TrunkLimited as e:
            busy = e.refusal.reason == "max_calls"
            status, code = (503, "trunk_busy") if busy else (429, "trunk_rate_limited")
            return DirectoryError(status, code, str(e), "trunk", e.refusal.retry_after_s)
        except TrunkError as e:
            return DirectoryError(422, "cannot_originate", str(e), "trunk")
        except ValueError as e:
            field = "route" if route else "to"
            unavailable = "port" in str(e) or "transport" in str(e)
            status = 503 if unavailable and not isinstance(e, TargetError) else 422
            return DirectoryError(status, "cannot_originate", str(e), field)

    def _live(self, call_id: str) -> CallRunner | DirectoryError:
        """The call's runner, or 404 (no such call) / 409 (it is ending)."""
        r = self._runners().get(call_id)
        if r is None:
            return DirectoryError(404, "not_found", f"no call {call_id!r}")
        if r.finished:
            return DirectoryError(409, "ending", "the call is ending")
        return r

    def say(self, call_id: str, say: Say) -> DirectoryError | None:
        r = self._live(call_id)
        if isinstance(r, DirectoryError):
            return r
        if not r.knows_provider(say.provider):
            return DirectoryError(
                422, "invalid_field", f"no provider {say.provider!r} on this node", "provider"
            )
        r.say(say)
        return None

    def hangup(self, call_id: str, reason: str) -> DirectoryError | None:
        r = self._runners().get(call_id)
        if r is None:
            return DirectoryError(404, "not_found", f"no call {call_id!r}")
        r.hangup(reason)
        return None

    def command(self, call_id: str, command: Command) -> DirectoryError | None:
        r = self._live(call_id)
        if isinstance(r, DirectoryError):
            return r
        reason = r.api_command(command)
        if not reason:
            return None
        status, field = REFUSALS.get(reason, (409, "$"))
        return DirectoryError(status, reason, f"the call refused it: {reason}", field)

    def mint_stream_token(self, call_id: str) -> tuple[str, float] | DirectoryError:
        leg = next((leg for leg in self.daemon.legs if leg.name == "media_streams"), None)
        book = getattr(leg, "tokens", None)
        if not isinstance(book, TokenBook):
            return DirectoryError(
                409, "tokens_off", "[media_streams] single_use_tokens is off on this node"
            )
        return book.mint(call_id, time.time()), book.ttl_s


async def api_handler(daemon: ApiHost, request: HttpRequest) -> HttpResponse | None:
    if not (request.path.startswith("/v1/") or request.path == "/openapi.json"):
        return None
    directory = Directory(daemon)
    resp = handle(
        request.method,
        request.target,
        request.headers,
        request.body,
        directory,
        daemon.config.api.token,
    )
    if directory.lookup is not None:  # an authorized, valid originate to a host name
        target, transport = directory.lookup
        sip = next((leg for leg in daemon.legs if leg.name == "sip"), None)
        answer: list[Located] | DnsError
        try:  # off the media path: RFC 3263 (SRV, A/AAAA), with a timeout
            answer = await sip.locate_hop(target, transport)  # type: ignore[union-attr]
        except DnsError as e:
            answer = e
        host = target.host
        resp = handle(
            request.method,
            request.target,
            request.headers,
            request.body,
            Directory(daemon, {host: answer}),
            daemon.config.api.token,
        )
    content_type = dict(resp.headers).get("Content-Type", "application/json")
    extra = tuple((k, v) for k, v in resp.headers if k.lower() != "content-type")
    return HttpResponse(resp.status, resp.body, content_type, extra)


def metrics_refusal(api: ApiConfig, request: HttpRequest) -> HttpResponse | None:
    """401 for ``/metrics`` without the API's bearer token (``[api] metrics_auth``, on by
    default when a token is set); ``None`` when the scrape may go ahead."""
    if not api.metrics_auth or authorized(request.headers, api.token):
        return None
    return HttpResponse(
        401, b"a valid bearer token is required\n", "text/plain", (("WWW-Authenticate", "Bearer"),)
    )

"""The media-stream leg: carriers' WebSockets (Twilio and the other dialects) in.

One listener on ``[media_streams] listen`` serves:

* ``POST /twiml``: the TwiML a Twilio number points at (``<Connect><Stream>``
  back to this listener, with the route as a ``<Parameter>``);
* WebSocket upgrades on each dialect's path (``/twilio``, ``/telnyx``,
  ``/plivo``, ``/exotel``, ``/vonage``). With ``twilio_auth_token`` set, a
  Twilio upgrade must carry a valid ``X-Twilio-Signature`` for its exact URL,
  else 403 before the upgrade completes. With ``stream_token`` set, every
  dialect presents it (``Authorization``, ``?token=``; Twilio and Plivo, which
  cannot add a header, may send it as the ``stream_token`` custom parameter of
  ``start`` instead). With ``single_use_tokens``, every dialect's ``start``
  carries a per-call token (custom parameter ``token``). On a listener that is
  not loopback, a dialect with no credential configured is refused (403).
  While draining, upgrades get 503; beyond ``max_streams`` open streams, 503.

``POST /twiml`` is checked as Twilio signs webhooks when ``twilio_auth_token``
is set (and refused on a public listener without it); a CallSid gets at most
one token (a replayed webhook gets 409).

Each accepted socket is pumped through its dialect engine
(``bridge.streams``) by a ``StreamCall`` (``bridge.io.legs.stream_call``, the
per-message half, compiled); ``StreamStarted`` comes back here
(``_start_call``), which picks the route and starts a ``CallRunner``; inbound
audio, DTMF and mark echoes go to the call; the call's frames, marks and
clears go back through the engine. A stream that ends (``stop``, close,
violation) ends its call.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import re
import time
from typing import Any
from urllib.parse import parse_qsl

from bridge import commands as cmd
from bridge.config import split_hostport
from bridge.io.callrun import CallRunner
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, WsConnection, serve_http_ws
from bridge.io.legs.stream_call import StreamCall, StreamLeg
from bridge.io.services import Services
from bridge.logs import bind_call, get_logger, unbind_call
from bridge.media.call_types import LegProfile
from bridge.streams import DIALECTS
from bridge.streams.auth import (
    ReplayGuard,
    TokenBook,
    plivo_signature_v3_valid,
    presented_token,
    shared_token_valid,
    twilio_signature_valid,
    twilio_webhook_valid,
)
from bridge.streams.base import MediaStreamProtocol, StreamSettings, StreamStarted
from bridge.streams.twiml import twiml_for_route
from telcodec.framing import FrameCutter

__all__ = ["MediaStreamsLeg"]

log = get_logger("callbridge.streams")

CAN_CLEAR = {"twilio", "telnyx", "plivo", "exotel", "vonage"}
TWIML_BODY_BYTES = 64 * 1024
"""The largest body a POST here may carry (Twilio's webhook form is a few hundred bytes)."""
_CREDENTIAL_PARAMS = frozenset({"token", "stream_token"})
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._:-]")
TWIML_REPLAY_WINDOW_S = 86400.0
"""How long a CallSid that got a stream token is remembered (a replayed /twiml: 409)."""
#: dialects that cannot add a header to their upgrade (stream_token may come in ``start``)
TOKEN_IN_START = {"twilio", "plivo"}
CARRIER_STALL_S = 10.0
"""A carrier that reads nothing of ours for this long, once our unsent bytes pass
``CARRIER_HIGH_WATER_BYTES``, is cut off (its call ends ``carrier_stalled``)."""
CARRIER_HIGH_WATER_BYTES = 16 * 1024
"""About a second of Twilio media messages, held unsent before the stall clock starts."""
CARRIER_SNDBUF_BYTES = 64 * 1024
"""The kernel's send buffer of a carrier socket (Linux doubles it): seconds of media,
not the megabytes of autotuning, so a stall shows in seconds and costs little."""


def _is_public(listen: str) -> bool:
    host = split_hostport(listen)[0]
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


class MediaStreamsLeg:
    """The ``[media_streams]`` listener and its calls."""

    name = "media_streams"

    def __init__(self, services: Services) -> None:
        self.services = services
        self.server: HttpWsServer | None = None
        self.calls: dict[str, CallRunner] = {}
        self.draining = False
        ms = services.config.media_streams
        secret = ms.token_secret.encode() or os.urandom(32)
        self.tokens = TokenBook(secret, ttl_s=ms.token_ttl_s) if ms.single_use_tokens else None
        self.plivo_nonces = ReplayGuard()
        self.twiml_call_sids = ReplayGuard()
        self.public = _is_public(ms.listen)
        self.streams_open = 0

    @property
    def settings(self) -> StreamSettings:
        ms = self.services.config.media_streams
        return StreamSettings(max_message_bytes=ms.max_message_bytes)

    async def start(self) -> None:
        host, port = split_hostport(self.services.config.media_streams.listen)
        self.server = await serve_http_ws(
            host,
            port,
            http=self._http,
            ws=self._ws,
            max_message_bytes=self.services.config.media_streams.max_message_bytes,
            limits=self.services.config.media_streams.limits,
            max_body_bytes=TWIML_BODY_BYTES,
        )
        log.info(
            "media_streams.listening",
            listen=self.services.config.media_streams.listen,
            port=self.port,
        )

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def active_calls(self) -> int:
        return len(self.calls)

    def set_draining(self, draining: bool) -> None:
        self.draining = draining

    async def end_all_calls(self, reason: str) -> None:
        for call in list(self.calls.values()):
            call.hangup(reason)
        await asyncio.sleep(0.05)  # let close frames go out

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close()

    def _call_finished(self, call: CallRunner) -> None:
        self.calls.pop(call.call_id, None)
        if isinstance(call.leg, StreamLeg):
            # the stream holds its runner and the runner its leg (the stream): break
            # the cycle so the ended call is freed now, not at the next full GC pass
            call.leg.stream.call = None

    def _unique_call_id(self, call_id: str) -> str:
        """``call_id``, or ``call_id-2``, ``-3``... if a call runs under it (a carrier
        reusing an id: a retried or forked stream). The suffix keeps the id one path
        segment, so ``/v1/calls/{call_id}`` reaches every call (a ``/`` did not)."""
        # the carrier's id, cut to what the API and stream tokens take (STREAM_CALL_ID_RE)
        call_id = _UNSAFE_ID_CHARS.sub("_", call_id)[:120] or os.urandom(8).hex()
        unique, n = call_id, 1
        while unique in self.calls:
            n += 1
            unique = f"{call_id}-{n}"
        return unique

    def _refuse_start(self, stream: StreamCall, reason: str, text: str) -> None:
        self.services.metrics.rejected_total.labels(reason).inc()
        log.warning("streams.start_refused", reason=reason, dialect=stream.engine.DIALECT)
        stream.engine.reject(text, stream.now())
        stream.pump()

    def _start_call(
        self, stream: StreamCall, event: StreamStarted, stream_token_due: bool = False
    ) -> None:
        """``StreamStarted``: check the stream's tokens, pick the route, start the call.

        ``stream_token_due``: the shared ``stream_token`` was not presented at
        the upgrade (Twilio, Plivo) and must be the ``stream_token`` parameter.
        """
        services = self.services
        cfg = services.call_config()
        route = cfg.route_for(event.route or "")
        if route is None:
            services.metrics.rejected_total.labels("no_route").inc()
            log.warning("streams.no_route", route=event.route)
            stream.engine.hangup(stream.now())
            stream.pump()
            return
        call_id = event.call_id or event.stream_id
        ms = services.config.media_streams
        if stream_token_due and not shared_token_valid(
            ms.stream_token, event.custom_parameters.get("stream_token")
        ):
            self._refuse_start(stream, "bad_token", "stream token invalid")
            return
        book = self.tokens
        if book is not None:
            verdict = book.check(event.custom_parameters.get("token"), call_id, time.time())
            if verdict != "ok":
                self._refuse_start(stream, f"token_{verdict}", f"stream token {verdict}")
                return
        call_id = self._unique_call_id(call_id)
        bind_call(call_id)
        profile = LegProfile(
            kind=stream.engine.DIALECT,  # type: ignore[arg-type]
            codec=event.codec,
            sample_rate_hz=event.sample_rate_hz,
            heard_from="marks",
            can_clear=stream.engine.DIALECT in CAN_CLEAR,
            can_transfer=False,  # no carrier protocol here has a transfer message
            can_send_dtmf=stream.engine.supports_send_dtmf,
        )
        stream.cutter = FrameCutter(profile.frame_bytes)
        started = cmd.CallStarted(
            call_id=call_id,
            leg=stream.engine.DIALECT,
            from_=event.custom_parameters.get("from", ""),
            to=event.custom_parameters.get("to", ""),
            # the credentials it carried stay here: the application never sees them
            custom_parameters={
                k: v for k, v in event.custom_parameters.items() if k not in _CREDENTIAL_PARAMS
            },
        )
        lead = max(0, self.services.config.media_streams.lead_ms // 20 - 1)
        call = CallRunner(
            services,
            call_id,
            StreamLeg(stream),
            profile,
            route,
            started,
            lead_frames=lead,
            on_finished=self._call_finished,
        )
        self.calls[call_id] = call
        services.metrics.call_setup_seconds.labels(stream.engine.DIALECT).observe(
            stream.now() - stream.connected_at
        )
        stream.call = call
        call.start()
        unbind_call()

    def _public_url(self, request: HttpRequest) -> str:
        base = self.services.config.media_streams.public_url.rstrip("/")
        for path in DIALECTS:  # public_url may name the /twilio URL itself
            base = base.removesuffix(path)
        if base:
            return base + request.target
        return f"ws://{request.headers.get('host', '')}{request.target}"

    def _webhook_url(self, request: HttpRequest) -> str:
        """The URL Twilio POSTed to: ``public_url`` in its http(s) spelling + the target."""
        url = self._public_url(request)
        return "https://" + url[6:] if url.startswith("wss://") else "http://" + url[5:]

    async def _http(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/twiml" and request.method == "POST":
            return self._twiml(request)
        if request.path in DIALECTS:
            return HttpResponse.text(426, "WebSocket upgrade required")
        return HttpResponse.text(404, "not found")

    def _twiml(self, request: HttpRequest) -> HttpResponse:
        ms = self.services.config.media_streams
        form = dict(parse_qsl(request.body.decode("latin-1"), keep_blank_values=True))
        signed = False
        if ms.twilio_auth_token:
            signature = request.headers.get("x-twilio-signature")
            if not twilio_webhook_valid(
                ms.twilio_auth_token, self._webhook_url(request), form, signature
            ):
                self.services.metrics.rejected_total.labels("bad_signature").inc()
                log.warning("streams.twiml_bad_signature")
                return HttpResponse.text(403, "invalid X-Twilio-Signature")
            signed = True
        elif self.public:
            self.services.metrics.rejected_total.labels("no_credential").inc()
            return HttpResponse.text(
                403, "POST /twiml needs media_streams.twilio_auth_token on a public listener"
            )
        route = request.query.get("route") or form.get("route", "")
        base = self.services.config.media_streams.public_url or (
            f"wss://{request.headers.get('host', '')}"
        )
        stream_url = base.rstrip("/").replace("ws://", "wss://", 1)
        stream_url = stream_url if stream_url.endswith("/twilio") else stream_url + "/twilio"
        params = {
            k: v for k, v in (("from", form.get("From", "")), ("to", form.get("To", ""))) if v
        }
        if signed and ms.stream_token:
            params["stream_token"] = ms.stream_token  # to Twilio only: the request was signed
        if self.tokens is not None:
            call_sid = form.get("CallSid", "")
            if not call_sid:
                return HttpResponse.text(400, "CallSid is required for single-use stream tokens")
            now = time.time()
            if not self.twiml_call_sids.first_use(call_sid, now + TWIML_REPLAY_WINDOW_S, now):
                self.services.metrics.rejected_total.labels("twiml_replayed").inc()
                log.warning("streams.twiml_replayed")
                return HttpResponse.text(409, "a stream token was already issued for this call")
            params["token"] = self.tokens.mint(call_sid, now)
        try:
            xml = twiml_for_route(stream_url, route or None, params)
        except ValueError as e:
            return HttpResponse.text(400, str(e))
        return HttpResponse(200, xml.encode(), "application/xml")

    async def _ws(self, request: HttpRequest) -> Any:
        cls = DIALECTS.get(request.path)
        if cls is None:
            return HttpResponse.text(404, f"no media-stream dialect at {request.path}")
        if self.draining:
            self.services.metrics.rejected_total.labels("draining").inc()
            return HttpResponse(503, b"draining\n", headers=(("Retry-After", "5"),))
        if self.services.ticker.overloaded(self.services.config.daemon.max_loop_lag_ms / 1000):
            self.services.metrics.rejected_total.labels("overloaded").inc()
            return HttpResponse(503, b"overloaded\n", headers=(("Retry-After", "2"),))
        if self.streams_open >= self.services.config.media_streams.max_streams:
            self.services.metrics.rejected_total.labels("max_streams").inc()
            return HttpResponse(503, b"too many media streams\n", headers=(("Retry-After", "5"),))
        refusal, stream_token_due = self._upgrade_refusal(cls.DIALECT, request)
        if refusal is not None:
            return refusal
        return self._accept(cls, request, stream_token_due)

    def _upgrade_refusal(
        self, dialect: str, request: HttpRequest
    ) -> tuple[HttpResponse | None, bool]:
        """(a 403 for an upgrade that fails its dialect's checks, or None; whether the
        shared ``stream_token`` is still due in ``start``)."""
        ms = self.services.config.media_streams
        metrics = self.services.metrics
        credentialed = self.tokens is not None  # checked in start
        if dialect == "twilio" and ms.twilio_auth_token:
            signature = request.headers.get("x-twilio-signature")
            if not twilio_signature_valid(
                ms.twilio_auth_token, self._public_url(request), signature
            ):
                metrics.rejected_total.labels("bad_signature").inc()
                log.warning("streams.bad_signature", path=request.path)
                return HttpResponse.text(403, "invalid X-Twilio-Signature"), False
            credentialed = True
        if dialect == "plivo" and ms.plivo_auth_token:
            nonce = request.headers.get("x-plivo-signature-v3-nonce")
            signature = request.headers.get("x-plivo-signature-v3")
            url = self._public_url(request)
            now = time.time()
            if not plivo_signature_v3_valid(ms.plivo_auth_token, url, nonce, signature) or not (
                nonce and self.plivo_nonces.first_use(nonce, now + 300, now)
            ):
                metrics.rejected_total.labels("bad_signature").inc()
                log.warning("streams.bad_signature", path=request.path)
                return HttpResponse.text(403, "invalid X-Plivo-Signature-V3"), False
            credentialed = True
        due = False
        if ms.stream_token:
            presented = presented_token(request.headers, request.query)
            if presented is None and dialect in TOKEN_IN_START:
                due = True  # no header on this carrier's upgrade: the start must carry it
            elif not shared_token_valid(ms.stream_token, presented):
                metrics.rejected_total.labels("bad_token").inc()
                log.warning("streams.bad_token", path=request.path)
                return HttpResponse.text(403, "invalid stream token"), False
            credentialed = True
        if self.public and not credentialed:
            metrics.rejected_total.labels("no_credential").inc()
            log.warning("streams.no_credential", path=request.path)
            return HttpResponse.text(403, f"no credential configured for {request.path}"), False
        return None, due

    def _accept(
        self, cls: type[MediaStreamProtocol], request: HttpRequest, stream_token_due: bool
    ) -> Any:
        async def handler(conn: WsConnection) -> None:
            if self.streams_open >= self.services.config.media_streams.max_streams:
                # upgrades decided while others were still handshaking: the cap is exact
                self.services.metrics.rejected_total.labels("max_streams").inc()
                await conn.close(1013, "too many media streams")
                return
            self.streams_open += 1
            conn.guard_stall(CARRIER_STALL_S, CARRIER_HIGH_WATER_BYTES, CARRIER_SNDBUF_BYTES)
            try:
                engine = cls(self.settings, route=request.query.get("route"))
                loop = asyncio.get_running_loop()
                on_started = functools.partial(self._start_call, stream_token_due=stream_token_due)
                stream = StreamCall(conn, engine, loop, self.services.ticker.run_if_due, on_started)
                await stream.run()
            finally:
                self.streams_open -= 1

        return handler

"""The media-stream leg: carriers' WebSockets (Twilio and the other dialects) in.

One listener on ``[media_streams] listen`` serves:

* ``POST /twiml``: the TwiML a Twilio number points at (``<Connect><Stream>``
  back to this listener, with the route as a ``<Parameter>``);
* WebSocket upgrades on each dialect's path (``/twilio``, ``/telnyx``,
  ``/plivo``, ``/exotel``, ``/vonage``). With ``twilio_auth_token`` set, a
  Twilio upgrade must carry a valid ``X-Twilio-Signature`` for its exact URL,
  else 403 before the upgrade completes. While draining, upgrades get 503.

Each accepted socket is pumped through its dialect engine
(``bridge.streams``) by a ``StreamCall`` (``bridge.io.stream_call``, the
per-message half, compiled); ``StreamStarted`` comes back here
(``_start_call``), which picks the route and starts a ``CallRunner``; inbound
audio, DTMF and mark echoes go to the call; the call's frames, marks and
clears go back through the engine. A stream that ends (``stop``, close,
violation) ends its call.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from bridge.config import split_hostport
from bridge.control import commands as cmd
from bridge.io.callrun import CallRunner
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, WsConnection, serve_http_ws
from bridge.io.stream_call import StreamCall, StreamLeg
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
)
from bridge.streams.base import MediaStreamProtocol, StreamSettings, StreamStarted
from bridge.streams.twiml import twiml_for_route
from telcodec.framing import FrameCutter

if TYPE_CHECKING:
    from bridge.io.daemon import Daemon

__all__ = ["MediaStreamsLeg"]

log = get_logger("callbridge.streams")

CAN_CLEAR = {"twilio", "telnyx", "plivo", "exotel", "vonage"}
TWIML_BODY_BYTES = 64 * 1024
"""The largest body a POST here may carry (Twilio's webhook form is a few hundred bytes)."""


class MediaStreamsLeg:
    """The ``[media_streams]`` listener and its calls."""

    name = "media_streams"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.server: HttpWsServer | None = None
        self.calls: dict[str, CallRunner] = {}
        self.draining = False
        ms = daemon.config.media_streams
        secret = ms.token_secret.encode() or os.urandom(32)
        self.tokens = TokenBook(secret, ttl_s=60.0) if ms.single_use_tokens else None
        self.plivo_nonces = ReplayGuard()

    @property
    def settings(self) -> StreamSettings:
        ms = self.daemon.config.media_streams
        return StreamSettings(max_message_bytes=ms.max_message_bytes)

    async def start(self) -> None:
        host, port = split_hostport(self.daemon.config.media_streams.listen)
        self.server = await serve_http_ws(
            host,
            port,
            http=self._http,
            ws=self._ws,
            max_message_bytes=self.daemon.config.media_streams.max_message_bytes,
            limits=self.daemon.config.media_streams.limits,
            max_body_bytes=TWIML_BODY_BYTES,
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

    def _start_call(self, stream: StreamCall, event: StreamStarted) -> None:
        """``StreamStarted``: pick the route, check the stream token, start the call."""
        daemon = self.daemon
        cfg = daemon.runtime.config if daemon.runtime else daemon.config
        route = cfg.route_for(event.route or "")
        if route is None:
            daemon.metrics.rejected_total.labels("no_route").inc()
            log.warning("streams.no_route", route=event.route)
            stream.engine.hangup(stream.now())
            stream.pump()
            return
        call_id = event.call_id or event.stream_id
        if call_id in self.calls:
            # a carrier reusing a call id (a retried or forked stream) must not
            # collide with the call already running under it
            call_id = f"{call_id}/{event.stream_id or os.urandom(4).hex()}"
            if call_id in self.calls:
                call_id = f"{call_id}/{os.urandom(4).hex()}"
        book = self.tokens
        if book is not None and stream.engine.DIALECT == "twilio":
            verdict = book.check(event.custom_parameters.get("token"), call_id, time.time())
            if verdict != "ok":
                daemon.metrics.rejected_total.labels(f"token_{verdict}").inc()
                log.warning("streams.token_refused", verdict=verdict)
                stream.engine.reject(f"stream token {verdict}", stream.now())
                stream.pump()
                return
        bind_call(call_id)
        profile = LegProfile(
            kind=stream.engine.DIALECT,  # type: ignore[arg-type]
            codec=event.codec,
            sample_rate_hz=event.sample_rate_hz,
            heard_from="marks",
            can_clear=stream.engine.DIALECT in CAN_CLEAR,
        )
        stream.cutter = FrameCutter(profile.frame_bytes)
        started = cmd.CallStarted(
            call_id=call_id,
            leg=stream.engine.DIALECT,
            from_=event.custom_parameters.get("from", ""),
            to=event.custom_parameters.get("to", ""),
            custom_parameters=dict(event.custom_parameters),
        )
        lead = max(0, self.daemon.config.media_streams.lead_ms // 20 - 1)
        call = CallRunner(
            daemon,
            call_id,
            StreamLeg(stream),
            profile,
            route,
            started,
            lead_frames=lead,
            on_finished=self._call_finished,
        )
        self.calls[call_id] = call
        daemon.metrics.call_setup_seconds.labels(stream.engine.DIALECT).observe(
            stream.now() - stream.connected_at
        )
        stream.call = call
        call.start()
        unbind_call()

    def _public_url(self, request: HttpRequest) -> str:
        base = self.daemon.config.media_streams.public_url
        if base:
            return base.rstrip("/") + request.target
        return f"ws://{request.headers.get('host', '')}{request.target}"

    async def _http(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/twiml" and request.method == "POST":
            return self._twiml(request)
        if request.path in DIALECTS:
            return HttpResponse.text(426, "WebSocket upgrade required")
        return HttpResponse.text(404, "not found")

    def _twiml(self, request: HttpRequest) -> HttpResponse:
        form = dict(parse_qsl(request.body.decode("latin-1"), keep_blank_values=True))
        route = request.query.get("route") or form.get("route", "")
        base = self.daemon.config.media_streams.public_url or (
            f"wss://{request.headers.get('host', '')}"
        )
        stream_url = base.rstrip("/").replace("ws://", "wss://", 1)
        stream_url = stream_url if stream_url.endswith("/twilio") else stream_url + "/twilio"
        params = {
            k: v for k, v in (("from", form.get("From", "")), ("to", form.get("To", ""))) if v
        }
        if self.tokens is not None:
            call_sid = form.get("CallSid", "")
            if not call_sid:
                return HttpResponse.text(400, "CallSid is required for single-use stream tokens")
            params["token"] = self.tokens.mint(call_sid, time.time())
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
            self.daemon.metrics.rejected_total.labels("draining").inc()
            return HttpResponse(503, b"draining\n", headers=(("Retry-After", "5"),))
        if self.daemon.ticker.overloaded(self.daemon.config.daemon.max_loop_lag_ms / 1000):
            self.daemon.metrics.rejected_total.labels("overloaded").inc()
            return HttpResponse(503, b"overloaded\n", headers=(("Retry-After", "2"),))
        token = self.daemon.config.media_streams.twilio_auth_token
        if cls.DIALECT == "twilio" and token:
            signature = request.headers.get("x-twilio-signature")
            if not twilio_signature_valid(token, self._public_url(request), signature):
                self.daemon.metrics.rejected_total.labels("bad_signature").inc()
                log.warning("streams.bad_signature", path=request.path)
                return HttpResponse.text(403, "invalid X-Twilio-Signature")
        plivo_token = self.daemon.config.media_streams.plivo_auth_token
        if cls.DIALECT == "plivo" and plivo_token:
            nonce = request.headers.get("x-plivo-signature-v3-nonce")
            signature = request.headers.get("x-plivo-signature-v3")
            url = self._public_url(request)
            now = time.time()
            if not plivo_signature_v3_valid(plivo_token, url, nonce, signature) or not (
                nonce and self.plivo_nonces.first_use(nonce, now + 300, now)
            ):
                self.daemon.metrics.rejected_total.labels("bad_signature").inc()
                log.warning("streams.bad_signature", path=request.path)
                return HttpResponse.text(403, "invalid X-Plivo-Signature-V3")
            return self._accept(cls, request)
        shared = self.daemon.config.media_streams.stream_token
        if cls.DIALECT != "twilio" and shared:
            presented = presented_token(request.headers, request.query)
            if not shared_token_valid(shared, presented):
                self.daemon.metrics.rejected_total.labels("bad_token").inc()
                log.warning("streams.bad_token", path=request.path)
                return HttpResponse.text(403, "invalid stream token")

        return self._accept(cls, request)

    def _accept(self, cls: type[MediaStreamProtocol], request: HttpRequest) -> Any:
        async def handler(conn: WsConnection) -> None:
            engine = cls(self.settings, route=request.query.get("route"))
            loop = asyncio.get_running_loop()
            stream = StreamCall(conn, engine, loop, self.daemon.ticker.run_if_due, self._start_call)
            await stream.run()

        return handler

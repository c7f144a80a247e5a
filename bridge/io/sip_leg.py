"""The SIP/RTP leg: SIP over UDP and TCP, one RTP socket pair per call.

One ``SipUserAgent`` engine per listening transport (``[sip] listen`` ×
``transports``). Each transport callback feeds its engine with
``loop.time()`` and pumps: datagrams and stream bytes out, call events to
this leg, one timer re-armed from ``next_deadline()``.

A ``CallOffered`` is routed by the request-URI user (``sip:demo@host`` →
route ``demo``), negotiated (PCMU/PCMA + telephone-event), given an RTP port
pair from ``[sip] rtp_ports`` and answered; the call then runs in a
``CallRunner``; its media (one RTP packet out and one frame in per 20 ms
tick) is a ``_SipCall`` (``bridge.io.sip_call``, compiled with mypyc). The
port pair is released on every exit path (BYE, CANCEL, RTP timeout, error,
refused call, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import socket
from typing import TYPE_CHECKING

from bridge.config import RouteConfig, split_hostport
from bridge.control import commands as cmd
from bridge.engine import SendDatagram
from bridge.io.callrun import CallRunner
from bridge.io.sip_call import _DatagramProtocol, _SipCall
from bridge.io.startup import listen_error
from bridge.logs import bind_call, get_logger, unbind_call
from bridge.media.call_types import LegProfile
from bridge.rtp.ports import RtpPortAllocator
from bridge.sip.events import (
    CallCancelled,
    CallEnded,
    CallOffered,
    CloseStream,
    DtmfInfoReceived,
    HoldChanged,
    OutboundCallAnswered,
    OutboundCallFailed,
    RegistrationStateChanged,
    SendStream,
    TransferProgress,
)
from bridge.sip.sdp import build_answer, build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipAuthUser, SipSettings
from bridge.sip.ua import SipUserAgent

if TYPE_CHECKING:
    from bridge.io.daemon import Daemon

__all__ = ["SipLeg"]

log = get_logger("callbridge.sip")

_URI_USER = re.compile(r"^sips?:([^@;>]+)@", re.IGNORECASE)
MAX_BIND_ATTEMPTS = 8

SIP_UDP_RCVBUF_BYTES = 4 * 1024 * 1024
"""Receive buffer asked for the SIP UDP socket. The kernel's default (``net.core.rmem_default``,
about 208 KB) holds only about a hundred datagrams, counted at their in-kernel size: a burst
of hang-ups or INVITEs beyond that is dropped before the daemon reads it, and a lost BYE
leaves its call up until the RTP timeout. The kernel caps the request at
``net.core.rmem_max`` (docs/operations.md)."""


def _route_key(request_uri: str) -> str:
    m = _URI_USER.match(request_uri.strip("<>"))
    return m.group(1) if m else ""


class _UaRunner:
    """One SIP transport and its user agent engine."""

    def __init__(self, leg: SipLeg, settings: SipSettings) -> None:
        self.leg = leg
        self.ua = SipUserAgent(settings)
        self.kind = settings.transport
        self.loop = asyncio.get_running_loop()
        self.udp: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.Server | None = None
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.next_conn_id = 1
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        """The deadline ``timer`` is armed for (while it is not None)."""

    async def start(self, host: str, port: int) -> None:
        if self.kind == "UDP":
            proto = _DatagramProtocol(self._on_datagram)
            transport, _ = await self.loop.create_datagram_endpoint(
                lambda: proto, local_addr=(host, port)
            )
            self.udp = transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SIP_UDP_RCVBUF_BYTES)
                with contextlib.suppress(OSError):
                    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                    # Linux reports twice what it grants (the other half is its bookkeeping)
                    log.info("sip.udp_receive_buffer", bytes=got, asked=SIP_UDP_RCVBUF_BYTES)
        else:
            self.tcp = await asyncio.start_server(self._on_stream, host, port)

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        self.ua.receive_datagram(data, addr, self.loop.time())
        self.pump()
        # the loop hands a socket's queued datagrams over in one pass: a burst
        # of INVITEs (a few hundred microseconds each) must not hold every
        # call's frames back (bridge.io.ticker, "run_if_due")
        self.leg.daemon.ticker.run_if_due()

    async def _on_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_id = self.next_conn_id
        self.next_conn_id += 1
        self.writers[conn_id] = writer
        peer = writer.get_extra_info("peername")
        source = (peer[0], peer[1]) if peer else ("0.0.0.0", 0)
        try:
            while data := await reader.read(65536):
                self.ua.receive_stream(conn_id, data, source, self.loop.time())
                self.pump()
                self.leg.daemon.ticker.run_if_due()
        except (ConnectionError, OSError):
            pass
        finally:
            self.writers.pop(conn_id, None)
            self.ua.connection_lost(conn_id)
            self.pump()
            writer.close()

    def pump(self) -> None:
        for action in self.ua.actions_to_send():
            if isinstance(action, SendDatagram):
                self.leg.count_response(action.data)
                if self.udp is not None:
                    self.udp.sendto(action.data, action.addr)
            elif isinstance(action, SendStream):
                self.leg.count_response(action.data)
                writer = self.writers.get(action.conn_id)
                if writer is not None:
                    writer.write(action.data)
            elif isinstance(action, CloseStream):
                writer = self.writers.pop(action.conn_id, None)
                if writer is not None:
                    writer.close()
        for event in self.ua.events_received():
            self.leg.on_sip_event(self, event)
        deadline = self.ua.next_deadline()
        if self.timer is not None:
            if deadline == self.timer_at:
                return  # armed for that already: no new handle per message
            self.timer.cancel()
            self.timer = None
        if deadline is not None:
            self.timer = self.loop.call_at(deadline, self._on_timer)
            self.timer_at = deadline

    def _on_timer(self) -> None:
        self.timer = None
        self.ua.handle_timer(self.loop.time())
        self.pump()

    async def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.udp is not None:
            self.udp.close()
        if self.tcp is not None:
            self.tcp.close()
            for w in list(self.writers.values()):
                w.close()


class SipLeg:
    """The ``[sip]`` listeners and their calls."""

    name = "sip"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        cfg = daemon.config.sip
        self.ports = RtpPortAllocator(cfg.rtp_ports)
        self.runners: list[_UaRunner] = []
        self.calls: dict[str, _SipCall] = {}
        self.draining = False
        self.secret = os.urandom(32)
        self.pending_routes: dict[str, tuple[RouteConfig, str, str]] = {}

    def _settings(self, host: str, port: int, transport: str) -> SipSettings:
        cfg = self.daemon.config.sip
        return SipSettings(
            local_host=host,
            local_port=port,
            transport=transport,
            allowed_sources=cfg.allow,
            auth_realm=cfg.auth_realm,
            auth_users=tuple(SipAuthUser(u.user, u.password) for u in cfg.auth_users),
            auth_secret=self.secret,
            invite_rate_per_s=cfg.invite_rate_per_source,
            max_calls=cfg.max_calls,
            session_expires_s=cfg.session_expires_s,
            codecs=cfg.codecs,
        )

    async def start(self) -> None:
        cfg = self.daemon.config.sip
        for listen in cfg.listen:
            host, port = split_hostport(listen)
            for transport in cfg.transports:
                runner = _UaRunner(self, self._settings(host, port, transport.upper()))
                try:
                    await runner.start(host, port)
                except OSError as e:
                    raise listen_error("sip.listen", listen, transport, e) from e
                self.runners.append(runner)
        log.info("sip.listening", listen=list(cfg.listen), transports=list(cfg.transports))
        self._register_all()

    def _register_all(self) -> None:
        """Keep a binding at every ``[sip.registrations]`` registrar (refreshed by the engine)."""
        ua = next((r for r in self.runners if r.kind == "UDP"), None)
        for reg in self.daemon.config.sip.registrations:
            dest = _uri_hostport(reg.registrar)
            if ua is None or dest is None:
                log.error("sip.register_impossible", registration=reg.name)
                continue
            host = dest[0]
            ua.ua.register(
                dest,
                reg.registrar,
                f"sip:{reg.user}@{host}",
                ua.loop.time(),
                credentials=(reg.user, reg.password),
                expires_s=reg.expires_s,
            )
            ua.pump()
            log.info("sip.registering", registration=reg.name, registrar=reg.registrar)

    def active_calls(self) -> int:
        return len(self.calls)

    def count_response(self, data: bytes) -> None:
        if data.startswith(b"SIP/2.0 "):
            self.daemon.metrics.sip_responses_total.labels(
                data[8:11].decode("ascii", "replace")
            ).inc()

    def set_draining(self, draining: bool) -> None:
        self.draining = draining
        if draining:
            for r in self.runners:
                r.ua.drain()

    async def end_all_calls(self, reason: str) -> None:
        for call in list(self.calls.values()):
            if call.runner is not None:
                call.runner.hangup(reason)
            else:
                call.hangup(reason)
        await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            self._release(call)
        for r in self.runners:
            await r.stop()

    # ------------------------------------------------------------ events

    def on_sip_event(self, ua: _UaRunner, event: object) -> None:
        if isinstance(event, CallOffered):
            self.daemon.loop_task(self._offered(ua, event))
        elif isinstance(event, CallEnded | CallCancelled):
            call = self.calls.get(event.call_id)
            if call is not None:
                call.ended = True
                reason = getattr(event, "reason", "cancelled")
                if call.runner is not None:
                    call.runner.leg_ended(reason)
                self._release(call)
        elif isinstance(event, RegistrationStateChanged):
            log.info(
                "sip.registration",
                registered=event.registered,
                status=event.status,
                expires_s=event.expires_s,
            )
        elif isinstance(event, OutboundCallAnswered):
            self._outbound_answered(event)
        elif isinstance(event, OutboundCallFailed):
            self.pending_routes.pop(event.call_id, None)
            call = self.calls.get(event.call_id)
            log.info("sip.outbound_failed", call_id=event.call_id, status=event.status)
            if call is not None:
                call.ended = True
                self._release(call)
        elif isinstance(event, TransferProgress):
            log.info(
                "sip.transfer",
                call_id=event.call_id,
                status=event.status,
                reason=event.reason,
                final=event.final,
            )
            call = self.calls.get(event.call_id)
            runner = call.runner if call is not None else None
            if event.final and 200 <= event.status < 300 and runner is not None:
                runner.hangup("transferred")  # the transferee has the call now
        elif isinstance(event, DtmfInfoReceived):
            call = self.calls.get(event.call_id)
            if call is not None and call.runner is not None:
                call.runner.caller_dtmf(event.digit)
        elif isinstance(event, HoldChanged):
            call = self.calls.get(event.call_id)
            if call is not None:
                direction = (
                    event.direction if event.direction in ("sendonly", "inactive") else "sendrecv"
                )
                call.rtp.set_direction(
                    {"sendonly": "recvonly", "inactive": "inactive"}.get(direction, "sendrecv"),  # type: ignore[arg-type]
                    call.loop.time(),
                )
                if event.remote_rtp_addr is not None:
                    call.rtp.set_remote(event.remote_rtp_addr)

    async def _offered(self, ua: _UaRunner, event: CallOffered) -> None:
        loop = asyncio.get_running_loop()
        offered_at = loop.time()
        cfg = self.daemon.runtime.config if self.daemon.runtime else self.daemon.config
        route = cfg.route_for(_route_key(event.request_uri))
        reject: tuple[int, str] | None = None
        audio = negotiate(parse_sdp(event.offer_sdp), cfg.sip.codecs) if event.offer_sdp else None
        if route is None:
            reject = (404, "Not Found")
        elif audio is None:
            reject = (488, "Not Acceptable Here")
        elif self.active_calls() >= cfg.sip.max_calls:
            reject = (503, "Service Unavailable")
        elif self.daemon.ticker.overloaded(cfg.daemon.max_loop_lag_ms / 1000):
            reject = (503, "Service Unavailable")  # protect the calls in progress
            log.warning("sip.overloaded", lag_ms=round(self.daemon.ticker.lag_s * 1000, 2))
        if reject is not None or route is None or audio is None:
            status, phrase = reject or (500, "Server Internal Error")
            self.daemon.metrics.rejected_total.labels(f"sip_{status}").inc()
            ua.ua.reject(
                event.call_id,
                status,
                phrase,
                loop.time(),
                (("Retry-After", "5"),) if status == 503 else (),
            )
            ua.pump()
            return
        host = ua.ua.settings.local_host
        bound = self._bind(ua, event.call_id, host)
        if bound is None:
            ua.ua.reject(
                event.call_id, 503, "Service Unavailable", loop.time(), (("Retry-After", "5"),)
            )
            ua.pump()
            return
        call = bound[0]
        await call.attach(bound[1])
        call.start_media(audio)
        self.calls[event.call_id] = call
        rtp_host = cfg.sip.rtp_address or host
        offer = parse_sdp(event.offer_sdp)
        answer = build_answer(
            offer, audio, rtp_host, call.rtp_port, int.from_bytes(os.urandom(4), "big") >> 1, 1
        )
        try:
            ua.ua.answer(event.call_id, answer, loop.time())
        except Exception:  # the caller cancelled while we bound the ports
            log.info("sip.answer_failed", call_id=event.call_id)
            self._release(call)
            return
        ua.pump()
        self.daemon.metrics.call_setup_seconds.labels("sip").observe(loop.time() - offered_at)
        self._run_call(call, route, event.from_uri, event.to_uri)

    def _run_call(self, call: _SipCall, route: RouteConfig, from_uri: str, to_uri: str) -> None:
        bind_call(call.call_id)
        profile = LegProfile(kind="sip", codec=call.codec, heard_from="frames")  # type: ignore[arg-type]
        started = cmd.CallStarted(call_id=call.call_id, leg="sip", from_=from_uri, to=to_uri)
        runner = CallRunner(
            self.daemon,
            call.call_id,
            call,
            profile,
            route,
            started,
            on_finished=lambda r: self._runner_finished(call),
        )
        call.runner = runner
        runner.start()
        unbind_call()

    # ---------------------------------------------------------- outbound

    def originate(self, to_uri: str, from_uri: str, route_key: str) -> str:
        """Place a call to ``to_uri`` over UDP; returns its Call-ID (answered later).

        Raises:
            ValueError: no route, no UDP transport, a URI without a host, or no RTP port.
        """
        cfg = self.daemon.runtime.config if self.daemon.runtime else self.daemon.config
        route = cfg.route_for(route_key or _route_key(to_uri))
        if route is None:
            raise ValueError("no route matches")
        ua = next((r for r in self.runners if r.kind == "UDP"), None)
        if ua is None:
            raise ValueError("no UDP transport to call out on")
        dest = _uri_hostport(to_uri)
        if dest is None:
            raise ValueError(f"cannot find a host in {to_uri!r}")
        host = ua.ua.settings.local_host
        key = f"out-{os.urandom(6).hex()}"
        bound = self._bind(ua, key, host)
        if bound is None:
            raise ValueError("no RTP port free")
        call = bound[0]
        self.daemon.loop_task(call.attach(bound[1]))
        offer = build_offer(cfg.sip.rtp_address or host, call.rtp_port, 1, 1, cfg.sip.codecs)
        call_id = ua.ua.invite(to_uri, from_uri, offer, dest, call.loop.time())
        call.call_id, call.outbound = call_id, True
        self.calls[call_id] = call
        self.pending_routes[call_id] = (route, from_uri, to_uri)
        ua.pump()
        return call_id

    def _outbound_answered(self, event: OutboundCallAnswered) -> None:
        call = self.calls.get(event.call_id)
        pending = self.pending_routes.pop(event.call_id, None)
        if call is None or pending is None:
            return
        audio = negotiate(parse_sdp(event.answer_sdp), self.daemon.config.sip.codecs)
        if audio is None:
            call.hangup("no_codec")
            self._release(call)
            return
        call.start_media(audio)
        route, from_uri, to_uri = pending
        self.daemon.metrics.call_setup_seconds.labels("sip").observe(
            call.loop.time() - call.created_at
        )
        self._run_call(call, route, from_uri, to_uri)

    def _bind(
        self, ua: _UaRunner, call_id: str, host: str
    ) -> tuple[_SipCall, tuple[socket.socket, socket.socket]] | None:
        for _ in range(MAX_BIND_ATTEMPTS):
            port = self.ports.allocate(call_id)
            if port is None:
                return None
            call = _SipCall(self, ua, call_id, port)
            try:
                return call, call.bind_sockets(_bind_host(host))
            except OSError:
                self.ports.release(call_id)
                self.ports.mark_unusable(port)
        return None

    def _runner_finished(self, call: _SipCall) -> None:
        if not call.ended:
            call.hangup("finished")
        self._release(call)
        call.drop_cycles()

    def _release(self, call: _SipCall) -> None:
        if self.calls.pop(call.call_id, None) is not None:
            lost = call.rtp.reception_stats().lost
            if lost > 0:
                self.daemon.metrics.rtp_packets_lost_total.inc(lost)
            call.close()
            self.ports.release(call.port_key)


def _uri_hostport(uri: str) -> tuple[str, int] | None:
    m = re.match(r"^sips?:(?:[^@]*@)?(\[[^\]]+\]|[^:;>?]+)(?::(\d+))?", uri.strip("<>"), re.I)
    if m is None:
        return None
    return m.group(1).strip("[]"), int(m.group(2) or 5060)


def _bind_host(host: str) -> str:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    return "0.0.0.0"

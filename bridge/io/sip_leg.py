"""The SIP/RTP leg: SIP over UDP and TCP, one RTP socket pair per call.

One ``SipUserAgent`` engine per listening transport (``[sip] listen`` ×
``transports``). Each transport callback feeds its engine with
``loop.time()`` and pumps: datagrams and stream bytes out, call events to
this leg, one timer re-armed from ``next_deadline()``.

A ``CallOffered`` is routed by the request-URI user (``sip:demo@host`` →
route ``demo``), negotiated (PCMU/PCMA + telephone-event), given an RTP port
pair from ``[sip] rtp_ports`` and answered; the call then runs in a
``CallRunner``. Every 20 ms tick of the call's media clock sends one RTP
packet (the turn's frame, comfort silence between turns, or an RFC 4733
event while DTMF is being sent) and takes one inbound frame from the RTP
jitter buffer for the VAD/barge-in path. The port pair is released on every
exit path (BYE, CANCEL, RTP timeout, error, refused call, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from bridge.config import RouteConfig, split_hostport
from bridge.control import commands as cmd
from bridge.engine import SendDatagram
from bridge.io.callrun import CallRunner
from bridge.io.rtpsock import SCM_TIMESTAMPNS, recv_stamped
from bridge.io.ticker import InboundCallback, ProcessCallback
from bridge.logs import bind_call, get_logger, unbind_call
from bridge.media.call_types import LegProfile
from bridge.rtp.dtmf import DtmfReceived, DtmfSender, InbandDtmf
from bridge.rtp.jitter import FrameLost
from bridge.rtp.packet import is_rtcp
from bridge.rtp.ports import RtpPortAllocator
from bridge.rtp.session import RtpSession, RtpSessionConfig, RtpTimedOut, silence_frame
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
from bridge.sip.sdp import NegotiatedAudio, build_answer, build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipAuthUser, SipSettings
from bridge.sip.ua import SipUserAgent

if TYPE_CHECKING:
    from bridge.io.daemon import Daemon

__all__ = ["SipLeg"]

log = get_logger("callbridge.sip")

_URI_USER = re.compile(r"^sips?:([^@;>]+)@", re.IGNORECASE)
MAX_BIND_ATTEMPTS = 8

SO_TIMESTAMPNS = SCM_TIMESTAMPNS if sys.platform == "linux" else None
"""Linux: the kernel stamps each datagram's arrival (``SCM_TIMESTAMPNS``, CLOCK_REALTIME)."""
FRAME_S = 0.02
SIP_UDP_RCVBUF_BYTES = 4 * 1024 * 1024
"""Receive buffer asked for the SIP UDP socket. The kernel's default (``net.core.rmem_default``,
about 208 KB) holds only about a hundred datagrams, counted at their in-kernel size: a burst
of hang-ups or INVITEs beyond that is dropped before the daemon reads it, and a lost BYE
leaves its call up until the RTP timeout. The kernel caps the request at
``net.core.rmem_max`` (docs/operations.md)."""
MAX_READS_PER_TICK = 32
"""A call's RTP socket is read at its tick; a backlog larger than this waits for the next one."""


def _route_key(request_uri: str) -> str:
    m = _URI_USER.match(request_uri.strip("<>"))
    return m.group(1) if m else ""


class _DatagramProtocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:  # ICMP unreachable and the like
        log.debug("udp.error", error=str(exc))


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
            self.udp = transport  # type: ignore[assignment]
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


class _SipCall:
    """``LegAdapter`` of one SIP call: its RTP session and sockets."""

    kind = "sip"
    # Slots: the per-frame path (send_frame, _inbound, _process) reads a dozen of
    # these on every tick; slot reads are the cheapest attribute access in CPython.
    __slots__ = (
        "__weakref__",
        "_inbound_cb",
        "_process_cb",
        "_rx",
        "_rx_addr",
        "_rx_at",
        "_rx_data",
        "_rx_key",
        "_rx_source",
        "audio",
        "call_id",
        "created_at",
        "dtmf",
        "dtmf_active",
        "ended",
        "inband",
        "leg",
        "loop",
        "outbound",
        "outbox",
        "port_key",
        "pt",
        "rtcp_transport",
        "rtp",
        "rtp_port",
        "rtp_sock",
        "runner",
        "sending_audio",
        "silence",
        "ticker",
        "ua",
    )

    def __init__(self, leg: SipLeg, ua: _UaRunner, call_id: str, rtp_port: int) -> None:
        self.leg = leg
        self.ua = ua
        self.call_id = call_id
        self.port_key = call_id
        self.rtp_port = rtp_port
        self.loop = asyncio.get_running_loop()
        self.audio: NegotiatedAudio | None = None
        self.rtp = RtpSession(RtpSessionConfig(), None, self.loop.time())  # until negotiated
        self.pt = 0
        self.silence = silence_frame(0)
        self.dtmf = DtmfSender()
        self.dtmf_active = False
        """Digits queued on ``dtmf``: ticks ask it for a packet only then."""
        self.inband: InbandDtmf | None = None
        self.rtp_sock: socket.socket | None = None
        """The RTP socket: read at the call's tick (``_inbound``), not by the loop."""
        self.rtcp_transport: asyncio.DatagramTransport | None = None
        self.ticker = leg.daemon.ticker
        self.outbox = self.ticker.outbox
        self._inbound_cb: InboundCallback = self._inbound
        self._process_cb: ProcessCallback = self._process
        self._rx_data: bytes | None = None
        """The first datagram this tick's ``_inbound`` read, for its ``_process`` (None: none)."""
        self._rx_addr: Any = None
        self._rx_at = 0.0
        """The first datagram's source and arrival time."""
        self._rx_key = -2
        self._rx_source: tuple[str, int] | None = None
        """The last datagram's source, and its key from ``rtpsock.recv_stamped`` (-2: none yet)."""
        self._rx: list[tuple[bytes, Any, float]] = []
        """(datagram, source, arrival) of any further datagrams read by this tick's ``_inbound``."""
        self.runner: CallRunner | None = None
        self.sending_audio = False
        self.ended = False
        self.outbound = False
        self.created_at = self.loop.time()

    def start_media(self, audio: NegotiatedAudio) -> None:
        """Offer/answer is done: the RTP session for the negotiated stream."""
        self.audio = audio
        host = audio.remote_addr[0] if audio.remote_addr else None
        self.rtp = RtpSession(
            RtpSessionConfig(
                payload_types=frozenset({audio.payload_type}),
                telephone_event_pt=audio.telephone_event_pt,
                latch=True,
                latch_host=host,
                timeout_s=self.leg.daemon.config.sip.rtp_timeout_s,
            ),
            audio.remote_addr,
            self.loop.time(),
        )
        self.pt = audio.payload_type
        self.silence = silence_frame(self.pt)
        # no telephone-event negotiated: listen for in-band tones instead
        law: Literal["ulaw", "alaw"] = "alaw" if audio.codec == "PCMA" else "ulaw"
        self.inband = InbandDtmf(law) if audio.telephone_event_pt is None else None

    @property
    def codec(self) -> str:
        return "alaw" if self.audio is not None and self.audio.codec == "PCMA" else "mulaw"

    def bind_sockets(self, host: str) -> tuple[socket.socket, socket.socket]:
        """Bind the RTP/RTCP port pair now (raises OSError if either is taken)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        pair: list[socket.socket] = []
        try:
            for port in (self.rtp_port, self.rtp_port + 1):
                sock = socket.socket(family, socket.SOCK_DGRAM)
                pair.append(sock)
                sock.setblocking(False)
                sock.bind((host, port))
            if SO_TIMESTAMPNS is not None:
                with contextlib.suppress(OSError):
                    pair[0].setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            for sock in pair:
                sock.close()
            raise
        return pair[0], pair[1]

    async def attach(self, socks: tuple[socket.socket, socket.socket]) -> None:
        """Take the bound port pair: RTCP is read by the loop, RTP at each tick."""
        self.rtp_sock = socks[0]
        rtcp = _DatagramProtocol(self._on_rtcp)
        t2, _ = await self.loop.create_datagram_endpoint(lambda: rtcp, sock=socks[1])
        self.rtcp_transport = t2  # type: ignore[assignment]
        if self.ended:
            self.close()

    def _on_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        self.rtp.receive_rtcp(data, addr, self.loop.time())
        self._pump_rtp()

    def _pump_rtp(self) -> None:
        for action in self.rtp.actions_to_send():
            if isinstance(action, SendDatagram) and self.rtp_sock is not None:
                # by content, not by the destination's parity: RTP must leave from the RTP
                # port (symmetric RTP, RFC 4961) even when the peer's port is odd (NAT)
                if is_rtcp(action.data) and self.rtcp_transport is not None:
                    self.rtcp_transport.sendto(action.data, action.addr)
                else:
                    try:
                        self.rtp_sock.sendto(action.data, action.addr)
                    except OSError:  # full buffer or closed: RTP does not queue
                        self.ticker.send_errors += 1
        for event in self.rtp.events_received():
            if isinstance(event, DtmfReceived) and self.runner is not None:
                self.runner.caller_dtmf(event.digit)
            elif isinstance(event, RtpTimedOut):
                log.info("sip.rtp_timeout", call_id=self.call_id)
                if self.runner is not None:
                    self.runner.hangup("rtp_timeout")

    # --- LegAdapter ---------------------------------------------------------

    def send_frame(self, frame: bytes | None, n: int, now: float) -> InboundCallback:
        """This tick's RTP packet out (the per-call hot path); returns the tick's inbound work.

        The common tick builds one datagram (``RtpSession.frame_packet``) and
        queues it on the ticker's outbox, which sends every due call's packet
        back to back (``bridge.io.ticker``): no action object, no outbox
        lists of the engine. ``_inbound`` runs after that send.
        """
        rtp = self.rtp
        if self.dtmf_active:
            packet = self.dtmf.next_packet()
            if packet is None and self.dtmf.idle:
                self.dtmf_active = False
            if packet is not None:
                rtp.send_telephone_event(packet, now, n)
                self._pump_rtp()
                return self._inbound_cb
        if frame is None:
            frame = self.silence
            self.sending_audio = False
        elif not self.sending_audio:
            rtp.start_talkspurt()
            self.sending_audio = True
        data = rtp.frame_packet(frame, self.pt, now, n)
        if data is not None:
            sock = self.rtp_sock
            if sock is not None:
                self.outbox.append((sock, data, rtp.remote_addr))
        return self._inbound_cb

    def _inbound(self, now: float) -> ProcessCallback:
        """The tick's read of the RTP socket; returns the work on what was read (``_process``).

        The socket is read here rather than by the loop: one ``recvmsg`` per
        call per tick instead of a loop wake-up and a callback per datagram,
        and the ticker runs every due call's read back to back (the kernel's
        receive path stays warm). Each datagram keeps its kernel arrival time
        (``SO_TIMESTAMPNS``) for the jitter buffer and the RFC 3550 jitter.
        Reading stops at the first datagram that arrived within the last
        frame period (anything queued behind it is younger still and is read
        at the next tick), so a backlog drains and the common tick costs a
        single ``recvmsg``. The reads go through ``bridge.io.rtpsock``: the
        peer's address is formatted once, not per datagram, and an empty
        socket raises nothing.
        """
        sock = self.rtp_sock
        if sock is None or self._rx_data is not None:
            # (not yet processed: a talkspurt start moved this tick ahead of the last
            # one's third phase, which the ticker had put off; the socket keeps the rest)
            return self._process_cb
        # the common tick: one datagram, kept in three slots (no tuple, no list)
        try:
            got = recv_stamped(sock, self._rx_key)
        except OSError:  # the socket was closed
            return self._process_cb
        if got is None:  # nothing queued
            return self._process_cb
        data, stamp, key, addr = got
        if addr is not None:  # a source other than the last one (or not IPv4)
            self._rx_key = key
            self._rx_source = addr
        self._rx_data = data
        self._rx_addr = self._rx_source
        if stamp >= 0.0:
            arrival = stamp + self.ticker.real_to_mono
            if arrival > now:
                arrival = now
            self._rx_at = arrival
            if arrival > now - FRAME_S:
                return self._process_cb
        else:
            self._rx_at = now  # no kernel stamp: read until the queue is empty
        # a backlog: the rest, in order, behind the first
        rx = self._rx
        mono = self.ticker.real_to_mono
        for _ in range(MAX_READS_PER_TICK - 1):
            try:
                got = recv_stamped(sock, self._rx_key)
            except OSError:
                break
            if got is None:
                break
            data, stamp, key, addr = got
            if addr is not None:
                self._rx_key = key
                self._rx_source = addr
            if stamp < 0.0:
                rx.append((data, self._rx_source, now))
                continue
            arrival = stamp + mono
            if arrival > now:
                arrival = now
            rx.append((data, self._rx_source, arrival))
            if arrival > now - FRAME_S:
                break
        return self._process_cb

    def _process(self, now: float) -> None:
        """The caller's side of the tick: what was read into the RTP engine, one frame on."""
        rtp = self.rtp
        pump = False
        data = self._rx_data
        if data is not None:
            self._rx_data = None
            # (host, port): rtpsock gives IPv6 sources without flow info and scope
            if rtp.receive_datagram(data, self._rx_addr, self._rx_at):
                pump = True  # the engine queued something (latch, DTMF, SSRC, ...)
            rx = self._rx
            if rx:
                for data, addr, arrival in rx:
                    if rtp.receive_datagram(data, addr, arrival):
                        pump = True
                rx.clear()
        # RTCP report, RTP timeout, DTMF end: every few seconds (poll_timer's own first test)
        if now >= rtp.timer_floor and rtp.poll_timer(now):
            pump = True
        inbound = rtp.pop_frame(now)
        if pump:
            self._pump_rtp()
        runner = self.runner
        if runner is None:
            return
        if inbound is None or isinstance(inbound, FrameLost):
            runner.caller_audio(self.silence)
        elif len(payload := inbound.payload) == 160:
            runner.caller_audio(payload)
            if self.inband is not None:
                for digit in self.inband.process(payload):
                    runner.caller_dtmf(digit)

    def send_mark(self, name: str) -> None:
        """RTP has no marks: a frame sent is a frame heard."""

    def clear(self) -> None:
        """RTP has no far-end buffer to clear: not sending is enough."""

    def hangup(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            with contextlib.suppress(Exception):  # the dialog may already be gone
                self.ua.ua.hangup(self.call_id, self.loop.time())
            self.ua.pump()

    def transfer(self, target: str) -> None:
        self.ua.ua.refer(self.call_id, target, self.loop.time())
        self.ua.pump()

    def send_dtmf(self, digits: str) -> None:
        if self.audio is not None and self.audio.telephone_event_pt is not None:
            self.dtmf.send_digits(digits)
            self.dtmf_active = True
        else:
            log.warning("sip.dtmf_unsupported", call_id=self.call_id)

    def close(self) -> None:
        self.rtp.close(self.loop.time())
        self._pump_rtp()
        if self.rtcp_transport is not None:
            self.rtcp_transport.close()
        if self.rtp_sock is not None:
            self.rtp_sock.close()

    def drop_cycles(self) -> None:
        """The call is over: break the reference cycles through it.

        Its runner holds it as its leg, and the bound methods cached for the
        ticker hold it too; left alone the ended call (tens of KB with its
        bridge) waits for a full GC pass, or with the GC policy for the next
        thaw (``tests/e2e/test_call_release.py``). A tick already under way
        reads nothing more.
        """
        self.runner = None
        self._inbound_cb = self._process_cb = _read_nothing


def _read_nothing(now: float) -> None:
    """A closed call's tick work: nothing to read or process."""


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
                await runner.start(host, port)
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
        call.runner = CallRunner(
            self.daemon,
            call.call_id,
            call,
            profile,
            route,
            started,
            on_finished=lambda r: self._runner_finished(call),
        )
        call.runner.start()
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

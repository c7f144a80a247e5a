"""The SIP/RTP leg: SIP over UDP, TCP and TLS, one RTP socket pair per call.

One ``SipUserAgent`` engine per listening transport (``[sip] listen`` ×
``transports``, and one per ``[sip] tls_listen``: ``bridge.io.sip_tls``). Each
transport callback feeds its engine with ``loop.time()`` and pumps: datagrams
and stream bytes out, call events to this leg, one timer re-armed from
``next_deadline()``.

A ``CallOffered`` is routed by the request-URI user (``sip:demo@host`` →
route ``demo``), negotiated (PCMU/PCMA + telephone-event), given an RTP port
pair from ``[sip] rtp_ports`` and answered; the call then runs in a
``CallRunner``; its media (one RTP packet out and one frame in per 20 ms
tick) is a ``_SipCall`` (``bridge.io.legs.sip_call``, compiled with mypyc). The
port pair is released on every exit path (BYE, CANCEL, RTP timeout, error,
refused call, shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import importlib
import ipaddress
import os
import re
import secrets
import socket
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge import commands as cmd
from bridge.config import (
    Config,
    ConnectionLimits,
    RouteConfig,
    SipRegistration,
    split_hostport,
)
from bridge.engine import LocalProtocolError, SendDatagram
from bridge.io.callrun import CallRunner
from bridge.io.connlimits import ConnectionGate
from bridge.io.dns import DnsCache, DnsError, SipLocator, is_ip_literal, make_resolver
from bridge.io.legs.sip_call import _DatagramProtocol, _SipCall
from bridge.io.services import Services
from bridge.io.sip_tls import HANDSHAKE_TIMEOUT_S, ClientContexts, server_context
from bridge.io.startup import listen_error
from bridge.logs import bind_call, get_logger, unbind_call
from bridge.media.call_types import AnswerLeg, LegProfile, RejectLeg
from bridge.rtp.ports import UNUSABLE_COOLDOWN_S, RtpPortAllocator
from bridge.rtp.session import LatchingMode
from bridge.sip.dialog import Peer
from bridge.sip.digest import DigestCredentials
from bridge.sip.errors import SipParseError
from bridge.sip.events import (
    AuthFailed,
    CallCancelled,
    CallEnded,
    CallOffered,
    CloseStream,
    DtmfInfoReceived,
    EarlyMediaExpired,
    HoldChanged,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgress,
    OutboundCallRetried,
    RegistrationRetried,
    RegistrationStateChanged,
    SendStream,
    SrtpKeyChanged,
    TransferProgress,
)
from bridge.sip.locate import Located, plan_lookup
from bridge.sip.sdp import (
    SDES_SUITES,
    NegotiatedAudio,
    SdesCrypto,
    SdpError,
    build_answer,
    build_offer,
    choose_crypto,
    negotiate,
    parse_sdp,
)
from bridge.sip.settings import SipAuthUser, SipSecurity, SipSettings, TrunkConfig
from bridge.sip.trunks import TrunkLimited, TrunkLimiter, choose_trunk, trunk_credentials
from bridge.sip.ua import SipUserAgent
from bridge.sip.uri import OutboundTarget, TargetError, outbound_target, parse_uri

__all__ = ["SipLeg"]

if TYPE_CHECKING:
    from bridge.rtp.srtp import SrtpContext

log = get_logger("callbridge.sip")

_URI_USER = re.compile(r"^sips?:([^@;>]+)@", re.IGNORECASE)
MAX_BIND_ATTEMPTS = 8
PORT_ZERO_ATTEMPTS = 20
"""A ``[sip] listen`` on port 0 whose later transport finds the port held: bound again."""
MAX_NEXT_SERVERS = 3
"""A call out tries at most this many servers after the first (RFC 3263 §4.3): each
that times out costs Timer B (32 s)."""
TIMER_RETRY_S = 0.1
"""After ``handle_timer`` raised, the engine's timer is tried again no sooner than this."""

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

    def __init__(
        self,
        leg: SipLeg,
        settings: SipSettings,
        limits: ConnectionLimits | None = None,
        tls: tuple[ssl.SSLContext, ClientContexts] | None = None,
    ) -> None:
        self.leg = leg
        self.ua = SipUserAgent(settings)
        self.kind = settings.transport
        self.loop = asyncio.get_running_loop()
        self.udp: asyncio.DatagramTransport | None = None
        self.tcp: asyncio.Server | None = None
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.pending: dict[int, list[bytes]] = {}
        """Outbound TCP connections still opening: what the engine sent them so far."""
        self.next_conn_id = 1
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        """The deadline ``timer`` is armed for (while it is not None)."""
        self.timer_floor = 0.0
        """No timer before this (set after a failed ``handle_timer``)."""
        self.gate = ConnectionGate(limits or ConnectionLimits())
        """The TCP listener's connection caps (``[sip] max_connections``...)."""
        self.refused_not_allowed = 0
        """TCP connections closed at accept: their source is outside ``[sip] allow``."""
        self.timed_out = 0
        """TCP connections closed by ``header_timeout_s`` or ``idle_timeout_s``."""
        family = socket.AF_INET6 if ":" in settings.local_host else socket.AF_INET
        self.dns = DnsCache(family)
        """Host names the engine sends to (``bridge.io.dns``), resolved off the media path."""
        self.awaiting_dns: dict[str, list[tuple[bytes, int]]] = {}
        """Datagrams for a name being looked up: (data, port), sent once it resolves."""
        self.tls = tls
        """TLS: the listener's context and the outbound ones (``bridge.io.sip_tls``)."""
        self.peer_conns: dict[tuple[str, int, str, str], int] = {}
        """TCP and TLS: the one connection per peer (address, port, and for TLS the server
        name) we call out and register on, reused by later requests (RFC 5923's spirit)
        and opened again once it drops; the fourth element is the trunk whose TLS settings
        it was opened with ("": ``[sip]``'s)."""
        self.conn_peers: dict[int, tuple[str, int, str, str]] = {}
        """The reverse of ``peer_conns``."""
        self.tls_handshakes = 0
        """Outbound TLS handshakes completed (one per peer while its connection lives)."""
        self.connections_opened = 0
        """Outbound TCP or TLS connections opened (one per peer while it lives)."""

    async def start(self, host: str, port: int) -> int:
        """Bind the listener; the port it got (port 0 binds any free one, and the engine's
        settings take it: its Via and Contact name the bound port, never 0)."""
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
        elif self.tls is not None:
            # the handshake comes first: [sip] allow and the connection caps are checked
            # once it is done (a stranger costs one handshake, bounded by its timeout)
            self.tcp = await asyncio.start_server(
                self._on_stream,
                host,
                port,
                ssl=self.tls[0],
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        else:
            self.tcp = await asyncio.start_server(self._on_stream, host, port)
        if self.udp is not None:
            bound = int(self.udp.get_extra_info("sockname")[1])
        else:
            assert self.tcp is not None
            bound = int(self.tcp.sockets[0].getsockname()[1])
        if bound != self.ua.settings.local_port:  # port 0: nothing has reached the engine
            self.ua = SipUserAgent(dataclasses.replace(self.ua.settings, local_port=bound))
        return bound

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            self.ua.receive_datagram(data, addr, self.loop.time())
        except Exception:  # an engine bug on one datagram must not stop the listener
            log.exception("sip.receive_failed", source=addr[0])
        self.pump()
        # the loop hands a socket's queued datagrams over in one pass: a burst
        # of INVITEs (a few hundred microseconds each) must not hold every
        # call's frames back (bridge.io.ticker, "run_if_due")
        self.leg.services.ticker.run_if_due()

    async def _on_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = (peer[0], peer[1]) if peer else ("0.0.0.0", 0)
        # checked at accept, before anything is read: a source outside [sip] allow, or
        # one connection too many (in all or from this source), is closed at once
        if not self.ua.allows_source(source[0]):
            self.refused_not_allowed += 1
            writer.transport.abort()
            return
        if self.gate.admit(source[0]) is not None:
            writer.transport.abort()
            return
        conn_id = self.next_conn_id
        self.next_conn_id += 1
        await self._serve_stream(conn_id, reader, writer, source, gated=True)

    def connect(self, addr: tuple[str, int], server_name: str = "", trunk: str = "") -> int:
        """The connection to a peer we call or register at; its conn_id at once (what
        the engine sends before it is up waits in ``pending``; if it cannot connect,
        the calls waiting on it fail at once, as a 503). The peer's connection if one
        is open or opening, over TCP and TLS alike (TLS: ``server_name`` is the name its
        certificate must carry, and SNI; empty: the address; ``trunk``: whose TLS
        verification applies, "" for ``[sip]``'s)."""
        tls = self.tls is not None
        key = (addr[0], addr[1], (server_name or addr[0]) if tls else "", trunk if tls else "")
        conn_id = self.peer_conns.get(key, 0)
        if conn_id and (conn_id in self.writers or conn_id in self.pending):
            return conn_id
        if not conn_id:
            conn_id = self.next_conn_id
            self.next_conn_id += 1
            self.peer_conns[key] = conn_id
            self.conn_peers[conn_id] = key
        self._open(conn_id, [])
        return conn_id

    def reserve(self, addr: tuple[str, int], server_name: str = "", trunk: str = "") -> int:
        """The conn_id of a peer's connection (as ``connect``), without opening it: it is
        opened when the engine first sends on it (a call's next server, RFC 3263)."""
        tls = self.tls is not None
        key = (addr[0], addr[1], (server_name or addr[0]) if tls else "", trunk if tls else "")
        conn_id = self.peer_conns.get(key, 0)
        if not conn_id:
            conn_id = self.next_conn_id
            self.next_conn_id += 1
            self.peer_conns[key] = conn_id
            self.conn_peers[conn_id] = key
        return conn_id

    def refer_target(self, call_id: str, target: str, trunk: str = "") -> str:
        return self.leg.refer_target(call_id, target, trunk)

    def _open(self, conn_id: int, queued: list[bytes]) -> None:
        """(Re)open the peer's connection ``conn_id`` with ``queued`` to send on it."""
        host, port, name, trunk = self.conn_peers[conn_id]
        self.pending[conn_id] = queued
        self.leg.services.spawn(self._connect(conn_id, (host, port), name, trunk))

    async def _connect(
        self, conn_id: int, addr: tuple[str, int], server_name: str = "", trunk: str = ""
    ) -> None:
        try:
            if self.tls is not None:
                contexts = self.tls[1]
                reader, writer = await asyncio.open_connection(
                    addr[0],
                    addr[1],
                    ssl=contexts.for_trunk(trunk, server_name or addr[0])
                    if isinstance(contexts, _TrunkContexts)
                    else contexts.for_host(server_name or addr[0]),
                    server_hostname=server_name or addr[0],
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
                )
                self.tls_handshakes += 1
            else:
                reader, writer = await asyncio.open_connection(addr[0], addr[1])
            self.connections_opened += 1
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            self.pending.pop(conn_id, None)
            log.info("sip.connect_failed", host=addr[0], port=addr[1], error=str(exc))
            self.ua.connection_lost(conn_id)
            self.ua.connection_failed(conn_id, self.loop.time())
            self.pump()
            return
        for data in self.pending.pop(conn_id, []):
            writer.write(data)
        self.ua.flow_opened(conn_id, self.loop.time())  # ours: kept alive with CRLF pings
        self.pump()
        peer = writer.get_extra_info("peername")
        source = (peer[0], peer[1]) if peer else (addr[0], addr[1])
        await self._serve_stream(conn_id, reader, writer, source, gated=False)

    async def _serve_stream(
        self,
        conn_id: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        source: tuple[str, int],
        gated: bool,
    ) -> None:
        """Read one connection until it closes or times out; ``gated``: it holds a place
        in the listener's connection gate (an inbound one), given back at its end."""
        self.writers[conn_id] = writer
        limits = self.gate.limits
        started = self.loop.time()  # of the message not complete yet (or of the connection)
        last_complete: float | None = None
        try:
            while True:
                now = self.loop.time()
                # our own connections (calls out, registrations) are ours to keep: only a
                # message left incomplete times them out, never idleness
                if self.ua.stream_partial_bytes(conn_id) or (gated and last_complete is None):
                    deadline: float | None = started + limits.header_timeout_s
                elif gated and last_complete is not None and limits.idle_timeout_s > 0:
                    deadline = last_complete + limits.idle_timeout_s
                else:
                    deadline = None
                try:
                    data = await asyncio.wait_for(
                        reader.read(65536), None if deadline is None else max(0.0, deadline - now)
                    )
                except TimeoutError:  # a dribbled message, or an idle connection
                    self.timed_out += 1
                    log.info(
                        "sip.tcp_timeout",
                        source=source[0],
                        partial=self.ua.stream_partial_bytes(conn_id) > 0,
                    )
                    break
                if not data:
                    break
                now = self.loop.time()
                before = self.ua.stream_partial_bytes(conn_id)
                self.ua.receive_stream(conn_id, data, source, now)
                if self.ua.stream_partial_bytes(conn_id) < before + len(data):
                    # bytes were consumed: a message (or a keepalive) is complete, and
                    # what is left over began in this read
                    last_complete = started = now
                self.pump()
                self.leg.services.ticker.run_if_due()
        except (ConnectionError, OSError):
            pass
        finally:
            if gated:
                self.gate.release(source[0])
            if self.writers.get(conn_id) is writer:  # (not a connection opened again since)
                del self.writers[conn_id]
            self.ua.connection_lost(conn_id)
            if conn_id in self.conn_peers:  # ours: its calls and registrations learn of it
                self.ua.connection_failed(conn_id, self.loop.time())
            self.pump()
            writer.close()

    def pump(self) -> None:
        """Send the engine's actions, hand its events to the leg, re-arm its timer.

        One failing action or event is logged and the rest of the batch goes on;
        the timer is re-armed whatever happened (an engine left without its timer
        would never retransmit or time out again).
        """
        try:
            for action in self.ua.actions_to_send():
                try:
                    self._perform(action)
                except Exception:
                    log.exception("sip.action_failed", action=type(action).__name__)
            if self.ua.refusals:  # what the engine refused: allowlist, rate, drain, limit, auth
                for reason, count in self.ua.take_refusals().items():
                    self.leg.services.metrics.rejected_total.labels(reason).inc(count)
            for event in self.ua.events_received():
                try:
                    self.leg.on_sip_event(self, event)
                except Exception:
                    log.exception("sip.event_failed", sip_event=type(event).__name__)
        finally:
            self._arm_timer()

    def _perform(self, action: object) -> None:
        if isinstance(action, SendDatagram):
            self.leg.count_response(action.data)
            if self.udp is not None:
                if is_ip_literal(action.addr[0]):
                    self.udp.sendto(action.data, action.addr)
                else:
                    self._send_to_name(action.data, action.addr[0], action.addr[1])
        elif isinstance(action, SendStream):
            self.leg.count_response(action.data)
            writer = self.writers.get(action.conn_id)
            if writer is not None:
                writer.write(action.data)
            elif action.conn_id in self.pending:  # an outbound connection still opening
                self.pending[action.conn_id].append(action.data)
            elif action.conn_id in self.conn_peers:  # a peer's connection dropped
                self._open(action.conn_id, [action.data])
            elif action.reopen_to is not None:  # a caller's connection dropped: its Contact
                conn_id = self.connect(action.reopen_to, action.reopen_to[0])
                writer = self.writers.get(conn_id)
                if writer is not None:
                    writer.write(action.data)
                else:
                    self.pending.setdefault(conn_id, []).append(action.data)
        elif isinstance(action, CloseStream):
            writer = self.writers.pop(action.conn_id, None)
            if writer is None:
                return
            if action.flow_failed:  # no pong to our keep-alive: the peer may be gone
                peer = self.conn_peers.get(action.conn_id)
                log.info(
                    "sip.keepalive_failed",
                    host=peer[0] if peer else "",
                    port=peer[1] if peer else 0,
                )
                writer.transport.abort()  # at once: queued bytes may never drain
            else:
                writer.close()

    def _send_to_name(self, data: bytes, host: str, port: int) -> None:
        """A datagram for a host name (a registrar, a Contact): sent to its address from
        the cache, or once the lookup ends; dropped if the name does not resolve (the
        engine's transaction then times out, as with an unreachable host)."""
        cached = self.dns.get(host, self.loop.time())
        if cached is not None:
            address, why = cached
            if address is None:
                log.info("sip.dns_failed", host=host, error=why)
            elif self.udp is not None:
                self.udp.sendto(data, (address, port))
            return
        waiting = self.awaiting_dns.get(host)
        if waiting is not None:
            waiting.append((data, port))
            return
        self.awaiting_dns[host] = [(data, port)]
        self.leg.services.spawn(self._resolve_and_send(host))

    async def _resolve_and_send(self, host: str) -> None:
        try:
            address: str | None = await self.dns.lookup(host, self.loop.time())
        except DnsError as e:
            log.warning("sip.dns_failed", host=host, error=str(e))
            address = None
        for data, port in self.awaiting_dns.pop(host, []):
            if address is not None and self.udp is not None:
                self.udp.sendto(data, (address, port))

    def _arm_timer(self) -> None:
        deadline = self.ua.next_deadline()
        if deadline is not None and deadline < self.timer_floor:
            deadline = self.timer_floor  # the last timer failed: no busy loop of failures
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
        now = self.loop.time()
        try:
            self.ua.handle_timer(now)
        except Exception:
            log.exception("sip.timer_failed")
            self.timer_floor = now + TIMER_RETRY_S
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

    def __init__(self, services: Services) -> None:
        self.services = services
        cfg = services.config.sip
        self.ports = RtpPortAllocator(cfg.rtp_ports)
        self.port_cooldown_s = UNUSABLE_COOLDOWN_S
        """How long a port found in use by another process is left out (``RtpPortAllocator``)."""
        self.runners: list[_UaRunner] = []
        self.calls: dict[str, _SipCall] = {}
        self.draining = False
        self.secret = os.urandom(32)
        self.pending_routes: dict[str, tuple[RouteConfig, str, str, str]] = {}
        """Outbound calls not answered yet: route, From, To and the next hop's host."""
        self.offered_keys: dict[str, tuple[SdesCrypto, ...]] = {}
        """Outbound calls not answered yet that offered SRTP: the keys they offered."""
        self.early: dict[str, tuple[_UaRunner, str]] = {}
        """Inbound calls in early media (183 sent, no final response): their user agent and
        SDP answer (the 200 repeats it). Whether and when to answer is the bridge's call."""
        self.early_out: set[str] = set()
        """Outbound calls receiving the far end's early media (their RTP read on the
        ticker before a runner exists)."""
        self.call_trunks: dict[str, TrunkConfig] = {}
        """The calls through a ``[trunks]`` entry (out, and in from its sources)."""
        self.trunk_limits: dict[str, TrunkLimiter] = {}
        """Each trunk's concurrent calls and call-out rate (``bridge.sip.trunks``)."""
        self.dns_servers = cfg.dns_servers
        self.locator = SipLocator(make_resolver(cfg.dns_servers))
        """RFC 3263 server location of next hops (``bridge.io.dns``): ``[sip] dns_servers``."""

    def _settings(self, host: str, port: int, transport: str) -> SipSettings:
        cfg = self.services.config.sip
        return SipSettings(
            security=cfg.security,
            local_host=host,
            local_port=port,
            contact_host=cfg.external_address,
            transport=transport,
            allowed_sources=cfg.allow,
            trusted_proxies=cfg.trusted_proxies,
            auth_realm=cfg.auth_realm,
            auth_users=tuple(SipAuthUser(u.user, u.password) for u in cfg.auth_users),
            auth_secret=self.secret,
            invite_rate_per_s=cfg.invite_rate_per_source,
            max_calls=cfg.max_calls,
            session_expires_s=cfg.session_expires_s,
            keepalive_s=cfg.keepalive_s,
            codecs=cfg.codecs,
            trunks=self.services.config.trunks,
        )

    async def start(self) -> None:
        load_srtp(self.services.config)
        cfg = self.services.config.sip
        bound: list[str] = []
        for listen in cfg.listen:
            host, port = split_hostport(listen)
            for attempt in range(PORT_ZERO_ATTEMPTS if port == 0 else 1):
                last = port != 0 or attempt == PORT_ZERO_ATTEMPTS - 1
                runners = await self._bind_listen(listen, host, port, last)
                if runners:
                    break
            self.runners.extend(runners)
            got = runners[0].ua.settings.local_port
            bound.append(f"[{host}]:{got}" if ":" in host else f"{host}:{got}")
        if cfg.tls_listen:
            tls = (
                server_context(cfg.tls_certificate_file, cfg.tls_key_file),
                _TrunkContexts(cfg.security, self.services.config.trunks),
            )
        for listen in cfg.tls_listen:
            host, port = split_hostport(listen)
            runner = _UaRunner(self, self._settings(host, port, "TLS"), cfg.limits, tls)
            try:
                got = await runner.start(host, port)
            except OSError as e:
                raise listen_error("sip.tls_listen", listen, "tls", e) from e
            self.runners.append(runner)
            bound.append(f"[{host}]:{got}" if ":" in host else f"{host}:{got}")
        log.info(
            "sip.listening",
            listen=list(cfg.listen),
            bound=bound,
            transports=list(cfg.transports),
            tls_listen=list(cfg.tls_listen),
        )
        self._register_all()

    async def _bind_listen(self, listen: str, host: str, port: int, last: bool) -> list[_UaRunner]:
        """One ``listen`` address's runners, one a transport, all on one port. Port 0: the
        first transport binds any free port and the others that one; [] if another process
        holds it for a later transport (unless ``last``: then that is an error)."""
        cfg = self.services.config.sip
        runners: list[_UaRunner] = []
        for transport in cfg.transports:
            runner = _UaRunner(self, self._settings(host, port, transport.upper()), cfg.limits)
            try:
                port = await runner.start(host, port)
            except OSError as e:
                for r in runners:
                    await r.stop()
                if runners and e.errno == errno.EADDRINUSE and not last:
                    return []
                raise listen_error("sip.listen", listen, transport, e) from e
            runners.append(runner)
        return runners

    def apply_config(self) -> None:
        """After a reload (``daemon.config`` is the new one): ``allow``, the digest users,
        the INVITE rate limit, ``max_calls``... and the TCP connection limits, from the
        next request or connection on. Addresses and transports cannot change here."""
        load_srtp(self.services.config)
        for runner in self.runners:
            s = runner.ua.settings
            runner.ua.apply_settings(self._settings(s.local_host, s.local_port, runner.kind))
            runner.gate.limits = self.services.config.sip.limits

    def _register_all(self) -> None:
        """Keep a binding at every ``[sip.registrations]`` registrar and every trunk's
        (refreshed by the engine), over its transport (a trunk's: its ``transport``, on
        ``registrar_hop``): UDP, or the registrar's TCP or TLS connection
        (``_UaRunner.connect``: shared with calls to that peer, a trunk's TLS one made with
        the trunk's TLS settings, opened again when it drops, and the engine registers
        again on it)."""
        cfg = self.services.config
        regs: list[tuple[SipRegistration, str, str, DigestCredentials | None, str | None]] = [
            (reg, reg.registrar, "", DigestCredentials(reg.user, reg.password), None)
            for reg in cfg.sip.registrations
        ]
        regs += [
            (
                SipRegistration(f"trunks.{t.name}", t.registrar, t.user, t.password),
                t.registrar_hop,
                t.name,
                trunk_credentials(t),
                t.transport.upper(),
            )
            for t in cfg.trunks
            if t.registrar
        ]
        for reg, hop, trunk, credentials, fixed in regs:
            try:
                target = outbound_target(hop)
            except TargetError:
                log.error("sip.register_impossible", registration=reg.name)
                continue
            transport = fixed or target.named_transport
            plan = plan_lookup(
                target.host, target.named_port, target.scheme, transport, self.transports()
            )
            if plan.srv:  # a registrar named without a port: RFC 3263 first
                self.services.spawn(
                    self._locate_and_register(reg, target, trunk, credentials, transport)
                )
            else:
                self._register_at(reg, target, trunk, credentials)

    async def _locate_and_register(
        self,
        reg: SipRegistration,
        target: OutboundTarget,
        trunk: str,
        credentials: DigestCredentials | None,
        transport: str | None,
    ) -> None:
        try:
            located = await self.locate_hop(target, transport)
        except DnsError as e:
            log.error("sip.register_impossible", registration=reg.name, error=str(e))
            return
        self._register_at(reg, target, trunk, credentials, located)

    def _register_at(
        self,
        reg: SipRegistration,
        target: OutboundTarget,
        trunk: str,
        credentials: DigestCredentials | None,
        located: Sequence[Located] = (),
    ) -> None:
        """REGISTER at ``target`` (at the places RFC 3263 found, ``located``: the first,
        then the next ones of its transport in turn, at most ``MAX_NEXT_SERVERS`` more,
        when one fails: ``bridge.sip.registration``)."""
        if located:
            target = dataclasses.replace(target, transport=located[0].transport)
        ua = next((r for r in self.runners if r.kind == target.transport), None)
        if ua is None:
            log.error("sip.register_impossible", registration=reg.name)
            return
        dest = (target.host, target.port)
        if located:
            dest = (located[0].address, located[0].port)
        conn_id = ua.connect(dest, target.host, trunk) if ua.kind != "UDP" else None
        alternates = _next_servers(ua, located, target.host, trunk)
        ua.ua.register(
            dest,
            reg.registrar,
            f"sip:{reg.user}@{target.host}",
            ua.loop.time(),
            credentials=credentials,
            expires_s=reg.expires_s,
            conn_id=conn_id,
            alternates=alternates,
        )
        ua.pump()
        log.info(
            "sip.registering",
            registration=reg.name,
            registrar=reg.registrar,
            transport=target.transport,
            address=dest[0],
            port=dest[1],
        )

    def active_calls(self) -> int:
        return len(self.calls)

    def count_response(self, data: bytes) -> None:
        if data.startswith(b"SIP/2.0 "):
            self.services.metrics.sip_responses_total.labels(
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

    async def wait_hangups(self, until: float) -> int:
        """After ``end_all_calls``: wait, until loop time ``until``, while a call has not
        sent its BYE or a BYE has no answer (its client transaction retransmits it, RFC
        3261 §17.1.2); how many were still unanswered then."""
        loop = asyncio.get_running_loop()
        while True:
            waiting = sum(not c.ended for c in self.calls.values()) + sum(
                r.ua.unanswered_requests("bye") for r in self.runners
            )
            if not waiting or loop.time() >= until:
                return waiting
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            self._release(call)
        for r in self.runners:
            await r.stop()

    # ------------------------------------------------------------ events

    def on_sip_event(self, ua: _UaRunner, event: object) -> None:
        if isinstance(event, CallOffered):
            self.services.spawn(self._offered(ua, event))
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
        elif isinstance(event, OutboundCallProgress):
            self._outbound_progress(event)
        elif isinstance(event, EarlyMediaExpired):
            log.info("sip.early_media_expired", call_id=event.call_id)
            call = self.calls.get(event.call_id)
            if call is not None and call.runner is not None:
                call.runner.early_media_expired()
        elif isinstance(event, RegistrationRetried):
            log.info(
                "sip.registrar_next_server",
                status=event.status,
                address=event.addr[0],
                port=event.addr[1],
            )
        elif isinstance(event, OutboundCallRetried):
            log.info(
                "sip.outbound_next_server",
                call_id=event.call_id,
                status=event.status,
                address=event.addr[0],
                port=event.addr[1],
            )
            pending = self.pending_routes.get(event.call_id)
            if pending is not None:  # the next hop the call's media is compared with
                self.pending_routes[event.call_id] = (*pending[:3], event.addr[0])
        elif isinstance(event, OutboundCallFailed):
            self.pending_routes.pop(event.call_id, None)
            self.offered_keys.pop(event.call_id, None)
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
                    call.rtp.set_remote(
                        event.remote_rtp_addr,
                        now=call.loop.time(),
                        latch_host=event.remote_rtp_addr[0],
                    )
        elif isinstance(event, SrtpKeyChanged):
            call = self.calls.get(event.call_id)
            if call is not None and call.srtp is not None:
                call.srtp.rekey_remote(event.remote)
                log.info("sip.srtp_rekeyed", call_id=event.call_id)
        elif isinstance(event, AuthFailed):
            # one line per failed answer (fail2ban reads these), one more when the
            # source is blocked; later refusals of a blocked source are not logged (the
            # engine counts every one as a refusal, exported in pump())
            log.warning(
                "sip.auth_blocked" if event.blocked else "sip.auth_failed",
                source=event.source,
                transport=event.transport,
                username=event.username,
            )

    async def _offered(self, ua: _UaRunner, event: CallOffered) -> None:
        loop = asyncio.get_running_loop()
        offered_at = loop.time()
        cfg = self.services.call_config()
        route = cfg.route_for(_route_key(event.request_uri))
        reject: tuple[int, str, str] | None = None
        trunk = next((t for t in cfg.trunks if t.name == event.trunk), None)
        codecs = trunk.codecs if trunk is not None else cfg.sip.codecs
        srtp_mode = trunk.srtp if trunk is not None else cfg.sip.security.srtp
        limiter = self._trunk_limiter(trunk) if trunk is not None else None
        audio = negotiate(parse_sdp(event.offer_sdp), codecs) if event.offer_sdp else None
        if route is None:
            reject = (404, "Not Found", "no_route")
        elif audio is None:
            reject = (488, "Not Acceptable Here", "no_codec")
        elif self.active_calls() >= cfg.sip.max_calls:
            reject = (503, "Service Unavailable", "max_calls")
        elif limiter is not None and limiter.admit(loop.time(), outbound=False) is not None:
            reject = (503, "Service Unavailable", "max_calls")  # the trunk's
        elif self.services.ticker.overloaded(cfg.daemon.max_loop_lag_ms / 1000):
            reject = (503, "Service Unavailable", "overloaded")  # protect the calls in progress
            log.warning("sip.overloaded", lag_ms=round(self.services.ticker.lag_s * 1000, 2))
        if reject is not None or route is None or audio is None:
            status, phrase, reason = reject or (500, "Server Internal Error", "error")
            self.services.metrics.rejected_total.labels(reason).inc()
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
            self.services.metrics.rejected_total.labels("no_ports").inc()
            ua.ua.reject(
                event.call_id, 503, "Service Unavailable", loop.time(), (("Retry-After", "5"),)
            )
            ua.pump()
            return
        call = bound[0]
        await call.attach(bound[1])
        # SRTP when offered over TLS and not off (the engine refused every other
        # combination with 488, sdp.srtp_refusal): our own key for the offered suite
        local = remote = None
        if audio.crypto and srtp_mode != "off" and ua.kind == "TLS":
            local = choose_crypto(audio.crypto, secrets.token_bytes)
            remote = next((c for c in audio.crypto if local and c.tag == local.tag), None)
        srtp = _srtp_context(local, remote) if local and remote else None
        call.start_media(audio, event.source[0], _latching(cfg.sip.latching), srtp)
        self.calls[event.call_id] = call
        if trunk is not None and limiter is not None:
            self.call_trunks[event.call_id] = trunk
            limiter.started(event.call_id)
        rtp_host = cfg.sip.external_address or host
        offer = parse_sdp(event.offer_sdp)
        answer = build_answer(
            offer,
            audio,
            rtp_host,
            call.rtp_port,
            int.from_bytes(os.urandom(4), "big") >> 1,
            1,
            crypto=local if srtp else None,
        )
        early = route.early_media != "off"  # 183 with SDP now; 200 or an error decided later
        try:
            if early:
                max_s = route.early_media_max_s
                ua.ua.early_media(event.call_id, answer, loop.time(), max_s=max_s)
                # a caller need not send RTP before the 200: no RTP timeout until then
                call.rtp.set_direction("sendonly", loop.time())
            else:
                ua.ua.answer(event.call_id, answer, loop.time())
        except Exception:  # the caller cancelled while we bound the ports
            log.info("sip.answer_failed", call_id=event.call_id)
            self._release(call)
            return
        ua.pump()
        self.services.metrics.call_setup_seconds.labels("sip").observe(loop.time() - offered_at)
        then: AnswerLeg | RejectLeg | None = None
        if early:
            self.early[event.call_id] = (ua, answer)
            # the route's rule, unless the app answers or rejects first: the bridge decides
            then = (
                RejectLeg(route.early_media_status) if route.early_media == "only" else AnswerLeg()
            )
        self._run_call(call, route, event.from_uri, event.to_uri, early=then)
        if early:
            log.info("sip.early_media", call_id=event.call_id, mode=route.early_media)

    def _early_media_end(self, call: _SipCall, action: AnswerLeg | RejectLeg) -> None:
        """Carry out how the call's bridge ended its early media: ``AnswerLeg`` sends the
        200 with the 183's SDP; ``RejectLeg`` the final error (the runner then finishes,
        which releases the call)."""
        pending = self.early.pop(call.call_id, None)
        if pending is None or call.ended:
            return
        ua, answer = pending
        now = ua.loop.time()
        if isinstance(action, RejectLeg):
            call.ended = True
            phrase = action.reason or _FINAL_PHRASES.get(action.status, "Unavailable")
            with contextlib.suppress(LocalProtocolError):  # cancelled meanwhile
                ua.ua.reject(call.call_id, action.status, phrase, now)
            ua.pump()
            log.info("sip.early_media_ended", call_id=call.call_id, status=action.status)
            return
        try:
            ua.ua.answer(call.call_id, answer, now)
        except LocalProtocolError:  # cancelled or rejected meanwhile
            return
        ua.pump()
        call.rtp.set_direction("sendrecv", now)  # the RTP timeout from now
        log.info("sip.early_media_answered", call_id=call.call_id)

    def _run_call(
        self,
        call: _SipCall,
        route: RouteConfig,
        from_uri: str,
        to_uri: str,
        early: AnswerLeg | RejectLeg | None = None,
    ) -> CallRunner:
        """Start the call's runner; ``early``: the call is in early media, which ``early``
        ends at the first turn's end unless the turn source answers or rejects first."""
        bind_call(call.call_id)
        profile = LegProfile(
            kind="sip",
            codec=call.codec,  # type: ignore[arg-type]
            sample_rate_hz=call.sample_rate_hz,  # G.722: 16 kHz
            heard_from="frames",
        )
        trunk = self.call_trunks.get(call.call_id)
        started = cmd.CallStarted(
            call_id=call.call_id,
            leg="sip",
            from_=from_uri,
            to=to_uri,
            custom_parameters={"trunk": trunk.name} if trunk is not None else {},
        )
        runner = CallRunner(
            self.services,
            call.call_id,
            call,
            profile,
            route,
            started,
            on_finished=lambda r: self._runner_finished(call),
        )
        call.runner = runner
        if early is not None:
            runner.on_early_media = lambda action: self._early_media_end(call, action)
            runner.early_media(early)
        runner.start()
        unbind_call()
        return runner

    # ---------------------------------------------------------- outbound

    def originate(
        self,
        to_uri: str,
        from_uri: str,
        route_key: str,
        located: Sequence[Located] | None = None,
        trunk: str = "",
    ) -> str:
        """Place a call to ``to_uri`` (``sip:`` or ``tel:+E164``); returns its Call-ID
        (answered later). Over UDP, or TCP when the next hop says ``transport=tcp``,
        or TLS for ``sips:`` and ``transport=tls`` (on the peer's one connection);
        through ``[sip] outbound_proxy`` when set; a tel: number goes to the proxy's
        or the first registrar's host. Credentials for a 401/407: the registration
        whose registrar host is the next hop's or the Request-URI's.

        ``located``: where the next hop is (``locate_hop``: RFC 3263, SRV then A/AAAA; the
        API looks it up first, so its caller hears of a name that does not resolve): the
        INVITE goes to the first place, over its transport, and to the next ones in turn
        (at most ``MAX_NEXT_SERVERS`` more) when one answers 503, cannot be connected to,
        or times out before the call rings (RFC 3263 §4.3).
        Without it a host name is resolved (A/AAAA, the URI's or the default port) as the
        INVITE leaves.

        ``trunk`` names a ``[trunks]`` entry (a ``tel:`` target without one takes the only
        trunk): its proxy, transport, credentials, caller ID (``from_uri`` empty), codecs,
        SRTP and limits apply instead of ``[sip]``'s.

        Raises:
            TargetError: the target cannot be called (not a global number, ...);
                ``TrunkError`` for the trunk's name.
            TrunkLimited: the trunk's ``max_calls`` or ``calls_per_second`` refuses it.
            ValueError: no route, no transport of that kind, or no RTP port.
        """
        cfg = self.services.call_config()
        chosen, proxy, target = self._outbound(to_uri, trunk)
        if chosen is not None:
            security, codecs = chosen.security, chosen.codecs
            from_uri = from_uri or _caller_id(chosen, target.host)
        else:
            security, codecs = cfg.sip.security, cfg.sip.codecs
            from_uri = from_uri or "sip:callbridge@localhost"
        if located:  # RFC 3263: the first place found (its transport may be SRV's choice)
            first = located[0]
            target = dataclasses.replace(target, transport=first.transport)
            log.info(
                "sip.next_hop_located",
                host=target.host,
                address=first.address,
                port=first.port,
                transport=first.transport,
                others=len(located) - 1,
            )
        route = cfg.route_for(route_key or _route_key(target.request_uri))
        if route is None:
            raise ValueError("no route matches")
        if security.srtp == "require" and target.transport != "TLS":
            raise TargetError(
                f"{to_uri}: sip.srtp is 'require' and SDES keys travel only over TLS "
                "(call a sips: or ;transport=tls target)"
            )
        limiter = self._trunk_limiter(chosen) if chosen is not None else None
        ua = next((r for r in self.runners if r.kind == target.transport), None)
        if ua is None:
            raise ValueError(
                f"no {target.transport} transport to call out on (sip.listen, sip.tls_listen)"
            )
        dest = (target.host, target.port)
        if located:
            dest = (located[0].address, located[0].port)
        if limiter is not None and (refusal := limiter.admit(ua.loop.time())) is not None:
            raise TrunkLimited(refusal)
        host = ua.ua.settings.local_host
        key = f"out-{os.urandom(6).hex()}"
        bound = self._bind(ua, key, host)
        if bound is None:
            if limiter is not None:
                limiter.give_back()  # nothing was sent: the call did not count
            raise ValueError("no RTP port could be bound")
        call = bound[0]
        self.services.spawn(call.attach(bound[1]))
        keys = _offered_keys(security) if target.transport == "TLS" else ()
        offer = build_offer(
            cfg.sip.external_address or host,
            call.rtp_port,
            1,
            1,
            codecs,
            crypto=keys,
            proto="RTP/SAVP" if keys and security.srtp == "require" else "RTP/AVP",
        )
        credentials = (
            _credentials_for(cfg.sip.registrations, target)
            if chosen is None
            else trunk_credentials(chosen)
        )
        headers = (("Route", f"<{proxy};lr>"),) if target.via_proxy else ()
        trunk_name = chosen.name if chosen is not None else ""
        conn_id = ua.connect(dest, target.host, trunk_name) if target.transport != "UDP" else None
        alternates = _next_servers(ua, located or (), target.host, trunk_name)
        call_id = ua.ua.invite(
            target.request_uri,
            from_uri,
            offer,
            dest,
            call.loop.time(),
            credentials=credentials,
            headers=headers,
            conn_id=conn_id,
            from_display=chosen.caller_name if chosen is not None else "",
            alternates=alternates,
        )
        call.call_id, call.outbound = call_id, True
        self.calls[call_id] = call
        if chosen is not None and limiter is not None:
            self.call_trunks[call_id] = chosen
            limiter.started(call_id)
        self.pending_routes[call_id] = (route, from_uri, to_uri, dest[0])
        if keys:
            self.offered_keys[call_id] = keys
        ua.pump()
        return call_id

    def _outbound(
        self, to_uri: str, trunk: str
    ) -> tuple[TrunkConfig | None, str | None, OutboundTarget]:
        """The trunk a call to ``to_uri`` goes through (None: ``[sip]``'s settings), its
        outbound proxy, and the target (its next hop).

        Raises:
            TargetError: as ``outbound_target``; ``TrunkError`` for the trunk's name.
        """
        cfg = self.services.call_config()
        chosen = choose_trunk(cfg.trunks, trunk, to_uri)
        if chosen is not None:
            proxy: str | None = chosen.next_hop
            return chosen, proxy, outbound_target(to_uri, proxy, proxy)
        registrar = cfg.sip.registrations[0].registrar if cfg.sip.registrations else None
        proxy = cfg.sip.outbound_proxy or None
        return None, proxy, outbound_target(to_uri, proxy, proxy or registrar)

    def outbound_hop(
        self, to_uri: str, trunk: str = ""
    ) -> tuple[OutboundTarget, str | None] | None:
        """The next hop ``originate(to_uri, trunk=trunk)`` sends to, and the transport it
        must use (a trunk's; the URI's ``transport``; None: any, as SRV finds); None
        when the call cannot be placed (``originate`` then says why)."""
        try:
            chosen, _, target = self._outbound(to_uri, trunk)
        except ValueError:
            return None
        if chosen is not None:
            return target, chosen.transport.upper()
        return target, target.named_transport

    def transports(self) -> tuple[str, ...]:
        """The transports this node can send on (``UDP``, ``TCP``, ``TLS``)."""
        return tuple(dict.fromkeys(r.kind for r in self.runners))

    def _current_locator(self) -> SipLocator:
        servers = self.services.config.sip.dns_servers
        if servers != self.dns_servers:  # a reload changed them
            self.dns_servers = servers
            self.locator = SipLocator(make_resolver(servers))
        if self.runners:
            self.locator.family = self.runners[0].dns.family
        return self.locator

    async def locate_hop(self, target: OutboundTarget, transport: str | None) -> list[Located]:
        """Where ``target``'s next hop is, best first (RFC 3263: ``SipLocator``): SRV for a
        host name without a port, then A/AAAA.

        Raises:
            DnsError: nothing found, or no answer in time (naming the host).
        """
        return await self._current_locator().locate(
            target.host, target.named_port, target.scheme, transport, self.transports()
        )

    def pending_calls(self, now: float) -> list[tuple[str, str, str, str, float]]:
        """Outbound calls not answered yet, for the API: (call id, From, To, state, seconds
        since the INVITE); state ``early_media`` once a 183 with SDP came, else ``ringing``."""
        out = []
        for call_id, (_route, from_uri, to_uri, _hop) in self.pending_routes.items():
            call = self.calls.get(call_id)
            if call is not None:
                state = "early_media" if call_id in self.early_out else "ringing"
                out.append((call_id, from_uri, to_uri, state, now - call.created_at))
        return out

    def _outbound_progress(self, event: OutboundCallProgress) -> None:
        """180/183 to our INVITE. A 183 with SDP is the far end's early media (ringback,
        an announcement): its RTP session starts (latching as usual) and is read on the
        call's media clock, comfort noise going the other way, until the answer."""
        early = bool(event.early_sdp)
        log.info(
            "sip.outbound_progress", call_id=event.call_id, status=event.status, early_media=early
        )
        call = self.calls.get(event.call_id)
        pending = self.pending_routes.get(event.call_id)
        if call is None or pending is None or not early or event.call_id in self.early_out:
            return
        try:
            audio = negotiate(parse_sdp(event.early_sdp), self.services.config.sip.codecs)
        except SdpError:
            audio = None
        offered = self.offered_keys.get(event.call_id, ())
        srtp = _answered_srtp(offered, audio) if audio is not None else None
        if audio is None or (srtp is None and (offered or audio.crypto)):
            return  # no codec, or no SRTP key agreed: wait for the answer
        call.start_media(audio, pending[3], _latching(self.services.config.sip.latching), srtp)
        self.early_out.add(event.call_id)
        self.services.ticker.add(
            event.call_id,
            lambda n, now: call.send_frame(None, n, now),
            lambda exc: log.error("sip.early_media_failed", call_id=call.call_id, error=str(exc)),
            ts0=int.from_bytes(os.urandom(4), "big"),
        )

    def _outbound_answered(self, event: OutboundCallAnswered) -> None:
        call = self.calls.get(event.call_id)
        pending = self.pending_routes.pop(event.call_id, None)
        offered = self.offered_keys.pop(event.call_id, ())
        early = event.call_id in self.early_out
        if early:  # the runner's clock takes over
            self.early_out.discard(event.call_id)
            self.services.ticker.remove(event.call_id)
        if call is None or pending is None:
            return
        trunk = self.call_trunks.get(event.call_id)
        sip = self.services.config.sip
        codecs = trunk.codecs if trunk is not None else sip.codecs
        srtp_mode = trunk.srtp if trunk is not None else sip.security.srtp
        audio = negotiate(parse_sdp(event.answer_sdp), codecs)
        if audio is None:
            call.hangup("no_codec")
            self._release(call)
            return
        srtp = _answered_srtp(offered, audio)
        if srtp is None and (srtp_mode == "require" or audio.crypto):
            # required and not answered, or answered with a key for nothing we offered
            log.info("sip.srtp_not_answered", call_id=event.call_id)
            call.hangup("srtp_mismatch")
            self._release(call)
            return
        route, from_uri, to_uri, next_hop = pending
        before = call.audio
        same = before is not None and (before.remote_addr, before.payload_type) == (
            audio.remote_addr,
            audio.payload_type,
        )
        if not (early and same):
            # (the early media's session goes on when the answer repeats its SDP)
            call.start_media(audio, next_hop, _latching(self.services.config.sip.latching), srtp)
        self.services.metrics.call_setup_seconds.labels("sip").observe(
            call.loop.time() - call.created_at
        )
        self._run_call(call, route, from_uri, to_uri)

    def _bind(
        self, ua: _UaRunner, call_id: str, host: str
    ) -> tuple[_SipCall, tuple[socket.socket, socket.socket]] | None:
        for _ in range(MAX_BIND_ATTEMPTS):
            now = ua.loop.time()
            port = self.ports.allocate(call_id, now)
            if port is None:
                log.warning("sip.rtp_ports_exhausted", call_id=call_id)
                return None
            call = _SipCall(self.services, ua, call_id, port)
            try:
                return call, call.bind_sockets(_bind_host(host))
            except OSError as e:
                self.ports.release(call_id)
                if e.errno != errno.EADDRINUSE:
                    # descriptors or buffers exhausted (EMFILE, ENFILE, ENOBUFS...): nothing
                    # wrong with the port, which stays in the queue; this call is refused
                    log.warning(
                        "sip.rtp_bind_failed",
                        call_id=call_id,
                        port=port,
                        error=errno.errorcode.get(e.errno or 0, str(e.errno)),
                    )
                    return None
                # another process has it: tried again after the cool-down
                self.ports.mark_unusable(port, now, self.port_cooldown_s)
        return None

    def can_take_calls(self) -> bool:
        """False while no RTP port could be given to a new call (``/readyz``)."""
        return self.ports.usable_count(asyncio.get_running_loop().time()) > 0

    def _runner_finished(self, call: _SipCall) -> None:
        if not call.ended:
            call.hangup("finished")
        self._release(call)
        call.drop_cycles()

    def refer_target(self, call_id: str, target: str, trunk: str = "") -> str:
        """The Refer-To of a transfer: through the trunk named ``trunk`` (a flow step's or
        the app's ``trunk``) or else the call's own, a ``tel:+E164`` target becomes
        ``sip:+NUMBER@PROXY-HOST;user=phone``, as a call out through the trunk would (the
        carrier places it); anything else as it is."""
        try:
            chosen = (
                choose_trunk(self.services.call_config().trunks, trunk, "")
                if trunk
                else self.call_trunks.get(call_id)
            )
            if chosen is None or not target.lower().startswith("tel:"):
                return target
            return outbound_target(target, chosen.next_hop, chosen.next_hop).request_uri
        except TargetError:  # (TrunkError: the named trunk went with a reload)
            return target

    def _trunk_limiter(self, trunk: TrunkConfig) -> TrunkLimiter:
        """The trunk's limiter (a new one, keeping its calls, when a reload changed them)."""
        limiter = self.trunk_limits.get(trunk.name)
        if limiter is None or (limiter.max_calls, limiter.rate) != (
            trunk.max_calls,
            trunk.calls_per_second,
        ):
            fresh = TrunkLimiter(trunk.name, trunk.max_calls, trunk.calls_per_second)
            fresh.calls = limiter.calls if limiter is not None else set()
            self.trunk_limits[trunk.name] = limiter = fresh
        return limiter

    def _release(self, call: _SipCall) -> None:
        self.early.pop(call.call_id, None)
        if call.call_id in self.early_out:
            self.early_out.discard(call.call_id)
            self.services.ticker.remove(call.call_id)
        trunk = self.call_trunks.pop(call.call_id, None)
        if trunk is not None and trunk.name in self.trunk_limits:
            self.trunk_limits[trunk.name].ended(call.call_id)
        if self.calls.pop(call.call_id, None) is not None:
            lost = call.rtp.reception_stats().lost
            if lost > 0:
                self.services.metrics.rtp_packets_lost_total.inc(lost)
            call.close()
            self.ports.release(call.port_key)


_FINAL_PHRASES = {
    403: "Forbidden",
    404: "Not Found",
    410: "Gone",
    480: "Temporarily Unavailable",
    486: "Busy Here",
    487: "Request Terminated",
    503: "Service Unavailable",
    600: "Busy Everywhere",
    603: "Decline",
    604: "Does Not Exist Anywhere",
}
"""Reason phrases of the final responses an early-media call may end with (``early_media =
"only"``'s ``early_media_status``, the app's ``reject``); another status gets "Unavailable"."""


def _uri_hostport(uri: str) -> tuple[str, int] | None:
    # [0-9], not \d (which takes non-ASCII digits); a port past 65535 raised at sendto
    pattern = r"^sips?:(?:[^@]*@)?(\[[^\]]+\]|[^:;>?]+)(?::([0-9]{1,5}))?(?=$|[;?>])"
    m = re.match(pattern, uri.strip("<>"), re.I)
    if m is None or int(m.group(2) or 5060) > 65535:
        return None
    return m.group(1).strip("[]"), int(m.group(2) or 5060)


class _TrunkContexts(ClientContexts):
    """``[sip]``'s outbound TLS contexts, and each TLS trunk's own (its ``tls_ca_file``,
    or no verification of its proxy with ``tls_verify = false``)."""

    def __init__(self, security: SipSecurity, trunks: tuple[TrunkConfig, ...]) -> None:
        super().__init__(security)
        self.trunks = {t.name: ClientContexts(t.security) for t in trunks if t.transport == "tls"}

    def for_trunk(self, trunk: str, host: str) -> ssl.SSLContext:
        """The context a call through ``trunk`` ("": none) calls ``host`` with; a trunk
        added by a reload has none yet: ``[sip]``'s (verifying against its store)."""
        own = self.trunks.get(trunk)
        return own.for_host(host) if own is not None else self.for_host(host)


def _offered_keys(security: SipSecurity) -> tuple[SdesCrypto, ...]:
    """The keys an outbound call over TLS offers: one per suite, or none (``srtp`` off)."""
    if security.srtp == "off":
        return ()
    return tuple(
        SdesCrypto.generate(tag, secrets.token_bytes, suite)
        for tag, suite in enumerate(SDES_SUITES, start=1)
    )


def srtp_configured(cfg: Config) -> bool:
    """Whether any call may be keyed: ``sip.srtp`` or a trunk's ``srtp`` other than off."""
    return cfg.sip.security.srtp != "off" or any(t.srtp != "off" for t in cfg.trunks)


def load_srtp(cfg: Config) -> None:
    """libsrtp (``bridge.rtp.srtp``: pylibsrtp and its OpenSSL, about 5 MB resident) is
    loaded when SRTP is configured, at start and at a reload that turns it on, never
    on a call's path (an import takes milliseconds the media clock does not have); a
    daemon without SRTP never loads it (``_srtp_context`` cannot be reached there:
    keys are agreed only where ``srtp`` is not off)."""
    if srtp_configured(cfg):
        importlib.import_module("bridge.rtp.srtp")


def _srtp_context(local: SdesCrypto, remote: SdesCrypto) -> SrtpContext:
    from bridge.rtp.srtp import SrtpContext  # loaded by load_srtp: a dict lookup here

    return SrtpContext(local, remote)


def _answered_srtp(offered: tuple[SdesCrypto, ...], audio: NegotiatedAudio) -> SrtpContext | None:
    """The SRTP keys of an answered outbound call: the answer's key for one we offered
    (same tag and suite), or None (not offered, or not answered)."""
    for theirs in audio.crypto:
        for ours in offered:
            if (ours.tag, ours.suite) == (theirs.tag, theirs.suite):
                return _srtp_context(ours, theirs)
    return None


def _caller_id(trunk: TrunkConfig, host: str) -> str:
    """The From URI a trunk presents: its ``caller_id`` (or ``callbridge``) at its host."""
    return f"sip:{trunk.caller_id or 'callbridge'}@{host}"


def _latching(mode: str) -> LatchingMode:
    return "learn" if mode == "learn" else "strict"


def _next_servers(ua: _UaRunner, located: Sequence[Located], host: str, trunk: str) -> list[Peer]:
    """The places after the first that RFC 3263 found (``located``), of ``ua``'s
    transport, at most ``MAX_NEXT_SERVERS``: where a request goes next when one fails (a
    stream transport's connection reserved for each, opened only if it is used)."""
    return [
        Peer(
            (place.address, place.port),
            ua.reserve((place.address, place.port), host, trunk) if ua.kind != "UDP" else None,
        )
        for place in located[1 : 1 + MAX_NEXT_SERVERS]
        if place.transport == ua.kind
    ]


def _credentials_for(
    registrations: tuple[SipRegistration, ...], target: OutboundTarget
) -> DigestCredentials | None:
    """The credentials of the registration at the next hop's or the Request-URI's host."""
    hosts = {target.host.lower()}
    with contextlib.suppress(SipParseError):
        hosts.add(parse_uri(target.request_uri).host.lower())
    for reg in registrations:
        with contextlib.suppress(SipParseError):
            if parse_uri(reg.registrar).host.lower() in hosts:
                return DigestCredentials(reg.user, reg.password)
    return None


def _bind_host(host: str) -> str:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    return "0.0.0.0"

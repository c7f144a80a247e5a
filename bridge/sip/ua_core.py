"""Transport and transaction plumbing under the SIP user agent (RFC 3261 §17, §18).

Theory of operation
-------------------
:class:`UaCore` is the lower half of :class:`bridge.sip.ua.SipUserAgent`. It
owns the transport side of one listening socket:

1. Input: ``receive_datagram(data, source, now)`` or
   ``receive_stream(conn_id, data, source, now)`` (cut into messages by a
   :class:`SipStreamFramer` per connection).
2. Requests from sources outside the allowlist are dropped. Parse errors are
   answered statelessly (``400 <reason>``, ``505``, ``513``) when the request
   is answerable, else dropped (reliability.md §1.7); error answers are
   rate-limited per source so we are no reflector.
3. The top Via gets ``received``/``rport`` (RFC 3581); responses go to the
   source address when ``rport`` is present, else to the source IP and the
   sent-by port (§18.2.2).
4. Requests are matched to server transactions (§17.2.3; RFC 2543 matching
   when the branch lacks the magic cookie): retransmissions and ACKs for
   non-2xx are absorbed there. New requests create a server transaction and
   go up to ``_on_request``; ACKs that match none go to ``_on_ack``.
   Floods of non-INVITE requests are bounded (``_may_linger``): a non-INVITE
   transaction whose final answer has no side effect to repeat (any OPTIONS,
   and every other non-INVITE answered >= 300: 481, 405, 501...) waits out
   Timer J only while its source has fewer than
   ``MAX_LINGERING_PER_SOURCE`` such transactions and all sources fewer
   than ``MAX_LINGERING``; beyond that it is released as soon as it is
   answered, so the answer was in effect stateless (RFC 3261 §8.2.7) and a
   retransmission of it is answered afresh by the TU. Transactions with
   effects (a 2xx to BYE, INFO, NOTIFY, UPDATE, CANCEL) and INVITEs always
   keep their state, so their retransmissions stay absorbed.
5. Responses are matched to client transactions by (branch, CSeq method) and
   go up through ``_on_client_response`` / ``_on_client_timeout``.
6. Timers: one heap of ``(deadline, seq, holder)`` for every transaction
   and every call (the TU's timer holders), so ``next_deadline()`` and
   ``handle_timer(now)`` cost O(log n) however many transactions linger in
   their 32 s wait states (Timers L and J keep every INVITE and BYE
   transaction of the last 32 s alive: 12 800 of them at 200 calls/s).
   The heap is lazy: a holder's ``timer_at`` is the time of its earliest
   entry, an entry whose time is not its holder's ``timer_at`` (superseded)
   or whose holder is gone is skipped, and an entry whose holder's real
   deadline moved later is pushed again at that time. A holder is
   re-scheduled after everything that can arm an earlier timer: every
   transaction pump, and the TU's ``_schedule(call)`` calls. The few
   registrations stay outside the heap (``_tu_deadlines``).
7. Keep-alive (RFC 5626 §4.4.1): on each stream connection the shell opened
   itself (``flow_opened``: to a peer, trunk, registrar or a caller's Contact;
   never a connection a peer opened to us, nor UDP) a double-CRLF ping goes out every
   ``settings.keepalive_s`` times a jitter factor drawn in
   ``KEEPALIVE_JITTER`` from the injected RNG, each interval drawn afresh.
   A single-CRLF pong must come within ``PONG_TIMEOUT_S``; if none does the
   flow has failed: ``CloseStream(conn_id, flow_failed=True)``, and the shell
   drops the connection and reports it lost (``connection_failed``), so
   registrations on it register again and the next request opens it anew.
   A ping from the peer on any stream connection is answered with a pong
   (one per read: two pongs back to back would read as a ping). The few
   flows' deadlines stay outside the heap; their earliest is cached.

Nothing here reads a clock or touches a socket: everything leaves as
``SendDatagram`` / ``SendStream`` / ``CloseStream`` actions.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from bridge.engine import Outbox, SendDatagram
from bridge.sip.dialog import Peer
from bridge.sip.digest import DigestCredentials
from bridge.sip.errors import SipParseError
from bridge.sip.events import CloseStream, SendStream
from bridge.sip.framer import SipStreamFramer
from bridge.sip.guard import InviteRateLimiter, SourceAllowlist, TrustedProxies
from bridge.sip.message import (
    SipMessage,
    SipRequest,
    SipResponse,
    build_response,
    can_answer,
    parse_message,
)
from bridge.sip.settings import SipSettings
from bridge.sip.transaction import (
    ClientTransaction,
    ResponseReceived,
    ServerTransaction,
    State,
    TransactionTerminated,
    TransactionTimedOut,
    TransmitMessage,
)

__all__ = ["ClientEntry", "ServerEntry", "UaCore"]

logger = logging.getLogger(__name__)

MAGIC_COOKIE = "z9hG4bK"
PING = b"\r\n\r\n"
"""RFC 5626 §4.4.1 keep-alive ping: a double CRLF."""
PONG = b"\r\n"
"""Its answer: a single CRLF."""
PONG_TIMEOUT_S = 10.0
"""RFC 5626 §4.4.1: no pong this long after a ping and the flow has failed."""
KEEPALIVE_JITTER = (0.8, 1.0)
"""Each ping interval is ``keepalive_s`` times a factor drawn in this range (RFC 5626
§4.4.1: between 80 and 100 % of the recommended 95-120 s)."""
ERROR_RESPONSES_PER_S = 20.0
"""Stateless error answers allowed per source per second (burst of the same size)."""
MAX_LINGERING_PER_SOURCE = 32
"""Answered side-effect-free non-INVITE transactions kept for Timer J per source host."""
MAX_LINGERING = 4096
"""The same, over all sources (about 16 MiB at ~4 KiB a transaction)."""


@dataclass(slots=True)
class _Flow:
    """Keep-alive state of one stream connection we opened (rule 7)."""

    ping_at: float | None
    """When the next ping goes out (None: none planned)."""
    pong_due: float | None = None
    """A ping is waiting for its pong until then."""


class TimerHolder(Protocol):
    """Anything with timers in the user agent's heap (transaction entries, calls)."""

    timer_at: float | None
    """Time of the holder's earliest entry in the heap (None: not in it)."""


@dataclass(slots=True)
class ServerEntry:
    tx: ServerTransaction
    peer: Peer
    key: tuple[str, ...]
    timer_at: float | None = None
    linger: bool | None = None
    """Whether it may wait out Timer J once answered (None: not decided yet)."""
    charged: str | None = None
    """The source host its lingering counts against (``UaCore._lingering``)."""


@dataclass(slots=True)
class ClientEntry:
    tx: ClientTransaction
    peer: Peer
    kind: str
    """What the TU sent it for: invite, reinvite, bye, cancel, register, refer, info, update."""
    ref: str
    """The call id or registration id it belongs to."""
    key: tuple[str, str] = ("", "")
    """(top Via branch, method): the key in ``UaCore._client_txs``."""
    timer_at: float | None = None
    credentials: DigestCredentials | None = None
    """An INVITE's: its call's credentials, for the BYE of a 2xx that comes after the
    call is gone (``SipUserAgent._ack_and_bye_stray``)."""


def server_key(request: SipRequest) -> tuple[str, ...]:
    """RFC 3261 §17.2.3 matching key (RFC 2543 fallback without the cookie)."""
    via = request.top_via()
    method = "INVITE" if request.method == "ACK" else request.method
    branch = via.branch or ""
    sent_by = f"{via.host}:{via.port or 5060}"
    if branch.startswith(MAGIC_COOKIE):
        return (branch, sent_by, method)
    from_tag = request.from_().tag or ""
    return ("2543", request.call_id, from_tag, str(request.cseq().number), method, sent_by)


class UaCore(Outbox):
    """Transport side of the user agent; see the module docstring."""

    def __init__(self, settings: SipSettings, rng: random.Random | None = None) -> None:
        super().__init__()
        self.settings = settings
        self._rng = rng or random.SystemRandom()
        self._reliable = settings.transport.upper() != "UDP"
        self._server_txs: dict[tuple[str, ...], ServerEntry] = {}
        self._client_txs: dict[tuple[str, str], ClientEntry] = {}
        self._framers: dict[int, SipStreamFramer] = {}
        self._flows: dict[int, _Flow] = {}
        """Stream connections we opened, by conn_id: their keep-alive (rule 7)."""
        self._flows_next: float | None = None
        """The earliest deadline in ``_flows`` (kept up to date as they change)."""
        self._lingering: Counter[str] = Counter()
        """Side-effect-free answered non-INVITE transactions kept, by source host."""
        self._lingering_total = 0
        self.released_early = 0
        """Answered non-INVITE transactions released before Timer J (flood bound)."""
        self._allowlist = SourceAllowlist(settings.allowed_sources)
        self._trusted = TrustedProxies(settings.trusted_proxies)
        self._error_limiter = InviteRateLimiter(ERROR_RESPONSES_PER_S, int(ERROR_RESPONSES_PER_S))
        self._timer_heap: list[tuple[float, int, TimerHolder]] = []
        self._timer_seq = itertools.count()
        self.dropped_messages = 0
        """Messages dropped (unparseable, unanswerable, not allowed, unmatched)."""
        self.refusals: Counter[str] = Counter()
        """Requests refused, by reason (``guard.REFUSAL_REASONS``); see ``take_refusals``."""

    def take_refusals(self) -> dict[str, int]:
        """The refusals counted since the last call, by reason (for the metrics)."""
        taken = dict(self.refusals)
        self.refusals.clear()
        return taken

    # --- identifiers -----------------------------------------------------------
    def _token(self, bits: int = 64) -> str:
        return f"{self._rng.getrandbits(bits):x}"

    def _via(self) -> str:
        s = self.settings
        host = f"[{s.local_host}]" if ":" in s.local_host else s.local_host
        branch = f"{MAGIC_COOKIE}{self._token()}"
        return f"SIP/2.0/{s.transport.upper()} {host}:{s.local_port};branch={branch};rport"

    def _contact(self, user: str = "callbridge", secure: bool = False) -> str:
        """Our Contact; ``secure``: the dialog's Request-URI was ``sips:`` (RFC 3261
        §12.1.1: then Contact must be one too). Otherwise over TLS a ``sip:`` URI with
        ``;transport=tls``, which RFC 5630 deprecates but every peer routes (baresip 1.0
        ends a call whose Contact is ``sips:`` when it dialled ``sip:``: ENOSYS)."""
        s = self.settings
        kind = s.transport.upper()
        name = s.contact_host or s.local_host
        host = f"[{name}]" if ":" in name else name
        if kind == "TLS" and secure:
            return f"<sips:{user}@{host}:{s.local_port}>"
        transport = "" if kind == "UDP" else f";transport={kind.lower()}"
        return f"<sip:{user}@{host}:{s.local_port}{transport}>"

    # --- input -------------------------------------------------------------------
    def receive_datagram(self, data: bytes, source: tuple[str, int], now: float) -> None:
        """Feed one UDP datagram. Drain actions and events afterwards."""
        self._receive_message(data, Peer(source), now)

    def receive_stream(
        self, conn_id: int, data: bytes, source: tuple[str, int], now: float
    ) -> None:
        """Feed bytes read from stream connection ``conn_id`` (any chunk size)."""
        framer = self._framers.setdefault(conn_id, SipStreamFramer())
        try:
            messages = framer.feed(data)
        except SipParseError:
            self.dropped_messages += 1
            del self._framers[conn_id]
            self._forget_flow(conn_id)
            self._actions.append(CloseStream(conn_id))
            return
        pings, pongs = framer.take_keepalives()
        if pings:
            self._actions.append(SendStream(conn_id, PONG))
        if pongs:
            flow = self._flows.get(conn_id)
            if flow is not None and flow.pong_due is not None:
                flow.pong_due = None
                self._update_flows_next()
        for message in messages:
            self._receive_message(message, Peer(source, conn_id), now)

    def connection_lost(self, conn_id: int) -> None:
        self._framers.pop(conn_id, None)
        self._forget_flow(conn_id)

    # --- keep-alive (rule 7) -----------------------------------------------------------
    def flow_opened(self, conn_id: int, now: float) -> None:
        """The shell opened stream connection ``conn_id`` itself (to a peer, a trunk, a
        registrar; again after it dropped): keep it alive with CRLF pings. Not for a
        connection a peer opened to us, nor on UDP."""
        if not self._reliable:
            return
        self._flows[conn_id] = _Flow(self._next_ping(now))
        self._update_flows_next()

    def _next_ping(self, now: float) -> float | None:
        interval = self.settings.keepalive_s
        if interval <= 0:
            return None
        return now + interval * self._rng.uniform(*KEEPALIVE_JITTER)

    def _forget_flow(self, conn_id: int) -> None:
        if self._flows.pop(conn_id, None) is not None:
            self._update_flows_next()

    def _update_flows_next(self) -> None:
        # while a ping waits for its pong, its pong deadline is the flow's only one
        deadlines = [
            at
            for f in self._flows.values()
            if (at := f.ping_at if f.pong_due is None else f.pong_due) is not None
        ]
        self._flows_next = min(deadlines, default=None)

    def _keepalive_timers(self, now: float) -> None:
        """Send the pings due; a ping whose pong is overdue fails its flow."""
        if self._flows_next is None or self._flows_next > now:
            return
        for conn_id, flow in list(self._flows.items()):
            if flow.pong_due is not None:
                if flow.pong_due <= now:  # no pong: the flow has failed
                    del self._flows[conn_id]
                    self._framers.pop(conn_id, None)
                    self._actions.append(CloseStream(conn_id, flow_failed=True))
                continue  # no new ping while one waits for its pong
            if flow.ping_at is not None and flow.ping_at <= now:
                self._actions.append(SendStream(conn_id, PING))
                flow.ping_at = self._next_ping(now)
                flow.pong_due = now + PONG_TIMEOUT_S
                framer = self._framers.setdefault(conn_id, SipStreamFramer())
                framer.expect_pong()
        self._update_flows_next()

    def allows_source(self, host: str) -> bool:
        """Whether ``host`` may connect: inside the allowlist, or a trusted proxy (a
        stream transport asks at accept)."""
        return self._allowlist.allows(host) or self._trusted.trusts(host)

    def unanswered_requests(self, kind: str) -> int:
        """Client transactions of ``kind`` (``bye``...) with no final response yet (their
        transactions retransmit them until one comes or they time out)."""
        return sum(
            1
            for e in self._client_txs.values()
            if e.kind == kind and e.tx.state in (State.CALLING, State.TRYING, State.PROCEEDING)
        )

    def stream_partial_bytes(self, conn_id: int) -> int:
        """Bytes of a message not complete yet on stream connection ``conn_id``."""
        framer = self._framers.get(conn_id)
        return 0 if framer is None else framer.buffered_bytes

    def _receive_message(self, data: bytes, peer: Peer, now: float) -> None:
        try:
            message = parse_message(data)
        except SipParseError as exc:
            self._on_parse_error(exc, peer, now)
            return
        if isinstance(message, SipResponse):
            self._receive_response(message, now)
        elif not self._allowlist.allows(peer.addr[0]) and not self._trusted.trusts(peer.addr[0]):
            self.dropped_messages += 1
            self.refusals["not_allowed"] += 1
        else:
            self._receive_request(message, peer, now)

    def _on_parse_error(self, exc: SipParseError, peer: Peer, now: float) -> None:
        partial = exc.partial
        if (
            not isinstance(partial, SipRequest)
            or not can_answer(partial)
            or not (self._allowlist.allows(peer.addr[0]) or self._trusted.trusts(peer.addr[0]))
            or not self._error_limiter.allow(peer.addr[0], now)
        ):
            self.dropped_messages += 1
            return
        reason = "".join(ch for ch in exc.reason if " " <= ch < "\x7f")[:120]
        try:
            self._stamp_via(partial, peer)  # reads every Via: a later one may be malformed too
            response = build_response(partial, exc.status, reason or "Bad Request")
            reply_to = self._response_peer(partial, peer)
        except SipParseError:
            self.dropped_messages += 1
            return
        self._send(response, reply_to)

    def _stamp_via(self, request: SipRequest, peer: Peer) -> None:
        """Add ``received`` and fill ``rport`` in the top Via (RFC 3261 §18.2.1, RFC 3581)."""
        via = request.top_via()
        stamped = via
        if via.host != peer.addr[0]:
            stamped = stamped.with_param("received", peer.addr[0])
        if via.rport is not None:
            stamped = stamped.with_param("received", peer.addr[0])
            stamped = stamped.with_param("rport", str(peer.addr[1]))
        if stamped is not via:
            values = request.get_all("via")
            request.remove("via")
            request.add("Via", str(stamped))
            for value in values[1:]:
                request.add("Via", value)

    def _response_peer(self, request: SipRequest, peer: Peer) -> Peer:
        if peer.conn_id is not None:
            return peer
        via = request.top_via()
        if via.rport is not None:
            return peer
        return Peer((peer.addr[0], via.port or 5060))

    def _receive_request(self, request: SipRequest, peer: Peer, now: float) -> None:
        self._stamp_via(request, peer)
        reply_to = self._response_peer(request, peer)
        if request.top_via().branch == MAGIC_COOKIE:
            if request.method != "ACK":
                self._send(build_response(request, 400, "Bad Branch"), reply_to)
            return
        key = server_key(request)
        entry = self._server_txs.get(key)
        if entry is not None:
            if entry.tx.receive_request(request, now):
                self._on_ack(request, peer, now)
            self._pump_server(entry)
            return
        if request.method == "ACK":
            self._on_ack(request, peer, now)
            return
        tx = ServerTransaction(request, self.settings.timers, self._reliable)
        entry = ServerEntry(tx, reply_to, key)
        self._server_txs[entry.key] = entry
        try:
            self._on_request(request, entry, peer, now)
        except SipParseError:
            # a header a handler parses lazily (Require, Event, ...) was malformed:
            # answer 400 rather than let it escape and leave the transaction open
            self.dropped_messages += 1
            if tx.state in (State.TRYING, State.PROCEEDING):
                self._respond(entry, 400, "Bad Request", now)
        self._pump_server(entry)

    def _receive_response(self, response: SipResponse, now: float) -> None:
        branch = response.top_via().branch or ""
        entry = self._client_txs.get((branch, response.cseq().method))
        if entry is None:
            self.dropped_messages += 1
            return
        entry.tx.receive_response(response, now)
        self._pump_client(entry, now)

    # --- responding and sending ------------------------------------------------------
    def _respond(
        self,
        entry: ServerEntry,
        status: int,
        reason: str,
        now: float,
        *,
        to_tag: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
    ) -> SipResponse:
        response = build_response(entry.tx.request, status, reason, to_tag)
        for name, value in headers:
            response.add(name, value)
        if self.settings.user_agent:
            response.add("Server", self.settings.user_agent)
        response.body = body
        entry.tx.respond(response, now)
        self._pump_server(entry)
        return response

    def _send(self, message: SipMessage, peer: Peer) -> None:
        assert isinstance(message, SipRequest | SipResponse)
        data = message.to_bytes()
        if peer.conn_id is None:
            self._actions.append(SendDatagram(data, peer.addr))
        else:
            self._actions.append(SendStream(peer.conn_id, data, peer.reopen_to))

    def _start_client(
        self,
        request: SipRequest,
        peer: Peer,
        kind: str,
        ref: str,
        now: float,
        *,
        add_via: bool = True,
    ) -> ClientEntry:
        """Put a fresh top Via on ``request`` (unless it is a CANCEL that reuses
        the INVITE's) and run it in a client transaction."""
        if add_via:
            request.headers.insert(0, ("via", "Via", self._via()))
        if self.settings.user_agent:
            request.add("User-Agent", self.settings.user_agent)
        tx = ClientTransaction(request, self.settings.timers, self._reliable)
        branch = request.top_via().branch or ""
        entry = ClientEntry(tx, peer, kind, ref, (branch, request.method))
        self._client_txs[entry.key] = entry
        tx.start(now)
        self._pump_client(entry, now)
        return entry

    def _pump_server(self, entry: ServerEntry) -> None:
        for action in entry.tx.actions_to_send():
            if isinstance(action, TransmitMessage):
                self._send(action.message, entry.peer)
        for event in entry.tx.events_received():
            if isinstance(event, TransactionTimedOut):
                self._on_server_timeout(entry)
            if isinstance(event, TransactionTerminated):
                self._release_server(entry)
        if self._server_txs.get(entry.key) is not entry:
            return
        if entry.linger is None and entry.tx.state is State.COMPLETED and not entry.tx.is_invite:
            entry.linger = self._may_linger(entry)
            if not entry.linger:
                self.released_early += 1
                self._release_server(entry)
                return
        self._schedule(entry)

    def _may_linger(self, entry: ServerEntry) -> bool:
        """Whether an answered non-INVITE transaction may wait out Timer J (the
        flood bound of the module docstring); charges its source when it may."""
        response = entry.tx.last_response
        harmless = entry.tx.request.method == "OPTIONS" or (
            response is not None and response.status >= 300
        )
        if not harmless:
            return True
        host = entry.peer.addr[0]
        if (
            self._lingering[host] >= MAX_LINGERING_PER_SOURCE
            or self._lingering_total >= MAX_LINGERING
        ):
            return False
        self._lingering[host] += 1
        self._lingering_total += 1
        entry.charged = host
        return True

    def _release_server(self, entry: ServerEntry) -> None:
        """Forget server transaction ``entry`` (and its charge against its source)."""
        if self._server_txs.get(entry.key) is entry:
            del self._server_txs[entry.key]
        host = entry.charged
        if host is not None:
            entry.charged = None
            self._lingering_total -= 1
            self._lingering[host] -= 1
            if self._lingering[host] <= 0:
                del self._lingering[host]

    def _pump_client(self, entry: ClientEntry, now: float) -> None:
        for action in entry.tx.actions_to_send():
            if isinstance(action, TransmitMessage):
                self._send(action.message, entry.peer)
        for event in entry.tx.events_received():
            if isinstance(event, ResponseReceived):
                self._on_client_response(entry, event.response, now)
            elif isinstance(event, TransactionTimedOut):
                self._on_client_timeout(entry, now)
            elif isinstance(event, TransactionTerminated):
                self._client_txs.pop(entry.key, None)
        if self._client_txs.get(entry.key) is entry:
            self._schedule(entry)

    # --- timers ------------------------------------------------------------------------
    def _schedule(self, holder: TimerHolder) -> None:
        """Make sure the heap has an entry no later than ``holder``'s deadline."""
        deadline = self._deadline_of(holder)
        if deadline is None or (holder.timer_at is not None and holder.timer_at <= deadline):
            return
        holder.timer_at = deadline
        heap = self._timer_heap
        heapq.heappush(heap, (deadline, next(self._timer_seq), holder))
        if len(heap) > 2 * self._holder_count() + 64:
            # superseded entries pile up when deadlines keep moving earlier: drop them
            heap[:] = [e for e in heap if e[2].timer_at == e[0] and self._is_live(e[2])]
            heapq.heapify(heap)

    def _deadline_of(self, holder: TimerHolder) -> float | None:
        if isinstance(holder, ServerEntry | ClientEntry):
            return holder.tx.next_deadline()
        return self._tu_deadline_of(holder)

    def _is_live(self, holder: TimerHolder) -> bool:
        if isinstance(holder, ServerEntry):
            return self._server_txs.get(holder.key) is holder
        if isinstance(holder, ClientEntry):
            return self._client_txs.get(holder.key) is holder
        return self._tu_is_live(holder)

    def _holder_count(self) -> int:
        return len(self._server_txs) + len(self._client_txs) + self._tu_holder_count()

    def _heap_top(self) -> float | None:
        """The earliest real deadline in the heap, dropping stale entries on the way."""
        heap = self._timer_heap
        while heap:
            at, _, holder = heap[0]
            if holder.timer_at != at or not self._is_live(holder):
                heapq.heappop(heap)
                continue
            deadline = self._deadline_of(holder)
            if deadline is not None and deadline <= at:
                return at
            heapq.heappop(heap)  # the holder's timers moved later (or stopped)
            holder.timer_at = None
            self._schedule(holder)
        return None

    def next_deadline(self) -> float | None:
        deadline = self._heap_top()
        flows = self._flows_next
        if flows is not None and (deadline is None or flows < deadline):
            deadline = flows
        for tu in self._tu_deadlines():
            if deadline is None or tu < deadline:
                deadline = tu
        return deadline

    def handle_timer(self, now: float) -> None:
        """Fire everything due at ``now``, earliest first; then drain actions and events."""
        heap = self._timer_heap
        while (at := self._heap_top()) is not None and at <= now:
            holder = heapq.heappop(heap)[2]
            holder.timer_at = None
            if isinstance(holder, ServerEntry):
                holder.tx.handle_timer(now)
                self._pump_server(holder)
            elif isinstance(holder, ClientEntry):
                holder.tx.handle_timer(now)
                self._pump_client(holder, now)
            else:
                self._tu_fire(holder, now)
                if self._is_live(holder):
                    self._schedule(holder)
        self._keepalive_timers(now)
        self._tu_handle_timer(now)

    # --- hooks for the transaction user (implemented by SipUserAgent) ---------------------
    def _on_request(self, request: SipRequest, entry: ServerEntry, peer: Peer, now: float) -> None:
        raise NotImplementedError

    def _on_ack(self, request: SipRequest, peer: Peer, now: float) -> None:
        raise NotImplementedError

    def _on_server_timeout(self, entry: ServerEntry) -> None:
        raise NotImplementedError

    def _on_client_response(self, entry: ClientEntry, response: SipResponse, now: float) -> None:
        raise NotImplementedError

    def _on_client_timeout(self, entry: ClientEntry, now: float) -> None:
        raise NotImplementedError

    def _tu_deadlines(self) -> list[float]:
        """Deadlines kept outside the heap (a handful: registrations)."""
        raise NotImplementedError

    def _tu_handle_timer(self, now: float) -> None:
        """Fire the timers outside the heap that are due."""
        raise NotImplementedError

    def _tu_deadline_of(self, holder: TimerHolder) -> float | None:
        """Deadline of a TU holder (a call) in the heap."""
        raise NotImplementedError

    def _tu_is_live(self, holder: TimerHolder) -> bool:
        raise NotImplementedError

    def _tu_holder_count(self) -> int:
        raise NotImplementedError

    def _tu_fire(self, holder: TimerHolder, now: float) -> None:
        """Fire the due timers of a TU holder; it is re-scheduled afterwards."""
        raise NotImplementedError

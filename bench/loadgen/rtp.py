"""Many SIP/RTP calls from one process: the UAC, the inbound RTP sender and the receiver.

One ``SipUserAgent`` (our own engine) over a UDP socket places every call at
the daemon. Each call has its own RTP socket (named in our SDP offer); the
daemon's packets land there and are timestamped by the *kernel* on arrival
(``SO_TIMESTAMPNS``), so how busy this process is does not change what it
measures. Every 20 ms each call also sends one inbound PCMU packet (low-level
noise below the barge-in energy floor, so the VAD runs on every frame but
never interrupts the turn). Calls are spread over 20 one-millisecond phases.

The RTP sockets are not in the ``epoll`` set: each call's socket is read
right after its own packet is sent, once every 20 ms (``_send_slot``).
A socket something waits on costs its *sender* a wake-up per datagram: on
loopback the daemon's ``sendto`` runs the receive path to the end and
wakes this process, about 5 % of the daemon's core at 500 calls (perf,
docs/benchmarks.md), a cost a receiver on another host never puts on the
daemon. The kernel stamps arrivals, so a packet read later is timed the same.

The same object is also a minimal UAS (``accept_incoming = True``): a call
offered to its SIP port (e.g. by baresip) is answered at once with SDP that
names a fresh RTP socket, and that call's packets are measured the same way
(``bench/bench_pacing.py`` uses this for the baresip baseline).

With ``tls`` (an ``ssl.SSLContext``) the calls' SIP goes over one TLS
connection to the daemon's TLS listener (``sips:`` URIs, in the same ``epoll``
loop); with ``srtp`` too, each call offers an SDES key (``RTP/SAVP``) and its
media both ways is SRTP through ``bridge.rtp.srtp.SrtpContext``: what the
daemon sends is unprotected (verified) before it is recorded, and a packet that
fails counts as a stray. SDES keys are refused by the daemon over UDP and TCP.

Everything runs in one ``epoll`` loop with no asyncio: timing is
``time.monotonic()``; kernel timestamps (CLOCK_REALTIME) are moved onto
CLOCK_MONOTONIC with an offset measured at start-up.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import select
import socket
import ssl
import struct
import time
from array import array
from dataclasses import dataclass, field

from bridge.engine import SendDatagram
from bridge.rtp.srtp import SdesCrypto, SrtpContext
from bridge.sip.events import (
    CallEnded,
    CallOffered,
    OutboundCallAnswered,
    OutboundCallFailed,
    SendStream,
)
from bridge.sip.sdp import build_answer, build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent
from telcodec import g711

SO_TIMESTAMPNS = 35  # Linux; SCM_TIMESTAMPNS has the same value
_HDR = struct.Struct("!BBHII")
_TS = struct.Struct("qq")


def realtime_to_monotonic_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few paired reads."""
    best: tuple[int, int] | None = None
    for _ in range(50):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, r - (m0 + m1) // 2)
    assert best is not None
    return best[1]


def noise_payload(level: float = 60.0, seed: int = 1) -> bytes:
    """160 mu-law bytes of quiet noise (about -55 dBFS: VAD work, no barge-in)."""
    rng = random.Random(seed)
    pcm = struct.pack("<160h", *(int(rng.gauss(0, level)) for _ in range(160)))
    return g711.ulaw_encode(pcm)


@dataclass
class RtpCall:
    """One call: its SIP call id, RTP socket and what arrived on it."""

    index: int
    sock: socket.socket
    port: int
    call_id: str = ""
    remote: tuple[str, int] | None = None
    answered_at: float | None = None
    ended: bool = False
    seq: int = field(default_factory=lambda: random.getrandbits(16))
    ts: int = field(default_factory=lambda: random.getrandbits(32))
    ssrc: int = field(default_factory=lambda: random.getrandbits(32))
    arrival_ns: array[int] = field(default_factory=lambda: array("q"))
    rtp_ts: array[int] = field(default_factory=lambda: array("Q"))
    marker: array[int] = field(default_factory=lambda: array("B"))
    strays: int = 0
    """PCMU packets from another source than the daemon's answer named, or SRTP packets
    that failed to verify (not recorded)."""
    key: SdesCrypto | None = None
    """Our SDES key (``srtp``), offered with the INVITE."""
    srtp: SrtpContext | None = None
    """Set when the daemon answered with its key: media both ways is SRTP."""


class RtpLoad:
    """Places ``n`` calls at the daemon's SIP port and runs their media."""

    STREAM_ID = 1
    """The engine's conn_id of the TLS connection (``tls``): the only one."""

    def __init__(
        self,
        daemon_sip: tuple[str, int],
        route: str = "talk",
        *,
        tls: ssl.SSLContext | None = None,
        srtp: bool = False,
    ) -> None:
        """``daemon_sip``: the daemon's UDP SIP address, or its TLS listener's with ``tls``;
        ``srtp`` (needs ``tls``): offer SDES keys, and run every answered call's media as SRTP."""
        if srtp and tls is None:
            raise ValueError("SRTP needs tls: the daemon takes SDES keys over TLS only")
        self.daemon = daemon_sip
        self.route = route
        self.srtp = srtp
        self.stream: ssl.SSLSocket | None = None
        self.sip: socket.socket
        if tls is not None:
            raw = socket.create_connection(daemon_sip, timeout=10)
            self.stream = tls.wrap_socket(raw, server_hostname=daemon_sip[0])
            self.stream.setblocking(False)
            self.sip = self.stream
            transport = "TLS"
        else:
            self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sip.bind(("127.0.0.1", 0))
            self.sip.setblocking(False)
            transport = "UDP"
        port = self.sip.getsockname()[1]
        self.ua = SipUserAgent(
            SipSettings(local_host="127.0.0.1", local_port=port, transport=transport)
        )
        self.ep = select.epoll()
        self.ep.register(self.sip.fileno(), select.EPOLLIN)
        self.calls: list[RtpCall] = []
        self.by_call_id: dict[str, RtpCall] = {}
        self.failed = 0
        self._recording = False
        self.accept_incoming = False
        self.payload = noise_payload()
        self.offset_ns = realtime_to_monotonic_offset_ns()
        self._ua_deadline: float | None = None
        self._origin = time.monotonic()
        self._slot = 0

    @property
    def recording(self) -> bool:
        """Whether arrivals are kept; turning it off first reads what arrived until now."""
        return self._recording

    @recording.setter
    def recording(self, on: bool) -> None:
        if self._recording and not on:
            for call in self.calls:  # up to a slot's worth not read yet
                self._read_rtp(call)
        self._recording = on

    # ------------------------------------------------------------ SIP

    def _flush(self) -> None:
        for action in self.ua.actions_to_send():
            if isinstance(action, SendDatagram):
                self.sip.sendto(action.data, action.addr)
            elif isinstance(action, SendStream) and self.stream is not None:
                self._stream_send(action.data)

    def _stream_send(self, data: bytes) -> None:
        """All of ``data`` on the TLS connection (non-blocking: wait while it is full)."""
        assert self.stream is not None
        view = memoryview(data)
        while view:
            try:
                view = view[self.stream.send(view) :]
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                select.select([], [self.stream], [], 0.05)

    def _pump(self) -> None:
        self._flush()
        for event in self.ua.events_received():
            if isinstance(event, OutboundCallAnswered):
                call = self.by_call_id.get(event.call_id)
                audio = negotiate(parse_sdp(event.answer_sdp), ("PCMU",))
                if call is not None and audio is not None:
                    if call.key is not None and audio.crypto:
                        call.srtp = SrtpContext(call.key, audio.crypto[0])
                    call.remote = audio.remote_addr
                    call.answered_at = time.monotonic()
            elif isinstance(event, OutboundCallFailed):
                self.failed += 1
                call = self.by_call_id.get(event.call_id)
                if call is not None:
                    call.ended = True
            elif isinstance(event, CallOffered):
                self._answer(event)
            elif isinstance(event, CallEnded):
                call = self.by_call_id.get(event.call_id)
                if call is not None:
                    call.ended = True
        self._flush()  # what answering an offered call queued
        self._ua_deadline = self.ua.next_deadline()

    def _new_call(self) -> RtpCall:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 18)
        return RtpCall(len(self.calls), sock, sock.getsockname()[1])

    def _register(self, call: RtpCall) -> None:
        self.calls.append(call)
        self.by_call_id[call.call_id] = call

    def _answer(self, event: CallOffered) -> None:
        """The UAS side: answer an offered call (PCMU) with a fresh measured RTP socket."""
        now = time.monotonic()
        offer = parse_sdp(event.offer_sdp)
        audio = negotiate(offer, ("PCMU",))
        if not self.accept_incoming or audio is None:
            status, reason = (488, "Not Acceptable Here") if audio is None else (603, "Decline")
            self.ua.reject(event.call_id, status, reason, now)
            return
        call = self._new_call()
        call.call_id = event.call_id
        answer = build_answer(offer, audio, "127.0.0.1", call.port, random.getrandbits(31), 1)
        self.ua.answer(event.call_id, answer, now)
        call.remote = audio.remote_addr
        call.answered_at = now
        self._register(call)

    @property
    def sip_addr(self) -> tuple[str, int]:
        """Where this load generator's UA listens (the UAS address for incoming calls)."""
        host, port = self.sip.getsockname()[:2]
        return str(host), int(port)

    def place(self, n: int, rate_per_s: float = 200.0) -> None:
        """Invite ``n`` more calls at ``rate_per_s``, running media for those answered."""
        gap_s = 1.0 / rate_per_s
        next_at = time.monotonic()
        scheme = "sips" if self.stream is not None else "sip"
        for _ in range(n):
            self.run_until(next_at)
            call = self._new_call()
            if self.srtp:
                call.key = SdesCrypto.generate(1, secrets.token_bytes)
            offer = build_offer(
                "127.0.0.1",
                call.port,
                random.getrandbits(31),
                1,
                ("PCMU",),
                crypto=[call.key] if call.key is not None else (),
            )
            call.call_id = self.ua.invite(
                f"{scheme}:{self.route}@{self.daemon[0]}:{self.daemon[1]}",
                f"{scheme}:load@127.0.0.1",
                offer,
                self.daemon,
                time.monotonic(),
                conn_id=self.STREAM_ID if self.stream is not None else None,
            )
            self._register(call)
            self._pump()
            next_at += gap_s

    def answered(self) -> int:
        return sum(1 for c in self.calls if c.remote is not None and not c.ended)

    def wait_answered(self, timeout_s: float = 30.0) -> int:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.run_for(0.1)
            pending = [c for c in self.calls if c.remote is None and not c.ended]
            if not pending:
                break
        return self.answered()

    def hangup_all(self, settle_s: float = 1.0) -> None:
        now = time.monotonic()
        for call in self.calls:
            if call.call_id and not call.ended:
                with contextlib.suppress(Exception):
                    self.ua.hangup(call.call_id, now)
                call.ended = True
        self._pump()
        self.run_for(settle_s)

    def close(self) -> None:
        for call in self.calls:
            call.sock.close()
        self.calls.clear()
        self.by_call_id.clear()
        self.ep.close()
        self.sip.close()

    def forget_calls(self) -> None:
        """Drop ended calls (their sockets closed) so a new step starts clean."""
        for call in self.calls:
            call.sock.close()
        self.calls, self.by_call_id = [], {}

    # ------------------------------------------------------------ loop

    def run_for(self, seconds: float) -> None:
        self.run_until(time.monotonic() + seconds)

    def run_until(self, end: float) -> None:
        ep = self.ep  # the SIP socket only: RTP sockets are read at their send slots
        while True:
            now = time.monotonic()
            if now >= end:
                return
            next_send = self._origin + (self._slot + 1) * 0.001
            wake = min(end, next_send)
            if self._ua_deadline is not None:
                wake = min(wake, self._ua_deadline)
            if ep.poll(max(0.0, wake - now)):
                self._read_sip()
            now = time.monotonic()
            while self._origin + (self._slot + 1) * 0.001 <= now:
                self._slot += 1
                self._send_slot(self._slot % 20)
            if self._ua_deadline is not None and now >= self._ua_deadline:
                self.ua.handle_timer(now)
                self._pump()

    def _read_sip(self) -> None:
        if self.stream is not None:
            self._read_stream()
            return
        while True:
            try:
                data, addr = self.sip.recvfrom(65536)
            except BlockingIOError:
                return
            self.ua.receive_datagram(data, (addr[0], addr[1]), time.monotonic())
            self._pump()

    def _read_stream(self) -> None:
        assert self.stream is not None
        source = self.daemon
        while True:
            try:
                data = self.stream.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            if not data:  # the daemon closed it: nothing more arrives
                self.ep.unregister(self.stream.fileno())
                self.ua.connection_lost(self.STREAM_ID)
                return
            self.ua.receive_stream(self.STREAM_ID, data, source, time.monotonic())
            self._pump()

    def _read_rtp(self, call: RtpCall) -> None:
        sock, rec = call.sock, self._recording
        while True:
            try:
                data, anc, _, source = sock.recvmsg(512, 64)
            except BlockingIOError:
                return
            if call.srtp is not None:
                # every packet, recorded or not: the receiver's rollover counter follows
                # the sequence numbers only if it sees them (a first packet read after
                # the sender's wrap would be verified with the wrong counter, and so
                # would every packet after it)
                try:
                    data = call.srtp.unprotect(data)
                except ValueError:  # not this call's keys (or replayed)
                    if rec:
                        call.strays += 1
                    continue
            if not rec or len(data) < 12:
                continue
            _b0, b1, _seq, ts, _ssrc = _HDR.unpack_from(data)
            if b1 & 0x7F != 0:  # PCMU only: skip telephone-event, RTCP and anything else
                continue
            if source != call.remote:
                # not this call's stream: a call of an earlier step whose daemon port still
                # sent to this (reused) port would put timestamps of another stream on its grid
                call.strays += 1
                continue
            arrival = time.monotonic_ns()
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TS.unpack(raw[: _TS.size])
                    arrival = sec * 1_000_000_000 + nsec - self.offset_ns
            call.arrival_ns.append(arrival)
            call.rtp_ts.append(ts)
            call.marker.append(1 if b1 & 0x80 else 0)

    def _send_slot(self, slot: int) -> None:
        payload = self.payload
        for call in self.calls[slot::20]:
            if call.remote is not None and not call.ended:
                call.seq = (call.seq + 1) & 0xFFFF
                call.ts = (call.ts + 160) & 0xFFFFFFFF
                packet = _HDR.pack(0x80, 0, call.seq, call.ts, call.ssrc) + payload
                if call.srtp is not None:
                    packet = call.srtp.protect(packet)
                with contextlib.suppress(OSError):
                    call.sock.sendto(packet, call.remote)
            self._read_rtp(call)  # not waited on: see the module docstring

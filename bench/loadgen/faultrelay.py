"""A seeded UDP fault relay: loss, duplication, reordering, jitter and blackouts.

This machine's kernel has no ``netem`` (``docs`` of issue 33, reliability
notes §6.4), so network faults are made in user space, between a caller and
the daemon on loopback.

Two layers, as everywhere in callbridge:

* ``FaultSchedule`` is pure: given a packet's arrival time ``now`` it says
  when each copy of it leaves (``[]``: dropped). Its random choices come
  from ``random.Random`` seeded with the relay's seed and the direction's
  name, so a direction's sequence of decisions is the same on every run;
  which packets meet which decision still depends on what the peers send
  and when, so tests assert outcomes (the call answered and ended cleanly,
  each digit once, a barge-in happened), never timings. It counts what it
  did (``FaultCounters``).
* ``UdpPipe`` is the thin socket shell: a ``front`` socket the client talks
  to and a ``back`` socket that talks to the server; each datagram goes
  through the direction's schedule (and an optional rewrite) and is sent at
  the times the schedule gave (``loop.call_at``).

``SipRtpRelay`` puts two pipes, one for SIP and one for RTP, between a SIP
caller and the daemon, and rewrites the addresses in SIP and SDP (a small
ALG, ``rewrite_sip``) so that the daemon's signalling and media both pass
through the relay: the caller targets the relay's SIP port, the daemon sees
the relay's back sockets as the caller.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "FaultCounters",
    "FaultSchedule",
    "Faults",
    "SipRtpRelay",
    "UdpPipe",
    "rewrite_contact",
    "rewrite_sip",
]

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Faults:
    """What a direction of the relay does to its packets."""

    loss: float = 0.0
    """Probability that a packet is dropped (Bernoulli)."""
    duplicate: float = 0.0
    """Probability that a packet is sent twice (the copy 0-``jitter_s`` later)."""
    reorder: float = 0.0
    """Probability that a packet is held ``reorder_delay_s`` longer (overtaken)."""
    reorder_delay_s: float = 0.045
    jitter_s: float = 0.0
    """Each packet is delayed by a uniform 0..``jitter_s`` on top of ``delay_s``."""
    delay_s: float = 0.0
    blackouts: tuple[tuple[float, float], ...] = ()
    """(start, end) in seconds from the schedule's ``start``: everything dropped."""

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"faults.{name}: expected a probability in [0, 1], got {value}")
        for name in ("reorder_delay_s", "jitter_s", "delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"faults.{name}: must be >= 0")
        for start, end in self.blackouts:
            if end < start:
                raise ValueError(f"faults.blackouts: ({start}, {end}) ends before it starts")


@dataclass(slots=True)
class FaultCounters:
    packets: int = 0
    sent: int = 0
    lost: int = 0
    blacked_out: int = 0
    duplicated: int = 0
    reordered: int = 0


@dataclass(slots=True)
class FaultSchedule:
    """The pure fault decision of one direction (module docstring)."""

    faults: Faults
    seed: int
    name: str
    start: float
    counters: FaultCounters = field(default_factory=FaultCounters)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}:{self.name}")

    def in_blackout(self, now: float) -> bool:
        t = now - self.start
        return any(start <= t < end for start, end in self.faults.blackouts)

    def deliveries(self, now: float) -> list[float]:
        """When the copies of a packet that arrived at ``now`` leave ([] if dropped).

        The same number of random draws is taken for every packet, whatever
        happens to it, so one packet's fate never shifts the next one's."""
        f = self.faults
        rng = self._rng
        lose, dup, reorder = rng.random(), rng.random(), rng.random()
        jitter, dup_jitter = rng.random() * f.jitter_s, rng.random() * f.jitter_s
        self.counters.packets += 1
        if self.in_blackout(now):
            self.counters.blacked_out += 1
            return []
        if lose < f.loss:
            self.counters.lost += 1
            return []
        at = now + f.delay_s + jitter
        if reorder < f.reorder:
            self.counters.reordered += 1
            at += f.reorder_delay_s
        out = [at]
        if dup < f.duplicate:
            self.counters.duplicated += 1
            out.append(at + dup_jitter)
        self.counters.sent += len(out)
        return out


Rewrite = Callable[[bytes], bytes]


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, Address], None]) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self.on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP port unreachable from a peer that is gone: the packet is lost


class UdpPipe:
    """Client <-> front socket ... back socket <-> server, through two schedules.

    ``server`` may be set later (``set_server``); until then the client's
    packets are dropped. The client is the last source seen on ``front``
    (or ``set_client``)."""

    def __init__(
        self,
        name: str,
        faults: Faults,
        seed: int,
        host: str = "127.0.0.1",
        server: Address | None = None,
        to_server: Rewrite | None = None,
        to_client: Rewrite | None = None,
    ) -> None:
        self.name = name
        self.faults = faults
        self.seed = seed
        self.host = host
        self.server = server
        self.client: Address | None = None
        self.to_server = to_server
        self.to_client = to_client
        self.up: FaultSchedule | None = None  # client -> server
        self.down: FaultSchedule | None = None  # server -> client
        self._front: asyncio.DatagramTransport | None = None
        self._back: asyncio.DatagramTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.TimerHandle] = set()

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        self.up = FaultSchedule(self.faults, self.seed, f"{self.name}:up", now)
        self.down = FaultSchedule(self.faults, self.seed, f"{self.name}:down", now)
        self._front, _ = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._from_client), local_addr=(self.host, 0)
        )
        self._back, _ = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._from_server), local_addr=(self.host, 0)
        )

    @property
    def front(self) -> Address:
        assert self._front is not None
        return self._front.get_extra_info("sockname")[:2]  # type: ignore[no-any-return]

    @property
    def back(self) -> Address:
        assert self._back is not None
        return self._back.get_extra_info("sockname")[:2]  # type: ignore[no-any-return]

    def set_server(self, addr: Address) -> None:
        self.server = addr

    def set_client(self, addr: Address) -> None:
        self.client = addr

    def _from_client(self, data: bytes, addr: Address) -> None:
        self.client = addr
        if self.server is None or self.up is None:
            return
        if self.to_server is not None:
            data = self.to_server(data)
        self._schedule(self.up, self._back, data, self.server)

    def _from_server(self, data: bytes, addr: Address) -> None:
        if self.client is None or self.down is None:
            return
        if self.to_client is not None:
            data = self.to_client(data)
        self._schedule(self.down, self._front, data, self.client)

    def _schedule(
        self,
        schedule: FaultSchedule,
        transport: asyncio.DatagramTransport | None,
        data: bytes,
        dest: Address,
    ) -> None:
        assert self._loop is not None and transport is not None
        now = self._loop.time()
        for at in schedule.deliveries(now):
            if at <= now:
                transport.sendto(data, dest)
                continue
            self._send_later(transport, data, dest, at)

    def _send_later(
        self, transport: asyncio.DatagramTransport, data: bytes, dest: Address, at: float
    ) -> None:
        assert self._loop is not None
        cell: list[asyncio.TimerHandle] = []

        def send() -> None:
            self._pending.discard(cell[0])
            if not transport.is_closing():
                transport.sendto(data, dest)

        cell.append(self._loop.call_at(at, send))
        self._pending.add(cell[0])

    def close(self) -> None:
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()
        for t in (self._front, self._back):
            if t is not None:
                t.close()


# --- SIP and SDP address rewriting ---------------------------------------------------------

_CONTENT_LENGTH = re.compile(rb"\r\n(Content-Length|l)[ \t]*:[ \t]*\d+", re.IGNORECASE)
_AUTH = re.compile(rb"(proxy-)?authorization[ \t]*:", re.IGNORECASE)
_M_AUDIO = re.compile(rb"m=audio (\d+) ")
_CONTACT = re.compile(
    rb"(\r\n(?:Contact|m)[ \t]*:[^\r]*?sip:(?:[^@>;\r]*@)?)([^>;\r]+)", re.IGNORECASE
)


def rewrite_contact(data: bytes, hostport: bytes) -> bytes:
    """``data`` with the host:port of its Contact URI replaced by ``hostport``."""
    return _CONTACT.sub(lambda m: m.group(1) + hostport, data, count=1)


def rewrite_sip(data: bytes, replace: list[tuple[bytes, bytes]]) -> bytes:
    """``data`` with each (old, new) replaced, head and body, and Content-Length fixed.

    ``old`` matches only where no digit follows it (``127.0.0.1:5000`` is not
    a prefix of ``127.0.0.1:50001``). Digest answers (``Authorization``) are
    left as they are: their ``uri`` is under the hash."""
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    for old, new in replace:
        pattern = re.compile(re.escape(old) + rb"(?!\d)")
        lines = [line if _AUTH.match(line) else pattern.sub(_literal(new), line) for line in lines]
        body = pattern.sub(_literal(new), body)
    head = b"\r\n".join(lines)
    if sep:
        head = _CONTENT_LENGTH.sub(
            lambda m: b"\r\n" + m.group(1) + b": " + str(len(body)).encode(), head
        )
    return head + sep + body


def _literal(new: bytes) -> Callable[[re.Match[bytes]], bytes]:
    return lambda _m: new


def sdp_audio_port(data: bytes) -> int | None:
    """The port of the first ``m=audio`` line in a SIP message's body, if any."""
    body = data.partition(b"\r\n\r\n")[2]
    m = _M_AUDIO.search(body)
    return int(m.group(1)) if m else None


class SipRtpRelay:
    """A SIP pipe and an RTP pipe between one SIP caller and the daemon (module docstring).

    The caller dials ``sip:USER@{relay.sip_front}``; SIP is rewritten both
    ways so that the daemon's Contact and SDP name the relay's front
    sockets to the caller, and the caller's Via, Contact and SDP name the
    relay's back sockets to the daemon. The daemon's Contact is replaced
    whole (it may name another address than the one it answered from, e.g.
    port 0 when its listener was bound to port 0), so that the caller's ACK
    and BYE come back through the relay. One call at a time."""

    def __init__(
        self, daemon_sip: Address, faults: Faults, seed: int, host: str = "127.0.0.3"
    ) -> None:
        self.daemon_sip = daemon_sip
        self.sip = UdpPipe(
            "sip", faults, seed, host, daemon_sip, self._sip_to_daemon, self._sip_to_caller
        )
        self.rtp = UdpPipe("rtp", faults, seed, host)
        self.caller_rtp: Address | None = None
        self.daemon_rtp: Address | None = None

    async def start(self) -> None:
        await self.sip.start()
        await self.rtp.start()

    @property
    def sip_front(self) -> Address:
        return self.sip.front

    def _sip_to_daemon(self, data: bytes) -> bytes:
        caller = self.sip.client
        assert caller is not None
        replace = [
            (f"{caller[0]}:{caller[1]}".encode(), _hp(self.sip.back)),
            (_hp(self.sip.front), _hp(self.daemon_sip)),
        ]
        port = sdp_audio_port(data)
        if port is not None:
            self.caller_rtp = (caller[0], port)
            self.rtp.set_client(self.caller_rtp)
            host = self.rtp.back[0].encode()
            replace += [
                (b"m=audio %d " % port, b"m=audio %d " % self.rtp.back[1]),
                (b"IN IP4 " + caller[0].encode(), b"IN IP4 " + host),
            ]
        return rewrite_sip(data, replace)

    def _sip_to_caller(self, data: bytes) -> bytes:
        caller = self.sip.client
        assert caller is not None
        replace = [
            (_hp(self.sip.back), f"{caller[0]}:{caller[1]}".encode()),
            (_hp(self.daemon_sip), _hp(self.sip.front)),
        ]
        port = sdp_audio_port(data)
        if port is not None:
            self.daemon_rtp = (self.daemon_sip[0], port)
            self.rtp.set_server(self.daemon_rtp)
            replace += [
                (b"m=audio %d " % port, b"m=audio %d " % self.rtp.front[1]),
                (b"IN IP4 " + self.daemon_sip[0].encode(), b"IN IP4 " + self.rtp.front[0].encode()),
            ]
        return rewrite_contact(rewrite_sip(data, replace), _hp(self.sip.front))

    def close(self) -> None:
        self.sip.close()
        self.rtp.close()


def _hp(addr: Address) -> bytes:
    return f"{addr[0]}:{addr[1]}".encode()

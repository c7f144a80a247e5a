"""A seeded TCP fault relay: fragmented and delayed bytes, a stalled reader, a cut.

The TCP counterpart of ``faultrelay.py`` (which does loss, duplication and
reordering to UDP) for the media-stream leg: a carrier's WebSocket to the
daemon crosses it. TCP delivers bytes in order, so what a network can do to
it is to deliver them late, in pieces, or not at all:

* **fragmented and delayed**: every chunk read is forwarded in pieces of 1 to
  ``fragment_max_bytes`` bytes (0: whole), each held a uniform 0..``jitter_s``
  longer, never overtaking the one before it. A WebSocket frame then arrives
  split anywhere, header included, and several frames arrive glued together.
  The random choices come from ``random.Random`` seeded with the relay's seed
  and the direction's name; which bytes meet which choice depends on what the
  peers send and when, so tests assert outcomes, never timings.
* **stalled** (``stall_downstream``): the relay stops reading what the server
  sends, as a carrier whose process hangs or whose network path died without
  a reset: the server's socket buffers fill and its writes pile up. What the
  client sends still goes through. With ``server_rcvbuf`` the relay's socket
  to the server has a small receive buffer, so the kernel holds little.
* **cut** (``cut``): both connections are reset at once (``abort``: RST, no
  close frame, no FIN), as a path that dies mid-call.

It counts what it did (``TcpCounters``). The relay is the thin socket shell
only; tests drive when a stall or cut happens from what they observe (a turn
under way), never from a clock.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections import deque
from dataclasses import dataclass, field

__all__ = ["TcpCounters", "TcpFaultRelay", "TcpFaults"]

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TcpFaults:
    """What the relay does to the bytes of both directions."""

    fragment_max_bytes: int = 0
    """Forward each chunk in pieces of 1..this many bytes (0: as read)."""
    jitter_s: float = 0.0
    """Each piece is held a uniform 0..``jitter_s`` longer (order kept)."""
    server_rcvbuf: int = 0
    """``SO_RCVBUF`` of the relay's socket to the server (0: the kernel's default)."""

    def __post_init__(self) -> None:
        if self.fragment_max_bytes < 0:
            raise ValueError("faults.fragment_max_bytes: must be >= 0")
        if self.jitter_s < 0:
            raise ValueError("faults.jitter_s: must be >= 0")
        if self.server_rcvbuf < 0:
            raise ValueError("faults.server_rcvbuf: must be >= 0")


@dataclass(slots=True)
class TcpCounters:
    chunks: int = 0
    """Chunks read from the sending side."""
    pieces: int = 0
    """Pieces written to the receiving side (more than ``chunks`` when fragmenting)."""
    bytes: int = 0


class _Side(asyncio.Protocol):
    def __init__(self, conn: _Connection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.side_up(self)

    def data_received(self, data: bytes) -> None:
        self.conn.forward(self, data)

    def eof_received(self) -> bool | None:
        self.conn.side_eof(self)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.side_lost(self)


@dataclass
class _Direction:
    rng: random.Random
    counters: TcpCounters = field(default_factory=TcpCounters)
    last_at: float = 0.0
    """When this direction's last piece is due: the next never leaves before it."""
    pending: list[bytes] = field(default_factory=list)
    """Bytes read before the other side was connected."""
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    """Pieces not yet written, with when each is due (in order: timers of equal times
    need not run in the order they were made, so one timer serves the queue)."""
    timer: asyncio.TimerHandle | None = None


class _Connection:
    """One client connection and the relay's connection to the server for it."""

    def __init__(self, relay: TcpFaultRelay, index: int) -> None:
        self.relay = relay
        self.loop = relay.loop
        seed = relay.seed
        self.up = _Direction(random.Random(f"{seed}:{index}:up"))
        self.down = _Direction(random.Random(f"{seed}:{index}:down"))
        self.client: _Side | None = None
        self.server: _Side | None = None
        self.stalled = False
        self.closed = False

    def side_up(self, side: _Side) -> None:
        if side.name == "client":
            self.client = side
            assert side.transport is not None
            side.transport.pause_reading()  # until the server side is connected
            self.loop.create_task(self._connect_server())
        else:
            self.server = side
            if self.stalled:
                assert side.transport is not None
                side.transport.pause_reading()
            for data in self.up.pending:
                self._send(self.up, side, data)
            self.up.pending.clear()
            if self.client is not None and self.client.transport is not None:
                self.client.transport.resume_reading()

    async def _connect_server(self) -> None:
        faults = self.relay.faults
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if faults.server_rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, faults.server_rcvbuf)
        try:
            await self.loop.sock_connect(sock, self.relay.server)
            await self.loop.create_connection(lambda: _Side(self, "server"), sock=sock)
        except OSError:
            sock.close()
            self.abort()

    def forward(self, side: _Side, data: bytes) -> None:
        if side.name == "client":
            direction, to = self.up, self.server
        else:
            direction, to = self.down, self.client
        direction.counters.chunks += 1
        direction.counters.bytes += len(data)
        if to is None:
            direction.pending.append(data)
            return
        self._send(direction, to, data)

    def _send(self, direction: _Direction, to: _Side, data: bytes) -> None:
        faults = self.relay.faults
        rng = direction.rng
        now = self.loop.time()
        pos = 0
        while pos < len(data):
            most = faults.fragment_max_bytes
            size = rng.randint(1, most) if most else len(data)
            piece = data[pos : pos + size]
            pos += size
            late_s = rng.uniform(0, faults.jitter_s) if faults.jitter_s else 0.0
            at = max(direction.last_at, now + late_s)
            direction.last_at = at
            direction.counters.pieces += 1
            direction.queue.append((at, piece))
        self._drain(direction, to)

    def _drain(self, direction: _Direction, to: _Side) -> None:
        """Write the pieces that are due, in order; arm the timer for the next one."""
        direction.timer = None
        now = self.loop.time()
        queue = direction.queue
        while queue and queue[0][0] <= now:
            piece = queue.popleft()[1]
            if to.transport is not None and not to.transport.is_closing():
                to.transport.write(piece)
        if queue and direction.timer is None:
            direction.timer = self.loop.call_at(queue[0][0], self._drain, direction, to)

    def side_eof(self, side: _Side) -> None:
        """One side half-closed: pass it on after the pieces already scheduled."""
        up = side.name == "client"
        direction, to = (self.up, self.server) if up else (self.down, self.client)
        if to is None:
            return
        at = max(direction.last_at, self.loop.time()) + 0.001  # after the last piece's timer
        self.loop.call_at(at, self._write_eof, to)

    @staticmethod
    def _write_eof(to: _Side) -> None:
        t = to.transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            t.write_eof()

    def side_lost(self, side: _Side) -> None:
        """One side is gone: close the other once what was scheduled for it has left."""
        other = self.server if side.name == "client" else self.client
        direction = self.up if side.name == "client" else self.down
        if other is not None and other.transport is not None:
            at = max(direction.last_at, self.loop.time()) + 0.001  # after the last piece
            self.loop.call_at(at, other.transport.close)
        self.closed = True

    def stall(self) -> None:
        self.stalled = True
        if self.server is not None and self.server.transport is not None:
            self.server.transport.pause_reading()

    def abort(self) -> None:
        for side in (self.client, self.server):
            if side is not None and side.transport is not None:
                side.transport.abort()
        self.closed = True


class TcpFaultRelay:
    """Listens on loopback; every connection to it is relayed to ``server`` with ``faults``."""

    def __init__(self, server: Address, faults: TcpFaults = TcpFaults(), seed: int = 0) -> None:
        self.server = server
        self.faults = faults
        self.seed = seed
        self.loop = asyncio.get_running_loop()
        self.connections: list[_Connection] = []
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        def accept() -> _Side:
            conn = _Connection(self, len(self.connections))
            self.connections.append(conn)
            return _Side(conn, "client")

        self._listener = await self.loop.create_server(accept, "127.0.0.1", 0)

    @property
    def front(self) -> Address:
        assert self._listener is not None
        host, port = self._listener.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def up_counters(self) -> TcpCounters:
        """Client to server, over every connection."""
        return _sum(c.up.counters for c in self.connections)

    def down_counters(self) -> TcpCounters:
        """Server to client, over every connection."""
        return _sum(c.down.counters for c in self.connections)

    def stall_downstream(self) -> None:
        """Stop reading what the server sends, on every connection (now and later)."""
        for conn in self.connections:
            conn.stall()

    def cut(self) -> None:
        """Reset every connection, both ways, at once."""
        for conn in self.connections:
            conn.abort()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self.cut()


def _sum(counters: object) -> TcpCounters:
    total = TcpCounters()
    for c in counters:  # type: ignore[attr-defined]
        total.chunks += c.chunks
        total.pieces += c.pieces
        total.bytes += c.bytes
    return total

"""The RTP socket's per-packet calls: one datagram in with its arrival time, the tick's out.

A SIP call's media tick reads its RTP socket once and the ticker sends every
due call's packet back to back (``bridge.io.legs.sip_call``, ``bridge.io.ticker``).
Both go through the socket module (a hand-written C module that skipped its
address formatting and exceptions saved no measurable CPU in the daemon:
docs/native.md).

``recv_stamped(sock, last_key)`` returns ``None`` when nothing is queued,
else ``(data, stamp, key, addr)``:

* ``stamp``: the kernel's arrival time (``SCM_TIMESTAMPNS``, CLOCK_REALTIME
  seconds) or ``-1.0`` if the datagram carries none;
* ``key``: ``-1`` (a key for the source, so that a caller could skip the
  tuple for a source it already has, is not made: ``last_key`` is unused);
* ``addr``: the source as ``(host, port)``.

It raises ``OSError`` for anything but an empty socket (a closed one).

``send_all(outbox)`` sends every ``(socket, data, (host, port))`` of the list
and returns how many the kernel refused (a full buffer, a closed socket):
RTP does not queue, those are dropped.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

__all__ = ["SCM_TIMESTAMPNS", "Received", "recv_stamped", "send_all"]

SCM_TIMESTAMPNS = 35
"""Linux: ``SO_TIMESTAMPNS`` and the control message it adds have the same number."""

MAX_DATAGRAM = 2048

Received = tuple[bytes, float, int, tuple[str, int] | None]

_TIMESPEC = struct.Struct("@qq")


def recv_stamped(sock: socket.socket, last_key: int) -> Received | None:
    try:
        data, anc, _flags, addr = sock.recvmsg(MAX_DATAGRAM, 64)
    except BlockingIOError:
        return None
    stamp = -1.0
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            stamp = sec + nsec * 1e-9
    return data, stamp, -1, (addr[0], addr[1])


def send_all(outbox: list[tuple[socket.socket, Any, Any]]) -> int:
    # The datagram is typed Any: whatever buffer the socket module takes, and this
    # module is compiled (mypyc would check a declared ``bytes`` and raise mid-outbox).
    failed = 0
    for sock, data, addr in outbox:
        try:
            sock.sendto(data, addr)
        except OSError:  # a full send buffer or a socket closed since: RTP does not queue
            failed += 1
    return failed

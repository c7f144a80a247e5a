"""The RTP socket's per-packet calls: one datagram in with its arrival time, the tick's out.

A SIP call's media tick reads its RTP socket once and the ticker sends every
due call's packet back to back (``bridge.io.legs.sip_call``, ``bridge.io.ticker``).
Through the socket module each read formats the peer's address as text,
builds the ancillary-data list and, on an empty socket, raises; each send
encodes the destination host and parses it back. The C module
``bridge/io/_rtpsock.c`` (built with the package, see docs/native.md) makes
the same system calls without that work; this module holds the same two
functions in Python, used when it is not built (``CALLBRIDGE_PURE_PYTHON``).
``NATIVE`` says which is in use. The tests run both.

``recv_stamped(sock, last_key)`` returns ``None`` when nothing is queued,
else ``(data, stamp, key, addr)``:

* ``stamp``: the kernel's arrival time (``SCM_TIMESTAMPNS``, CLOCK_REALTIME
  seconds) or ``-1.0`` if the datagram carries none;
* ``key``: the IPv4 source as ``address << 16 | port``, ``-1`` for anything
  else (and always ``-1`` in Python);
* ``addr``: the source as ``(host, port)``, or ``None`` when ``key`` equals
  ``last_key`` (the caller keeps the tuple it already has: the peer's address
  is the same datagram after datagram, and is not formatted again).

It raises ``OSError`` for anything but an empty socket (a closed one).

``send_all(outbox)`` sends every ``(socket, data, (host, port))`` of the list
and returns how many the kernel refused (a full buffer, a closed socket):
RTP does not queue, those are dropped.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["NATIVE", "SCM_TIMESTAMPNS", "Received", "recv_stamped", "send_all"]

SCM_TIMESTAMPNS = 35
"""Linux: ``SO_TIMESTAMPNS`` and the control message it adds have the same number."""

MAX_DATAGRAM = 2048

Received = tuple[bytes, float, int, tuple[str, int] | None]

_TIMESPEC = struct.Struct("@qq")


def _recv_stamped_py(sock: socket.socket, last_key: int) -> Received | None:
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


def _send_all_py(outbox: list[tuple[socket.socket, bytes, Any]]) -> int:
    failed = 0
    for sock, data, addr in outbox:
        try:
            sock.sendto(data, addr)
        except OSError:  # a full send buffer or a socket closed since: RTP does not queue
            failed += 1
    return failed


recv_stamped: Callable[[socket.socket, int], Received | None]
send_all: Callable[[list[tuple[socket.socket, bytes, Any]]], int]

try:
    from bridge.io import _rtpsock  # type: ignore[attr-defined]
except ImportError:  # not built: CALLBRIDGE_PURE_PYTHON, or no C compiler
    NATIVE = False
    recv_stamped, send_all = _recv_stamped_py, _send_all_py
else:
    NATIVE = True
    recv_stamped, send_all = _rtpsock.recv_stamped, _rtpsock.send_all

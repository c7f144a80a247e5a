"""The RTP socket's per-packet calls (``bridge.io.rtpsock``).

Real UDP sockets on loopback. A datagram sent on loopback is queued at the
receiver before ``sendto`` returns, so nothing here waits.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bridge.io import rtpsock

Recv = Callable[[socket.socket, int], rtpsock.Received | None]
SendAll = Callable[[list[tuple[Any, bytes, Any]]], int]


@pytest.fixture
def impl() -> tuple[str, Recv, SendAll]:
    return ("python", rtpsock.recv_stamped, rtpsock.send_all)


def _udp(stamped: bool = True, family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
    sock.setblocking(False)
    if stamped:
        sock.setsockopt(socket.SOL_SOCKET, rtpsock.SCM_TIMESTAMPNS, 1)
    return sock


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx, tx = _udp(), _udp(stamped=False)
    yield rx, tx
    rx.close()
    tx.close()


def test_an_empty_socket_gives_none(
    impl: tuple[str, Recv, SendAll], pair: tuple[socket.socket, socket.socket]
) -> None:
    _, recv, _ = impl
    rx, _ = pair
    assert recv(rx, -2) is None


def test_a_datagram_comes_with_its_kernel_arrival_time_and_source(
    impl: tuple[str, Recv, SendAll], pair: tuple[socket.socket, socket.socket]
) -> None:
    _, recv, _ = impl
    rx, tx = pair
    before = time.time()
    tx.sendto(b"\x80\x00" + bytes(170), rx.getsockname())
    tx.sendto(b"second", rx.getsockname())
    after = time.time()
    got = recv(rx, -2)
    assert got is not None
    data, stamp, key, addr = got
    assert data == b"\x80\x00" + bytes(170)
    assert before - 0.001 <= stamp <= after + 0.001  # CLOCK_REALTIME, from the kernel
    assert addr == tx.getsockname()
    assert key == -1
    again = recv(rx, key)
    assert again is not None
    assert again[0] == b"second"
    assert again[2] == key and again[3] == tx.getsockname()
    assert recv(rx, key) is None


def test_a_new_source_is_given_in_full(
    impl: tuple[str, Recv, SendAll], pair: tuple[socket.socket, socket.socket]
) -> None:
    _, recv, _ = impl
    rx, tx = pair
    with _udp(stamped=False) as other:
        tx.sendto(b"a", rx.getsockname())
        other.sendto(b"b", rx.getsockname())
        first = recv(rx, -2)
        assert first is not None and first[3] == tx.getsockname()
        second = recv(rx, first[2])
        assert second is not None and second[3] == other.getsockname()


def test_without_timestamps_the_stamp_is_minus_one(impl: tuple[str, Recv, SendAll]) -> None:
    _, recv, _ = impl
    with _udp(stamped=False) as rx, _udp(stamped=False) as tx:
        tx.sendto(b"x", rx.getsockname())
        got = recv(rx, -2)
        assert got is not None and got[0] == b"x" and got[1] == -1.0


def test_a_long_datagram_is_cut_at_2048_bytes_like_recvmsg(
    impl: tuple[str, Recv, SendAll], pair: tuple[socket.socket, socket.socket]
) -> None:
    _, recv, _ = impl
    rx, tx = pair
    tx.sendto(bytes(range(256)) * 10, rx.getsockname())
    got = recv(rx, -2)
    assert got is not None and got[0] == (bytes(range(256)) * 10)[:2048]


def test_a_closed_socket_raises_oserror(impl: tuple[str, Recv, SendAll]) -> None:
    _, recv, _ = impl
    rx = _udp()
    rx.close()
    with pytest.raises(OSError):
        recv(rx, -2)


@pytest.mark.needs("ipv6")
def test_an_ipv6_source_comes_as_host_and_port(impl: tuple[str, Recv, SendAll]) -> None:
    _, recv, _ = impl
    rx, tx = _udp(family=socket.AF_INET6), _udp(stamped=False, family=socket.AF_INET6)
    with rx, tx:
        tx.sendto(b"v6", rx.getsockname())
        got = recv(rx, -2)
        assert got is not None
        assert got[2] == -1 and got[3] == tx.getsockname()[:2]


class _Refusing:
    """Not a socket: its own ``sendto`` runs, and refuses."""

    def __init__(self) -> None:
        self.calls = 0

    def sendto(self, data: bytes, addr: object) -> int:
        self.calls += 1
        raise BlockingIOError("send buffer full")


def test_send_all_sends_each_datagram_and_counts_the_refused(
    impl: tuple[str, Recv, SendAll], pair: tuple[socket.socket, socket.socket]
) -> None:
    _, recv, send_all = impl
    rx, tx = pair
    closed = _udp(stamped=False)
    closed.close()
    refusing = _Refusing()
    with _udp() as rx2:
        port2 = rx2.getsockname()[1]
        outbox: list[tuple[Any, bytes, Any]] = [
            (tx, b"one", rx.getsockname()),
            (closed, b"lost", rx.getsockname()),  # closed since it was queued
            (refusing, b"full", rx.getsockname()),
            (tx, b"two", ("localhost", port2)),  # a name: the socket module resolves it
            (tx, bytearray(b"three"), rx.getsockname()),  # not bytes: the socket module
        ]
        assert send_all(outbox) == 2
        assert refusing.calls == 1
        got = [recv(rx, -2), recv(rx, -2), recv(rx2, -2)]
        assert [g[0] if g else None for g in got] == [b"one", b"three", b"two"]
        assert recv(rx, -2) is None
    assert len(outbox) == 5  # the caller clears it


def test_send_all_lets_other_errors_through(impl: tuple[str, Recv, SendAll]) -> None:
    _, _, send_all = impl

    class Broken:
        def sendto(self, data: bytes, addr: object) -> int:
            raise RuntimeError("a bug, not a full buffer")

    with pytest.raises(RuntimeError):
        send_all([(Broken(), b"x", ("127.0.0.1", 9))])

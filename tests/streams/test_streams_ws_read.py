"""The shell's own reading of whole data frames behaves as websockets' parser does.

``WsConnection._read_frames`` (the per-message path while serving a media
stream, docs/benchmarks.md issue 8) unmasks a whole unfragmented data frame
itself and hands every other frame to websockets' parser. Each test feeds
the same bytes, cut at every place, to a connection reading that way and to
one reading everything through websockets, and compares what each delivered,
wrote back, and how it ended.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from websockets.frames import Frame, Opcode
from websockets.http11 import Request as WsRequest
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.io.httpws import HttpRequest, WsConnection

HANDSHAKE = (
    b"GET /twilio HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
MAX_SIZE = 100_000


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed


class _Writer:
    def __init__(self) -> None:
        self.transport = _Transport()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.transport.closed = True


class _Ended:
    """Stands in for serve()'s future."""

    def __init__(self) -> None:
        self.outcome: tuple[str, Any] | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def set_result(self, value: None) -> None:
        self.outcome = ("result", value)

    def set_exception(self, exc: BaseException) -> None:
        self.outcome = ("exception", type(exc).__name__)


def _serving(fast: bool) -> tuple[WsConnection, list[str | bytes], _Ended, _Transport]:
    proto = ServerProtocol(max_size=MAX_SIZE)
    proto.receive_data(HANDSHAKE)
    (request,) = proto.events_received()
    assert isinstance(request, WsRequest)
    proto.send_response(proto.accept(request))
    proto.data_to_send()
    writer = _Writer()
    conn = WsConnection(HttpRequest("GET", "/twilio", {}), proto, None, writer)  # type: ignore[arg-type]
    assert conn._fast_read  # a fresh connection reads data frames itself
    conn._fast_read = fast
    got: list[str | bytes] = []
    ended = _Ended()
    conn._serving = (got.append, ended)  # type: ignore[assignment]
    return conn, got, ended, writer.transport


def _outcome(stream: bytes, cuts: list[int], fast: bool) -> dict[str, Any]:
    conn, got, ended, transport = _serving(fast)
    start = 0
    for cut in [*cuts, len(stream)]:
        conn._serve_data(stream[start:cut])
        start = cut
    return {
        "got": got,
        "written": b"".join(transport.writes),
        "ended": ended.outcome,
        "closed": conn.closed,
        "close": (conn.close_code, conn.close_reason),
        "state": conn._proto.state,
        "transport_closed": transport.closed,
    }


def _same_at_every_cut(stream: bytes, step: int = 1) -> dict[str, Any]:
    reference = _outcome(stream, [], fast=False)
    assert _outcome(stream, [], fast=True) == reference
    for cut in range(1, len(stream), step):
        assert _outcome(stream, [cut], fast=True) == reference, cut
    rng = random.Random(len(stream))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, 6)))
        assert _outcome(stream, cuts, fast=True) == reference, cuts
    return reference


def _frame(
    opcode: Opcode, data: bytes, fin: bool = True, rsv1: bool = False, mask: bool = True
) -> bytes:
    """A client frame as RFC 6455 §5.2 lays it out (also the ones websockets won't write)."""
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode.value])
    n, bit = len(data), 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + data
    key = random.Random(n).randbytes(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(data))


def _text(text: str) -> bytes:
    return _frame(Opcode.TEXT, text.encode())


def test_data_frames_of_every_length_encoding() -> None:
    messages: list[str | bytes] = ["m0", "é" * 60, "x" * 200, b"\x00\xff" * 40, "y" * 70_000]
    stream = b"".join(
        _frame(Opcode.BINARY, m) if isinstance(m, bytes) else _text(m) for m in messages
    )
    reference = _same_at_every_cut(stream, step=997)
    assert reference["got"] == messages and reference["ended"] is None
    assert _same_at_every_cut(stream[:1000])["got"] == messages[:4]  # the 70 kB one cut off


def test_a_ping_between_messages_is_answered_and_the_messages_still_come() -> None:
    stream = _text("a") + _frame(Opcode.PING, b"hi") + _text("b") + _frame(Opcode.PONG, b"")
    reference = _same_at_every_cut(stream + _text("c"))
    assert reference["got"] == ["a", "b", "c"]
    assert reference["written"] == Frame(Opcode.PONG, b"hi").serialize(mask=False)


def test_a_fragmented_message_between_whole_ones() -> None:
    stream = (
        _text("a")
        + _frame(Opcode.TEXT, b"he", fin=False)
        + _frame(Opcode.PING, b"")
        + _frame(Opcode.CONT, b"ll", fin=False)
        + _frame(Opcode.CONT, b"o", fin=True)
        + _text("b")
    )
    assert _same_at_every_cut(stream)["got"] == ["a", "hello", "b"]
    # a whole data frame inside a fragmented message is websockets' protocol error
    bad = _frame(Opcode.TEXT, b"he", fin=False) + _text("x") + _text("y")
    reference = _same_at_every_cut(bad)
    assert reference["got"] == [] and reference["close"][0] == 1002


def test_close_then_more_data() -> None:
    close = _frame(Opcode.CLOSE, struct.pack("!H", 1000) + b"bye")
    reference = _same_at_every_cut(_text("a") + close + _text("late"))
    assert reference["got"] == ["a"] and reference["close"] == (1000, "bye")
    assert reference["closed"] and reference["transport_closed"]
    assert reference["state"] is State.CLOSING


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (_frame(Opcode.TEXT, b"x" * (MAX_SIZE + 1)), 1009),  # too big
        (_frame(Opcode.TEXT, b"x", mask=False), 1002),  # a client must mask
        (_frame(Opcode.TEXT, b"x", rsv1=True), 1002),  # no extension: no reserved bit
        (_frame(Opcode.CONT, b"x"), 1002),  # nothing to continue
        (_frame(Opcode.PING, b"x" * 126), 1002),  # control frame too long
    ],
)
def test_a_frame_websockets_refuses_is_refused_the_same_way(bad: bytes, code: int) -> None:
    reference = _same_at_every_cut(_text("a") + bad[:300] + _text("b"), step=7)
    assert reference["got"] == ["a"] and reference["close"][0] in (code, None)
    assert reference["closed"] and reference["state"] is not State.OPEN


def test_invalid_utf8_ends_serving_after_the_messages_before_it() -> None:
    stream = _text("a") + _frame(Opcode.TEXT, b"\xff\xfe") + _text("b")
    reference = _outcome(stream, [len(_text("a"))], fast=False)
    assert reference["got"] == ["a"] and reference["ended"] == ("exception", "UnicodeDecodeError")
    # websockets' parser reads a whole segment before delivering any of it, so
    # a message in the bad frame's segment was lost with it; now it arrives
    assert _outcome(stream, [], fast=False)["got"] == []
    for cut in range(len(stream)):
        assert _outcome(stream, [cut] if cut else [], fast=True) == reference, cut


def test_recv_before_serve_hands_the_parser_every_byte() -> None:
    conn, _, _, _ = _serving(fast=True)
    conn._proto.receive_data(_text("x")[:3])  # as recv() does: the parser holds part of a frame
    conn._fast_read = False  # what recv() sets
    conn._serve_data(_text("x")[3:])
    assert conn._pending == [] and conn._serving is not None

"""What ``WsConnection.serve`` delivers from a carrier's bytes, however they are cut.

Every byte of a served connection goes through websockets' sans-I/O parser
(issue 32: one frame parser, websockets' own). Each test runs ``serve`` on a
connection over a stand-in transport, feeds the bytes as the event loop would
(the transport's protocol's ``data_received``), in one read and cut at every
place, and checks what was delivered, written back, and how serving ended:
the same for every cut.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """What ``serve`` uses of a transport: writes, its protocol, reading and closing."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol: Any = asyncio.Protocol()

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def resume_reading(self) -> None:
        pass


class _Writer:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.transport.close()

    async def drain(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


def _open() -> tuple[WsConnection, _Transport, asyncio.StreamReader]:
    """An accepted connection, as ``serve_http_ws`` hands it to its handler."""
    proto = ServerProtocol(max_size=MAX_SIZE)
    proto.receive_data(HANDSHAKE)
    (request,) = proto.events_received()
    assert isinstance(request, WsRequest)
    proto.send_response(proto.accept(request))
    proto.data_to_send()
    transport = _Transport()
    reader = asyncio.StreamReader()
    conn = WsConnection(HttpRequest("GET", "/twilio", {}), proto, reader, _Writer(transport))  # type: ignore[arg-type]
    return conn, transport, reader


async def _settle() -> None:
    for _ in range(3):  # serve()'s task: started, or woken by its end
        await asyncio.sleep(0)


async def _outcome(stream: bytes, cuts: list[int]) -> dict[str, Any]:
    conn, transport, _ = _open()
    got: list[str | bytes] = []
    serving = asyncio.ensure_future(conn.serve(got.append))
    await _settle()  # serve() has taken over the transport's protocol
    start = 0
    for cut in [*cuts, len(stream)]:
        transport.protocol.data_received(stream[start:cut])  # as the loop calls it
        start = cut
    await _settle()
    ended: tuple[str, Any] | None = None
    if serving.done():
        exc = serving.exception()
        ended = ("result", None) if exc is None else ("exception", type(exc).__name__)
    else:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    return {
        "got": got,
        "written": b"".join(transport.writes),
        "ended": ended,
        "closed": conn.closed,
        "close": (conn.close_code, conn.close_reason),
        "state": conn._proto.state,
        "transport_closed": transport.closed,
    }


def _same_at_every_cut(stream: bytes, step: int = 1) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        reference = await _outcome(stream, [])
        for cut in range(1, len(stream), step):
            assert await _outcome(stream, [cut]) == reference, cut
        rng = random.Random(len(stream))
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, 6)))
            assert await _outcome(stream, cuts) == reference, cuts
        return reference

    return asyncio.run(main())


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
    assert reference["written"] == b"" and reference["state"] is State.OPEN
    assert _same_at_every_cut(stream[:1000])["got"] == messages[:4]  # the 70 kB one cut off


def test_many_messages_in_one_read_arrive_in_order() -> None:
    messages = [f"m{i}" for i in range(50)]
    reference = _same_at_every_cut(b"".join(_text(m) for m in messages), step=11)
    assert reference["got"] == messages


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
    binary = _frame(Opcode.BINARY, b"\x00", fin=False) + _frame(Opcode.CONT, b"\xff")
    assert _same_at_every_cut(binary)["got"] == [b"\x00\xff"]
    # a whole data frame inside a fragmented message is websockets' protocol error
    bad = _frame(Opcode.TEXT, b"he", fin=False) + _text("x") + _text("y")
    reference = _same_at_every_cut(bad)
    assert reference["got"] == [] and reference["close"][0] == 1002
    assert reference["ended"] == ("result", None) and reference["transport_closed"]


def test_close_then_more_data() -> None:
    close = _frame(Opcode.CLOSE, struct.pack("!H", 1000) + b"bye")
    reference = _same_at_every_cut(_text("a") + close + _text("late"))
    assert reference["got"] == ["a"] and reference["close"] == (1000, "bye")
    assert reference["closed"] and reference["transport_closed"]
    assert reference["ended"] == ("result", None)
    assert reference["state"] is State.CLOSING
    # the close is answered with the same code
    assert reference["written"].startswith(bytes([0x88, 2 + len(b"bye")]) + struct.pack("!H", 1000))


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
def test_a_frame_websockets_refuses_is_refused(bad: bytes, code: int) -> None:
    reference = _same_at_every_cut(_text("a") + bad[:300] + _text("b"), step=7)
    assert reference["got"] == ["a"] and reference["close"][0] in (code, None)
    assert reference["closed"] and reference["state"] is not State.OPEN
    assert reference["ended"] == ("result", None)


def test_invalid_utf8_ends_serving_after_the_messages_before_it() -> None:
    stream = _text("a") + _frame(Opcode.TEXT, b"\xff\xfe") + _text("b")
    reference = _same_at_every_cut(stream)
    # "a", in the same read as the bad frame when the bytes come in one, still arrives
    assert reference["got"] == ["a"] and reference["ended"] == ("exception", "UnicodeDecodeError")
    assert reference["written"] == b"" and not reference["closed"]


def test_bytes_read_before_serve_go_to_the_same_parser() -> None:
    async def main() -> None:
        conn, transport, reader = _open()
        reader.feed_data(_text("x") + _text("y")[:3])
        assert await conn.recv() == "x"  # that read left part of "y" in the parser
        reader.feed_data(_text("y")[3:5])  # sent before serve(): still the reader's
        got: list[str | bytes] = []
        serving = asyncio.ensure_future(conn.serve(got.append))
        await _settle()
        transport.protocol.data_received(_text("y")[5:] + _text("z"))
        assert got == ["y", "z"] and not serving.done()
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    asyncio.run(main())

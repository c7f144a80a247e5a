"""Provider messages straight from websockets' parser (``_ProviderWebSocket``), frame by frame.

The provider connection hands each complete data message to its reader as
the frames are parsed, instead of through websockets' message queue. These
feed it frames by hand: whole and fragmented messages, text and binary,
invalid UTF-8 (the connection fails with 1007, as ``recv()`` did), and
control frames left to websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from provider_socket import FakeTransport, open_provider_socket
from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from bridge.engine import Action, Event
from bridge.io.provider_ws import Connection, _ProviderWebSocket
from bridge.providers.base import ConnectParams
from bridge.providers.pool import Placement


def open_socket(messages: list[str | bytes]) -> _ProviderWebSocket:
    return open_provider_socket(messages.append)


def run(fn: Any) -> None:
    async def main() -> None:
        fn()

    asyncio.run(main())


def test_whole_and_fragmented_messages_reach_the_reader_in_order() -> None:
    def body() -> None:
        got: list[str | bytes] = []
        ws = open_socket(got)
        ws.process_event(Frame(Opcode.TEXT, b'{"a":1}'))
        ws.process_event(Frame(Opcode.TEXT, b'{"b":"', fin=False))
        ws.process_event(Frame(Opcode.CONT, b"\xc3", fin=False))  # a split UTF-8 character
        ws.process_event(Frame(Opcode.CONT, b'\xa9"}'))
        ws.process_event(Frame(Opcode.BINARY, b"\x00\x01", fin=False))
        ws.process_event(Frame(Opcode.CONT, b"\x02"))
        ws.process_event(Frame(Opcode.BINARY, b"\xff"))
        ws.process_event(Frame(Opcode.PONG, b""))  # control frames: websockets' own
        assert got == ['{"a":1}', '{"b":"é"}', b"\x00\x01\x02", b"\xff"]
        assert ws.protocol.state is State.OPEN

    run(body)


def test_invalid_utf8_fails_the_connection_with_1007_and_is_not_delivered() -> None:
    def body() -> None:
        got: list[str | bytes] = []
        ws = open_socket(got)
        ws.process_event(Frame(Opcode.TEXT, b"ok"))
        ws.process_event(Frame(Opcode.TEXT, b"\xff\xfe"))
        assert got == ["ok"]
        assert ws.protocol.state is State.CLOSING
        assert ws.protocol.close_sent is not None
        assert ws.protocol.close_sent.code == CloseCode.INVALID_DATA
        assert isinstance(ws.connection_exc, UnicodeDecodeError)

    run(body)


class RecordingEngine:
    """The engine contract, recording the order of what the shell tells it."""

    max_turns = 1

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: list[str] = []

    def session_request(self) -> None:
        return None

    def open_turns(self) -> int:
        return 0

    def connect_params(self) -> ConnectParams:
        return ConnectParams(url=self.url)

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        self.calls.append("made")

    def receive_text(self, text: str, now: float) -> None:
        self.calls.append(f"text:{text}")

    def receive_bytes(self, data: bytes, now: float) -> None:
        self.calls.append(f"bytes:{data!r}")

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        self.calls.append(f"lost:{code}")

    def actions_to_send(self) -> list[Action]:
        return []

    def events_received(self) -> list[Event]:
        return []

    def next_deadline(self) -> float | None:
        return None


def test_messages_sent_with_the_handshake_reach_the_engine_after_connection_made() -> None:
    """A server that writes its first message in the same segment as the 101 response:
    the message is parsed before the client's connect() returns, and must wait for
    the engine to hear of the connection."""

    async def handshake_and_hello(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = accept_key(key.decode()).encode()
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
            b"\x81\x05hello"  # a text frame in the same write
            b"\x82\x01\x07"  # and a binary one
            b"\x88\x02\x03\xe8"  # then a close (1000)
        )
        await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readexactly(8)  # the client's (masked) close frame
        writer.close()

    async def main() -> list[str]:
        server = await asyncio.start_server(handshake_and_hello, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = RecordingEngine(f"ws://127.0.0.1:{port}/")
        pool = SimpleNamespace(
            preempt=lambda: None,
            connection_ended=lambda conn: None,
            placement=Placement(None, 1),
            arm_idle_close=lambda: None,
            name="test",
            settings=SimpleNamespace(unix_socket=""),
        )
        conn = Connection(pool, engine)  # type: ignore[arg-type]
        await asyncio.wait_for(conn.run(), 10)
        server.close()
        await server.wait_closed()
        return engine.calls

    assert asyncio.run(main()) == ["made", "text:hello", "bytes:b'\\x07'", "lost:1000"]


def handshaken(messages: list[str | bytes]) -> tuple[_ProviderWebSocket, FakeTransport]:
    """A socket past a real 101 response (read on its own, as a server usually sends it)."""
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1:9/v1/ws"))
    request = protocol.connect()
    protocol.send_request(request)
    ws = _ProviderWebSocket(protocol, on_message=messages.append)
    transport = FakeTransport()
    ws.connection_made(transport)  # type: ignore[arg-type]
    accept = accept_key(request.headers["Sec-WebSocket-Key"])
    ws.data_received(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
    )
    assert ws.protocol.state is State.OPEN
    transport.written.clear()
    return ws, transport


def server_frames(big: bool) -> tuple[bytes, list[str | bytes]]:
    """Unmasked frames as a server sends them, and the messages they carry."""
    text_c = "c" * (70_000 if big else 300)
    frames = [
        Frame(Opcode.TEXT, b"a"),
        Frame(Opcode.BINARY, bytes(range(200))),
        Frame(Opcode.TEXT, text_c.encode()),
        Frame(Opcode.PING, b"p"),
        Frame(Opcode.TEXT, b"he", fin=False),
        Frame(Opcode.PONG, b""),
        Frame(Opcode.CONT, "llé".encode(), fin=True),
        Frame(Opcode.TEXT, b'{"audio_chunk":"AAAA","context_id":"c1"}'),
        Frame(Opcode.CLOSE, b"\x03\xe8"),
        Frame(Opcode.TEXT, b"after the close"),
    ]
    wire = b"".join(f.serialize(mask=False, extensions=[]) for f in frames)
    return wire, [
        "a",
        bytes(range(200)),
        text_c,
        "hellé",
        '{"audio_chunk":"AAAA","context_id":"c1"}',
    ]


def test_frames_cut_from_the_bytes_at_any_split_give_the_messages_and_the_control_frames() -> None:
    def body() -> None:
        wire, expected = server_frames(big=False)
        for cut in range(len(wire) + 1):
            got: list[str | bytes] = []
            ws, transport = handshaken(got)
            ws.data_received(wire[:cut])
            ws.data_received(wire[cut:])
            assert got == expected, cut
            assert ws.protocol.state is State.CLOSING, cut  # the close was the protocol's
            assert len(transport.written) >= 2, cut  # the pong, then the close reply

    run(body)


def test_a_big_frame_over_many_reads_and_byte_by_byte() -> None:
    def body() -> None:
        wire, expected = server_frames(big=True)
        for step in (1, 7, 1000, 65536):
            got: list[str | bytes] = []
            ws, _ = handshaken(got)
            for at in range(0, len(wire), step):
                ws.data_received(wire[at : at + step])
            assert got == expected, step

    run(body)


def test_frames_the_protocol_must_judge_are_left_to_it() -> None:
    def body() -> None:
        for bad in (
            bytes([0xC1, 0x01]) + b"x",  # RSV1 set, no extension negotiated
            Frame(Opcode.TEXT, b"x").serialize(mask=True, extensions=[]),  # masked by a server
            bytes([0x83, 0x00]),  # a reserved opcode
            bytes([0x81, 0x7F]) + (2**40).to_bytes(8, "big"),  # over the size limit
            Frame(Opcode.CONT, b"x").serialize(mask=False, extensions=[]),  # nothing to continue
        ):
            got: list[str | bytes] = []
            ws, _ = handshaken(got)
            ws.data_received(Frame(Opcode.TEXT, b"ok").serialize(mask=False, extensions=[]) + bad)
            ws.data_received(Frame(Opcode.TEXT, b"late").serialize(mask=False, extensions=[]))
            assert got == ["ok"], bad
            assert ws.protocol.state is State.CLOSING, bad

    run(body)


def test_a_text_frame_inside_a_fragmented_message_fails_the_connection() -> None:
    def body() -> None:
        got: list[str | bytes] = []
        ws, _ = handshaken(got)
        ws.data_received(
            Frame(Opcode.TEXT, b"he", fin=False).serialize(mask=False, extensions=[])
            + Frame(Opcode.TEXT, b"x").serialize(mask=False, extensions=[])
        )
        assert got == []
        assert ws.protocol.state is State.CLOSING

    run(body)


def test_each_message_is_handed_over_with_its_offsets_at_any_split() -> None:
    """``msg_start`` and ``consumed`` (what ``watch_dry`` reads) name the message's own
    bytes in the stream, however the reads cut it."""

    def body() -> None:
        frames = [
            Frame(Opcode.TEXT, b"a" * 300),
            Frame(Opcode.BINARY, bytes(range(126))),
            Frame(Opcode.TEXT, b"b"),
            Frame(Opcode.TEXT, "c\u00e9".encode() * 40_000),
            Frame(Opcode.BINARY, b""),
        ]
        wires = [f.serialize(mask=False, extensions=[]) for f in frames]
        wire = b"".join(wires)
        for cut in (*range(0, 400), *range(len(wire) - 300, len(wire) + 1)):
            seen: list[tuple[int, int]] = []
            ws, _ = handshaken([])
            ws.on_message = lambda msg, ws=ws, seen=seen: seen.append((ws.msg_start, ws.consumed))
            base = ws.received
            ws.data_received(wire[:cut])
            ws.data_received(wire[cut:])
            expected, at = [], base
            for w in wires:
                expected.append((at, at + len(w)))
                at += len(w)
            assert seen == expected, cut
            assert ws.consumed == ws.received == at, cut

    run(body)


def test_a_bad_frame_split_over_reads_fails_the_connection_and_nothing_after_it_is_delivered() -> (
    None
):
    def body() -> None:
        ok = Frame(Opcode.TEXT, b"ok").serialize(mask=False, extensions=[])
        bad = Frame(Opcode.TEXT, b"x" * 40).serialize(mask=True, extensions=[])
        late = Frame(Opcode.TEXT, b"late").serialize(mask=False, extensions=[])
        for cut in range(len(ok) + 1, len(ok) + len(bad)):
            got: list[str | bytes] = []
            ws, _ = handshaken(got)
            wire = ok + bad + late
            ws.data_received(wire[:cut])
            ws.data_received(wire[cut:])
            assert got == ["ok"], cut
            assert ws.protocol.state is State.CLOSING, cut

    run(body)


def test_offsets_count_from_the_response_end_however_it_and_the_frames_are_cut() -> None:
    """The handshake response and the first frames in one stream, cut anywhere: each
    message's ``msg_start``/``consumed`` are its own bytes' offsets in that stream."""

    def body() -> None:
        frames = [
            Frame(Opcode.TEXT, b"a" * 200),
            Frame(Opcode.BINARY, b"b"),
            Frame(Opcode.PING, b""),
        ]
        wires = [f.serialize(mask=False, extensions=[]) for f in frames]
        for cut in range(0, 150, 7):
            protocol = ClientProtocol(parse_uri("ws://127.0.0.1:9/v1/ws"))
            request = protocol.connect()
            protocol.send_request(request)
            seen: list[tuple[int, int]] = []
            ws = _ProviderWebSocket(protocol, on_message=lambda m: None)
            ws.on_message = lambda msg, ws=ws, seen=seen: seen.append((ws.msg_start, ws.consumed))
            ws.connection_made(FakeTransport())  # type: ignore[arg-type]
            accept = accept_key(request.headers["Sec-WebSocket-Key"]).encode()
            response = (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
            )
            stream = response + b"".join(wires)
            ws.data_received(stream[:cut])
            ws.data_received(stream[cut:])
            at = len(response)
            expected = [
                (at, at + len(wires[0])),
                (at + len(wires[0]), at + len(wires[0]) + len(wires[1])),
            ]
            assert seen == expected, cut
            assert ws.consumed == ws.received == len(stream), cut  # the ping counts as handed over

    run(body)

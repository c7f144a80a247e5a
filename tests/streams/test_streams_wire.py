"""Outbound media's fast path writes exactly the bytes the slow path wrote.

Two shortcuts (docs/benchmarks.md, issue 8): the Twilio-shaped dialects
render ``media`` from a per-stream template instead of ``json.dumps`` (a
``SendEncodedText``), and the shell writes a server data frame's header
itself instead of going through websockets' ``send_text`` +
``data_to_send``. Both must be byte-identical to what they replace.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request as WsRequest
from websockets.protocol import State
from websockets.server import ServerProtocol

from bridge.engine import SendText
from bridge.io.httpws import HttpRequest, WsConnection
from bridge.streams.base import MediaStreamProtocol, SendEncodedText, StreamState
from bridge.streams.exotel import ExotelStreamProtocol
from bridge.streams.telnyx import TelnyxStreamProtocol
from bridge.streams.twilio import TwilioStreamProtocol

HANDSHAKE = (
    b"GET /twilio HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def _twilio_start(stream_sid: str) -> str:
    return json.dumps(
        {
            "event": "start",
            "sequenceNumber": "1",
            "streamSid": stream_sid,
            "start": {
                "streamSid": stream_sid,
                "accountSid": "AC1",
                "callSid": "CA1",
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            },
        }
    )


def _started(engine: MediaStreamProtocol, start: dict[str, Any]) -> MediaStreamProtocol:
    engine.connection_made(0.0)
    engine.receive_text(json.dumps(start), 0.0)
    assert engine.state is StreamState.STREAMING, engine.events_received()
    engine.actions_to_send()
    engine.events_received()
    return engine


def _slow_media(key: str | None, stream_id: str, wire_audio: bytes) -> str:
    """What ``_send_media`` rendered before the template: ``json.dumps`` of the message."""
    ref = {key: stream_id} if key else {}
    payload = base64.b64encode(wire_audio).decode("ascii")
    return json.dumps(
        {"event": "media", **ref, "media": {"payload": payload}}, separators=(",", ":")
    )


@pytest.mark.parametrize(
    "stream_sid",
    ["MZ18ad3ab5a668481ce02b83e7395059f0", 'MZ"quoted"\\back', "MZ-é-ünï-☎-\U0001f4de"],
)
def test_twilio_media_template_is_json_dumps(stream_sid: str) -> None:
    engine = TwilioStreamProtocol()
    engine.connection_made(0.0)
    engine.receive_text(_twilio_start(stream_sid), 0.0)
    engine.actions_to_send()
    assert engine.events_received() and engine.stream_id == stream_sid
    for frame in (bytes(range(160)), b"\xff" * 160, bytes(160)):
        assert engine.send_frame(frame, 0.02)
        (action,) = engine.actions_to_send()
        assert isinstance(action, SendEncodedText) and isinstance(action, SendText)
        expected = _slow_media("streamSid", engine.stream_id, frame)
        assert action.data == expected.encode()
        assert action.text == expected
    assert engine.sent_ms == 60


def test_telnyx_l16_media_template_swaps_bytes_and_names_no_stream() -> None:
    engine = _started(
        TelnyxStreamProtocol(),
        {
            "event": "start",
            "sequence_number": "1",
            "stream_id": "st-1",
            "start": {
                "call_control_id": "cc-1",
                "media_format": {"encoding": "L16", "sample_rate": 16000, "channels": 1},
            },
        },
    )
    frame = bytes(range(256)) + bytes(range(256)) + bytes(128)
    assert engine.send_frame(frame, 0.02)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendEncodedText)
    swapped = bytes(b for i in range(0, len(frame), 2) for b in (frame[i + 1], frame[i]))
    assert action.text == _slow_media(None, "", swapped)


def test_exotel_chunk_uses_the_template() -> None:
    engine = _started(
        ExotelStreamProtocol(),
        {
            "event": "start",
            "sequence_number": "1",
            "stream_sid": "ex-1",
            "start": {"stream_sid": "ex-1", "call_sid": "c", "account_sid": "a"},
        },
    )
    frame = bytes(range(160)) * 2
    for _ in range(10):
        engine.send_frame(frame, 0.02)
    (action,) = engine.actions_to_send()
    assert isinstance(action, SendEncodedText)
    assert action.text == _slow_media("stream_sid", "ex-1", frame * 10)


def test_encoded_text_equals_and_reprs_like_send_text() -> None:
    a, b = SendEncodedText(b'{"a":"\xc3\xa9"}'), SendEncodedText(b'{"a":"\xc3\xa9"}')
    assert a == b and hash(a) == hash(b) and a.text == '{"a":"é"}'
    assert "SendEncodedText" in repr(a) and '{"a":"é"}' in repr(a)


# --------------------------------------------------------------- the shell


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


class _Writer:
    def __init__(self) -> None:
        self.transport = _Transport()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def can_write_eof(self) -> bool:
        return False


def _open_protocol() -> ServerProtocol:
    proto = ServerProtocol()
    proto.receive_data(HANDSHAKE)
    (request,) = proto.events_received()
    assert isinstance(request, WsRequest)
    proto.send_response(proto.accept(request))
    proto.data_to_send()
    assert proto.state is State.OPEN
    return proto


def _connection() -> tuple[WsConnection, _Transport]:
    writer = _Writer()
    request = HttpRequest("GET", "/twilio", {})
    conn = WsConnection(request, _open_protocol(), None, writer)  # type: ignore[arg-type]
    return conn, writer.transport


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 309, 4500, 65535, 65536, 70_000])
def test_header_built_by_the_shell_is_what_websockets_writes(size: int) -> None:
    data = (b'{"event":"media","payload":"' + b"A" * size)[:size]
    reference = _open_protocol()
    reference.send_text(data)
    expected = b"".join(reference.data_to_send())
    conn, transport = _connection()
    conn.send_encoded_text_nowait(data)
    assert transport.writes == [expected]  # one write: header and payload together
    frame = Frame(Opcode.TEXT, data)
    assert expected == frame.serialize(mask=False)


def test_send_text_nowait_and_encoded_write_the_same_bytes() -> None:
    text = _slow_media("streamSid", "MZ-é", bytes(range(160)))
    slow, slow_t = _connection()
    fast, fast_t = _connection()
    slow.send_text_nowait(text)
    fast.send_encoded_text_nowait(text.encode())
    assert b"".join(slow_t.writes) == b"".join(fast_t.writes)


def test_encoded_text_not_written_after_close_and_falls_back_while_closing() -> None:
    conn, transport = _connection()
    conn.closed = True
    conn.send_encoded_text_nowait(b"{}")
    assert transport.writes == []
    # a fragmented message in progress: the protocol object decides (and refuses)
    conn, transport = _connection()
    conn._proto.send_text(b"part", fin=False)
    conn._proto.data_to_send()
    with pytest.raises(Exception, match="continuation"):
        conn.send_encoded_text_nowait(b"{}")
    assert transport.writes == []


def test_encoded_text_goes_through_the_protocol_once_a_close_was_received() -> None:
    # recv() returns the message that came before the peer's close: the
    # connection is not closed yet, but the protocol is CLOSING, so a frame
    # is no longer written raw (websockets refuses it)
    async def main() -> None:
        reader = asyncio.StreamReader()
        writer = _Writer()
        conn = WsConnection(HttpRequest("GET", "/twilio", {}), _open_protocol(), reader, writer)  # type: ignore[arg-type]
        text = Frame(Opcode.TEXT, b"a").serialize(mask=True)
        close = Frame(Opcode.CLOSE, b"\x03\xe8").serialize(mask=True)
        reader.feed_data(text + close)
        assert await conn.recv() == "a"
        assert not conn.closed and conn._proto.state is State.CLOSING
        writer.transport.writes.clear()  # the close reply
        with pytest.raises(InvalidState):
            conn.send_encoded_text_nowait(b"{}")
        assert writer.transport.writes == []

    asyncio.run(main())

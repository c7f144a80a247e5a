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
from pathlib import Path
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
from bridge.streams.plivo import PlivoStreamProtocol
from bridge.streams.telnyx import TelnyxStreamProtocol
from bridge.streams.twilio import TwilioStreamProtocol
from bridge.streams.vonage import VonageStreamProtocol

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


def test_header_of_each_size_on_one_connection() -> None:
    # the shell keeps the last header it built: sizes changing back and forth
    reference = _open_protocol()
    conn, transport = _connection()
    for size in (300, 300, 125, 300, 70_000, 70_000, 126, 300):
        data = b"x" * size
        reference.send_text(data)
        conn.send_encoded_text_nowait(data)
        assert transport.writes[-1] == b"".join(reference.data_to_send())


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


# ------------------------------------------- frame_message: send_frame, not queued

FIXTURES = Path(__file__).parent / "fixtures"


def _streaming(cls: type[MediaStreamProtocol], fixture: str) -> MediaStreamProtocol:
    """A fresh engine fed its fixture's inbound messages up to ``start``."""
    engine = cls()
    engine.connection_made(0.0)
    for line in (FIXTURES / fixture).read_text().splitlines():
        item = json.loads(line)
        if engine.state is StreamState.STREAMING:
            break
        if item["dir"] == "in":
            msg = item["msg"]
            if isinstance(msg, dict) and set(msg) == {"b64"}:
                engine.receive_bytes(base64.b64decode(msg["b64"]), 0.0)
            else:
                engine.receive_text(json.dumps(msg), 0.0)
    assert engine.state is StreamState.STREAMING
    engine.actions_to_send()
    engine.events_received()
    return engine


@pytest.mark.parametrize(
    ("cls", "fixture"),
    [(TwilioStreamProtocol, "twilio_call.jsonl"), (TelnyxStreamProtocol, "telnyx_l16.jsonl")],
)
def test_frame_message_is_the_message_send_frame_queues(
    cls: type[MediaStreamProtocol], fixture: str
) -> None:
    queued, taken = _streaming(cls, fixture), _streaming(cls, fixture)
    size = queued.frame_bytes
    for frame in ((bytes(range(256)) * (size // 256 + 1))[:size], b"\xff" * size, bytes(size)):
        assert queued.send_frame(frame, 0.02)
        (action,) = queued.actions_to_send()
        assert isinstance(action, SendEncodedText)
        assert taken.frame_message(frame) == action.data
        assert taken.actions_to_send() == [] and taken.events_received() == []
        assert taken.sent_ms == queued.sent_ms


def test_frame_message_declines_what_send_frame_would_refuse_or_pack() -> None:
    fresh = TwilioStreamProtocol()
    fresh.connection_made(0.0)
    assert fresh.frame_message(bytes(160)) is None  # before start (send_frame raises)
    engine = _streaming(TwilioStreamProtocol, "twilio_call.jsonl")
    assert engine.frame_message(bytes(159)) is None  # a wrong size (send_frame raises)
    assert engine.sent_ms == 0
    engine.hangup(0.1)
    engine.actions_to_send()
    assert engine.frame_message(bytes(160)) is None  # ended (send_frame returns False)
    assert engine.sent_ms == 0
    # dialects whose frame is not one message of their own: send_frame decides
    for cls, fixture in (
        (ExotelStreamProtocol, "exotel_call.jsonl"),
        (PlivoStreamProtocol, "plivo_call.jsonl"),
        (VonageStreamProtocol, "vonage_call.jsonl"),
    ):
        other = _streaming(cls, fixture)
        assert other.frame_message(bytes(other.frame_bytes)) is None
        assert other.actions_to_send() == [] and other.sent_ms == 0


class _RecordingConn:
    """A connection recording which send the leg used: the per-frame write or a pumped message."""

    def __init__(self) -> None:
        self.conn, self.transport = _connection()
        self.sends: list[str] = []

    def send_encoded_text_nowait(self, data: bytes) -> None:
        self.sends.append("direct")
        self.conn.send_encoded_text_nowait(data)

    def send_text_nowait(self, text: str) -> None:
        self.sends.append("pumped")
        self.conn.send_text_nowait(text)


class _Loop:
    def time(self) -> float:
        return 0.0

    def call_at(self, when: float, callback: Any) -> None:
        raise AssertionError("no engine timer while streaming")


def _no_start(stream: Any, event: Any) -> None:
    raise AssertionError("the stream has started already")


@pytest.mark.parametrize(
    ("cls", "fixture", "direct"),
    [
        (TwilioStreamProtocol, "twilio_call.jsonl", True),
        (TelnyxStreamProtocol, "telnyx_l16.jsonl", True),
        (PlivoStreamProtocol, "plivo_call.jsonl", False),
    ],
)
def test_leg_writes_a_frame_as_the_pumped_send_frame_did(
    cls: type[MediaStreamProtocol], fixture: str, direct: bool
) -> None:
    from bridge.io.legs.stream_call import StreamCall, StreamLeg

    recorder = _RecordingConn()
    engine = _streaming(cls, fixture)
    stream = StreamCall(recorder, engine, _Loop(), lambda: None, _no_start)  # type: ignore[arg-type]
    leg = StreamLeg(stream)
    reference, (ref_conn, ref_transport) = _streaming(cls, fixture), _connection()
    frames = [bytes([i]) * engine.frame_bytes for i in range(3)]
    for i, frame in enumerate(frames):
        leg.send_frame(frame, i, 0.02 * i)
        reference.send_frame(frame, 0.02 * i)  # the engine's queue, pumped by hand
        for action in reference.actions_to_send():
            assert isinstance(action, SendText)
            ref_conn.send_text_nowait(action.text)
    leg.send_frame(None, 3, 0.06)  # nothing due: nothing written
    assert recorder.transport.writes == ref_transport.writes
    assert len(recorder.transport.writes) == 3
    assert recorder.sends == ["direct" if direct else "pumped"] * 3
    assert engine.sent_ms == reference.sent_ms

"""zwst's wire vocabulary, written once for both sides (seed ``004_47f0a1422d27ad55.txt``).

JSON control frames (``{"type": ...}``) in text messages, and binary audio
frames behind a 12-byte header. The client engine (``client.py``) and the
``tts-server`` session (``server.py``) both take from here the paths, the
limits, the close codes, the audio frame header and its codec, and the
message, field and value names (the constants at the end, one per string
both sides write).

Pure: no I/O, no state.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Final, Literal

from bridge.providers.base import AudioEncoding

ByteOrder = Literal["big", "little"]

#: The WebSocket path (seed: ``wss://<gateway>/v1/stream``).
STREAM_PATH = "/v1/stream"
#: The session route. The seed refers to it but never names its path: ours.
SESSION_ROUTE = "/v1/sessions"
#: The only wire format the seed defines (header table: "mono 16-bit
#: little-endian PCM at sample_rate").
WIRE_ENCODING: AudioEncoding = "pcm_s16le"
#: Audio frame header (seed "Audio frame").
FRAME_HEADER_BYTES = 12
FRAME_VERSION = 0x01
FLAG_FINAL = 0x01
MAX_CONTEXT_ORDINAL = 0xFFFF
#: Seed: "Send one every 20 seconds".
PING_INTERVAL_S = 20.0
#: Ours: how long a ping may stay unanswered before the socket counts as dead.
PONG_TIMEOUT_S = 10.0
#: Ours (the seed names the limit, not its value); the embedded server agrees.
MAX_SEGMENT_CHARS = 500
#: Ours: the seed states no context limit; the embedded server's default.
MAX_CONTEXTS = 16

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_POLICY_VIOLATION = 1008
CLOSE_SEGMENT_TOO_LONG = 4003

_HEADER_FORMATS: dict[ByteOrder, struct.Struct] = {
    "big": struct.Struct(">BBHII"),
    "little": struct.Struct("<BBHII"),
}


# ------------------------------------------------------------------ codecs


@dataclass(frozen=True, slots=True)
class AudioFrameHeader:
    """The 12-byte header of a zwst binary audio frame."""

    version: int
    final: bool
    context_ordinal: int
    sequence: int
    pts_ms: int


def pack_frame_header(header: AudioFrameHeader, byte_order: ByteOrder = "big") -> bytes:
    """Serialize a header."""
    flags = FLAG_FINAL if header.final else 0
    return _HEADER_FORMATS[byte_order].pack(
        header.version, flags, header.context_ordinal, header.sequence, header.pts_ms
    )


def unpack_frame_header(data: bytes, byte_order: ByteOrder = "big") -> AudioFrameHeader:
    """Parse the first 12 bytes of ``data``.

    Raises:
        ValueError: fewer than 12 bytes.
    """
    if len(data) < FRAME_HEADER_BYTES:
        raise ValueError(f"audio frame of {len(data)} bytes is shorter than its header")
    version, flags, ordinal, sequence, pts_ms = _HEADER_FORMATS[byte_order].unpack_from(data)
    return AudioFrameHeader(version, bool(flags & FLAG_FINAL), ordinal, sequence, pts_ms)


def dump(frame: dict[str, object]) -> str:
    """One control frame as the text of a message (compact JSON, non-ASCII as is)."""
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


# ------------------------------------------------------------------ frames
# One builder per control frame, for the side that sends it (``dump`` makes the text).

Frame = dict[str, object]


def config(context_id: str, speed: float) -> Frame:
    return {TYPE: CONFIG, CONTEXT_ID: context_id, SPEED: speed}


def synthesize(context_id: str, text: str, segment_mode: str) -> Frame:
    return {TYPE: SYNTHESIZE, CONTEXT_ID: context_id, TEXT: text, SEGMENT_MODE: segment_mode}


def end(context_id: str) -> Frame:
    return {TYPE: END, CONTEXT_ID: context_id}


def cancel(context_id: str) -> Frame:
    return {TYPE: CANCEL, CONTEXT_ID: context_id}


def ping() -> Frame:
    return {TYPE: PING}


def pong() -> Frame:
    return {TYPE: PONG}


def context_start(context_id: str) -> Frame:
    return {TYPE: CONTEXT_START, CONTEXT_ID: context_id}


def segment_start(context_id: str, queue_depth: int) -> Frame:
    return {TYPE: SEGMENT_START, CONTEXT_ID: context_id, QUEUE_DEPTH: queue_depth}


def timestamps(context_id: str, arrays: Frame) -> Frame:
    """``arrays``: ``words`` / ``start`` / ``end``."""
    return {TYPE: TIMESTAMPS, CONTEXT_ID: context_id, **arrays}


def segment_done(context_id: str) -> Frame:
    return {TYPE: SEGMENT_DONE, CONTEXT_ID: context_id}


def context_done(context_id: str) -> Frame:
    return {TYPE: CONTEXT_DONE, CONTEXT_ID: context_id}


def resumed() -> Frame:
    return {TYPE: RESUMED}


def error(context_id: str | None, message: str) -> Frame:
    return {TYPE: ERROR, CONTEXT_ID: context_id, MESSAGE: message}


# ------------------------------------------- message, field and value names
# Every string both sides write: control frame types (``config``,
# ``synthesize``, ``cancel``, ``ping``; ``context_start``, ``segment_start``,
# ``timestamps``, ``segment_done``, ``context_done``, ``error``, ``pong``...),
# their fields, and values such as the segment modes and error codes.

AUTO: Final = "auto"
CANCEL: Final = "cancel"
CONFIG: Final = "config"
CONTEXT_DONE: Final = "context_done"
CONTEXT_ID: Final = "context_id"
CONTEXT_START: Final = "context_start"
END: Final = "end"
ERROR: Final = "error"
FORMAT: Final = "format"
MESSAGE: Final = "message"
NONE: Final = "none"
NORMALIZE_TEXT: Final = "normalize_text"
PING: Final = "ping"
PONG: Final = "pong"
QUEUE_DEPTH: Final = "queue_depth"
RESUMED: Final = "resumed"
SAMPLE_RATE: Final = "sample_rate"
SEGMENT_DONE: Final = "segment_done"
SEGMENT_MODE: Final = "segment_mode"
SEGMENT_START: Final = "segment_start"
SEGMENT_TOO_LONG: Final = "segment_too_long"
SPEED: Final = "speed"
START: Final = "start"
SYNTHESIZE: Final = "synthesize"
TEXT: Final = "text"
TIMESTAMPS: Final = "timestamps"
TYPE: Final = "type"
URL: Final = "url"
VOICE_ID: Final = "voice_id"
WORD_TIMESTAMPS: Final = "word_timestamps"

"""Kova's wire vocabulary, written once for both sides (seed ``000_f43e393e6311affa.txt``).

Frames are JSON objects in text messages; the discriminator key present names
the frame. The client engine (``client.py``) encodes the client frames and
decodes the server's; the ``tts-server`` session (``server.py``) the other
way round. Both import the names, fields, encodings and codecs from here, so
a frame cannot be spelled one way by one side and another way by the other.

Pure: no I/O, no state. Decoding raises ``FrameError`` (a ``ValueError``)
with a message naming what is wrong; each side words its own reply (an event,
an ``error`` frame) around it.
"""

from __future__ import annotations

import json
from typing import Final

from bridge.providers.base import AudioEncoding, AudioFormat, WordTiming
from bridge.providers.client_common import TimingsWording, json_text, parallel_word_timings

__all__ = [
    "AUDIO_CHUNK",
    "CLIENT_FRAMES",
    "CLOSE_CONTEXT",
    "CONTEXT_CLOSED",
    "CONTEXT_ID",
    "CONTEXT_STARTED",
    "ERROR",
    "FLUSH",
    "FLUSH_COMPLETED",
    "FLUSH_ID",
    "SEND_TEXT",
    "SERVER_FRAMES",
    "START_CONTEXT",
    "TIMESTAMPS",
    "FrameError",
    "NotAnObject",
    "NotJson",
    "decode_frame",
    "dump",
]

# ------------------------------------------------------------- frame names

START_CONTEXT: Final = "start_context"
SEND_TEXT: Final = "send_text"
FLUSH: Final = "flush"
CLOSE_CONTEXT: Final = "close_context"
CLIENT_FRAMES: Final = (START_CONTEXT, SEND_TEXT, FLUSH, CLOSE_CONTEXT)
"""Client -> server discriminators, in the order a frame's type is looked for."""

CONTEXT_STARTED: Final = "context_started"
AUDIO_CHUNK: Final = "audio_chunk"
TIMESTAMPS: Final = "timestamps"
FLUSH_COMPLETED: Final = "flush_completed"
CONTEXT_CLOSED: Final = "context_closed"
ERROR: Final = "error"
SERVER_FRAMES: Final = (
    CONTEXT_STARTED,
    AUDIO_CHUNK,
    TIMESTAMPS,
    FLUSH_COMPLETED,
    CONTEXT_CLOSED,
    ERROR,
)
"""Server -> client discriminators, in the order a frame's type is looked for."""

# ------------------------------------------------------------------ fields

CONTEXT_ID: Final = "context_id"
FLUSH_ID: Final = "flush_id"
VOICE_ID: Final = "voice_id"
MODEL_ID: Final = "model_id"
TEMPERATURE: Final = "temperature"
RESPONSE_FORMAT: Final = "response_format"
ENCODING: Final = "encoding"
SAMPLE_RATE: Final = "sample_rate"
BITRATE: Final = "bitrate"
WORDS: Final = "words"
START_SECONDS: Final = "start_seconds"
END_SECONDS: Final = "end_seconds"

# --------------------------------------------------------------- encodings

DEFAULT_SAMPLE_RATE_HZ: Final = 32000
"""PCM's rate when ``response_format`` names none (seed, ``audio_chunk``)."""
G711_SAMPLE_RATE_HZ: Final = 8000
DEFAULT_FORMAT: Final = AudioFormat("pcm_s16le", DEFAULT_SAMPLE_RATE_HZ)

ENCODINGS: Final[dict[str, AudioEncoding]] = {
    "pcm": "pcm_s16le",
    "linear16": "pcm_s16le",
    "mulaw": "mulaw",
    "alaw": "alaw",
}
"""Wire encodings we carry, as the interface names them (``linear16`` is taken to be
the same little-endian int16 PCM as ``pcm``)."""
WIRE_ENCODING: Final[dict[AudioEncoding, str]] = {
    "pcm_s16le": "pcm",
    "mulaw": "mulaw",
    "alaw": "alaw",
}
PCM_ENCODINGS: Final = frozenset({"pcm", "linear16"})
G711_ENCODINGS: Final = frozenset({"mulaw", "alaw"})
UNSUPPORTED_ENCODINGS: Final = frozenset({"mp3", "wav", "opus"})
"""In the seed, but not produced by our server (no encoder shipped)."""

CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_POLICY_VIOLATION: Final = 1008


class FrameError(ValueError):
    """A frame whose shape the seed does not allow; the message says what is wrong."""


class NotJson(FrameError):
    """A text message that is not JSON."""


class NotAnObject(FrameError):
    """JSON, but not an object."""


# ------------------------------------------------------------------ codecs


def dump(frame: dict[str, object]) -> str:
    """One frame as the text of a message (compact JSON, as Kova writes it)."""
    return json.dumps(frame, separators=(",", ":"))


def decode_frame(text: str) -> dict[str, object]:
    """A message's JSON object.

    Raises:
        NotJson: the text is not JSON.
        NotAnObject: it is, but not an object.
    """
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NotJson("invalid JSON") from exc
    if not isinstance(frame, dict):
        raise NotAnObject("not an object")
    return frame


def frame_kinds(frame: dict[str, object], kinds: tuple[str, ...]) -> list[str]:
    """The discriminators of ``kinds`` that ``frame`` carries, in ``kinds``' order."""
    return [k for k in kinds if k in frame]


def with_context(frame: dict[str, object], context_id: str | None) -> dict[str, object]:
    """``frame`` addressed to ``context_id`` (none: the default context)."""
    if context_id is not None:
        frame[CONTEXT_ID] = context_id
    return frame


# client -> server


def start_context(context_id: str, body: dict[str, object]) -> str:
    return dump({START_CONTEXT: body, CONTEXT_ID: context_id})


def start_body(
    voice_id: str,
    model_id: str,
    temperature: float | None,
    timestamps: bool,
    audio_format: AudioFormat,
) -> dict[str, object]:
    """The ``start_context`` object asking for ``audio_format``."""
    body: dict[str, object] = {VOICE_ID: voice_id, MODEL_ID: model_id}
    if temperature is not None:
        body[TEMPERATURE] = temperature
    body[TIMESTAMPS] = timestamps
    body[RESPONSE_FORMAT] = {
        ENCODING: WIRE_ENCODING[audio_format.encoding],
        SAMPLE_RATE: audio_format.sample_rate_hz,
    }
    return body


def send_text(context_id: str, text: str) -> str:
    return dump({SEND_TEXT: text, CONTEXT_ID: context_id})


def flush(context_id: str, flush_id: str) -> str:
    return dump({FLUSH: True, CONTEXT_ID: context_id, FLUSH_ID: flush_id})


def close_context(context_id: str) -> str:
    return dump({CLOSE_CONTEXT: True, CONTEXT_ID: context_id})


# server -> client


def context_started(context_id: str | None, echo: dict[str, object]) -> str:
    return dump(with_context({CONTEXT_STARTED: echo}, context_id))


def audio_chunk(context_id: str | None, b64: str) -> str:
    """``{"audio_chunk": b64, "context_id": id}`` without the JSON encoder scanning the
    base64 text for characters to escape (it has none): the same text, byte for byte."""
    if context_id is None:
        return '{"' + AUDIO_CHUNK + '":"' + b64 + '"}'
    return (
        '{"' + AUDIO_CHUNK + '":"' + b64 + '","' + CONTEXT_ID + '":' + json.dumps(context_id) + "}"
    )


def timestamps(context_id: str | None, arrays: dict[str, object]) -> str:
    """``arrays``: ``words`` / ``start_seconds`` / ``end_seconds``."""
    return dump(with_context({TIMESTAMPS: arrays}, context_id))


def flush_completed(context_id: str | None, flush_id: str) -> str:
    return dump(with_context({FLUSH_COMPLETED: True, FLUSH_ID: flush_id}, context_id))


def context_closed(context_id: str | None) -> str:
    return dump(with_context({CONTEXT_CLOSED: True}, context_id))


def error(message: str, context_id: str | None = None, flush_id: str | None = None) -> str:
    frame: dict[str, object] = with_context({ERROR: message}, context_id)
    if flush_id is not None:
        frame[FLUSH_ID] = flush_id
    return dump(frame)


# ---------------------------------------------------------------- decoders


def format_from_echo(echoed: dict[str, object], asked: AudioFormat) -> AudioFormat | None:
    """The real format from ``context_started.response_format`` (None: unusable)."""
    encoding = ENCODINGS.get(json_text(echoed.get(ENCODING)))
    if encoding is None:
        return None
    rate = echoed.get(SAMPLE_RATE)
    if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0:
        return AudioFormat(encoding, rate)
    if encoding == asked.encoding:
        return asked
    return AudioFormat(encoding, 8000 if encoding != "pcm_s16le" else DEFAULT_SAMPLE_RATE_HZ)


_TIMESTAMPS_WORDING = TimingsWording(
    not_arrays="timestamps needs words, start_seconds and end_seconds arrays",
    lengths_differ="timestamps arrays differ in length",
    bad_entry="timestamps hold a non-string word or a bad time",
)


def decode_timestamps(body: object) -> tuple[WordTiming, ...]:
    """Parallel arrays ``words`` / ``start_seconds`` / ``end_seconds`` to timings.

    Raises:
        FrameError: not an object, arrays missing or of different lengths, a bad entry.
    """
    if not isinstance(body, dict):
        raise FrameError("timestamps is not an object")
    return parallel_word_timings(
        body.get(WORDS),
        body.get(START_SECONDS),
        body.get(END_SECONDS),
        wording=_TIMESTAMPS_WORDING,
        error=FrameError,
    )

"""Coda's wire vocabulary, written once for both sides (seed ``003_e1fb1d1bb580e7a1.txt``).

JSON text frames of the ``rime.v1.json`` subprotocol (proto3 JSON: camelCase
fields, ``Duration`` strings). The client engine (``client.py``) and the
``tts-server`` session (``server.py``) both take from here the subprotocol,
the limits, the error kinds, the close codes, the message and field names
(the constants at the end, one per string both sides write) and the shared
codecs: compact dumping, splitting text to the message budget, ``Duration``
parsing and formatting.

Pure: no I/O, no state.
"""

from __future__ import annotations

import json
from typing import Any, Final

from bridge.providers.client_common import non_negative_seconds

SUBPROTOCOL = "rime.v1.json"
PROTOCOL_VERSION = 1
#: "Incoming message or frame: 64 KiB, including the envelope" (seed, limits).
MAX_MESSAGE_BYTES = 64 * 1024
MAX_CONTEXTS = 16
MAX_CONTEXT_ID_BYTES = 128
SPLIT_STRATEGIES = frozenset(
    {"SPLIT_STRATEGY_ACCUMULATE_SENTENCE", "SPLIT_STRATEGY_NONE", "SPLIT_STRATEGY_SENTENCE"}
)
#: ``error.kind`` -> whether a retry (or another provider) could succeed.
ERROR_KINDS: dict[str, bool] = {
    "invalid_input": False,
    "unauthenticated": False,
    "permission_denied": False,
    "not_found": False,
    "resource_exhausted": True,
    "unavailable": True,
    "timeout": True,
    "internal": True,
}
#: ``timeScaleFactor`` is clamped to this range by the engine (seed).
TIME_SCALE_RANGE = (0.4, 2.5)

# WebSocket close codes we use.
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
# Close codes the seed defines.
CLOSE_UNDECODABLE = 1007
CLOSE_CREDENTIALS = 1008


# ------------------------------------------------------------------ codecs


def dump_message(message: dict[str, Any]) -> str:
    """Serialise one frame compactly (UTF-8 text, no ASCII escaping)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _escaped_len(ch: str) -> int:
    """Bytes ``ch`` takes inside a JSON string written by ``dump_message``."""
    if " " <= ch <= "~" and ch not in '"\\':
        return 1
    return utf8_len(json.dumps(ch, ensure_ascii=False)) - 2


def split_text(text: str, budget_bytes: int) -> list[str]:
    """Cut ``text`` into pieces whose JSON-escaped UTF-8 size is <= ``budget_bytes``.

    A cut is moved back to just after the last whitespace of the piece when
    that whitespace lies in the piece's second half, so words stay whole.
    """
    if budget_bytes < 12:
        raise ValueError("budget_bytes must leave room for one escaped character")
    if utf8_len(json.dumps(text, ensure_ascii=False)) - 2 <= budget_bytes:
        return [text] if text else []
    pieces: list[str] = []
    start = 0
    while start < len(text):
        size = 0
        end = start
        while end < len(text):
            size += _escaped_len(text[end])
            if size > budget_bytes:
                break
            end += 1
        if end < len(text):
            space = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            if space >= start + (end - start) // 2:
                end = space + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def parse_duration_s(value: object) -> float | None:
    """A proto3 JSON ``Duration`` (``"0.080s"``) in seconds; ``None`` if invalid."""
    if isinstance(value, str) and value.endswith("s"):
        try:
            return non_negative_seconds(float(value[:-1]))
        except ValueError:
            return None
    return non_negative_seconds(value)


def format_duration(seconds: float) -> str:
    """Seconds as a proto3 JSON ``Duration``: 0, 3, 6 or 9 fractional digits."""
    nanos_total = round(seconds * 1_000_000_000)
    whole, nanos = divmod(nanos_total, 1_000_000_000)
    if nanos == 0:
        return f"{whole}s"
    if nanos % 1_000_000 == 0:
        return f"{whole}.{nanos // 1_000_000:03d}s"
    if nanos % 1_000 == 0:
        return f"{whole}.{nanos // 1_000:06d}s"
    return f"{whole}.{nanos:09d}s"


# ------------------------------------------- message, field and value names
# Every string both sides write: message payload keys (``config``, ``start``,
# ``text``, ``end``, ``cancel``; ``ready``, ``started``, ``audio``,
# ``timestamps``, ``done``, ``cancelled``, ``error``), their fields
# (proto3 JSON camelCase), formats, split strategies and error kinds.

AUDIO: Final = "audio"
AUDIO_FORMAT: Final = "audioFormat"
AUDIO_PARAMETERS: Final = "audioParameters"
AUDIO_PCM: Final = "audio/pcm"
AUDIO_PCMU: Final = "audio/pcmu"
CANCEL: Final = "cancel"
CANCELLED: Final = "cancelled"
CODA_PARAMETERS: Final = "codaParameters"
CODE: Final = "code"
CONFIG: Final = "config"
CONTEXT_ID: Final = "contextId"
DEFAULTS: Final = "defaults"
DEFAULT_LANGUAGE: Final = "defaultLanguage"
DONE: Final = "done"
ENABLE: Final = "enable"
END: Final = "end"
ERROR: Final = "error"
INVALID_INPUT: Final = "invalid_input"
KIND: Final = "kind"
LANGUAGE: Final = "language"
LANGUAGES: Final = "languages"
LICENSE: Final = "license"
MESSAGE: Final = "message"
PROTOCOL: Final = "protocol"
READY: Final = "ready"
REQUEST_ID: Final = "requestId"
RESOURCE_EXHAUSTED: Final = "resource_exhausted"
SAMPLING_RATE: Final = "samplingRate"
SPANS: Final = "spans"
SPEAKER: Final = "speaker"
SPLIT_STRATEGY: Final = "splitStrategy"
SPLIT_STRATEGY_ACCUMULATE_SENTENCE: Final = "SPLIT_STRATEGY_ACCUMULATE_SENTENCE"
START: Final = "start"
STARTED: Final = "started"
STATUS: Final = "status"
TEXT: Final = "text"
TEXT_LOOKAHEAD_TOKENS: Final = "textLookaheadTokens"
TIMESTAMPS: Final = "timestamps"
TIME_SCALE_FACTOR: Final = "timeScaleFactor"
UNAUTHENTICATED: Final = "unauthenticated"

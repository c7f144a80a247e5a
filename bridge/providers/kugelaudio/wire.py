"""KugelAudio's wire vocabulary, written once for both sides (seed ``001_f88cd5aab3126180.txt``).

JSON text frames over one WebSocket per turn (``/ws/tts/stream``): the
client's config, text, ``flush``, ``update_settings``, ``cancel`` and
``close_socket``; the server's ``generation_started``, ``audio``,
``word_timestamps``, ``chunk_complete``, ``settings_updated``,
``session_closed`` and ``error`` frames. The client engine (``client.py``)
and the ``tts-server`` session (``server.py``) both take from here the path,
the sample rates, the settings a live session may change, the close codes
and the frame, field and error-code names (the constants at the end, one per
string both sides write).

Pure: no I/O, no state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

PATH: Final = "/ws/tts/stream"
SAMPLE_RATES_HZ: Final = frozenset({8000, 16000, 22050, 24000})
UPDATABLE_FIELDS: Final = (
    "cfg_scale",
    "temperature",
    "max_new_tokens",
    "language",
    "normalize",
    "speed",
)
"""Fields ``update_settings`` accepts (seed, "Update Settings Message"), in the order the
server echoes them."""
CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_POLICY_VIOLATION: Final = 1008


def dump(message: dict[str, object]) -> str:
    """One frame as the text of a message (compact JSON)."""
    return json.dumps(message, separators=(",", ":"))


# ------------------------------------------------------------------ frames
# One builder per frame, for the side that sends it (``dump`` makes the text).

Frame = dict[str, object]


def text(value: str) -> Frame:
    return {TEXT: value}


def flush() -> Frame:
    return {FLUSH: True}


def cancel() -> Frame:
    return {CANCEL: True}


def close_socket() -> Frame:
    return {CLOSE_SOCKET: True}


def update_settings(changed: Frame) -> Frame:
    return {UPDATE_SETTINGS: changed}


def generation_started(chunk_id: int, value: str) -> Frame:
    return {GENERATION_STARTED: True, CHUNK_ID: chunk_id, TEXT: value}


def audio(b64: str, idx: int, sample_rate_hz: int, samples: int, chunk_id: int) -> Frame:
    """An ``audio`` frame of PCM s16le (the only encoding our server sends)."""
    return {
        AUDIO: b64,
        ENC: "pcm_s16le",
        IDX: idx,
        SR: sample_rate_hz,
        "samples": samples,
        CHUNK_ID: chunk_id,
    }


def word_timestamps(words: object, chunk_id: int) -> Frame:
    return {WORD_TIMESTAMPS: words, CHUNK_ID: chunk_id}


def interrupted() -> Frame:
    return {INTERRUPTED: True}


def settings_updated(settings: Frame) -> Frame:
    return {SETTINGS_UPDATED: True, SETTINGS: settings}


def final(totals: Mapping[str, object]) -> Frame:
    return {FINAL: True, **totals}


def session_closed(totals: Mapping[str, object], usage: Mapping[str, object]) -> Frame:
    return {SESSION_CLOSED: True, **totals, USAGE: usage}


def error(message: str, error_code: str, code: int) -> Frame:
    return {ERROR: message, ERROR_CODE: error_code, "code": code}


# ------------------------------------------- message, field and value names
# Every string both sides write: frame discriminators and types, config and
# settings fields, and error codes.

API_KEY: Final = "api_key"
AUDIO: Final = "audio"
CANCEL: Final = "cancel"
CFG_SCALE: Final = "cfg_scale"
CHUNK_COMPLETE: Final = "chunk_complete"
CHUNK_ID: Final = "chunk_id"
CLOSE_SOCKET: Final = "close_socket"
DICTIONARY_IDS: Final = "dictionary_ids"
ENC: Final = "enc"
END_MS: Final = "end_ms"
ERROR: Final = "error"
ERROR_CODE: Final = "error_code"
FINAL: Final = "final"
FLUSH: Final = "flush"
FLUSH_TIMEOUT_MS: Final = "flush_timeout_ms"
GENERATION_STARTED: Final = "generation_started"
IDX: Final = "idx"
INTERRUPTED: Final = "interrupted"
LANGUAGE: Final = "language"
MAX_BUFFER_LENGTH: Final = "max_buffer_length"
MAX_NEW_TOKENS: Final = "max_new_tokens"
MODEL_ID: Final = "model_id"
NORMALIZE: Final = "normalize"
PROJECT_ID: Final = "project_id"
SAMPLE_RATE: Final = "sample_rate"
SESSION_CLOSED: Final = "session_closed"
SETTINGS: Final = "settings"
SETTINGS_UPDATED: Final = "settings_updated"
SPEED: Final = "speed"
SR: Final = "sr"
START_MS: Final = "start_ms"
TEMPERATURE: Final = "temperature"
TEXT: Final = "text"
TOTAL_AUDIO_CHUNKS: Final = "total_audio_chunks"
TOTAL_AUDIO_SECONDS: Final = "total_audio_seconds"
TOTAL_TEXT_CHUNKS: Final = "total_text_chunks"
UNAUTHORIZED: Final = "UNAUTHORIZED"
UPDATE_SETTINGS: Final = "update_settings"
USAGE: Final = "usage"
VALIDATION_ERROR: Final = "VALIDATION_ERROR"
VOICE_ID: Final = "voice_id"
WARNING: Final = "warning"
WORD: Final = "word"
WORD_TIMESTAMPS: Final = "word_timestamps"

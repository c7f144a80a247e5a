"""KugelAudio stream-input server session (the provider's side of ``/ws/tts/stream``).

Theory of operation
-------------------
One ``KugelAudioServerSession`` per accepted WebSocket (seed
``001_f88cd5aab3126180.txt``). Client frames are JSON objects told apart by
key; a frame without a command key is a config and/or ``text``/``flush``
frame. One backend session (= one turn) runs at a time::

    IDLE   --text-->  OPEN      config snapshot taken; text buffered
    OPEN   --sentence end / flush_timeout_ms / max_buffer_length--> chunk queued
    OPEN   --flush | close | end_session | close_socket | idle 5 s--> ENDING
    ENDING --last chunk done--> final, session_closed{usage} --> IDLE
    any    --cancel--> CancelSynthesis, buffer dropped, interrupted --> IDLE

Per chunk (``chunk_id`` counts from 0 in each session): ``generation_started``
-> ``Synthesize`` -> ``audio`` frames (``idx`` counts audio frames in the
session) -> ``word_timestamps`` (when asked) -> ``chunk_complete``. Chunks are
synthesised one after another, so audio order is text order.

Rules that keep this module honest:

1. Bad client input never raises: it becomes the error frame of the
   documentation's error page, ``{"error", "error_code", "code"}``, and the
   socket stays open. Only a refused ``api_key`` closes it (1008).
2. Frames that arrive while a session is ENDING (except ``cancel``) are held
   and replayed once ``session_closed`` is out: they belong to the next turn.
3. Word timestamps are milliseconds from the start of the *session's* audio:
   a job's timings (seconds from the start of the job) are offset by the audio
   already sent in the session.
4. Audio is ``pcm_s16le`` only: the seed defines no other ``enc``; an
   ``output_format`` other than ``"pcm_s16le"`` is a VALIDATION_ERROR.
5. Nothing reads a clock: the idle auto-end (5 s) and ``flush_timeout_ms``
   are deadlines from ``next_deadline()``.
"""

from __future__ import annotations

import base64
import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from bridge.engine import CloseConnection, Outbox, SendText
from bridge.providers.base import WordTiming
from bridge.providers.client_common import json_object
from bridge.providers.kugelaudio import wire
from bridge.providers.kugelaudio.wire import (
    CLOSE_POLICY_VIOLATION,
    PATH,
    SAMPLE_RATES_HZ,
    UPDATABLE_FIELDS,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.server_common import byte_chunks, whole_samples

__all__ = ["PATHS", "SESSION", "KugelAudioServerSession"]

logger = logging.getLogger(__name__)

PATHS: tuple[str, ...] = (PATH,)

IDLE_TURN_TIMEOUT_S = 5.0
MAX_AUDIO_FRAME_MS = 200
DEFAULTS: dict[str, object] = {
    wire.MODEL_ID: "kugel-3",
    wire.CFG_SCALE: 2.0,
    wire.TEMPERATURE: None,
    wire.SAMPLE_RATE: 24000,
    wire.NORMALIZE: True,
    wire.LANGUAGE: None,
    wire.WORD_TIMESTAMPS: False,
    wire.FLUSH_TIMEOUT_MS: 500,
    wire.MAX_BUFFER_LENGTH: 10000,
    wire.SPEED: 1.0,
    wire.MAX_NEW_TOKENS: 2048,
}
IDENTITY_FIELDS = frozenset(
    {
        wire.VOICE_ID,
        wire.MODEL_ID,
        wire.SAMPLE_RATE,
        "output_format",
        wire.PROJECT_ID,
        wire.DICTIONARY_IDS,
    }
)
BUSY_ERROR = ("SERVICE_UNAVAILABLE", 503)
"""``error_code`` and ``code`` of a turn refused at capacity (the seed's error table is
not in the document we have; the client treats any code but ``VALIDATION_ERROR`` as
retryable)."""
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")


class _Invalid(ValueError):
    """Client input the protocol refuses; becomes an error frame."""

    def __init__(self, message: str, error_code: str = wire.VALIDATION_ERROR, code: int = 400):
        super().__init__(message)
        self.error_code = error_code
        self.code = code


# --------------------------------------------------------------- validators


Validator = Callable[[str, object], object]


def _number(lo: float, hi: float, clamp: bool = False) -> Validator:
    def check(name: str, value: object) -> object:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _Invalid(f"Invalid request: {name} must be a number")
        if clamp:  # compared before float(): a huge JSON integer overflows a double
            return float(min(max(value, lo), hi))
        if not lo <= value <= hi:
            raise _Invalid(f"Invalid request: {name} must be between {lo} and {hi}")
        return float(value)

    return check


def _integer(
    lo: int | None = None, hi: int | None = None, allowed: frozenset[int] = frozenset()
) -> Validator:
    def check(name: str, value: object) -> object:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(f"Invalid request: {name} must be an integer")
        if allowed and value not in allowed:
            raise _Invalid(f"Invalid request: {name} must be one of {sorted(allowed)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _Invalid(f"Invalid request: {name} must be between {lo} and {hi}")
        return value

    return check


def _of_type(kind: type, label: str) -> Validator:
    def check(name: str, value: object) -> object:
        if not isinstance(value, kind) or (kind is str and not value):
            raise _Invalid(f"Invalid request: {name} must be {label}")
        return value

    return check


def _voice_id(name: str, value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise _Invalid(f"Invalid request: {name} must be an integer or a voice name")
    return str(value)


def _dictionary_ids(name: str, value: object) -> object:
    ok = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
    if not ok:
        raise _Invalid(f"Invalid request: {name} must be a list of integers")
    return value


def _output_format(name: str, value: object) -> object:
    if value != "pcm_s16le":
        raise _Invalid(f"Invalid request: unsupported {name} {value!r} (only pcm_s16le)")
    return value


VALIDATORS: dict[str, Validator] = {
    wire.VOICE_ID: _voice_id,
    wire.MODEL_ID: _of_type(str, "a non-empty string"),
    wire.CFG_SCALE: _number(1.2, 2.5, clamp=True),
    wire.TEMPERATURE: _number(0.0, 1.0),
    wire.SAMPLE_RATE: _integer(allowed=SAMPLE_RATES_HZ),
    wire.NORMALIZE: _of_type(bool, "a boolean"),
    wire.LANGUAGE: _of_type(str, "a non-empty string"),
    wire.WORD_TIMESTAMPS: _of_type(bool, "a boolean"),
    wire.FLUSH_TIMEOUT_MS: _integer(lo=0),
    wire.MAX_BUFFER_LENGTH: _integer(lo=1),
    wire.SPEED: _number(0.8, 1.2),
    wire.MAX_NEW_TOKENS: _integer(1, 2048),
    wire.PROJECT_ID: _integer(),
    wire.DICTIONARY_IDS: _dictionary_ids,
    "output_format": _output_format,
}
COMMAND_KEYS = (wire.CANCEL, wire.UPDATE_SETTINGS, wire.CLOSE_SOCKET, "close", "end_session")


class _State(Enum):
    CONNECTING = "connecting"
    IDLE = "idle"  # no backend session
    OPEN = "open"  # session receiving text
    ENDING = "ending"  # flushed; finishing the queued chunks
    CLOSED = "closed"


@dataclass(slots=True)
class _Job:
    job_id: str
    chunk_id: int
    text: str
    started_at: float
    start_samples: int  # session audio already sent when the job began
    samples: int = 0
    remainder: bytes = b""
    char_cursor: int = 0
    words: list[dict[str, object]] = field(default_factory=list)


@dataclass(slots=True)
class _Session:
    number: int
    settings: dict[str, object]
    voice: str
    sample_rate_hz: int
    last_text_at: float
    buffer: str = ""
    chunks: deque[str] = field(default_factory=deque)
    next_chunk_id: int = 0
    job: _Job | None = None
    close_socket: bool = False
    characters: int = 0
    audio_samples: int = 0
    audio_frames: int = 0
    text_chunks: int = 0


class KugelAudioServerSession(Outbox):
    """Provider side of ``/ws/tts/stream`` (see the module docstring).

    After every call, drain ``actions_to_send()``: ``SendText`` frames,
    ``Synthesize`` / ``CancelSynthesis`` for the shell, ``CloseConnection``.
    """

    protocol_name: ClassVar[str] = "kugelaudio"

    def __init__(self, options: ServerOptions) -> None:
        super().__init__()
        self._options = options
        self._state = _State.CONNECTING
        self._config: dict[str, object] = dict(DEFAULTS)
        self._configured = False
        self._session: _Session | None = None
        self._session_serial = 0
        self._held: deque[dict[str, Any]] = deque()

    # ------------------------------------------------------------ connection

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        """Check ``?api_key=`` when keys are configured (and the path)."""
        self._state = _State.IDLE
        if path not in PATHS:
            self._refuse("Not found", "NOT_FOUND", 404)
        elif self._options.api_keys and query.get(wire.API_KEY) not in self._options.api_keys:
            self._refuse("Unauthorized", wire.UNAUTHORIZED, 401)

    def connection_lost(self, now: float) -> None:
        session = self._session
        if session is not None and session.job is not None:
            self._actions.append(CancelSynthesis(session.job.job_id))
        self._session = None
        self._held.clear()
        self._state = _State.CLOSED

    # ----------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        session = self._session
        if session is None or self._state is not _State.OPEN:
            return None
        deadline = session.last_text_at + IDLE_TURN_TIMEOUT_S
        if session.buffer.strip():
            flush_s = _as_int(session.settings[wire.FLUSH_TIMEOUT_MS]) / 1000.0
            deadline = min(deadline, session.last_text_at + flush_s)
        return deadline

    def handle_timer(self, now: float) -> None:
        session = self._session
        if session is None or self._state is not _State.OPEN:
            return
        if now >= session.last_text_at + IDLE_TURN_TIMEOUT_S:
            self._send(
                {
                    wire.WARNING: "Turn ended after 5s of inactivity. Send "
                    '{"flush": true} to end a turn explicitly — it lowers latency '
                    "and avoids this auto-flush."
                }
            )
            self._end_session(session, now)
            return
        flush_s = _as_int(session.settings[wire.FLUSH_TIMEOUT_MS]) / 1000.0
        if session.buffer.strip() and now >= session.last_text_at + flush_s:
            self._cut_buffer(session)
            self._pump(now)

    # ---------------------------------------------------------------- receive

    def receive_bytes(self, data: bytes, now: float) -> None:
        if self._state not in (_State.CONNECTING, _State.CLOSED):
            self._send_error(_Invalid("Invalid request: binary frames are not accepted"))

    def receive_text(self, text: str, now: float) -> None:
        if self._state in (_State.CONNECTING, _State.CLOSED):
            return
        frame = json_object(text)
        if frame is None:
            self._send_error(_Invalid("Invalid request"))
            return
        self._dispatch(frame, now)

    def _dispatch(self, frame: dict[str, Any], now: float) -> None:
        if self._state is _State.ENDING and wire.CANCEL not in frame:
            self._held.append(frame)  # rule 2
            return
        try:
            command = next((key for key in COMMAND_KEYS if key in frame), None)
            if command is not None:
                if command != wire.UPDATE_SETTINGS and frame[command] is not True:
                    raise _Invalid(f"Invalid request: {command} must be true")
                getattr(self, f"_on_{command}")(frame, now)
            else:
                self._on_config_text_flush(frame, now)
        except _Invalid as exc:
            self._send_error(exc)

    def _on_cancel(self, frame: dict[str, Any], now: float) -> None:
        session = self._session
        if session is not None and session.job is not None:
            self._actions.append(CancelSynthesis(session.job.job_id))
        self._session = None
        self._held.clear()
        self._state = _State.IDLE
        self._send(wire.interrupted())

    def _on_update_settings(self, frame: dict[str, Any], now: float) -> None:
        update = frame[wire.UPDATE_SETTINGS]
        if not isinstance(update, dict):
            raise _Invalid("Invalid request: update_settings must be an object")
        refused = sorted(update.keys() & IDENTITY_FIELDS)
        if refused:
            raise _Invalid(
                f"Invalid request: {', '.join(refused)} cannot be changed with "
                "update_settings; send a config message between turns"
            )
        unknown = sorted(update.keys() - set(UPDATABLE_FIELDS))
        if unknown:
            raise _Invalid(f"Invalid request: unknown setting(s) {', '.join(unknown)}")
        checked = {key: VALIDATORS[key](key, value) for key, value in update.items()}
        self._config.update(checked)  # applies from the next session on
        settings = {key: self._config[key] for key in UPDATABLE_FIELDS}
        self._send(wire.settings_updated(settings))

    def _on_close_socket(self, frame: dict[str, Any], now: float) -> None:
        session = self._session
        if session is None:
            self._close(1000, wire.CLOSE_SOCKET)
            return
        session.close_socket = True
        self._end_session(session, now)

    def _on_close(self, frame: dict[str, Any], now: float) -> None:
        if self._session is not None:
            self._end_session(self._session, now)

    _on_end_session = _on_close

    def _on_config_text_flush(self, frame: dict[str, Any], now: float) -> None:
        config = {key: frame[key] for key in VALIDATORS if key in frame}
        if not config and wire.TEXT not in frame and wire.FLUSH not in frame:
            raise _Invalid("Invalid request")
        if config:
            self._apply_config(config)
        if wire.TEXT in frame:
            self._on_text(frame[wire.TEXT], now)
        if wire.FLUSH in frame:
            if not isinstance(frame[wire.FLUSH], bool):
                raise _Invalid("Invalid request: flush must be a boolean")
            if frame[wire.FLUSH] and self._session is not None:
                self._end_session(self._session, now)

    def _apply_config(self, config: dict[str, object]) -> None:
        checked = {key: VALIDATORS[key](key, value) for key, value in config.items()}
        changes = {k: v for k, v in checked.items() if self._config.get(k) != v}
        if changes and self._state is _State.OPEN:
            raise _Invalid("Invalid request: settings can only change between turns")
        voice = checked.get(wire.VOICE_ID)
        if voice is not None and voice not in self._options.voices:
            raise _Invalid("Voice not found", "NOT_FOUND", 404)
        dictionary_ids = checked.get(wire.DICTIONARY_IDS, [])
        if dictionary_ids:
            if checked.get(wire.PROJECT_ID, self._config.get(wire.PROJECT_ID)) is None:
                raise _Invalid("Invalid request: dictionary_ids requires project_id")
            raise _Invalid("Dictionary not found", "NOT_FOUND", 404)
        self._config.update(checked)
        self._configured = True

    def _on_text(self, text: object, now: float) -> None:
        if not isinstance(text, str):
            raise _Invalid("Invalid request: text must be a string")
        if not self._configured:
            raise _Invalid("Invalid request: send the config message before text")
        if not text:
            return  # not "new text": does not reset the idle timer
        session = self._session or self._open_session(now)
        session.buffer += text
        session.last_text_at = now
        parts = _SENTENCE_END.split(session.buffer)
        session.buffer = parts.pop()
        session.chunks.extend(part for part in parts if part.strip())
        if len(session.buffer) >= _as_int(session.settings[wire.MAX_BUFFER_LENGTH]):
            self._cut_buffer(session)
        self._pump(now)

    # ----------------------------------------------------------- synthesis

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        session, job = self._job(job_id)
        if session is None or job is None:
            return  # cancelled or unknown job: output dropped
        data, job.remainder = whole_samples(job.remainder, pcm)
        frame_bytes = session.sample_rate_hz * MAX_AUDIO_FRAME_MS // 1000 * 2
        for frame in byte_chunks(data, frame_bytes):
            self._send_audio(session, job, frame)
        if session.settings[wire.WORD_TIMESTAMPS]:
            for word in words:
                job.words.append(self._word_entry(session, job, word))

    def synthesis_done(self, job_id: str, now: float) -> None:
        session, job = self._job(job_id)
        if session is None or job is None:
            return
        if job.words:
            self._send(wire.word_timestamps(job.words, job.chunk_id))
        self._send(
            {
                wire.CHUNK_COMPLETE: True,
                wire.CHUNK_ID: job.chunk_id,
                "audio_seconds": round(job.samples / session.sample_rate_hz, 3),
                "gen_ms": round((now - job.started_at) * 1000.0),
            }
        )
        session.job = None
        self._pump(now)

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None:
        logger.warning("! synthesis of job %s failed: %s", job_id, message)
        self._fail_job(job_id, _Invalid("Generation failed", "INTERNAL_ERROR", 500), now)

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """At capacity: ``SERVICE_UNAVAILABLE`` (503), the turn ends as on a failure."""
        self._fail_job(job_id, _Invalid(f"Service unavailable: {message}", *BUSY_ERROR), now)

    def _fail_job(self, job_id: str, error: _Invalid, now: float) -> None:
        session, job = self._job(job_id)
        if session is None or job is None:
            return
        self._send_error(error)
        self._session = None
        self._state = _State.IDLE
        self._replay_held(now)

    # --------------------------------------------------------------- helpers

    def _open_session(self, now: float) -> _Session:
        self._session_serial += 1
        settings = dict(self._config)
        voice = settings.get(wire.VOICE_ID) or self._options.default_voice
        rate_hz = _as_int(settings[wire.SAMPLE_RATE])
        session = _Session(self._session_serial, settings, str(voice), rate_hz, now)
        self._session = session
        self._state = _State.OPEN
        return session

    def _cut_buffer(self, session: _Session) -> None:
        if session.buffer.strip():
            session.chunks.append(session.buffer)
        session.buffer = ""

    def _end_session(self, session: _Session, now: float) -> None:
        self._cut_buffer(session)
        self._state = _State.ENDING
        self._pump(now)

    def _pump(self, now: float) -> None:
        """Start the next chunk; close the session once an ENDING one is empty."""
        session = self._session
        if session is None or session.job is not None:
            return
        if session.chunks:
            self._start_job(session, session.chunks.popleft().strip(), now)
            return
        if self._state is _State.ENDING:
            self._finish_session(session, now)

    def _start_job(self, session: _Session, text: str, now: float) -> None:
        chunk_id = session.next_chunk_id
        session.next_chunk_id += 1
        session.text_chunks += 1
        session.characters += len(text)
        job_id = f"ka{session.number}.{chunk_id}"
        session.job = _Job(job_id, chunk_id, text, now, session.audio_samples)
        self._send(wire.generation_started(chunk_id, text))
        speed = session.settings[wire.SPEED]
        self._actions.append(
            Synthesize(
                job_id,
                text,
                session.voice,
                session.sample_rate_hz,
                float(speed) if isinstance(speed, int | float) else 1.0,
            )
        )

    def _finish_session(self, session: _Session, now: float) -> None:
        audio_seconds = round(session.audio_samples / session.sample_rate_hz, 3)
        totals = {
            wire.TOTAL_AUDIO_SECONDS: audio_seconds,
            wire.TOTAL_TEXT_CHUNKS: session.text_chunks,
            wire.TOTAL_AUDIO_CHUNKS: session.audio_frames,
        }
        self._send(wire.final(totals))
        usage = {
            "audio_seconds": audio_seconds,
            "characters": session.characters,
            "cost_cents": None,  # the local server has no price list
            "cost_unavailable": True,
            "currency": "eur",
            wire.MODEL_ID: session.settings[wire.MODEL_ID],
        }
        self._send(wire.session_closed(totals, usage))
        self._session = None
        self._state = _State.IDLE
        if session.close_socket:
            self._close(1000, wire.CLOSE_SOCKET)
            return
        self._replay_held(now)

    def _replay_held(self, now: float) -> None:
        while self._held and self._state in (_State.IDLE, _State.OPEN):
            self._dispatch(self._held.popleft(), now)

    def _send_audio(self, session: _Session, job: _Job, data: bytes) -> None:
        samples = len(data) // 2
        b64 = base64.b64encode(data).decode("ascii")
        self._send(
            wire.audio(b64, session.audio_frames, session.sample_rate_hz, samples, job.chunk_id)
        )
        session.audio_frames += 1
        session.audio_samples += samples
        job.samples += samples

    def _word_entry(self, session: _Session, job: _Job, word: WordTiming) -> dict[str, object]:
        offset_ms = job.start_samples * 1000.0 / session.sample_rate_hz
        found = job.text.find(word.word, job.char_cursor)
        char_start = found if found >= 0 else None
        if char_start is not None:
            job.char_cursor = char_start + len(word.word)
        return {
            wire.WORD: word.word,
            wire.START_MS: round(offset_ms + word.start_s * 1000.0),
            wire.END_MS: round(offset_ms + word.end_s * 1000.0),
            "char_start": char_start,
            "char_end": None if char_start is None else char_start + len(word.word),
            "score": 1.0,
        }

    def _job(self, job_id: str) -> tuple[_Session | None, _Job | None]:
        session = self._session
        if session is None or session.job is None or session.job.job_id != job_id:
            return None, None
        return session, session.job

    def _refuse(self, message: str, error_code: str, code: int) -> None:
        self._send_error(_Invalid(message, error_code, code))
        self._close(CLOSE_POLICY_VIOLATION, message)

    def _close(self, code: int, reason: str) -> None:
        self._actions.append(CloseConnection(code, reason))
        self._state = _State.CLOSED

    def _send_error(self, exc: _Invalid) -> None:
        self._send(wire.error(str(exc), exc.error_code, exc.code))

    def _send(self, message: dict[str, object]) -> None:
        self._actions.append(SendText(wire.dump(message)))


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0


SESSION = KugelAudioServerSession

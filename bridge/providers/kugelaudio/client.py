"""KugelAudio stream-input client engine (``/ws/tts/stream``, config name ``kugelaudio``).

Theory of operation
-------------------
One engine is one WebSocket to KugelAudio's stream-input endpoint (seed
``001_f88cd5aab3126180.txt``). The protocol has no turn or context ids: the
socket carries **one turn at a time** ("one turn = one backend session"), so
``max_turns = 1`` and the connection pool in the shell reuses a socket for
the next turn once ``ready`` is true again. Frames are JSON text only.

Client frames, and when this engine sends them::

    open_turn   -> config (first turn, or identity/format fields changed)
                   | {"update_settings": {...}} (only generation fields changed)
                   | nothing (same settings: config is sticky per connection)
    send_text   -> {"text": ...}
    end_turn    -> {"flush": true}                    (ends the backend session)
    idle timer  -> {"flush": true} after ``idle_flush_s`` without text, so the
                   server's ~5 s idle auto-flush never races our own flush;
                   the turn goes on: later text opens the next backend session
    cancel      -> {"cancel": true}; every frame is dropped until ``interrupted``
    close       -> {"close_socket": true}; on a connection that never carried a
                   turn (no config sent yet, and the config must be the first
                   message) a plain WebSocket close (1000) instead

Server frames and what they become (one turn, states ``TurnState``)::

    generation_started        -> TurnStarted (once per turn)
    audio {enc, sr, idx...}   -> AudioReceived with AudioFormat(enc, sr)
    word_timestamps           -> WordsTimed, seconds from the start of the turn
    chunk_complete            -> (bookkeeping only)
    warning                   -> the server auto-ended our open session
    final                     -> TurnDone once the last session of the turn ended
    session_closed {usage}    -> UsageReported; the socket is free afterwards
    interrupted               -> TurnDone(cancelled=True) after our cancel
    settings_updated          -> (logged)
    {error, error_code, code} -> TurnFailed (per turn) or ProviderFailed
                                 (UNAUTHORIZED / INSUFFICIENT_CREDITS)

Rules that keep this module honest:

1. Bad remote input never raises. Unparseable frames (not JSON, not an
   object, bad base64, wrong field types) fail the *connection*
   (``ProviderFailed`` + close 1002): without turn ids a lost frame cannot be
   attributed, so the audio stream is no longer trustworthy. Unknown frames
   and binary messages are ignored.
2. After a per-turn failure the engine sends ``cancel`` and drops everything
   until ``interrupted``: that frame is the only boundary the protocol offers
   between one turn's late frames and the next turn's.
3. Word timestamps: the seed does not say whether ``start_ms`` counts from
   the session or from the chunk. A chunk's first word cannot start before
   the chunk's audio did, so times below the chunk's start are read as
   chunk-relative and offset; either way, earlier backend sessions of the
   same turn are added.
4. 8 kHz mu-law/A-law: the seed shows only ``enc: "pcm_s16le"`` and defines
   no ``output_format`` value, so G.711 turns ask for ``sample_rate: 8000``
   PCM (no resampling; the shell only G.711-encodes).
5. ``api_key`` goes only into the URL's query string; it is scrubbed from
   every event message.
6. No clock is read: timers (idle flush, response timeout, cancel
   acknowledgement, close) are data returned by ``next_deadline()``.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from bridge.engine import CloseConnection, LocalProtocolError, Outbox, SendText
from bridge.providers.base import (
    AudioEncoding,
    AudioFormat,
    AudioReceived,
    ConnectionReady,
    ConnectParams,
    HttpRequest,
    OptionType,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    UsageReported,
    WordsTimed,
    WordTiming,
)
from bridge.providers.client_common import b64decode_fast, json_object, scrub_secret
from bridge.providers.kugelaudio import wire
from bridge.providers.kugelaudio.wire import (
    CLOSE_PROTOCOL_ERROR,
    PATH,
    SAMPLE_RATES_HZ,
    UPDATABLE_FIELDS,
)

__all__ = ["ENGINE", "KugelAudioProtocol", "TurnState"]

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATE_HZ = 24000

#: Config fields taken from ``[providers.NAME]`` options or ``TurnSettings.extra``.
OPTION_FIELDS: dict[str, type] = {
    wire.CFG_SCALE: float,
    wire.NORMALIZE: bool,
    wire.FLUSH_TIMEOUT_MS: int,
    wire.MAX_BUFFER_LENGTH: int,
    wire.MAX_NEW_TOKENS: int,
    wire.PROJECT_ID: int,
    wire.DICTIONARY_IDS: list,
}
#: ``enc`` values understood on ``audio`` frames.
ENCODINGS: dict[str, AudioEncoding] = {
    "pcm_s16le": "pcm_s16le",
    "pcm_mulaw": "mulaw",
    "mulaw": "mulaw",
    "pcm_alaw": "alaw",
    "alaw": "alaw",
}
#: Error codes that make the whole connection useless (the key is refused).
CONNECTION_ERROR_CODES = frozenset({wire.UNAUTHORIZED, "INSUFFICIENT_CREDITS"})
#: Error codes another provider or a retry cannot fix.
NON_RETRYABLE_ERROR_CODES = frozenset({wire.VALIDATION_ERROR})
CHUNK_RELATIVE_TOLERANCE_MS = 20.0

#: Server frames by their discriminator key, in the order they are tested.
FRAME_HANDLERS: tuple[tuple[str, str], ...] = (
    (wire.ERROR, "_on_error"),
    (wire.AUDIO, "_on_audio"),
    (wire.WORD_TIMESTAMPS, "_on_word_timestamps"),
    (wire.GENERATION_STARTED, "_on_generation_started"),
    (wire.CHUNK_COMPLETE, "_on_chunk_complete"),
    (wire.FINAL, "_on_final"),
    (wire.SESSION_CLOSED, "_on_session_closed"),
    (wire.INTERRUPTED, "_on_interrupted"),
    (wire.SETTINGS_UPDATED, "_on_settings_updated"),
    (wire.WARNING, "_on_warning"),
)


class TurnState(Enum):
    ACTIVE = "active"  # open_turn called; text may be sent
    ENDED = "ended"  # end_turn called; waiting for the last `final`
    DONE = "done"  # TurnDone emitted; waiting for the last `session_closed`
    CANCELLING = "cancelling"  # cancel sent; dropping frames until `interrupted`
    RESYNC = "resync"  # failed; cancel sent; dropping frames until `interrupted`


class _Conn(Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"  # close_socket sent
    CLOSED = "closed"


_LIVE = (TurnState.ACTIVE, TurnState.ENDED)


class _MalformedFrame(ValueError):
    """A server frame that cannot be understood (caught in ``receive_text``)."""


@dataclass(slots=True)
class _Turn:
    turn_id: str
    state: TurnState
    started: bool = False
    session_open: bool = False  # text sent that no flush / auto-flush has ended yet
    sessions_unfinished: int = 0  # ended sessions still owing `final`
    sessions_unclosed: int = 0  # ended sessions still owing `session_closed`
    session_finalized: bool = False  # the current session already sent `final`
    offset_s: float = 0.0  # audio of earlier backend sessions of this turn
    session_audio_s: float = 0.0
    chunk_start_s: dict[int, float] = field(default_factory=dict)
    next_idx: int = 0
    last_text_at: float = 0.0
    waiting_since: float = 0.0
    cancel_deadline: float = 0.0


class KugelAudioProtocol(Outbox):
    """One ``/ws/tts/stream`` connection, as a sans-I/O engine (see module docstring).

    Engine-only options of ``[providers.NAME]`` (never sent): ``idle_flush_s``
    (4.0; 0 disables), ``response_timeout_s`` (15.0), ``cancel_timeout_s``
    (5.0), ``close_timeout_s`` (5.0), ``sample_rate`` (24000, used when the
    turn's rate is not one KugelAudio offers). Config options sent as-is:
    ``cfg_scale``, ``normalize``, ``flush_timeout_ms``, ``max_buffer_length``,
    ``max_new_tokens``, ``project_id``, ``dictionary_ids`` (``"1,2"``).
    """

    protocol_name: ClassVar[str] = "kugelaudio"
    max_turns: ClassVar[int] = 1

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__()
        self._settings = settings
        self._conn = _Conn.CONNECTING
        self._turn: _Turn | None = None
        self._sticky: dict[str, object] | None = None
        self._close_deadline: float | None = None
        self._idle_flush_s = float(settings.option("idle_flush_s", 4.0))
        self._response_timeout_s = float(settings.option("response_timeout_s", 15.0))
        self._cancel_timeout_s = float(settings.option("cancel_timeout_s", 5.0))
        self._close_timeout_s = float(settings.option("close_timeout_s", 5.0))
        self._fallback_rate_hz = int(settings.option("sample_rate", DEFAULT_SAMPLE_RATE_HZ))

    # ------------------------------------------------------------ connection

    def session_request(self) -> HttpRequest | None:
        return None

    def session_response(self, status: int, body: bytes, now: float) -> None:
        logger.debug("= unexpected session response %d ignored", status)

    def connect_params(self) -> ConnectParams:
        """``<url>/ws/tts/stream?api_key=...`` (the path is added unless present)."""
        parts = urlsplit(self._settings.url)
        path = parts.path.rstrip("/")
        if not path.endswith(PATH):
            path += PATH
        query = parts.query
        if self._settings.api_key:
            extra = urlencode({wire.API_KEY: self._settings.api_key})
            query = f"{query}&{extra}" if query else extra
        return ConnectParams(url=urlunsplit((parts.scheme, parts.netloc, path, query, "")))

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        if self._conn is not _Conn.CONNECTING:
            return
        self._conn = _Conn.OPEN
        self._events.append(ConnectionReady())

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        if self._conn is _Conn.CLOSED:
            return
        we_closed = self._conn is _Conn.CLOSING
        turn_ids = self._unfinished_turn_ids()
        self._conn = _Conn.CLOSED
        self._turn = None
        if turn_ids or not we_closed:
            message = self._redact(f"connection closed (code {code}) {reason}".strip())
            self._events.append(ProviderFailed("connection_closed", message, turn_ids))

    def close(self, now: float) -> None:
        """Send ``close_socket``: the server finishes the open turn, then closes.

        A connection that never carried a turn has sent nothing, and the protocol's
        first message is the config: it is closed with a WebSocket close instead.
        """
        if self._conn is not _Conn.OPEN:
            return
        if self._sticky is None:  # no config sent: nothing else may go first
            self._conn = _Conn.CLOSING
            self._actions.append(CloseConnection(1000, "idle"))
            return
        turn = self._turn
        if turn is not None and turn.state is TurnState.ACTIVE:
            self.end_turn(turn.turn_id, now)
        self._send(wire.close_socket())
        self._conn = _Conn.CLOSING
        if self._turn is None:
            self._actions.append(CloseConnection(1000, wire.CLOSE_SOCKET))
        else:
            self._close_deadline = now + self._close_timeout_s

    @property
    def ready(self) -> bool:
        return self._conn is _Conn.OPEN and self._turn is None

    def open_turns(self) -> int:
        return 0 if self._turn is None else 1

    # --------------------------------------------------------------- commands

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        """Start a turn: sends the config / ``update_settings`` it needs, if any.

        Raises:
            LocalProtocolError: the connection is not ``ready`` (closed, or
                still busy with a turn), or a config option has a bad value.
        """
        if not self.ready:
            raise LocalProtocolError("kugelaudio connection cannot take a turn now")
        config = self._config_for(settings)
        for message in self._settings_messages(config):
            self._send(message)
        self._sticky = config
        self._turn = _Turn(turn_id, TurnState.ACTIVE, waiting_since=now)

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        turn = self._turn
        if turn is None or turn.turn_id != turn_id or turn.state is not TurnState.ACTIVE:
            logger.debug("= text for inactive turn %s dropped", turn_id)
            return
        if not text:
            return
        self._send(wire.text(text))
        turn.session_open = True
        turn.last_text_at = now

    def end_turn(self, turn_id: str, now: float) -> None:
        turn = self._turn
        if turn is None or turn.turn_id != turn_id or turn.state is not TurnState.ACTIVE:
            return
        if turn.session_open:
            self._end_session(turn)
        turn.state = TurnState.ENDED
        turn.waiting_since = now
        self._check_done(turn)

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in: send ``cancel``; nothing more of this turn reaches the caller."""
        turn = self._turn
        if turn is None or turn.turn_id != turn_id or turn.state not in _LIVE:
            return
        self._send(wire.cancel())
        turn.state = TurnState.CANCELLING
        turn.cancel_deadline = now + self._cancel_timeout_s

    # ----------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        deadlines = [self._close_deadline] if self._close_deadline is not None else []
        if self._turn is not None:
            turn_deadline = self._turn_deadline(self._turn)
            if turn_deadline is not None:
                deadlines.append(turn_deadline)
        return min(deadlines, default=None)

    def handle_timer(self, now: float) -> None:
        if self._close_deadline is not None and now >= self._close_deadline:
            self._close_deadline = None
            if self._conn is _Conn.CLOSING:
                self._actions.append(CloseConnection(1000, "close_socket not honoured"))
        turn = self._turn
        if turn is None or self._conn is _Conn.CLOSED:
            return
        deadline = self._turn_deadline(turn)
        if deadline is None or now < deadline:
            return
        if turn.state is TurnState.ACTIVE:
            logger.debug("> idle flush for turn %s", turn.turn_id)
            self._end_session(turn)
        elif turn.state is TurnState.ENDED:
            self._fail_turn(turn, "timeout", "no audio from the provider in time", True, now)
        else:
            self._connection_failed("timeout", "cancel was not acknowledged", 1000)

    def _turn_deadline(self, turn: _Turn) -> float | None:
        """Idle flush (ACTIVE), response timeout (ENDED) or cancel ack (CANCELLING/RESYNC)."""
        if turn.state is TurnState.ACTIVE:
            if turn.session_open and self._idle_flush_s > 0:
                return turn.last_text_at + self._idle_flush_s
            return None
        if turn.state is TurnState.ENDED:
            if self._response_timeout_s > 0:
                return turn.waiting_since + self._response_timeout_s
            return None
        if turn.state in (TurnState.CANCELLING, TurnState.RESYNC):
            return turn.cancel_deadline
        return None

    # ---------------------------------------------------------------- inbound

    def receive_bytes(self, data: bytes, now: float) -> None:
        logger.debug("< binary message (%d bytes) ignored: the protocol is JSON", len(data))

    def receive_text(self, text: str, now: float) -> None:
        if self._conn in (_Conn.CONNECTING, _Conn.CLOSED):
            return
        frame = json_object(text)
        if frame is None:
            self._connection_failed("protocol_error", "frame is not a JSON object")
            return
        for key, handler in FRAME_HANDLERS:
            if key in frame:
                try:
                    getattr(self, handler)(frame, now)
                except _MalformedFrame as exc:
                    self._connection_failed("protocol_error", f"malformed {key} frame: {exc}")
                return
        logger.debug("< unknown frame ignored (keys %s)", sorted(frame))

    def _on_audio(self, frame: dict[str, Any], now: float) -> None:
        turn = self._live_turn(now)
        if turn is None:
            return
        data = _b64(frame[wire.AUDIO])
        enc = _field(frame, wire.ENC, str)
        rate_hz = _field(frame, wire.SR, int)
        chunk_id = _optional_int(frame, wire.CHUNK_ID, 0)
        idx = _optional_int(frame, wire.IDX, turn.next_idx)
        encoding = ENCODINGS.get(enc)
        if encoding is None:
            self._fail_turn(turn, "unsupported_encoding", f"audio enc {enc!r}", False, now)
            return
        audio_format = AudioFormat(encoding, rate_hz)
        if not 0 < rate_hz <= MAX_SAMPLE_RATE_HZ or len(data) % audio_format.bytes_per_sample:
            raise _MalformedFrame(f"{len(data)} bytes of {enc} at {rate_hz} Hz")
        if idx != turn.next_idx:
            logger.warning("< audio idx %d, expected %d", idx, turn.next_idx)
        turn.next_idx = idx + 1
        self._mark_started(turn)
        turn.chunk_start_s.setdefault(chunk_id, turn.session_audio_s)
        turn.session_audio_s += len(data) / audio_format.bytes_per_sample / rate_hz
        if data:
            self._events.append(AudioReceived(turn.turn_id, data, audio_format))

    def _on_word_timestamps(self, frame: dict[str, Any], now: float) -> None:
        turn = self._live_turn(now)
        if turn is None:
            return
        entries = _field(frame, wire.WORD_TIMESTAMPS, list)
        chunk_id = _optional_int(frame, wire.CHUNK_ID, 0)
        parsed = [w for w in (_word(e) for e in entries) if w is not None]
        if not parsed:
            return
        chunk_start_ms = turn.chunk_start_s.get(chunk_id, turn.session_audio_s) * 1000.0
        base_ms = turn.offset_s * 1000.0
        if min(start for _, start, _ in parsed) + CHUNK_RELATIVE_TOLERANCE_MS < chunk_start_ms:
            base_ms += chunk_start_ms  # chunk-relative times (rule 3)
        words = tuple(
            WordTiming(word, (base_ms + start) / 1000.0, (base_ms + end) / 1000.0)
            for word, start, end in parsed
        )
        self._events.append(WordsTimed(turn.turn_id, words))

    def _on_generation_started(self, frame: dict[str, Any], now: float) -> None:
        turn = self._live_turn(now)
        if turn is not None:
            self._mark_started(turn)

    def _on_chunk_complete(self, frame: dict[str, Any], now: float) -> None:
        if self._live_turn(now) is not None:
            logger.debug("< chunk_complete %s", frame.get(wire.CHUNK_ID))

    def _on_final(self, frame: dict[str, Any], now: float) -> None:
        turn = self._live_turn(now)
        if turn is None:
            return
        self._finalize_session(turn)
        self._check_done(turn)

    def _on_session_closed(self, frame: dict[str, Any], now: float) -> None:
        turn = self._turn
        usage = frame.get(wire.USAGE)
        report: dict[str, object] = dict(usage) if isinstance(usage, dict) else {}
        for key in (wire.TOTAL_AUDIO_SECONDS, wire.TOTAL_TEXT_CHUNKS, wire.TOTAL_AUDIO_CHUNKS):
            if key in frame:
                report[key] = frame[key]
        live = turn is not None and turn.state in (*_LIVE, TurnState.DONE)
        self._events.append(UsageReported(turn.turn_id if turn and live else None, report))
        if turn is None or not live:
            return
        if not turn.session_finalized:
            self._finalize_session(turn)
        turn.session_finalized = False
        turn.sessions_unclosed = max(0, turn.sessions_unclosed - 1)
        self._check_done(turn)

    def _on_interrupted(self, frame: dict[str, Any], now: float) -> None:
        turn = self._turn
        if turn is None or turn.state not in (TurnState.CANCELLING, TurnState.RESYNC):
            logger.debug("< unexpected interrupted ignored")
            return
        if turn.state is TurnState.CANCELLING:
            self._events.append(TurnDone(turn.turn_id, cancelled=True))
        self._release()

    def _on_settings_updated(self, frame: dict[str, Any], now: float) -> None:
        logger.debug("< settings_updated %s", frame.get(wire.SETTINGS))

    def _on_warning(self, frame: dict[str, Any], now: float) -> None:
        logger.warning("< provider warning: %s", frame.get(wire.WARNING))
        turn = self._live_turn(now)
        if turn is not None and turn.session_open:
            turn.session_open = False  # the server auto-ended the session we had open
            turn.sessions_unfinished += 1
            turn.sessions_unclosed += 1

    def _on_error(self, frame: dict[str, Any], now: float) -> None:
        message = str(frame.get(wire.ERROR))
        error_code = frame.get(wire.ERROR_CODE)
        kind = error_code if isinstance(error_code, str) else wire.ERROR
        self._sticky = None  # the server may not hold the config we think it holds
        if kind in CONNECTION_ERROR_CODES:
            self._connection_failed(kind, message, 1000)
            return
        turn = self._turn
        if turn is None or turn.state not in _LIVE:
            logger.warning("< error outside a turn: %s %s", kind, self._redact(message))
            return
        self._fail_turn(turn, kind, message, kind not in NON_RETRYABLE_ERROR_CODES, now)

    # ---------------------------------------------------------------- helpers

    def _config_for(self, settings: TurnSettings) -> dict[str, object]:
        rate_hz = settings.audio_format.sample_rate_hz
        if rate_hz not in SAMPLE_RATES_HZ:
            rate_hz = self._fallback_rate_hz
        config: dict[str, object] = {}
        voice = settings.voice or self._settings.voice
        if voice:
            config[wire.VOICE_ID] = int(voice) if voice.isascii() and voice.isdigit() else voice
        model = settings.model or self._settings.model
        if model:
            config[wire.MODEL_ID] = model
        config[wire.SAMPLE_RATE] = rate_hz
        config[wire.WORD_TIMESTAMPS] = settings.word_timestamps
        for key, value in (
            (wire.LANGUAGE, settings.language),
            (wire.SPEED, settings.speed),
            (wire.TEMPERATURE, settings.temperature),
        ):
            if value is not None:
                config[key] = value
        for key, raw in (*self._settings.options, *settings.extra):
            if key in OPTION_FIELDS:
                config[key] = _coerce_option(key, raw)
        return config

    def _settings_messages(self, config: dict[str, object]) -> list[dict[str, object]]:
        """Full config, an ``update_settings`` or nothing (config is sticky)."""
        sticky = self._sticky
        if sticky is None:
            return [config]
        changed = {k: v for k, v in config.items() if k not in sticky or sticky[k] != v}
        if not changed and sticky.keys() == config.keys():
            return []
        if sticky.keys() <= config.keys() and changed.keys() <= set(UPDATABLE_FIELDS):
            return [wire.update_settings(changed)]
        return [config]

    def _end_session(self, turn: _Turn) -> None:
        self._send(wire.flush())
        turn.session_open = False
        turn.sessions_unfinished += 1
        turn.sessions_unclosed += 1

    def _finalize_session(self, turn: _Turn) -> None:
        """The current backend session delivered all its audio (``final``)."""
        turn.offset_s += turn.session_audio_s
        turn.session_audio_s = 0.0
        turn.chunk_start_s.clear()
        turn.next_idx = 0
        turn.session_finalized = True
        turn.sessions_unfinished = max(0, turn.sessions_unfinished - 1)

    def _check_done(self, turn: _Turn) -> None:
        if turn.state is TurnState.ENDED and turn.sessions_unfinished == 0:
            self._mark_started(turn)
            self._events.append(TurnDone(turn.turn_id))
            turn.state = TurnState.DONE
        if turn.state is TurnState.DONE and turn.sessions_unclosed == 0:
            self._release()

    def _mark_started(self, turn: _Turn) -> None:
        if not turn.started:
            turn.started = True
            self._events.append(TurnStarted(turn.turn_id))

    def _release(self) -> None:
        self._turn = None
        if self._conn is _Conn.CLOSING:
            self._close_deadline = None
            self._actions.append(CloseConnection(1000, wire.CLOSE_SOCKET))

    def _live_turn(self, now: float) -> _Turn | None:
        turn = self._turn
        if turn is None or turn.state not in _LIVE:
            return None  # late frame of a cancelled / failed / finished turn
        turn.waiting_since = now
        return turn

    def _unfinished_turn_ids(self) -> tuple[str, ...]:
        turn = self._turn
        if turn is None or turn.state in (TurnState.DONE, TurnState.RESYNC):
            return ()
        return (turn.turn_id,)

    def _fail_turn(self, turn: _Turn, kind: str, message: str, retryable: bool, now: float) -> None:
        self._events.append(TurnFailed(turn.turn_id, kind, self._redact(message), retryable))
        self._send(wire.cancel())
        turn.state = TurnState.RESYNC
        turn.cancel_deadline = now + self._cancel_timeout_s

    def _connection_failed(self, kind: str, message: str, code: int = CLOSE_PROTOCOL_ERROR) -> None:
        turn_ids = self._unfinished_turn_ids()
        self._events.append(ProviderFailed(kind, self._redact(message), turn_ids))
        self._actions.append(CloseConnection(code, kind))
        self._conn = _Conn.CLOSED
        self._turn = None
        self._close_deadline = None

    def _send(self, message: dict[str, object]) -> None:
        self._actions.append(SendText(wire.dump(message)))

    def _redact(self, text: str) -> str:
        return scrub_secret(text, self._settings.api_key)


ENGINE = KugelAudioProtocol

OPTIONS: dict[str, OptionType] = {
    "idle_flush_s": float,
    "response_timeout_s": float,
    "cancel_timeout_s": float,
    "close_timeout_s": float,
    "sample_rate": int,
    "cfg_scale": float,
    "normalize": bool,
    "flush_timeout_ms": int,
    "max_buffer_length": int,
    "max_new_tokens": int,
    "project_id": int,
    "dictionary_ids": str,
}
"""The protocol options of ``[providers.NAME]`` and their types (``bridge.config`` rejects
any other key): the engine's own timers and fallback rate, and ``OPTION_FIELDS`` sent in
the config (``dictionary_ids`` as ``"1,2"``)."""


# ------------------------------------------------------------ field parsing


def _field(frame: dict[str, Any], key: str, kind: type) -> Any:
    value = frame.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _MalformedFrame(f"{key!r} must be {kind.__name__}")
    return value


def _optional_int(frame: dict[str, Any], key: str, default: int) -> int:
    if frame.get(key) is None:
        return default
    value: int = _field(frame, key, int)
    return value


def _b64(value: object) -> bytes:
    if not isinstance(value, str):
        raise _MalformedFrame("'audio' must be a base64 string")
    fast = b64decode_fast(value)
    if fast is not None:
        return fast
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:  # binascii.Error, or non-ASCII characters
        raise _MalformedFrame(f"bad base64 ({exc})") from None


_MAX_WORD_MS = 1e12
"""Word times beyond this (30 years) are not times: the entry is skipped."""
MAX_SAMPLE_RATE_HZ = 384_000
"""Largest ``sr`` an audio frame may name; larger is malformed (and overflowed a float)."""


def _word(entry: object) -> tuple[str, float, float] | None:
    """One ``word_timestamps`` entry as (word, start_ms, end_ms); None if unusable."""
    if not isinstance(entry, dict):
        return None
    word, start, end = entry.get(wire.WORD), entry.get(wire.START_MS), entry.get(wire.END_MS)
    if not isinstance(word, str):
        return None
    if not isinstance(start, int | float) or not isinstance(end, int | float):
        return None
    if isinstance(start, bool) or isinstance(end, bool):
        return None
    if not (abs(start) < _MAX_WORD_MS and abs(end) < _MAX_WORD_MS):
        return None  # a JSON integer too large for a float (OverflowError), or inf
    return word, float(start), float(end)


def _coerce_option(key: str, raw: object) -> object:
    kind = OPTION_FIELDS[key]
    try:
        if kind is list:
            if isinstance(raw, int) and not isinstance(raw, bool):
                return [raw]
            text = str(raw).strip()
            return [int(part) for part in text.split(",") if part.strip()]
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "false"):
                return str(raw).lower() == "true"
            raise ValueError(raw)
        if isinstance(raw, bool):
            raise ValueError(raw)
        return kind(raw)
    except (TypeError, ValueError):
        raise LocalProtocolError(
            f"kugelaudio option {key}={raw!r} is not a {kind.__name__}"
        ) from None

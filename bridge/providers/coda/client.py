"""Coda (Rime) WebSocket TTS client engine (config name ``coda``).

Theory of operation
-------------------
One ``CodaProtocol`` is one WebSocket to ``wss://coda.api.rime.ai/ws`` (seed
``003_e1fb1d1bb580e7a1.txt``), subprotocol ``rime.v1.json``: JSON text
messages, each with exactly one payload key and an optional ``contextId``
(no ``type`` discriminator). The payload is found by *presence*
(``"done" in msg``), never by truthiness: ``{}`` is a valid ``done``.

Connection life::

    connection_made(subprotocol)   must be "rime.v1.json", else ProviderFailed + close 1002
                                   AWAITING_READY (timer: ready_timeout_s)
    ready{protocol: 1}             READY -> ConnectionReady; at most one ``config``
                                   (defaults / authorization / license), before any start
    error without contextId        unauthenticated, permission_denied, unavailable,
                                   internal... -> ProviderFailed + close;
                                   invalid_input -> logged (the seed: "existing
                                   contexts continue"); resource_exhausted -> the
                                   newest turn still waiting for ``started`` fails
    connection_lost                ProviderFailed listing every unfinished turn

Each turn is one *context* with a fresh id (``<n>-<turn_id>``, at most 128
UTF-8 bytes, never ``default``), so a late ``cancel``/``cancelled`` can never
touch the next turn. The life of one context::

    open_turn  -> start (no text)           STREAMING  (input_mode "streaming")
               or nothing yet               PENDING    (input_mode "complete")
    send_text  -> text                      (PENDING: buffered)
    end_turn   -> end                       ENDED      (PENDING: one complete-text start)
    started                                 -> TurnStarted(provider_ref=requestId)
    audio                                   -> AudioReceived (whole samples only)
    done{timestamps}                        -> WordsTimed, TurnDone
    cancel     -> cancel                    CANCELLING: every later frame dropped here
    cancelled / done / error                -> TurnDone(cancelled=True)
    error{contextId}                        -> TurnFailed(kind, retryable by kind)

Rules that keep this module honest:

1. One terminal event per context (``done``, ``cancelled`` or a context
   ``error``); nothing of a context reaches the ``Call`` after it, or after
   ``cancel()``. Frames for unknown contexts are dropped.
2. No frame we send exceeds ``MAX_MESSAGE_BYTES`` (64 KiB, envelope
   included): long text is split over several ``text`` messages (at
   whitespace when possible), and a complete-text ``start`` too big for one
   frame becomes a streaming ``start`` + ``text``... + ``end``.
3. At most ``MAX_CONTEXTS`` (16) contexts are open per socket (``max_turns``);
   a context counts until its terminal frame arrives, cancelled or not.
4. Bad input never raises: invalid JSON, a non-object or a binary frame fail
   the connection (``ProviderFailed``, close 1002); a bad payload of one
   context (undecodable base64) fails only that turn, which is cancelled.
5. The server pings every 30 s and drops a socket after 75 s without pongs;
   the WebSocket library in the shell answers pings. Our own timers are the
   ``ready`` timeout and a per-context response timeout (armed whenever we
   wait on the server: after ``start``, ``end`` and ``cancel``, re-armed by
   every frame of the context; not while a streaming input is idle). Both
   fail the connection.
6. ``api_key`` goes only into the upgrade header (or ``config.authorization``
   with ``auth = "config"``), never into an event or a log line.
"""

from __future__ import annotations

import base64
import binascii
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bridge.engine import CloseConnection, Event, LocalProtocolError, Outbox, SendText
from bridge.providers.base import (
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
    WordsTimed,
    WordTiming,
)
from bridge.providers.client_common import (
    b64decode_fast,
    bearer_headers,
    json_object,
    scrub_secret,
)
from bridge.providers.coda import wire
from bridge.providers.coda.wire import (
    CLOSE_CREDENTIALS,
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_UNDECODABLE,
    ERROR_KINDS,
    MAX_CONTEXT_ID_BYTES,
    MAX_CONTEXTS,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    SUBPROTOCOL,
    TIME_SCALE_RANGE,
    dump_message,
    parse_duration_s,
    split_text,
    utf8_len,
)

__all__ = [
    "DEFAULT_URL",
    "ENGINE",
    "CodaProtocol",
]

logger = logging.getLogger(__name__)

DEFAULT_URL = "wss://coda.api.rime.ai/ws"

# ------------------------------------------------------------------ states


class _Phase(enum.Enum):
    CONNECTING = "connecting"
    AWAITING_READY = "awaiting_ready"
    READY = wire.READY
    CLOSING = "closing"  # close() called, waiting for connection_lost
    CLOSED = "closed"  # ProviderFailed emitted; nothing more happens


class _State(enum.Enum):
    PENDING = "pending"  # complete-text input being collected, nothing sent
    STREAMING = "streaming"  # start sent, input open
    ENDED = "ended"  # all input sent, waiting for done
    CANCELLING = "cancelling"  # cancel sent, waiting for the terminal frame
    ABANDONED = "abandoned"  # already failed towards the Call; waiting silently


_SILENT = (_State.CANCELLING, _State.ABANDONED)


@dataclass(slots=True)
class _Turn:
    turn_id: str
    context_id: str
    audio_format: AudioFormat
    start: dict[str, Any]
    state: _State
    pending_text: list[str] = field(default_factory=list)
    started: bool = False
    carry: bytes = b""
    expect_by: float | None = None


# ------------------------------------------------------------------ engine


class CodaProtocol(Outbox):
    """One WebSocket to Coda, carrying up to 16 turns as contexts.

    After every call (commands, ``receive_*``, ``handle_timer``,
    ``connection_*``) the shell must drain ``actions_to_send()`` and
    ``events_received()``, and re-arm its timer from ``next_deadline()``.

    Provider options (``[providers.NAME]``): ``language``, ``split_strategy``
    (default ``SPLIT_STRATEGY_ACCUMULATE_SENTENCE``), ``text_lookahead_tokens``,
    ``input_mode`` (``streaming`` | ``complete``), ``auth`` (``header`` |
    ``config``), ``license``, ``ready_timeout_s`` (10), ``response_timeout_s``
    (30). ``TurnSettings.extra`` may override ``split_strategy``,
    ``input_mode`` and ``text_lookahead_tokens`` per turn.
    """

    protocol_name: ClassVar[str] = "coda"
    max_turns: ClassVar[int] = MAX_CONTEXTS

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__()
        self._settings = settings
        self._auth_in_config = settings.option("auth", "header") == wire.CONFIG
        self._ready_timeout_s = float(settings.option("ready_timeout_s", 10.0))
        self._response_timeout_s = float(settings.option("response_timeout_s", 30.0))
        self._phase = _Phase.CONNECTING
        self._ready_by: float | None = None
        self._turns: dict[str, _Turn] = {}
        self._by_context: dict[str, _Turn] = {}
        self._next_context = 1
        self.languages: tuple[str, ...] = ()
        """``ready.languages``: the language tags the engine supports."""
        self.default_language = ""
        """``ready.defaultLanguage``, when the deployment sets one."""

    # ---------------------------------------------------------- connection

    def session_request(self) -> HttpRequest | None:
        return None

    def session_response(self, status: int, body: bytes, now: float) -> None:
        """Coda has no session route; nothing to do."""

    def connect_params(self) -> ConnectParams:
        headers = () if self._auth_in_config else bearer_headers(self._settings.api_key)
        url = self._settings.url or DEFAULT_URL
        return ConnectParams(url=url, headers=headers, subprotocols=(SUBPROTOCOL,))

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        if self._phase is not _Phase.CONNECTING:
            return
        if subprotocol != SUBPROTOCOL:
            self._fail(
                "subprotocol",
                f"server negotiated subprotocol {subprotocol!r}, expected {SUBPROTOCOL!r}",
                retryable=False,
                close_code=CLOSE_PROTOCOL_ERROR,
            )
            return
        self._phase = _Phase.AWAITING_READY
        self._ready_by = now + self._ready_timeout_s

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        """The socket is gone: every unfinished turn fails with it.

        After our own ``close()`` with no turn left unfinished this is silent
        (an idle connection the pool closed is no provider error).
        """
        if self._phase is _Phase.CLOSING and all(
            t.state is _State.ABANDONED for t in self._turns.values()
        ):
            self._turns.clear()
            self._by_context.clear()
            self._phase = _Phase.CLOSED
            return
        detail = f"connection closed (code {code}{', ' + reason if reason else ''})"
        if code == CLOSE_CREDENTIALS:
            kind, retryable = wire.UNAUTHENTICATED, False
        elif code == CLOSE_UNDECODABLE:
            kind, retryable = wire.INVALID_INPUT, True
        else:
            kind, retryable = (
                ("closed" if self._phase is _Phase.CLOSING else "connection_lost"),
                True,
            )
        self._fail(kind, detail, retryable, close_code=None)

    @property
    def ready(self) -> bool:
        return self._phase is _Phase.READY

    def open_turns(self) -> int:
        return len(self._turns)

    def close(self, now: float) -> None:
        """Close the socket; the server cancels every active context."""
        if self._phase in (_Phase.CLOSING, _Phase.CLOSED):
            return
        self._phase = _Phase.CLOSING
        self._ready_by = None
        for turn in self._turns.values():
            turn.expect_by = None
        self._actions.append(CloseConnection(CLOSE_NORMAL, ""))

    # ------------------------------------------------------------ commands

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        """Open a context for ``turn_id`` (streaming ``start`` unless complete mode).

        Raises:
            LocalProtocolError: not ready, ``turn_id`` already open, or 16
                contexts already open.
        """
        if not self.ready:
            raise LocalProtocolError("open_turn before the connection is ready")
        if turn_id in self._turns:
            raise LocalProtocolError(f"turn {turn_id!r} is already open")
        if len(self._turns) >= self.max_turns:
            raise LocalProtocolError(f"a Coda connection carries at most {self.max_turns} turns")
        audio_format, audio_parameters = _audio_request(settings)
        turn = _Turn(
            turn_id=turn_id,
            context_id=self._new_context_id(turn_id),
            audio_format=audio_format,
            start=self._start_payload(settings, audio_parameters),
            state=_State.PENDING,
        )
        self._turns[turn_id] = turn
        self._by_context[turn.context_id] = turn
        if self._turn_option(settings, "input_mode", "streaming") != "complete":
            self._send_start(turn, "", now)
            turn.state = _State.STREAMING

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        """Stream ``text`` into the turn (sent unchanged, spaces included)."""
        turn = self._turns.get(turn_id)
        if turn is None or turn.state in _SILENT or not text:
            return  # a turn that already ended or was cancelled: late text is moot
        if turn.state is _State.ENDED:
            raise LocalProtocolError(f"send_text after end_turn on turn {turn_id!r}")
        if turn.state is _State.PENDING:
            turn.pending_text.append(text)
            return
        self._send_text_messages(turn, text)

    def end_turn(self, turn_id: str, now: float) -> None:
        """No more text: send ``end`` (or the complete-text ``start``)."""
        turn = self._turns.get(turn_id)
        if turn is None or turn.state not in (_State.PENDING, _State.STREAMING):
            return
        if turn.state is _State.PENDING:
            text = "".join(turn.pending_text)
            turn.pending_text.clear()
            message = {
                wire.CONTEXT_ID: turn.context_id,
                wire.START: {**turn.start, wire.TEXT: text},
            }
            if text.strip() and utf8_len(dump_message(message)) <= MAX_MESSAGE_BYTES:
                self._send(message)
            else:  # blank or too big for one frame: stream it instead
                self._send_start(turn, "", now)
                self._send_text_messages(turn, text)
                self._send({wire.CONTEXT_ID: turn.context_id, wire.END: {}})
        else:
            self._send({wire.CONTEXT_ID: turn.context_id, wire.END: {}})
        turn.state = _State.ENDED
        turn.expect_by = now + self._response_timeout_s

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in: send ``cancel``; from now on the turn's frames are dropped."""
        turn = self._turns.get(turn_id)
        if turn is None or turn.state in _SILENT:
            return
        if turn.state is _State.PENDING:  # nothing was sent for it yet
            self._forget(turn)
            self._events.append(TurnDone(turn_id, cancelled=True))
            return
        self._send({wire.CONTEXT_ID: turn.context_id, wire.CANCEL: {}})
        turn.state = _State.CANCELLING
        turn.carry = b""
        turn.expect_by = now + self._response_timeout_s

    # -------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        deadlines = [t.expect_by for t in self._turns.values() if t.expect_by is not None]
        if self._ready_by is not None:
            deadlines.append(self._ready_by)
        return min(deadlines, default=None)

    def handle_timer(self, now: float) -> None:
        if self._ready_by is not None and now >= self._ready_by:
            self._fail("timeout", f"no ready within {self._ready_timeout_s:g} s")
            return
        for turn in self._turns.values():
            if turn.expect_by is not None and now >= turn.expect_by:
                self._fail(
                    "timeout",
                    f"no answer for context {turn.context_id!r} "
                    f"within {self._response_timeout_s:g} s",
                )
                return

    # ------------------------------------------------------------- receive

    def receive_text(self, text: str, now: float) -> None:
        if self._phase in (_Phase.CONNECTING, _Phase.CLOSING, _Phase.CLOSED):
            return
        message = json_object(text)
        if message is None:
            self._fail("malformed", "frame is not a JSON object", close_code=CLOSE_PROTOCOL_ERROR)
            return
        context_id = message.get(wire.CONTEXT_ID, "")
        if not isinstance(context_id, str):
            self._fail("malformed", "contextId is not a string", close_code=CLOSE_PROTOCOL_ERROR)
            return
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("< %s", _summary(message))
        if wire.READY in message:
            self._on_ready(message[wire.READY], now)
        elif wire.ERROR in message:
            self._on_error(context_id, message[wire.ERROR], now)
        else:
            self._on_context_frame(context_id, message, now)

    def receive_bytes(self, data: bytes, now: float) -> None:
        if self._phase in (_Phase.CONNECTING, _Phase.CLOSING, _Phase.CLOSED):
            return
        self._fail(
            "malformed",
            f"binary frame ({len(data)} bytes) on the JSON subprotocol",
            close_code=CLOSE_PROTOCOL_ERROR,
        )

    def _on_ready(self, body: object, now: float) -> None:
        if self._phase is not _Phase.AWAITING_READY:
            logger.debug("= duplicate ready ignored")
            return
        body = body if isinstance(body, dict) else {}
        protocol = body.get(wire.PROTOCOL, 0)  # proto3 JSON omits a zero
        if protocol != PROTOCOL_VERSION or isinstance(protocol, bool):
            self._fail(
                "protocol_version",
                f"server speaks protocol {protocol!r}, expected {PROTOCOL_VERSION}",
                retryable=False,
                close_code=CLOSE_PROTOCOL_ERROR,
            )
            return
        languages = body.get(wire.LANGUAGES, [])
        if isinstance(languages, list):
            self.languages = tuple(x for x in languages if isinstance(x, str))
        default_language = body.get(wire.DEFAULT_LANGUAGE, "")
        self.default_language = default_language if isinstance(default_language, str) else ""
        self._phase = _Phase.READY
        self._ready_by = None
        config = self._config_payload()
        if config:
            self._send({wire.CONFIG: config})
        self._events.append(ConnectionReady())

    def _on_context_frame(self, context_id: str, message: dict[str, Any], now: float) -> None:
        key = next((k for k in self._CONTEXT_HANDLERS if k in message), None)
        if key is None:
            logger.debug("= frame without a known payload ignored: %s", sorted(message))
            return
        if self._phase is not _Phase.READY:
            logger.debug("= %s before ready ignored", key)
            return
        turn = self._by_context.get(context_id)
        if turn is None:
            logger.debug("= %s for unknown context %r dropped", key, context_id)
            return
        streaming = turn.state is _State.STREAMING
        turn.expect_by = None if streaming else now + self._response_timeout_s
        self._CONTEXT_HANDLERS[key](self, turn, message[key], now)

    def _on_started(self, turn: _Turn, body: object, now: float) -> None:
        if turn.started:
            return
        turn.started = True
        request_id = body.get(wire.REQUEST_ID, "") if isinstance(body, dict) else ""
        request_id = request_id if isinstance(request_id, str) else ""
        logger.info("coda context %s started, requestId %s", turn.context_id, request_id)
        if turn.state not in _SILENT:
            self._events.append(TurnStarted(turn.turn_id, provider_ref=request_id))

    def _on_audio(self, turn: _Turn, body: object, now: float) -> None:
        if turn.state in _SILENT:
            return
        try:
            if not isinstance(body, str):
                raise ValueError("audio is not a string")
            fast = b64decode_fast(body)
            data = fast if fast is not None else base64.b64decode(body, validate=True)
        except (ValueError, binascii.Error):
            self._abandon(turn, "malformed", "audio payload is not valid base64", now)
            return
        data = turn.carry + data
        width = turn.audio_format.bytes_per_sample
        whole = len(data) - len(data) % width
        data, turn.carry = data[:whole], data[whole:]
        if data:
            self._events.append(AudioReceived(turn.turn_id, data, turn.audio_format))

    def _on_done(self, turn: _Turn, body: object, now: float) -> None:
        if turn.state in _SILENT:
            self._finish(turn, TurnDone(turn.turn_id, cancelled=True))
            return
        if turn.carry:
            logger.warning("coda context %s ended on half a sample", turn.context_id)
        timestamps = body.get(wire.TIMESTAMPS) if isinstance(body, dict) else None
        words = _parse_timestamps(turn.context_id, timestamps)
        if words:
            self._events.append(WordsTimed(turn.turn_id, words))
        self._finish(turn, TurnDone(turn.turn_id))

    def _on_cancelled(self, turn: _Turn, body: object, now: float) -> None:
        if turn.state in _SILENT:
            self._finish(turn, TurnDone(turn.turn_id, cancelled=True))
        else:
            message = "the provider cancelled the context"
            self._finish(turn, TurnFailed(turn.turn_id, wire.CANCELLED, message, retryable=True))

    _CONTEXT_HANDLERS: ClassVar[dict[str, Callable[[CodaProtocol, _Turn, object, float], None]]] = {
        wire.STARTED: _on_started,
        wire.AUDIO: _on_audio,
        wire.DONE: _on_done,
        wire.CANCELLED: _on_cancelled,
    }

    def _on_error(self, context_id: str, body: object, now: float) -> None:
        body = body if isinstance(body, dict) else {}
        kind = body.get(wire.KIND, "")
        kind = kind if isinstance(kind, str) and kind else "unknown"
        text = body.get(wire.MESSAGE, "")
        request_id = body.get(wire.REQUEST_ID, "")
        message = self._scrub(str(text)) + (f" (requestId {request_id})" if request_id else "")
        logger.warning("coda error %s for context %r: %s", kind, context_id, message)
        retryable = ERROR_KINDS.get(kind, True)
        if self._phase is not _Phase.READY:
            self._fail(kind, message, retryable)
        elif context_id:
            turn = self._by_context.get(context_id)
            if turn is None:
                return
            if turn.state in _SILENT:
                self._finish(turn, TurnDone(turn.turn_id, cancelled=True))
            else:
                self._finish(turn, TurnFailed(turn.turn_id, kind, message, retryable))
        elif kind == wire.INVALID_INPUT:
            pass  # e.g. text racing a context's end: the seed says contexts continue
        elif kind == wire.RESOURCE_EXHAUSTED:
            waiting = [t for t in self._turns.values() if not t.started and t.state in _LIVE_SENT]
            if waiting:  # the newest start is the one the server refused
                self._finish(waiting[-1], TurnFailed(waiting[-1].turn_id, kind, message, True))
        else:
            self._fail(kind, message, retryable)

    # ------------------------------------------------------------- helpers

    def _new_context_id(self, turn_id: str) -> str:
        raw = f"{self._next_context}-{turn_id}".encode()[:MAX_CONTEXT_ID_BYTES]
        self._next_context += 1
        return raw.decode("utf-8", "ignore")

    def _turn_option(self, settings: TurnSettings, key: str, default: str) -> str:
        for k, v in settings.extra:
            if k == key:
                return v
        return str(self._settings.option(key, default))

    def _start_payload(
        self, settings: TurnSettings, audio_parameters: dict[str, Any]
    ) -> dict[str, Any]:
        start: dict[str, Any] = {}
        speaker = settings.voice or self._settings.voice
        if speaker:
            start[wire.SPEAKER] = speaker
        language = settings.language or str(self._settings.option("language", ""))
        if language:
            start[wire.LANGUAGE] = language
        if settings.speed is not None and settings.speed > 0:
            low, high = TIME_SCALE_RANGE
            audio_parameters[wire.TIME_SCALE_FACTOR] = min(high, max(low, 1.0 / settings.speed))
        start[wire.AUDIO_PARAMETERS] = audio_parameters
        split = self._turn_option(
            settings, "split_strategy", wire.SPLIT_STRATEGY_ACCUMULATE_SENTENCE
        )
        if split:
            start[wire.SPLIT_STRATEGY] = split
        lookahead = int(self._turn_option(settings, "text_lookahead_tokens", "-1"))
        if lookahead >= 0:
            start[wire.CODA_PARAMETERS] = {wire.TEXT_LOOKAHEAD_TOKENS: lookahead}
        if settings.word_timestamps:
            start[wire.TIMESTAMPS] = {wire.ENABLE: True}
        return start

    def _config_payload(self) -> dict[str, Any]:
        config: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        if self._settings.voice:
            defaults[wire.SPEAKER] = self._settings.voice
        language = str(self._settings.option("language", ""))
        if language:
            defaults[wire.LANGUAGE] = language
        if defaults:
            config[wire.DEFAULTS] = defaults
        if self._auth_in_config and self._settings.api_key:
            config["authorization"] = self._settings.api_key
        license_json = str(self._settings.option("license", ""))
        if license_json:
            config[wire.LICENSE] = license_json
        return config

    def _send_start(self, turn: _Turn, text: str, now: float) -> None:
        self._send({wire.CONTEXT_ID: turn.context_id, wire.START: {**turn.start, wire.TEXT: text}})
        turn.expect_by = now + self._response_timeout_s

    def _send_text_messages(self, turn: _Turn, text: str) -> None:
        envelope = utf8_len(dump_message({wire.CONTEXT_ID: turn.context_id, wire.TEXT: ""}))
        for piece in split_text(text, MAX_MESSAGE_BYTES - envelope):
            self._send({wire.CONTEXT_ID: turn.context_id, wire.TEXT: piece})

    def _send(self, message: dict[str, Any]) -> None:
        text = dump_message(message)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from upstream text
            text = text.encode("utf-8", "replace").decode("utf-8")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("> %s", _summary(message))
        self._actions.append(SendText(text))

    def _abandon(self, turn: _Turn, kind: str, message: str, now: float) -> None:
        """Fail one turn towards the Call and cancel its context on the server."""
        self._events.append(TurnFailed(turn.turn_id, kind, message, retryable=True))
        self._send({wire.CONTEXT_ID: turn.context_id, wire.CANCEL: {}})
        turn.state = _State.ABANDONED
        turn.expect_by = now + self._response_timeout_s

    def _finish(self, turn: _Turn, event: Event) -> None:
        """The context's terminal frame: report once (unless abandoned) and forget it."""
        if turn.state is not _State.ABANDONED:
            self._events.append(event)
        self._forget(turn)

    def _forget(self, turn: _Turn) -> None:
        self._turns.pop(turn.turn_id, None)
        self._by_context.pop(turn.context_id, None)

    def _fail(
        self,
        kind: str,
        message: str,
        retryable: bool = True,
        close_code: int | None = CLOSE_NORMAL,
    ) -> None:
        """The connection is unusable: report every unfinished turn once, close."""
        if self._phase is _Phase.CLOSED:
            return
        if close_code is not None and self._phase is not _Phase.CLOSING:
            self._actions.append(CloseConnection(close_code, kind))
        turn_ids = tuple(t.turn_id for t in self._turns.values() if t.state is not _State.ABANDONED)
        self._events.append(ProviderFailed(kind, self._scrub(message), turn_ids, retryable))
        self._turns.clear()
        self._by_context.clear()
        self._ready_by = None
        self._phase = _Phase.CLOSED

    def _scrub(self, message: str) -> str:
        return scrub_secret(message, self._settings.api_key)


_LIVE_SENT = (_State.STREAMING, _State.ENDED)


def _audio_request(settings: TurnSettings) -> tuple[AudioFormat, dict[str, Any]]:
    """The format we ask for, and its ``audioParameters``.

    mu-law passes through as ``audio/pcmu``; Coda has no A-law, so an A-law
    call gets PCM at the same rate and the Call encodes it.
    """
    rate_hz = settings.audio_format.sample_rate_hz
    if settings.audio_format.encoding == "mulaw":
        return AudioFormat("mulaw", rate_hz), {
            wire.AUDIO_FORMAT: wire.AUDIO_PCMU,
            wire.SAMPLING_RATE: rate_hz,
        }
    return AudioFormat("pcm_s16le", rate_hz), {
        wire.AUDIO_FORMAT: wire.AUDIO_PCM,
        wire.SAMPLING_RATE: rate_hz,
    }


def _parse_timestamps(context_id: str, body: object) -> tuple[WordTiming, ...]:
    """``done.timestamps`` -> word timings (already seconds from the context's start)."""
    if not isinstance(body, dict):
        return ()
    status = body.get(wire.STATUS, {})
    if isinstance(status, dict) and status.get(wire.CODE, 0):
        logger.warning(
            "coda context %s: no word timestamps (status %s: %s)",
            context_id,
            status.get(wire.CODE),
            status.get(wire.MESSAGE, ""),
        )
    spans = body.get(wire.SPANS, [])
    words: list[WordTiming] = []
    for span in spans if isinstance(spans, list) else []:
        if not isinstance(span, dict):
            continue
        start_s = parse_duration_s(span.get(wire.START, "0s"))  # proto3 omits zero
        end_s = parse_duration_s(span.get(wire.END, "0s"))
        text = span.get(wire.TEXT, "")
        if start_s is None or end_s is None or not isinstance(text, str):
            logger.debug("= malformed timestamp span dropped: %r", span)
            continue
        words.append(WordTiming(text, start_s, max(start_s, end_s)))
    return tuple(words)


def _summary(message: dict[str, Any]) -> str:
    """A log line for a frame: audio shown by size, never the credentials."""
    shown: dict[str, Any] = {}
    for key, value in message.items():
        if key == wire.AUDIO and isinstance(value, str):
            shown[key] = f"<{len(value)} b64 chars>"
        elif key == wire.CONFIG and isinstance(value, dict):
            shown[key] = {k: ("***" if k == "authorization" else v) for k, v in value.items()}
        else:
            shown[key] = value
    return dump_message(shown)[:300]


ENGINE = CodaProtocol

OPTIONS: dict[str, OptionType] = {
    "language": str,
    "split_strategy": str,
    "text_lookahead_tokens": int,
    "input_mode": ("streaming", "complete"),
    "auth": ("header", "config"),
    "license": str,
    "ready_timeout_s": float,
    "response_timeout_s": float,
}
"""The protocol options of ``[providers.NAME]`` and their types (``bridge.config`` rejects
any other key)."""

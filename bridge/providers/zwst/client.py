"""zwst gateway streaming client engine (config name ``zwst``).

Theory of operation
-------------------
One ``ZwstProtocol`` is one zwst session: a POST to the *session route* that
returns a connect URL, then one WebSocket to ``/v1/stream`` (seed
``004_47f0a1422d27ad55.txt``). The session properties (``voice_id``,
``format``, ``sample_rate``, ``normalize_text``, ``word_timestamps``) are
query parameters of that URL, so they are fixed for the life of the socket:
**the shell pools zwst connections per (voice, wire format)** and builds one
engine per pool key with ``settings_for(settings, voice, audio_format)``
(``pool_key(settings, turn)`` says which key a turn needs).

The life of a connection::

    session_request()      -> POST {voice_id, format, sample_rate, ...}   SESSION
    session_response(200)  <- {"url": "wss://.../v1/stream?token=...", ...}
    connect_params()       -> that URL
    connection_made()      -> ConnectionReady; ping every 20 s (timer)     OPEN
    close()                -> CloseConnection(1000)                        CLOSING

Turns map one-to-one onto *contexts*. A context exists on the server from its
first ``synthesize``; the client numbers contexts in the order of their first
``synthesize`` (0, 1, 2...), which is the order the server sees them, and that
number is the *context ordinal* of the binary audio frames (the seed says to
route audio by ordinal, not by arrival order). The life of one context::

    open_turn                    (nothing on the wire yet)
    send_text (first)   -> config{speed} (if any), synthesize      ordinal assigned
    context_start       -> TurnStarted
    segment_start       -> QueueDepthChanged (when queue_depth changes)
    audio frame         -> AudioReceived (pcm_s16le at the session rate)
    timestamps          -> WordsTimed (already seconds from the context start)
    end_turn            -> end
    context_done        -> TurnDone                                    forgotten
    cancel              -> cancel; TurnDone(cancelled=True) at once     late frames dropped
    error{context_id}   -> TurnFailed; cancel (frees the slot)         late frames dropped

A turn that never sent text never reached the server: ``end_turn``/``cancel``
finish it locally.

Rules that keep this module honest:

1. Audio frames carry a 12-byte header. The seed gives the field layout but
   not the byte order of the header integers (only the payload is said to be
   little-endian). We read network order (big-endian) and *verify* it on the
   first frames: sequence numbers of a context start at 0 and go up by one, so
   the first frame whose (ordinal, sequence) reads differently in the two
   orders decides. If only the other order makes sense we switch and emit
   ``HeaderByteOrderSwitched``.
2. Bad remote input never raises: invalid JSON, a non-object frame, a known
   frame with invalid fields, a short or wrong-version audio frame, or an odd
   PCM payload fail the connection (``ProviderFailed(kind="protocol_error")``
   and close 1002): a broken peer could otherwise leave a turn waiting
   forever. Unknown frame types and unknown fields are ignored, as the seed
   asks. Frames of a cancelled, failed or finished context are dropped.
3. Close codes: 4003 is ``segment_too_long``; 1008 carries its cause in the
   reason (``slow_reader``, ``invalid_token``...), which becomes the
   ``ProviderFailed.kind``.
4. Limits the seed states: context ordinals are uint16 (at most 65536
   contexts per socket: the engine stops being ``ready`` before that),
   ``segment_mode: "none"`` over the model's input limit kills the socket
   (we only send ``none`` when asked to by config *and* the text is within
   ``max_segment_chars``), heartbeat every 20 s. The seed states no context
   count limit; ``max_turns`` is 16, the embedded server's default.
5. ``api_key`` goes only into the session route's ``Authorization: Bearer``
   header and is scrubbed from every message we surface.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

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
    QueueDepthChanged,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.client_common import (
    TimingsWording,
    bearer_headers,
    json_text,
    parallel_word_timings,
    scrub_secret,
)
from bridge.providers.zwst import wire
from bridge.providers.zwst.wire import (
    CLOSE_NORMAL,
    CLOSE_POLICY_VIOLATION,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_SEGMENT_TOO_LONG,
    FRAME_HEADER_BYTES,
    FRAME_VERSION,
    MAX_CONTEXT_ORDINAL,
    MAX_CONTEXTS,
    MAX_SEGMENT_CHARS,
    PING_INTERVAL_S,
    PONG_TIMEOUT_S,
    SESSION_ROUTE,
    STREAM_PATH,
    WIRE_ENCODING,
    AudioFrameHeader,
    ByteOrder,
    unpack_frame_header,
)

__all__ = [
    "ENGINE",
    "HeaderByteOrderSwitched",
    "ProviderNoticed",
    "ZwstProtocol",
    "pool_key",
    "settings_for",
    "wire_format",
]

logger = logging.getLogger(__name__)


def wire_format(requested: AudioFormat) -> AudioFormat:
    """The format zwst sends for a requested one.

    The seed defines only ``pcm_s16le`` (at any ``sample_rate``), so G.711
    requests get PCM at the same rate: 8 kHz calls still need no resampling,
    only encoding.
    """
    return AudioFormat(WIRE_ENCODING, requested.sample_rate_hz)


def pool_key(settings: ProviderSettings, turn: TurnSettings) -> tuple[str, AudioFormat]:
    """The (voice, wire format) a turn needs; one connection serves one key."""
    return (turn.voice or settings.voice, wire_format(turn.audio_format))


def settings_for(
    settings: ProviderSettings, voice: str, audio_format: AudioFormat
) -> ProviderSettings:
    """``settings`` specialised to one pool key (what a pooled engine is built with)."""
    fmt = wire_format(audio_format)
    options = tuple((k, v) for k, v in settings.options if k != wire.SAMPLE_RATE)
    return replace(
        settings, voice=voice, options=(*options, (wire.SAMPLE_RATE, fmt.sample_rate_hz))
    )


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class HeaderByteOrderSwitched(Event):
    """The audio header only made sense in ``byte_order``; the engine switched to it."""

    byte_order: str
    message: str


@dataclass(frozen=True, slots=True)
class ProviderNoticed(Event):
    """Something worth logging that fails nothing.

    ``kind``: ``resumed`` (the gateway rebound the session to another worker),
    ``error`` (an ``error`` frame naming no open context), ``unknown_ordinal``
    (audio for a context ordinal never assigned).
    """

    kind: str
    message: str
    turn_id: str | None = None


# ------------------------------------------------------------------ engine


class _FrameError(ValueError):
    """A server frame that breaks the seed's rules (becomes a protocol error)."""


@dataclass(slots=True)
class _Context:
    turn_id: str
    context_id: str
    want_words: bool
    speed: float | None
    ordinal: int | None = None  # assigned with the first synthesize
    ended: bool = False
    queue_depth: int | None = None


Handler = Callable[["ZwstProtocol", _Context, dict[str, object]], None]

_SESSION, _OPEN, _CLOSING, _CLOSED = "SESSION", "OPEN", "CLOSING", "CLOSED"


class ZwstProtocol(Outbox):
    """Client side of the zwst gateway (see the module docstring).

    After every call into the engine, drain ``actions_to_send()`` and
    ``events_received()``, then re-arm the timer from ``next_deadline()``.

    Options (``[providers.NAME]`` keys): ``sample_rate`` (Hz, default 8000),
    ``normalize_text`` (default true), ``word_timestamps`` (default true),
    ``segment_mode`` (``auto``/``none``, default ``auto``),
    ``max_segment_chars`` (default 500), ``session_path`` (default
    ``/v1/sessions``).
    """

    protocol_name: ClassVar[str] = "zwst"
    max_turns: ClassVar[int] = MAX_CONTEXTS

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__()
        self._settings = settings
        self._voice = settings.voice
        rate = int(settings.option("sample_rate", 8000))
        self._format = AudioFormat(WIRE_ENCODING, rate)
        self._normalize_text = bool(settings.option("normalize_text", True))
        self._word_timestamps = bool(settings.option("word_timestamps", True))
        self._segment_mode = str(settings.option("segment_mode", "auto"))
        self._max_segment_chars = int(settings.option("max_segment_chars", MAX_SEGMENT_CHARS))
        self._session_path = str(settings.option("session_path", SESSION_ROUTE))
        self._state = _SESSION
        self._connect_url: str | None = None
        self._context_serial = 0
        self._next_ordinal = 0
        self._turns: dict[str, _Context] = {}
        self._by_context: dict[str, _Context] = {}
        self._by_ordinal: dict[int, _Context] = {}
        self._next_sequence: dict[int, int] = {}  # per ordinal, every context ever sent
        self._byte_order: ByteOrder = "big"
        self._byte_order_checked = False
        self._ping_at: float | None = None
        self._pong_due_at: float | None = None

    @property
    def audio_format(self) -> AudioFormat:
        """The wire format of this connection's audio (its pool key's format)."""
        return self._format

    @property
    def voice(self) -> str:
        """The voice of this connection (its pool key's voice)."""
        return self._voice

    # ---------------------------------------------------------- connection

    def session_request(self) -> HttpRequest:
        """The POST to the session route, with the session properties as JSON."""
        body = {
            wire.VOICE_ID: self._voice,
            wire.FORMAT: self._format.encoding,
            wire.SAMPLE_RATE: self._format.sample_rate_hz,
            wire.NORMALIZE_TEXT: self._normalize_text,
            wire.WORD_TIMESTAMPS: self._word_timestamps,
        }
        headers = (("Content-Type", "application/json"), *bearer_headers(self._settings.api_key))
        return HttpRequest(
            method="POST",
            url=_http_url(self._settings.url, self._session_path),
            headers=headers,
            body=json.dumps(body, separators=(",", ":")).encode(),
        )

    def session_response(self, status: int, body: bytes, now: float) -> None:
        """The session route's answer: ``{"url": "wss://.../v1/stream?token=..."}``.

        A refusal or an unusable answer fails the connection
        (``ProviderFailed(kind="session_rejected"|"protocol_error")``).
        """
        if self._state != _SESSION:
            raise LocalProtocolError(f"session_response in state {self._state}")
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            answer = None
        if status != 200:
            detail = ""
            if isinstance(answer, dict):
                detail = f": {answer.get('error', '')} {answer.get('message', '')}".rstrip()
            retryable = status >= 500 or status in (401, 408, 429)
            self._fail_connection(
                "session_rejected", f"session route answered {status}{detail}", retryable=retryable
            )
            return
        url = answer.get(wire.URL) if isinstance(answer, dict) else None
        if not isinstance(url, str) or urlsplit(url).scheme not in ("ws", "wss"):
            self._fail_connection("protocol_error", "session route answer has no ws(s) url")
            return
        self._connect_url = url

    def connect_params(self) -> ConnectParams:
        """The connect URL from the session route (the token is in its query)."""
        if self._connect_url is None:
            raise LocalProtocolError("connect_params() before a successful session_response()")
        return ConnectParams(url=self._connect_url)

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        """The upgrade completed: turns can open; the heartbeat starts."""
        if self._state != _SESSION or self._connect_url is None:
            raise LocalProtocolError(f"connection_made in state {self._state}")
        self._state = _OPEN
        self._ping_at = now + PING_INTERVAL_S
        self._events.append(ConnectionReady())

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        """The socket is gone: every open turn fails with the connection."""
        if self._state == _CLOSED:
            return
        if self._state == _CLOSING and not self._turns:
            self._state = _CLOSED
            return
        kind, retryable = _close_kind(code, reason)
        detail = f"code={code} reason={reason!r}" if code is not None else "no close frame"
        self._fail_connection(kind, f"connection closed ({detail})", retryable=retryable)

    @property
    def ready(self) -> bool:
        return self._state == _OPEN and self._next_ordinal <= MAX_CONTEXT_ORDINAL

    def open_turns(self) -> int:
        return len(self._turns)

    def close(self, now: float) -> None:
        """Close the socket (code 1000); turns still open are failed with it."""
        if self._state in (_CLOSING, _CLOSED):
            return
        if self._turns:
            self._events.append(
                ProviderFailed("closed", "connection closed by the client", self._open_turn_ids())
            )
            self._forget_all()
        self._state = _CLOSING if self._state == _OPEN else _CLOSED
        self._ping_at = self._pong_due_at = None
        if self._state == _CLOSING:
            self._actions.append(CloseConnection(CLOSE_NORMAL, "conversation over"))

    # ------------------------------------------------------------ commands

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        """Register a turn; nothing is sent until its first text.

        A turn that needs another (voice, wire format) than this connection's
        fails at once (``TurnFailed(kind="unsupported_settings")``, so a
        failover chain moves on): the session properties cannot change on a
        socket, which is why the shell pools zwst per ``pool_key``.

        Raises:
            LocalProtocolError: not ready, the turn id is in use, or
                ``max_turns`` turns are open.
        """
        if not self.ready:
            raise LocalProtocolError("open_turn on a connection that is not ready")
        if turn_id in self._turns:
            raise LocalProtocolError(f"turn {turn_id!r} is already open")
        if len(self._turns) >= self.max_turns:
            raise LocalProtocolError(f"{self.max_turns} turns already open on this connection")
        voice, fmt = pool_key(self._settings, settings)
        if (voice, fmt) != (self._voice, self._format):
            message = (
                f"turn wants voice={voice!r} {fmt.encoding}@{fmt.sample_rate_hz}; this zwst "
                f"connection is voice={self._voice!r} "
                f"{self._format.encoding}@{self._format.sample_rate_hz}"
            )
            self._events.append(TurnFailed(turn_id, "unsupported_settings", message))
            return
        self._context_serial += 1
        ctx = _Context(
            turn_id=turn_id,
            context_id=f"c{self._context_serial}",
            want_words=settings.word_timestamps and self._word_timestamps,
            speed=settings.speed,
        )
        self._turns[turn_id] = ctx
        self._by_context[ctx.context_id] = ctx

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        """Queue text on the turn's context (one ``synthesize``).

        A no-op for empty text and for a turn that is no longer open (it may
        have failed or been cancelled meanwhile).

        Raises:
            LocalProtocolError: text after ``end_turn``.
        """
        ctx = self._turns.get(turn_id)
        if ctx is None:
            return
        if ctx.ended:
            raise LocalProtocolError(f"send_text after end_turn on turn {turn_id!r}")
        if not text.strip():
            return
        if ctx.ordinal is None:
            if self._next_ordinal > MAX_CONTEXT_ORDINAL:
                raise LocalProtocolError("context ordinals of this connection are used up")
            ctx.ordinal = self._next_ordinal
            self._next_ordinal += 1
            self._by_ordinal[ctx.ordinal] = ctx
            self._next_sequence[ctx.ordinal] = 0
            if ctx.speed is not None:  # config: only before the context starts
                self._send(wire.config(ctx.context_id, ctx.speed))
        mode = self._segment_mode
        if mode == wire.NONE and len(text) > self._max_segment_chars:
            mode = wire.AUTO  # "none" over the model's limit would close the socket (4003)
        self._send(wire.synthesize(ctx.context_id, text, mode))

    def end_turn(self, turn_id: str, now: float) -> None:
        """No more text for the turn: ``end`` (or ``TurnDone`` at once if it sent none).

        A no-op for a turn already ended or no longer open.
        """
        ctx = self._turns.get(turn_id)
        if ctx is None or ctx.ended:
            return
        ctx.ended = True
        if ctx.ordinal is None:
            self._retire(ctx)
            self._events.append(TurnDone(turn_id))
            return
        self._send(wire.end(ctx.context_id))

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in: ``cancel``, ``TurnDone(cancelled=True)``; late frames are dropped.

        The seed defines no acknowledgement of a cancel, so the turn is done
        as soon as the cancel is queued. Cancelling a finished turn is a no-op.
        """
        ctx = self._turns.get(turn_id)
        if ctx is None:
            return
        if ctx.ordinal is not None:
            self._send(wire.cancel(ctx.context_id))
        self._retire(ctx)
        self._events.append(TurnDone(turn_id, cancelled=True))

    # -------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (self._ping_at, self._pong_due_at) if d is not None]
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        """Send the 20 s ``ping``; fail the connection if a ping went unanswered."""
        if self._pong_due_at is not None and now >= self._pong_due_at:
            self._fail_connection(
                "heartbeat_timeout", f"no pong within {PONG_TIMEOUT_S:g} s", close=True
            )
            return
        if self._ping_at is not None and now >= self._ping_at:
            self._send(wire.ping())
            self._ping_at = now + PING_INTERVAL_S
            if self._pong_due_at is None:
                self._pong_due_at = now + PONG_TIMEOUT_S

    # -------------------------------------------------------------- frames

    def receive_text(self, text: str, now: float) -> None:
        """One JSON frame from the gateway."""
        if self._state not in (_OPEN, _CLOSING):
            return
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError) as exc:
            self._fail_connection("protocol_error", f"invalid JSON frame: {exc}", close=True)
            return
        if not isinstance(frame, dict) or not isinstance(frame.get(wire.TYPE), str):
            self._fail_connection(
                "protocol_error", "frame is not an object with a type", close=True
            )
            return
        kind = frame[wire.TYPE]
        if kind == wire.PONG:
            self._pong_due_at = None
            return
        if kind == wire.RESUMED:
            self._events.append(ProviderNoticed(wire.RESUMED, "session rebound to another worker"))
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            return  # seed: ignore any message type you do not recognise
        try:
            context_id = frame.get(wire.CONTEXT_ID)
            ctx = self._by_context.get(context_id) if isinstance(context_id, str) else None
            if ctx is None:
                if kind == wire.ERROR:
                    message = json_text(frame.get(wire.MESSAGE))
                    self._events.append(ProviderNoticed(wire.ERROR, self._scrub(message)))
                return  # a cancelled / failed / finished context: dropped at the boundary
            handler(self, ctx, frame)
        except _FrameError as exc:
            self._fail_connection("protocol_error", f"invalid {kind} frame: {exc}", close=True)

    def receive_bytes(self, data: bytes, now: float) -> None:
        """One binary audio frame: 12-byte header, then PCM s16le."""
        if self._state not in (_OPEN, _CLOSING):
            return
        if len(data) < FRAME_HEADER_BYTES or data[0] != FRAME_VERSION:
            what = f"{len(data)} bytes" if len(data) < FRAME_HEADER_BYTES else f"version {data[0]}"
            self._fail_connection("protocol_error", f"bad audio frame ({what})", close=True)
            return
        header = self._read_header(data)
        payload = data[FRAME_HEADER_BYTES:]
        if len(payload) % 2:
            self._fail_connection("protocol_error", "odd-length PCM payload", close=True)
            return
        if header.context_ordinal >= self._next_ordinal:
            self._events.append(
                ProviderNoticed("unknown_ordinal", f"audio for ordinal {header.context_ordinal}")
            )
            return
        self._next_sequence[header.context_ordinal] = header.sequence + 1
        ctx = self._by_ordinal.get(header.context_ordinal)
        if ctx is None or not payload:
            return  # late frame of a cancelled / finished context, or an empty final frame
        self._events.append(AudioReceived(ctx.turn_id, payload, self._format))

    def _read_header(self, data: bytes) -> AudioFrameHeader:
        """Parse the header, verifying the byte order on the first telling frame."""
        ours = unpack_frame_header(data, self._byte_order)
        if self._byte_order_checked:
            return ours
        other_order: ByteOrder = "little" if self._byte_order == "big" else "big"
        other = unpack_frame_header(data, other_order)
        if (ours.context_ordinal, ours.sequence) == (other.context_ordinal, other.sequence):
            return ours  # symmetric values (ordinal 0, sequence 0): nothing learnt yet
        if self._plausible(ours):
            self._byte_order_checked = True
            return ours
        if not self._plausible(other):
            return ours  # neither order continues a sequence: decide on a later frame
        self._byte_order_checked = True
        self._byte_order = other_order
        message = (
            f"audio header read {self._byte_order}-endian: sequence {other.sequence} of "
            f"ordinal {other.context_ordinal} (the other order gave {ours.sequence} of "
            f"{ours.context_ordinal})"
        )
        logger.warning("zwst: %s", message)
        self._events.append(HeaderByteOrderSwitched(self._byte_order, message))
        return other

    def _plausible(self, header: AudioFrameHeader) -> bool:
        """Does the header continue its context's sequence 0, 1, 2...?"""
        expected = self._next_sequence.get(header.context_ordinal)
        return expected is not None and header.sequence == expected

    # ------------------------------------------------------ frame handlers

    def _on_context_start(self, ctx: _Context, frame: dict[str, object]) -> None:
        self._events.append(TurnStarted(ctx.turn_id, provider_ref=ctx.context_id))

    def _on_segment_start(self, ctx: _Context, frame: dict[str, object]) -> None:
        depth = frame.get(wire.QUEUE_DEPTH)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise _FrameError("queue_depth is not a non-negative integer")
        if depth != ctx.queue_depth:
            ctx.queue_depth = depth
            self._events.append(QueueDepthChanged(ctx.turn_id, depth))

    def _on_timestamps(self, ctx: _Context, frame: dict[str, object]) -> None:
        words = _parse_timestamps(frame)
        if ctx.want_words and words:
            self._events.append(WordsTimed(ctx.turn_id, words))

    def _on_segment_done(self, ctx: _Context, frame: dict[str, object]) -> None:
        """Nothing to do: the next segment follows seamlessly on the same timeline."""

    def _on_context_done(self, ctx: _Context, frame: dict[str, object]) -> None:
        self._retire(ctx)
        self._events.append(TurnDone(ctx.turn_id))

    def _on_error(self, ctx: _Context, frame: dict[str, object]) -> None:
        message = self._scrub(json_text(frame.get(wire.MESSAGE)))
        self._send(wire.cancel(ctx.context_id))  # free the slot
        self._retire(ctx)
        self._events.append(TurnFailed(ctx.turn_id, "provider_error", message))

    # ------------------------------------------------------------- helpers

    def _send(self, frame: dict[str, object]) -> None:
        self._actions.append(SendText(wire.dump(frame)))

    def _retire(self, ctx: _Context) -> None:
        """Forget a turn; its frames (JSON by context id, audio by ordinal) are dropped."""
        self._turns.pop(ctx.turn_id, None)
        self._by_context.pop(ctx.context_id, None)
        if ctx.ordinal is not None:
            self._by_ordinal.pop(ctx.ordinal, None)

    def _open_turn_ids(self) -> tuple[str, ...]:
        return tuple(self._turns)

    def _forget_all(self) -> None:
        self._turns.clear()
        self._by_context.clear()
        self._by_ordinal.clear()

    def _fail_connection(
        self, kind: str, message: str, *, close: bool = False, retryable: bool = True
    ) -> None:
        if self._state == _CLOSED:
            return
        open_turns = self._open_turn_ids()
        if close and self._state == _OPEN:
            self._actions.append(CloseConnection(CLOSE_PROTOCOL_ERROR, kind))
        self._state = _CLOSED
        self._ping_at = self._pong_due_at = None
        self._forget_all()
        self._events.append(ProviderFailed(kind, self._scrub(message), open_turns, retryable))

    def _scrub(self, message: str) -> str:
        return scrub_secret(message, self._settings.api_key)


_HANDLERS: dict[str, Handler] = {
    wire.CONTEXT_START: ZwstProtocol._on_context_start,
    wire.SEGMENT_START: ZwstProtocol._on_segment_start,
    wire.TIMESTAMPS: ZwstProtocol._on_timestamps,
    wire.SEGMENT_DONE: ZwstProtocol._on_segment_done,
    wire.CONTEXT_DONE: ZwstProtocol._on_context_done,
    wire.ERROR: ZwstProtocol._on_error,
}
"""Frame type -> handler, as functions: a protocol holding its own bound methods
would be a reference cycle, freed only by a full collection."""


ENGINE = ZwstProtocol

OPTIONS: dict[str, OptionType] = {
    "sample_rate": int,
    "normalize_text": bool,
    "word_timestamps": bool,
    "segment_mode": ("auto", "none"),
    "max_segment_chars": int,
    "session_path": str,
}
"""The protocol options of ``[providers.NAME]`` and their types (``bridge.config`` rejects
any other key)."""


# ------------------------------------------------------------ pure helpers


def _http_url(base: str, path: str) -> str:
    """The session route URL on the gateway ``base`` (ws/wss become http/https)."""
    parts = urlsplit(base)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    prefix = parts.path.rstrip("/")
    if prefix.endswith(STREAM_PATH):
        prefix = prefix[: -len(STREAM_PATH)]
    return urlunsplit((scheme, parts.netloc, prefix + path, "", ""))


def _close_kind(code: int | None, reason: str) -> tuple[str, bool]:
    """``ProviderFailed`` kind and retryability for a close code."""
    if code == CLOSE_SEGMENT_TOO_LONG:
        return wire.SEGMENT_TOO_LONG, False
    if code == CLOSE_POLICY_VIOLATION:
        cause = reason.strip()
        return (cause if cause.isidentifier() else "policy_violation"), True
    return "connection_closed", True


_TIMESTAMPS_WORDING = TimingsWording(
    not_arrays="words/start/end are not arrays",
    lengths_differ="words/start/end differ in length",
    bad_entry="a word is not text or a time is not a finite number",
)


def _parse_timestamps(frame: dict[str, object]) -> tuple[WordTiming, ...]:
    """The parallel ``words``/``start``/``end`` arrays (context-relative seconds)."""
    return parallel_word_timings(
        frame.get("words"),
        frame.get(wire.START),
        frame.get(wire.END),
        wording=_TIMESTAMPS_WORDING,
        error=_FrameError,
    )

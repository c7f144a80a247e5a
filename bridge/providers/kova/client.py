"""Kova WebSocket TTS client engine (config name ``kova``).

Theory of operation
-------------------
One ``KovaProtocol`` is one WebSocket to Kova. Frames are JSON objects in text
messages; the presence of a discriminator key (``context_started``,
``audio_chunk``...) names the frame (seed ``000_f43e393e6311affa.txt``).
Many *contexts* share the socket and every frame carries ``context_id``, so
one connection carries up to ``max_turns`` concurrent turns.

Each turn gets its own context id (``c1``, ``c2``... per connection; a turn id
is never reused as a context id, so late frames of a cancelled turn can never
be mistaken for a new turn with the same id). The life of one context::

    open_turn   -> start_context          STARTING   (timer: start_timeout_s)
    context_started                       STREAMING  -> TurnStarted
    send_text   -> send_text              (audio_chunk / timestamps stream in)
    end_turn    -> flush{flush_id}        FLUSHING   (timer: reply_timeout_s, re-armed per frame)
    flush_completed                       -> TurnDone; close_context; CLOSING
    cancel      -> close_context          CLOSING    (late audio dropped here)
    context_closed                        forgotten  (-> TurnDone(cancelled) after a cancel)

Rules that keep this module honest:

1. Ordering (seed "Frame ordering" 1-4): ``audio_chunk``/``timestamps`` before
   ``context_started`` is a remote protocol error for that turn
   (``TurnFailed``); frames after the turn finished or was cancelled are
   dropped at the boundary, never turned into events.
2. A per-context ``error`` frame fails only its turn (``TurnFailed``); the
   socket stays usable, as the seed says. An ``error`` we cannot attribute to
   a context, invalid JSON, a non-object frame, or the socket closing fail the
   connection (``ProviderFailed`` listing every open turn).
3. Unknown frame types (valid JSON objects without a known discriminator) and
   binary messages are ignored.
4. Audio is reported in its real format: the one echoed by
   ``context_started.response_format`` when present, else the one we asked
   for. G.711 calls ask for ``mulaw``/``alaw`` at 8000 Hz so audio passes
   through untouched. PCM chunks are re-cut on whole samples.
5. ``api_key`` goes only into the ``Authorization: Bearer`` header of the
   upgrade and is scrubbed from every message we surface.
6. The seed defines no heartbeat frame and no size or context limits; the
   only timers are ours (reply timeouts), exposed through
   ``next_deadline()``/``handle_timer(now)``.

Cost: a turn's audio is a burst of frames (one ``audio_chunk`` and one
``timestamps`` per word), so the per-frame path is kept short. An
``audio_chunk`` frame in the compact shape the reference server and Kova
send (``{"audio_chunk":"<base64>","context_id":"<id>"}``, no whitespace, no
escapes) is taken apart without the JSON parser and its base64 decoded once,
straight to bytes; anything else, and any doubt (an escape, bad base64, an
unknown or unstarted context), goes through the full parse, so both paths
give the same events. The earliest deadline comes from a heap of the
deadlines as they were set (entries a context has moved away from are dropped
when they reach the top), not from a scan of every context per frame.
"""

from __future__ import annotations

import base64
import heapq
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from bridge.engine import CloseConnection, Event, LocalProtocolError, Outbox, SendText
from bridge.providers.base import (
    AudioEncoding,
    AudioFormat,
    AudioPiece,
    AudioReceived,
    ConnectionReady,
    ConnectParams,
    HttpRequest,
    OptionType,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnPiece,
    TurnSettings,
    TurnStarted,
    WordsTimed,
    WordTiming,
)
from bridge.providers.client_common import (
    TimingsWording,
    b64decode_fast,
    bearer_headers,
    json_text,
    parallel_word_timings,
    scrub_secret,
)

__all__ = ["ENGINE", "KovaProtocol"]

logger = logging.getLogger(__name__)

#: Default audio when no ``response_format`` is set (seed, ``audio_chunk``).
DEFAULT_FORMAT = AudioFormat("pcm_s16le", 32000)

#: Kova encodings we can carry, mapped to the interface's names. ``linear16``
#: is taken to be the same little-endian int16 PCM as ``pcm``.
ENCODINGS: dict[str, AudioEncoding] = {
    "pcm": "pcm_s16le",
    "linear16": "pcm_s16le",
    "mulaw": "mulaw",
    "alaw": "alaw",
}
WIRE_ENCODING: dict[AudioEncoding, str] = {"pcm_s16le": "pcm", "mulaw": "mulaw", "alaw": "alaw"}

CLOSE_PROTOCOL_ERROR = 1002

_AUDIO_HEAD = '{"audio_chunk":"'
_AUDIO_HEAD_LEN = len(_AUDIO_HEAD)
_AUDIO_MID = '","context_id":"'
_AUDIO_MID_LEN = len(_AUDIO_MID)
_AUDIO_TAIL = '"}'


class _KovaFrameError(ValueError):
    """A known frame whose fields do not match the seed's shapes."""


@dataclass(slots=True)
class _Context:
    """One Kova context, i.e. one turn on the wire."""

    turn_id: str
    context_id: str
    audio_format: AudioFormat
    started: bool = False
    flush_id: str | None = None
    closing: bool = False
    finished: bool = False
    cancelled: bool = False
    deadline_at: float | None = None
    remainder: bytes = b""
    heap_at: float | None = None  # when its live entry in the deadline heap is due
    heap_serial: int = 0  # which entry that is (older ones of the context are stale)


Handler = Callable[["KovaProtocol", _Context, dict[str, object], float], None]


class KovaProtocol(Outbox):
    """Client side of Kova's WebSocket frames (see the module docstring).

    After every call into the engine, drain ``actions_to_send()`` and
    ``events_received()``, then re-arm the timer from ``next_deadline()``.
    """

    protocol_name: ClassVar[str] = "kova"
    max_turns: ClassVar[int] = 64

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__()
        self._settings = settings
        self._start_timeout_s = float(settings.option("start_timeout_s", 10.0))
        self._reply_timeout_s = float(settings.option("reply_timeout_s", 10.0))
        self._close_timeout_s = float(settings.option("close_timeout_s", 5.0))
        self._forced_format = _forced_format(settings)
        self._ready = False
        self._failed = False
        self._closing = False
        self._context_serial = 0
        self._flush_serial = 0
        self._contexts: dict[str, _Context] = {}
        self._turns: dict[str, _Context] = {}
        self._deadlines: list[tuple[float, int, _Context]] = []
        """A heap of (deadline, serial, context): each context's live entry is at or
        before its deadline (a deadline that moves later leaves its entry where it
        is, to be moved when it reaches the top); superseded entries and those of
        forgotten contexts are dropped when they reach the top."""
        self._deadline_serial = 0

    # ---------------------------------------------------------- connection

    def session_request(self) -> HttpRequest | None:
        """Kova has no session route: the WebSocket is opened directly."""
        return None

    def session_response(self, status: int, body: bytes, now: float) -> None:
        """Never called for Kova (``session_request()`` is ``None``)."""

    def connect_params(self) -> ConnectParams:
        """URL from config; the api key as ``Authorization: Bearer`` (see docs)."""
        return ConnectParams(url=self._settings.url, headers=bearer_headers(self._settings.api_key))

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        """The upgrade completed; Kova has no handshake frame, so turns can open."""
        self._ready = True
        self._events.append(ConnectionReady())

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        """The socket is gone: every open turn fails with the connection.

        After our own ``close()`` with no turn left open this is silent.
        """
        if self._closing and not self._live_contexts():
            self._failed = True
        if not self._failed:
            detail = f"code={code} reason={reason!r}" if code is not None else "no close frame"
            self._fail_connection("connection_closed", f"connection closed ({detail})")
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready and not self._failed

    def open_turns(self) -> int:
        """Contexts held on the server, including ones still being closed."""
        return len(self._contexts)

    def close(self, now: float) -> None:
        """Release every context politely, then close the socket (code 1000)."""
        for ctx in list(self._contexts.values()):
            if not ctx.closing:
                self._send_close_context(ctx, now)
        self._actions.append(CloseConnection(1000, "client closing"))
        self._ready = False
        self._closing = True

    # ------------------------------------------------------------ commands

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        """Send ``start_context`` for a new turn.

        Raises:
            LocalProtocolError: not ready, the turn id is in use, or
                ``max_turns`` contexts are already held.
        """
        if not self.ready:
            raise LocalProtocolError("kova connection is not ready")
        if turn_id in self._turns or any(c.turn_id == turn_id for c in self._live_contexts()):
            raise LocalProtocolError(f"turn {turn_id!r} is already open")
        if len(self._contexts) >= self.max_turns:
            raise LocalProtocolError("kova connection has no free context")
        self._context_serial += 1
        fmt = self._forced_format or _requested_format(settings)
        ctx = _Context(turn_id, f"c{self._context_serial}", fmt)
        self._contexts[ctx.context_id] = ctx
        self._set_deadline(ctx, now + self._start_timeout_s)
        self._turns[turn_id] = ctx
        self._send(
            {
                "start_context": self._start_body(settings, ctx.audio_format),
                "context_id": ctx.context_id,
            }
        )

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        """Send ``send_text``; a no-op for empty text or a turn already ended.

        Raises:
            LocalProtocolError: text after ``end_turn``.
        """
        ctx = self._turns.get(turn_id)
        if ctx is None or not text:
            return
        if ctx.flush_id is not None:
            raise LocalProtocolError(f"turn {turn_id!r} already ended")
        self._send({"send_text": text, "context_id": ctx.context_id})

    def end_turn(self, turn_id: str, now: float) -> None:
        """Send ``flush`` with a fresh ``flush_id``; ``TurnDone`` follows ``flush_completed``."""
        ctx = self._turns.get(turn_id)
        if ctx is None or ctx.flush_id is not None:
            return
        self._flush_serial += 1
        ctx.flush_id = f"f{self._flush_serial}"
        if ctx.started:
            self._set_deadline(ctx, now + self._reply_timeout_s)
        self._send({"flush": True, "context_id": ctx.context_id, "flush_id": ctx.flush_id})

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in: send ``close_context`` and drop the turn's late frames.

        ``TurnDone(cancelled=True)`` follows ``context_closed`` (or the close
        timeout). Cancelling a finished or unknown turn does nothing.
        """
        ctx = self._turns.pop(turn_id, None)
        if ctx is None:
            return
        ctx.cancelled = True
        ctx.remainder = b""
        self._send_close_context(ctx, now)

    # -------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        heap, contexts = self._deadlines, self._contexts
        while heap:
            at, serial, ctx = heap[0]
            if serial != ctx.heap_serial or contexts.get(ctx.context_id) is not ctx:
                heapq.heappop(heap)  # superseded, or the context is forgotten
                continue
            due = ctx.deadline_at
            if due == at:
                return at
            if due is None:  # cleared since
                heapq.heappop(heap)
                ctx.heap_at = None
                continue
            # moved later since (a reply timeout re-armed by every frame): the entry follows
            self._deadline_serial += 1
            ctx.heap_at, ctx.heap_serial = due, self._deadline_serial
            heapq.heapreplace(heap, (due, self._deadline_serial, ctx))
        return None

    def _set_deadline(self, ctx: _Context, at: float | None) -> None:
        """Move ``ctx``'s deadline; ``next_deadline()`` finds the earliest in the heap.

        A deadline at or after the context's entry in the heap touches only
        the context (the entry moves when it reaches the top): the reply
        timeout every frame of a flushed turn pushes later costs no heap push.
        """
        ctx.deadline_at = at
        if at is None:
            return
        heap_at = ctx.heap_at
        if heap_at is not None and heap_at <= at:
            return
        heap, contexts = self._deadlines, self._contexts
        if len(heap) > 4 * len(contexts) + 64:  # many superseded entries: rebuild
            heap[:] = [
                e
                for e in heap
                if e[1] == e[2].heap_serial and contexts.get(e[2].context_id) is e[2]
            ]
            heapq.heapify(heap)
        self._deadline_serial += 1
        ctx.heap_at, ctx.heap_serial = at, self._deadline_serial
        heapq.heappush(heap, (at, self._deadline_serial, ctx))

    def handle_timer(self, now: float) -> None:
        """Expire contexts whose reply did not come in time."""
        for ctx in list(self._contexts.values()):
            if ctx.deadline_at is None or ctx.deadline_at > now:
                continue
            if ctx.closing:
                self._forget(ctx)
                if not ctx.finished:
                    self._finish(ctx, TurnDone(ctx.turn_id, cancelled=True))
            elif not ctx.started:
                self._fail_turn(ctx, "timeout", "no context_started in time", now)
            else:
                self._fail_turn(ctx, "timeout", "no frame for the flushed context in time", now)

    # ------------------------------------------------------------- receive

    def receive_text(self, text: str, now: float) -> None:
        """Parse one server frame; bad input becomes an event, never an exception."""
        if self._failed:
            return
        if text.startswith(_AUDIO_HEAD):
            piece = self._fast_audio_chunk(text, now)
            if piece is True:
                return
            if piece is not False:
                self._events.append(AudioReceived(*piece))
                return
        self._parse(text, now)

    def receive_text_fast(self, text: str, now: float) -> TurnPiece | None:
        """``receive_text``, but a plain audio chunk or timestamps frame is returned, not queued.

        With nothing queued (no event, no action): an ``audio_chunk`` in the
        compact shape for a streaming context comes back as ``(turn_id,
        audio, audio_format)``, exactly what ``receive_text`` would have
        queued as ``AudioReceived``; a frame whose whole outcome is one
        ``WordsTimed`` (``timestamps``) comes back as ``(turn_id, words)``.
        Nothing else changed then but the context's reply deadline, which
        only moves later (the shell need not drain or re-arm). Anything else
        is handled as ``receive_text`` handles it, and ``None`` says to drain
        as usual.
        """
        if self._failed:
            return None
        events = self._events
        if events or self._actions:
            self.receive_text(text, now)
            return None
        if text.startswith(_AUDIO_HEAD):
            piece = self._fast_audio_chunk(text, now)
            if piece is True:
                return None
            if piece is not False:
                return piece
        self._parse(text, now)
        if len(events) == 1 and not self._actions and type(events[0]) is WordsTimed:
            timed: WordsTimed = events.pop()  # type: ignore[assignment]
            return timed.turn_id, timed.words
        return None

    def _parse(self, text: str, now: float) -> None:
        """The full parse of one frame (the compact audio shape did not apply)."""
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            self._fail_connection("malformed_frame", "invalid JSON from server", close=True)
            return
        if not isinstance(frame, dict):
            self._fail_connection("malformed_frame", "server frame is not an object", close=True)
            return
        kind = None
        for k in _HANDLERS:
            if k in frame:
                kind = k
                break
        if kind is None:
            logger.debug("< kova: ignoring unknown frame keys %s", sorted(frame)[:8])
            return
        self._dispatch(kind, frame, now)

    def _fast_audio_chunk(self, text: str, now: float) -> AudioPiece | bool:
        """An ``audio_chunk`` frame in the compact shape, for a streaming context.

        Handled here with the same outcome as the full parse would give: the
        audio to report as ``AudioReceived`` (the caller queues or returns
        it), or True when there is nothing to report (a late frame dropped, a
        PCM chunk of one odd byte kept). False sends it through the full
        parse: another shape, a JSON escape, base64 that does not decode
        strictly, an unknown or unstarted context.
        """
        end = text.find('"', _AUDIO_HEAD_LEN)
        if end < 0 or not text.startswith(_AUDIO_MID, end):
            return False
        id_at = end + _AUDIO_MID_LEN
        context_id = text[id_at : -len(_AUDIO_TAIL)]
        if not text.endswith(_AUDIO_TAIL) or '"' in context_id or "\\" in context_id:
            return False
        ctx = self._contexts.get(context_id)
        if ctx is None or not ctx.started:
            return False
        if ctx.closing:
            return True  # late frame of a cancelled / finished turn: dropped here
        # strict: only the base64 alphabet with correct padding, so the JSON
        # string had no escape and b64decode(validate=True) would agree
        audio = b64decode_fast(text[_AUDIO_HEAD_LEN:end])
        if audio is None:
            return False
        return self._audio(ctx, audio, now) or True

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Kova frames are text only; binary messages are ignored."""
        logger.debug("< kova: ignoring %d-byte binary message", len(data))

    def receive_bytes_fast(self, data: bytes, now: float) -> AudioPiece | None:
        """``receive_bytes``: Kova has no binary audio."""
        self.receive_bytes(data, now)
        return None

    # ------------------------------------------------------------ handlers

    def _dispatch(self, kind: str, frame: dict[str, object], now: float) -> None:
        ctx = self._context_for(frame)
        if ctx is None:
            if kind == "error" and not isinstance(frame.get("context_id"), str):
                message = f"provider error: {json_text(frame.get('error'))}"
                self._fail_connection("error", message, close=True)
            return
        if ctx.closing and kind not in ("context_closed", "error"):
            return  # late frame of a cancelled / finished turn: dropped here
        try:
            _HANDLERS[kind](self, ctx, frame, now)
        except _KovaFrameError as exc:
            self._fail_turn(ctx, "malformed_frame", f"{kind}: {exc}", now)

    def _context_for(self, frame: dict[str, object]) -> _Context | None:
        context_id = frame.get("context_id")
        if isinstance(context_id, str):
            return self._contexts.get(context_id)
        flush_id = frame.get("flush_id")  # an error may name only the flush
        if "error" in frame and isinstance(flush_id, str):
            return next((c for c in self._contexts.values() if c.flush_id == flush_id), None)
        return None

    def _on_context_started(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        body = frame["context_started"]
        if not isinstance(body, dict):
            raise _KovaFrameError("context_started is not an object")
        if ctx.started:
            return
        echoed = body.get("response_format")
        if isinstance(echoed, dict):
            real = _format_from_echo(echoed, ctx.audio_format)
            if real is None:
                encoding = json_text(echoed.get("encoding"))
                self._fail_turn(ctx, "unsupported_encoding", f"server chose {encoding}", now)
                return
            ctx.audio_format = real
        ctx.started = True
        self._set_deadline(ctx, now + self._reply_timeout_s if ctx.flush_id is not None else None)
        self._events.append(TurnStarted(ctx.turn_id, provider_ref=ctx.context_id))

    def _on_audio_chunk(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        self._check_started(ctx, "audio_chunk")
        payload = frame["audio_chunk"]
        if not isinstance(payload, str):
            raise _KovaFrameError("audio_chunk is not a string")
        try:
            audio = base64.b64decode(payload, validate=True)
        except ValueError as exc:  # binascii.Error, or a non-ASCII character
            raise _KovaFrameError("audio_chunk is not valid base64") from exc
        piece = self._audio(ctx, audio, now)
        if piece is not None:
            self._events.append(AudioReceived(*piece))

    def _audio(self, ctx: _Context, audio: bytes, now: float) -> AudioPiece | None:
        """A started context's decoded audio: whole samples out, an odd byte kept for the next.

        The audio to report (``None``: none this time); the deadline only moves later.
        """
        if ctx.flush_id is not None:
            self._set_deadline(ctx, now + self._reply_timeout_s)
        if ctx.audio_format.bytes_per_sample == 2:
            if ctx.remainder:
                audio = ctx.remainder + audio
            cut = len(audio) - len(audio) % 2
            if cut != len(audio):
                audio, ctx.remainder = audio[:cut], audio[cut:]
            else:
                ctx.remainder = b""
        if audio:
            return ctx.turn_id, audio, ctx.audio_format
        return None

    def _on_timestamps(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        self._check_started(ctx, "timestamps")
        self._touch(ctx, now)
        words = _parse_timestamps(frame["timestamps"])
        if words:
            self._events.append(WordsTimed(ctx.turn_id, words))

    def _on_flush_completed(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        flush_id = frame.get("flush_id")
        if frame["flush_completed"] is not True or not isinstance(flush_id, str):
            raise _KovaFrameError("flush_completed needs true and a string flush_id")
        if flush_id != ctx.flush_id:
            logger.debug(
                "< kova %s: flush_completed for unknown flush %r", ctx.context_id, flush_id
            )
            return
        self._finish(ctx, TurnDone(ctx.turn_id))
        self._send_close_context(ctx, now)

    def _on_context_closed(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        self._forget(ctx)
        if not ctx.finished:
            self._finish(ctx, TurnDone(ctx.turn_id, cancelled=ctx.cancelled))

    def _on_error(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        message = json_text(frame["error"])
        if ctx.closing:
            # An error while closing (e.g. the context was already gone):
            # nothing more will come for it.
            self._forget(ctx)
            if not ctx.finished:
                self._finish(ctx, TurnDone(ctx.turn_id, cancelled=True))
            return
        # An error before context_started refused start_context: the server
        # holds no context, so there is nothing to close.
        self._fail_turn(ctx, "error", message, now, release=ctx.started)

    # ------------------------------------------------------------- helpers

    def _start_body(self, settings: TurnSettings, fmt: AudioFormat) -> dict[str, object]:
        body: dict[str, object] = {
            "voice_id": settings.voice or self._settings.voice,
            "model_id": settings.model or self._settings.model or "default",
        }
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        body["timestamps"] = settings.word_timestamps
        body["response_format"] = {
            "encoding": WIRE_ENCODING[fmt.encoding],
            "sample_rate": fmt.sample_rate_hz,
        }
        return body

    def _check_started(self, ctx: _Context, kind: str) -> None:
        if not ctx.started:
            raise _KovaFrameError(f"{kind} before context_started (ordering rule 1)")

    def _touch(self, ctx: _Context, now: float) -> None:
        if ctx.flush_id is not None:
            self._set_deadline(ctx, now + self._reply_timeout_s)

    def _send(self, frame: dict[str, object]) -> None:
        self._actions.append(SendText(json.dumps(frame, separators=(",", ":"))))

    def _send_close_context(self, ctx: _Context, now: float) -> None:
        ctx.closing = True
        self._set_deadline(ctx, now + self._close_timeout_s)
        self._turns.pop(ctx.turn_id, None)
        self._send({"close_context": True, "context_id": ctx.context_id})

    def _finish(self, ctx: _Context, event: Event) -> None:
        ctx.finished = True
        ctx.remainder = b""
        self._turns.pop(ctx.turn_id, None)
        self._events.append(event)

    def _forget(self, ctx: _Context) -> None:
        self._contexts.pop(ctx.context_id, None)
        self._turns.pop(ctx.turn_id, None)

    def _fail_turn(
        self, ctx: _Context, kind: str, message: str, now: float, release: bool = True
    ) -> None:
        """Fail one turn; ``release`` sends ``close_context`` (the server holds it)."""
        self._finish(ctx, TurnFailed(ctx.turn_id, kind, self._scrub(message)))
        if release:
            self._send_close_context(ctx, now)
        else:
            self._forget(ctx)

    def _fail_connection(self, kind: str, message: str, close: bool = False) -> None:
        open_turns = tuple(c.turn_id for c in self._live_contexts())
        self._failed = True
        self._ready = False
        self._contexts.clear()
        self._turns.clear()
        self._deadlines.clear()
        self._events.append(ProviderFailed(kind, self._scrub(message), open_turns))
        if close:
            self._actions.append(CloseConnection(CLOSE_PROTOCOL_ERROR, kind))

    def _live_contexts(self) -> list[_Context]:
        return [c for c in self._contexts.values() if not c.finished]

    def _scrub(self, message: str) -> str:
        return scrub_secret(message, self._settings.api_key)


_HANDLERS: dict[str, Handler] = {
    "context_started": KovaProtocol._on_context_started,
    "audio_chunk": KovaProtocol._on_audio_chunk,
    "timestamps": KovaProtocol._on_timestamps,
    "flush_completed": KovaProtocol._on_flush_completed,
    "context_closed": KovaProtocol._on_context_closed,
    "error": KovaProtocol._on_error,
}
"""Frame type -> handler, as functions: a protocol holding its own bound methods
would be a reference cycle, freed only by a full collection."""


# ------------------------------------------------------------ pure helpers


def _requested_format(settings: TurnSettings) -> AudioFormat:
    """What to ask for: G.711 only at 8 kHz (pass-through), PCM at any rate."""
    fmt = settings.audio_format
    if fmt.encoding != "pcm_s16le" and fmt.sample_rate_hz != 8000:
        return AudioFormat("pcm_s16le", fmt.sample_rate_hz)
    return fmt


def _forced_format(settings: ProviderSettings) -> AudioFormat | None:
    """``[providers.NAME]`` options ``encoding`` (pcm/mulaw/alaw) and ``sample_rate``.

    When either is set, every turn asks for that format whatever the leg
    uses (e.g. 24 kHz PCM on a G.711 leg, to exercise resampling); the call
    transcodes what arrives. Unset: the turn's own format (pass-through).
    """
    raw_encoding = settings.option("encoding", "")
    raw_rate = settings.option("sample_rate", 0)
    if not raw_encoding and not raw_rate:
        return None
    encoding = ENCODINGS.get(str(raw_encoding or "pcm"), "pcm_s16le")
    rate = raw_rate if isinstance(raw_rate, int) and not isinstance(raw_rate, bool) else 0
    if rate <= 0:
        rate = DEFAULT_FORMAT.sample_rate_hz if encoding == "pcm_s16le" else 8000
    return AudioFormat(encoding, rate)


def _format_from_echo(echoed: dict[str, object], asked: AudioFormat) -> AudioFormat | None:
    """The real format from ``context_started.response_format`` (None: unusable)."""
    encoding = ENCODINGS.get(json_text(echoed.get("encoding")))
    if encoding is None:
        return None
    rate = echoed.get("sample_rate")
    if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0:
        return AudioFormat(encoding, rate)
    if encoding == asked.encoding:
        return asked
    return AudioFormat(encoding, 8000 if encoding != "pcm_s16le" else DEFAULT_FORMAT.sample_rate_hz)


_TIMESTAMPS_WORDING = TimingsWording(
    not_arrays="timestamps needs words, start_seconds and end_seconds arrays",
    lengths_differ="timestamps arrays differ in length",
    bad_entry="timestamps hold a non-string word or a bad time",
)


def _parse_timestamps(body: object) -> tuple[WordTiming, ...]:
    """Parallel arrays ``words`` / ``start_seconds`` / ``end_seconds`` to timings."""
    if not isinstance(body, dict):
        raise _KovaFrameError("timestamps is not an object")
    return parallel_word_timings(
        body.get("words"),
        body.get("start_seconds"),
        body.get("end_seconds"),
        wording=_TIMESTAMPS_WORDING,
        error=_KovaFrameError,
    )


ENGINE = KovaProtocol

OPTIONS: dict[str, OptionType] = {
    "start_timeout_s": float,
    "reply_timeout_s": float,
    "close_timeout_s": float,
    "encoding": tuple(ENCODINGS),
    "sample_rate": int,
}
"""The protocol options of ``[providers.NAME]`` and their types (``bridge.config`` rejects
any other key): the three timeouts, and ``encoding``/``sample_rate`` forcing a format."""

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
``timestamps`` per word). Every frame goes through the JSON parser; matching
the compact ``audio_chunk`` shape without it saved under 2 % of a core at
500 calls (``bench/bench_receive_contract.py``), so it went. The earliest
deadline comes from a heap of the deadlines as they were set (entries a
context has moved away from are dropped when they reach the top), not from a
scan of every context per frame.
"""

from __future__ import annotations

import base64
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

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
)
from bridge.providers.client_common import b64decode_fast, bearer_headers, json_text, scrub_secret
from bridge.providers.kova import wire
from bridge.providers.kova.wire import DEFAULT_FORMAT, ENCODINGS, FrameError

__all__ = ["ENGINE", "KovaProtocol"]

logger = logging.getLogger(__name__)


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
        body = wire.start_body(
            settings.voice or self._settings.voice,
            settings.model or self._settings.model or "default",
            settings.temperature,
            settings.word_timestamps,
            ctx.audio_format,
        )
        self._send(wire.start_context(ctx.context_id, body))

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
        self._send(wire.send_text(ctx.context_id, text))

    def end_turn(self, turn_id: str, now: float) -> None:
        """Send ``flush`` with a fresh ``flush_id``; ``TurnDone`` follows ``flush_completed``."""
        ctx = self._turns.get(turn_id)
        if ctx is None or ctx.flush_id is not None:
            return
        self._flush_serial += 1
        ctx.flush_id = f"f{self._flush_serial}"
        if ctx.started:
            self._set_deadline(ctx, now + self._reply_timeout_s)
        self._send(wire.flush(ctx.context_id, ctx.flush_id))

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
        try:
            frame = wire.decode_frame(text)
        except wire.NotJson:
            self._fail_connection("malformed_frame", "invalid JSON from server", close=True)
            return
        except wire.NotAnObject:
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

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Kova frames are text only; binary messages are ignored."""
        logger.debug("< kova: ignoring %d-byte binary message", len(data))

    # ------------------------------------------------------------ handlers

    def _dispatch(self, kind: str, frame: dict[str, object], now: float) -> None:
        ctx = self._context_for(frame)
        if ctx is None:
            if kind == wire.ERROR and not isinstance(frame.get(wire.CONTEXT_ID), str):
                message = f"provider error: {json_text(frame.get(wire.ERROR))}"
                self._fail_connection("error", message, close=True)
            return
        if ctx.closing and kind not in (wire.CONTEXT_CLOSED, wire.ERROR):
            return  # late frame of a cancelled / finished turn: dropped here
        try:
            _HANDLERS[kind](self, ctx, frame, now)
        except FrameError as exc:
            self._fail_turn(ctx, "malformed_frame", f"{kind}: {exc}", now)

    def _context_for(self, frame: dict[str, object]) -> _Context | None:
        context_id = frame.get(wire.CONTEXT_ID)
        if isinstance(context_id, str):
            return self._contexts.get(context_id)
        flush_id = frame.get(wire.FLUSH_ID)  # an error may name only the flush
        if wire.ERROR in frame and isinstance(flush_id, str):
            return next((c for c in self._contexts.values() if c.flush_id == flush_id), None)
        return None

    def _on_context_started(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        body = frame[wire.CONTEXT_STARTED]
        if not isinstance(body, dict):
            raise FrameError("context_started is not an object")
        if ctx.started:
            return
        echoed = body.get(wire.RESPONSE_FORMAT)
        if isinstance(echoed, dict):
            real = wire.format_from_echo(echoed, ctx.audio_format)
            if real is None:
                encoding = json_text(echoed.get(wire.ENCODING))
                self._fail_turn(ctx, "unsupported_encoding", f"server chose {encoding}", now)
                return
            ctx.audio_format = real
        ctx.started = True
        self._set_deadline(ctx, now + self._reply_timeout_s if ctx.flush_id is not None else None)
        self._events.append(TurnStarted(ctx.turn_id, provider_ref=ctx.context_id))

    def _on_audio_chunk(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        self._check_started(ctx, wire.AUDIO_CHUNK)
        payload = frame[wire.AUDIO_CHUNK]
        if not isinstance(payload, str):
            raise FrameError("audio_chunk is not a string")
        audio = b64decode_fast(payload)
        if audio is None:  # not strictly valid: the standard library decides
            try:
                audio = base64.b64decode(payload, validate=True)
            except ValueError as exc:  # binascii.Error, or a non-ASCII character
                raise FrameError("audio_chunk is not valid base64") from exc
        self._audio(ctx, audio, now)

    def _audio(self, ctx: _Context, audio: bytes, now: float) -> None:
        """A started context's decoded audio: whole samples out, an odd byte kept for the next.

        The deadline only moves later.
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
            self._events.append(AudioReceived(ctx.turn_id, audio, ctx.audio_format))

    def _on_timestamps(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        self._check_started(ctx, wire.TIMESTAMPS)
        self._touch(ctx, now)
        words = wire.decode_timestamps(frame[wire.TIMESTAMPS])
        if words:
            self._events.append(WordsTimed(ctx.turn_id, words))

    def _on_flush_completed(self, ctx: _Context, frame: dict[str, object], now: float) -> None:
        flush_id = frame.get(wire.FLUSH_ID)
        if frame[wire.FLUSH_COMPLETED] is not True or not isinstance(flush_id, str):
            raise FrameError("flush_completed needs true and a string flush_id")
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
        message = json_text(frame[wire.ERROR])
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

    def _check_started(self, ctx: _Context, kind: str) -> None:
        if not ctx.started:
            raise FrameError(f"{kind} before context_started (ordering rule 1)")

    def _touch(self, ctx: _Context, now: float) -> None:
        if ctx.flush_id is not None:
            self._set_deadline(ctx, now + self._reply_timeout_s)

    def _send(self, text: str) -> None:
        self._actions.append(SendText(text))

    def _send_close_context(self, ctx: _Context, now: float) -> None:
        ctx.closing = True
        self._set_deadline(ctx, now + self._close_timeout_s)
        self._turns.pop(ctx.turn_id, None)
        self._send(wire.close_context(ctx.context_id))

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
            self._actions.append(CloseConnection(wire.CLOSE_PROTOCOL_ERROR, kind))

    def _live_contexts(self) -> list[_Context]:
        return [c for c in self._contexts.values() if not c.finished]

    def _scrub(self, message: str) -> str:
        return scrub_secret(message, self._settings.api_key)


_HANDLERS: dict[str, Handler] = {
    wire.CONTEXT_STARTED: KovaProtocol._on_context_started,
    wire.AUDIO_CHUNK: KovaProtocol._on_audio_chunk,
    wire.TIMESTAMPS: KovaProtocol._on_timestamps,
    wire.FLUSH_COMPLETED: KovaProtocol._on_flush_completed,
    wire.CONTEXT_CLOSED: KovaProtocol._on_context_closed,
    wire.ERROR: KovaProtocol._on_error,
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

"""Kova WebSocket TTS server session (the provider's side; served on ``/v1/ws/kova``).

Theory of operation
-------------------
One ``KovaServerSession`` per accepted WebSocket. Client frames are JSON
objects named by one discriminator key: ``start_context``, ``send_text``,
``flush``, ``close_context`` (seed ``000_f43e393e6311affa.txt``). Each frame
addresses a context by ``context_id``; a frame without one addresses the
*default* context (key ``None``), since the seed makes the field optional.

Per context, text is cut into synthesis jobs at sentence ends (or at a
``flush``) and queued together with flush markers::

    start_context -> validate -> context_started            (ordering rule 1)
    send_text     -> pending text; each complete sentence -> queue
    flush         -> rest of the text -> queue, then a flush marker
    queue head    -> Synthesize(job) ... synthesis_audio -> audio_chunk [+ timestamps]
                                     ... synthesis_done  -> next item
    flush marker  -> flush_completed (after every earlier chunk: rule 3)
    close_context -> CancelSynthesis, queue dropped, context_closed (rule 4, last)

Only one job per context runs at a time, so audio order is text order and a
job's word timings are offset by the audio already sent in the context
(timestamps are seconds from the start of the context's audio).

Rules that keep this module honest:

1. Bad client input never raises: it becomes the seed's ``error`` frame
   (with ``context_id`` and, for a flush, ``flush_id``); the socket stays open.
   Only a failed ``Authorization`` closes it (1008).
2. Audio goes out in the format asked for: ``pcm``/``linear16`` (s16le at
   ``sample_rate``, default 32000), ``mulaw``/``alaw`` at 8000 Hz (encoded
   with ``telcodec.g711``). ``mp3``, ``wav`` and ``opus`` are refused with
   "unsupported encoding" (no encoders are shipped).
3. Nothing is sent for a context after its ``context_closed``; output of a
   cancelled job is dropped here even if the shell still delivers it.
4. No clock is read; the seed defines no timers, so ``next_deadline()`` is
   always ``None``.
"""

from __future__ import annotations

import base64
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from bridge.engine import CloseConnection, Outbox, SendText
from bridge.providers.base import WordTiming
from bridge.providers.client_common import non_negative_seconds
from bridge.providers.kova import wire
from bridge.providers.kova.wire import (
    CLIENT_FRAMES,
    DEFAULT_SAMPLE_RATE_HZ,
    G711_ENCODINGS,
    G711_SAMPLE_RATE_HZ,
    PCM_ENCODINGS,
    UNSUPPORTED_ENCODINGS,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.server_common import byte_chunks, encode_pcm, timing_arrays, whole_samples

__all__ = ["PATHS", "SESSION", "KovaServerSession"]

#: Kova's documentation names no path; this is ours (see docs/provider-protocols.md, Kova).
PATHS: tuple[str, ...] = ("/v1/ws/kova",)

PCM_SAMPLE_RATES_HZ = frozenset({8000, 16000, 22050, 24000, 32000, 44100, 48000})

#: Security limits (ours; the seed states none).
MAX_FRAME_CHARS = 1_000_000
MAX_TEXT_CHARS = 100_000
MAX_PENDING_CHARS = 2_000
MAX_AUDIO_CHUNK_BYTES = 16_000

_SENTENCE_END = re.compile(r"[.!?;:][\"')\]]*\s+")

ContextKey = str | None


class _BadFrame(ValueError):
    """Client input the seed does not allow; the message goes into ``error``."""


@dataclass(frozen=True, slots=True)
class _Flush:
    flush_id: str


@dataclass(slots=True)
class _Context:
    """Server state of one Kova context."""

    context_id: ContextKey
    voice_id: str
    encoding: str
    sample_rate_hz: int
    timestamps: bool
    pending_text: str = ""
    queue: deque[str | _Flush] = field(default_factory=deque)
    job_id: str | None = None
    job_offset_s: float = 0.0
    sent_samples: int = 0
    remainder: bytes = b""
    flush_serial: int = 0


class KovaServerSession(Outbox):
    """Provider side of Kova's WebSocket frames (see the module docstring).

    After every call, drain ``actions_to_send()``: ``SendText`` frames,
    ``Synthesize`` / ``CancelSynthesis`` jobs for the shell, ``CloseConnection``.
    """

    protocol_name: ClassVar[str] = "kova"

    def __init__(self, options: ServerOptions) -> None:
        super().__init__()
        self._options = options
        self._closed = False
        self._job_serial = 0
        self._contexts: dict[ContextKey, _Context] = {}
        self._jobs: dict[str, _Context] = {}

    # ---------------------------------------------------------- connection

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        """Check ``Authorization: Bearer <key>`` when keys are configured."""
        if not self._options.api_keys:
            return
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or key.strip() not in self._options.api_keys:
            self._send(wire.error("unauthorized"))
            self._actions.append(CloseConnection(wire.CLOSE_POLICY_VIOLATION, "unauthorized"))
            self._closed = True

    def connection_lost(self, now: float) -> None:
        """Stop every running job; the session is over."""
        for ctx in list(self._contexts.values()):
            self._drop_context(ctx)
        self._closed = True

    def handle_timer(self, now: float) -> None:
        """Kova defines no timers."""

    def next_deadline(self) -> float | None:
        return None

    # ------------------------------------------------------------- receive

    def receive_text(self, text: str, now: float) -> None:
        """Validate and apply one client frame, answering bad ones with ``error``."""
        if self._closed:
            return
        if len(text) > MAX_FRAME_CHARS:
            self._send(wire.error(f"frame too large (max {MAX_FRAME_CHARS} characters)"))
            return
        try:
            frame = wire.decode_frame(text)
        except wire.NotJson:
            self._send(wire.error("invalid JSON"))
            return
        except wire.NotAnObject:
            self._send(wire.error("frame must be a JSON object"))
            return
        raw_id = frame.get(wire.CONTEXT_ID)
        key: ContextKey = raw_id if isinstance(raw_id, str) else None
        try:
            if raw_id is not None and not isinstance(raw_id, str):
                raise _BadFrame("invalid field: context_id")
            kinds = wire.frame_kinds(frame, CLIENT_FRAMES)
            if not kinds:
                raise _BadFrame("unknown frame type")
            if len(kinds) > 1:
                raise _BadFrame(f"ambiguous frame: {', '.join(kinds)}")
            _HANDLERS[kinds[0]](self, frame, key)
        except _BadFrame as exc:
            self._send_error(str(exc), key, _flush_id_of(frame))

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Kova frames are JSON text; binary messages get an ``error``."""
        if not self._closed:
            self._send(wire.error("binary frames are not supported"))

    # ------------------------------------------------------------ handlers

    def _on_start_context(self, frame: dict[str, object], key: ContextKey) -> None:
        body = frame[wire.START_CONTEXT]
        if not isinstance(body, dict):
            raise _BadFrame(f"invalid field: {wire.START_CONTEXT}")
        ctx, echo = self._parse_start(body, key)
        if key in self._contexts:
            raise _BadFrame(f"context already exists: {key}")
        if len(self._contexts) >= self._options.max_contexts:
            raise _BadFrame(f"too many contexts (max {self._options.max_contexts})")
        self._contexts[key] = ctx
        self._send(wire.context_started(ctx.context_id, echo))

    def _on_send_text(self, frame: dict[str, object], key: ContextKey) -> None:
        text = frame[wire.SEND_TEXT]
        if not isinstance(text, str):
            raise _BadFrame(f"invalid field: {wire.SEND_TEXT}")
        if len(text) > MAX_TEXT_CHARS:
            raise _BadFrame(f"text too long (max {MAX_TEXT_CHARS} characters)")
        ctx = self._context(key)
        ctx.pending_text += text
        self._queue_sentences(ctx)
        self._pump(ctx)

    def _on_flush(self, frame: dict[str, object], key: ContextKey) -> None:
        flush_id = frame.get(wire.FLUSH_ID)
        if frame[wire.FLUSH] is not True:
            raise _BadFrame(f"invalid field: {wire.FLUSH}")
        if flush_id is not None and not isinstance(flush_id, str):
            raise _BadFrame(f"invalid field: {wire.FLUSH_ID}")
        ctx = self._context(key)
        if flush_id is None:
            ctx.flush_serial += 1
            flush_id = f"flush-{ctx.flush_serial}"
        if ctx.pending_text.strip():
            ctx.queue.append(ctx.pending_text)
        ctx.pending_text = ""
        ctx.queue.append(_Flush(flush_id))
        self._pump(ctx)

    def _on_close_context(self, frame: dict[str, object], key: ContextKey) -> None:
        if frame[wire.CLOSE_CONTEXT] is not True:
            raise _BadFrame(f"invalid field: {wire.CLOSE_CONTEXT}")
        ctx = self._context(key)
        self._drop_context(ctx)
        self._send(wire.context_closed(ctx.context_id))

    # ------------------------------------------------------------ synthesis

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        """Send a job's PCM as ``audio_chunk`` frames, then its ``timestamps``."""
        ctx = self._jobs.get(job_id)
        if ctx is None:
            return  # cancelled or unknown job: dropped
        pcm, ctx.remainder = whole_samples(ctx.remainder, pcm)
        ctx.sent_samples += len(pcm) // 2
        for chunk in byte_chunks(pcm, MAX_AUDIO_CHUNK_BYTES):
            audio = encode_pcm(ctx.encoding, chunk)
            self._send(wire.audio_chunk(ctx.context_id, base64.b64encode(audio).decode("ascii")))
        if ctx.timestamps and words:
            timestamps = timing_arrays(
                words,
                ctx.job_offset_s,
                start_key=wire.START_SECONDS,
                end_key=wire.END_SECONDS,
                ndigits=6,
            )
            self._send(wire.timestamps(ctx.context_id, timestamps))

    def synthesis_done(self, job_id: str, now: float) -> None:
        """The job is complete: move on to the context's next item."""
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        ctx.remainder = b""
        self._pump(ctx)

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None:
        """Report ``error`` for the utterance; its flush will not complete."""
        self._fail_job(job_id, f"synthesis failed: {message}")

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """At capacity: the same per-context ``error`` frame (the seed has no codes)."""
        self._fail_job(job_id, message)

    def _fail_job(self, job_id: str, message: str) -> None:
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        ctx.remainder = b""
        flush_id = None
        while ctx.queue and flush_id is None:
            item = ctx.queue.popleft()
            flush_id = item.flush_id if isinstance(item, _Flush) else None
        self._send_error(message, ctx.context_id, flush_id)
        self._pump(ctx)

    # ------------------------------------------------------------- helpers

    def _parse_start(
        self, body: dict[object, object], key: ContextKey
    ) -> tuple[_Context, dict[str, object]]:
        voice_id = _required_text(body, wire.VOICE_ID)
        model_id = _required_text(body, wire.MODEL_ID)
        temperature = body.get(wire.TEMPERATURE)
        if temperature is not None and non_negative_seconds(temperature) is None:
            raise _BadFrame(f"invalid field: {wire.TEMPERATURE}")
        timestamps = body.get(wire.TIMESTAMPS, False)
        if not isinstance(timestamps, bool):
            raise _BadFrame(f"invalid field: {wire.TIMESTAMPS}")
        encoding, sample_rate_hz, response_format = _parse_response_format(
            body.get(wire.RESPONSE_FORMAT)
        )
        if voice_id not in self._options.voices:
            raise _BadFrame(f"unknown voice: {voice_id}")
        echo: dict[str, object] = {wire.VOICE_ID: voice_id, wire.MODEL_ID: model_id}
        if wire.TEMPERATURE in body:
            echo[wire.TEMPERATURE] = temperature
        echo[wire.TIMESTAMPS] = timestamps
        echo[wire.RESPONSE_FORMAT] = response_format
        ctx = _Context(key, voice_id, encoding, sample_rate_hz, timestamps)
        return ctx, echo

    def _context(self, key: ContextKey) -> _Context:
        ctx = self._contexts.get(key)
        if ctx is None:
            raise _BadFrame(f"unknown context: {key}")
        return ctx

    def _queue_sentences(self, ctx: _Context) -> None:
        """Move every complete sentence of the pending text into the queue."""
        ends = [m.end() for m in _SENTENCE_END.finditer(ctx.pending_text)]
        cut = ends[-1] if ends else 0
        if not cut and len(ctx.pending_text) > MAX_PENDING_CHARS:
            cut = ctx.pending_text.rfind(" ") + 1 or len(ctx.pending_text)
        if cut:
            text, ctx.pending_text = ctx.pending_text[:cut], ctx.pending_text[cut:]
            if text.strip():
                ctx.queue.append(text)

    def _pump(self, ctx: _Context) -> None:
        """Start the next job, completing flush markers on the way (rule 3)."""
        while ctx.job_id is None and ctx.queue:
            item = ctx.queue.popleft()
            if isinstance(item, _Flush):
                self._send(wire.flush_completed(ctx.context_id, item.flush_id))
                continue
            self._job_serial += 1
            ctx.job_id = f"kova-{self._job_serial}"
            ctx.job_offset_s = ctx.sent_samples / ctx.sample_rate_hz
            self._jobs[ctx.job_id] = ctx
            self._actions.append(
                Synthesize(ctx.job_id, item.strip(), ctx.voice_id, ctx.sample_rate_hz)
            )

    def _drop_context(self, ctx: _Context) -> None:
        if ctx.job_id is not None:
            self._jobs.pop(ctx.job_id, None)
            self._actions.append(CancelSynthesis(ctx.job_id))
            ctx.job_id = None
        ctx.queue.clear()
        self._contexts.pop(ctx.context_id, None)

    def _send_error(self, message: str, key: ContextKey, flush_id: str | None) -> None:
        self._send(wire.error(message, key, flush_id))

    def _send(self, text: str) -> None:
        self._actions.append(SendText(text))


_HANDLERS: dict[str, Callable[[KovaServerSession, dict[str, object], ContextKey], None]] = {
    wire.START_CONTEXT: KovaServerSession._on_start_context,
    wire.SEND_TEXT: KovaServerSession._on_send_text,
    wire.FLUSH: KovaServerSession._on_flush,
    wire.CLOSE_CONTEXT: KovaServerSession._on_close_context,
}
"""Frame type -> handler, as functions: a session holding its own bound methods
would be a reference cycle, freed only by a full collection."""


# ------------------------------------------------------------ pure helpers


def _parse_response_format(value: object) -> tuple[str, int, dict[str, object]]:
    """Validate ``response_format``: (encoding, sample rate, echoed object)."""
    if value is None:
        default = {wire.ENCODING: "pcm", wire.SAMPLE_RATE: DEFAULT_SAMPLE_RATE_HZ}
        return "pcm", DEFAULT_SAMPLE_RATE_HZ, dict[str, object](default)
    if not isinstance(value, dict):
        raise _BadFrame("invalid field: response_format")
    encoding = value.get(wire.ENCODING)
    if not isinstance(encoding, str):
        raise _BadFrame("invalid field: response_format.encoding")
    if encoding in UNSUPPORTED_ENCODINGS:
        raise _BadFrame(f"unsupported encoding: {encoding}")
    if encoding not in PCM_ENCODINGS | G711_ENCODINGS:
        raise _BadFrame("invalid field: response_format.encoding")
    default_hz = DEFAULT_SAMPLE_RATE_HZ if encoding in PCM_ENCODINGS else G711_SAMPLE_RATE_HZ
    rate = value.get(wire.SAMPLE_RATE, default_hz)
    if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
        raise _BadFrame("invalid field: response_format.sample_rate")
    allowed = PCM_SAMPLE_RATES_HZ if encoding in PCM_ENCODINGS else {G711_SAMPLE_RATE_HZ}
    if rate not in allowed:
        raise _BadFrame(f"unsupported sample_rate for {encoding}: {rate}")
    bitrate = value.get(wire.BITRATE)
    if bitrate is not None and (isinstance(bitrate, bool) or not isinstance(bitrate, str | int)):
        raise _BadFrame("invalid field: response_format.bitrate")
    echo: dict[str, object] = {wire.ENCODING: encoding, wire.SAMPLE_RATE: rate}
    if bitrate is not None:
        echo[wire.BITRATE] = bitrate
    return encoding, rate, echo


def _required_text(body: dict[object, object], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise _BadFrame(f"missing field: {name}")
    if not isinstance(value, str) or not value:
        raise _BadFrame(f"invalid field: {name}")
    return value


def _flush_id_of(frame: dict[str, object]) -> str | None:
    flush_id = frame.get(wire.FLUSH_ID)
    return flush_id if wire.FLUSH in frame and isinstance(flush_id, str) else None


SESSION = KovaServerSession

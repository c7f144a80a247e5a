"""Coda (Rime) WebSocket TTS server session (the provider's side of ``coda``).

Theory of operation
-------------------
One ``CodaServerSession`` per accepted WebSocket on ``/ws`` (the seed's
``wss://coda.api.rime.ai/ws``) or ``/v1/ws/coda`` (ours, beside the other
protocols of ``callbridge tts-server``). It behaves as a *direct engine
connection* of seed ``003_e1fb1d1bb580e7a1.txt``: JSON messages with one
payload key (``config``, ``start``, ``text``, ``end``, ``cancel``) and an
optional ``contextId`` (omitted or empty selects ``default``)::

    connection_made        -> ready{protocol: 1, languages, defaultLanguage}
                              credentials: ``Authorization: Bearer`` header, or
                              ``config.authorization`` within 10 s (timer)
    config (once, before the first start) -> defaults merged at the top level
    start  -> validate -> started{requestId}; complete text: one job
    text   -> per splitStrategy: NONE = one job per message, SENTENCE = one job
              per sentence of each message, ACCUMULATE_SENTENCE = joined, one
              job per complete sentence (rest at ``end``)
    end    -> rest of the text; once the last job is done -> done{timestamps}
    cancel -> CancelSynthesis, queue dropped -> cancelled (also for unknown ids)
    job    -> Synthesize ... synthesis_audio -> audio (base64) ... synthesis_done

Only one job per context runs at a time, so audio order is text order and a
job's word timings are offset by the audio already sent in the context.

Errors (the seed's "Handle completion and errors"):

* connection-level ``error`` (no ``contextId``): a duplicate ``start``, text
  outside an open streaming input, a 17th context (``resource_exhausted``),
  a second ``config`` or one after ``start``, a message without a payload;
  every context continues.
* context ``error`` (ends that context): invalid ``start`` fields (missing or
  empty ``audioFormat``, unknown voice, unsupported language, bad types),
  a failed synthesis (``internal``, with the ``requestId``).
* ``invalid_input`` + close 1007: an undecodable envelope (not JSON, not an
  object, two payloads, a non-string ``contextId``, any binary message: the
  Protobuf schema is unpublished); + close 1009: a message over 64 KiB.
* ``unauthenticated`` + close 1008: wrong credentials, credentials in both
  the header and ``config``, or none within 10 s (when keys are configured).

Rules: bad input never raises; nothing is sent for a context after its
terminal frame; output of cancelled jobs is dropped here; no clock is read
(the only timer is the credentials deadline). WebSocket pings (every 30 s)
and the 75 s read-inactivity limit belong to the shell: see
``PING_INTERVAL_S`` and ``READ_INACTIVITY_TIMEOUT_S``, and pass
``select_subprotocol`` to the WebSocket server.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bridge.engine import CloseConnection, Outbox, SendText
from bridge.providers.base import WordTiming
from bridge.providers.client_common import json_object
from bridge.providers.coda import wire
from bridge.providers.coda.wire import (
    CLOSE_CREDENTIALS,
    CLOSE_UNDECODABLE,
    MAX_CONTEXT_ID_BYTES,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    SPLIT_STRATEGIES,
    SUBPROTOCOL,
    TIME_SCALE_RANGE,
    dump_message,
    format_duration,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.server_common import byte_chunks, encode_pcm, offset_words, whole_samples

__all__ = [
    "PATHS",
    "SESSION",
    "SUBPROTOCOLS",
    "CodaServerSession",
    "select_subprotocol",
]

PATHS: tuple[str, ...] = ("/ws", "/v1/ws/coda")
CODA_MAX_CONTEXTS = 16
ERROR_KIND_INTERNAL = "internal"
ERROR_KIND_UNAVAILABLE = "unavailable"
"""The seed's kind for "the server cannot take the request right now (at capacity)"."""
"""The seed's limit of open contexts per socket."""
#: Subprotocols we accept. ``rime.v1.binary`` is not: its Protobuf schema is unpublished.
SUBPROTOCOLS: tuple[str, ...] = (SUBPROTOCOL,)

LANGUAGES: tuple[str, ...] = ("en",)
DEFAULT_LANGUAGE = "en"
MAX_ALIGNED_AUDIO_S = 180.0
CREDENTIALS_DEADLINE_S = 10.0
PING_INTERVAL_S = 30.0
READ_INACTIVITY_TIMEOUT_S = 75.0
DEFAULT_SAMPLING_RATE_HZ = 24000
MAX_SAMPLING_RATE_HZ = 192000
DEFAULT_SPLIT_STRATEGY = "SPLIT_STRATEGY_NONE"
#: Raw audio per ``audio`` frame: base64 of it plus the envelope stays under 64 KiB.
MAX_AUDIO_CHUNK_BYTES = 48000

#: MIME type (and the direct-engine aliases) -> what we put on the wire;
#: ``None``: a format we have no encoder for. Unknown types fall back to WAV.
_FORMATS: dict[str, str | None] = {
    wire.AUDIO_PCM: "pcm",
    "audio/l16": "pcm",  # little-endian, as the seed warns
    "audio/wav": "wav",
    wire.AUDIO_PCMU: "mulaw",
    "audio/x-mulaw": "mulaw",
    "audio/mpeg": None,
    "audio/mp3": None,
    "audio/ogg;codecs=opus": None,
    "audio/ogg": None,
    "audio/webm;codecs=opus": None,
    "audio/webm": None,
}
_PAYLOADS = (wire.CONFIG, wire.START, wire.TEXT, wire.END, wire.CANCEL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_GRPC_OUT_OF_RANGE = 11

_CLOSE_TOO_BIG = 1009


def select_subprotocol(offered: Sequence[str]) -> str | None:
    """The seed's rule: the first offered value we support, else none (JSON)."""
    for value in offered:
        if value in SUBPROTOCOLS:
            return value
    return None


@dataclass(slots=True)
class _Context:
    context_id: str
    request_id: str
    voice: str
    language: str
    wire: str  # "pcm" | "mulaw" | "wav"
    sample_rate_hz: int
    speed: float
    split: str
    lookahead_tokens: int
    timestamps: bool
    streaming: bool
    input_ended: bool = False
    buffer: str = ""
    queue: deque[str] = field(default_factory=deque)
    dispatched: bool = False
    job_id: str | None = None
    samples_sent: int = 0
    job_start_samples: int = 0
    carry: bytes = b""
    header_sent: bool = False
    spans: list[WordTiming] = field(default_factory=list)


class CodaServerSession(Outbox):
    """One client of our Coda endpoint (see the module docstring).

    After every call the shell drains ``actions_to_send()`` (``SendText``,
    ``CloseConnection``, ``Synthesize``, ``CancelSynthesis``) and re-arms its
    timer from ``next_deadline()``.
    """

    protocol_name: ClassVar[str] = "coda"

    def __init__(self, options: ServerOptions) -> None:
        super().__init__()
        self._options = options
        self._open = False
        self._authenticated = not options.api_keys
        self._header_credentials = False
        self._credentials_by: float | None = None
        self._config_seen = False
        self._start_seen = False
        self._defaults: dict[str, Any] = {}
        self._contexts: dict[str, _Context] = {}
        self._jobs: dict[str, _Context] = {}
        self._request_serial = 0
        self._job_serial = 0

    # ---------------------------------------------------------- connection

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        self._open = True
        ready: dict[str, Any] = {wire.PROTOCOL: PROTOCOL_VERSION, wire.LANGUAGES: list(LANGUAGES)}
        ready[wire.DEFAULT_LANGUAGE] = DEFAULT_LANGUAGE
        self._send({wire.READY: ready})
        authorization = headers.get("authorization")
        if authorization is not None:
            self._header_credentials = True
            scheme, _, key = authorization.partition(" ")
            if self._options.api_keys and (
                scheme.lower() != "bearer" or key.strip() not in self._options.api_keys
            ):
                self._reject_credentials("invalid API key")
                return
            self._authenticated = True
        elif not self._authenticated:
            self._credentials_by = now + CREDENTIALS_DEADLINE_S

    def connection_lost(self, now: float) -> None:
        self._shut_down()

    def _shut_down(self) -> None:
        """Stop every job and accept nothing more (socket gone or being closed)."""
        for job_id in self._jobs:
            self._actions.append(CancelSynthesis(job_id))
        self._jobs.clear()
        self._contexts.clear()
        self._credentials_by = None
        self._open = False

    def next_deadline(self) -> float | None:
        return self._credentials_by

    def handle_timer(self, now: float) -> None:
        if self._credentials_by is not None and now >= self._credentials_by:
            self._reject_credentials(f"no credentials within {CREDENTIALS_DEADLINE_S:g} s")

    # ------------------------------------------------------------- receive

    def receive_text(self, text: str, now: float) -> None:
        if not self._open:
            return
        if len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES:
            self._error(wire.INVALID_INPUT, f"message exceeds {MAX_MESSAGE_BYTES} bytes")
            self._close(_CLOSE_TOO_BIG, "message too big")
            return
        message = json_object(text)
        if message is None:
            self._undecodable("message is not a JSON object")
            return
        context_id = message.get(wire.CONTEXT_ID, "")
        payloads = [key for key in _PAYLOADS if key in message]
        if not isinstance(context_id, str) or len(payloads) > 1:
            self._undecodable("contextId must be a string and there must be one payload")
            return
        if not payloads:
            self._error(
                wire.INVALID_INPUT, "message has no payload (config, start, text, end, cancel)"
            )
            return
        context_id = context_id or "default"
        if len(context_id.encode("utf-8", "surrogatepass")) > MAX_CONTEXT_ID_BYTES:
            self._error(wire.INVALID_INPUT, f"contextId exceeds {MAX_CONTEXT_ID_BYTES} bytes")
            return
        kind = payloads[0]
        if not self._authenticated and kind != wire.CONFIG:
            self._reject_credentials("credentials required before " + kind)
            return
        self._HANDLERS[kind](self, context_id, message[kind], now)

    def receive_bytes(self, data: bytes, now: float) -> None:
        if not self._open:
            return
        if len(data) > MAX_MESSAGE_BYTES:
            self._error(wire.INVALID_INPUT, f"message exceeds {MAX_MESSAGE_BYTES} bytes")
            self._close(_CLOSE_TOO_BIG, "message too big")
            return
        self._undecodable("binary (Protobuf) messages are not supported by this server")

    def _on_config(self, context_id: str, body: object, now: float) -> None:
        if self._start_seen or self._config_seen:
            self._error(wire.INVALID_INPUT, "send at most one config, before the first start")
            return
        self._config_seen = True
        if not isinstance(body, dict):
            self._error(wire.INVALID_INPUT, "config must be an object")
            return
        if "authorization" in body and not self._accept_config_credentials(body["authorization"]):
            return
        if not self._authenticated:
            self._reject_credentials("credentials required")
            return
        license_json = body.get(wire.LICENSE, "")
        defaults = body.get(wire.DEFAULTS, {})
        problem = "config.license must be a string" if not isinstance(license_json, str) else None
        problem = problem or _check_synthesis(defaults, "config.defaults")
        if problem:
            self._error(wire.INVALID_INPUT, problem)
            return
        self._defaults = {k: v for k, v in defaults.items() if k != wire.TEXT}

    def _on_start(self, context_id: str, body: object, now: float) -> None:
        self._start_seen = True
        if context_id in self._contexts:
            self._error(wire.INVALID_INPUT, f"duplicate start for open context {context_id!r}")
            return
        if len(self._contexts) >= min(self._options.max_contexts, CODA_MAX_CONTEXTS):
            self._error(
                wire.RESOURCE_EXHAUSTED,
                f"the connection already has {len(self._contexts)} open contexts",
            )
            return
        problem = _check_synthesis(body, wire.START)
        ctx = None
        if problem is None and isinstance(body, dict):
            ctx, problem = self._new_context(context_id, {**self._defaults, **body})
        if ctx is None:
            self._error(wire.INVALID_INPUT, problem or "invalid start", context_id)
            return
        self._contexts[context_id] = ctx
        self._send({wire.CONTEXT_ID: context_id, wire.STARTED: {wire.REQUEST_ID: ctx.request_id}})
        text = body.get(wire.TEXT, "") if isinstance(body, dict) else ""
        if not ctx.streaming:
            ctx.queue.append(text)
            ctx.input_ended = True
        self._pump(ctx)

    def _on_text(self, context_id: str, body: object, now: float) -> None:
        ctx = self._contexts.get(context_id)
        if ctx is None or not ctx.streaming or ctx.input_ended:
            self._error(
                wire.INVALID_INPUT, f"text outside an open streaming input ({context_id!r})"
            )
            return
        if not isinstance(body, str):
            self._error(wire.INVALID_INPUT, "text must be a string")
            return
        if ctx.split == wire.SPLIT_STRATEGY_ACCUMULATE_SENTENCE:
            *complete, ctx.buffer = _SENTENCE_END.split(ctx.buffer + body)
            ctx.queue.extend(complete)
        elif ctx.split == "SPLIT_STRATEGY_SENTENCE":
            ctx.queue.extend(_SENTENCE_END.split(body))
        else:
            ctx.queue.append(body)
        self._pump(ctx)

    def _on_end(self, context_id: str, body: object, now: float) -> None:
        ctx = self._contexts.get(context_id)
        if ctx is None or not ctx.streaming or ctx.input_ended:
            return  # the seed: a repeated end, or one for complete/unknown contexts, has no effect
        ctx.input_ended = True
        ctx.queue.append(ctx.buffer)
        ctx.buffer = ""
        self._pump(ctx)

    def _on_cancel(self, context_id: str, body: object, now: float) -> None:
        ctx = self._contexts.pop(context_id, None)
        if ctx is not None and ctx.job_id is not None:
            self._jobs.pop(ctx.job_id, None)
            self._actions.append(CancelSynthesis(ctx.job_id))
        self._send({wire.CONTEXT_ID: context_id, wire.CANCELLED: {}})

    _HANDLERS: ClassVar[dict[str, Callable[[CodaServerSession, str, object, float], None]]] = {
        wire.CONFIG: _on_config,
        wire.START: _on_start,
        wire.TEXT: _on_text,
        wire.END: _on_end,
        wire.CANCEL: _on_cancel,
    }

    # ----------------------------------------------------------- synthesis

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        ctx = self._jobs.get(job_id)
        if ctx is None:
            return  # cancelled or finished: dropped at the boundary
        offset_s = ctx.job_start_samples / ctx.sample_rate_hz  # words: from the job's start
        ctx.spans.extend(offset_words(words, offset_s))
        data, ctx.carry = whole_samples(ctx.carry, pcm)
        ctx.samples_sent += len(data) // 2
        encoded = encode_pcm(ctx.wire, data)
        if ctx.wire == "wav" and not ctx.header_sent:
            encoded = _wav_header(ctx.sample_rate_hz) + encoded
            ctx.header_sent = True
        for piece in byte_chunks(encoded, MAX_AUDIO_CHUNK_BYTES):
            chunk = base64.b64encode(piece).decode("ascii")
            self._send({wire.CONTEXT_ID: ctx.context_id, wire.AUDIO: chunk})

    def synthesis_done(self, job_id: str, now: float) -> None:
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        self._pump(ctx)

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None:
        self._fail_job(job_id, ERROR_KIND_INTERNAL, message)

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """At capacity: the seed's ``unavailable`` kind, scoped to the context."""
        self._fail_job(job_id, ERROR_KIND_UNAVAILABLE, message)

    def _fail_job(self, job_id: str, kind: str, message: str) -> None:
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        self._contexts.pop(ctx.context_id, None)
        body = {wire.KIND: kind, wire.MESSAGE: message, wire.REQUEST_ID: ctx.request_id}
        self._send({wire.CONTEXT_ID: ctx.context_id, wire.ERROR: body})

    # ------------------------------------------------------------- helpers

    def _new_context(self, context_id: str, merged: dict[str, Any]) -> tuple[_Context | None, str]:
        """Build a context from a merged synthesis object, or say why not."""
        audio = merged.get(wire.AUDIO_PARAMETERS, {})
        mime = audio.get(wire.AUDIO_FORMAT, "")
        if not mime:
            return None, "audioParameters.audioFormat is required"
        encoding = _FORMATS.get(mime.strip().lower(), "wav")
        if encoding is None:
            return None, f"audio format {mime!r} is not supported by this server"
        voice = merged.get(wire.SPEAKER, "") or self._options.default_voice
        if voice not in self._options.voices:
            return None, f"unknown voice {voice!r}"
        language = merged.get(wire.LANGUAGE, "") or DEFAULT_LANGUAGE
        if language not in LANGUAGES:
            return None, f"unsupported language {language!r}; see ready.languages"
        low, high = TIME_SCALE_RANGE
        scale = min(high, max(low, float(audio.get(wire.TIME_SCALE_FACTOR, 1.0))))
        split = merged.get(wire.SPLIT_STRATEGY, DEFAULT_SPLIT_STRATEGY)
        self._request_serial += 1
        return _Context(
            context_id=context_id,
            request_id=f"coda-request-{self._request_serial}",
            voice=voice,
            language=language,
            wire=encoding,
            sample_rate_hz=audio.get(wire.SAMPLING_RATE, DEFAULT_SAMPLING_RATE_HZ),
            speed=1.0 / scale,
            split=split if split in SPLIT_STRATEGIES else DEFAULT_SPLIT_STRATEGY,
            lookahead_tokens=merged.get(wire.CODA_PARAMETERS, {}).get(
                wire.TEXT_LOOKAHEAD_TOKENS, 0
            ),
            timestamps=merged.get(wire.TIMESTAMPS, {}).get(wire.ENABLE, False),
            streaming=not merged.get(wire.TEXT, "").strip(),
        ), ""

    def _pump(self, ctx: _Context) -> None:
        """Start the context's next job, or finish the context when all is done."""
        while ctx.job_id is None and ctx.queue:
            if not self._lookahead_satisfied(ctx):
                return
            text = ctx.queue.popleft().strip()
            if not text:
                continue
            self._job_serial += 1
            ctx.job_id = f"coda-{self._job_serial}"
            ctx.dispatched = True
            ctx.job_start_samples = ctx.samples_sent
            self._jobs[ctx.job_id] = ctx
            self._actions.append(
                Synthesize(ctx.job_id, text, ctx.voice, ctx.sample_rate_hz, ctx.speed)
            )
        if ctx.job_id is None and not ctx.queue and ctx.input_ended:
            self._contexts.pop(ctx.context_id, None)
            self._send({wire.CONTEXT_ID: ctx.context_id, wire.DONE: self._done_body(ctx)})

    def _lookahead_satisfied(self, ctx: _Context) -> bool:
        """Hold a streaming context's first job until ``textLookaheadTokens`` more tokens."""
        if ctx.dispatched or not ctx.streaming or ctx.input_ended or ctx.lookahead_tokens <= 0:
            return True
        later = " ".join(list(ctx.queue)[1:]) + " " + ctx.buffer
        return len(later.split()) >= ctx.lookahead_tokens

    def _done_body(self, ctx: _Context) -> dict[str, Any]:
        if not ctx.timestamps:
            return {}
        duration_s = ctx.samples_sent / ctx.sample_rate_hz
        if duration_s > MAX_ALIGNED_AUDIO_S:
            message = f"audio longer than {MAX_ALIGNED_AUDIO_S:g} s is not aligned"
            return {
                wire.TIMESTAMPS: {
                    wire.STATUS: {wire.CODE: _GRPC_OUT_OF_RANGE, wire.MESSAGE: message}
                }
            }
        spans = [
            {
                wire.TEXT: w.word,
                wire.START: format_duration(w.start_s),
                wire.END: format_duration(w.end_s),
            }
            for w in ctx.spans
        ]
        return {wire.TIMESTAMPS: {wire.STATUS: {}, wire.SPANS: spans}}

    def _accept_config_credentials(self, value: object) -> bool:
        if self._header_credentials:
            self._reject_credentials("credentials in both the upgrade header and config")
            return False
        if not isinstance(value, str) or (
            self._options.api_keys and value not in self._options.api_keys
        ):
            self._reject_credentials("invalid config.authorization")
            return False
        self._authenticated = True
        self._credentials_by = None
        return True

    def _reject_credentials(self, message: str) -> None:
        self._error(wire.UNAUTHENTICATED, message)
        self._close(CLOSE_CREDENTIALS, "invalid credentials")

    def _undecodable(self, message: str) -> None:
        self._error(wire.INVALID_INPUT, message)
        self._close(CLOSE_UNDECODABLE, "undecodable envelope")

    def _error(self, kind: str, message: str, context_id: str | None = None) -> None:
        frame: dict[str, Any] = {wire.ERROR: {wire.KIND: kind, wire.MESSAGE: message}}
        if context_id is not None:
            frame[wire.CONTEXT_ID] = context_id
        self._send(frame)

    def _close(self, code: int, reason: str) -> None:
        self._actions.append(CloseConnection(code, reason))
        self._shut_down()

    def _send(self, message: dict[str, Any]) -> None:
        self._actions.append(SendText(dump_message(message)))


def _check_synthesis(body: object, where: str) -> str | None:
    """Type-check a synthesis object (``start`` or ``config.defaults``); None if fine."""
    if not isinstance(body, dict):
        return f"{where} must be an object"
    for key in (wire.SPEAKER, wire.LANGUAGE, wire.TEXT):
        if key in body and not isinstance(body[key], str):
            return f"{where}.{key} must be a string"
    split = body.get(wire.SPLIT_STRATEGY, DEFAULT_SPLIT_STRATEGY)
    if split not in SPLIT_STRATEGIES and split != "SPLIT_STRATEGY_UNSPECIFIED":
        return f"{where}.splitStrategy {split!r} is not a split strategy"
    return (
        _check_object(body, wire.AUDIO_PARAMETERS, _AUDIO_FIELDS, where)
        or _check_object(body, wire.CODA_PARAMETERS, _CODA_FIELDS, where)
        or _check_object(body, wire.TIMESTAMPS, _TIMESTAMP_FIELDS, where)
    )


def _check_object(
    body: dict[str, Any], key: str, checks: dict[str, Callable[[object], bool]], where: str
) -> str | None:
    value = body.get(key, {})
    if not isinstance(value, dict):
        return f"{where}.{key} must be an object"
    for name, valid in checks.items():
        if name in value and not valid(value[name]):
            return f"{where}.{key}.{name} is invalid"
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_AUDIO_FIELDS: dict[str, Callable[[object], bool]] = {
    wire.AUDIO_FORMAT: lambda v: isinstance(v, str),
    wire.SAMPLING_RATE: lambda v: _is_int(v) and 0 < v <= MAX_SAMPLING_RATE_HZ,  # type: ignore[operator]
    wire.TIME_SCALE_FACTOR: _is_number,
}
_CODA_FIELDS: dict[str, Callable[[object], bool]] = {
    wire.TEXT_LOOKAHEAD_TOKENS: lambda v: _is_int(v) and v >= 0,  # type: ignore[operator]
}
_TIMESTAMP_FIELDS: dict[str, Callable[[object], bool]] = {
    wire.ENABLE: lambda v: isinstance(v, bool),
}


def _wav_header(sample_rate_hz: int) -> bytes:
    """A streaming WAV header (16-bit mono PCM, sizes unknown: 0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    byte_rate = sample_rate_hz * 2
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        *(b"RIFF", unknown, b"WAVE", b"fmt ", 16, 1, 1, sample_rate_hz, byte_rate, 2, 16),
        *(b"data", unknown),
    )


SESSION = CodaServerSession

"""zwst gateway server engine: the provider's side of ``/v1/stream``.

Theory of operation
-------------------
The seed (``004_47f0a1422d27ad55.txt``) has two parts, and so does this module:

* the **session route** (``SESSION_ROUTE``, POST): ``handle_session_request``
  is a pure function that validates the posted session properties and answers
  with the connect URL (the properties as query parameters, plus a
  short-lived signed ``token``);
* the **stream** (``PATHS``): one ``ZwstServerSession`` per accepted
  WebSocket. ``connection_made`` checks the token against the query, then
  JSON frames are validated and answered as the seed describes.

A context is a queue of segments. ``synthesize`` creates the context on first
use (``context_start``, ordinal = order of first use, from 0) and appends its
text, split into segments (``segment_mode: auto``: sentences packed toward a
15-second budget; ``none``: the text is one segment, and over
``MAX_SEGMENT_CHARS`` the socket closes with 4003 ``segment_too_long``). Each
context synthesises one segment at a time, contexts run concurrently::

    segment begins   -> segment_start{queue_depth}, Synthesize(job)
    synthesis_audio  -> timestamps (context-relative), binary frames (<= 40 ms)
    synthesis_done   -> last frame (final flag if the context is over), segment_done
    ...next segment, or (after ``end``) context_done
    cancel           -> CancelSynthesis(job); queue dropped; nothing more is sent
    synthesis_failed -> resumed + the job again on a fresh worker (once, before any
                        audio), else error{context_id} and the context is dropped

The last frame of the running segment is held back until the next audio or
the end of the segment, so the final-flag frame is normally a real audio
frame. When ``end`` arrives after the last segment was already delivered, the
final frame is an empty one (header only), followed by ``context_done``. A
context without ``end`` is finished the same way after
``CONTEXT_IDLE_TIMEOUT_S`` of idleness (seed: ``end`` "lets the server release
the slot immediately rather than waiting for a timeout").

Binary frame header: version 1, flags (bit 0 final), uint16 ordinal, uint32
sequence, uint32 presentation timestamp in ms, in network byte order (the
seed does not state it; ``bridge.providers.zwst.client`` explains and verifies it).

The outbound queue is bounded at about two seconds of audio: the shell
reports its send backlog with ``transport_backlog(bytes_queued, now)``; while
it is over the bound, audio frames are dropped (their sequence numbers are
still used, so the gap is visible), and after ``SLOW_READER_CLOSE_S`` over the
bound the socket closes with 1008 ``slow_reader``.

Bad client input never raises: it gets the seed's ``error`` frame (socket
stays open), or a close code where the seed names one (4003) or where the
connection itself is refused (1008: bad token or session properties).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import ClassVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from bridge.engine import Action, CloseConnection, SendBytes, SendText
from bridge.providers.base import WordTiming
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.server_common import byte_chunks, timing_arrays
from bridge.providers.zwst import wire
from bridge.providers.zwst.wire import (
    CLOSE_POLICY_VIOLATION,
    CLOSE_SEGMENT_TOO_LONG,
    FRAME_VERSION,
    MAX_CONTEXT_ORDINAL,
    MAX_SEGMENT_CHARS,
    SESSION_ROUTE,
    STREAM_PATH,
    WIRE_ENCODING,
    AudioFrameHeader,
    pack_frame_header,
)

__all__ = [
    "PATHS",
    "SESSION",
    "SESSION_ROUTE",
    "SessionProperties",
    "ZwstServerSession",
    "handle_session_request",
    "split_segments",
]

PATHS = (STREAM_PATH,)

#: Ours: sample rates the server renders (the seed names none).
SAMPLE_RATES_HZ = frozenset({8000, 16000, 22050, 24000, 44100, 48000})
#: Seed: the splitter "packs sentences toward a 15-second budget".
SEGMENT_BUDGET_S = 15.0
#: Ours: speaking-rate estimate that turns the budget into characters.
CHARS_PER_SECOND = 15.0
#: Ours: longest ``text`` one ``synthesize`` may carry (a security limit).
MAX_TEXT_CHARS = 5000
#: Ours: longest ``context_id``.
MAX_CONTEXT_ID_CHARS = 128
#: Ours: ``config.speed`` range.
SPEED_RANGE = (0.5, 2.0)
#: Ours: audio per binary frame.
FRAME_MS = 40
#: Seed: "Each session's outbound queue is bounded at about two seconds".
SEND_QUEUE_LIMIT_S = 2.0
#: Ours: how long "a sustained run" over the bound lasts before 1008.
SLOW_READER_CLOSE_S = 5.0
#: Ours: a context with no ``end`` is released after this long idle.
CONTEXT_IDLE_TIMEOUT_S = 15.0
#: Ours: lifetime of a connect token ("the short-lived connect token").
TOKEN_TTL_S = 60.0
TOKEN_PREFIX = "zwst_1."


# ------------------------------------------------------------ session route


@dataclass(frozen=True, slots=True)
class SessionProperties:
    """The session properties (seed "Session properties"), immutable per socket."""

    voice_id: str
    format: str = WIRE_ENCODING
    sample_rate: int = 24000
    normalize_text: bool = True
    word_timestamps: bool = False  # seed: "opt in to the timestamps message"

    def query(self) -> dict[str, str]:
        """The URL query parameters, in the seed's order (token first, added by the caller)."""
        return {
            wire.VOICE_ID: self.voice_id,
            wire.FORMAT: self.format,
            wire.SAMPLE_RATE: str(self.sample_rate),
            wire.NORMALIZE_TEXT: _bool_text(self.normalize_text),
            wire.WORD_TIMESTAMPS: _bool_text(self.word_timestamps),
        }


class _Invalid(ValueError):
    """Invalid session properties: ``code`` is the error name sent back."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _properties_from_body(body: Mapping[str, object], options: ServerOptions) -> SessionProperties:
    voice = body.get(wire.VOICE_ID, options.default_voice)
    fmt = body.get(wire.FORMAT, WIRE_ENCODING)
    rate = body.get(wire.SAMPLE_RATE, 24000)
    normalize = body.get(wire.NORMALIZE_TEXT, True)
    words = body.get(wire.WORD_TIMESTAMPS, False)
    if not isinstance(voice, str) or not isinstance(fmt, str):
        raise _Invalid("invalid_field", "voice_id and format must be strings")
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise _Invalid("invalid_field", "sample_rate must be an integer")
    if not isinstance(normalize, bool) or not isinstance(words, bool):
        raise _Invalid("invalid_field", "normalize_text and word_timestamps must be booleans")
    return _checked(SessionProperties(voice, fmt, rate, normalize, words), options)


def _properties_from_query(query: Mapping[str, str], options: ServerOptions) -> SessionProperties:
    missing = [k for k in (wire.VOICE_ID, wire.FORMAT, wire.SAMPLE_RATE) if k not in query]
    if missing:
        raise _Invalid("invalid_field", f"missing {', '.join(missing)}")
    rate = query[wire.SAMPLE_RATE]
    bools = {
        k: query.get(k, d)
        for k, d in ((wire.NORMALIZE_TEXT, "true"), (wire.WORD_TIMESTAMPS, "false"))
    }
    if not (rate.isascii() and rate.isdigit()) or any(
        v not in ("true", "false") for v in bools.values()
    ):
        raise _Invalid("invalid_field", "sample_rate must be digits, flags true or false")
    props = SessionProperties(
        query[wire.VOICE_ID],
        query[wire.FORMAT],
        int(rate),
        bools[wire.NORMALIZE_TEXT] == "true",
        bools[wire.WORD_TIMESTAMPS] == "true",
    )
    return _checked(props, options)


def _checked(props: SessionProperties, options: ServerOptions) -> SessionProperties:
    if props.voice_id not in options.voices:
        raise _Invalid("unknown_voice", f"unknown voice {props.voice_id!r}")
    if props.format != WIRE_ENCODING:
        raise _Invalid("invalid_field", f"format must be {WIRE_ENCODING!r}")
    if props.sample_rate not in SAMPLE_RATES_HZ:
        rates = ", ".join(str(r) for r in sorted(SAMPLE_RATES_HZ))
        raise _Invalid("invalid_field", f"sample_rate must be one of {rates}")
    return props


def _token_key(options: ServerOptions) -> bytes:
    """The HMAC key: derived from the configured api keys (none: an open server)."""
    return hashlib.sha256("\n".join(sorted(options.api_keys)).encode()).digest()


def _issue_token(props: SessionProperties, options: ServerOptions, expires_at: float | None) -> str:
    claims = json.dumps({"p": asdict(props), "exp": expires_at}, separators=(",", ":"))
    payload = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
    mac = hmac.new(_token_key(options), payload.encode(), hashlib.sha256).digest()
    return TOKEN_PREFIX + payload + "." + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _token_properties(token: str, options: ServerOptions, now: float) -> dict[str, object] | None:
    """The properties a valid, unexpired token was issued for, else ``None``."""
    if not token.startswith(TOKEN_PREFIX) or token.count(".") != 2:
        return None
    payload, _, mac_text = token[len(TOKEN_PREFIX) :].partition(".")
    expected = hmac.new(_token_key(options), payload.encode(), hashlib.sha256).digest()
    try:
        mac = base64.urlsafe_b64decode(mac_text + "=" * (-len(mac_text) % 4))
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(mac, expected) or not isinstance(claims, dict):
        return None
    expires_at, props = claims.get("exp"), claims.get("p")
    if isinstance(expires_at, int | float) and now > expires_at:
        return None
    return props if isinstance(props, dict) else None


def handle_session_request(
    body: bytes,
    options: ServerOptions,
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    now: float | None = None,
) -> tuple[int, bytes]:
    """Answer ``POST SESSION_ROUTE``: ``(status, JSON body)``.

    ``base_url`` is where ``/v1/stream`` is served (``http``/``ws`` schemes
    both work). ``headers`` (lower-case keys) carry ``authorization: Bearer
    <api key>``, required when ``options.api_keys`` is not empty. ``now``
    (the shell's monotonic clock, the same one ``connection_made`` gets) makes
    the token expire after ``TOKEN_TTL_S``; without it the token does not
    expire.

    200 ``{"url", "token", "expires_in"}``; 400 ``{"error", "message"}`` with
    ``invalid_json`` / ``invalid_field`` / ``unknown_voice``; 401 ``unauthorized``.
    """
    if options.api_keys:
        auth = (headers or {}).get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or key.strip() not in options.api_keys:
            return _http_error(401, "unauthorized", "missing or unknown api key")
    try:
        request = json.loads(body) if body.strip() else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _http_error(400, "invalid_json", "the body is not JSON")
    if not isinstance(request, dict):
        return _http_error(400, "invalid_json", "the body is not a JSON object")
    try:
        props = _properties_from_body(request, options)
    except _Invalid as exc:
        return _http_error(400, exc.code, str(exc))
    expires_at = None if now is None else now + TOKEN_TTL_S
    token = _issue_token(props, options, expires_at)
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = urlencode({"token": token, **props.query()})
    url = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + STREAM_PATH, query, ""))
    answer = {wire.URL: url, "token": token, "expires_in": TOKEN_TTL_S}
    return 200, json.dumps(answer).encode()


def _http_error(status: int, code: str, message: str) -> tuple[int, bytes]:
    return status, json.dumps({wire.ERROR: code, wire.MESSAGE: message}).encode()


# --------------------------------------------------------------- segmenting

_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+")


def split_segments(text: str, budget_chars: int, max_chars: int) -> list[str]:
    """``segment_mode: auto``: sentences packed toward ``budget_chars``.

    A sentence longer than ``max_chars`` (the model's input limit) is cut at
    word boundaries (a single longer word is cut hard).
    """
    pieces: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        pieces.extend(_cut_words(sentence, max_chars) if len(sentence) > max_chars else [sentence])
    segments: list[str] = []
    for piece in filter(None, pieces):
        if segments and len(segments[-1]) + 1 + len(piece) <= budget_chars:
            segments[-1] += " " + piece
        else:
            segments.append(piece)
    return segments


def _cut_words(sentence: str, max_chars: int) -> list[str]:
    parts: list[str] = []
    current = ""
    for word in sentence.split():
        while len(word) > max_chars:
            if current:
                parts.append(current)
                current = ""
            parts.append(word[:max_chars])
            word = word[max_chars:]
        if current and len(current) + 1 + len(word) > max_chars:
            parts.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        parts.append(current)
    return parts


# ------------------------------------------------------------------ session


@dataclass(slots=True)
class _Context:
    context_id: str
    ordinal: int
    speed: float
    queue: deque[str] = field(default_factory=deque)
    job_id: str | None = None
    job_text: str = ""
    job_audio: bool = False  # the running job has produced audio
    job_retried: bool = False
    segment_start_samples: int = 0
    samples: int = 0  # audio framed so far: the context's timeline
    sequence: int = 0
    tail: tuple[int, bytes] | None = None  # (pts_ms, payload) held back
    ended: bool = False
    idle_since: float | None = None


Handler = Callable[["ZwstServerSession", dict[str, object], float], None]

_WAITING, _OPEN, _CLOSED = "WAITING", "OPEN", "CLOSED"


class ZwstServerSession:
    """One accepted ``/v1/stream`` WebSocket (see the module docstring).

    After every call, drain ``actions_to_send()`` (``SendText``, ``SendBytes``,
    ``CloseConnection``, ``Synthesize``, ``CancelSynthesis``) and re-arm the
    timer from ``next_deadline()``. The shell also reports its send backlog
    with ``transport_backlog(bytes_queued, now)`` whenever it changes.
    """

    protocol_name: ClassVar[str] = "zwst"

    def __init__(self, options: ServerOptions) -> None:
        self._options = options
        self._actions: list[Action] = []
        self._state = _WAITING
        self._props: SessionProperties | None = None
        self._contexts: dict[str, _Context] = {}
        self._jobs: dict[str, _Context] = {}
        self._finished: set[str] = set()
        self._pending_speed: dict[str, float] = {}
        self._next_ordinal = 0
        self._job_serial = 0
        self._over_limit_since: float | None = None
        self.frames_dropped = 0

    def actions_to_send(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    # ---------------------------------------------------------- connection

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        """Check the token and the session properties of the connect URL.

        A refusal is ``CloseConnection(1008, reason)`` with reason
        ``not_found``, ``invalid_token``, ``unknown_voice`` or ``invalid_field``.
        """
        if path != STREAM_PATH:
            self._refuse("not_found")
            return
        claimed = _token_properties(query.get("token", ""), self._options, now)
        if claimed is None:
            self._refuse("invalid_token")
            return
        try:
            props = _properties_from_query(query, self._options)
        except _Invalid as exc:
            self._refuse(exc.code)
            return
        if asdict(props) != claimed:
            self._refuse("invalid_token")  # the URL was edited after the session route
            return
        self._props = props
        self._state = _OPEN

    def connection_lost(self, now: float) -> None:
        """The socket is gone: stop every job."""
        self._shutdown()

    @property
    def properties(self) -> SessionProperties | None:
        """The session properties, once the connection was accepted."""
        return self._props

    # -------------------------------------------------------------- frames

    def receive_text(self, text: str, now: float) -> None:
        """One client JSON frame; invalid ones get an ``error`` frame."""
        if self._state != _OPEN:
            return
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            self._send_error(None, "invalid JSON")
            return
        if not isinstance(frame, dict):
            self._send_error(None, "a message must be a JSON object")
            return
        kind = frame.get(wire.TYPE)
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self._send_error(_context_id_of(frame), f"unknown message type {kind!r}")
            return
        handler(self, frame, now)

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Clients send only JSON text frames (seed "Sending")."""
        if self._state == _OPEN:
            self._send_error(None, "binary messages are not accepted; send JSON text frames")

    def _on_ping(self, frame: dict[str, object], now: float) -> None:
        self._send(wire.pong())

    def _on_synthesize(self, frame: dict[str, object], now: float) -> None:
        cid = self._context_id(frame)
        text, mode = frame.get(wire.TEXT), frame.get(wire.SEGMENT_MODE, wire.AUTO)
        if cid is None:
            return
        if not isinstance(text, str) or not text.strip():
            self._send_error(cid, "text must be a non-empty string")
            return
        if mode not in (wire.AUTO, wire.NONE):
            self._send_error(cid, 'segment_mode must be "auto" or "none"')
            return
        if len(text) > MAX_TEXT_CHARS:
            self._send_error(cid, f"text is longer than {MAX_TEXT_CHARS} characters")
            return
        if mode == wire.NONE and len(text) > MAX_SEGMENT_CHARS:
            self._close(CLOSE_SEGMENT_TOO_LONG, wire.SEGMENT_TOO_LONG)
            return
        if cid in self._finished:
            self._send_error(cid, "context is finished; use a new context_id for a new turn")
            return
        ctx = self._contexts.get(cid)
        if ctx is not None and ctx.ended:
            self._send_error(cid, "context was ended; no more text may be sent on it")
            return
        if ctx is None:
            ctx = self._new_context(cid)
            if ctx is None:
                return
        if mode == wire.NONE:
            ctx.queue.append(text.strip())
        else:
            budget = int(SEGMENT_BUDGET_S * CHARS_PER_SECOND)
            ctx.queue.extend(split_segments(text, budget, MAX_SEGMENT_CHARS))
        ctx.idle_since = None
        if ctx.job_id is None:
            self._start_segment(ctx)

    def _on_end(self, frame: dict[str, object], now: float) -> None:
        cid = self._context_id(frame)
        if cid is None:
            return
        ctx = self._contexts.get(cid)
        if ctx is None:
            known = cid in self._finished
            self._send_error(cid, "context is already finished" if known else "unknown context")
            return
        ctx.ended = True
        if ctx.job_id is None and not ctx.queue:
            self._finish(ctx)

    def _on_cancel(self, frame: dict[str, object], now: float) -> None:
        """Stop the context now; a cancel racing the context's end is a no-op."""
        cid = self._context_id(frame)
        if cid is None:
            return
        self._pending_speed.pop(cid, None)
        ctx = self._contexts.pop(cid, None)
        if ctx is None:
            return
        self._stop_job(ctx)
        self._finished.add(cid)

    def _on_config(self, frame: dict[str, object], now: float) -> None:
        cid, speed = self._context_id(frame), frame.get(wire.SPEED)
        if cid is None:
            return
        if cid in self._contexts or cid in self._finished:
            self._send_error(cid, "config applies only to a context that has not started yet")
            return
        if speed is None:
            return
        low, high = SPEED_RANGE
        if isinstance(speed, bool) or not isinstance(speed, int | float):
            self._send_error(cid, "speed must be a number")
            return
        if not (math.isfinite(speed) and low <= speed <= high):
            self._send_error(cid, f"speed must be between {low} and {high}")
            return
        if (
            cid not in self._pending_speed
            and len(self._pending_speed) >= self._options.max_contexts
        ):
            self._send_error(cid, "too many configured contexts that have not started")
            return
        self._pending_speed[cid] = float(speed)

    # ----------------------------------------------------------- synthesis

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        """PCM s16le at the session rate, and word timings from the job's start."""
        ctx = self._jobs.get(job_id)
        if ctx is None or self._props is None:
            return  # cancelled: the output is not wanted
        rate = self._props.sample_rate
        ctx.job_audio = True
        if words and self._props.word_timestamps:
            offset_s = ctx.segment_start_samples / rate
            timings = timing_arrays(
                words, offset_s, start_key=wire.START, end_key=wire.END, ndigits=3
            )
            self._send(wire.timestamps(ctx.context_id, timings))
        frame_bytes = rate * FRAME_MS // 1000 * 2
        pcm = pcm[: len(pcm) - len(pcm) % 2]
        for payload in byte_chunks(pcm, frame_bytes):
            pts_ms = ctx.samples * 1000 // rate
            ctx.samples += len(payload) // 2
            if ctx.tail is not None:
                self._send_frame(ctx, *ctx.tail, final=False)
            ctx.tail = (pts_ms, payload)

    def synthesis_done(self, job_id: str, now: float) -> None:
        """The segment is complete: its last frame, ``segment_done``, what follows."""
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        last = ctx.ended and not ctx.queue
        if ctx.tail is not None:
            self._send_frame(ctx, *ctx.tail, final=last)
            ctx.tail = None
        elif last:
            self._send_final_marker(ctx)
        self._send(wire.segment_done(ctx.context_id))
        if last:
            self._send(wire.context_done(ctx.context_id))
            self._forget(ctx)
        elif ctx.queue:
            self._start_segment(ctx)
        else:
            ctx.idle_since = now

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None:
        """Retry once on a fresh job (``resumed``) before any audio; else ``error``."""
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        if not ctx.job_audio and not ctx.job_retried:
            self._send(wire.resumed())
            self._submit_job(ctx, ctx.job_text, retried=True)
            return
        self._contexts.pop(ctx.context_id, None)
        self._finished.add(ctx.context_id)
        self._send_error(ctx.context_id, f"synthesis failed: {message}")

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """At capacity: ``error`` for the context at once (no ``resumed``: no worker was lost)."""
        ctx = self._jobs.pop(job_id, None)
        if ctx is None:
            return
        ctx.job_id = None
        self._contexts.pop(ctx.context_id, None)
        self._finished.add(ctx.context_id)
        self._send_error(ctx.context_id, message)

    # -------------------------------------------------------------- timers

    def transport_backlog(self, bytes_queued: int, now: float) -> None:
        """The shell's send backlog; over ~2 s of audio, frames are dropped."""
        if self._props is None or self._state != _OPEN:
            return
        limit_bytes = SEND_QUEUE_LIMIT_S * self._props.sample_rate * 2
        if bytes_queued <= limit_bytes:
            self._over_limit_since = None
        elif self._over_limit_since is None:
            self._over_limit_since = now
        else:
            self.handle_timer(now)

    def next_deadline(self) -> float | None:
        deadlines = [
            ctx.idle_since + CONTEXT_IDLE_TIMEOUT_S
            for ctx in self._contexts.values()
            if ctx.idle_since is not None
        ]
        if self._over_limit_since is not None:
            deadlines.append(self._over_limit_since + SLOW_READER_CLOSE_S)
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        """Close a sustained slow reader (1008); release idle contexts."""
        if self._state != _OPEN:
            return
        since = self._over_limit_since
        if since is not None and now >= since + SLOW_READER_CLOSE_S:
            self._close(CLOSE_POLICY_VIOLATION, "slow_reader")
            return
        for ctx in list(self._contexts.values()):
            if ctx.idle_since is not None and now >= ctx.idle_since + CONTEXT_IDLE_TIMEOUT_S:
                self._finish(ctx)

    # ------------------------------------------------------------- helpers

    def _context_id(self, frame: Mapping[str, object]) -> str | None:
        """The frame's ``context_id``, or ``None`` after answering with an error."""
        cid = frame.get(wire.CONTEXT_ID)
        if isinstance(cid, str) and 0 < len(cid) <= MAX_CONTEXT_ID_CHARS:
            return cid
        self._send_error(None, f"context_id must be a string of 1 to {MAX_CONTEXT_ID_CHARS} chars")
        return None

    def _new_context(self, cid: str) -> _Context | None:
        if len(self._contexts) >= self._options.max_contexts:
            self._send_error(cid, f"too many open contexts (limit {self._options.max_contexts})")
            return None
        if self._next_ordinal > MAX_CONTEXT_ORDINAL:
            self._send_error(cid, "context ordinals of this connection are used up")
            return None
        speed = self._pending_speed.pop(cid, 1.0)
        ctx = _Context(cid, self._next_ordinal, speed)
        self._next_ordinal += 1
        self._contexts[cid] = ctx
        self._send(wire.context_start(cid))
        return ctx

    def _start_segment(self, ctx: _Context) -> None:
        text = ctx.queue.popleft()
        ctx.segment_start_samples = ctx.samples
        self._send(wire.segment_start(ctx.context_id, len(ctx.queue)))
        self._submit_job(ctx, text, retried=False)

    def _submit_job(self, ctx: _Context, text: str, *, retried: bool) -> None:
        assert self._props is not None
        self._job_serial += 1
        job_id = f"zwst-{ctx.ordinal}-{self._job_serial}"
        ctx.job_id, ctx.job_text, ctx.job_audio, ctx.job_retried = job_id, text, False, retried
        self._jobs[job_id] = ctx
        self._actions.append(
            Synthesize(job_id, text, self._props.voice_id, self._props.sample_rate, ctx.speed)
        )

    def _send_frame(self, ctx: _Context, pts_ms: int, payload: bytes, *, final: bool) -> None:
        header = AudioFrameHeader(FRAME_VERSION, final, ctx.ordinal, ctx.sequence, pts_ms)
        ctx.sequence += 1
        if self._over_limit_since is not None:
            if not final:
                self.frames_dropped += 1
                return
            payload = b""  # the end of the context still gets through
        self._actions.append(SendBytes(pack_frame_header(header) + payload))

    def _send_final_marker(self, ctx: _Context) -> None:
        assert self._props is not None
        self._send_frame(ctx, ctx.samples * 1000 // self._props.sample_rate, b"", final=True)

    def _finish(self, ctx: _Context) -> None:
        """``end`` (or the idle timeout) with nothing left to synthesise."""
        self._send_final_marker(ctx)
        self._send(wire.context_done(ctx.context_id))
        self._forget(ctx)

    def _forget(self, ctx: _Context) -> None:
        self._contexts.pop(ctx.context_id, None)
        self._finished.add(ctx.context_id)

    def _stop_job(self, ctx: _Context) -> None:
        ctx.queue.clear()
        ctx.tail = None
        if ctx.job_id is not None:
            self._jobs.pop(ctx.job_id, None)
            self._actions.append(CancelSynthesis(ctx.job_id))
            ctx.job_id = None

    def _refuse(self, reason: str) -> None:
        self._state = _CLOSED
        self._actions.append(CloseConnection(CLOSE_POLICY_VIOLATION, reason))

    def _close(self, code: int, reason: str) -> None:
        self._actions.append(CloseConnection(code, reason))
        self._shutdown()

    def _shutdown(self) -> None:
        for ctx in self._contexts.values():
            self._stop_job(ctx)
        self._contexts.clear()
        self._over_limit_since = None
        self._state = _CLOSED

    def _send(self, frame: dict[str, object]) -> None:
        self._actions.append(SendText(wire.dump(frame)))

    def _send_error(self, cid: str | None, message: str) -> None:
        self._send(wire.error(cid, message))


_HANDLERS: dict[str, Handler] = {
    wire.SYNTHESIZE: ZwstServerSession._on_synthesize,
    wire.END: ZwstServerSession._on_end,
    wire.CANCEL: ZwstServerSession._on_cancel,
    wire.CONFIG: ZwstServerSession._on_config,
    wire.PING: ZwstServerSession._on_ping,
}
"""Frame type -> handler, as functions: a session holding its own bound methods
would be a reference cycle, freed only by a full collection."""


SESSION = ZwstServerSession


def _context_id_of(frame: Mapping[str, object]) -> str | None:
    cid = frame.get(wire.CONTEXT_ID)
    return cid if isinstance(cid, str) else None


def _bool_text(value: bool) -> str:
    return "true" if value else "false"

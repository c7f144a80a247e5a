"""Kletso voice frames: the provider's side, as a small voice agent (``/v1/realtime``).

Theory of operation
-------------------
One ``KletsoServerSession`` per accepted WebSocket (seed
``002_3ce796c82c11903e.txt``). It plays the Kletso agent: it listens to the
caller's 24 kHz microphone frames, decides when a turn is over, and answers
aloud with a deterministic sentence rendered through ``Synthesize``.

Frames (envelopes are our choice, see ``docs/provider-protocols.md, Kletso``): client
``{"type": "voice.start", ...}``; log events ``{"type": "voice.state",
"seq": n, "data": {...}}``; errors ``{"type": "error", "code", "message"}``;
binary ``kind byte + PCM s16le mono 24 kHz``, at most 16 KB a frame.

Voice session::

    (none) --voice.start--> voice.started, avatar.mood, voice.state listening|idle
    active --voice.start--> error conflict
    (none) --any other voice frame or audio--> error voice_unavailable
    active --voice.stop / idle timer / limit timer / synthesis failure--> voice.ended

An answer (``voice.commit``; in ``vad`` mode also end of utterance: 60 ms of
speech, then 600 ms below the energy floor; ``voice.text``) runs::

    voice.transcript (speech only) -> voice.state thinking -> message.created
    -> Synthesize -> voice.state speaking -> 0x02 frames + message.delta
    -> message.completed -> voice.state listening (vad) | idle (ptt)

Answers queue and run one at a time. New speech while an answer is thinking
or speaking interrupts it (``CancelSynthesis``, ``voice.interrupted`` with
``audioEndMs`` = the last ``voice.played`` position, capped at what was
sent); so does new speech after a finished answer whose ``voice.played``
says it was not fully heard.

Rules that keep this module honest:

1. Bad client input never raises: it becomes an ``error`` frame
   (``invalid_request`` where the seed names no code); the socket stays open.
   Only a failed ``Authorization`` closes it (1008).
2. Nothing of a cancelled or finished job goes out, even if the shell still
   delivers it. Audio is always PCM s16le 24 kHz, the only format of the seed.
3. No clock is read: the idle and session-limit timers are deadlines
   (``next_deadline`` / ``handle_timer``); speech detection runs on the
   received samples, so it is the same whatever the arrival times.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

import numpy as np

from bridge.engine import CloseConnection, Outbox, SendBytes, SendText
from bridge.providers.base import WordTiming
from bridge.providers.kletso import wire
from bridge.providers.kletso.wire import (
    CLOSE_POLICY_VIOLATION,
    KIND_ASSISTANT,
    KIND_MIC,
    MAX_FRAME_BYTES,
    MODES,
    SAMPLE_RATE_HZ,
    STOP_REASONS,
)
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize
from bridge.providers.server_common import byte_chunks, whole_samples

__all__ = ["PATHS", "SESSION", "EnergyDetector", "KletsoServerSession"]

PATHS: tuple[str, ...] = ("/v1/realtime",)

BYTES_PER_S: Final = SAMPLE_RATE_HZ * 2
MAX_PLAYED_MS: Final = 10**12
"""Largest ``voice.played`` position taken (about 30 years); larger is refused."""
#: Outbound audio frames: 40 ms (the seed suggests 20-60 ms).
OUT_FRAME_BYTES: Final = BYTES_PER_S * 40 // 1000
#: Security limits (ours; the seed states none for JSON).
MAX_FRAME_CHARS: Final = 64 * 1024
MAX_ITEMS_REMEMBERED: Final = 256
ERROR_RATE_LIMITED: Final = "voice_rate_limited"
"""The seed's error code for a voice model that takes no more work now (a start rate
over the limit, or every synthesis worker busy)."""
#: Deterministic price list for ``usage.costMicros`` (micro-units per second).
COST_IN_MICROS_PER_S: Final = 100
COST_OUT_MICROS_PER_S: Final = 250

JsonObject = dict[str, object]


class _BadFrame(ValueError):
    """Client input the seed does not allow: (code, message) for the error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------- speech detection


class EnergyDetector:
    """End-of-utterance by energy over 20 ms frames of 24 kHz s16le PCM.

    ``process`` returns ``("started", 0)`` after ``start_ms`` of frames at or
    above ``rms_floor``, and ``("ended", speech_ms)`` after ``end_silence_ms``
    below it; ``speech_ms`` runs from the first voiced frame to the last.
    """

    FRAME_BYTES: ClassVar[int] = BYTES_PER_S * 20 // 1000

    def __init__(
        self, rms_floor: float = 500.0, start_ms: int = 60, end_silence_ms: int = 600
    ) -> None:
        self._rms_floor = rms_floor
        self._start_frames = max(1, start_ms // 20)
        self._end_frames = max(1, end_silence_ms // 20)
        self._carry = b""
        self._voiced_run = 0
        self._silent_run = 0
        self._speech_ms: int | None = None

    @property
    def in_speech(self) -> bool:
        return self._speech_ms is not None

    def process(self, pcm_s16le: bytes) -> list[tuple[Literal["started", "ended"], int]]:
        data = self._carry + pcm_s16le
        whole = len(data) // self.FRAME_BYTES * self.FRAME_BYTES
        self._carry = data[whole:]
        if not whole:
            return []
        frames = np.frombuffer(data[:whole], dtype="<i2").astype(np.float64)
        rms = np.sqrt(np.mean(frames.reshape(-1, self.FRAME_BYTES // 2) ** 2, axis=1))
        found: list[tuple[Literal["started", "ended"], int]] = []
        for voiced in (rms >= self._rms_floor).tolist():
            found.extend(self._step(bool(voiced)))
        return found

    def take_speech_ms(self) -> int:
        """The speech of the utterance in progress (0 if none); resets it."""
        speech_ms = self._speech_ms or 0
        self.reset()
        return speech_ms

    def reset(self) -> None:
        self._voiced_run = self._silent_run = 0
        self._speech_ms = None

    def _step(self, voiced: bool) -> list[tuple[Literal["started", "ended"], int]]:
        if self._speech_ms is None:
            self._voiced_run = self._voiced_run + 1 if voiced else 0
            if self._voiced_run >= self._start_frames:
                self._speech_ms, self._silent_run = self._voiced_run * 20, 0
                return [("started", 0)]
            return []
        if voiced:
            self._speech_ms += (self._silent_run + 1) * 20
            self._silent_run = 0
            return []
        self._silent_run += 1
        if self._silent_run < self._end_frames:
            return []
        speech_ms = self._speech_ms
        self.reset()
        return [("ended", speech_ms)]


# ------------------------------------------------------------------ state


@dataclass(slots=True)
class _Item:
    """One assistant answer being rendered (``item_id`` doubles as the job id)."""

    item_id: str
    text: str
    sent_bytes: int = 0
    carry: bytes = b""
    words: list[str] = field(default_factory=list)
    speaking: bool = False
    played_ms: int | None = None


@dataclass(slots=True)
class _Heard:
    """A finished answer, kept for ``voice.played`` and late interruption."""

    item_id: str
    sent_ms: int
    played_ms: int | None = None
    interrupted: bool = False


Handler = Callable[["KletsoServerSession", JsonObject, float], None]


class KletsoServerSession(Outbox):
    """Provider side of Kletso's voice frames (see the module docstring).

    After every call, drain ``actions_to_send()``: ``SendText`` / ``SendBytes``
    frames, ``Synthesize`` / ``CancelSynthesis`` jobs, ``CloseConnection``.

    Keywords (the seed's configuration knobs, not in ``ServerOptions``):
    ``not_configured`` answers every ``voice.start`` with ``not_configured``;
    ``voice_enabled=False`` with ``voice_unavailable``; more than
    ``max_starts_per_minute`` starts get ``voice_rate_limited``.
    """

    protocol_name: ClassVar[str] = "kletso"

    def __init__(
        self,
        options: ServerOptions,
        *,
        not_configured: bool = False,
        voice_enabled: bool = True,
        model: str = "kletso-voice-1",
        max_seconds: float = 600.0,
        idle_seconds: float = 60.0,
        max_starts_per_minute: int = 10,
        detector: EnergyDetector | None = None,
    ) -> None:
        super().__init__()
        self._options = options
        self._not_configured = not_configured
        self._voice_enabled = voice_enabled
        self._model = model
        self._max_seconds = max_seconds
        self._idle_seconds = idle_seconds
        self._max_starts_per_minute = max_starts_per_minute
        self._detector = detector or EnergyDetector()
        self._open = False
        self._seq = 0
        self._sessions = 0
        self._items = 0
        self._starts: deque[float] = deque()
        self._session_id: str | None = None
        self._mode = wire.PTT
        self._state = wire.IDLE
        self._limit_at: float | None = None
        self._active_at = 0.0
        self._in_bytes = self._out_bytes = 0
        self._ptt_speech_ms = 0
        self._queue: deque[tuple[str, str]] = deque()  # (kind, reply text)
        self._item: _Item | None = None
        self._heard: _Heard | None = None
        self._known_items: deque[str] = deque(maxlen=MAX_ITEMS_REMEMBERED)

    # ------------------------------------------------------- connection

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        """Check the bearer token (when keys are configured); the socket is then open."""
        keys = self._options.api_keys
        if keys and headers.get("authorization", "") not in {f"Bearer {k}" for k in keys}:
            self._actions.append(CloseConnection(CLOSE_POLICY_VIOLATION, "unauthorized"))
            return
        self._open = True

    def connection_lost(self, now: float) -> None:
        self._open = False
        if self._item is not None:
            self._actions.append(CancelSynthesis(self._item.item_id))
            self._item = None
        self._session_id = None

    # ------------------------------------------------------- client frames

    def receive_text(self, text: str, now: float) -> None:
        """One JSON control frame; bad input becomes an ``error`` frame."""
        if not self._open:
            return
        try:
            msg = _parse(text)
            frame_type = str(msg[wire.TYPE])
            handler = _HANDLERS.get(frame_type)
            if handler is None:
                raise _BadFrame("invalid_request", f"unknown frame type {frame_type[:64]!r}")
            if self._session_id is None and frame_type != wire.VOICE_START:
                raise _BadFrame(wire.VOICE_UNAVAILABLE, f"{frame_type} before voice.start")
            handler(self, msg, now)
        except _BadFrame as exc:
            self._error(exc.code, str(exc))

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Microphone audio (kind 0x01): usage, speech detection, barge-in."""
        if not self._open:
            return
        problem = _check_audio_frame(data)
        if problem:
            self._error("invalid_request", problem)
            return
        if self._session_id is None:
            self._error(wire.VOICE_UNAVAILABLE, "audio before voice.start")
            return
        pcm = data[1:]
        self._in_bytes += len(pcm)
        for what, speech_ms in self._detector.process(pcm):
            if what == "started":
                self._on_speech_started(now)
            else:
                self._on_speech_ended(speech_ms, now)
        if self._detector.in_speech:
            self._active_at = now

    # ------------------------------------------------------- frame handlers

    def _on_start(self, msg: JsonObject, now: float) -> None:
        if self._session_id is not None:
            raise _BadFrame(wire.CONFLICT, "a voice session is already running")
        mode = msg.get(wire.MODE)
        if mode not in MODES:
            raise _BadFrame("invalid_request", 'mode must be "vad" or "ptt"')
        rate = msg.get(wire.SAMPLE_RATE)
        if isinstance(rate, bool) or rate != SAMPLE_RATE_HZ:
            raise _BadFrame("invalid_request", "sampleRate must be 24000")
        client_id = msg.get(wire.CLIENT_ID)
        if not isinstance(client_id, str) or not client_id:
            raise _BadFrame("invalid_request", "clientId must be a non-empty string")
        if self._not_configured:
            self._error(wire.NOT_CONFIGURED, "no OpenAI key on the agent")
            self._log(
                wire.VOICE_ENDED, {wire.REASON: wire.NOT_CONFIGURED, wire.USAGE: _usage(0, 0)}
            )
            return
        if not self._voice_enabled:
            raise _BadFrame(wire.VOICE_UNAVAILABLE, "voice is off for this agent")
        while self._starts and self._starts[0] <= now - 60.0:
            self._starts.popleft()
        if len(self._starts) >= self._max_starts_per_minute:
            raise _BadFrame(wire.VOICE_RATE_LIMITED, "too many voice sessions, retry later")
        self._starts.append(now)
        self._begin_session(str(mode), now)

    def _on_stop(self, msg: JsonObject, now: float) -> None:
        if msg.get(wire.REASON) not in STOP_REASONS:
            raise _BadFrame("invalid_request", 'reason must be "user" or "background"')
        self._end_session("user")

    def _on_commit(self, msg: JsonObject, now: float) -> None:
        speech_ms = self._ptt_speech_ms + self._detector.take_speech_ms()
        self._ptt_speech_ms = 0
        self._active_at = now
        self._heard_speech(speech_ms, now)

    def _on_played(self, msg: JsonObject, now: float) -> None:
        item_id = msg.get(wire.ITEM_ID)
        ms = msg.get(wire.MS)
        if not isinstance(item_id, str) or not item_id:
            raise _BadFrame("invalid_request", "itemId must be a string")
        if isinstance(ms, bool) or not isinstance(ms, int | float):
            raise _BadFrame("invalid_request", "ms must be a number")
        # (a JSON integer too large for a double made math.isfinite raise OverflowError)
        if not 0 <= ms < MAX_PLAYED_MS or (isinstance(ms, float) and not math.isfinite(ms)):
            raise _BadFrame("invalid_request", "ms must be a finite number >= 0")
        if item_id != wire.CURRENT and item_id not in self._known_items:
            raise _BadFrame("invalid_request", f"unknown itemId {item_id[:64]!r}")
        item, heard = self._item, self._heard
        if item is not None and item_id in (wire.CURRENT, item.item_id):
            item.played_ms = int(ms)
        elif heard is not None and item_id in (wire.CURRENT, heard.item_id):
            heard.played_ms = int(ms)

    def _on_text(self, msg: JsonObject, now: float) -> None:
        text = msg.get(wire.TEXT)
        if not isinstance(text, str) or not text.strip():
            raise _BadFrame("invalid_request", "text must be a non-empty string")
        self._active_at = now
        user_id = self._new_item_id()
        self._log(
            wire.MESSAGE_CREATED, {wire.ITEM_ID: user_id, wire.ROLE: "user", "modality": wire.TEXT}
        )
        self._log(
            "message.completed",
            {wire.ITEM_ID: user_id, wire.ROLE: "user", "modality": wire.TEXT, wire.TEXT: text},
        )
        self._queue.append((wire.TEXT, f"You wrote: {text}"))
        self._begin_next(now)

    # ------------------------------------------------------- speech

    def _on_speech_started(self, now: float) -> None:
        self._log(wire.VOICE_TRANSCRIPT, {wire.ROLE: "user", wire.TEXT: "", wire.FINAL: False})
        if self._mode == wire.PTT:
            self._set_state(wire.LISTENING)
        self._queue.clear()
        item, heard = self._item, self._heard
        if item is not None:
            self._interrupt(item, now)
        elif heard is not None and not heard.interrupted and heard.played_ms is not None:
            self._interrupt_heard(heard)

    def _interrupt_heard(self, heard: _Heard) -> None:
        """New speech after a finished answer that ``voice.played`` says was cut short."""
        if heard.played_ms is not None and heard.played_ms < heard.sent_ms:
            heard.interrupted = True
            data = {wire.ITEM_ID: heard.item_id, wire.AUDIO_END_MS: heard.played_ms}
            self._log(wire.VOICE_INTERRUPTED, data)

    def _on_speech_ended(self, speech_ms: int, now: float) -> None:
        if self._mode == wire.PTT:
            self._ptt_speech_ms += speech_ms
            return
        self._heard_speech(speech_ms, now)

    def _heard_speech(self, speech_ms: int, now: float) -> None:
        seconds = speech_ms / 1000
        transcript = f"[speech, {seconds:.1f} s]" if speech_ms else "[silence]"
        self._log(
            wire.VOICE_TRANSCRIPT, {wire.ROLE: "user", wire.TEXT: transcript, wire.FINAL: True}
        )
        user_id = self._new_item_id()
        self._log(
            wire.MESSAGE_CREATED, {wire.ITEM_ID: user_id, wire.ROLE: "user", "modality": wire.VOICE}
        )
        done = {
            wire.ITEM_ID: user_id,
            wire.ROLE: "user",
            "modality": wire.VOICE,
            wire.TEXT: transcript,
        }
        self._log("message.completed", done)
        reply = f"I heard you speak for {seconds:.1f} seconds." if speech_ms else "I heard nothing."
        self._queue.append(("speech", reply))
        self._begin_next(now)

    # ------------------------------------------------------- answers

    def _begin_next(self, now: float) -> None:
        if self._item is not None or not self._queue or self._session_id is None:
            return
        _, text = self._queue.popleft()
        item = _Item(self._new_item_id(), text)
        self._item = item
        self._set_state(wire.THINKING)
        data = {wire.ITEM_ID: item.item_id, wire.ROLE: wire.ASSISTANT, "modality": wire.VOICE}
        self._log(wire.MESSAGE_CREATED, data)
        voice = self._options.default_voice
        self._actions.append(Synthesize(item.item_id, text, voice, SAMPLE_RATE_HZ))

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None:
        """Send the job's PCM as 0x02 frames and its words as ``message.delta``."""
        item = self._item
        if item is None or item.item_id != job_id:
            return
        if not item.speaking:
            item.speaking = True
            self._set_state(wire.SPEAKING)
        data, item.carry = whole_samples(item.carry, pcm)
        for chunk in byte_chunks(data, OUT_FRAME_BYTES):
            self._actions.append(SendBytes(bytes([KIND_ASSISTANT]) + chunk))
        item.sent_bytes += len(data)
        self._out_bytes += len(data)
        if words:
            delta = " ".join(w.word for w in words)
            if item.words:
                delta = " " + delta
            item.words.extend(w.word for w in words)
            self._log("message.delta", {wire.ITEM_ID: item.item_id, "delta": delta})

    def synthesis_done(self, job_id: str, now: float) -> None:
        """The answer is complete: ``message.completed``, then the next answer or rest."""
        item = self._item
        if item is None or item.item_id != job_id:
            return
        if not item.words:
            self._log("message.delta", {wire.ITEM_ID: item.item_id, "delta": item.text})
        self._complete(item, item.text)
        self._heard = _Heard(item.item_id, _ms(item.sent_bytes), item.played_ms)
        self._active_at = now
        if self._queue:
            self._begin_next(now)
        else:
            self._set_state(self._resting_state())

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None:
        """The voice model failed: ``voice_provider_error``, then ``voice.ended`` (error)."""
        item = self._item
        if item is None or item.item_id != job_id:
            return
        self._item = None
        self._error(wire.VOICE_PROVIDER_ERROR, f"synthesis failed: {message}")
        self._end_session(wire.ERROR)

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """At capacity: ``voice_rate_limited``, then ``voice.ended`` (error)."""
        item = self._item
        if item is None or item.item_id != job_id:
            return
        self._item = None
        self._error(ERROR_RATE_LIMITED, message)
        self._end_session(wire.ERROR)

    def _interrupt(self, item: _Item, now: float) -> None:
        self._actions.append(CancelSynthesis(item.item_id))
        self._item = None
        sent_ms = _ms(item.sent_bytes)
        end_ms = min(item.played_ms or 0, sent_ms)
        self._log(wire.VOICE_INTERRUPTED, {wire.ITEM_ID: item.item_id, wire.AUDIO_END_MS: end_ms})
        self._complete(item, " ".join(item.words))
        self._heard = _Heard(item.item_id, sent_ms, end_ms, interrupted=True)
        self._set_state(wire.LISTENING)

    def _complete(self, item: _Item, text: str) -> None:
        self._item = None
        data = {
            wire.ITEM_ID: item.item_id,
            wire.ROLE: wire.ASSISTANT,
            "modality": wire.VOICE,
            wire.TEXT: text,
        }
        self._log("message.completed", data)

    # ------------------------------------------------------- session

    def _begin_session(self, mode: str, now: float) -> None:
        self._sessions += 1
        self._session_id = f"vs_{self._sessions}"
        self._mode = mode
        self._limit_at = now + self._max_seconds
        self._active_at = now
        self._in_bytes = self._out_bytes = self._ptt_speech_ms = 0
        self._detector.reset()
        self._heard = None
        limits = {wire.MAX_SECONDS: self._max_seconds, wire.IDLE_SECONDS: self._idle_seconds}
        voice = self._options.default_voice
        data = {wire.VOICE_SESSION_ID: self._session_id, wire.MODEL: self._model, wire.VOICE: voice}
        self._log(wire.VOICE_STARTED, {**data, wire.LIMITS: limits})
        self._log("avatar.mood", {"mood": "neutral", "source": "rule"})
        self._state = ""  # announce the first state whatever it is
        self._set_state(self._resting_state())

    def _end_session(self, reason: str) -> None:
        if self._item is not None:
            self._actions.append(CancelSynthesis(self._item.item_id))
            self._item = None
        self._queue.clear()
        self._set_state(wire.IDLE)
        self._log(
            wire.VOICE_ENDED,
            {wire.REASON: reason, wire.USAGE: _usage(self._in_bytes, self._out_bytes)},
        )
        self._session_id = None
        self._limit_at = None

    def _resting_state(self) -> str:
        return wire.LISTENING if self._mode == wire.VAD else wire.IDLE

    # ------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        if self._session_id is None:
            return None
        deadlines = [self._limit_at]
        if self._item is None and not self._queue:
            deadlines.append(self._active_at + self._idle_seconds)
        return min(d for d in deadlines if d is not None)

    def handle_timer(self, now: float) -> None:
        """End the session at ``maxSeconds`` (limit) or after ``idleSeconds`` of quiet (idle)."""
        if self._session_id is None:
            return
        if self._limit_at is not None and now >= self._limit_at:
            self._end_session("limit")
            return
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            self._end_session(wire.IDLE)

    # ------------------------------------------------------- output

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self._log(wire.VOICE_STATE, {wire.STATE: state})

    def _log(self, event_type: str, data: Mapping[str, object]) -> None:
        self._seq += 1
        frame = {wire.TYPE: event_type, "seq": self._seq, wire.DATA: data}
        self._actions.append(SendText(json.dumps(frame, separators=(",", ":"))))

    def _error(self, code: str, message: str) -> None:
        frame = {wire.TYPE: wire.ERROR, wire.CODE: code, wire.MESSAGE: message}
        self._actions.append(SendText(json.dumps(frame, separators=(",", ":"))))

    def _new_item_id(self) -> str:
        self._items += 1
        item_id = f"item_{self._items}"
        self._known_items.append(item_id)
        return item_id


_HANDLERS: dict[str, Handler] = {
    wire.VOICE_START: KletsoServerSession._on_start,
    wire.VOICE_STOP: KletsoServerSession._on_stop,
    wire.VOICE_COMMIT: KletsoServerSession._on_commit,
    wire.VOICE_PLAYED: KletsoServerSession._on_played,
    wire.VOICE_TEXT: KletsoServerSession._on_text,
}
"""Frame type -> handler, as functions: a session holding its own bound methods
would be a reference cycle, freed only by a full collection."""


# ---------------------------------------------------------------- helpers


def _parse(text: str) -> JsonObject:
    if len(text) > MAX_FRAME_CHARS:
        raise _BadFrame("invalid_request", f"frame over {MAX_FRAME_CHARS} characters")
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):
        raise _BadFrame("invalid_request", "frame is not valid JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get(wire.TYPE), str):
        raise _BadFrame("invalid_request", "frame must be an object with a string type")
    return msg


def _check_audio_frame(data: bytes) -> str:
    """Why a client binary frame breaks the seed's rules ("" if it does not)."""
    if not data:
        return "empty binary frame"
    if len(data) > MAX_FRAME_BYTES:
        return f"binary frame of {len(data)} bytes is over 16 KB"
    if data[0] != KIND_MIC:
        return f"binary kind 0x{data[0]:02x} is not microphone audio (0x01)"
    if (len(data) - 1) % 2:
        return "PCM payload must be whole 16-bit samples"
    return ""


def _ms(pcm_bytes: int) -> int:
    return pcm_bytes * 1000 // BYTES_PER_S


def _usage(in_bytes: int, out_bytes: int) -> JsonObject:
    in_s, out_s = in_bytes / BYTES_PER_S, out_bytes / BYTES_PER_S
    cost = round(in_s * COST_IN_MICROS_PER_S + out_s * COST_OUT_MICROS_PER_S)
    return {
        wire.AUDIO_IN_SECONDS: round(in_s, 3),
        wire.AUDIO_OUT_SECONDS: round(out_s, 3),
        wire.COST_MICROS: cost,
    }


SESSION = KletsoServerSession

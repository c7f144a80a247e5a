"""Kletso voice frames: the client engine (config name ``kletso``).

Theory of operation
-------------------
Kletso (seed ``002_3ce796c82c11903e.txt``) is a speech-to-speech voice
*agent* on the realtime chat WebSocket (``wss://api.kletso.ai/v1/realtime``),
not a plain TTS: whatever we send, the agent answers aloud in its own words.
One engine is one WebSocket carrying at most one voice session.

Client frames are JSON ``{"type": "voice.start", ...fields}``; the agent
writes log events ``{"type": "voice.started", "data": {...}}`` and errors
``{"type": "error", "code": ..., "message": ...}`` (the seed gives no
envelope; these are our choice, see ``docs/provider-protocols.md, Kletso``). Audio is
binary: byte 0 is the kind (0x01 microphone up, 0x02 assistant down), then
PCM s16le mono 24 kHz, each frame at most 16 KB. Audio is never 8 kHz G.711,
so every ``AudioReceived`` says ``pcm_s16le`` at 24000 whatever the turn
asked for; the ``Call`` resamples.

Voice session (one per connection)::

    IDLE --start_voice/open_turn--> STARTING --voice.started--> ACTIVE
    ACTIVE --stop_voice--> STOPPING --voice.ended--> IDLE
    STARTING --error voice_rate_limited / voice_provider_error--> IDLE

Frames the caller asks for while STARTING (audio, commit, ``voice.text``)
are held and flushed in order after ``voice.started``, so nothing reaches the
agent before its session exists (it would answer ``voice_unavailable``).

Turns (the ``TtsProtocol`` side): ``open_turn`` starts a session if needed,
``send_text`` collects text, ``end_turn`` sends it as one ``voice.text``.
The protocol has no reply ids, so replies are matched to ``voice.text``
frames in order (a FIFO of owners). A reply begins at ``message.created``
(role assistant), ``voice.state`` speaking or its first audio frame, and ends
at any other ``voice.state``, ``voice.interrupted``, the next reply or
``voice.ended``. A reply with no owner answers the caller's speech; it gets a
turn id ``voice-N`` of its own (``TurnStarted`` tells the ``Call``).

``cancel`` is the seed's interruption report: ``voice.played`` with the
played position, sent at once. The turn is done (``TurnDone(cancelled=True)``)
immediately; its owner slot stays as a tombstone so the rest of its reply is
dropped here and never reaches the ``Call``. A reply the agent streamed
faster than real time is done here long before the caller has heard it: a
``cancel`` of one of the last few such turns still sends ``voice.played``
(nothing else: the turn was done).

Timers (``next_deadline`` / ``handle_timer``): ``voice.played`` every 500 ms
while a live reply is speaking (position from ``set_played_position``), and
a reply timeout per ``voice.text`` (option ``reply_timeout_s``).

Rules that keep this module honest:

1. Bad remote input never raises: malformed JSON, a known frame with wrong
   fields or an over-size / odd-length audio frame is a ``ProviderFailed``
   (``protocol_error``) and a close; unknown frame types, ``avatar.mood``,
   ``message.*``, ``tool.*`` and ``ui.*`` are ignored.
2. The API key goes only into the ``Authorization`` header; it is redacted
   from every message the server sends back.
3. No clock is read: ``now`` is a parameter everywhere.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Final, Literal

from bridge.engine import (
    Action,
    CloseConnection,
    Event,
    LocalProtocolError,
    Outbox,
    SendBytes,
    SendText,
)
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
    UsageReported,
    VoiceEnded,
    VoiceFailed,
    VoiceInterrupted,
    VoiceUsage,
)
from bridge.providers.client_common import bearer_headers, scrub_secret
from bridge.providers.kletso import wire
from bridge.providers.kletso.wire import (
    KIND_ASSISTANT,
    KIND_MIC,
    MAX_FRAME_BYTES,
    MODES,
    SAMPLE_RATE_HZ,
    STOP_REASONS,
)

__all__ = [
    "ENGINE",
    "KletsoProtocol",
    "TranscriptReceived",
    "VoiceEnded",
    "VoiceFailed",
    "VoiceInterrupted",
    "VoiceLimits",
    "VoiceStarted",
    "VoiceStateChanged",
    "VoiceUsage",
]

logger = logging.getLogger(__name__)

DEFAULT_URL: Final = "wss://api.kletso.ai/v1/realtime"
PCM_24K: Final = AudioFormat("pcm_s16le", SAMPLE_RATE_HZ)
#: Largest whole-sample payload that fits a frame after its kind byte.
MAX_PAYLOAD_BYTES: Final = (MAX_FRAME_BYTES - 1) // 2 * 2
PLAYED_INTERVAL_S: Final = 0.5
#: Replies streamed whole that a barge-in can still report as played.
FINISHED_REMEMBERED: Final = 8
VOICE_STATES: Final = frozenset({wire.LISTENING, wire.THINKING, wire.SPEAKING, wire.IDLE})

#: Security limits (ours; the seed states none for JSON).
MAX_TEXT_FRAME_BYTES: Final = 64 * 1024
MAX_MESSAGE_BYTES: Final = 1024 * 1024
MAX_HELD_AUDIO_BYTES: Final = 2 * SAMPLE_RATE_HZ * 2  # 2 s held while STARTING

#: error code -> (scope, retryable). Scope "connection" ends the engine,
#: "session" ends the voice session, "conflict" resyncs; others fail requests.
ERROR_TABLE: Final[dict[str, tuple[str, bool]]] = {
    wire.NOT_CONFIGURED: ("connection", False),
    wire.VOICE_UNAVAILABLE: ("connection", False),
    wire.VOICE_RATE_LIMITED: ("session", True),
    wire.VOICE_PROVIDER_ERROR: ("session", True),
    wire.CONFLICT: (wire.CONFLICT, False),
}

VoiceMode = Literal["vad", "ptt"]
JsonObject = dict[str, object]


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class VoiceLimits:
    """``voice.started.limits``: session caps in seconds (``None`` if absent)."""

    max_seconds: float | None
    idle_seconds: float | None


@dataclass(frozen=True, slots=True)
class VoiceStarted(Event):
    """``voice.started``: the agent opened the voice session."""

    voice_session_id: str
    model: str
    voice: str
    limits: VoiceLimits


@dataclass(frozen=True, slots=True)
class VoiceStateChanged(Event):
    """``voice.state``: listening, thinking, speaking or idle."""

    state: str


@dataclass(frozen=True, slots=True)
class TranscriptReceived(Event):
    """``voice.transcript``: what the agent heard (role ``user``)."""

    role: str
    text: str
    final: bool


# ------------------------------------------------------------------ state


class _Session(Enum):
    IDLE = wire.IDLE
    STARTING = "starting"
    ACTIVE = "active"
    STOPPING = "stopping"


class _Malformed(ValueError):
    """A known server frame with missing or mistyped fields."""


@dataclass(slots=True)
class _Turn:
    turn_id: str
    parts: list[str]
    phase: Literal["collecting", "held", "awaiting", "speaking"] = "collecting"


@dataclass(slots=True)
class _Reply:
    turn_id: str
    item_id: str | None
    live: bool
    is_text_turn: bool


Handler = Callable[["KletsoProtocol", JsonObject, float], None]


class KletsoProtocol(Outbox):
    """Client side of Kletso's voice frames (see the module docstring).

    After every call, drain ``actions_to_send()`` (``SendText``, ``SendBytes``,
    ``CloseConnection``) and ``events_received()``, and re-arm the timer from
    ``next_deadline()``.
    """

    protocol_name: ClassVar[str] = "kletso"
    max_turns: ClassVar[int] = 1

    def __init__(self, settings: ProviderSettings) -> None:
        super().__init__()
        self._settings = settings
        mode = str(settings.option("mode", "ptt"))
        if mode not in MODES:
            raise ValueError(f"kletso option mode must be vad or ptt, not {mode!r}")
        self._mode: VoiceMode = wire.VAD if mode == wire.VAD else wire.PTT
        self._client_id = str(settings.option("client_id", "callbridge"))
        self._reply_timeout_s = float(settings.option("reply_timeout_s", 15.0))
        self._connected = False
        self._closed = False
        self._closed_by_us = False
        self._failed = False
        self._session = _Session.IDLE
        self._held: list[tuple[Action, str | None]] = []
        self._held_audio_bytes = 0
        self._turn: _Turn | None = None
        self._owners: deque[str | None] = deque()
        self._reply: _Reply | None = None
        self._voice_replies = 0
        self._streamed: deque[tuple[str, str | None]] = deque(maxlen=FINISHED_REMEMBERED)
        """Replies streamed whole (turn id, item id), the newest last: the caller may still
        be hearing them, so a cancel still reports the played position."""
        self._server_state = wire.IDLE
        self._played_item_id = wire.CURRENT
        self._played_ms = 0
        self._played_at: float | None = None
        self._reply_deadline_at: float | None = None

    # ------------------------------------------------------- connection

    def session_request(self) -> HttpRequest | None:
        """Kletso needs no HTTP step before the WebSocket."""
        return None

    def session_response(self, status: int, body: bytes, now: float) -> None:
        """Never called: ``session_request()`` is always ``None``."""

    def connect_params(self) -> ConnectParams:
        """The realtime URL with the key as a bearer token (our choice: the seed names none)."""
        url = self._settings.url or DEFAULT_URL
        return ConnectParams(
            url=url,
            headers=bearer_headers(self._settings.api_key),
            max_message_bytes=MAX_MESSAGE_BYTES,
        )

    def connection_made(self, subprotocol: str | None, now: float) -> None:
        """The upgrade completed; Kletso negotiates no subprotocol."""
        self._connected = True
        self._events.append(ConnectionReady())

    def connection_lost(self, code: int | None, reason: str, now: float) -> None:
        """The socket is gone: every open turn fails (unless we closed an idle one)."""
        if self._failed:
            return
        ids = self._open_turn_ids()
        self._closed = True
        self._failed = True
        self._clear_all()
        if ids or not self._closed_by_us:
            message = self._redact(f"connection closed (code {code}): {reason}")
            self._events.append(ProviderFailed("connection_closed", message, ids, True))

    @property
    def ready(self) -> bool:
        return self._connected and not self._closed and not self._failed

    def close(self, now: float) -> None:
        """Close the WebSocket (ends any voice session with it)."""
        if self._closed:
            return
        self._closed = self._closed_by_us = True
        self._actions.append(CloseConnection(1000, "client closing"))

    # ------------------------------------------------------- turns

    def open_turns(self) -> int:
        return 0 if self._turn is None else 1

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None:
        """Open a text turn; the agent picks its own voice, audio is PCM 24 kHz.

        Raises:
            LocalProtocolError: not ready, or a turn is already open (``max_turns`` is 1).
        """
        self._require_ready()
        if self._turn is not None:
            raise LocalProtocolError("kletso carries one turn at a time")
        self._turn = _Turn(turn_id, [])
        if self._session is _Session.IDLE:
            self._send_start(self._mode, self._client_id)

    def send_text(self, turn_id: str, text: str, now: float) -> None:
        """Collect text; it goes out whole at ``end_turn`` (one ``voice.text`` = one answer)."""
        self._collecting(turn_id).parts.append(text)

    def end_turn(self, turn_id: str, now: float) -> None:
        """Send the turn's text as ``voice.text`` (held until the session is ACTIVE)."""
        turn = self._collecting(turn_id)
        text = "".join(turn.parts)
        if not text.strip():
            self._turn = None
            self._events.append(TurnDone(turn_id))
            return
        frame = _dumps({wire.TYPE: wire.VOICE_TEXT, wire.TEXT: text})
        if len(frame.encode()) > MAX_TEXT_FRAME_BYTES:
            self._turn = None
            message = f"text frame over {MAX_TEXT_FRAME_BYTES} bytes"
            self._events.append(TurnFailed(turn_id, "text_too_long", message, False))
            return
        if self._session is _Session.ACTIVE:
            self._send_text_frame(SendText(frame), turn_id, now)
        else:
            turn.phase = "held"
            self._held.append((SendText(frame), turn_id))
            if self._session is _Session.IDLE:
                self._send_start(self._mode, self._client_id)

    def cancel(self, turn_id: str, now: float) -> None:
        """Barge-in: report the played position (``voice.played``) and drop the rest.

        ``TurnDone(cancelled=True)`` follows at once; late frames of the reply
        are dropped here. Cancelling an unknown or finished turn does nothing.
        """
        reply = self._reply
        if reply is not None and reply.live and reply.turn_id == turn_id:
            reply.live = False
            self._played_at = None
            self._send_played(reply.item_id)
            if reply.is_text_turn:
                self._turn = None
            self._events.append(TurnDone(turn_id, cancelled=True))
            return
        streamed = next((r for r in reversed(self._streamed) if r[0] == turn_id), None)
        if streamed is not None:
            # streamed whole, still playing at the caller: the interruption is reported
            # all the same (the agent learns what was heard); the turn is already done
            self._streamed.remove(streamed)
            self._send_played(streamed[1])
            return
        turn = self._turn
        if turn is None or turn.turn_id != turn_id:
            return
        if turn.phase == "held":
            self._held = [(a, owner) for a, owner in self._held if owner != turn_id]
        elif turn.phase == "awaiting":
            self._tombstone(turn_id)
        self._turn = None
        self._events.append(TurnDone(turn_id, cancelled=True))

    # ------------------------------------------------------- voice agent API

    def start_voice(self, mode: VoiceMode, client_id: str, now: float) -> None:
        """Send ``voice.start`` (``sampleRate`` 24000).

        Raises:
            LocalProtocolError: not ready, bad mode, or a session is already running.
        """
        self._require_ready()
        if mode not in MODES:
            raise LocalProtocolError(f"voice mode must be vad or ptt, not {mode!r}")
        if self._session is not _Session.IDLE:
            raise LocalProtocolError("a voice session is already running")
        self._send_start(mode, client_id)

    def stop_voice(self, reason: str, now: float) -> None:
        """Send ``voice.stop``; ``voice.ended`` will follow from the agent."""
        self._require_ready()
        if reason not in STOP_REASONS:
            raise LocalProtocolError(f"stop reason must be user or background, not {reason!r}")
        if self._session in (_Session.IDLE, _Session.STOPPING):
            raise LocalProtocolError("no voice session to stop")
        for _, owner in self._held:
            if owner is not None:
                self._turn = None
                self._events.append(TurnFailed(owner, "voice_stopped", "voice stopped", True))
        self._held, self._held_audio_bytes = [], 0
        self._session = _Session.STOPPING
        self._send({wire.TYPE: wire.VOICE_STOP, wire.REASON: reason})

    def commit(self, now: float) -> None:
        """Push-to-talk release: ``voice.commit`` (the agent answers what it heard)."""
        self._send_or_hold(SendText(_dumps({wire.TYPE: wire.VOICE_COMMIT})), 0)

    def send_audio(self, pcm_s16le_24k: bytes, now: float) -> None:
        """Send microphone audio as kind-0x01 frames of at most 16 KB each.

        Raises:
            LocalProtocolError: odd length, or no voice session.
        """
        if len(pcm_s16le_24k) % 2:
            raise LocalProtocolError("PCM s16le must have an even number of bytes")
        for start in range(0, len(pcm_s16le_24k), MAX_PAYLOAD_BYTES):
            chunk = pcm_s16le_24k[start : start + MAX_PAYLOAD_BYTES]
            self._send_or_hold(SendBytes(bytes([KIND_MIC]) + chunk), len(chunk))

    def played(self, item_id: str, ms: int, now: float) -> None:
        """Send one ``voice.played`` now (``item_id`` ``""`` means ``"current"``)."""
        self._require_ready()
        self.set_played_position(item_id, ms)
        self._send_played(item_id or wire.CURRENT)

    def set_played_position(self, item_id: str, ms: int) -> None:
        """Record how much of ``item_id`` the caller has heard (used by the 500 ms timer)."""
        if ms < 0:
            raise LocalProtocolError("played position must not be negative")
        self._played_item_id = item_id or wire.CURRENT
        self._played_ms = int(ms)

    # ------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        deadlines = [t for t in (self._played_at, self._reply_deadline_at) if t is not None]
        return min(deadlines, default=None)

    def handle_timer(self, now: float) -> None:
        if self._reply_deadline_at is not None and now >= self._reply_deadline_at:
            self._reply_deadline_at = None
            turn = self._turn
            if turn is not None and turn.phase == "awaiting":
                self._tombstone(turn.turn_id)
                self._turn = None
                message = f"no reply within {self._reply_timeout_s} s"
                self._events.append(TurnFailed(turn.turn_id, "timeout", message, True))
        if self._played_at is not None and now >= self._played_at and self._reply is not None:
            self._send_played(self._reply.item_id)
            self._played_at = max(self._played_at + PLAYED_INTERVAL_S, now)

    # ------------------------------------------------------- receiving

    def receive_text(self, text: str, now: float) -> None:
        """Parse one JSON frame; never raises on bad input."""
        if self._failed:
            return
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError):
            self._fail_protocol("malformed JSON frame")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get(wire.TYPE), str):
            self._fail_protocol("frame is not an object with a string type")
            return
        frame_type: str = msg[wire.TYPE]
        handler = _HANDLERS.get(frame_type)
        if handler is None:
            logger.debug("< ignored %s", frame_type)
            return
        try:
            handler(self, msg, now)
        except _Malformed as exc:
            self._fail_protocol(f"{frame_type}: {exc}")

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Assistant audio (kind 0x02) becomes ``AudioReceived`` for the reply's turn."""
        if self._failed or not data:
            return
        if data[0] != KIND_ASSISTANT:
            logger.debug("< ignored binary kind 0x%02x", data[0])
            return
        if len(data) > MAX_FRAME_BYTES or (len(data) - 1) % 2:
            self._fail_protocol(f"bad audio frame of {len(data)} bytes")
            return
        if len(data) == 1:
            return
        if self._reply is None:
            self._start_reply(None, now)
        reply = self._reply
        if reply is not None and reply.live:
            self._events.append(AudioReceived(reply.turn_id, data[1:], PCM_24K))

    # ------------------------------------------------------- frame handlers

    def _on_started(self, msg: JsonObject, now: float) -> None:
        data = _data(msg)
        limits = data.get(wire.LIMITS, {})
        if not isinstance(limits, dict):
            raise _Malformed("limits is not an object")
        self._session = _Session.ACTIVE
        self._events.append(
            VoiceStarted(
                _str(data, wire.VOICE_SESSION_ID),
                _str(data, wire.MODEL),
                _str(data, wire.VOICE),
                VoiceLimits(
                    _opt_num(limits, wire.MAX_SECONDS), _opt_num(limits, wire.IDLE_SECONDS)
                ),
            )
        )
        self._flush_held(now)

    def _on_state(self, msg: JsonObject, now: float) -> None:
        state = _str(_data(msg), wire.STATE)
        if state not in VOICE_STATES:
            logger.debug("< ignored unknown voice state %s", state)
            return
        self._server_state = state
        self._events.append(VoiceStateChanged(state))
        if state != wire.SPEAKING:
            self._end_reply("done")
        elif self._reply is None:
            self._start_reply(None, now)
        elif self._reply.live and self._played_at is None:
            self._played_at = now + PLAYED_INTERVAL_S

    def _on_transcript(self, msg: JsonObject, now: float) -> None:
        data = _data(msg)
        final = data.get(wire.FINAL)
        if not isinstance(final, bool):
            raise _Malformed("final is not a boolean")
        self._events.append(TranscriptReceived(_str(data, wire.ROLE), _str(data, wire.TEXT), final))

    def _on_interrupted(self, msg: JsonObject, now: float) -> None:
        data = _data(msg)
        item_id = _str(data, wire.ITEM_ID)
        end_ms = _opt_num(data, wire.AUDIO_END_MS)
        if end_ms is None:
            raise _Malformed("audioEndMs missing")
        self._events.append(VoiceInterrupted(item_id, int(end_ms)))
        reply = self._reply
        if reply is not None and reply.item_id in (None, item_id):
            if reply.live:
                self._send_played(reply.item_id)
            self._end_reply("interrupted")

    def _on_ended(self, msg: JsonObject, now: float) -> None:
        data = _data(msg)
        reason = _str(data, wire.REASON)
        usage = data.get(wire.USAGE, {})
        if not isinstance(usage, dict):
            raise _Malformed("usage is not an object")
        figures = VoiceUsage(
            _opt_num(usage, wire.AUDIO_IN_SECONDS) or 0.0,
            _opt_num(usage, wire.AUDIO_OUT_SECONDS) or 0.0,
            int(_opt_num(usage, wire.COST_MICROS) or 0),
        )
        self._end_reply("failed", "voice_ended", f"voice session ended: {reason}")
        self._fail_waiting("voice_ended", f"voice session ended: {reason}", True)
        self._session = _Session.IDLE
        self._server_state = wire.IDLE
        self._events.append(VoiceEnded(reason, figures))
        self._events.append(UsageReported(None, dict(usage)))
        if self._held:
            self._send_start(self._mode, self._client_id)

    def _on_message_created(self, msg: JsonObject, now: float) -> None:
        data = msg.get(wire.DATA)
        if not isinstance(data, dict) or data.get(wire.ROLE) != wire.ASSISTANT:
            return
        item_id = data.get(wire.ITEM_ID)
        item = item_id if isinstance(item_id, str) else None
        reply = self._reply
        if reply is not None and reply.item_id is None and self._server_state == wire.SPEAKING:
            reply.item_id = item
            return
        self._start_reply(item, now)

    def _on_error(self, msg: JsonObject, now: float) -> None:
        code = _str(msg, wire.CODE)
        raw_message = msg.get(wire.MESSAGE, "")
        message = self._redact(raw_message if isinstance(raw_message, str) else "")
        scope, retryable = ERROR_TABLE.get(code, ("request", False))
        logger.debug("! error %s (%s)", code, scope)
        if scope == "connection":
            self._fail_connection(code, message, retryable, 1000)
            return
        if scope == wire.CONFLICT:
            # The agent already runs a session: treat it as ours and go on.
            if self._session is _Session.STARTING:
                self._session = _Session.ACTIVE
                self._flush_held(now)
        elif scope == "session":
            self._end_reply("failed", code, message, retryable)
            self._fail_waiting(code, message, retryable, held_too=True)
            self._session = _Session.IDLE
        else:
            self._fail_waiting(code, message, retryable)
        self._events.append(VoiceFailed(code, message, retryable))

    def _flush_held(self, now: float) -> None:
        held, self._held, self._held_audio_bytes = self._held, [], 0
        for action, owner in held:
            if owner is None:
                self._actions.append(action)
            elif isinstance(action, SendText):
                self._send_text_frame(action, owner, now)

    # ------------------------------------------------------- replies

    def _start_reply(self, item_id: str | None, now: float) -> None:
        self._end_reply("done")
        self._played_item_id, self._played_ms = wire.CURRENT, 0
        if self._owners:
            owner = self._owners.popleft()
            if owner is None:
                self._reply = _Reply("", item_id, live=False, is_text_turn=True)
                return
            self._reply = _Reply(owner, item_id, live=True, is_text_turn=True)
            self._reply_deadline_at = None
            if self._turn is not None and self._turn.turn_id == owner:
                self._turn.phase = wire.SPEAKING
        else:
            self._voice_replies += 1
            turn_id = f"voice-{self._voice_replies}"
            self._reply = _Reply(turn_id, item_id, live=True, is_text_turn=False)
        self._events.append(TurnStarted(self._reply.turn_id, item_id or ""))
        if self._server_state == wire.SPEAKING:
            self._played_at = now + PLAYED_INTERVAL_S

    def _end_reply(
        self,
        outcome: Literal["done", "interrupted", "failed"],
        kind: str = "",
        message: str = "",
        retryable: bool = True,
    ) -> None:
        reply, self._reply = self._reply, None
        self._played_at = None
        if reply is None or not reply.live:
            return
        if reply.is_text_turn:
            self._turn = None
        if outcome == "done":
            self._streamed.append((reply.turn_id, reply.item_id))
        if outcome == "failed":
            self._events.append(TurnFailed(reply.turn_id, kind, message, retryable))
        else:
            self._events.append(TurnDone(reply.turn_id, cancelled=outcome == "interrupted"))

    def _fail_waiting(
        self, kind: str, message: str, retryable: bool, held_too: bool = False
    ) -> None:
        """Fail the text turn whose ``voice.text`` was sent (and, if ``held_too``, a held one)."""
        turn = self._turn
        if turn is None or turn.phase not in (("held", "awaiting") if held_too else ("awaiting",)):
            return
        self._owners = deque(None if o == turn.turn_id else o for o in self._owners)
        self._held = [(a, o) for a, o in self._held if o != turn.turn_id]
        self._reply_deadline_at = None
        self._turn = None
        self._events.append(TurnFailed(turn.turn_id, kind, message, retryable))

    def _tombstone(self, turn_id: str) -> None:
        self._owners = deque(None if o == turn_id else o for o in self._owners)
        self._reply_deadline_at = None

    # ------------------------------------------------------- sending

    def _send(self, frame: JsonObject) -> None:
        logger.debug("> %s", frame[wire.TYPE])
        self._actions.append(SendText(_dumps(frame)))

    def _send_start(self, mode: VoiceMode, client_id: str) -> None:
        self._session = _Session.STARTING
        frame = {wire.TYPE: wire.VOICE_START, wire.MODE: mode, wire.SAMPLE_RATE: SAMPLE_RATE_HZ}
        self._send({**frame, wire.CLIENT_ID: client_id})

    def _send_text_frame(self, action: SendText, turn_id: str, now: float) -> None:
        self._actions.append(action)
        self._owners.append(turn_id)
        if self._turn is not None and self._turn.turn_id == turn_id:
            self._turn.phase = "awaiting"
            self._reply_deadline_at = now + self._reply_timeout_s

    def _send_or_hold(self, action: Action, audio_bytes: int) -> None:
        self._require_ready()
        if self._session is _Session.ACTIVE:
            self._actions.append(action)
        elif self._session is _Session.STARTING:
            if self._held_audio_bytes + audio_bytes > MAX_HELD_AUDIO_BYTES:
                logger.debug("= dropped %d bytes of audio held while starting", audio_bytes)
                return
            self._held_audio_bytes += audio_bytes
            self._held.append((action, None))
        else:
            raise LocalProtocolError("no voice session: call start_voice first")

    def _send_played(self, item_id: str | None) -> None:
        item = item_id or self._played_item_id
        ms = self._played_ms if self._played_item_id in (item, wire.CURRENT) else 0
        self._send({wire.TYPE: wire.VOICE_PLAYED, wire.ITEM_ID: item, wire.MS: ms})

    # ------------------------------------------------------- failure

    def _fail_protocol(self, message: str) -> None:
        self._fail_connection("protocol_error", message, True, 1002)

    def _fail_connection(self, kind: str, message: str, retryable: bool, code: int) -> None:
        ids = self._open_turn_ids()
        self._failed = True
        self._clear_all()
        self._events.append(ProviderFailed(kind, message, ids, retryable))
        if not self._closed:
            self._closed = True
            self._actions.append(CloseConnection(code, kind))

    def _open_turn_ids(self) -> tuple[str, ...]:
        ids = [] if self._turn is None else [self._turn.turn_id]
        reply = self._reply
        if reply is not None and reply.live and reply.turn_id not in ids:
            ids.append(reply.turn_id)
        return tuple(ids)

    def _clear_all(self) -> None:
        self._turn, self._reply = None, None
        self._owners.clear()
        self._held, self._held_audio_bytes = [], 0
        self._played_at = self._reply_deadline_at = None
        self._session = _Session.IDLE

    def _require_ready(self) -> None:
        if not self.ready:
            raise LocalProtocolError("kletso connection is not ready")

    def _collecting(self, turn_id: str) -> _Turn:
        turn = self._turn
        if turn is None or turn.turn_id != turn_id or turn.phase != "collecting":
            raise LocalProtocolError(f"turn {turn_id!r} is not open for text")
        return turn

    def _redact(self, text: str) -> str:
        return scrub_secret(text, self._settings.api_key)


_HANDLERS: dict[str, Handler] = {
    wire.VOICE_STARTED: KletsoProtocol._on_started,
    wire.VOICE_STATE: KletsoProtocol._on_state,
    wire.VOICE_TRANSCRIPT: KletsoProtocol._on_transcript,
    wire.VOICE_INTERRUPTED: KletsoProtocol._on_interrupted,
    wire.VOICE_ENDED: KletsoProtocol._on_ended,
    wire.MESSAGE_CREATED: KletsoProtocol._on_message_created,
    wire.ERROR: KletsoProtocol._on_error,
}
"""Frame type -> handler, as functions: a protocol holding its own bound methods
would be a reference cycle, freed only by a full collection."""


# ---------------------------------------------------------------- helpers


def _dumps(frame: JsonObject) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def _data(msg: JsonObject) -> JsonObject:
    data = msg.get(wire.DATA)
    if not isinstance(data, dict):
        raise _Malformed("data is not an object")
    return data


def _str(obj: JsonObject, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise _Malformed(f"{key} is not a string")
    return value


def _opt_num(obj: dict[str, object], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Malformed(f"{key} is not a number")
    try:
        number = float(value)  # a JSON integer beyond a double raises OverflowError
    except OverflowError:
        raise _Malformed(f"{key} is out of range") from None
    if not math.isfinite(number):
        raise _Malformed(f"{key} is not a number")
    return number


ENGINE = KletsoProtocol

OPTIONS: dict[str, OptionType] = {
    "mode": ("vad", "ptt"),
    "client_id": str,
    "reply_timeout_s": float,
}
"""The protocol options of ``[providers.NAME]`` and their types (``bridge.config`` rejects
any other key)."""

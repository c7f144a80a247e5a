"""The one interface every media-stream WebSocket dialect offers the per-call bridge.

Theory of operation
-------------------
A carrier (Twilio, Telnyx, Plivo, Exotel, Vonage) opens a WebSocket to us and
carries one call's audio over it. One engine instance is one accepted socket.
The shell (``bridge.io``) picks the dialect by request path (``/twilio``,
``/telnyx``, ...; see ``bridge.streams.DIALECTS``) and pumps:

1. ``connection_made(now)`` once the upgrade completed: arms the *start
   timer* (a stream that has not said ``start`` within ``start_timeout_s`` is
   closed, reliability.md §3.1 rule 4).
2. ``receive_text`` / ``receive_bytes`` for every message, ``handle_timer``
   at ``next_deadline()``, ``connection_lost`` when the socket is gone.
3. After each call: ``actions_to_send()`` (``SendText``, ``SendBytes``,
   ``CloseConnection``) and ``events_received()``.

The life of a stream (one table for every dialect)::

    AWAITING_START   connected            (Twilio/Telnyx/Exotel; ignored otherwise)
                     start                -> StreamStarted, STREAMING
                     media / dtmf / mark  -> ProtocolViolation, close 1002
                     start timer          -> ProtocolViolation, close 1008
    STREAMING        media                -> AudioReceived (payload in the leg's codec)
                     dtmf                 -> DtmfReceived
                     mark echo            -> MarkPlayed(cleared=False|True)
                     stop                 -> StreamStopped("stop"), STOPPED
    any              connection_lost      -> StreamStopped("connection_lost"), CLOSED
                     malformed message    -> ProtocolViolation, StreamStopped, close
                     unknown event        -> logged once at debug, ignored

``StreamStopped`` is emitted exactly once per engine, whatever ends the
stream (``stop``, ``hangup``, ``reject``, a violation, the socket going away).

Outbound commands (only while STREAMING; before ``start`` they are our own
misuse and raise ``LocalProtocolError``; after the stream ended they are
dropped and return ``False``, because the call may race the carrier's
``stop``):

* ``send_frame(frame, now)``: exactly one 20 ms frame in the leg's codec
  (``frame_bytes``). The engine does not pace; the shell's media clock does.
  Dialects with packing rules buffer here (Exotel: 3200 B chunks).
* ``mark(name, now)``: a named playback position after the audio sent so far
  (the dialect's ``mark`` / ``checkpoint`` / ``notify``). ``MarkPlayed``
  reports it when the carrier says the audio before it has played.
* ``clear(now)``: barge-in. The carrier drops its buffer. Every mark pending at
  that moment is reported ``MarkPlayed(cleared=True)``: Twilio, Telnyx and
  Exotel echo those marks after a ``clear`` (the echo itself does not say
  played vs discarded, so the engine remembers which names were pending);
  Plivo and Vonage send one confirmation (``clearedAudio`` /
  ``websocket:cleared``) instead, which releases all of them at once. A mark
  whose audio finished just as the ``clear`` was in flight is counted as
  cleared: conservative, never over-reports what the caller heard.
* ``flush(now)``: push out audio a packing dialect still holds (no-op
  elsewhere); ``mark`` flushes first by itself.
* ``send_dtmf(digits, now)``: only where the dialect has it
  (``supports_send_dtmf``); elsewhere the call refuses the command (``dtmf_unsupported``).
* ``hangup(now)``: close 1000. ``reject(reason, now)``: close 1008 (failed
  authentication of the ``start`` message).

Rules that keep this module honest:

1. Bad remote input never raises: every field is read through the ``_field``
   helpers, which raise the private ``_Malformed`` that ``receive_*`` turns
   into ``ProtocolViolation`` + ``StreamStopped`` + ``CloseConnection``.
2. Sequence numbers are checked, never trusted: a jump or a repeat is a
   ``SequenceGap`` event and the counter resynchronises; it does not end the
   stream.
3. Positions are counted from audio handed to the carrier (``sent_ms``),
   never from a clock; ``played_position_ms()`` only moves when a mark echo
   proves playback.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from bridge.engine import (
    CloseConnection,
    Event,
    LocalProtocolError,
    Outbox,
    SendBytes,
    SendText,
)

__all__ = [
    "CLOSE_INVALID_PAYLOAD",
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_NORMAL",
    "CLOSE_POLICY_VIOLATION",
    "CLOSE_PROTOCOL_ERROR",
    "CLOSE_UNSUPPORTED_DATA",
    "DTMF_DIGITS",
    "FRAME_MS",
    "AudioReceived",
    "CarrierErrorReceived",
    "Codec",
    "DtmfReceived",
    "MarkPlayed",
    "MediaStreamProtocol",
    "ProtocolViolation",
    "SendEncodedText",
    "SequenceGap",
    "StreamSettings",
    "StreamStarted",
    "StreamState",
    "StreamStopped",
    "frame_bytes_for",
]

logger = logging.getLogger(__name__)

Codec = Literal["mulaw", "alaw", "pcm_s16le"]

#: Every frame on the wire is a whole 20 ms.
FRAME_MS = 20
#: Keypad digits any dialect may carry (RFC 4733 events 0-15).
DTMF_DIGITS = frozenset("0123456789*#ABCD")

# WebSocket close codes (RFC 6455 §7.4.1).
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009


def frame_bytes_for(codec: Codec, sample_rate_hz: int) -> int:
    """Bytes in one 20 ms frame: 160 B G.711 at 8 kHz, 320/640 B L16 at 8/16 kHz."""
    samples = sample_rate_hz * FRAME_MS // 1000
    return samples * (2 if codec == "pcm_s16le" else 1)


# ------------------------------------------------------------------ settings


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Limits shared by every dialect (from ``[media_streams]``)."""

    max_message_bytes: int = 64 * 1024
    """Largest inbound message accepted, in bytes (larger: close 1009)."""
    start_timeout_s: float = 5.0
    """Seconds from ``connection_made`` to ``start`` before the socket is closed."""
    max_pending_marks: int = 4096
    """Marks sent and not yet echoed; more is our own misuse (a leak)."""


# ------------------------------------------------------------------- actions


class SendEncodedText(SendText):
    """Send one WebSocket text message whose UTF-8 encoding is already built.

    The outbound ``media`` hot path: dialects render it from a per-stream
    template (only the base64 payload changes), and the shell writes ``data``
    as the frame payload without encoding it again. It *is* a ``SendText``:
    ``text`` decodes ``data``, so any consumer of ``SendText`` keeps working.
    """

    __slots__ = ("data",)
    data: bytes

    def __init__(self, data: bytes) -> None:
        object.__setattr__(self, "data", data)

    @property
    def text(self) -> str:
        """The message as text (decoded on demand)."""
        return self.data.decode()


# -------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class StreamStarted(Event):
    """The carrier said ``start``: who the call is and what the audio is."""

    stream_id: str
    call_id: str
    account_id: str
    tracks: tuple[str, ...]
    custom_parameters: dict[str, str]
    codec: Codec
    sample_rate_hz: int
    route: str | None


@dataclass(frozen=True, slots=True)
class AudioReceived(Event):
    """Inbound audio of the caller, in the leg's codec (base64 already decoded).

    ``sequence`` is the carrier's per-media counter (``chunk``) where it has
    one; ``timestamp_ms`` the carrier's media timestamp (ms since stream start).
    """

    payload: bytes
    codec: Codec
    sample_rate_hz: int
    timestamp_ms: int | None
    sequence: int | None


@dataclass(frozen=True, slots=True)
class DtmfReceived(Event):
    """The caller pressed a key (``duration_ms`` where the carrier says it)."""

    digit: str
    duration_ms: int | None = None


@dataclass(frozen=True, slots=True)
class MarkPlayed(Event):
    """The carrier answered a mark.

    ``cleared=True``: the answer came *because of* a ``clear``; the audio
    before the mark was discarded, not played. ``position_ms`` is where the
    mark sat in the audio we handed to the carrier (``sent_ms`` at ``mark``).
    """

    name: str
    cleared: bool
    position_ms: int = 0


@dataclass(frozen=True, slots=True)
class StreamStopped(Event):
    """The stream is over (emitted exactly once per engine)."""

    reason: str


@dataclass(frozen=True, slots=True)
class SequenceGap(Event):
    """A message arrived with another sequence number than the next expected."""

    expected: int
    got: int


@dataclass(frozen=True, slots=True)
class ProtocolViolation(Event):
    """The carrier sent something the dialect does not allow."""

    reason: str


@dataclass(frozen=True, slots=True)
class CarrierErrorReceived(Event):
    """The carrier reported an error about what *we* sent (Telnyx ``error``)."""

    code: str
    title: str
    detail: str


class StreamState(enum.Enum):
    """Where the stream is in its life (see the table in the module docstring)."""

    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    STOPPED = "stopped"
    CLOSED = "closed"


class _Malformed(Exception):
    """Private: one remote message broke the dialect; caught in ``receive_*``."""

    def __init__(self, reason: str, code: int = CLOSE_PROTOCOL_ERROR) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


# -------------------------------------------------------- field reading helpers


def obj_field(msg: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``msg[key]`` as a JSON object."""
    value = msg.get(key)
    if not isinstance(value, dict):
        raise _Malformed(f"{key!r} must be an object, got {_kind(value)}")
    return value


def str_field(msg: Mapping[str, Any], key: str, *, optional: bool = False) -> str:
    """``msg[key]`` as a string (``""`` when optional and absent)."""
    value = msg.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise _Malformed(f"{key!r} must be a string, got {_kind(value)}")
    return value


def int_field(msg: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    """``msg[key]`` as a non-negative integer, given as a JSON number or a digit string.

    Twilio, Telnyx and Exotel send numbers as strings (``"160"``), Plivo as
    numbers; both are accepted. Booleans, fractions and signs are not.
    """
    value = msg.get(key)
    if value is None:
        if optional:
            return None
        raise _Malformed(f"missing {key!r}")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**18:
        return value
    raise _Malformed(f"{key!r} must be a non-negative integer, got {_kind(value)}")


def b64_field(msg: Mapping[str, Any], key: str) -> bytes:
    """``msg[key]`` decoded from strict base64."""
    text = str_field(msg, key)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _Malformed(f"{key!r} is not base64", CLOSE_INVALID_PAYLOAD) from None


def string_map(value: Any, key: str) -> dict[str, str]:
    """A JSON object of string values (custom parameters), absent -> ``{}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(f"{key!r} must be an object, got {_kind(value)}")
    out: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(item, str):
            raise _Malformed(f"{key}.{name[:32]} must be a string, got {_kind(item)}")
        out[name] = item
    return out


def tracks_field(value: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    """A JSON list of track names, absent -> ``default``."""
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise _Malformed(f"'tracks' must be a list of strings, got {_kind(value)}")
    return tuple(value)


def malformed(reason: str, code: int = CLOSE_PROTOCOL_ERROR) -> _Malformed:
    """Build the private exception dialect handlers raise on bad remote input."""
    return _Malformed(reason, code)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# -------------------------------------------------------------------- engine

Handler = Callable[[Any, dict[str, Any], float], None]
"""A dialect's handler method from its class: called with the protocol, the message, ``now``."""

_HANDLER_TABLES: dict[type, dict[str, Handler]] = {}


def _handler_table(cls: type[MediaStreamProtocol]) -> dict[str, Handler]:
    """``cls.HANDLERS`` with each method name resolved on ``cls`` (once per class).

    The table holds functions, not an instance's bound methods: a protocol
    holding its own bound methods would be a reference cycle, and an ended
    call would wait for a full collection (``tests/e2e/test_call_release.py``).
    """
    table = _HANDLER_TABLES.get(cls)
    if table is None:
        table = {event: getattr(cls, name) for event, name in cls.HANDLERS.items()}
        _HANDLER_TABLES[cls] = table
    return table


@dataclass(slots=True)
class _PendingMark:
    position_ms: int
    cleared: bool = False


class MediaStreamProtocol(Outbox):
    """The common engine; one subclass per dialect fills in the wire format.

    Subclasses set the class constants, among them ``HANDLERS`` (event name
    -> name of the method taking the parsed message and ``now``), and
    implement the ``_wire_*`` methods that render outbound messages.
    """

    #: Dialect name and the request path the shell routes to it.
    DIALECT: ClassVar[str] = ""
    PATH: ClassVar[str] = ""
    #: Key of the message discriminator (``event``).
    EVENT_KEY: ClassVar[str] = "event"
    #: Key of the per-message sequence number, or ``None``.
    SEQUENCE_KEY: ClassVar[str | None] = None
    #: Whether binary messages are audio (Vonage) or a violation (the rest).
    BINARY_AUDIO: ClassVar[bool] = False
    supports_send_dtmf: ClassVar[bool] = False
    #: Inbound event name -> name of the method that handles it (message, ``now``).
    HANDLERS: ClassVar[Mapping[str, str]] = {}

    def __init__(self, settings: StreamSettings | None = None, *, route: str | None = None) -> None:
        """Args:
        settings: shared limits.
        route: a route chosen before ``start`` (e.g. from the upgrade URL);
            ``customParameters.route`` (or the dialect's equivalent) wins.
        """
        super().__init__()
        self.settings = settings or StreamSettings()
        self._route_hint = route
        self._handlers = _handler_table(type(self))
        self._state = StreamState.AWAITING_START
        self._start_deadline: float | None = None
        self._expected_seq: int | None = None
        self._unknown_reported: set[str] = set()
        self._pending_marks: dict[str, _PendingMark] = {}
        self._sent_bytes = 0
        self._played_position_ms = 0
        self.stream_id = ""
        self.call_id = ""
        self.codec: Codec = "mulaw"
        self.sample_rate_hz = 8000
        self.frame_bytes = frame_bytes_for("mulaw", 8000)

    # ------------------------------------------------------------ properties

    @property
    def state(self) -> StreamState:
        """Where the stream is in its life."""
        return self._state

    @property
    def sent_ms(self) -> int:
        """Milliseconds of audio handed to the carrier on the wire so far."""
        bytes_per_ms = self.frame_bytes // FRAME_MS
        return self._sent_bytes // bytes_per_ms

    def played_position_ms(self) -> int:
        """Position (in ``sent_ms`` terms) of the latest mark the carrier played.

        Only a played mark moves it; cleared marks never do. The call computes
        what the caller heard of a turn as the difference between this and the
        turn's first position.
        """
        return self._played_position_ms

    def pending_marks(self) -> list[str]:
        """Names of marks sent and not yet answered, oldest first."""
        return list(self._pending_marks)

    # ---------------------------------------------------------------- inputs

    def connection_made(self, now: float) -> None:
        """The upgrade completed: arm the start timer."""
        if self._state is StreamState.AWAITING_START:
            self._start_deadline = now + self.settings.start_timeout_s

    def receive_text(self, text: str, now: float) -> None:
        """Handle one text message from the carrier (never raises on bad input)."""
        if self._state is StreamState.CLOSED:
            return
        try:
            if len(text) > self.settings.max_message_bytes:
                raise _Malformed(
                    f"text message of {len(text)} characters exceeds "
                    f"{self.settings.max_message_bytes}",
                    CLOSE_MESSAGE_TOO_BIG,
                )
            msg = self._parse(text)
            event = msg.get(self.EVENT_KEY)
            if not isinstance(event, str):
                raise _Malformed(f"missing or non-string {self.EVENT_KEY!r}")
            self._check_sequence(msg)
            handler = self._handlers.get(event)
            if handler is None:
                self._report_unknown(event)
                return
            handler(self, msg, now)
        except _Malformed as exc:
            self._violate(exc.reason, exc.code)

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Handle one binary message (audio for Vonage, a violation elsewhere)."""
        if self._state is StreamState.CLOSED:
            return
        try:
            if len(data) > self.settings.max_message_bytes:
                raise _Malformed(
                    f"binary message of {len(data)} bytes exceeds "
                    f"{self.settings.max_message_bytes}",
                    CLOSE_MESSAGE_TOO_BIG,
                )
            if not self.BINARY_AUDIO:
                raise _Malformed(
                    f"binary message on a {self.DIALECT} stream", CLOSE_UNSUPPORTED_DATA
                )
            self._on_binary(data, now)
        except _Malformed as exc:
            self._violate(exc.reason, exc.code)

    def connection_lost(self, now: float) -> None:
        """The socket is gone (with or without a ``stop``)."""
        self._finish("connection_lost")
        self._state = StreamState.CLOSED

    def handle_timer(self, now: float) -> None:
        """Fire the start timer if it is due."""
        if self._start_deadline is not None and now >= self._start_deadline:
            self._start_deadline = None
            if self._state is StreamState.AWAITING_START:
                self._violate(
                    f"no start within {self.settings.start_timeout_s:g} s",
                    CLOSE_POLICY_VIOLATION,
                )

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` must run next, or ``None``."""
        return self._start_deadline

    def take_media_text(self, text: str) -> bytes | None:
        """The caller's audio of a plain ``media`` text message, taken whole; or ``None``.

        The inbound per-frame path (50 messages a second per call). Where a
        dialect can tell that ``text`` is a ``media`` message of the
        expected kind (the next sequence number, this stream, an inbound
        track, non-empty audio in the leg's codec) it returns the decoded
        audio: the state moved exactly as ``receive_text`` would have moved
        it, and nothing was queued (no ``AudioReceived``, no action), so
        there is nothing to drain. ``None``: nothing happened; feed the same
        text to ``receive_text``. This default takes nothing.
        """
        return None

    # -------------------------------------------------------------- commands

    def send_frame(self, frame: bytes, now: float) -> bool:
        """Send exactly one 20 ms frame of the leg's audio in the leg's codec.

        Returns ``False`` (and sends nothing) once the stream has ended.

        Raises:
            LocalProtocolError: before ``start``, or ``frame`` is not
                ``frame_bytes`` long.
        """
        if not self._ready_to_send("send_frame"):
            return False
        if len(frame) != self.frame_bytes:
            raise LocalProtocolError(
                f"{self.DIALECT}: a frame is {self.frame_bytes} bytes "
                f"({self.codec} at {self.sample_rate_hz} Hz), got {len(frame)}"
            )
        self._wire_frame(frame)
        return True

    def frame_message(self, frame: bytes) -> bytes | None:
        """``send_frame``'s one outbound message, returned instead of queued; or ``None``.

        The outbound per-frame path. Where one frame is exactly one text
        message (a ``SendEncodedText``), the stream is STREAMING and
        ``frame`` is ``frame_bytes`` long, this counts the frame as sent and
        returns the message's UTF-8 bytes for the shell to write; nothing
        is queued. ``None``: nothing happened; use ``send_frame`` (which
        also raises on misuse). This default returns ``None``.
        """
        return None

    def mark(self, name: str, now: float) -> bool:
        """Place a named playback position after the audio sent so far.

        Raises:
            LocalProtocolError: before ``start``, an empty or duplicate name,
                or too many marks pending.
        """
        if not self._ready_to_send("mark"):
            return False
        if not name or name in self._pending_marks:
            raise LocalProtocolError(f"{self.DIALECT}: mark name {name!r} empty or pending")
        if len(self._pending_marks) >= self.settings.max_pending_marks:
            raise LocalProtocolError(f"{self.DIALECT}: more than {len(self._pending_marks)} marks")
        self.flush(now)
        self._pending_marks[name] = _PendingMark(self.sent_ms)
        self._wire_mark(name)
        return True

    def clear(self, now: float) -> bool:
        """Barge-in: the carrier drops everything buffered; pending marks become cleared."""
        if not self._ready_to_send("clear"):
            return False
        self._drop_unsent()
        for pending in self._pending_marks.values():
            pending.cleared = True
        self._wire_clear()
        return True

    def flush(self, now: float) -> bool:
        """Send audio a packing dialect still holds (no-op for most dialects)."""
        if not self._ready_to_send("flush"):
            return False
        self._wire_flush()
        return True

    def send_dtmf(self, digits: str, now: float) -> bool:
        """Ask the carrier to play DTMF digits to the caller.

        Raises:
            LocalProtocolError: the dialect has no such message
                (``supports_send_dtmf`` is false), before ``start``, or
                ``digits`` holds something that is not a keypad digit.
        """
        if not self.supports_send_dtmf:
            raise LocalProtocolError(f"{self.DIALECT}: no DTMF message; play tones in-band")
        if not self._ready_to_send("send_dtmf"):
            return False
        if not digits or any(d not in DTMF_DIGITS for d in digits):
            raise LocalProtocolError(f"{self.DIALECT}: not DTMF digits: {digits!r}")
        self._wire_dtmf(digits)
        return True

    def hangup(self, now: float) -> None:
        """End the stream: close the socket normally (Twilio: the call moves on)."""
        self._close(CLOSE_NORMAL, "hangup", "hangup")

    def reject(self, reason: str, now: float) -> None:
        """Refuse the stream (failed authentication of ``start``): close 1008."""
        self._close(CLOSE_POLICY_VIOLATION, _close_reason(reason), f"rejected: {reason}")

    # ----------------------------------------------- helpers for dialect code

    def _started(
        self,
        *,
        stream_id: str,
        call_id: str,
        account_id: str,
        tracks: tuple[str, ...],
        custom_parameters: dict[str, str],
        codec: Codec,
        sample_rate_hz: int,
    ) -> None:
        """A valid ``start``: record the leg's format and emit ``StreamStarted``."""
        if self._state is not StreamState.AWAITING_START:
            raise _Malformed("second start")
        self._state = StreamState.STREAMING
        self._start_deadline = None
        self.stream_id, self.call_id = stream_id, call_id
        self.codec, self.sample_rate_hz = codec, sample_rate_hz
        self.frame_bytes = frame_bytes_for(codec, sample_rate_hz)
        route = custom_parameters.get("route") or self._route_hint
        logger.debug(
            "= %s start stream=%s call=%s %s/%d",
            self.DIALECT,
            stream_id,
            call_id,
            codec,
            sample_rate_hz,
        )
        self._events.append(
            StreamStarted(
                stream_id,
                call_id,
                account_id,
                tracks,
                custom_parameters,
                codec,
                sample_rate_hz,
                route,
            )
        )

    def _require_streaming(self, what: str) -> None:
        if self._state is StreamState.AWAITING_START:
            raise _Malformed(f"{what} before start")

    def _audio(self, payload: bytes, timestamp_ms: int | None, sequence: int | None) -> None:
        """Inbound audio of the caller (only while STREAMING)."""
        self._require_streaming("media")
        if self._state is not StreamState.STREAMING or not payload:
            return
        if self.codec == "pcm_s16le" and len(payload) % 2:
            raise _Malformed(
                f"odd-length 16-bit PCM payload ({len(payload)} bytes)", CLOSE_INVALID_PAYLOAD
            )
        self._events.append(
            AudioReceived(payload, self.codec, self.sample_rate_hz, timestamp_ms, sequence)
        )

    def _dtmf(self, digit: str, duration_ms: int | None = None) -> None:
        self._require_streaming("dtmf")
        if digit not in DTMF_DIGITS:
            raise _Malformed(f"not a DTMF digit: {digit[:8]!r}")
        if self._state is StreamState.STREAMING:
            self._events.append(DtmfReceived(digit, duration_ms))

    def _mark_answered(self, name: str) -> None:
        """The carrier answered mark ``name``.

        Carriers answer marks in the order they were sent, so an answer also
        settles every older mark still pending: a cleared one is reported
        cleared (its echo is not coming, or was lost), an uncleared one played
        (audio after it has played, so it did too).
        """
        self._require_streaming("mark")
        if name not in self._pending_marks:
            logger.debug("! %s answer to unknown mark %r ignored", self.DIALECT, name[:64])
            return
        for older in list(self._pending_marks):
            pending = self._pending_marks.pop(older)
            if not pending.cleared:
                self._played_position_ms = max(self._played_position_ms, pending.position_ms)
            self._events.append(MarkPlayed(older, pending.cleared, pending.position_ms))
            if older == name:
                break

    def _clear_confirmed(self) -> None:
        """Plivo ``clearedAudio`` / Vonage ``websocket:cleared``: cleared marks are gone."""
        self._require_streaming("clear confirmation")
        for name, pending in list(self._pending_marks.items()):
            if pending.cleared:
                del self._pending_marks[name]
                self._events.append(MarkPlayed(name, True, pending.position_ms))

    def _stopped(self, reason: str) -> None:
        """The carrier said ``stop``: no more input; the socket closes next."""
        self._require_streaming("stop")
        self._finish(reason)
        self._state = StreamState.STOPPED

    def _send_json(self, msg: dict[str, Any]) -> None:
        self._actions.append(SendText(json.dumps(msg, separators=(",", ":"))))

    def _send_bytes(self, data: bytes) -> None:
        self._actions.append(SendBytes(data))

    def _count_sent(self, audio_bytes: int) -> None:
        self._sent_bytes += audio_bytes

    def _check_stream_id(self, value: str) -> None:
        """A message naming another stream than ours is a violation."""
        if value and self.stream_id and value != self.stream_id:
            raise _Malformed(f"message for stream {value[:64]!r}, not {self.stream_id!r}")

    # -------------------------------------------- what dialects must provide

    def _wire_frame(self, frame: bytes) -> None:
        raise NotImplementedError

    def _wire_mark(self, name: str) -> None:
        raise NotImplementedError

    def _wire_clear(self) -> None:
        raise NotImplementedError

    def _wire_flush(self) -> None:
        """Default: nothing is held back."""

    def _drop_unsent(self) -> None:
        """Default: nothing is held back."""

    def _wire_dtmf(self, digits: str) -> None:
        raise NotImplementedError

    def _on_binary(self, data: bytes, now: float) -> None:
        raise NotImplementedError

    # --------------------------------------------------------------- private

    def _parse(self, text: str) -> dict[str, Any]:
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError):
            raise _Malformed("text message is not JSON", CLOSE_INVALID_PAYLOAD) from None
        if not isinstance(msg, dict):
            raise _Malformed(f"JSON message must be an object, got {_kind(msg)}")
        return msg

    def _check_sequence(self, msg: dict[str, Any]) -> None:
        if self.SEQUENCE_KEY is None or self.SEQUENCE_KEY not in msg:
            return
        got = int_field(msg, self.SEQUENCE_KEY)
        assert got is not None  # not optional: int_field raised otherwise
        self._sequence_seen(got)

    def _sequence_seen(self, got: int) -> None:
        """A message carried sequence number ``got``: a gap is an event, then resync."""
        expected = self._expected_seq
        if expected is not None and got != expected:
            logger.debug("! %s sequence gap: expected %d, got %d", self.DIALECT, expected, got)
            self._events.append(SequenceGap(expected, got))
        self._expected_seq = got + 1 if expected is None else max(expected, got + 1)

    def _report_unknown(self, event: str) -> None:
        if event not in self._unknown_reported and len(self._unknown_reported) < 32:
            self._unknown_reported.add(event)
            logger.debug("? %s unknown event %r ignored", self.DIALECT, event[:64])

    def _ready_to_send(self, command: str) -> bool:
        if self._state is StreamState.AWAITING_START:
            raise LocalProtocolError(f"{self.DIALECT}: {command} before the stream started")
        return self._state is StreamState.STREAMING

    def _violate(self, reason: str, code: int) -> None:
        reason = reason[:200]
        logger.debug("! %s protocol violation: %s", self.DIALECT, reason)
        self._events.append(ProtocolViolation(reason))
        self._close(code, _close_reason(reason), "protocol_violation")

    def _close(self, code: int, reason: str, stopped_reason: str) -> None:
        if self._state is StreamState.CLOSED:
            return
        self._finish(stopped_reason)
        self._state = StreamState.CLOSED
        self._start_deadline = None
        self._actions.append(CloseConnection(code, reason))

    def _finish(self, reason: str) -> None:
        if self._state in (StreamState.STOPPED, StreamState.CLOSED):
            return
        self._start_deadline = None
        self._events.append(StreamStopped(reason))


def _close_reason(reason: str) -> str:
    """A close reason fits 123 UTF-8 bytes (RFC 6455 §5.5): cut at a character."""
    data = reason.encode("utf-8")[:123]
    return data.decode("utf-8", errors="ignore")

"""The application protocol: JSON over the WebSocket the daemon opens per call.

Theory of operation
-------------------
For a route (or flow step) with an ``app`` URL the daemon dials out one
WebSocket per call and speaks a small JSON protocol, one object per text
message, each with a ``type``:

* events out (``encode_event``): ``call.started``, ``dtmf``,
  ``speech.started``, ``speech.stopped``, ``turn.started``,
  ``turn.interrupted``, ``turn.finished``, ``provider.error``, ``call.ended``,
  and ``error`` (``encode_error``) for a command that was malformed or that
  the call refused;
* commands in (``decode_command``): ``say``, ``cancel``, ``hangup``,
  ``transfer``, ``dtmf``, ``answer``, ``reject``, each mapped to the shared
  ``Command`` values of ``bridge.commands`` (``answer``/``reject`` end a SIP
  call's early media; the call refuses them outside it: ``not_early_media``).

``bridge/control/app_schema.json`` is the protocol's JSON Schema and
``docs/app-protocol.md`` its description; ``decode_command`` accepts exactly
what the schema accepts, plus two rules a schema cannot state: a message is
at most ``MAX_MESSAGE_BYTES`` of UTF-8, and strings hold no lone surrogates.
Validation is strict: unknown fields, duplicate keys, wrong types and
out-of-range strings are refused with an ``error`` naming the field (so a
typo such as ``interuptible`` never silently becomes the default).

``AppSession`` is the per-call engine. Calling contract (the shell's side)::

    session = AppSession(call_started, url, now, fallback_flow=..., greeting=...)
    # the shell starts connecting to ``url`` now, then reports the outcome:
    session.connected(now) | session.connect_failed(reason, now)
    session.receive_text(text, now) / session.receive_bytes(data, now)
    session.disconnected(code, reason, now)
    session.handle_event(call_event, now)   # every CallEvent of the call
    session.handle_timer(now)               # once now >= session.next_deadline()
    # after every call above, drain:
    session.actions_to_send()     # SendText / CloseConnection on the app WebSocket
    session.commands_to_send()    # Commands for CallBridge.execute
    session.events_received()     # AppConnected, AppLost

States::

    CONNECTING --connected--> OPEN --CallEnded--> ENDED (call.ended sent, then close)
        |                       |
        +--failed/timeout-------+--disconnected--> LOST (AppLost: run the fallback)

The shell makes one session per connection: at call start for a route with
``app``, or when the call queues ``ConnectApp(url)`` (a flow step's ``app``
hand-over). Events that happen while connecting are buffered (``call.started`` first)
and flushed on ``connected``. ``AppLost`` carries the route's fallback; the
shell runs ``flow.fallback_runner(...)`` with it (the fallback flow, or the
greeting and a hangup) and routes further call events there.

Rules that keep this module honest:

1. Bad input from the application never raises: it becomes an ``error``
   message to the application, and the call goes on.
2. Nothing is sent before the WebSocket is open or after it is closed.
3. ``AppLost`` is emitted at most once, and never after the call ended.
"""

from __future__ import annotations

import enum
import json
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from bridge.commands import (
    REJECT_STATUS_DEFAULT,
    REJECT_STATUS_RANGE,
    Answer,
    CallEnded,
    CallEvent,
    CallStarted,
    Cancel,
    Command,
    CommandRejected,
    DtmfHeard,
    Hangup,
    ProviderBacklog,
    ProviderErrored,
    Reject,
    Say,
    SendDtmf,
    SpeechStarted,
    SpeechStopped,
    Transfer,
    TurnBegan,
    TurnFinished,
    TurnInterrupted,
)
from bridge.engine import CloseConnection, Event, LocalProtocolError, Outbox, SendText

__all__ = [
    "COMMAND_BUILDERS",
    "COMMAND_FIELDS",
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "MAX_MESSAGE_BYTES",
    "AppConnected",
    "AppError",
    "AppLost",
    "AppSession",
    "FieldSpec",
    "decode_command",
    "decode_command_and_id",
    "encode_error",
    "encode_event",
]

MAX_MESSAGE_BYTES = 64 * 1024
"""Largest command message accepted (UTF-8 bytes); the shell sets its WS ``max_size`` to it."""
RECENT_IDS = 64
"""Commands with an ``id`` kept for their rejection's ``error``: a call refuses a
command in the same pump that carries it out, so far fewer are ever waiting."""
MAX_TEXT_CHARS = 4096
MAX_PENDING_EVENTS = 256
DEFAULT_CONNECT_TIMEOUT_S = 5.0

COMMAND_TYPES = ("say", "cancel", "hangup", "transfer", "dtmf", "answer", "reject")
EVENT_TYPES = (
    "call.started",
    "dtmf",
    "speech.started",
    "speech.stopped",
    "turn.started",
    "turn.interrupted",
    "turn.finished",
    "provider.error",
    "provider.backlog",
    "call.ended",
    "error",
)


# --------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class AppError:
    """Why a command was refused: the field at fault ("$" for the whole message)."""

    field: str
    message: str
    command_id: str | None = None
    command: str | None = None


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a command: its JSON type and bounds (the HTTP API reuses them).

    ``int`` fields are JSON integers (not booleans, not ``486.0``) from ``lo`` to ``hi``.
    """

    name: str
    kind: Literal["str", "bool", "int"]
    required: bool = False
    pattern: str = ""
    max_chars: int = 0
    hint: str = ""
    lo: int = 0
    hi: int = 0

    def check(self, value: object) -> str | None:
        """The problem with ``value``, or ``None``."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"expected true or false, got {_jt(value)}"
        if self.kind == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                return f"expected an integer, got {_jt(value)}"
            return None if self.lo <= value <= self.hi else f"must be {self.hint}"
        if not isinstance(value, str):
            return f"expected a string, got {_jt(value)}"
        if not _is_unicode(value):
            return "not valid Unicode (lone surrogate)"
        if self.pattern and re.fullmatch(self.pattern, value) is None:
            return f"must be {self.hint}"
        if self.max_chars and len(value) > self.max_chars:
            return f"longer than {self.max_chars} characters"
        return None


_NAME = r"[A-Za-z0-9._:-]{1,64}"
_NAME_HINT = "1-64 characters from A-Z a-z 0-9 . _ : -"
_TURN_ID = FieldSpec("turn_id", "str", True, _NAME, hint=_NAME_HINT)
_PRINTABLE = r"[ -~]{1,128}"
_PRINTABLE_HINT = "1-128 printable ASCII characters"
_ID = FieldSpec("id", "str", False, r"[^\x00-\x1f]{1,128}", hint="1-128 characters, no controls")

COMMAND_FIELDS: dict[str, tuple[FieldSpec, ...]] = {
    "say": (
        _TURN_ID,
        FieldSpec("text", "str", True, max_chars=MAX_TEXT_CHARS),
        FieldSpec("final", "bool"),
        FieldSpec("interruptible", "bool"),
        FieldSpec("replace", "bool"),
        FieldSpec("cacheable", "bool"),
        FieldSpec("provider", "str", pattern=_NAME, hint=_NAME_HINT),
        FieldSpec("voice", "str", pattern=_NAME, hint=_NAME_HINT),
    ),
    "cancel": (_TURN_ID,),
    "hangup": (FieldSpec("reason", "str", pattern=_PRINTABLE, hint=_PRINTABLE_HINT),),
    "transfer": (
        FieldSpec(
            "target",
            "str",
            True,
            r"(sips?|tel):[!-~]{1,250}",
            hint="a sip:, sips: or tel: URI (printable ASCII, no spaces, at most 254 characters)",
        ),
        FieldSpec("trunk", "str", pattern=_NAME, hint=_NAME_HINT),
    ),
    "dtmf": (
        FieldSpec("digits", "str", True, r"[0-9A-D*#]{1,32}", hint="1-32 of 0-9 * # A B C D"),
    ),
    "answer": (),
    "reject": (
        FieldSpec(
            "status",
            "int",
            hint="a SIP final status from 400 to 699",
            lo=REJECT_STATUS_RANGE[0],
            hi=REJECT_STATUS_RANGE[1],
        ),
        FieldSpec("reason", "str", pattern=_PRINTABLE, hint=_PRINTABLE_HINT),
    ),
}

COMMAND_BUILDERS: dict[str, Callable[[dict[str, Any]], Command]] = {
    "say": lambda f: Say(
        f["turn_id"],
        f["text"],
        final=f.get("final", True),
        interruptible=f.get("interruptible", True),
        replace=f.get("replace", False),
        provider=f.get("provider"),
        voice=f.get("voice"),
        cacheable=f.get("cacheable", False),
    ),
    "cancel": lambda f: Cancel(f["turn_id"]),
    "hangup": lambda f: Hangup(f.get("reason", "app_hangup")),
    "transfer": lambda f: Transfer(f["target"], f.get("trunk", "")),
    "dtmf": lambda f: SendDtmf(f["digits"]),
    "answer": lambda f: Answer(),
    "reject": lambda f: Reject(f.get("status", REJECT_STATUS_DEFAULT), f.get("reason", "")),
}


class _Refused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def decode_command(text: str | bytes) -> Command | AppError:
    """Parse and validate one command message.

    Returns:
        The ``Command`` it asks for, or an ``AppError`` naming the first field
        at fault (fields are checked in a fixed order: the message, ``id``,
        ``type``, unknown fields, then the command's fields as documented).
    """
    decoded = decode_command_and_id(text)
    return decoded if isinstance(decoded, AppError) else decoded[0]


def decode_command_and_id(text: str | bytes) -> tuple[Command, str | None] | AppError:
    """``decode_command``, with the command's ``id`` (None: it had none), which an
    ``error`` about the command echoes."""
    try:
        obj = _parse(text)
    except _Refused as e:
        return AppError(e.field, e.message)
    command_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    ctype = obj.get("type") if isinstance(obj.get("type"), str) else None
    try:
        if "id" in obj:
            _check(_ID, obj["id"])
        ctype = _command_type(obj)
        fields = {f.name: f for f in COMMAND_FIELDS[ctype]}
        for key in obj:
            if key not in fields and key not in ("type", "id"):
                raise _Refused(key, f"unknown field for {ctype!r}")
        for spec in fields.values():
            if spec.name in obj:
                _check(spec, obj[spec.name])
            elif spec.required:
                raise _Refused(spec.name, "missing")
    except _Refused as e:
        ok_id = command_id if e.field != "id" else None
        ok_type = ctype if ctype in COMMAND_TYPES else None
        return AppError(e.field, e.message, ok_id, ok_type)
    return COMMAND_BUILDERS[ctype](obj), command_id


def _parse(text: str | bytes) -> dict[str, Any]:
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > MAX_MESSAGE_BYTES:
        raise _Refused("$", f"message is {size} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Refused:
        raise
    except (ValueError, RecursionError) as e:
        raise _Refused("$", f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise _Refused("$", f"expected a JSON object, got {_jt(obj)}")
    return obj


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(key, "duplicate key")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _Refused("$", f"not JSON: {name} is not a JSON number")


def _command_type(obj: dict[str, Any]) -> str:
    if "type" not in obj:
        raise _Refused("type", "missing")
    ctype = obj["type"]
    if not isinstance(ctype, str):
        raise _Refused("type", f"expected a string, got {_jt(ctype)}")
    if ctype not in COMMAND_TYPES:
        raise _Refused(
            "type", f"unknown command {ctype[:64]!r} (expected one of {', '.join(COMMAND_TYPES)})"
        )
    return ctype


def _check(spec: FieldSpec, value: object) -> None:
    problem = spec.check(value)
    if problem is not None:
        raise _Refused(spec.name, problem)


def _jt(value: object) -> str:
    """The JSON type name of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _is_unicode(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------- encoding


def _call_started(e: CallStarted) -> dict[str, Any]:
    return {
        "call_id": e.call_id,
        "leg": e.leg,
        "from": e.from_,
        "to": e.to,
        "custom_parameters": dict(e.custom_parameters),
    }


_ENCODERS: dict[type[CallEvent], tuple[str, Callable[[Any], dict[str, Any]]]] = {
    CallStarted: ("call.started", _call_started),
    DtmfHeard: ("dtmf", lambda e: {"digit": e.digit}),
    SpeechStarted: ("speech.started", lambda e: {}),
    SpeechStopped: ("speech.stopped", lambda e: {}),
    TurnBegan: ("turn.started", lambda e: {"turn_id": e.turn_id}),
    TurnInterrupted: (
        "turn.interrupted",
        lambda e: {
            "turn_id": e.turn_id,
            "heard_ms": e.heard_ms,
            "heard_text": e.heard_text,
            "reason": e.reason,
        },
    ),
    TurnFinished: (
        "turn.finished",
        lambda e: {"turn_id": e.turn_id, "heard_ms": e.heard_ms, "heard_text": e.heard_text},
    ),
    ProviderErrored: (
        "provider.error",
        lambda e: {
            "turn_id": e.turn_id,
            "provider": e.provider,
            "kind": e.kind,
            "message": e.message,
        },
    ),
    ProviderBacklog: (
        "provider.backlog",
        lambda e: {"turn_id": e.turn_id, "queue_depth": e.queue_depth},
    ),
    CallEnded: ("call.ended", lambda e: {"reason": e.reason}),
}


def encode_event(event: CallEvent) -> str:
    """One call event as its protocol message.

    Raises:
        LocalProtocolError: the event has no protocol message (``CommandRejected``
            is sent with ``encode_error``; the daemon's own events are not sent).
    """
    entry = _ENCODERS.get(type(event))
    if entry is None:
        raise LocalProtocolError(f"{type(event).__name__} is not an application event")
    name, fields = entry
    return _dumps({"type": name, **fields(event)})


def encode_error(
    error: AppError, code: Literal["invalid_command", "command_rejected"] = "invalid_command"
) -> str:
    """An ``error`` message for a refused command."""
    msg: dict[str, Any] = {
        "type": "error",
        "code": code,
        "field": error.field,
        "message": error.message,
    }
    if error.command_id is not None:
        msg["id"] = error.command_id
    if error.command is not None:
        msg["command"] = error.command
    return _dumps(msg)


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


_REJECTED_TYPE = {
    "Say": "say",
    "Cancel": "cancel",
    "Hangup": "hangup",
    "Transfer": "transfer",
    "SendDtmf": "dtmf",
    "Answer": "answer",
    "Reject": "reject",
}
_REJECTED_FIELD = {
    "turn_closed": "turn_id",
    "duplicate_turn_id": "turn_id",
    "empty_turn_id": "turn_id",
    "no_such_turn": "turn_id",
    "empty_target": "target",
    "bad_digits": "digits",
    "unknown_provider": "provider",
    "bad_status": "status",
}


def _rejection(event: CommandRejected, command_id: str | None = None) -> AppError:
    where = f" (turn {event.turn_id})" if event.turn_id else ""
    return AppError(
        _REJECTED_FIELD.get(event.reason, "$"),
        f"refused by the call: {event.reason}{where}",
        command_id,
        _REJECTED_TYPE.get(event.command),
    )


# --------------------------------------------------------------- session


@dataclass(frozen=True, slots=True)
class AppConnected(Event):
    url: str
    at_s: float


@dataclass(frozen=True, slots=True)
class AppLost(Event):
    """The application cannot drive the call: run the route's fallback.

    ``reason``: ``connect_failed: ...``, ``connect_timeout`` or ``disconnected: <code>``.
    ``mid_call``: the application had connected (its turns may still be queued).
    """

    reason: str
    mid_call: bool
    fallback_flow: str
    greeting: str


class AppState(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    ENDED = "ended"
    LOST = "lost"


class AppSession(Outbox):
    """One call's application WebSocket (see the module docstring for the contract)."""

    def __init__(
        self,
        call_started: CallStarted,
        url: str,
        now: float,
        *,
        fallback_flow: str = "",
        greeting: str = "",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_pending_events: int = MAX_PENDING_EVENTS,
    ) -> None:
        """Start a session; the shell starts connecting to ``url`` at ``now``.

        Args:
            call_started: the call's ``CallStarted``; always the first message.
            url: the application's ``ws(s)://`` URL (from the route or a flow step).
            now: when connecting began; the connect timeout counts from it.
            fallback_flow: the route's ``fallback_flow`` ("" for greeting + hangup).
            greeting: the route's greeting, for the fallback.
            connect_timeout_s: how long the WebSocket may take to open.
            max_pending_events: events buffered while connecting; later ones are dropped.
        """
        super().__init__()
        self.url = url
        self._fallback_flow = fallback_flow
        self._greeting = greeting
        self._state = AppState.CONNECTING
        self._connect_deadline_at: float | None = now + connect_timeout_s
        self._pending: list[str] = [encode_event(call_started)]
        self._max_pending = max_pending_events
        self._commands: list[Command] = []
        self._ids: deque[tuple[Command, str]] = deque(maxlen=RECENT_IDS)
        """The latest commands that came with an ``id``: a rejection (which names its
        command object) echoes it."""
        self.dropped_events = 0
        self.refused_commands = 0

    @property
    def state(self) -> AppState:
        return self._state

    @property
    def is_connected(self) -> bool:
        return self._state is AppState.OPEN

    def _id_of(self, event: CommandRejected) -> str | None:
        """The ``id`` the refused command came with (None: none, or not the app's)."""
        for i, (command, command_id) in enumerate(self._ids):
            if command is event.source:
                del self._ids[i]
                return command_id
        return None

    def commands_to_send(self) -> list[Command]:
        """Drain the application's valid commands, in arrival order."""
        out, self._commands = self._commands, []
        return out

    # ------------------------------------------------------------ the WebSocket

    def connected(self, now: float) -> None:
        """The WebSocket opened: flush the buffered events (``call.started`` first)."""
        if self._state is not AppState.CONNECTING:
            return
        self._state = AppState.OPEN
        self._connect_deadline_at = None
        self._actions.extend(SendText(t) for t in self._pending)
        self._pending = []
        self._events.append(AppConnected(self.url, now))

    def connect_failed(self, reason: str, now: float) -> None:
        """The WebSocket could not be opened (refused, DNS, TLS, HTTP status)."""
        if self._state is AppState.CONNECTING:
            self._lose(f"connect_failed: {reason}", mid_call=False)

    def disconnected(self, code: int, reason: str, now: float) -> None:
        """The WebSocket closed; before the call ended that loses the application."""
        if self._state is AppState.OPEN:
            self._lose(f"disconnected: {code} {reason}".rstrip(), mid_call=True)
        elif self._state is AppState.CONNECTING:
            self._lose(f"connect_failed: closed {code}", mid_call=False)

    def receive_text(self, text: str, now: float) -> None:
        """One text message from the application: a command or an ``error`` reply."""
        if self._state is not AppState.OPEN:
            return
        result = decode_command_and_id(text)
        if isinstance(result, AppError):
            self.refused_commands += 1
            self._actions.append(SendText(encode_error(result)))
        else:
            command, command_id = result
            self._commands.append(command)
            if command_id is not None:
                self._ids.append((command, command_id))

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Binary messages are not part of the protocol: answered with ``error``."""
        if self._state is not AppState.OPEN:
            return
        self.refused_commands += 1
        error = AppError("$", "binary messages are not part of the protocol; send JSON text")
        self._actions.append(SendText(encode_error(error)))

    # ------------------------------------------------------------ the call

    def handle_event(self, event: CallEvent, now: float) -> None:
        """One event of the call: sent (or buffered) as its protocol message."""
        if self._state in (AppState.ENDED, AppState.LOST):
            return
        if isinstance(event, CommandRejected):
            self._send(encode_error(_rejection(event, self._id_of(event)), "command_rejected"))
        elif type(event) in _ENCODERS:
            self._send(encode_event(event))
        if isinstance(event, CallEnded):
            was_open = self._state is AppState.OPEN
            self._state = AppState.ENDED
            self._connect_deadline_at = None
            self._pending = []
            code, reason = (1000, "call ended") if was_open else (1001, "call ended")
            self._actions.append(CloseConnection(code, reason))

    def next_deadline(self) -> float | None:
        """The connect timeout while connecting, else ``None``."""
        return self._connect_deadline_at

    def handle_timer(self, now: float) -> None:
        """Give up connecting at the deadline (``CloseConnection`` aborts the attempt)."""
        if self._connect_deadline_at is None or now < self._connect_deadline_at:
            return
        self._actions.append(CloseConnection(1001, "connect timeout"))
        self._lose("connect_timeout", mid_call=False)

    def _send(self, text: str) -> None:
        if self._state is AppState.OPEN:
            self._actions.append(SendText(text))
        elif len(self._pending) < self._max_pending:
            self._pending.append(text)
        else:
            self.dropped_events += 1

    def _lose(self, reason: str, *, mid_call: bool) -> None:
        self._state = AppState.LOST
        self._connect_deadline_at = None
        self._pending = []
        self._events.append(AppLost(reason, mid_call, self._fallback_flow, self._greeting))

"""What drives a call, whatever the turn source: commands in, call events out.

The application WebSocket (``bridge/control/app.py``), the HTTP API
(``bridge/control/api.py``) and IVR flows (``bridge/control/flow.py``) all
produce the same ``Command`` values, and all consume the same ``CallEvent``
values. The per-call bridge (``bridge/media/call.py``) executes commands and
reports events; it does not know which source drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

__all__ = [
    "REJECT_STATUS_DEFAULT",
    "REJECT_STATUS_RANGE",
    "Answer",
    "CallEnded",
    "CallEvent",
    "CallStarted",
    "Cancel",
    "Command",
    "CommandRejected",
    "DtmfHeard",
    "HandOver",
    "Hangup",
    "ProviderBacklog",
    "ProviderErrored",
    "Reject",
    "Say",
    "SendDtmf",
    "SpeechStarted",
    "SpeechStopped",
    "Transfer",
    "TurnBegan",
    "TurnFinished",
    "TurnInterrupted",
]


# ---------------------------------------------------------------- commands


class Command:
    """Base of everything a turn source can ask of a call."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Say(Command):
    """Speak text on a turn. Text may stream in pieces; ``final`` closes the turn.

    A ``say`` for a new ``turn_id`` opens a turn: it queues behind the
    current one, or replaces it when ``replace`` is true. Further ``say``
    commands with the same ``turn_id`` append text.
    """

    turn_id: str
    text: str
    final: bool = True
    interruptible: bool = True
    replace: bool = False
    provider: str | None = None
    voice: str | None = None
    cacheable: bool = False


@dataclass(frozen=True, slots=True)
class Cancel(Command):
    """Stop a turn (as a barge-in would, but asked for)."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class Hangup(Command):
    reason: str = "hangup"


@dataclass(frozen=True, slots=True)
class Transfer(Command):
    """Blind transfer (SIP REFER) to ``target``."""

    target: str
    trunk: str = ""
    """The ``[trunks]`` entry a ``tel:`` target goes through ("": the call's own trunk)."""


@dataclass(frozen=True, slots=True)
class SendDtmf(Command):
    digits: str


REJECT_STATUS_DEFAULT = 486
"""``reject`` without a status: 486 Busy Here (the caller's side may try voicemail or
another number; 603 Decline says the callee refuses everywhere)."""
REJECT_STATUS_RANGE = (400, 699)
"""The final statuses ``reject`` may send: a 4xx, 5xx or 6xx."""


@dataclass(frozen=True, slots=True)
class Answer(Command):
    """During early media (SIP 183): answer the call now (200 OK); the turn goes on."""


@dataclass(frozen=True, slots=True)
class Reject(Command):
    """During early media (SIP 183): end the call with this final response.

    ``reason``: the response's reason phrase ("" for the status's usual phrase).
    """

    status: int = REJECT_STATUS_DEFAULT
    reason: str = ""


@dataclass(frozen=True, slots=True)
class HandOver(Command):
    """Give the call to an application WebSocket or a voice agent provider."""

    app: str = ""
    voice_agent: str = ""


# ------------------------------------------------------------------ events


@mypyc_attr(allow_interpreted_subclasses=True)  # the shell's and tests' own events
class CallEvent:
    """Base of everything a call tells its turn source."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class CallStarted(CallEvent):
    call_id: str
    leg: str
    from_: str
    to: str
    custom_parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DtmfHeard(CallEvent):
    digit: str


@dataclass(frozen=True, slots=True)
class SpeechStarted(CallEvent):
    at_s: float


@dataclass(frozen=True, slots=True)
class SpeechStopped(CallEvent):
    at_s: float


@dataclass(frozen=True, slots=True)
class TurnBegan(CallEvent):
    """The first frame of the turn went out to the caller."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class TurnFinished(CallEvent):
    """The turn played to its end; ``heard_ms`` is all of it."""

    turn_id: str
    heard_ms: int
    heard_text: str


@dataclass(frozen=True, slots=True)
class TurnInterrupted(CallEvent):
    """The turn was cut (barge-in, cancel, replace); what the caller heard of it."""

    turn_id: str
    heard_ms: int
    heard_text: str
    reason: str


@dataclass(frozen=True, slots=True)
class ProviderBacklog(CallEvent):
    """The provider's queue for a turn (zwst ``segment_start.queue_depth``).

    Backpressure for a source streaming text: a growing depth means text
    arrives faster than the provider synthesises it.
    """

    turn_id: str
    queue_depth: int


@dataclass(frozen=True, slots=True)
class ProviderErrored(CallEvent):
    turn_id: str
    provider: str
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class CallEnded(CallEvent):
    reason: str


@dataclass(frozen=True, slots=True)
class CommandRejected(CallEvent):
    """A command from the turn source could not be carried out; nothing changed."""

    command: str
    turn_id: str
    reason: str
    source: Command | None = field(default=None, compare=False, repr=False)
    """The refused command itself: its sender tells it apart from an equal one (the
    application protocol echoes the ``id`` the command came with)."""

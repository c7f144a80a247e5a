"""The vocabulary every sans-I/O engine shares.

Theory of operation
-------------------
An engine is a protocol state machine with no sockets, no clock and no tasks
(the aioquic / python-websockets shape). The asyncio shell in ``bridge.io``
drives it:

* it feeds what arrived with ``receive_*(data, now)``;
* it calls ``handle_timer(now)`` once ``now >= next_deadline()``;
* it drains ``actions_to_send()`` (things to put on a wire) and
  ``events_received()`` (things the layer above must know) after every call.

Rules that keep engines honest:

1. ``now`` is always a parameter (seconds on the loop's monotonic clock).
   Nothing in an engine reads a clock.
2. Bad remote input never raises out of an engine: it becomes a response
   (SIP 400), a close action, or an error event.
3. Actions and events are frozen, slotted dataclasses; events are named in the
   past tense.

The transport-level actions below are shared by every engine that speaks over
a WebSocket or a datagram socket; engines add their own where a transport
needs more (SIP over TCP, HTTP requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from mypy_extensions import mypyc_attr

__all__ = [
    "Action",
    "CloseConnection",
    "Engine",
    "Event",
    "LocalProtocolError",
    "Outbox",
    "ProtocolError",
    "RemoteProtocolError",
    "SendBytes",
    "SendDatagram",
    "SendText",
]

Address = tuple[str, int]


@mypyc_attr(allow_interpreted_subclasses=True)
class Action:
    """Base class of everything an engine asks the shell to do."""

    __slots__ = ()


@mypyc_attr(allow_interpreted_subclasses=True)
class Event:
    """Base class of everything an engine tells the layer above."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class SendText(Action):
    """Send one WebSocket text message."""

    text: str


@dataclass(frozen=True, slots=True)
class SendBytes(Action):
    """Send one WebSocket binary message."""

    data: bytes


@dataclass(frozen=True, slots=True)
class SendDatagram(Action):
    """Send one UDP datagram to ``addr``."""

    data: bytes
    addr: Address


@dataclass(frozen=True, slots=True)
class CloseConnection(Action):
    """Close the transport (for WebSockets, with a close code and reason)."""

    code: int = 1000
    reason: str = ""


@mypyc_attr(allow_interpreted_subclasses=True)
class ProtocolError(Exception):
    """A protocol rule was broken.

    ``status`` carries the SIP status code or WebSocket close code that the
    violation maps to, when there is one.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@mypyc_attr(allow_interpreted_subclasses=True)
class LocalProtocolError(ProtocolError):
    """We misused an engine (a programming error on our side)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class Engine(Protocol):
    """The contract every protocol engine follows (see module docstring)."""

    def handle_timer(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def actions_to_send(self) -> list[Action]: ...

    def events_received(self) -> list[Event]: ...


A = TypeVar("A", bound=Action)


@mypyc_attr(allow_interpreted_subclasses=True)
class Outbox:
    """The two queues an engine fills: actions for the shell, events for the layer above.

    Engines inherit from it (or hold one) so that draining is written once.
    """

    __slots__ = ("_actions", "_events")

    def __init__(self) -> None:
        self._actions: list[Action] = []
        self._events: list[Event] = []

    def actions_to_send(self) -> list[Action]:
        """Drain and return the actions queued since the last call."""
        actions, self._actions = self._actions, []
        return actions

    def events_received(self) -> list[Event]:
        """Drain and return the events queued since the last call."""
        events, self._events = self._events, []
        return events

"""IVR flows: a call driven by the ``[flows.NAME]`` steps of the config.

Theory of operation
-------------------
``FlowRunner`` is a turn source: it consumes the call's ``CallEvent`` values
and time, and produces ``Command`` values (``bridge.commands``),
exactly as the application WebSocket (``bridge.control.app``) does. It owns
no audio: the per-call bridge speaks, barges in and reports turns.

Calling contract (the shell's side)::

    runner = FlowRunner(flow, greeting, now)
    runner.start(now)                       # greeting, then the start step
    runner.handle_event(call_event, now)    # every CallEvent of the call
    runner.handle_timer(now)                # once now >= runner.next_deadline()
    runner.commands_to_send()               # drain after every call above -> call.execute
    runner.events_received()                # StepEntered, DigitsGathered, FlowEnded (logs, CDR)

Each step runs the same phases (``_Phase``)::

    enter step --say?--> PROMPTING --prompt reported--> GATHERING --digits/timeout--+
        |  (no say, nothing playing)        |  (no gather)                          |
        +-----------------------------------+----------> step ends <----------------+

A prompt is *reported* when the call says ``TurnFinished`` or
``TurnInterrupted`` for its turn id. A step without ``say`` that is entered
while the greeting still plays treats the greeting as its prompt.

Gathering (steps with ``gather``):

* Digits count from the moment the step's prompt is queued: a DTMF during an
  interruptible prompt barges in (the call does that) and is the first digit.
  During a non-interruptible prompt keys neither cut it nor count ("keys do
  not cut it", config/README.md): the caller must hear it first.
* The gather completes on the terminator (not part of the digits), or when
  ``max_digits`` digits are in. A gather completed during the prompt is
  resolved when the prompt is reported (at once after a DTMF barge-in; when
  the prompt ends if barge-in on DTMF is switched off).
* ``timeout_s`` runs from the end of the prompt and re-arms after every digit
  (an inter-digit timeout); at expiry whatever was collected is resolved.

Branching: the collected digits are looked up exactly in ``branch``; the
terminator alone looks up the terminator key; no digit at all by timeout
looks up ``timeout``; anything else (and a missing ``timeout`` key) uses
``default``. With no matching key the step ends as a non-gathering step does,
and a gathering step with nowhere to go is asked again.

A step ends, in this order: a branch target; ``transfer`` (``Transfer``);
``hangup`` (``Hangup("flow_hangup")``); ``app``/``voice_agent`` (``HandOver``); ``next``.
Every ending runs after the step's prompt was reported, so "Goodbye" is
heard before the ``Hangup``. After ``Transfer``, ``Hangup`` and ``HandOver``
the flow is done and ignores everything; so it does after ``CallEnded``.

Rules that keep this module honest:

1. Nothing raises on what the call reports: unknown turn ids, digits outside
   a gather and events after the end are ignored.
2. Every ``Say`` has a fresh turn id (``<prefix>-<n>``); prompts are static
   text, so they are marked ``cacheable``.
3. A hand-built ``FlowConfig`` that names a missing step or loops through
   steps that never wait ends the call (``Hangup("flow_error")``) instead of
   recursing forever.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Protocol

from bridge.commands import (
    CallEnded,
    CallEvent,
    Command,
    DtmfHeard,
    HandOver,
    Hangup,
    Say,
    Transfer,
    TurnFinished,
    TurnInterrupted,
)
from bridge.config import FlowConfig, FlowStep
from bridge.engine import Event, LocalProtocolError

__all__ = [
    "DigitsGathered",
    "FlowEnded",
    "FlowRunner",
    "StepEntered",
    "TurnSource",
    "fallback_runner",
]

GatherOutcome = Literal["terminator", "max_digits", "timeout"]
FlowOutcome = Literal["transfer", "hangup", "handed_over", "call_ended", "flow_error"]

HANGUP_REASON = "flow_hangup"
ERROR_REASON = "flow_error"


class TurnSource(Protocol):
    """What the shell drives for every turn source (IVR flow or application)."""

    def handle_event(self, event: CallEvent, now: float) -> None: ...

    def handle_timer(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def commands_to_send(self) -> list[Command]: ...

    def events_received(self) -> list[Event]: ...


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class StepEntered(Event):
    step: str
    at_s: float


@dataclass(frozen=True, slots=True)
class DigitsGathered(Event):
    """A gather completed; ``target`` is the step chosen ("" when no key matched)."""

    step: str
    digits: str
    outcome: GatherOutcome
    target: str


@dataclass(frozen=True, slots=True)
class FlowEnded(Event):
    outcome: FlowOutcome
    step: str
    elapsed_s: float


# ------------------------------------------------------------------ runner


class _Phase(enum.Enum):
    IDLE = "idle"
    PROMPTING = "prompting"
    GATHERING = "gathering"
    DONE = "done"


class FlowRunner:
    """Runs one IVR flow for one call (see the module docstring for the contract)."""

    def __init__(
        self,
        flow: FlowConfig,
        greeting: str,
        now: float,
        *,
        turn_prefix: str = "",
        replace: bool = False,
    ) -> None:
        """Prepare the flow; nothing is said before ``start``.

        Args:
            flow: the validated ``[flows.NAME]`` table.
            greeting: the route's greeting, said before the start step ("" for none).
            now: creation time; ``FlowEnded.elapsed_s`` counts from it.
            turn_prefix: turn ids are ``<turn_prefix>-<n>`` (default ``flow-<name>``);
                give a distinct prefix to each runner of one call.
            replace: the first ``Say`` replaces whatever the call still has queued
                (a fallback flow taking over from a lost application).
        """
        self._flow = flow
        self._greeting = greeting
        self._created_s = now
        self._prefix = turn_prefix or f"flow-{flow.name}"
        self._replace_next = replace
        self._commands: list[Command] = []
        self._events: list[Event] = []
        self._phase = _Phase.IDLE
        self._step = FlowStep(name="", hangup=True)
        self._turn_seq = 0
        self._open_turns: dict[str, bool] = {}  # flow turn id -> interruptible, until reported
        self._prompt_turn = ""
        self._digits = ""
        self._gather_end: GatherOutcome | None = None
        self._gather_deadline_at: float | None = None
        self._hops = 0

    # ------------------------------------------------------------ drains

    def commands_to_send(self) -> list[Command]:
        """Drain the commands for the call (``CallBridge.execute``), in order."""
        out, self._commands = self._commands, []
        return out

    def events_received(self) -> list[Event]:
        """Drain ``StepEntered`` / ``DigitsGathered`` / ``FlowEnded``."""
        out, self._events = self._events, []
        return out

    @property
    def done(self) -> bool:
        return self._phase is _Phase.DONE

    @property
    def step(self) -> str:
        """The current step's name ("" before ``start``)."""
        return self._step.name

    # ------------------------------------------------------------ inputs

    def start(self, now: float) -> None:
        """Say the greeting, then enter the start step.

        Raises:
            LocalProtocolError: the runner was already started.
        """
        if self._phase is not _Phase.IDLE:
            raise LocalProtocolError("FlowRunner.start called twice")
        if self._greeting:
            self._say(self._greeting, interruptible=True)
        self._enter(self._flow.start, now)

    def handle_event(self, event: CallEvent, now: float) -> None:
        """Consume one event of the call; anything irrelevant is ignored."""
        if self._phase in (_Phase.IDLE, _Phase.DONE):
            return
        match event:
            case TurnFinished(turn_id=turn_id) | TurnInterrupted(turn_id=turn_id):
                self._turn_reported(turn_id, now)
            case DtmfHeard(digit=digit):
                self._on_digit(digit, now)
            case CallEnded():
                self._end("call_ended", now)
            case _:
                pass  # speech, turn starts, provider errors: the call handles them

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` must run next (the gather timeout), or ``None``."""
        return self._gather_deadline_at if self._phase is _Phase.GATHERING else None

    def handle_timer(self, now: float) -> None:
        """Run the gather timeout if it is due; early calls do nothing."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return
        self._gather_end = "timeout"
        self._resolve(now)

    # ------------------------------------------------------------ steps

    def _enter(self, name: str, now: float) -> None:
        self._hops += 1
        try:
            step = self._flow.step(name)
        except KeyError:
            step = None
        if step is None or self._hops > len(self._flow.steps) + 1:
            self._commands.append(Hangup(ERROR_REASON))
            self._end("flow_error", now)
            return
        self._step = step
        self._digits = ""
        self._gather_end = None
        self._gather_deadline_at = None
        self._events.append(StepEntered(step.name, now))
        if step.say:
            self._prompt_turn = self._say(step.say, interruptible=step.interruptible)
        elif self._open_turns:
            self._prompt_turn = next(reversed(self._open_turns))
        else:
            self._prompt_done(now)
            return
        self._phase = _Phase.PROMPTING
        self._hops = 0

    def _say(self, text: str, *, interruptible: bool) -> str:
        self._turn_seq += 1
        turn_id = f"{self._prefix}-{self._turn_seq}"
        self._commands.append(
            Say(
                turn_id,
                text,
                final=True,
                interruptible=interruptible,
                replace=self._replace_next,
                cacheable=True,
            )
        )
        self._replace_next = False
        self._open_turns[turn_id] = interruptible
        return turn_id

    def _turn_reported(self, turn_id: str, now: float) -> None:
        self._open_turns.pop(turn_id, None)
        if self._phase is _Phase.PROMPTING and turn_id == self._prompt_turn:
            self._prompt_turn = ""
            self._prompt_done(now)

    def _prompt_done(self, now: float) -> None:
        if not self._step.gathers:
            self._finish_step("", now)
        elif self._gather_end is not None:
            self._resolve(now)
        else:
            self._phase = _Phase.GATHERING
            self._gather_deadline_at = now + self._step.gather_timeout_s
            self._hops = 0

    def _on_digit(self, digit: str, now: float) -> None:
        step = self._step
        if not step.gathers or self._gather_end is not None:
            return
        if self._phase is _Phase.PROMPTING and not self._open_turns.get(self._prompt_turn, True):
            return  # a non-interruptible prompt: keys neither cut it nor count
        if step.gather_terminator and digit == step.gather_terminator:
            self._gather_end = "terminator"
        else:
            self._digits += digit
            if len(self._digits) >= step.gather_max_digits:
                self._gather_end = "max_digits"
        if self._phase is not _Phase.GATHERING:
            return  # resolved when the prompt is reported
        if self._gather_end is not None:
            self._resolve(now)
        else:
            self._gather_deadline_at = now + step.gather_timeout_s

    def _resolve(self, now: float) -> None:
        step, digits, outcome = self._step, self._digits, self._gather_end
        assert outcome is not None
        branch = dict(step.branch)
        if digits:
            key = digits
        elif outcome == "terminator":
            key = step.gather_terminator
        else:
            key = "timeout"
        target = branch.get(key) or branch.get("default", "")
        self._gather_deadline_at = None
        self._events.append(DigitsGathered(step.name, digits, outcome, target))
        self._finish_step(target, now)

    def _finish_step(self, target: str, now: float) -> None:
        step = self._step
        if target:
            self._enter(target, now)
        elif step.transfer:
            self._commands.append(Transfer(step.transfer, step.trunk))
            self._end("transfer", now)
        elif step.hangup:
            self._commands.append(Hangup(HANGUP_REASON))
            self._end("hangup", now)
        elif step.app or step.voice_agent:
            self._commands.append(HandOver(app=step.app, voice_agent=step.voice_agent))
            self._end("handed_over", now)
        elif step.next:
            self._enter(step.next, now)
        elif step.gathers:
            self._enter(step.name, now)
        else:
            self._commands.append(Hangup(ERROR_REASON))
            self._end("flow_error", now)

    def _end(self, outcome: FlowOutcome, now: float) -> None:
        self._phase = _Phase.DONE
        self._gather_deadline_at = None
        self._events.append(FlowEnded(outcome, self._step.name, now - self._created_s))


def fallback_runner(
    flow: FlowConfig | None,
    greeting: str,
    now: float,
    *,
    replace: bool,
    turn_prefix: str = "fallback",
) -> FlowRunner:
    """The runner for a route's fallback, when its application is unreachable or lost.

    With a ``fallback_flow`` it runs that flow (after the greeting); without
    one it says the greeting and hangs up (at once when there is no greeting).
    ``replace`` makes the first prompt cut whatever the application left queued
    (an application lost mid-call may leave a turn whose text never closed).
    Call ``start(now)`` on the result.
    """
    if flow is None:
        flow = FlowConfig(name="fallback", start="end", steps=(FlowStep(name="end", hangup=True),))
    return FlowRunner(flow, greeting, now, turn_prefix=turn_prefix, replace=replace)

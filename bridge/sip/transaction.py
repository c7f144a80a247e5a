"""SIP transactions (RFC 3261 §17, with the RFC 6026 "Accepted" states).

Theory of operation
-------------------
Four state machines, one class each, sharing timer bookkeeping:

==============  ==========================================  =====================
machine         states                                      timers
==============  ==========================================  =====================
INVITE client   CALLING -> PROCEEDING -> COMPLETED|ACCEPTED  A, B, D, M
non-INVITE cl.  TRYING -> PROCEEDING -> COMPLETED            E, F, K
INVITE server   PROCEEDING -> COMPLETED -> CONFIRMED|ACCEPTED G, H, I, L
non-INVITE sv.  TRYING -> PROCEEDING -> COMPLETED            J
==============  ==========================================  =====================

Every machine ends in TERMINATED. The transition tables below
(``_INVITE_CLIENT``, ``_NON_INVITE_CLIENT``) map (state, response class) to
the next state; the server side is driven by the TU's ``respond`` calls.

Inputs: ``start(now)`` (client), ``receive_response`` (client),
``receive_request`` (server: retransmissions and ACK), ``respond`` (server),
``handle_timer(now)``. Outputs, drained by the owner (the user agent):
``TransmitMessage`` actions (the owner knows where and how to send) and the
events ``ResponseReceived``, ``TransactionTimedOut`` and
``TransactionTerminated``.

Rules:

1. Timers are data: ``self._timers`` maps the RFC timer letter to an absolute
   deadline, ``next_deadline()`` is their minimum, and nothing reads a clock.
2. On a reliable transport nothing is retransmitted (A, E, G never armed) and
   the wait timers D, I, J, K are zero (RFC 3261 §17.1.1.2 etc.).
3. Timer A doubles without a cap; E and G double up to T2 (E stays at T2 in
   PROCEEDING).
4. The INVITE client transaction builds the ACK for non-2xx finals itself
   (§17.1.1.3) and re-sends it on every retransmitted final response.
5. Server transactions absorb request retransmissions by re-sending the last
   response (§17.2.1, §17.2.2).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bridge.engine import Action, Event, Outbox
from bridge.sip.message import SipMessage, SipRequest, SipResponse
from bridge.sip.settings import TimerSettings

__all__ = [
    "ClientTransaction",
    "ResponseReceived",
    "ServerTransaction",
    "State",
    "TransactionTerminated",
    "TransactionTimedOut",
    "TransmitMessage",
    "build_ack",
]


class State(enum.Enum):
    CALLING = "Calling"
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    COMPLETED = "Completed"
    CONFIRMED = "Confirmed"
    ACCEPTED = "Accepted"
    TERMINATED = "Terminated"


@dataclass(frozen=True, slots=True)
class TransmitMessage(Action):
    """Send ``message`` to the transaction's peer."""

    message: SipMessage


@dataclass(frozen=True, slots=True)
class ResponseReceived(Event):
    """A response the TU must see (retransmitted non-2xx finals are absorbed)."""

    response: SipResponse


@dataclass(frozen=True, slots=True)
class TransactionTimedOut(Event):
    """Timer B/F (client: no final response) or H (server: no ACK) fired."""

    timer: str


@dataclass(frozen=True, slots=True)
class TransactionTerminated(Event):
    """The transaction reached TERMINATED; its owner may forget it."""


# (state, response class) -> next state. Class 2 is 2xx, 3 stands for 300-699.
# RFC 3261 Figure 5 with RFC 6026 Figure 3 (2xx -> ACCEPTED).
_INVITE_CLIENT: dict[tuple[State, int], State] = {
    (State.CALLING, 1): State.PROCEEDING,
    (State.PROCEEDING, 1): State.PROCEEDING,
    (State.CALLING, 2): State.ACCEPTED,
    (State.PROCEEDING, 2): State.ACCEPTED,
    (State.ACCEPTED, 2): State.ACCEPTED,
    (State.CALLING, 3): State.COMPLETED,
    (State.PROCEEDING, 3): State.COMPLETED,
    (State.COMPLETED, 3): State.COMPLETED,
}
# RFC 3261 Figure 6.
_NON_INVITE_CLIENT: dict[tuple[State, int], State] = {
    (State.TRYING, 1): State.PROCEEDING,
    (State.PROCEEDING, 1): State.PROCEEDING,
    (State.TRYING, 2): State.COMPLETED,
    (State.PROCEEDING, 2): State.COMPLETED,
    (State.TRYING, 3): State.COMPLETED,
    (State.PROCEEDING, 3): State.COMPLETED,
}


def _response_class(status: int) -> int:
    return 1 if status < 200 else 2 if status < 300 else 3


class _Transaction(Outbox):
    """Timer bookkeeping shared by the four machines."""

    def __init__(self, request: SipRequest, timers: TimerSettings, reliable: bool) -> None:
        super().__init__()
        self.request = request
        self.state = State.TERMINATED
        self._config = timers
        self._reliable = reliable
        self._timers: dict[str, float] = {}
        self._interval_s = timers.t1_s

    @property
    def is_invite(self) -> bool:
        return self.request.method == "INVITE"

    def next_deadline(self) -> float | None:
        return min(self._timers.values()) if self._timers else None

    def handle_timer(self, now: float) -> None:
        """Fire every timer due at ``now``, earliest first."""
        while self._timers:
            name = min(self._timers, key=self._timers.__getitem__)
            if self._timers[name] > now:
                return
            del self._timers[name]
            self._fire(name, now)

    def _fire(self, name: str, now: float) -> None:
        raise NotImplementedError

    def _wait(self, unreliable_s: float) -> float:
        return 0.0 if self._reliable else unreliable_s

    def _transmit(self, message: SipMessage) -> None:
        self._actions.append(TransmitMessage(message))

    def _terminate(self) -> None:
        self.state = State.TERMINATED
        self._timers.clear()
        self._events.append(TransactionTerminated())


class ClientTransaction(_Transaction):
    """INVITE or non-INVITE client transaction (RFC 3261 §17.1)."""

    def __init__(self, request: SipRequest, timers: TimerSettings, reliable: bool) -> None:
        super().__init__(request, timers, reliable)
        self.last_ack: SipRequest | None = None

    def start(self, now: float) -> None:
        """Send the request and arm A/B (INVITE) or E/F (non-INVITE)."""
        self.state = State.CALLING if self.is_invite else State.TRYING
        self._transmit(self.request)
        retransmit, timeout = ("A", "B") if self.is_invite else ("E", "F")
        if not self._reliable:
            self._timers[retransmit] = now + self._interval_s
        self._timers[timeout] = now + self._config.timeout_s

    def receive_response(self, response: SipResponse, now: float) -> None:
        """Feed a response whose branch and CSeq method match this transaction."""
        table = _INVITE_CLIENT if self.is_invite else _NON_INVITE_CLIENT
        klass = _response_class(response.status)
        new_state = table.get((self.state, klass))
        if new_state is None:
            return  # e.g. a late 1xx after a final: absorbed
        old_state, self.state = self.state, new_state
        if self.is_invite:
            self._invite_transition(old_state, response, now)
        else:
            self._non_invite_transition(response, now)

    def _invite_transition(self, old: State, response: SipResponse, now: float) -> None:
        if self.state is State.COMPLETED:
            if old is State.COMPLETED:
                if self.last_ack is not None:
                    self._transmit(self.last_ack)  # retransmitted final: re-ACK, absorb
                return
            self._timers.clear()
            self.last_ack = build_ack(self.request, response)
            self._transmit(self.last_ack)
            self._timers["D"] = now + self._wait(32.0)
        elif self.state is State.ACCEPTED and old is not State.ACCEPTED:
            self._timers.clear()
            self._timers["M"] = now + self._config.timeout_s
        elif self.state is State.PROCEEDING:
            self._timers.pop("A", None)
            self._timers.pop("B", None)  # Timer B only runs in CALLING
        self._events.append(ResponseReceived(response))

    def _non_invite_transition(self, response: SipResponse, now: float) -> None:
        if self.state is State.COMPLETED:
            self._timers.clear()
            self._timers["K"] = now + self._wait(self._config.t4_s)
        self._events.append(ResponseReceived(response))

    def _fire(self, name: str, now: float) -> None:
        if name == "A":
            self._transmit(self.request)
            self._interval_s *= 2
            self._timers["A"] = now + self._interval_s
        elif name == "E":
            self._transmit(self.request)
            if self.state is State.PROCEEDING:
                self._interval_s = self._config.t2_s
            else:
                self._interval_s = min(self._interval_s * 2, self._config.t2_s)
            self._timers["E"] = now + self._interval_s
        elif name in ("B", "F"):
            self._events.append(TransactionTimedOut(name))
            self._terminate()
        else:  # D, K, M
            self._terminate()


class ServerTransaction(_Transaction):
    """INVITE or non-INVITE server transaction (RFC 3261 §17.2)."""

    def __init__(self, request: SipRequest, timers: TimerSettings, reliable: bool) -> None:
        super().__init__(request, timers, reliable)
        self.state = State.PROCEEDING if self.is_invite else State.TRYING
        self.last_response: SipResponse | None = None

    def receive_request(self, request: SipRequest, now: float) -> bool:
        """Feed a request that matched this transaction (a retransmission or ACK).

        Returns:
            True if the request is an ACK the TU must see (ACCEPTED state).
        """
        if request.method == "ACK":
            if self.state is State.COMPLETED:
                self.state = State.CONFIRMED
                self._timers.clear()
                self._timers["I"] = now + self._wait(self._config.t4_s)
            return self.state is State.ACCEPTED
        if self.state in (State.PROCEEDING, State.COMPLETED) and self.last_response:
            self._transmit(self.last_response)
        return False

    def respond(self, response: SipResponse, now: float) -> None:
        """Send ``response`` (from the TU) and move the machine accordingly."""
        if self.state not in (State.TRYING, State.PROCEEDING, State.ACCEPTED):
            return  # a final response was already sent
        self.last_response = response
        self._transmit(response)
        klass = _response_class(response.status)
        if klass == 1:
            self.state = State.PROCEEDING
        elif self.is_invite and klass == 2:
            if self.state is not State.ACCEPTED:
                self.state = State.ACCEPTED
                self._timers["L"] = now + self._config.timeout_s
        elif self.is_invite:
            self.state = State.COMPLETED
            if not self._reliable:
                self._timers["G"] = now + self._interval_s
            self._timers["H"] = now + self._config.timeout_s
        else:
            self.state = State.COMPLETED
            self._timers["J"] = now + self._wait(self._config.timeout_s)

    def _fire(self, name: str, now: float) -> None:
        if name == "G" and self.last_response is not None:
            self._transmit(self.last_response)
            self._interval_s = min(self._interval_s * 2, self._config.t2_s)
            self._timers["G"] = now + self._interval_s
        elif name == "H":
            self._events.append(TransactionTimedOut("H"))
            self._terminate()
        else:  # I, J, L
            self._terminate()


def build_ack(invite: SipRequest, response: SipResponse) -> SipRequest:
    """The ACK for a non-2xx final response (RFC 3261 §17.1.1.3)."""
    ack = SipRequest(method="ACK", uri=invite.uri)
    ack.add("Via", invite.get_all("via")[0])
    for key in ("route",):
        for value in invite.get_all(key):
            ack.add("Route", value)
    ack.add("Max-Forwards", "70")
    ack.add("From", invite.get("from") or "")
    ack.add("To", response.get("to") or "")
    ack.add("Call-ID", invite.call_id)
    ack.add("CSeq", f"{invite.cseq().number} ACK")
    return ack

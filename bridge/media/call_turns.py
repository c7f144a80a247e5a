"""The call's record of its turns: phases, what each turn has, and the bounded history.

Theory of operation
-------------------
``CallBridge`` keeps one ``CallTurn`` per turn (a ``Say`` or a voice-agent
reply). The playout queue knows frames and positions; a ``CallTurn`` knows
everything else: the provider, the framer for its audio, its word timings,
its latency timestamps, its mark bookkeeping and its phase::

    QUEUED --first frame popped--> SOUNDING --last frame popped--> (marks leg) AWAITING_MARK
       \\______________________________\\_____________________________________\\--> DONE

DONE means reported (``TurnFinished`` or ``TurnInterrupted``), exactly once.
``TurnBook`` holds the turns by id, the ids awaiting their final mark echo,
and forgets the oldest reported turns beyond ``max_history`` (late audio and
duplicate ids are recognised for that long).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from bridge.media.call_audio import Framer
from bridge.media.text_pacing import TextPacer
from bridge.providers.base import AudioFormat, WordTiming

__all__ = [
    "AWAITING_MARK",
    "DONE",
    "QUEUED",
    "SOUNDING",
    "CallTurn",
    "TurnBook",
    "TurnPhase",
    "TurnStop",
    "heard_text",
]

_EPSILON_S = 1e-9


class TurnPhase(enum.Enum):
    QUEUED = "queued"
    SOUNDING = "sounding"
    AWAITING_MARK = "awaiting_mark"
    DONE = "done"


# The phases as module constants, for the per-frame paths: on CPython 3.11
# ``TurnPhase.SOUNDING`` goes through the enum's metaclass (about 170 ns, more
# than the rest of a tick's turn check); a module global costs a dict lookup.
QUEUED: Final = TurnPhase.QUEUED
SOUNDING: Final = TurnPhase.SOUNDING
AWAITING_MARK: Final = TurnPhase.AWAITING_MARK
DONE: Final = TurnPhase.DONE


@dataclass(slots=True)
class CallTurn:
    """Everything the call knows about one turn besides its frames."""

    turn_id: str
    provider: str
    interruptible: bool
    agent: bool
    opened_s: float
    item_id: str = ""
    """The voice agent's item id (Kletso ``itemId``), ``""`` if none."""
    text_open: bool = True
    """More ``Say`` text is accepted."""
    pacer: TextPacer | None = None
    """The turn's text not sent to the provider yet (``None``: sent as it comes)."""
    audio_open: bool = True
    """Provider audio is accepted (not done, failed, cut or truncated)."""
    framer: Framer | None = None
    in_format: AudioFormat | None = None
    pending: deque[tuple[bytes, AudioFormat]] = field(default_factory=deque)
    """Provider audio received but not transcoded yet (oldest first), with its format."""
    pending_offset: int = 0
    """Bytes of ``pending[0]`` already transcoded."""
    pending_bytes: int = 0
    """Untranscoded bytes in ``pending`` (after ``pending_offset``)."""
    audio_ending: bool = False
    """The provider ended the turn while audio was still pending: end it once transcoded."""
    received_s: float = 0.0
    """Seconds of provider audio handed to the call for the turn (an underrun's cause)."""
    words: list[WordTiming] = field(default_factory=list)
    first_audio_s: float | None = None
    head_at_first_audio: bool = False
    last_frame_s: float | None = None
    play_anchor: tuple[float, int] | None = None
    """(when, samples): a position the carrier is known to have played at that time."""
    frames_since_mark: int = 0
    final_mark: str | None = None
    end_reason: str | None = None
    """Set when the turn will be reported as interrupted (and why)."""
    phase: TurnPhase = QUEUED


@dataclass(frozen=True, slots=True)
class TurnStop:
    """One turn being stopped: how much went out, how much the carrier acknowledged."""

    turn: CallTurn
    played_samples: int
    heard_samples: int
    cancel_provider: bool


def heard_text(words: Iterable[WordTiming], heard_ms: int) -> str:
    """The words that ended by ``heard_ms`` (from the turn's start), space-joined."""
    limit_s = heard_ms / 1000 + _EPSILON_S
    return " ".join(w.word for w in words if w.end_s <= limit_s)


class TurnBook:
    """Turns by id, the ones awaiting a final mark echo, and a bounded history."""

    __slots__ = ("_awaiting", "_max_history", "_retired", "_turns")

    def __init__(self, max_history: int) -> None:
        self._turns: dict[str, CallTurn] = {}
        self._retired: deque[str] = deque()
        self._awaiting: dict[str, None] = {}
        self._max_history = max_history

    def get(self, turn_id: str) -> CallTurn | None:
        return self._turns.get(turn_id)

    def add(self, turn: CallTurn) -> None:
        self._turns[turn.turn_id] = turn

    def unreported(self) -> list[CallTurn]:
        """Turns not yet DONE, oldest first."""
        return [t for t in self._turns.values() if t.phase is not DONE]

    def retire(self, turn: CallTurn) -> None:
        """The turn was reported: mark it DONE and forget the oldest beyond the history."""
        turn.phase = DONE
        turn.words = []
        self._awaiting.pop(turn.turn_id, None)
        self._retired.append(turn.turn_id)
        while len(self._retired) > self._max_history:
            self._turns.pop(self._retired.popleft(), None)

    def await_mark(self, turn: CallTurn) -> None:
        turn.phase = AWAITING_MARK
        self._awaiting[turn.turn_id] = None

    def awaiting(self) -> Iterator[CallTurn]:
        """Turns whose audio is all sent and whose final mark is not echoed yet."""
        return (self._turns[t] for t in self._awaiting)

    def any_awaiting(self, interruptible: bool) -> bool:
        """Whether a turn awaiting its final mark is (or is not) interruptible."""
        if not self._awaiting:
            return False
        return any(self._turns[t].interruptible is interruptible for t in self._awaiting)

    def take_awaiting(self, interruptible_only: bool) -> list[CallTurn]:
        """Remove and return the awaiting turns (only interruptible ones if asked)."""
        taken = [t for t in self.awaiting() if t.interruptible or not interruptible_only]
        for turn in taken:
            del self._awaiting[turn.turn_id]
        return taken

    def stop_awaiting(self, turn: CallTurn) -> None:
        """The turn no longer waits for its final mark (it is being stopped)."""
        self._awaiting.pop(turn.turn_id, None)

    def forget_awaiting(self) -> None:
        self._awaiting.clear()

"""The barge-in detector: when does the caller interrupt the bot?

Theory of operation
-------------------
A pure state machine over one observation per inbound 20 ms frame,
``observe(is_speech, energy_dbfs, now)`` (from ``bridge.media.vad``), plus
DTMF digits. It knows nothing about legs, queues or providers; the call feeds
it and acts on what it returns.

A frame is *active* when all three hold:

1. the VAD calls it speech;
2. its level is at least ``energy_floor_dbfs`` (line noise the VAD lets
   through stays quiet);
3. echo guard: it is louder than the loudest outbound (bot) level of the last
   ``echo_window_ms`` minus ``echo_return_loss_db``. The call reports the
   level of every outbound frame with ``record_bot_level``; the window covers
   the echo path delay and tail. A caller no louder than the bot's own echo
   is taken for echo.

States, per run of activity::

    IDLE --active--> CANDIDATE --speech credit >= min_speech_ms--> SPEAKING
      ^                  | gap > hangover_ms                          | gap > speech_end_ms
      +------------------+--------------------------------------------+  (SpeechStopped)

The first active frame starts a run; its time is the run's onset. Each active
frame adds ``frame_ms`` of credit. Inside a candidate run a non-speech frame
takes one frame of credit back (so sparse clicks never add up) and a gap
longer than ``hangover_ms`` drops the run. When the credit reaches
``min_speech_ms`` the run becomes speech: ``SpeechStarted(now, onset_s)``.
Once speaking, only ``speech_end_ms`` of continuous inactivity ends it:
``SpeechStopped``.

Barge-in. While the bot is speaking (``set_bot_speaking(True)``) and the
policy is enabled, the first active frame of a confirmed run returns
``BargeInTriggered("speech", onset_s, now)`` from ``observe``, once per run
and bot turn (a new bot turn re-arms it). A DTMF digit while the bot speaks
triggers at once: ``dtmf()`` returns ``BargeInTriggered("dtmf", now, now)``.
Speech events go to ``events_received()``; the trigger is only *returned*, so
it is handled exactly once.

Defaults, to be measured in ``bench/`` (not yet measured): 20 ms frames,
``min_speech_ms`` 160 (8 frames: longer than a cough or click, short enough to
feel responsive), ``hangover_ms`` 60, ``speech_end_ms`` 400,
``energy_floor_dbfs`` -45, ``echo_return_loss_db`` 15 (G.168 requires at least
6 dB from a hybrid; 15 is a typical network figure), ``echo_window_ms`` 200.

The detector has no timers: it advances only with observations, so a leg that
stops sending audio leaves the state as it was.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from bridge.engine import Event, LocalProtocolError, Outbox

__all__ = [
    "BargeInDecision",
    "BargeInDetector",
    "BargeInPolicy",
    "BargeInTriggered",
    "SpeechStarted",
    "SpeechStopped",
]


@dataclass(frozen=True, slots=True)
class BargeInPolicy:
    """Thresholds of the detector; every field is in config."""

    enabled: bool = True
    """Whether speech or DTMF may interrupt the bot (speech events are emitted regardless)."""
    frame_ms: int = 20
    """Duration of one observation."""
    min_speech_ms: int = 160
    """Speech credit a run needs before it counts as speech."""
    hangover_ms: int = 60
    """Longest gap a candidate run survives."""
    speech_end_ms: int = 400
    """Continuous inactivity that ends confirmed speech."""
    energy_floor_dbfs: float = -45.0
    """Quietest frame that can be speech."""
    echo_return_loss_db: float = 15.0
    """Expected attenuation of the bot's own audio coming back on the inbound path."""
    echo_window_ms: int = 200
    """How long an outbound level keeps guarding against its echo."""
    dtmf_triggers: bool = True
    """Whether a DTMF digit interrupts the bot."""
    echo_correlation: float = 0.7
    """Inbound speech frames correlating this well with the bot's recent audio are
    its echo, not the caller (``bridge.media.echo``); 0 switches the check off."""


@dataclass(frozen=True, slots=True)
class SpeechStarted(Event):
    """A run of caller activity reached the minimum speech duration."""

    now: float
    onset_s: float
    """Time of the run's first active frame."""


@dataclass(frozen=True, slots=True)
class SpeechStopped(Event):
    """Confirmed caller speech was followed by ``speech_end_ms`` of inactivity."""

    now: float
    onset_s: float
    last_speech_s: float
    """Time of the run's last active frame."""


@dataclass(frozen=True, slots=True)
class BargeInTriggered(Event):
    """The caller interrupted the bot: the call should run ``barge_in(now)``."""

    reason: Literal["speech", "dtmf"]
    onset_s: float
    now: float


BargeInDecision = BargeInTriggered


class BargeInDetector(Outbox):
    """Barge-in policy state for one call.

    Calling contract: for every inbound frame call ``observe``; for every
    outbound frame call ``record_bot_level``; call ``set_bot_speaking`` when a
    bot turn starts and stops playing. Act on a returned ``BargeInTriggered``
    and drain ``events_received()`` for ``SpeechStarted``/``SpeechStopped``.
    """

    __slots__ = (
        "_bot_levels",
        "_bot_speaking",
        "_credit_ms",
        "_gap_ms",
        "_last_active_s",
        "_onset_s",
        "_policy",
        "_speaking",
        "_triggered",
    )

    def __init__(self, policy: BargeInPolicy | None = None) -> None:
        super().__init__()
        self._policy = policy or BargeInPolicy()
        if self._policy.frame_ms <= 0 or self._policy.min_speech_ms <= 0:
            raise LocalProtocolError("frame_ms and min_speech_ms must be positive")
        self._bot_speaking = False
        self._bot_levels: deque[tuple[float, float]] = deque()  # (now, level_dbfs)
        self._onset_s: float | None = None
        self._last_active_s = 0.0
        self._credit_ms = 0
        self._gap_ms = 0
        self._speaking = False
        self._triggered = False

    @property
    def policy(self) -> BargeInPolicy:
        return self._policy

    @property
    def caller_speaking(self) -> bool:
        """Whether a confirmed run of caller speech is in progress."""
        return self._speaking

    def set_bot_speaking(self, speaking: bool) -> None:
        """Tell the detector whether a bot turn is playing; a new turn re-arms the trigger."""
        if speaking and not self._bot_speaking:
            self._triggered = False
        self._bot_speaking = speaking

    def record_bot_level(self, level_dbfs: float, now: float) -> None:
        """Report the level of the outbound frame sent at ``now`` (for the echo guard)."""
        self._bot_levels.append((now, level_dbfs))
        self._forget_bot_levels(now)

    def observe(self, is_speech: bool, energy_dbfs: float, now: float) -> BargeInDecision | None:
        """Feed one inbound frame; returns a trigger when the caller barges in."""
        if self._is_active(is_speech, energy_dbfs, now):
            return self._on_active(now)
        self._on_inactive(now)
        return None

    def dtmf(self, digit: str, now: float) -> BargeInDecision | None:
        """A DTMF digit arrived; it interrupts a speaking bot at once."""
        if not (self._policy.enabled and self._policy.dtmf_triggers and self._bot_speaking):
            return None
        return BargeInTriggered("dtmf", now, now)

    def _is_active(self, is_speech: bool, energy_dbfs: float, now: float) -> bool:
        if not is_speech or energy_dbfs < self._policy.energy_floor_dbfs:
            return False
        echo_dbfs = self._echo_level_dbfs(now)
        return echo_dbfs is None or energy_dbfs > echo_dbfs

    def _echo_level_dbfs(self, now: float) -> float | None:
        self._forget_bot_levels(now)
        if not self._bot_levels:
            return None
        loudest_dbfs = max(level for _, level in self._bot_levels)
        return loudest_dbfs - self._policy.echo_return_loss_db

    def _forget_bot_levels(self, now: float) -> None:
        oldest_s = now - self._policy.echo_window_ms / 1000.0
        while self._bot_levels and self._bot_levels[0][0] < oldest_s:
            self._bot_levels.popleft()

    def _on_active(self, now: float) -> BargeInDecision | None:
        if self._onset_s is None:
            self._onset_s = now
        self._last_active_s = now
        self._gap_ms = 0
        self._credit_ms += self._policy.frame_ms
        if not self._speaking and self._credit_ms >= self._policy.min_speech_ms:
            self._speaking = True
            self._events.append(SpeechStarted(now, self._onset_s))
        if self._speaking and self._bot_speaking and self._policy.enabled and not self._triggered:
            self._triggered = True
            return BargeInTriggered("speech", self._onset_s, now)
        return None

    def _on_inactive(self, now: float) -> None:
        if self._onset_s is None:
            return
        self._gap_ms += self._policy.frame_ms
        if self._speaking:
            if self._gap_ms >= self._policy.speech_end_ms:
                self._events.append(SpeechStopped(now, self._onset_s, self._last_active_s))
                self._reset_run()
            return
        self._credit_ms = max(0, self._credit_ms - self._policy.frame_ms)
        if self._gap_ms > self._policy.hangover_ms or self._credit_ms == 0:
            self._reset_run()

    def _reset_run(self) -> None:
        self._onset_s = None
        self._last_active_s = 0.0
        self._credit_ms = 0
        self._gap_ms = 0
        self._speaking = False
        self._triggered = False

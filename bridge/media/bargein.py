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
   the echo path delay and tail. Since the call also removes echo by
   correlation (``bridge.media.echo``), this guard is only a backstop (the
   daemon's default return loss is 30 dB): at 15 dB it hid -30 dBFS callers
   under a loud bot.

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

Rise above the line's noise floor (babble, hum, loud line noise). The VAD
calls babble and even steady noise "speech", and babble correlates with
nothing we sent. The detector follows the line's level in dB with equal
rise and fall time constants (``noise_floor_up_ms``/``noise_floor_down_ms``,
1 s), which puts the floor near the line's mean level: babble's own peaks
stand a few dB above it, a caller's onset over steady noise far more. A
candidate run becomes speech only if its last ``min_speech_ms`` of active
frames stand on average ``need`` dB above the floor as it was before each
frame, where ``need`` is the larger of ``noise_rise_db`` (7) and
``babble_spread`` (3) times the line's spread (the RMS deviation of its
level from the floor, learnt from VAD-speech frames between runs, so not from
the bot's echo the call flags; steady noise ~1 dB, babble 3-4 dB, taken as
``noise_spread_prior_db`` (3 dB) before it is known). In the call's first
``noise_warmup_ms`` (500 ms, 25 frames) the floor learns fast
(``noise_warmup_floor_ms``, 100 ms) from every frame that does not itself
rise as a run must, and a run needs ``noise_warmup_rise_db`` (10 dB) more.
Confirmed speech keeps going on the VAD, the energy floor and the echo guard
alone. What this cannot tell apart: a background that suddenly gets louder
(a TV switched on) from a caller; a caller no louder than the babble around
them.

Barge-in. While the bot is speaking (``set_bot_speaking(True)``) and the
policy is enabled, the first active frame of a confirmed run returns
``BargeInTriggered("speech", onset_s, now)`` from ``observe``, once per run
and bot turn (a new bot turn re-arms it). A DTMF digit while the bot speaks
triggers at once: ``dtmf()`` returns ``BargeInTriggered("dtmf", now, now)``.
Speech events go to ``events_received()``; the trigger is only *returned*, so
it is handled exactly once.

Defaults. ``BargeInPolicy`` is the one place the thresholds and their
defaults are written: the config reader builds it from ``[bargein]``
(``bridge.config``), and a call built without a config (tests,
``bench/bench_call.py``) runs the same defaults as the daemon. They were
measured with ``bench/bench_bargein.py`` (tuned on seeds 1 and 3, checked on
5 and 7): ``min_speech_ms`` 60, ``energy_floor_dbfs`` -48,
``echo_return_loss_db`` 30, VAD mode 3, ``hangover_ms`` 60,
``speech_end_ms`` 400, ``echo_window_ms`` 200, the rise check's as above.
Every field but ``frame_ms`` is a ``[bargein]`` key (``dtmf_triggers`` is
``dtmf``).

The detector has no timers: it advances only with observations, so a leg that
stops sending audio leaves the state as it was.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bridge.engine import Event, LocalProtocolError, Outbox
from bridge.media import vad
from bridge.settings import setting

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
    """Thresholds of the detector and their defaults (the daemon's, measured in bench/):
    the one source of both. Every field but ``frame_ms`` is a ``[bargein]`` key
    (``dtmf_triggers`` is ``dtmf``), described once here (``setting``): the config
    reader builds this from those descriptions, and ``config/README.md``'s table is
    generated from them."""

    enabled: bool = setting(
        True,
        "whether speech or a key press may interrupt the bot (the application's "
        "`speech.started`/`speech.stopped` events are sent regardless)",
    )  # fmt: skip
    frame_ms: int = 20
    """Duration of one observation (not a key)."""
    min_speech_ms: int = setting(
        60,
        "caller speech (speech credit of a run) needed before the bot stops. Raise it if "
        "short noises (coughs, \"mm-hm\") stop the bot; each 20 ms added delays every "
        "barge-in by 20 ms",
        lo=20, hi=5000, multiple_of=20, why_multiple="one frame",
    )  # fmt: skip
    hangover_ms: int = setting(
        60,
        "longest pause a starting run survives before `min_speech_ms` is reached. Each frame "
        "of pause also takes back one frame of credit, which ends short runs anyway: with "
        "`min_speech_ms` 60 only `0` changes anything (a one-frame pause then restarts the "
        "run). Raise it with a longer `min_speech_ms` so that speech with short pauses still "
        "adds up",
        lo=0, hi=2000, multiple_of=20, why_multiple="one frame",
    )  # fmt: skip
    speech_end_ms: int = setting(
        400,
        "silence that ends the caller's speech: the application's `speech.stopped` comes this "
        "long after the last active frame. While the caller still counts as speaking, a new "
        "bot turn is interrupted by their next active frame. Raise it for slow talkers, lower "
        "it for a faster `speech.stopped`",
        lo=20, hi=10000, multiple_of=20, why_multiple="one frame",
    )  # fmt: skip
    energy_floor_dbfs: float = setting(
        -48.0,
        "frames quieter than this are never speech. Raise it on lines with loud steady noise "
        "that the rise check (`noise_rise_db`) does not already handle; lower it only for very "
        "quiet callers",
        lo=-96, hi=0,
    )  # fmt: skip
    echo_return_loss_db: float = setting(
        30.0,
        "while the bot speaks, caller audio must be louder than the bot's level minus this "
        "(the expected attenuation of its echo). A backstop: echo is removed by correlation "
        "(`echo_correlation`). Lower it (towards 15) only if loud echo the correlation misses "
        "stops the bot; then quiet callers cannot interrupt a loud bot",
        lo=0, hi=60,
    )  # fmt: skip
    echo_window_ms: int = setting(
        200,
        "how long a bot frame's level keeps guarding against its echo (the echo path's delay "
        "plus tail). Raise it for a long echo path (satellite, long conference bridges)",
        lo=0, hi=2000,
    )  # fmt: skip
    dtmf_triggers: bool = setting(True, "a key press interrupts an interruptible turn", key="dtmf")
    vad_aggressiveness: int = setting(
        3,
        "webrtcvad mode the call runs on the caller audio it observes: 3 calls the least noise "
        "speech",
        lo=0, hi=3,
    )  # fmt: skip
    echo_correlation: float = setting(
        0.7,
        "inbound speech correlating this well with the bot's own audio of the last 300 ms is "
        "its echo, not the caller (`bridge.media.echo`); `0` switches the check off",
        lo=0.0, hi=1.0,
    )  # fmt: skip
    noise_rise_db: float = setting(
        7.0,
        "a starting run must stand on average this far above the line's noise floor (its "
        "running level, the `noise_floor_*` keys): babble, hum and loud line noise sit at that "
        "floor. Raise it if background noise or a TV stops the bot; lower it if callers over "
        "noisy lines cannot interrupt. `0` switches the floor check off (and with it "
        "`babble_spread` and the warm-up)",
        lo=0, hi=60,
    )  # fmt: skip
    babble_spread: float = setting(
        3.0,
        "babble guard: the rise needed is at least this many times the line's spread around "
        "its floor (RMS in dB, learnt between runs: ~1 dB for steady noise, 3–4 dB for "
        "background talk). Raise it if background talk stops the bot; lower it if callers in "
        "noisy rooms cannot interrupt. `0` switches it off",
        lo=0, hi=10, unit="a factor",
    )  # fmt: skip
    noise_floor_up_ms: int = setting(
        1000,
        "time constant with which the floor follows the line's level up. Shorter adapts "
        "faster to noise that gets louder, but also starts to follow a caller who talks on",
        lo=20, hi=60000,
    )  # fmt: skip
    noise_floor_down_ms: int = setting(
        1000,
        "time constant with which it follows the line down. Equal time constants keep the "
        "floor near the line's mean level (babble's own peaks rise little above it, a caller's "
        "onset over steady noise rises far); shorter makes a caller heard sooner after a noise "
        "stops",
        lo=20, hi=60000,
    )  # fmt: skip
    noise_warmup_ms: int = setting(
        500,
        "the call's first moments (frames that do not themselves rise enough), in which the "
        "floor is a guess: it learns fast (`noise_warmup_floor_ms`) and a run needs "
        "`noise_warmup_rise_db` more. `0` switches the warm-up off (the floor starts 10 dB "
        "below `energy_floor_dbfs` and moves at its normal pace)",
        lo=0, hi=10000, multiple_of=20, why_multiple="one frame",
    )  # fmt: skip
    noise_warmup_floor_ms: int = setting(
        100,
        "the floor's time constant during the warm-up. Longer helps a caller who talks over "
        "the greeting from the first moment, at the cost of lines that start in background "
        "talk",
        lo=20, hi=60000,
    )  # fmt: skip
    noise_warmup_rise_db: float = setting(
        10.0,
        "extra rise a run needs during the warm-up. Lower it if callers who talk at once "
        "cannot interrupt the greeting; raise it if noise at the call's start does",
        lo=0, hi=60,
    )  # fmt: skip
    noise_spread_prior_db: float = setting(
        3.0,
        "the line's spread assumed before it is learnt (the first second or two; it is learnt "
        "with the `noise_floor_up_ms` time constant). The default assumes background talk; "
        "lower it (towards 1) if the lines are usually quiet and early interruptions are "
        "missed",
        lo=0, hi=20,
    )  # fmt: skip


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

_FLOOR_START_BELOW_DB = 10.0
"""The noise floor starts this far below ``energy_floor_dbfs``."""
_SPREAD_CAP_DB2 = 400.0
"""One frame moves the spread estimate by at most a 20 dB deviation (a click)."""


class _SpillSink:
    """A detector's ``record_bot_frame`` that holds its window, not the detector.

    The echo correlator keeps this (``share_window``) while the detector keeps
    the correlator's ``bot_frames``: with the detector's own bound method the
    two would form a reference cycle, and every ended call would wait for a
    full collection (``tests/e2e/test_call_release.py``).
    """

    __slots__ = ("_levels", "_window_s")

    def __init__(self, levels: deque[tuple[float, float | bytes]], window_s: float) -> None:
        self._levels = levels
        self._window_s = window_s

    def __call__(self, frame: bytes, now: float) -> None:
        levels = self._levels
        levels.append((now, frame))
        oldest_s = now - self._window_s  # ``_forget_bot_levels``, inline
        while levels and levels[0][0] < oldest_s:
            levels.popleft()


class BargeInDetector(Outbox):
    """Barge-in policy state for one call.

    Calling contract: for every inbound frame call ``observe``; for every
    outbound frame call ``record_bot_level`` (or ``record_bot_frame``, in time
    order); call ``set_bot_speaking`` when a bot turn starts and stops playing.
    Act on a returned ``BargeInTriggered`` and drain ``events_received()`` for
    ``SpeechStarted``/``SpeechStopped``.

    Args:
        policy: the thresholds (``None``: the defaults).
        frame_level: level in dBFS of a frame given to ``record_bot_frame``
            (default: ``energy_dbfs`` of s16le; a G.711 leg passes decode-then-level).
        bot_frames: where outbound frames are kept already (the call's echo
            correlator, ``EchoCorrelator.bot_frames`` after
            ``share_window(echo_window_s, spill_sink())``):
            ``bot_frames(now)`` gives (push number, time, frame) of those sent
            within ``echo_window_ms``; the guard reads them, measured with
            ``frame_level`` once each, besides what was recorded here. The
            call then records no frame itself (one store per frame, not two).
    """

    __slots__ = (
        "_bot_levels",
        "_bot_source",
        "_bot_speaking",
        "_credit_ms",
        "_echo_window_s",
        "_floor_dbfs",
        "_floor_down",
        "_floor_frames",
        "_floor_up",
        "_floor_warm",
        "_frame_level",
        "_gap_ms",
        "_last_active_s",
        "_onset_s",
        "_policy",
        "_rises",
        "_source_levels",
        "_speaking",
        "_spread2",
        "_triggered",
        "_warmup_frames",
        "_warmup_rise_db",
    )

    def __init__(
        self,
        policy: BargeInPolicy | None = None,
        *,
        frame_level: Callable[[bytes], float] = vad.energy_dbfs,
        bot_frames: Callable[[float], list[tuple[int, float, bytes]]] | None = None,
    ) -> None:
        super().__init__()
        self._policy = policy or BargeInPolicy()
        if self._policy.frame_ms <= 0 or self._policy.min_speech_ms <= 0:
            raise LocalProtocolError("frame_ms and min_speech_ms must be positive")
        self._bot_speaking = False
        # (now, level_dbfs), or (now, frame) whose level is computed only when
        # the echo guard needs it (an inbound frame the VAD calls speech)
        self._bot_levels: deque[tuple[float, float | bytes]] = deque()
        self._echo_window_s = self._policy.echo_window_ms / 1000.0
        self._frame_level = frame_level
        self._bot_source = bot_frames
        self._source_levels: dict[int, float] = {}
        """Levels of ``bot_frames``' frames measured so far, by push number."""
        self._onset_s: float | None = None
        self._last_active_s = 0.0
        self._credit_ms = 0
        self._gap_ms = 0
        self._speaking = False
        self._triggered = False
        p = self._policy
        self._floor_up = 1.0 - math.exp(-p.frame_ms / max(1, p.noise_floor_up_ms))
        self._floor_down = 1.0 - math.exp(-p.frame_ms / max(1, p.noise_floor_down_ms))
        self._floor_warm = 1.0 - math.exp(-p.frame_ms / max(1, p.noise_warmup_floor_ms))
        self._floor_dbfs = p.energy_floor_dbfs - _FLOOR_START_BELOW_DB
        self._floor_frames = 0
        self._warmup_frames = max(0, p.noise_warmup_ms // p.frame_ms)
        self._warmup_rise_db = p.noise_warmup_rise_db
        self._spread2 = p.noise_spread_prior_db**2
        self._rises: deque[float] = deque(maxlen=max(1, p.min_speech_ms // p.frame_ms))

    @property
    def policy(self) -> BargeInPolicy:
        return self._policy

    @property
    def echo_window_s(self) -> float:
        """How long an outbound frame keeps guarding against its echo (``echo_window_ms``)."""
        return self._echo_window_s

    @property
    def caller_speaking(self) -> bool:
        """Whether a confirmed run of caller speech is in progress."""
        return self._speaking

    def has_events(self) -> bool:
        """Whether ``events_received`` has anything (after ``observe``: speech started/stopped)."""
        return bool(self._events)

    def set_bot_speaking(self, speaking: bool) -> None:
        """Tell the detector whether a bot turn is playing; a new turn re-arms the trigger."""
        if speaking and not self._bot_speaking:
            self._triggered = False
        self._bot_speaking = speaking

    def record_bot_level(self, level_dbfs: float, now: float) -> None:
        """Report the level of the outbound frame sent at ``now`` (for the echo guard)."""
        levels = self._bot_levels
        levels.append((now, level_dbfs))
        oldest_s = now - self._echo_window_s  # ``_forget_bot_levels``, inline
        while levels and levels[0][0] < oldest_s:
            levels.popleft()

    def record_bot_frame(self, frame: bytes, now: float) -> None:
        """``record_bot_level`` of ``frame_level(frame)``, computed only if the guard needs it.

        Most outbound frames leave the window before any inbound frame is
        speech: their level is never computed (the decision is the same).
        Called on every tick that sends a frame: ``record_bot_level``'s body,
        inline, not a second call.
        """
        levels = self._bot_levels
        levels.append((now, frame))
        oldest_s = now - self._echo_window_s  # ``_forget_bot_levels``, inline
        while levels and levels[0][0] < oldest_s:
            levels.popleft()

    def spill_sink(self) -> Callable[[bytes, float], None]:
        """``record_bot_frame`` for ``EchoCorrelator.share_window``, without a reference here."""
        return _SpillSink(self._bot_levels, self._echo_window_s)

    def observe(self, is_speech: bool, energy_dbfs: float, now: float) -> BargeInDecision | None:
        """Feed one inbound frame; returns a trigger when the caller barges in."""
        if not is_speech:  # most frames: never active, never between-runs speech
            if self._floor_frames >= self._warmup_frames:  # ``_track_floor``'s steady state
                floor = self._floor_dbfs
                dev = energy_dbfs - floor
                self._floor_dbfs = floor + (self._floor_up if dev > 0.0 else self._floor_down) * dev
            else:
                self._track_floor(energy_dbfs, False)
            if self._onset_s is not None:
                self._on_inactive(now)
            return None
        floor_dbfs = self._floor_dbfs
        active = self._is_active(is_speech, energy_dbfs, now)
        # the line's spread is learnt from VAD speech between runs (babble): not
        # from the bot's echo (flagged by the call) nor from what the VAD rejects
        self._track_floor(energy_dbfs, self._onset_s is None and is_speech)
        if active:
            return self._on_active(now, energy_dbfs - floor_dbfs)
        self._on_inactive(now)
        return None

    @property
    def noise_floor_dbfs(self) -> float:
        """The line's running noise floor, which a starting run must rise above."""
        return self._floor_dbfs

    def _track_floor(self, energy_dbfs: float, between_runs: bool) -> None:
        floor = self._floor_dbfs
        dev = energy_dbfs - floor
        if self._floor_frames < self._warmup_frames:
            # The call's first moments: learn the line fast, but not from frames
            # that rise as a run must (a caller talking from the first frame).
            if self._floor_frames == 0:
                # start at the line's first level, but never above the energy
                # floor nor far below it (silence)
                p_floor = self._policy.energy_floor_dbfs
                floor = max(p_floor - _FLOOR_START_BELOW_DB, min(p_floor, energy_dbfs))
                self._floor_dbfs = floor
                dev = energy_dbfs - floor
            if dev >= self._need_db():
                return
            if self._floor_frames and between_runs:
                self._spread2 += self._floor_up * (min(dev * dev, _SPREAD_CAP_DB2) - self._spread2)
            self._floor_frames += 1
            self._floor_dbfs = floor + self._floor_warm * dev
            return
        if between_runs:  # how much the line moves, learnt between runs
            self._spread2 += self._floor_up * (min(dev * dev, _SPREAD_CAP_DB2) - self._spread2)
        rate = self._floor_up if dev > 0.0 else self._floor_down
        self._floor_dbfs = floor + rate * dev

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
        levels = self._bot_levels
        source = self._bot_source
        if not levels and source is None:
            return None
        # frames spilled by ``bot_frames``' ring may be out of time order: with
        # a source, the window is taken by time, not only by pruning
        oldest_s = now - self._echo_window_s if source is not None else -math.inf
        loudest_dbfs: float | None = None
        for i in range(len(levels)):
            at_s, level = levels[i]
            if isinstance(level, bytes):  # a frame not measured yet: measure it once
                level = self._frame_level(level)
                levels[i] = (at_s, level)
            if at_s >= oldest_s and (loudest_dbfs is None or level > loudest_dbfs):
                loudest_dbfs = level
        if source is not None:
            loudest_dbfs = self._loudest_shared(source, now, loudest_dbfs)
        if loudest_dbfs is None:
            return None
        return loudest_dbfs - self._policy.echo_return_loss_db

    def _loudest_shared(
        self,
        source: Callable[[float], list[tuple[int, float, bytes]]],
        now: float,
        loudest_dbfs: float | None,
    ) -> float | None:
        """``loudest_dbfs`` or the loudest frame of ``bot_frames`` in the window, if louder."""
        known = self._source_levels
        measured: dict[int, float] = {}
        for key, _, frame in source(now):
            level = known.get(key)
            if level is None:
                level = self._frame_level(frame)
            measured[key] = level
            if loudest_dbfs is None or level > loudest_dbfs:
                loudest_dbfs = level
        self._source_levels = measured  # frames that left the window are forgotten
        return loudest_dbfs

    def _forget_bot_levels(self, now: float) -> None:
        oldest_s = now - self._echo_window_s
        while self._bot_levels and self._bot_levels[0][0] < oldest_s:
            self._bot_levels.popleft()

    def _on_active(self, now: float, rise_db: float) -> BargeInDecision | None:
        if self._onset_s is None:
            self._onset_s = now
        self._last_active_s = now
        self._gap_ms = 0
        self._credit_ms += self._policy.frame_ms
        self._rises.append(rise_db)
        if (
            not self._speaking
            and self._credit_ms >= self._policy.min_speech_ms
            and self._rises_enough()
        ):
            self._speaking = True
            self._events.append(SpeechStarted(now, self._onset_s))
        if self._speaking and self._bot_speaking and self._policy.enabled and not self._triggered:
            self._triggered = True
            return BargeInTriggered("speech", self._onset_s, now)
        return None

    def _need_db(self) -> float:
        """Mean rise above the floor a run needs now (0: the check is off)."""
        need_db = self._policy.noise_rise_db
        if need_db <= 0.0:
            return 0.0
        if self._floor_frames < self._warmup_frames:
            need_db += self._warmup_rise_db  # the floor is still a guess
        if self._policy.babble_spread > 0.0:
            need_db = max(need_db, self._policy.babble_spread * math.sqrt(self._spread2))
        return need_db

    def _rises_enough(self) -> bool:
        need_db = self._need_db()
        return need_db <= 0.0 or sum(self._rises) >= need_db * len(self._rises)

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
        self._rises.clear()
        self._onset_s = None
        self._last_active_s = 0.0
        self._credit_ms = 0
        self._gap_ms = 0
        self._speaking = False
        self._triggered = False

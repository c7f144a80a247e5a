"""Flow control on a provider connection, the pure part: when to stop reading, when to resume.

Each turn on a connection has a ``TurnClock``: when the audio received so far
runs out if it plays from its arrival on. ``FlowControl.after_read(now, ...)``
says whether a read left every turn more than ``high_s`` ahead (then the shell
pauses the socket until the returned time); ``open_turn`` and ``drop_turn``
say when to resume early. No socket, no clock: ``now`` is passed in.
"""

from __future__ import annotations

from bridge.providers.base import AudioFormat

__all__ = [
    "FLOW_HIGH_S",
    "FLOW_LOW_S",
    "FLOW_PAUSE_MAX_S",
    "NO_FLOW_CONTROL",
    "FlowControl",
    "TurnClock",
]

FLOW_HIGH_S = 4.0
"""A connection stops reading while every turn on it has more than this many seconds of
audio received and not yet due to play, when flow control is on (``ProviderPool(flow_high_s=
FLOW_HIGH_S)``). It is off by default. Pausing holds back every turn on the connection:
with several turns on one, the others' audio then waits in the provider's and the kernel's
buffers in front of a restarted turn's first audio, where reading it at once would have
moved it into the calls' queues. With one turn per connection (``turns_per_connection =
1``) it holds back only its own turn. There, with a provider that sends faster than real
time, it keeps a restarted turn's first audio from waiting behind the other calls' bulk:
at 400 SIP calls of 24 kHz PCM, restarted turns' first audio took 38-143 ms (p50) with 4 s
ahead and 0.7-0.9 s without (``bench/bench_capacity.py``)."""
FLOW_LOW_S = 2.0
"""It reads again once one of its turns is down to this many seconds ahead."""
FLOW_PAUSE_MAX_S = 5.0
"""And at the latest after this long (a server close, a ping or a control message waits
behind the paused bytes; each resumed read is judged afresh). Under the keepalive's
``ping_timeout`` (20 s), so a pong behind paused bytes is read in time. Not much
shorter: one read takes up to 256 KB (uvloop's buffer), about 4 s of 24 kHz audio in
base64, so at 1 s a paused turn was still read about 4 times faster than it played, and
its read-ahead was not bounded at all."""
NO_FLOW_CONTROL = frozenset({"zwst"})
"""Protocols whose servers punish a client that lets their send queue grow (zwst drops
audio over ~2 s of backlog and closes a slow reader with 1008): never paused."""


class TurnClock:
    """How far ahead of its playout one turn's audio is, by the clock.

    ``due_at`` is when the audio received so far runs out if it plays from
    its arrival on without a break: each piece of audio starts at the later of
    ``due_at`` and its arrival and adds its duration. The true queue can only
    be longer (playout starts at a tick, after a previous turn, or is held),
    never shorter, so a turn this counts as needing audio may not, but one it
    counts as well ahead is.
    """

    __slots__ = ("due_at", "fmt", "s_per_byte")

    def __init__(self) -> None:
        self.due_at = 0.0
        self.fmt: AudioFormat | None = None
        self.s_per_byte = 0.0

    def set_format(self, audio_format: AudioFormat) -> None:
        self.fmt = audio_format
        self.s_per_byte = 1.0 / (audio_format.sample_rate_hz * audio_format.bytes_per_sample)

    def add(self, n_bytes: int, audio_format: AudioFormat, now: float) -> None:
        if audio_format is not self.fmt:
            self.set_format(audio_format)
        due_at = self.due_at
        self.due_at = (due_at if due_at > now else now) + n_bytes * self.s_per_byte


class FlowControl:
    """One connection's turns' clocks and its paused state.

    The thresholds are the pool's (``after_read``'s ``high_s``, None: off). It
    never pauses while a turn has no clock (a voice agent's turn counts as
    needing audio) or while the shell says it cannot (a keepalive ping awaits
    its pong, the connection is not open).
    """

    __slots__ = ("clocks", "pause_max_s", "paused")

    def __init__(self, pause_max_s: float = FLOW_PAUSE_MAX_S) -> None:
        self.pause_max_s = pause_max_s
        self.clocks: dict[str, TurnClock] = {}
        """Each turn's audio ahead of its playout (only with flow control on)."""
        self.paused = False

    def open_turn(self, turn_id: str) -> bool:
        """A turn opened with flow control on: it gets a clock; True if reading must
        resume (it needs its first audio)."""
        self.clocks[turn_id] = TurnClock()
        return self.paused

    def audio(self, turn_id: str, n_bytes: int, audio_format: AudioFormat, now: float) -> None:
        clock = self.clocks.get(turn_id)
        if clock is not None:
            clock.add(n_bytes, audio_format, now)

    def drop_turn(self, turn_id: str) -> bool:
        """A turn ended: True if reading must resume (no turn left to hold back: what is
        left of the dropped one, a cancelled turn's audio or the server's release of it,
        is read now, not at the timer)."""
        self.clocks.pop(turn_id, None)
        return self.paused and not self.clocks

    def after_read(
        self, now: float, turns: int, can_pause: bool, high_s: float | None, low_s: float
    ) -> float | None:
        """A read's messages are handed over (``turns`` open on the connection): the time
        to resume at if reading must pause now (the state is then paused), else None:
        every turn more than ``high_s`` ahead pauses until the neediest is ``low_s``
        ahead, or at most ``pause_max_s``."""
        high = high_s
        clocks = self.clocks
        if high is None or self.paused or not clocks or not can_pause:
            return None
        if len(clocks) < turns:
            return None  # a turn without a clock (an agent's): counted as needing audio
        neediest = min(c.due_at for c in clocks.values())
        if neediest - now <= high:
            return None
        self.paused = True
        return min(neediest - low_s, now + self.pause_max_s)

    def resumed(self) -> bool:
        """Reading resumes: True if it was paused."""
        was, self.paused = self.paused, False
        return was

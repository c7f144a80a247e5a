"""A fake-time harness for ``CallBridge`` tests, and synthetic audio.

Imported by the ``test_call_*`` modules (``conftest.py`` puts this directory
on ``sys.path``).

Time is always a number the test writes: tick ``n`` of a call is at
``n * 0.020``. Nothing here sleeps.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from bridge.commands import CallEvent, Say
from bridge.engine import Action, Event
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import CallOptions, LegProfile
from bridge.providers.base import MULAW_8K, AudioFormat, AudioReceived, TurnDone
from telcodec import g711

FRAME_S = 0.020
SIP = LegProfile(kind="sip", codec="mulaw", sample_rate_hz=8000, heard_from="frames")
TWILIO = LegProfile(
    kind="twilio",
    codec="mulaw",
    sample_rate_hz=8000,
    heard_from="marks",
    can_clear=True,
    mark_interval_ms=200,
)
PCM_24K = AudioFormat("pcm_s16le", 24000)
ULAW_SILENCE_FRAME = b"\xff" * 160

T = TypeVar("T")


def at(n: int) -> float:
    """Time of tick ``n``."""
    return round(n * FRAME_S, 9)


def tone_s16le(freq_hz: float, duration_s: float, rate_hz: int, peak: float = 0.1) -> bytes:
    t = np.arange(round(duration_s * rate_hz)) / rate_hz
    return (np.sin(2 * np.pi * freq_hz * t) * peak * 32767).astype("<i2").tobytes()


def tone_ulaw_frames(count: int, freq_hz: float = 440.0, peak: float = 0.1) -> list[bytes]:
    """``count`` distinct 20 ms mu-law frames of a tone (bot audio)."""
    audio = g711.ulaw_encode(tone_s16le(freq_hz, count * FRAME_S, 8000, peak))
    return [audio[i * 160 : (i + 1) * 160] for i in range(count)]


def voiced_s16le(duration_s: float, rate_hz: int = 8000, peak: float = 0.3) -> bytes:
    """A vowel-like signal webrtcvad calls speech: 130 Hz harmonics, 4 Hz envelope."""
    t = np.arange(round(duration_s * rate_hz)) / rate_hz
    harmonics: npt.NDArray[np.float64] = sum(
        (np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 25)), np.zeros_like(t)
    )
    signal = harmonics * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    signal = signal / float(np.max(np.abs(signal)))
    return (signal * peak * 32767).astype("<i2").tobytes()


def voiced_ulaw_frames(duration_s: float) -> list[bytes]:
    audio = g711.ulaw_encode(voiced_s16le(duration_s))
    return [audio[i : i + 160] for i in range(0, len(audio) - 159, 160)]


class Harness:
    """A ``CallBridge`` plus everything it queued, drained after every input."""

    def __init__(
        self,
        leg: LegProfile = SIP,
        policy: BargeInPolicy | None = None,
        options: CallOptions | None = None,
    ) -> None:
        self.call = CallBridge("call-1", leg, policy, 0.0, options=options)
        self.actions: list[Action] = []
        self.events: list[CallEvent] = []

    def drain(self) -> None:
        self.actions += self.call.actions_to_send()
        self.events += self.call.events_received()

    def take(self) -> tuple[list[Action], list[CallEvent]]:
        """Everything queued since the last ``take``."""
        self.drain()
        actions, events = self.actions, self.events
        self.actions, self.events = [], []
        return actions, events

    def say(self, turn_id: str, text: str = "hello", now: float = 0.0, **kw: Any) -> None:
        self.call.execute(Say(turn_id, text, **kw), now)
        self.drain()

    def provide(self, event: Event, now: float) -> None:
        self.call.provider_event(event, now)
        self.drain()

    def audio(
        self, turn_id: str, data: bytes, now: float, audio_format: AudioFormat = MULAW_8K
    ) -> None:
        self.provide(AudioReceived(turn_id, data, audio_format), now)

    def frames(self, turn_id: str, frames: list[bytes], now: float) -> None:
        self.audio(turn_id, b"".join(frames), now)

    def done(self, turn_id: str, now: float) -> None:
        self.provide(TurnDone(turn_id), now)

    def tick(self, n: int) -> bytes | None:
        """One tick as the shell runs it: the frame, then the look-ahead (``feed``).

        The bridge's timer (``next_deadline``), which the shell arms on the loop, runs
        after the frame when it fell due by this tick."""
        frame = self.call.tick(at(n))
        deadline = self.call.next_deadline()
        if deadline is not None and deadline <= at(n):
            self.call.handle_timer(at(n))
        if self.call.feed_due():
            self.call.feed(at(n))
        self.drain()
        return frame

    def caller(self, frame: bytes, now: float) -> None:
        self.call.caller_audio(frame, now)
        self.drain()


def of_type(items: list[object] | list[Action] | list[CallEvent], kind: type[T]) -> list[T]:
    return [item for item in items if isinstance(item, kind)]

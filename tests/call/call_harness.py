"""A fake-time harness for ``CallBridge`` tests, and synthetic audio.

Imported by the ``test_call_*`` modules (``conftest.py`` puts this directory
on ``sys.path``).

Time is always a number the test writes: tick ``n`` of a call is at
``n * 0.020``. Nothing here sleeps.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from bridge.commands import CallEvent, Say, TurnInterrupted
from bridge.engine import Action, Event
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import CallOptions, LegProfile, OpenTurn
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
SIP_16K = LegProfile(kind="sip", codec="pcm_s16le", sample_rate_hz=16000, heard_from="frames")
"""What ``bridge.io.legs.sip`` builds for a call that negotiated a wideband codec (G.722,
Opus): ``_SipCall`` encodes and decodes around a 16 kHz linear leg."""
PCM_16K = AudioFormat("pcm_s16le", 16000)
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


class StreamEncoder(Protocol):
    """A wideband codec's encoder (``telcodec.g722``, ``telcodec.opus``)."""

    def encode(self, pcm_s16le: bytes) -> bytes: ...

    def encode_silence(self) -> bytes: ...


class StreamDecoder(Protocol):
    """A wideband codec's decoder."""

    def decode(self, payload: bytes) -> bytes: ...


def tone_turn_through_codec(
    encoder: StreamEncoder, decoder: StreamDecoder, tone_s: float, ticks: int
) -> tuple[list[bytes], bytes]:
    """A turn on a 16 kHz leg (``SIP_16K``) whose provider, asked for 16 kHz PCM, sends a 6
    kHz tone ``tone_s`` long (only a 16 kHz leg carries it: a provider at 8 kHz could not
    send it); ticks 1 to ``ticks - 1`` encoded (a frame, or comfort silence) and decoded
    as ``_SipCall`` would. The payloads, and the audio decoded from them."""
    h = Harness(SIP_16K)
    h.say("t1")
    actions, _ = h.take()
    assert isinstance(actions[0], OpenTurn)
    assert actions[0].settings.audio_format == PCM_16K
    h.audio("t1", tone_s16le(6000.0, tone_s, 16000, peak=0.3), 0.0, PCM_16K)
    h.done("t1", now=0.0)
    payloads = []
    heard = b""
    for n in range(1, ticks):
        frame = h.tick(n)
        payload = encoder.encode_silence() if frame is None else encoder.encode(frame)
        payloads.append(payload)
        heard += decoder.decode(payload)
    return payloads, heard


def peak_hz(pcm_s16le: bytes, start: int, stop: int, rate_hz: int = 16000) -> float:
    """The strongest frequency of samples ``start:stop`` (Hann window)."""
    pcm = np.frombuffer(pcm_s16le, dtype="<i2").astype(np.float64)[start:stop]
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.fft.rfftfreq(len(pcm), 1 / rate_hz)[spectrum.argmax()])


def ticks_until_caller_barges_in(caller_side: StreamEncoder, ours: StreamDecoder) -> int:
    """A 16 kHz leg playing a silent turn while the caller speaks, each of the caller's 20
    ms encoded by ``caller_side`` (the phone's) and decoded by ``ours`` (the leg's): the
    tick the turn was interrupted at, for speech."""
    h = Harness(SIP_16K)
    h.say("t1")
    h.audio("t1", bytes(640) * 50, now=0.0, audio_format=PCM_16K)
    voice = voiced_s16le(1.0, rate_hz=16000)
    n = 0
    for n in range(1, 50):
        assert h.tick(n) == bytes(640)
        h.caller(ours.decode(caller_side.encode(voice[(n - 1) * 640 : n * 640])), at(n) + 0.005)
        if of_type(h.events, TurnInterrupted):
            break
    assert of_type(h.events, TurnInterrupted)[0].reason == "speech"
    return n

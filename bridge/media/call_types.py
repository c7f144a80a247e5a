"""The vocabulary of the per-call bridge: leg profile, options, actions, events, stats.

``bridge.media.call`` (the ``CallBridge`` engine) is the only producer of
these values; the asyncio shell that drives a call consumes the actions, the
turn source consumes the events. See ``bridge.media.call`` for the contract.

Actions are imperative (the shell *does* them); events are past tense. The
call events the turn sources share (``CommandRejected`` among them) live in
``bridge.commands``; the one defined here (``AgentEnded``) is an extra event of
the same ``CallEvent`` family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bridge.commands import CallEvent
from bridge.engine import Action
from bridge.providers.base import TurnSettings

__all__ = [
    "AgentEnded",
    "AgentPlayed",
    "AnswerLeg",
    "BargeInTiming",
    "CallOptions",
    "CallStats",
    "CancelTurn",
    "ClearLeg",
    "ConnectApp",
    "EndTurn",
    "HangupLeg",
    "HeardFrom",
    "LegCodec",
    "LegKind",
    "LegProfile",
    "OpenTurn",
    "RejectLeg",
    "SendAgentAudio",
    "SendLegDtmf",
    "SendMark",
    "SendTurnText",
    "StartAgent",
    "StopAgent",
    "TransferLeg",
]

LegKind = Literal["sip", "twilio", "telnyx", "plivo", "exotel", "vonage", "webrtc"]
LegCodec = Literal["mulaw", "alaw", "pcm_s16le"]
HeardFrom = Literal["frames", "marks"]

_LEG_KINDS = ("sip", "twilio", "telnyx", "plivo", "exotel", "vonage", "webrtc")


@dataclass(frozen=True, slots=True)
class LegProfile:
    """What the call needs to know about its caller leg.

    Raises:
        ValueError: an unknown kind or codec, a rate other than 8000/16000,
            G.711 at 16 kHz, or a non-positive mark interval (config errors).
    """

    kind: LegKind
    codec: LegCodec
    sample_rate_hz: int = 8000
    heard_from: HeardFrom = "frames"
    """``frames``: a frame popped is sent is heard (RTP). ``marks``: the heard
    position moves only when the carrier echoes a mark (media streams)."""
    can_clear: bool = False
    """The carrier has a buffer-clear command (Twilio ``clear``)."""
    mark_interval_ms: int = 1000
    """Marks inside long turns on mark legs (the heard position's resolution)."""
    can_transfer: bool = True
    """The leg can hand the caller to another party (SIP REFER); a media stream's
    carrier protocol cannot, and the call refuses ``transfer`` (``transfer_unsupported``)."""
    can_send_dtmf: bool = True
    """The leg can send DTMF (RFC 4733 on SIP; on a media stream, only a dialect with a
    DTMF message); elsewhere the call refuses ``dtmf`` (``dtmf_unsupported``)."""

    def __post_init__(self) -> None:
        if self.kind not in _LEG_KINDS:
            raise ValueError(f"unknown leg kind {self.kind!r}")
        if self.codec not in ("mulaw", "alaw", "pcm_s16le"):
            raise ValueError(f"unknown leg codec {self.codec!r}")
        if self.sample_rate_hz not in (8000, 16000):
            raise ValueError(f"leg sample rate must be 8000 or 16000, not {self.sample_rate_hz}")
        if self.codec != "pcm_s16le" and self.sample_rate_hz != 8000:
            raise ValueError("G.711 legs are 8000 Hz")
        if self.heard_from not in ("frames", "marks"):
            raise ValueError(f"heard_from must be frames or marks, not {self.heard_from!r}")
        if self.mark_interval_ms < 20:
            raise ValueError("mark_interval_ms must be at least one 20 ms frame")

    @property
    def samples_per_frame(self) -> int:
        """Samples in one 20 ms frame (160 at 8 kHz, 320 at 16 kHz)."""
        return self.sample_rate_hz // 50

    @property
    def frame_bytes(self) -> int:
        """Bytes of one 20 ms frame in the leg codec."""
        return self.samples_per_frame * (2 if self.codec == "pcm_s16le" else 1)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Tunables of one call that are not the leg's or the barge-in policy's."""

    default_voice: str = ""
    """Voice for a ``Say`` that names none (``""``: the provider's default)."""
    agent_rate_hz: int = 24000
    """Sample rate of caller audio sent up to a voice agent (Kletso: 24 kHz)."""
    agent_batch_ms: int = 40
    """Caller audio for the agent goes out once this much is buffered (40-60 ms pieces)."""
    agent_played_interval_ms: int = 500
    """``AgentPlayed`` period while an agent turn is sounding."""
    resample_quality: str = "HQ"
    """soxr quality for provider audio that needs resampling."""
    max_turn_history: int = 128
    """Finished turns remembered (duplicate turn ids, late audio, late mark echoes)."""
    max_samples_kept: int = 256
    """Per-turn latency figures and barge-in timings kept for ``stats()``."""
    max_queued_frames: int = 15_000
    """Security limit on frames queued for the leg (15 000 = 5 minutes)."""
    decode_ahead_frames: int = 3
    """Provider audio is transcoded on demand, this many leg frames ahead of the clock."""
    decode_piece_ms: int = 500
    """Provider audio transcoded in one go when the frames ready fall short.

    Half a second, a trade-off measured in the daemon (``bench/bench_capacity.py``).
    Each soxr call has fixed work around it (numpy
    conversions, the join's history): at 200 ms that was a fifth of the call
    side's CPU (``bench/bench_call.py``, SIP with 24 kHz PCM: 7.2-7.3 µs per call
    per 20 ms at 200 ms, 5.7-5.9 at 1 000). But 1 s pieces cost the other calls'
    pacing: at 400 and 500 SIP calls with 24 kHz PCM, runs interleaved, the
    worst call's p99 was 2.1-3.9 ms at 1 000 and 1.7-2.1 at 500, for 5-7 % more
    CPU. Why is only partly traced: not soxr's buffers, which grow with the
    piece (the 40-60 MB of RSS 1 s pieces add). 250 ms paced no better than 500
    and cost another 6 %."""
    text_ahead_s: float = 3.0
    """A turn's text goes to the provider a sentence at a time, this far ahead of playout
    (``bridge.media.text_pacing``); 0 sends it as it comes. Turns of a provider named in
    ``provider_text_ahead_s`` use that provider's figure."""
    provider_text_ahead_s: tuple[tuple[str, float], ...] = ()
    """(provider name, ``text_ahead_s``) for ``Say`` commands that name a provider."""
    cache_prompts: bool = True
    """Cacheable turns are spoken whole, to be cached (not paced). ``False`` (the daemon's
    prompt cache holds nothing): they are turns like any other."""
    trunks: frozenset[str] = frozenset()
    """The ``[trunks]`` names a ``Transfer`` may give (another is refused: ``unknown_trunk``)."""
    max_undecoded_ms: int = 20_000
    """Provider audio one turn may hold untranscoded (by duration); beyond it the oldest
    is transcoded at arrival. 0 transcodes everything at arrival (no look-ahead)."""


# ----------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class OpenTurn(Action):
    """Open a provider turn (the shell's Speaker picks the connection)."""

    turn_id: str
    settings: TurnSettings
    provider: str | None
    """The provider asked for by the ``Say``; ``None`` is the route's default."""
    cacheable: bool
    """Spoken whole, to be cached: the ``Say`` was cacheable and the daemon caches prompts
    (``CallOptions.cache_prompts``)."""


@dataclass(frozen=True, slots=True)
class SendTurnText(Action):
    """Stream text into an open provider turn."""

    turn_id: str
    text: str


@dataclass(frozen=True, slots=True)
class EndTurn(Action):
    """No more text for the turn (the provider may finish synthesis)."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class CancelTurn(Action):
    """Stop the provider turn (its own cancel); a finished turn's cancel is a no-op."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class ClearLeg(Action):
    """Empty the carrier's playout buffer (Twilio ``clear``)."""


@dataclass(frozen=True, slots=True)
class SendMark(Action):
    """Send the carrier a named mark right after the frame ``tick`` returned."""

    name: str


@dataclass(frozen=True, slots=True)
class HangupLeg(Action):
    """End the caller leg (SIP BYE, WS close)."""

    reason: str


@dataclass(frozen=True, slots=True)
class AnswerLeg(Action):
    """End the leg's early media by answering it (SIP 200 OK with the 183's SDP)."""


@dataclass(frozen=True, slots=True)
class RejectLeg(Action):
    """End the leg's early media with a final response (SIP 4xx-6xx): the call is over.

    ``reason``: the reason phrase ("" for the status's usual one).
    """

    status: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TransferLeg(Action):
    """Blind transfer (SIP REFER) to ``target``."""

    target: str
    trunk: str = ""
    """The ``[trunks]`` entry a ``tel:`` target goes through ("": the call's own trunk)."""


@dataclass(frozen=True, slots=True)
class SendLegDtmf(Action):
    """Send DTMF digits on the leg (RFC 4733 events or the carrier's DTMF message)."""

    digits: str


@dataclass(frozen=True, slots=True)
class StartAgent(Action):
    """Start a voice-agent session on the named provider for this call."""

    provider: str


@dataclass(frozen=True, slots=True)
class StopAgent(Action):
    """Stop the voice-agent session (Kletso ``voice.stop``)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectApp(Action):
    """Hand the call to an application WebSocket at ``url``."""

    url: str


@dataclass(frozen=True, slots=True)
class SendAgentAudio(Action):
    """Caller audio for the voice agent: s16le mono at ``CallOptions.agent_rate_hz``."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class AgentPlayed(Action):
    """How much of the agent's item the caller has heard (Kletso ``voice.played``)."""

    item_id: str
    """The agent's item id; ``""`` when the agent gave none (Kletso: ``current``)."""
    ms: int


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class AgentEnded(CallEvent):
    """The voice-agent session ended (the agent's own reason)."""

    reason: str


# ------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True)
class BargeInTiming:
    """When one barge-in was detected, and when the cut audio stopped."""

    reason: str
    onset_s: float
    """Start of the caller's speech (the trigger time for DTMF and asked-for barge-ins)."""
    decided_s: float
    """When the call ran ``barge_in`` (the detector's decision)."""
    last_frame_s: float | None
    """Tick of the last frame of a cut turn; the next tick sends none of it."""

    @property
    def latency_s(self) -> float:
        """Caller onset to decision: how long the bot talked over the caller."""
        return self.decided_s - self.onset_s


@dataclass(frozen=True, slots=True)
class CallStats:
    """A snapshot of one call's counters (metrics and the end-of-call summary)."""

    turns: int
    """Turns opened (``Say`` turns and voice-agent replies)."""
    turns_finished: int
    turns_interrupted: int
    underruns: int
    """Ticks inside a started turn with no frame ready (silence was sent), less those a
    buffering carrier covered from the lead it held (``Underruns.heard``)."""
    underruns_provider: int
    """Of ``underruns``: ticks the provider had not yet sent the frame's audio (it had
    handed over less than the turn's played position + one frame, and the shell found
    none of it among the bytes waiting unread; ``Underruns.provider``). The rest
    the daemon held, or had not read in time."""
    barge_ins: dict[str, int]
    """Barge-ins that cut audio, by reason."""
    bargein_timings: tuple[BargeInTiming, ...]
    time_to_first_audio_s: tuple[float, ...]
    """Per turn: ``OpenTurn`` to the first ``AudioReceived``."""
    added_latency_s: tuple[float, ...]
    """Per turn at the head of the queue: first ``AudioReceived`` to its first frame sent."""
    late_chunks_dropped: int
    """Provider audio chunks for a cut, finished or unknown turn (never transcoded)."""
    late_frames_dropped: int
    """Frames the playout queue refused for a turn that was over."""
    overflow_frames_dropped: int
    provider_errors: int
    frames_sent: int
    bad_inbound_frames: int
    """Caller frames of the wrong size (not analysed)."""
    text_chars_unsent: int = 0
    """Characters of turn text never sent to a provider: held by text pacing when the
    turn was cut (barge-in, cancel, hang-up) or its provider ended it."""

"""The test caller's report: pure arithmetic over what one call recorded.

Theory of operation
-------------------
``callbridge call`` (``bridge.io.caller``) records, on the loop clock, when it
placed the call, when it was answered, the arrival time and level of every
audio frame it received, the sequence numbers of RTP packets, when each
``--speak`` clip's speech began on the wire (its *onset*), when ``clear``
messages arrived (media streams) and when the call ended. Those facts form a
``CallRecording``; ``build_report(recording)`` turns it into a ``CallReport``.
Nothing here reads a clock, a socket or a file.

What each figure means (times in the report are milliseconds, or seconds
since the answer for positions):

* ``setup_ms``: SIP, INVITE sent -> 2xx received; media stream, the socket
  opened (``connected``/``start`` sent) -> the first outbound ``media``.
* ``first_audio_ms``: answer -> the first received frame at or above the
  speech threshold (``SPEECH_THRESHOLD_DBFS``, RMS relative to full scale).
* ``pacing``: for each two consecutive received frames, ``|inter-arrival -
  20 ms|``; p50/p99 (nearest rank) and max. Media streams do not send during
  silence, so there an inter-arrival longer than ``max_interarrival_s`` is a
  pause, not a pacing error, and is left out.
* ``sequence_gaps``: RTP only. Sequence numbers (audio and telephone-event
  packets share one space) are unwrapped in arrival order; every hole between
  the lowest and highest one received is a gap, reordering is not.
* ``silence_gaps``: quiet stretches longer than ``SILENCE_GAP_MIN_S`` between
  two speech frames (from the end of one to the start of the next).
* ``barge_ins``, one per speech onset: the outbound audio *stopped* at the
  end of the last speech frame after which nothing at or above the threshold
  came for ``hold_s`` (silent frames on RTP, silence or no media at all on a
  media stream), or at the first ``clear`` after the onset if that came no
  later than one frame after it (``outcome="cleared"``). ``barge_in_ms`` is
  stop - onset (never negative). If no speech frame came in the ``hold_s``
  before the onset, the far side was not speaking and nothing is measured
  (``outcome="not-speaking"``); if it was still speaking when the call ended,
  ``outcome="still-speaking"``.

Which frames the last two are measured on: RTP frames as they arrived (the
caller plays them at once). A media stream is sent ahead of time and the
carrier buffers it, so media that stopped *arriving* is still playing; there
the caller passes ``heard_frames``, the carrier's playout cut into 20 ms
frames at the times they played (``TwilioCarrier.heard_audio``), and gaps and
barge-in are measured on what the caller actually heard.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any, Literal

import numpy as np

__all__ = [
    "BARGE_IN_HOLD_S",
    "FRAME_S",
    "SILENCE_GAP_MIN_S",
    "SPEECH_THRESHOLD_DBFS",
    "BargeIn",
    "CallRecording",
    "CallReport",
    "PacingStats",
    "ReceivedFrame",
    "SequenceGap",
    "SilenceGap",
    "build_report",
    "first_speech_frame",
    "format_report",
    "level_dbfs",
    "pacing_stats",
    "sequence_gaps",
    "silence_gaps",
]

FRAME_S = 0.020
"""One frame on the wire: 20 ms."""
SPEECH_THRESHOLD_DBFS = -40.0
"""A frame at or above this RMS level counts as speech (sent and received)."""
SILENCE_GAP_MIN_S = 0.060
"""Quiet stretches inside speech longer than this are reported."""
BARGE_IN_HOLD_S = 0.5
"""Outbound speech has stopped once this long passes with no speech frame."""
WS_MAX_INTERARRIVAL_S = 0.25
"""Media streams: a longer inter-arrival is a pause in sending, not a pacing error."""
LEVEL_FLOOR_DBFS = -120.0
"""The level reported for digital silence (instead of minus infinity)."""

Transport = Literal["sip", "ws"]
BargeInOutcome = Literal["stopped", "cleared", "not-speaking", "still-speaking"]


def level_dbfs(pcm_s16le: bytes) -> float:
    """RMS level of 16-bit little-endian PCM relative to full scale (32768), in dBFS."""
    samples = np.frombuffer(pcm_s16le[: len(pcm_s16le) & ~1], dtype="<i2").astype(np.float64)
    if samples.size == 0:
        return LEVEL_FLOOR_DBFS
    rms = math.sqrt(float(np.mean(samples * samples)))
    if rms <= 0.0:
        return LEVEL_FLOOR_DBFS
    return max(LEVEL_FLOOR_DBFS, 20.0 * math.log10(rms / 32768.0))


def first_speech_frame(
    pcm_s16le: bytes, frame_bytes: int = 320, threshold_dbfs: float = SPEECH_THRESHOLD_DBFS
) -> int | None:
    """Index of the first ``frame_bytes`` frame at or above ``threshold_dbfs`` (None: none)."""
    for index, offset in enumerate(range(0, len(pcm_s16le), frame_bytes)):
        if level_dbfs(pcm_s16le[offset : offset + frame_bytes]) >= threshold_dbfs:
            return index
    return None


@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    """One received audio frame: arrival time (loop clock), decoded level, RTP sequence."""

    at_s: float
    level_dbfs: float
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class CallRecording:
    """Everything one test call recorded, on the loop clock (seconds)."""

    transport: Transport
    started_at_s: float
    """INVITE sent (SIP) or socket opened and ``start`` sent (media stream)."""
    answered_at_s: float | None
    """2xx received (SIP) or socket opened (media stream); None if never answered."""
    ended_at_s: float
    frames: tuple[ReceivedFrame, ...] = ()
    heard_frames: tuple[ReceivedFrame, ...] | None = None
    """Media streams: the playout, one frame per 20 ms from ``answered_at_s`` (see above)."""
    event_seqs: tuple[int, ...] = ()
    """RTP sequence numbers of received non-audio packets (telephone-event)."""
    speech_onsets_s: tuple[float, ...] = ()
    """When the first speech frame of each ``--speak`` clip was sent."""
    clears_at_s: tuple[float, ...] = ()
    failure: str | None = None
    """Why the call was not answered or ended abnormally (``486 Busy Here``...)."""
    dtmf_sent: tuple[tuple[float, str], ...] = ()
    """(time, digit) of each key press sent."""
    dtmf_received: tuple[tuple[float, str], ...] = ()
    """(time, digit) of each key press the far side sent us."""
    ended_by: str = ""
    """``local-hangup``, ``remote-bye``, ``stop``, ``closed``..."""
    slipped_frames: int = 0
    """Outbound frames skipped because the caller's own loop woke too late."""
    protocol_errors: tuple[str, ...] = ()
    """Mistakes the far side made that the caller noticed (media streams)."""


@dataclass(frozen=True, slots=True)
class PacingStats:
    """Deviation of inter-arrival times from 20 ms, in milliseconds."""

    p50_ms: float
    p99_ms: float
    max_ms: float
    intervals: int


@dataclass(frozen=True, slots=True)
class SequenceGap:
    """``missing`` RTP packets after sequence number ``after_seq``."""

    after_seq: int
    missing: int


@dataclass(frozen=True, slots=True)
class SilenceGap:
    """A quiet stretch inside speech: start (seconds since the answer) and length."""

    start_s: float
    length_ms: float


@dataclass(frozen=True, slots=True)
class BargeIn:
    """One speech onset and when the outbound speech stopped (seconds since the answer)."""

    onset_s: float
    outcome: BargeInOutcome
    stopped_s: float | None = None
    barge_in_ms: float | None = None


@dataclass(frozen=True, slots=True)
class CallReport:
    """The caller's verdict on one call (see the module docstring for each figure)."""

    transport: Transport
    answered: bool
    failure: str | None
    ended_by: str
    duration_s: float
    setup_ms: float | None
    first_audio_ms: float | None
    frames_received: int
    speech_frames_received: int
    pacing: PacingStats | None
    lost_packets: int
    sequence_gaps: tuple[SequenceGap, ...]
    silence_gaps: tuple[SilenceGap, ...]
    barge_ins: tuple[BargeIn, ...]
    clears_received: int
    dtmf_sent: str
    dtmf_received: str
    slipped_frames: int
    protocol_errors: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``--json``)."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def pacing_stats(
    arrivals_s: Sequence[float],
    frame_s: float = FRAME_S,
    max_interarrival_s: float | None = None,
) -> PacingStats | None:
    """Inter-arrival deviation from ``frame_s``; None with fewer than two arrivals.

    Args:
        arrivals_s: arrival times in order.
        max_interarrival_s: longer intervals are pauses and left out (None: keep all).
    """
    deviations_ms = sorted(
        abs(b - a - frame_s) * 1000.0
        for a, b in pairwise(arrivals_s)
        if max_interarrival_s is None or b - a <= max_interarrival_s
    )
    if not deviations_ms:
        return None
    return PacingStats(
        p50_ms=round(_percentile(deviations_ms, 0.50), 3),
        p99_ms=round(_percentile(deviations_ms, 0.99), 3),
        max_ms=round(deviations_ms[-1], 3),
        intervals=len(deviations_ms),
    )


def _unwrap(seqs: Sequence[int]) -> list[int]:
    """16-bit sequence numbers to a monotonic-ish extended space, in arrival order."""
    out: list[int] = []
    for seq in seqs:
        if not out:
            out.append(seq)
            continue
        delta = (seq - out[-1]) & 0xFFFF
        out.append(out[-1] + delta if delta < 0x8000 else out[-1] - (0x10000 - delta))
    return out


def sequence_gaps(seqs: Sequence[int]) -> tuple[SequenceGap, ...]:
    """Holes in the received sequence numbers (arrival order; reordering is no hole)."""
    received = sorted(set(_unwrap(seqs)))
    return tuple(
        SequenceGap(after_seq=a & 0xFFFF, missing=b - a - 1)
        for a, b in pairwise(received)
        if b - a > 1
    )


def silence_gaps(
    speech_arrivals_s: Sequence[float],
    origin_s: float,
    frame_s: float = FRAME_S,
    min_gap_s: float = SILENCE_GAP_MIN_S,
) -> tuple[SilenceGap, ...]:
    """Quiet stretches longer than ``min_gap_s`` between consecutive speech frames."""
    gaps = []
    for a, b in pairwise(speech_arrivals_s):
        quiet_s = b - (a + frame_s)
        if quiet_s > min_gap_s:
            gaps.append(SilenceGap(round(a + frame_s - origin_s, 3), round(quiet_s * 1000.0, 1)))
    return tuple(gaps)


def _barge_in(
    onset_s: float,
    speech_s: Sequence[float],
    clears_s: Sequence[float],
    ended_at_s: float,
    origin_s: float,
    hold_s: float,
    frame_s: float,
) -> BargeIn:
    position = round(onset_s - origin_s, 3)
    before = [i for i, a in enumerate(speech_s) if onset_s - hold_s <= a <= onset_s]
    if not before:
        return BargeIn(position, "not-speaking")
    stop_s: float | None = None
    for i in range(before[-1], len(speech_s)):
        end_s = speech_s[i] + frame_s
        following = speech_s[i + 1] if i + 1 < len(speech_s) else None
        if following is None:
            stop_s = end_s if ended_at_s - end_s >= hold_s else None
            break
        if following - end_s >= hold_s:
            stop_s = end_s
            break
    clear_s = next((c for c in clears_s if c >= onset_s), None)
    outcome: BargeInOutcome = "stopped"
    if clear_s is not None and (stop_s is None or clear_s <= stop_s + frame_s):
        stop_s, outcome = clear_s, "cleared"
    if stop_s is None:
        return BargeIn(position, "still-speaking")
    return BargeIn(
        position,
        outcome,
        stopped_s=round(stop_s - origin_s, 3),
        barge_in_ms=round(max(0.0, stop_s - onset_s) * 1000.0, 1),
    )


def build_report(
    recording: CallRecording,
    *,
    threshold_dbfs: float = SPEECH_THRESHOLD_DBFS,
    hold_s: float = BARGE_IN_HOLD_S,
    frame_s: float = FRAME_S,
) -> CallReport:
    """Compute every figure of the report from one recording (module docstring)."""
    rec = recording
    answered = rec.answered_at_s is not None
    origin_s = rec.answered_at_s if rec.answered_at_s is not None else rec.started_at_s
    arrivals = [f.at_s for f in rec.frames]
    speech = [f.at_s for f in rec.frames if f.level_dbfs >= threshold_dbfs]
    heard = rec.frames if rec.heard_frames is None else rec.heard_frames
    heard_speech = [f.at_s for f in heard if f.level_dbfs >= threshold_dbfs]
    if rec.transport == "sip":
        setup_ms = None if rec.answered_at_s is None else (rec.answered_at_s - rec.started_at_s)
        seqs = [f.seq for f in rec.frames if f.seq is not None] + list(rec.event_seqs)
    else:
        setup_ms = arrivals[0] - rec.started_at_s if arrivals else None
        seqs = []
    gaps = sequence_gaps(seqs)
    first_audio = speech[0] - origin_s if answered and speech else None
    return CallReport(
        transport=rec.transport,
        answered=answered,
        failure=rec.failure,
        ended_by=rec.ended_by,
        duration_s=round(rec.ended_at_s - origin_s, 3) if answered else 0.0,
        setup_ms=None if setup_ms is None else round(setup_ms * 1000.0, 1),
        first_audio_ms=None if first_audio is None else round(first_audio * 1000.0, 1),
        frames_received=len(rec.frames),
        speech_frames_received=len(speech),
        pacing=pacing_stats(
            arrivals, frame_s, WS_MAX_INTERARRIVAL_S if rec.transport == "ws" else None
        ),
        lost_packets=sum(g.missing for g in gaps),
        sequence_gaps=gaps,
        silence_gaps=silence_gaps(heard_speech, origin_s, frame_s),
        barge_ins=tuple(
            _barge_in(o, heard_speech, rec.clears_at_s, rec.ended_at_s, origin_s, hold_s, frame_s)
            for o in rec.speech_onsets_s
        ),
        clears_received=len(rec.clears_at_s),
        dtmf_sent="".join(d for _, d in rec.dtmf_sent),
        dtmf_received="".join(d for _, d in rec.dtmf_received),
        slipped_frames=rec.slipped_frames,
        protocol_errors=rec.protocol_errors,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def format_report(report: CallReport) -> str:
    """The human-readable report (one fact per line)."""
    r = report
    lines = [
        f"answered:          {'yes' if r.answered else 'no'}"
        + (f" ({r.failure})" if r.failure else ""),
        f"ended by:          {r.ended_by or '-'} after {r.duration_s:.3f} s",
        f"setup time:        {_ms(r.setup_ms)}",
        f"first audio:       {_ms(r.first_audio_ms)}",
        f"frames received:   {r.frames_received} ({r.speech_frames_received} speech)",
    ]
    if r.pacing is not None:
        p = r.pacing
        lines.append(
            f"pacing deviation:  p50 {p.p50_ms:.2f} ms, p99 {p.p99_ms:.2f} ms, "
            f"max {p.max_ms:.2f} ms over {p.intervals} intervals"
        )
    if r.transport == "sip":
        where = ", ".join(f"{g.missing} after seq {g.after_seq}" for g in r.sequence_gaps[:5])
        lines.append(f"lost packets:      {r.lost_packets}" + (f" ({where})" if where else ""))
    quiet = ", ".join(f"{g.length_ms:.0f} ms at {g.start_s:.2f} s" for g in r.silence_gaps[:5])
    more = f" (+{len(r.silence_gaps) - 5} more)" if len(r.silence_gaps) > 5 else ""
    lines.append(
        f"silence gaps:      {len(r.silence_gaps)}" + (f": {quiet}{more}" if quiet else "")
    )
    for b in r.barge_ins:
        result = f"{b.barge_in_ms:.1f} ms ({b.outcome})" if b.barge_in_ms is not None else b.outcome
        lines.append(f"barge-in:          onset at {b.onset_s:.3f} s -> {result}")
    if r.transport == "ws":
        lines.append(f"clears received:   {r.clears_received}")
    if r.dtmf_sent or r.dtmf_received:
        lines.append(
            f"dtmf:              sent {r.dtmf_sent or '-'}, received {r.dtmf_received or '-'}"
        )
    if r.slipped_frames:
        lines.append(f"caller slipped:    {r.slipped_frames} frames (its own loop woke late)")
    lines.extend(f"protocol error:    {e}" for e in r.protocol_errors[:10])
    return "\n".join(lines)

"""DTMF over RTP: RFC 4733 telephone-events in and out, and an in-band fallback.

Theory of operation
-------------------
Payload (RFC 4733 §2.3), 4 bytes::

    event (8) | E (1) | R (1) | volume (6, -dBm0) | duration (16, timestamp units)

Events 0-9 are the digits, 10 ``*``, 11 ``#``, 12-15 ``A``-``D``; 16 (flash)
and above are ignored here. Every packet of one event carries the *same* RTP
timestamp (the event's start) and a growing duration; the last one has E=1
and is sent three times (§2.5.1.4).

``DtmfReceiver`` (one per inbound stream, fed by the RTP session with each
telephone-event packet's payload and timestamp) identifies an event by its
RTP timestamp, never by the marker bit (some carriers never set it):

* a timestamp it has not seen starts an event: ``DtmfStarted`` at once (the
  low-latency barge-in trigger);
* the first E=1 packet of the event reports it: ``DtmfReceived`` with the
  digit, duration and volume, ``ended=True``;
* the two retransmitted end packets, and late updates of an event already
  reported, carry a timestamp it remembers (the last ``_RECENT_EVENTS``), and
  are dropped;
* an event whose end packets were all lost is reported (``ended=False``, the
  longest duration seen) when a different timestamp starts a new event, or
  ``end_timeout_s`` after its last packet (``next_deadline``/``handle_timer``).

So each event is reported exactly once. Events longer than 0xFFFF timestamp
units (8.2 s at 8 kHz) arrive as several segments with new timestamps
(§2.5.1.3) and are reported once per segment.

``DtmfSender`` produces the payloads of outbound events, one per 20 ms tick
of the media clock: the first with the marker bit, durations 160, 320, ... and
then three end packets with the final duration. The RTP session stamps them
all with the timestamp of the event's first tick
(``RtpSession.send_telephone_event``). Between queued digits it returns
``None`` for ``gap_ms`` (the tick then sends audio or silence).

``InbandDtmf`` is the fallback when telephone-event was not negotiated: it
decodes G.711 frames with ``telcodec.g711`` and runs
``telcodec.dtmf.DtmfDetector`` on the result.

Rules that keep this module honest: no clock reads (``now`` is a
parameter); a malformed payload is counted, never raised.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from bridge.engine import Event, Outbox
from telcodec import g711
from telcodec.dtmf import DtmfDetector

__all__ = [
    "DTMF_EVENT_CODES",
    "DtmfReceived",
    "DtmfReceiver",
    "DtmfSender",
    "DtmfStarted",
    "InbandDtmf",
    "TelephoneEvent",
    "TelephoneEventPacket",
]

DTMF_EVENT_CODES: Final = "0123456789*#ABCD"
_EVENT: Final = struct.Struct("!BBH")
_MAX_DURATION: Final = 0xFFFF
_RECENT_EVENTS: Final = 8


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """One RFC 4733 payload, decoded. ``volume`` is in -dBm0 (0..63)."""

    event: int
    end: bool
    volume: int
    duration: int

    @classmethod
    def parse(cls, payload: bytes) -> TelephoneEvent:
        """Decode the first 4 bytes of a telephone-event payload.

        Raises:
            ValueError: fewer than 4 bytes.
        """
        if len(payload) < _EVENT.size:
            raise ValueError(f"telephone-event payload too short: {len(payload)} bytes, needs 4")
        event, flags, duration = _EVENT.unpack_from(payload)
        return cls(event, bool(flags & 0x80), flags & 0x3F, duration)

    def serialize(self) -> bytes:
        flags = (0x80 if self.end else 0) | (self.volume & 0x3F)
        return _EVENT.pack(self.event, flags, self.duration)


@dataclass(frozen=True, slots=True)
class DtmfStarted(Event):
    """A telephone-event started (first packet of a new RTP timestamp)."""

    digit: str
    timestamp: int


@dataclass(frozen=True, slots=True)
class DtmfReceived(Event):
    """A key press, reported once per event.

    ``ended`` is False when no end packet arrived and the event was closed by
    a newer event or by the timeout; ``duration_ms`` is then the longest seen.
    """

    digit: str
    duration_ms: int
    volume_dbm0: int
    timestamp: int
    ended: bool


class DtmfReceiver(Outbox):
    """RFC 4733 receiver for one inbound stream (see the module docstring).

    Calling contract: ``receive(payload, timestamp, now)`` for every packet
    of the negotiated telephone-event payload type, ``handle_timer(now)`` once
    ``now >= next_deadline()``; drain ``events_received()`` after either.
    """

    __slots__ = (
        "_clock_rate_hz",
        "_digit",
        "_duration",
        "_end_timeout_s",
        "_last_packet_at",
        "_recent",
        "_timestamp",
        "_volume",
        "duplicates",
        "ignored_events",
        "malformed",
    )

    def __init__(self, clock_rate_hz: int = 8000, end_timeout_s: float = 0.5) -> None:
        super().__init__()
        self._clock_rate_hz = clock_rate_hz
        self._end_timeout_s = end_timeout_s
        self._timestamp: int | None = None  # the open (not yet reported) event
        self._digit = ""
        self._duration = 0
        self._volume = 0
        self._last_packet_at = 0.0
        self._recent: deque[int] = deque(maxlen=_RECENT_EVENTS)
        self.malformed = 0
        """Payloads shorter than 4 bytes."""
        self.ignored_events = 0
        """Packets of events other than 0-15 (flash, tones)."""
        self.duplicates = 0
        """Retransmitted end packets and late packets of reported events."""

    def receive(self, payload: bytes, timestamp: int, now: float) -> None:
        """Handle one telephone-event packet's payload and RTP timestamp."""
        try:
            event = TelephoneEvent.parse(payload)
        except ValueError:
            self.malformed += 1
            return
        if event.event >= len(DTMF_EVENT_CODES):
            self.ignored_events += 1
            return
        if timestamp != self._timestamp:
            if timestamp in self._recent:
                self.duplicates += 1
                return
            self._close(ended=False)
            self._timestamp = timestamp
            self._digit = DTMF_EVENT_CODES[event.event]
            self._duration = 0
            self._events.append(DtmfStarted(self._digit, timestamp))
        self._duration = max(self._duration, event.duration)
        self._volume = event.volume
        self._last_packet_at = now
        if event.end:
            self._close(ended=True)

    def next_deadline(self) -> float | None:
        """When an event without end packets will be reported, if one is open."""
        if self._timestamp is None:
            return None
        return self._last_packet_at + self._end_timeout_s

    def handle_timer(self, now: float) -> None:
        """Report the open event if its end packets never came."""
        deadline = self.next_deadline()
        if deadline is not None and now >= deadline:
            self._close(ended=False)

    def reset(self) -> None:
        """Forget every event (the stream's SSRC changed): the open one is reported."""
        self._close(ended=False)
        self._recent.clear()

    def _close(self, *, ended: bool) -> None:
        if self._timestamp is None:
            return
        duration_ms = self._duration * 1000 // self._clock_rate_hz
        self._events.append(
            DtmfReceived(self._digit, duration_ms, self._volume, self._timestamp, ended)
        )
        self._recent.append(self._timestamp)
        self._timestamp = None


@dataclass(frozen=True, slots=True)
class TelephoneEventPacket:
    """One outbound telephone-event payload; ``marker`` is set on an event's first packet."""

    payload: bytes
    marker: bool


class DtmfSender:
    """Outbound RFC 4733 events, one payload per 20 ms tick (see the module docstring).

    Args:
        volume_dbm0: Volume field, in -dBm0 (10 is usual for DTMF).
        samples_per_frame: Timestamp units per tick (160 = 20 ms at 8 kHz).
        frame_ms: Tick period in milliseconds.
        end_repeats: Copies of the end packet (RFC 4733 §2.5.1.4: 3).

    Calling contract: ``send_digits(...)`` queues; on each tick call
    ``next_packet()`` and, if it returns a packet, send it with
    ``RtpSession.send_telephone_event`` instead of that tick's audio frame.
    """

    __slots__ = (
        "_end_repeats",
        "_frame_ms",
        "_queue",
        "_samples_per_frame",
        "_volume_dbm0",
    )

    def __init__(
        self,
        volume_dbm0: int = 10,
        samples_per_frame: int = 160,
        frame_ms: int = 20,
        end_repeats: int = 3,
    ) -> None:
        if not 0 <= volume_dbm0 <= 63:
            raise ValueError(f"volume {volume_dbm0} -dBm0 out of 0..63")
        self._volume_dbm0 = volume_dbm0
        self._samples_per_frame = samples_per_frame
        self._frame_ms = frame_ms
        self._end_repeats = end_repeats
        self._queue: deque[TelephoneEventPacket | None] = deque()

    @property
    def idle(self) -> bool:
        """True when nothing is queued (every event has sent its end packets)."""
        return not self._queue

    def send_digits(self, digits: str, tone_ms: int = 100, gap_ms: int = 60) -> None:
        """Queue ``digits`` (0-9, ``*``, ``#``, A-D), each ``tone_ms`` long, ``gap_ms`` apart.

        Raises:
            ValueError: an unknown digit, or a tone longer than one event
                segment (0xFFFF timestamp units) or shorter than one tick.
        """
        tone_frames = math.ceil(tone_ms / self._frame_ms)
        if tone_frames < 1 or tone_frames * self._samples_per_frame > _MAX_DURATION:
            raise ValueError(f"tone of {tone_ms} ms outside 1 tick .. one event segment")
        for digit in digits:
            event = DTMF_EVENT_CODES.find(digit.upper())
            if event < 0:
                raise ValueError(f"not a DTMF digit: {digit!r}")
            if self._queue:
                self._queue.extend([None] * math.ceil(gap_ms / self._frame_ms))
            self._queue.extend(self._event_packets(event, tone_frames))

    def next_packet(self) -> TelephoneEventPacket | None:
        """The payload for this tick, or ``None`` (send audio this tick)."""
        if not self._queue:
            return None
        return self._queue.popleft()

    def cancel(self) -> None:
        """Drop the digits not started yet; an event in progress still sends its end packets."""
        rest: deque[TelephoneEventPacket | None] = deque()
        # Mid-event iff the head is a later packet of an event (only first packets carry M).
        while self._queue and (head := self._queue[0]) is not None and not head.marker:
            rest.append(self._queue.popleft())
        self._queue = rest

    def _event_packets(self, event: int, tone_frames: int) -> list[TelephoneEventPacket]:
        spf = self._samples_per_frame
        packets = [
            TelephoneEventPacket(
                TelephoneEvent(event, False, self._volume_dbm0, (k + 1) * spf).serialize(),
                marker=k == 0,
            )
            for k in range(tone_frames - 1)
        ]
        end = TelephoneEvent(event, True, self._volume_dbm0, tone_frames * spf).serialize()
        packets.extend(
            TelephoneEventPacket(end, marker=tone_frames == 1 and i == 0)
            for i in range(self._end_repeats)
        )
        return packets


class InbandDtmf:
    """In-band DTMF on G.711 frames (decoded with telcodec.g711) or on frames already
    linear (``"linear"``: s16le at ``sample_rate_hz``, a G.722 leg's decoded 16 kHz),
    detected with telcodec.dtmf.

    For legs where telephone-event was not negotiated. Feed every inbound
    frame in order (a silence frame for a lost one); each call returns the
    digits whose key press was recognised in that frame.
    """

    __slots__ = ("_decode", "_detector")

    def __init__(
        self, encoding: Literal["ulaw", "alaw", "linear"], sample_rate_hz: int = 8000
    ) -> None:
        self._decode: Callable[[bytes], bytes] | None = (
            None
            if encoding == "linear"
            else g711.ulaw_decode
            if encoding == "ulaw"
            else g711.alaw_decode
        )
        self._detector = DtmfDetector(sample_rate_hz)

    def process(self, frame: bytes) -> list[str]:
        """Digits recognised in this frame."""
        decode = self._decode
        return self._detector.process(frame if decode is None else decode(frame))

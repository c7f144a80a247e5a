"""One RTP session per call leg: send, receive, latch, jitter buffer, RTCP, timeout.

Theory of operation
-------------------
``RtpSession`` is a sans-I/O engine. The shell binds the sockets and calls:

* ``receive_datagram(data, source_addr, now)`` for each datagram on the RTP
  port (and, with ``rtcp_mux``, RTCP too); ``receive_rtcp(...)`` for each
  datagram on the RTCP port;
* ``send_frame(payload, pt, now, frame_index)`` / ``send_telephone_event``
  on each 20 ms tick of the media clock, and ``pop_frame(now)`` on the same
  tick to take the next inbound frame;
* ``handle_timer(now)`` once ``now >= next_deadline()``;
* then drains ``actions_to_send()`` (``SendDatagram``) and
  ``events_received()``.

Sending (RFC 3550 §5.1, RFC 3551 §4.1). SSRC, first sequence number and
``ts0`` are random (from the injected ``random.Random``). The sequence
number advances by one per packet sent (audio and telephone-event share it,
wrapping at 2**16); the timestamp is ``ts0 + frame_index * 160`` (mod 2**32),
a function of the media clock's frame index, never of elapsed time. The
marker bit goes on the first packet of the session and of each talkspurt
(``start_talkspurt()``, and automatically when sending resumes after hold).
Silence between turns is ordinary frames (``silence_frame(pt)``), so a
continuous stream has no other talkspurt boundary.

Receiving, in the order the checks run on every datagram:

1. parse (``parse_rtp_header``), else dropped as malformed;
2. payload type: a negotiated audio PT or the telephone-event PT, else
   dropped (no latching, no SSRC switch on a PT we did not negotiate);
3. source (RTP injection / RTP bleed, reliability notes §2.3): with
   ``latch=False`` only the address the SDP named is accepted; with
   ``latch=True`` (symmetric RTP for NATed peers) the first valid packet's
   source, optionally only from ``latch_host``, is learned and locked, and
   from then on replies go there. Other sources are dropped and counted.
   Only a new offer/answer (``set_remote``) re-opens learning, never
   traffic. Learning mode for callers behind NAT (``[sip] latching =
   "learn"``, see ``latch_policy``): ``learn_window_s`` lets the first valid
   packet from *any* host be learned within that window after the session
   starts (or ``set_remote(..., now=)``), only ``latch_host`` after it; and
   ``rebind_packets`` follows a NAT rebind (below);
4. SSRC: a new SSRC from the locked source is accepted (``SsrcChanged``),
   with fresh sequence state, a flushed jitter buffer and a reset DTMF
   receiver;
5. RFC 3550 A.1 sequence validation (probation of ``min_sequential``
   packets, MAX_DROPOUT = 3000, MAX_MISORDER = 100, resync after two
   sequential packets past a big jump), giving an extended sequence number;
6. A.8 interarrival jitter (audio packets only: telephone-event packets
   repeat the event's start timestamp);
7. telephone-event payloads go to the ``DtmfReceiver`` and leave a
   placeholder in the jitter buffer (so their sequence numbers are not seen
   as loss); audio goes into the jitter buffer.

NAT rebind (``rebind_packets`` = N > 0): once locked, a packet from a new
port on the locked source's *host* starts a candidate when it carries the
current remote SSRC and a sequence number within ``MAX_DROPOUT`` after the
highest one seen. The candidate replaces the locked source (``RemoteLatched``
again, ``source_rebinds`` counted) on its N-th packet when all N came with
consecutive sequence numbers and the locked source sent nothing accepted
since the candidate's first packet (it went quiet: the NAT moved the flow).
Anything else restarts or drops the candidate; its packets before the switch
are dropped as wrong-source. At 20 ms packets N = 5 follows a rebind 80 ms
after the new port's first packet. Another host is never followed (that
takes a new offer), so injection from a third address is refused in every
mode, and a blind injector on the same host needs the SSRC and sequence.

Jitter buffer (``bridge.rtp.jitter``): frames keyed by extended sequence
number, played in order from ``jitter_depth_frames`` on, one per
``pop_frame(now)``: an ``RtpFrame``, ``FrameLost`` for a missing one, or
``None`` (nothing to play: buffering, a telephone-event slot, underrun).

RTCP (RFC 3550 §6): a compound SR (when we sent RTP since the last report)
or RR, with one report block for the remote source and an SDES CNAME, every
``rtcp_interval_s`` randomised over [0.5, 1.5] (the first interval halved),
to the RTCP address (RTP port + 1, or the RTP address with ``rtcp_mux``).
Incoming RTCP is accepted from the peer's host only; an SR gives LSR/DLSR
for our next report block; a report block about our SSRC becomes
``RtcpReportReceived`` (fraction lost, cumulative lost, jitter, round trip);
a BYE becomes ``RtcpByeReceived``.

Timeout: in ``sendrecv`` a period of ``timeout_s`` without an accepted RTP
packet emits ``RtpTimedOut`` once (re-armed by the next packet). Hold
(``sendonly``, ``recvonly``, ``inactive``) never times out; only
``sendrecv`` and ``sendonly`` send.

Rules that keep this module honest: no clock reads; no exception escapes
``receive_*`` on bad input; no log line per packet, and no object per
received packet beyond its payload slice and its frame tuple; counters, not
events, for per-packet drops.
"""

from __future__ import annotations

import ipaddress
import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from bridge.addresses import NOT_ROUTABLE
from bridge.engine import Address, Event, LocalProtocolError, Outbox, SendDatagram
from bridge.rtp.dtmf import DtmfReceiver, TelephoneEventPacket
from bridge.rtp.jitter import FrameLost, JitterBuffer, RtpFrame
from bridge.rtp.packet import (
    RTP_FIXED_HEADER,
    ReportBlock,
    RtcpBye,
    RtcpPacket,
    RtcpReceiverReport,
    RtcpSenderReport,
    RtcpSourceDescription,
    SdesChunk,
    build_rtp,
    is_rtcp,
    ntp_from_seconds,
    ntp_middle_32,
    parse_rtcp,
    parse_rtp_header,
    serialize_rtcp,
)

__all__ = [
    "Direction",
    "FrameLost",
    "LatchPolicy",
    "LatchingMode",
    "ReceptionStats",
    "RemoteLatched",
    "RtcpByeReceived",
    "RtcpReportReceived",
    "RtpCounters",
    "RtpFrame",
    "RtpSession",
    "RtpSessionConfig",
    "RtpTimedOut",
    "SsrcChanged",
    "latch_policy",
    "needs_learning",
    "silence_frame",
]

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
LatchingMode = Literal["strict", "learn"]

LEARN_WINDOW_S: Final = 3.0
"""``learn`` mode: how long after the answer a source from any host may be learned
(rtpengine's default window; the first valid packet in it is learned)."""
REBIND_PACKETS: Final = 5
"""``learn`` mode: packets a new port must send to replace the locked one (100 ms at 20 ms)."""

_SEQ_MOD: Final = 1 << 16
_TS_MASK: Final = 0xFFFFFFFF
_MAX_DROPOUT: Final = 3000  # RFC 3550 A.1
_MAX_MISORDER: Final = 100
_NTP_UNIX_EPOCH_S: Final = 2_208_988_800  # 1900-01-01 to 1970-01-01
_SILENCE_BYTE: Final = {0: 0xFF, 8: 0xD5}  # PCMU, PCMA (RFC 3551 static PTs)
_new_tuple: Final = tuple.__new__
_unpack_header: Final = RTP_FIXED_HEADER.unpack_from
_pack_header: Final = RTP_FIXED_HEADER.pack


@dataclass(frozen=True, slots=True)
class RtpSessionConfig:
    """Parameters of one RTP session (one call leg)."""

    payload_types: frozenset[int] = frozenset({0})
    """Negotiated audio payload types accepted on receive."""
    telephone_event_pt: int | None = None
    """Negotiated RFC 4733 telephone-event payload type, if any."""
    clock_rate_hz: int = 8000
    """RTP clock rate of the audio payload."""
    samples_per_frame: int = 160
    """Timestamp units per 20 ms frame."""
    frame_s: float = 0.020
    """Frame period in seconds (ptime)."""
    latch: bool = False
    """Symmetric RTP: learn and lock the first source instead of trusting only the SDP address."""
    latch_host: str | None = None
    """With ``latch``: only learn a source from this host (the SDP or signalling host)."""
    learn_window_s: float = 0.0
    """With ``latch``: for this long after the start (or ``set_remote(..., now=)``) the first
    valid source from any host is learned, from ``latch_host`` only afterwards (0: never)."""
    rebind_packets: int = 0
    """With ``latch``: consecutive packets a new port on the locked host must send, the locked
    source quiet, to replace it (a NAT rebind; 0: never followed)."""
    rtcp_mux: bool = False
    """RTCP shares the RTP port (RFC 5761)."""
    jitter_depth_frames: int = 3
    """Frames buffered (or frame periods waited) before playout starts."""
    jitter_max_frames: int = 10
    """Buffered span beyond which the oldest frames are discarded."""
    keep_arrivals: bool = False
    """Keep every accepted audio frame for ``take_arrived()`` as it arrives (the barge-in
    detector's input, ahead of the jitter buffer's playout delay)."""
    min_sequential: int = 1
    """RFC 3550 A.1 probation: sequential packets needed to accept a new source."""
    timeout_s: float = 30.0
    """Seconds without RTP (in sendrecv) before ``RtpTimedOut``."""
    rtcp_interval_s: float = 5.0
    """Nominal RTCP report interval in seconds (randomised x[0.5, 1.5])."""
    cname: str = "callbridge"
    """SDES CNAME of our reports."""
    dtmf_end_timeout_s: float = 0.5
    """Seconds after an event's last packet before a missing end is assumed."""
    wallclock_offset_s: float = 0.0
    """Added to ``now`` to get Unix time, for SR NTP timestamps (0 keeps RTT correct)."""


@dataclass(frozen=True, slots=True)
class RtpTimedOut(Event):
    """No RTP packet for ``idle_s`` seconds while not on hold."""

    idle_s: float


@dataclass(frozen=True, slots=True)
class RemoteLatched(Event):
    """Symmetric RTP locked onto this source address."""

    addr: Address


@dataclass(frozen=True, slots=True)
class SsrcChanged(Event):
    """The locked source started a new SSRC (``old_ssrc`` None for the first one)."""

    old_ssrc: int | None
    new_ssrc: int


@dataclass(frozen=True, slots=True)
class RtcpReportReceived(Event):
    """The peer's reception report about our stream."""

    fraction_lost: float
    cumulative_lost: int
    jitter_ms: float
    round_trip_s: float | None


@dataclass(frozen=True, slots=True)
class RtcpByeReceived(Event):
    """The peer's RTCP BYE."""

    ssrcs: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class ReceptionStats:
    """RFC 3550 A.3/A.8 statistics of the current remote source."""

    ssrc: int | None
    extended_highest_seq: int
    expected: int
    received: int
    lost: int
    jitter_ms: float


@dataclass(frozen=True, slots=True)
class RtpCounters:
    """Everything the session counted, for metrics and the end-of-call summary."""

    packets_sent: int
    octets_sent: int
    packets_received: int
    octets_received: int
    dropped_malformed: int
    dropped_wrong_source: int
    source_rebinds: int
    dropped_payload_type: int
    dropped_bad_sequence: int
    dropped_late: int
    dropped_duplicate: int
    dropped_overflow: int
    frames_lost: int
    underruns: int
    ssrc_changes: int
    sequence_resyncs: int
    rtcp_received: int
    rtcp_malformed: int
    rtcp_wrong_source: int


def needs_learning(sdp_host: str | None, signalling_host: str | None) -> bool:
    """True when the offer's media address cannot be where the peer's RTP comes from:
    none, unspecified (``0.0.0.0``, ``::``), private (RFC 1918, RFC 4193, loopback,
    link-local, CGNAT), a name, or not the host the signalling came from."""
    if not sdp_host:
        return True
    try:
        ip = ipaddress.ip_address(sdp_host)
    except ValueError:
        return True
    if ip.is_unspecified or any(ip in net for net in NOT_ROUTABLE):
        return True
    return signalling_host is not None and sdp_host != signalling_host


@dataclass(frozen=True, slots=True)
class LatchPolicy:
    """The ``RtpSessionConfig`` latching fields for one call (``latch_policy``)."""

    latch_host: str | None
    learn_window_s: float
    rebind_packets: int


def latch_policy(
    mode: LatchingMode, sdp_host: str | None, signalling_host: str | None
) -> LatchPolicy:
    """``[sip] latching``: ``strict`` learns only from the SDP host and never moves;
    ``learn`` also learns from any host for ``LEARN_WINDOW_S`` when the SDP address
    cannot be trusted (``needs_learning``), and follows a NAT rebind."""
    if mode == "strict":
        return LatchPolicy(sdp_host, 0.0, 0)
    window = LEARN_WINDOW_S if needs_learning(sdp_host, signalling_host) else 0.0
    return LatchPolicy(sdp_host, window, REBIND_PACKETS)


def silence_frame(pt: int, samples: int = 160) -> bytes:
    """A G.711 silence frame: 0xFF for PCMU (PT 0), 0xD5 for PCMA (PT 8).

    Raises:
        ValueError: the payload type is not PCMU or PCMA.
    """
    try:
        return bytes((_SILENCE_BYTE[pt],)) * samples
    except KeyError:
        raise ValueError(f"no silence frame for payload type {pt}: PCMU (0) or PCMA (8)") from None


class RtpSession(Outbox):
    """The RTP/RTCP engine of one call leg (see the module docstring).

    Args:
        config: Session parameters.
        remote_addr: The RTP address from the remote SDP (``None``: unknown yet).
        now: Current loop time (starts the timeout and RTCP timers).
        rng: Source of SSRC, initial sequence, ``ts0`` and RTCP jitter
            (inject a seeded ``random.Random`` in tests).
    """

    # Slots: 55 attributes are more than CPython 3.11 keeps in a shared-key
    # instance dict (30), and the per-packet path reads and writes about 25.
    __slots__ = (
        "_accepted_pts",
        "_audio_pts",
        "_bad_seq",
        "_base_seq",
        "_cand_addr",
        "_cand_count",
        "_cand_received",
        "_cand_seq",
        "_clock_rate_hz",
        "_closed",
        "_config",
        "_cycles",
        "_direction",
        "_dropped_bad_sequence",
        "_dropped_malformed",
        "_dropped_payload_type",
        "_dropped_wrong_source",
        "_dtmf",
        "_event_ts",
        "_expected_prior",
        "_jitter",
        "_jitter_buffer",
        "_last_rx_at",
        "_last_sent_at",
        "_last_sent_ts",
        "_last_sr_at",
        "_last_sr_lsr",
        "_latch_host",
        "_learn_until",
        "_marker_pending",
        "_max_seq",
        "_octets_received",
        "_octets_sent",
        "_packets_received",
        "_packets_sent",
        "_peer",
        "_probation",
        "_received",
        "_received_prior",
        "_remote_ssrc",
        "_rng",
        "_rtcp_addr",
        "_rtcp_at",
        "_rtcp_malformed",
        "_rtcp_mux",
        "_rtcp_received",
        "_rtcp_wrong_source",
        "_sdp_addr",
        "_sending",
        "_sent_since_report",
        "_seq",
        "_sequence_resyncs",
        "_source_rebinds",
        "_spf",
        "_ssrc_changes",
        "_te_pt",
        "_timed_out",
        "_transit",
        "pop_frame",
        "remote_addr",
        "ssrc",
        "take_arrived",
        "timer_floor",
        "ts0",
    )

    def __init__(
        self,
        config: RtpSessionConfig,
        remote_addr: Address | None,
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self._rng = rng if rng is not None else random.SystemRandom()
        self._audio_pts = config.payload_types
        self._te_pt = config.telephone_event_pt
        self._accepted_pts = (
            config.payload_types
            if config.telephone_event_pt is None
            else config.payload_types | {config.telephone_event_pt}
        )
        """The audio payload types and the telephone-event one: what ``receive_datagram`` takes."""
        self._spf = config.samples_per_frame
        self._clock_rate_hz = config.clock_rate_hz
        self._rtcp_mux = config.rtcp_mux
        # Sending.
        self.ssrc = self._rng.getrandbits(32)
        self.ts0 = self._rng.getrandbits(32)
        self._seq = self._rng.getrandbits(16)
        self._marker_pending = True
        self._event_ts = 0
        self._packets_sent = 0
        self._octets_sent = 0
        self._sent_since_report = False
        self._last_sent_ts = self.ts0
        self._last_sent_at = now
        # Peer.
        self._sdp_addr = remote_addr
        self._peer: Address | None = None if config.latch else remote_addr
        self.remote_addr: Address | None = remote_addr
        """Where RTP is sent: the latched source, else the SDP address (read, never set)."""
        self._rtcp_addr: Address | None = None
        self._learn_until = now + config.learn_window_s
        self._latch_host = config.latch_host
        self._cand_addr: Address | None = None
        """A NAT rebind candidate: its address, packets so far, last sequence number and
        ``_packets_received`` at its first packet (the locked source quiet since then)."""
        self._cand_count = 0
        self._cand_seq = 0
        self._cand_received = 0
        self._direction: Direction = "sendrecv"
        self._sending = True  # direction sends and not closed
        self._closed = False
        # Receiving: RFC 3550 A.1 state of the current remote source.
        self._remote_ssrc: int | None = None
        self._probation = 0
        self._max_seq = 0
        self._cycles = 0
        self._base_seq = 0
        self._bad_seq = _SEQ_MOD + 1
        self._received = 0
        self._expected_prior = 0
        self._received_prior = 0
        self._transit: int | None = None
        self._jitter = 0.0
        self._last_sr_lsr = 0
        self._last_sr_at = 0.0
        self._last_rx_at = now
        self._timed_out = False
        self._jitter_buffer = JitterBuffer(
            config.jitter_depth_frames,
            config.jitter_max_frames,
            config.frame_s,
            config.keep_arrivals,
        )
        self.pop_frame = self._jitter_buffer.pop
        self.take_arrived = self._jitter_buffer.take_arrived
        self._dtmf = DtmfReceiver(config.clock_rate_hz, config.dtmf_end_timeout_s)
        # Counters.
        self._packets_received = 0
        self._octets_received = 0
        self._dropped_malformed = 0
        self._dropped_wrong_source = 0
        self._dropped_payload_type = 0
        self._dropped_bad_sequence = 0
        self._ssrc_changes = 0
        self._sequence_resyncs = 0
        self._source_rebinds = 0
        self._rtcp_received = 0
        self._rtcp_malformed = 0
        self._rtcp_wrong_source = 0
        # RTCP timer: the first interval is halved (RFC 3550 §6.3.2).
        self._rtcp_at = now + self._rtcp_interval() / 2
        self.timer_floor = -math.inf
        """A lower bound of ``next_deadline()`` (read only): ``poll_timer(now)`` does nothing
        while ``now < timer_floor``, so a per-tick caller may compare first and skip the call."""

    # ------------------------------------------------------------ commands

    def timestamp_for(self, frame_index: int) -> int:
        """RTP timestamp of outbound frame ``frame_index``: ``ts0 + n * 160`` mod 2**32."""
        return (self.ts0 + frame_index * self._spf) & _TS_MASK

    def start_talkspurt(self) -> None:
        """Set the marker bit on the next audio packet (RFC 3551 §4.1)."""
        self._marker_pending = True

    def send_frame(self, payload: bytes, pt: int, now: float, frame_index: int) -> None:
        """Queue one audio frame for the remote address.

        Nothing is sent when the direction does not send (hold) or no remote
        address is known yet. After calling this, drain ``actions_to_send()``.
        """
        data = self.frame_packet(payload, pt, now, frame_index)
        if data is not None:
            assert self.remote_addr is not None  # frame_packet returns None without one
            self._actions.append(SendDatagram(data, self.remote_addr))

    def frame_packet(self, payload: bytes, pt: int, now: float, frame_index: int) -> bytes | None:
        """``send_frame`` for the per-tick hot path: the datagram itself, not an action.

        Same packet and the same state changes (sequence number, marker,
        counters, SR figures) as ``send_frame``, but the datagram is returned
        for the shell to send to ``remote_addr`` at once: no ``SendDatagram``
        object and no outbox round trip per frame. ``None`` when nothing is
        to be sent (hold, or no remote address yet).
        """
        if self.remote_addr is None or not self._sending:
            return None
        second = pt
        if self._marker_pending:
            self._marker_pending = False
            second = pt | 0x80
        seq = self._seq
        ts = (self.ts0 + frame_index * self._spf) & _TS_MASK
        data = _pack_header(0x80, second, seq, ts, self.ssrc) + payload
        self._seq = (seq + 1) & 0xFFFF
        self._packets_sent += 1
        self._octets_sent += len(payload)
        self._sent_since_report = True
        self._last_sent_ts = ts
        self._last_sent_at = now
        return data

    def send_telephone_event(
        self, packet: TelephoneEventPacket, now: float, frame_index: int
    ) -> None:
        """Queue one RFC 4733 packet from ``DtmfSender`` instead of this tick's audio frame.

        Every packet of an event carries the timestamp of the tick on which
        its first (marker) packet was sent.

        Raises:
            LocalProtocolError: telephone-event was not negotiated.
        """
        if self._te_pt is None:
            raise LocalProtocolError("telephone-event was not negotiated for this session")
        addr = self.remote_addr
        if addr is None or not self._sending:
            return
        if packet.marker:
            self._event_ts = (self.ts0 + frame_index * self._spf) & _TS_MASK
        data = build_rtp(
            self._te_pt, self._seq, self._event_ts, self.ssrc, packet.payload, packet.marker
        )
        self._emit(data, addr, (self.ts0 + frame_index * self._spf) & _TS_MASK, now)

    def _emit(self, data: bytes, addr: Address, ts: int, now: float) -> None:
        self._seq = (self._seq + 1) & 0xFFFF
        self._packets_sent += 1
        self._octets_sent += len(data) - 12
        self._sent_since_report = True
        self._last_sent_ts = ts
        self._last_sent_at = now
        self._actions.append(SendDatagram(data, addr))

    def set_remote(
        self,
        addr: Address | None,
        rtcp_addr: Address | None = None,
        now: float | None = None,
        latch_host: str | None = None,
    ) -> None:
        """A new offer/answer named this remote RTP (and optionally RTCP) address.

        Strict mode locks onto it; latching mode re-opens learning (and sends
        to the SDP address until a packet is latched). With ``now`` the
        learning window (``learn_window_s``) starts again; ``latch_host``
        replaces the configured one (the new offer's host).
        """
        self._sdp_addr = addr
        self._rtcp_addr = rtcp_addr
        self.remote_addr = addr
        self._peer = None if self._config.latch else addr
        self._cand_addr = None
        if now is not None:
            self._learn_until = now + self._config.learn_window_s
        if latch_host is not None:
            self._latch_host = latch_host

    def set_direction(self, direction: Direction, now: float) -> None:
        """Our media direction after an offer/answer: hold stops sending and the timeout."""
        was_sending = self._sending
        self._direction = direction
        self._sending = direction in ("sendrecv", "sendonly") and not self._closed
        if self._sending and not was_sending:
            self._marker_pending = True
        self._last_rx_at = now
        self._timed_out = False
        self.timer_floor = -math.inf  # the timeout may apply again: recompute

    def close(self, now: float, reason: str = "") -> None:
        """Send a final RTCP report with BYE and stop sending."""
        if self._closed:
            return
        addr = self._rtcp_destination()
        if addr is not None:
            packets = self._report_packets(now)
            packets.append(RtcpBye((self.ssrc,), reason))
            self._actions.append(SendDatagram(serialize_rtcp(packets), addr))
        self._closed = True
        self._sending = False

    # ------------------------------------------------------------ receive

    def receive_datagram(self, data: bytes, source_addr: Address, now: float) -> bool:
        """Handle one datagram from the RTP port. Bad input is counted, never raised.

        Returns:
            True when the datagram queued events or actions: drain
            ``events_received()`` and ``actions_to_send()`` then. False in
            the common case (an audio packet from the locked source, or a
            dropped one), where draining would find nothing.
        """
        if self._rtcp_mux and is_rtcp(data):
            self.receive_rtcp(data, source_addr, now)
            return True
        try:
            first, second, seq, ts, ssrc = _unpack_header(data)
        except struct.error:  # shorter than the fixed header
            first = -1
        if first == 0x80:  # version 2, no padding, extension or CSRC: the common packet
            start = 12  # RTP_HEADER_BYTES
            end = len(data)
        else:
            try:
                second, seq, ts, ssrc, start, end = parse_rtp_header(data)
            except ValueError:
                self._dropped_malformed += 1
                return False
        pt = second & 0x7F
        if pt not in self._accepted_pts:
            self._dropped_payload_type += 1
            return False
        if source_addr != self._peer and not self._latch(source_addr, ssrc, seq, now):
            self._dropped_wrong_source += 1
            return bool(self._events)
        if ssrc != self._remote_ssrc:
            self._change_source(ssrc, seq)
        max_seq = self._max_seq
        if seq == (max_seq + 1) & 0xFFFF and not self._probation:
            # RFC 3550 A.1, the in-order case of update_seq() (udelta == 1)
            if seq < max_seq:
                self._cycles += _SEQ_MOD  # wrapped
            self._max_seq = seq
            self._received += 1
            ext = self._cycles + seq
        else:
            update = self._update_seq(seq)
            if update is None:
                self._dropped_bad_sequence += 1
                return bool(self._events)
            ext = update
        self._packets_received += 1
        self._octets_received += end - start
        self._last_rx_at = now
        if self._timed_out:
            self._timed_out = False
            self.timer_floor = -math.inf  # the timeout applies again
        if pt == self._te_pt:
            self._dtmf.receive(data[start:end], ts, now)
            self._events.extend(self._dtmf.events_received())
            self._jitter_buffer.insert(ext, None, now)
            self.timer_floor = -math.inf  # an event's end timeout may be armed
            return bool(self._events)
        # RFC 3550 A.8 interarrival jitter, in timestamp units.
        transit = (round(now * self._clock_rate_hz) - ts) & _TS_MASK
        if self._transit is not None:
            d = ((transit - self._transit + 0x80000000) & _TS_MASK) - 0x80000000
            self._jitter += ((d if d >= 0 else -d) - self._jitter) / 16
        self._transit = transit
        # tuple.__new__ skips the NamedTuple's generated __new__ frame (hot path).
        frame = _new_tuple(RtpFrame, (data[start:end], seq, ts, pt, second > 0x7F))
        self._jitter_buffer.insert(ext, frame, now)
        return bool(self._events)

    def _latch(self, source_addr: Address, ssrc: int, seq: int, now: float) -> bool:
        """Symmetric RTP: lock onto the first valid source (only while learning), or
        follow a NAT rebind (module docstring). True: accept this packet."""
        config = self._config
        if not config.latch:
            return False
        if self._peer is not None:
            return config.rebind_packets > 0 and self._rebind(source_addr, ssrc, seq)
        if (
            self._latch_host is not None
            and source_addr[0] != self._latch_host
            and now >= self._learn_until
        ):
            return False
        self._lock(source_addr)
        return True

    def _lock(self, source_addr: Address) -> None:
        self._peer = source_addr
        self.remote_addr = source_addr
        self._cand_addr = None
        self._events.append(RemoteLatched(source_addr))

    def _rebind(self, source_addr: Address, ssrc: int, seq: int) -> bool:
        peer = self._peer
        if peer is None or source_addr[0] != peer[0] or ssrc != self._remote_ssrc:
            return False
        if (
            source_addr == self._cand_addr
            and seq == (self._cand_seq + 1) & 0xFFFF
            and self._packets_received == self._cand_received
        ):
            self._cand_count += 1
            self._cand_seq = seq
        elif (seq - self._max_seq) & 0xFFFF < _MAX_DROPOUT:
            self._cand_addr = source_addr  # a new candidate (or a restarted one)
            self._cand_count = 1
            self._cand_seq = seq
            self._cand_received = self._packets_received
        else:
            return False
        if self._cand_count < self._config.rebind_packets:
            return False
        self._source_rebinds += 1
        if not self._rtcp_mux:
            self._rtcp_addr = None  # learned again from the new flow's RTCP
        self._lock(source_addr)
        return True

    def _change_source(self, ssrc: int, seq: int) -> None:
        old = self._remote_ssrc
        if old is not None:
            self._ssrc_changes += 1
            self._dtmf.reset()
            self._events.extend(self._dtmf.events_received())
        self._events.append(SsrcChanged(old, ssrc))
        self._remote_ssrc = ssrc
        self._init_seq(seq)
        self._max_seq = (seq - 1) & 0xFFFF
        self._probation = self._config.min_sequential
        self._received = 0
        self._expected_prior = 0
        self._received_prior = 0
        self._transit = None
        self._jitter = 0.0
        self._last_sr_lsr = 0
        self._jitter_buffer.flush()

    def _init_seq(self, seq: int) -> None:
        self._base_seq = seq
        self._max_seq = seq
        self._bad_seq = _SEQ_MOD + 1
        self._cycles = 0
        self._received = 0
        self._received_prior = 0
        self._expected_prior = 0

    def _update_seq(self, seq: int) -> int | None:
        """RFC 3550 A.1 ``update_seq``: the extended sequence number, or None (not valid)."""
        max_seq = self._max_seq
        if self._probation:
            if seq == (max_seq + 1) & 0xFFFF:
                self._probation -= 1
                self._max_seq = seq
                if self._probation == 0:
                    self._init_seq(seq)
                    self._received += 1
                    return seq
            else:
                self._probation = self._config.min_sequential - 1
                self._max_seq = seq
            return None
        udelta = (seq - max_seq) & 0xFFFF
        if udelta < _MAX_DROPOUT:
            if seq < max_seq:
                self._cycles += _SEQ_MOD  # wrapped
            self._max_seq = seq
            ext = self._cycles + seq
        elif udelta <= _SEQ_MOD - _MAX_MISORDER:
            if seq != self._bad_seq:
                self._bad_seq = (seq + 1) & 0xFFFF
                return None
            # Two sequential packets after a big jump: the source restarted.
            self._sequence_resyncs += 1
            self._init_seq(seq)
            self._jitter_buffer.flush()
            ext = seq
        else:
            ext = self._cycles + max_seq - ((max_seq - seq) & 0xFFFF)  # duplicate or reordered
        self._received += 1
        return ext

    # ------------------------------------------------------------ jitter buffer

    pop_frame: Callable[[float], RtpFrame | FrameLost | None]
    """``pop_frame(now)``: the next inbound 20 ms frame in sequence order; call once per tick.

    Returns ``RtpFrame``; ``FrameLost`` if that frame never arrived; ``None``
    when there is nothing to play this tick. The consumer plays silence (or
    conceals) for anything but an ``RtpFrame``. It is the jitter buffer's
    ``pop`` itself (bound in ``__init__``): one call per tick, not two.
    """

    take_arrived: Callable[[], list[RtpFrame]]
    """``take_arrived()``: with ``keep_arrivals``, the audio frames accepted since the last
    call, in arrival order, not yet played (the jitter buffer's ``take_arrived``)."""

    # ------------------------------------------------------------ RTCP

    def receive_rtcp(self, data: bytes, source_addr: Address, now: float) -> None:
        """Handle one RTCP datagram. Accepted only from the peer's host."""
        peer = self._peer if self._peer is not None else self._sdp_addr
        if peer is None or source_addr[0] != peer[0]:
            self._rtcp_wrong_source += 1
            return
        try:
            packets = parse_rtcp(data)
        except ValueError:
            self._rtcp_malformed += 1
            return
        self._rtcp_received += 1
        if self._config.latch and self._rtcp_addr is None and not self._config.rtcp_mux:
            self._rtcp_addr = source_addr
        for packet in packets:
            self._handle_rtcp(packet, now)

    def _handle_rtcp(self, packet: RtcpPacket, now: float) -> None:
        if isinstance(packet, RtcpSenderReport | RtcpReceiverReport):
            if isinstance(packet, RtcpSenderReport):
                self._last_sr_lsr = ntp_middle_32(packet.ntp_timestamp)
                self._last_sr_at = now
            for block in packet.reports:
                if block.ssrc == self.ssrc:
                    self._events.append(self._report_event(block, now))
        elif isinstance(packet, RtcpBye):
            self._events.append(RtcpByeReceived(packet.ssrcs, packet.reason))

    def _report_event(self, block: ReportBlock, now: float) -> RtcpReportReceived:
        round_trip_s: float | None = None
        if block.lsr:
            arrival = ntp_middle_32(self._ntp(now))
            round_trip_s = ((arrival - block.lsr - block.dlsr) & _TS_MASK) / 65536
        return RtcpReportReceived(
            fraction_lost=block.fraction_lost / 256,
            cumulative_lost=block.cumulative_lost,
            jitter_ms=block.jitter * 1000 / self._clock_rate_hz,
            round_trip_s=round_trip_s,
        )

    def _ntp(self, now: float) -> int:
        return ntp_from_seconds(now + self._config.wallclock_offset_s + _NTP_UNIX_EPOCH_S)

    def _rtcp_interval(self) -> float:
        return self._config.rtcp_interval_s * (0.5 + self._rng.random())

    def _rtcp_destination(self) -> Address | None:
        if self._config.rtcp_mux:
            return self.remote_addr
        if self._rtcp_addr is not None:
            return self._rtcp_addr
        if self.remote_addr is None:
            return None
        return (self.remote_addr[0], self.remote_addr[1] + 1)

    def _report_packets(self, now: float) -> list[RtcpPacket]:
        blocks: tuple[ReportBlock, ...] = ()
        if self._remote_ssrc is not None and self._probation == 0:
            blocks = (self._take_report_block(now),)
        first: RtcpPacket
        if self._sent_since_report:
            rtp_ts = self._last_sent_ts + round((now - self._last_sent_at) * self._clock_rate_hz)
            first = RtcpSenderReport(
                self.ssrc,
                self._ntp(now),
                rtp_ts & _TS_MASK,
                self._packets_sent,
                self._octets_sent,
                blocks,
            )
        else:
            first = RtcpReceiverReport(self.ssrc, blocks)
        self._sent_since_report = False
        cname = SdesChunk(self.ssrc, ((1, self._config.cname.encode()),))
        return [first, RtcpSourceDescription((cname,))]

    def _take_report_block(self, now: float) -> ReportBlock:
        """The report block of RFC 3550 A.3; advances the fraction-lost interval."""
        extended_max = self._cycles + self._max_seq
        expected = extended_max - self._base_seq + 1
        expected_interval = expected - self._expected_prior
        received_interval = self._received - self._received_prior
        self._expected_prior = expected
        self._received_prior = self._received
        lost_interval = expected_interval - received_interval
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = (lost_interval << 8) // expected_interval
        dlsr = 0
        if self._last_sr_lsr:
            dlsr = int((now - self._last_sr_at) * 65536) & _TS_MASK
        return ReportBlock(
            ssrc=self._remote_ssrc or 0,
            fraction_lost=fraction,
            cumulative_lost=expected - self._received,
            highest_sequence=extended_max & _TS_MASK,
            jitter=int(self._jitter),
            lsr=self._last_sr_lsr,
            dlsr=dlsr,
        )

    # ------------------------------------------------------------ timers

    def next_deadline(self) -> float | None:
        """The earliest of: next RTCP report, RTP timeout, DTMF end timeout."""
        if self._closed:
            return None
        deadline = self._rtcp_at
        if self._direction == "sendrecv" and not self._timed_out:
            deadline = min(deadline, self._last_rx_at + self._config.timeout_s)
        dtmf = self._dtmf.next_deadline()
        if dtmf is not None:
            deadline = min(deadline, dtmf)
        return deadline

    def poll_timer(self, now: float) -> bool:
        """``handle_timer(now)`` if ``now >= next_deadline()``: the once-per-tick check.

        Returns True when it ran (drain ``actions_to_send()`` and
        ``events_received()`` then). Cheap when nothing is due: one compare
        against a lower bound of the next deadline, refreshed only when that
        bound is reached or something may have moved the deadline earlier
        (a telephone-event packet, a direction change, the end of a timeout).
        Received packets only move the RTP timeout later, so they leave the
        bound valid.
        """
        if now < self.timer_floor:
            return False
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            self.timer_floor = math.inf if deadline is None else deadline
            return False
        self.handle_timer(now)
        return True

    def handle_timer(self, now: float) -> None:
        """Send a due RTCP report, report an RTP timeout, close a DTMF event."""
        self.timer_floor = -math.inf  # recomputed by the next poll_timer()
        if self._closed:
            return
        if now >= self._rtcp_at:
            self._rtcp_at = now + self._rtcp_interval()
            addr = self._rtcp_destination()
            if addr is not None:
                data = serialize_rtcp(self._report_packets(now))
                self._actions.append(SendDatagram(data, addr))
        idle_s = now - self._last_rx_at
        timeout_applies = self._direction == "sendrecv" and not self._timed_out
        if timeout_applies and idle_s >= self._config.timeout_s:
            self._timed_out = True
            self._events.append(RtpTimedOut(idle_s))
        self._dtmf.handle_timer(now)
        self._events.extend(self._dtmf.events_received())

    # ------------------------------------------------------------ statistics

    def reception_stats(self) -> ReceptionStats:
        """RFC 3550 A.3 counts and the A.8 jitter of the current remote source (pure read)."""
        extended_max = self._cycles + self._max_seq
        expected = extended_max - self._base_seq + 1 if self._remote_ssrc is not None else 0
        return ReceptionStats(
            ssrc=self._remote_ssrc,
            extended_highest_seq=extended_max,
            expected=expected,
            received=self._received,
            lost=expected - self._received,
            jitter_ms=self._jitter * 1000 / self._clock_rate_hz,
        )

    def counters(self) -> RtpCounters:
        """A snapshot of every counter."""
        jitter = self._jitter_buffer
        return RtpCounters(
            packets_sent=self._packets_sent,
            octets_sent=self._octets_sent,
            packets_received=self._packets_received,
            octets_received=self._octets_received,
            dropped_malformed=self._dropped_malformed,
            dropped_wrong_source=self._dropped_wrong_source,
            source_rebinds=self._source_rebinds,
            dropped_payload_type=self._dropped_payload_type,
            dropped_bad_sequence=self._dropped_bad_sequence,
            dropped_late=jitter.dropped_late,
            dropped_duplicate=jitter.dropped_duplicate,
            dropped_overflow=jitter.dropped_overflow,
            frames_lost=jitter.frames_lost,
            underruns=jitter.underruns,
            ssrc_changes=self._ssrc_changes,
            sequence_resyncs=self._sequence_resyncs,
            rtcp_received=self._rtcp_received,
            rtcp_malformed=self._rtcp_malformed,
            rtcp_wrong_source=self._rtcp_wrong_source,
        )

"""RTP and RTCP packets: parse and serialize (RFC 3550 §5, §6).

Theory of operation
-------------------
Pure functions and frozen dataclasses over ``bytes``; no state.

RTP (RFC 3550 §5.1)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |V=2|P|X|  CC   |M|     PT      |       sequence number         |
    |                           timestamp                           |
    |                             SSRC                              |
    |                      CSRC list (CC words)                     |
    | [extension: profile (16) | length in words (16) | words ...]  |
    | payload ...                   [padding ... | padding count]   |

``RtpPacket.parse`` checks, in this order, and raises ``ValueError`` naming
the rule: length >= 12, version 2, the CSRC list fits, the extension header
and its words fit, and the padding count is non-zero and fits in what
follows the header. The per-packet hot path of the session uses the same
checks through :func:`parse_rtp_header`, which returns a plain tuple instead
of a dataclass (one allocation less per packet), and :func:`build_rtp`, which
packs the fixed header with one precompiled ``struct.Struct``.

RTCP (RFC 3550 §6.4-6.6): packets travel as *compound* packets, several
RTCP packets back to back, each with the common header ``V=2 | P | count(5)
| PT(8) | length (words - 1)``. :func:`parse_rtcp` walks a compound packet
and checks every length against what is actually there before reading a
field (the Asterisk AST-2017-008 lesson: a too-short RR must not be read as
if it carried report blocks). SR (200), RR (201), SDES (202) and BYE (203)
are decoded; any other type (APP, feedback, XR) is kept as
:class:`RtcpOther` with its raw body, so a compound packet carrying them is
still usable. Serialization is the exact inverse of parsing for the four
decoded types; RTCP padding is read but never written.

NTP timestamps (SR) are 64-bit fixed point integers (32.32);
:func:`ntp_middle_32` gives the "LSR" form used by report blocks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "RTCP_BYE",
    "RTCP_RR",
    "RTCP_SDES",
    "RTCP_SR",
    "RTP_FIXED_HEADER",
    "RTP_HEADER_BYTES",
    "RTP_SEQ_MODULUS",
    "RTP_TS_MODULUS",
    "SDES_CNAME",
    "ReportBlock",
    "RtcpBye",
    "RtcpOther",
    "RtcpPacket",
    "RtcpReceiverReport",
    "RtcpSenderReport",
    "RtcpSourceDescription",
    "RtpPacket",
    "SdesChunk",
    "build_rtp",
    "is_rtcp",
    "ntp_from_seconds",
    "ntp_middle_32",
    "parse_rtcp",
    "parse_rtp_header",
    "serialize_rtcp",
]

RTP_VERSION: Final = 2
RTP_HEADER_BYTES: Final = 12
RTP_SEQ_MODULUS: Final = 1 << 16
RTP_TS_MODULUS: Final = 1 << 32

RTCP_SR: Final = 200
RTCP_RR: Final = 201
RTCP_SDES: Final = 202
RTCP_BYE: Final = 203
SDES_CNAME: Final = 1

_RTP_HEADER: Final = struct.Struct("!BBHII")
RTP_FIXED_HEADER: Final = _RTP_HEADER
"""The fixed 12-byte header (V/P/X/CC, M/PT, sequence, timestamp, SSRC), precompiled."""
_EXTENSION_HEADER: Final = struct.Struct("!HH")
_RTCP_HEADER: Final = struct.Struct("!BBH")
_U32: Final = struct.Struct("!I")
_SENDER_INFO: Final = struct.Struct("!IQIII")  # ssrc, ntp, rtp ts, packets, octets
_REPORT_BLOCK: Final = struct.Struct("!IIIIII")  # ssrc, lost word, ext seq, jitter, lsr, dlsr
_RTCP_HEADER_BYTES: Final = 4
_SENDER_INFO_BYTES: Final = _SENDER_INFO.size
_REPORT_BLOCK_BYTES: Final = _REPORT_BLOCK.size
_MAX_COUNT: Final = 31  # 5-bit RC / SC field
_NTP_FRACTION: Final = 1 << 32


# ---------------------------------------------------------------- RTP


def parse_rtp_header(data: bytes) -> tuple[int, int, int, int, int, int]:
    """Validate an RTP packet and return its fields without building an object.

    Returns:
        ``(marker_pt_byte, sequence_number, timestamp, ssrc, payload_start,
        payload_end)``: the second header byte (marker in bit 7, payload type
        in bits 0-6), and the payload's bounds inside ``data`` (padding
        excluded).

    Raises:
        ValueError: the packet is malformed (message names the rule).
    """
    size = len(data)
    if size < RTP_HEADER_BYTES:
        raise ValueError(f"RTP packet too short: {size} bytes, the fixed header needs 12")
    first, second, seq, ts, ssrc = _RTP_HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise ValueError(f"RTP version {first >> 6}, expected 2")
    start = RTP_HEADER_BYTES
    if first & 0x3F:  # CSRC count, extension or padding: the slow path
        start, end = _variable_part_bounds(data, first)
        return second, seq, ts, ssrc, start, end
    return second, seq, ts, ssrc, start, size


def _variable_part_bounds(data: bytes, first: int) -> tuple[int, int]:
    size = len(data)
    csrc_count = first & 0x0F
    start = RTP_HEADER_BYTES + 4 * csrc_count
    if start > size:
        raise ValueError(f"RTP CSRC list overrun: CC={csrc_count} needs {start} bytes, got {size}")
    if first & 0x10:
        if start + 4 > size:
            raise ValueError(
                f"RTP header extension overrun: its header needs {start + 4} bytes, got {size}"
            )
        _profile, words = _EXTENSION_HEADER.unpack_from(data, start)
        start += 4 + 4 * words
        if start > size:
            raise ValueError(
                f"RTP header extension overrun: {words} words need {start} bytes, got {size}"
            )
    end = size
    if first & 0x20:
        if end == start:
            raise ValueError("RTP bad padding: P bit set but no byte follows the header")
        padding_bytes = data[-1]
        if padding_bytes == 0:
            raise ValueError("RTP bad padding: padding count is 0")
        if padding_bytes > end - start:
            raise ValueError(
                f"RTP bad padding: count {padding_bytes} exceeds the {end - start} bytes "
                "after the header"
            )
        end -= padding_bytes
    return start, end


def build_rtp(
    payload_type: int, sequence_number: int, timestamp: int, ssrc: int, payload: bytes, marker: bool
) -> bytes:
    """Serialize a plain RTP packet (no CSRC, extension or padding): the send hot path."""
    second = payload_type | 0x80 if marker else payload_type
    return _RTP_HEADER.pack(0x80, second, sequence_number, timestamp, ssrc) + payload


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """One RTP packet, every header field decoded.

    ``padding_bytes`` is the number of padding bytes on the wire, the count
    byte included (0 = no padding); ``extension_profile`` is ``None`` when
    the X bit is clear.
    """

    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension_profile: int | None = None
    extension: bytes = b""
    padding_bytes: int = 0

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        """Parse one RTP packet.

        Raises:
            ValueError: the packet is malformed (see :func:`parse_rtp_header`).
        """
        second, seq, ts, ssrc, start, end = parse_rtp_header(data)
        first = data[0]
        csrc_count = first & 0x0F
        csrc = struct.unpack_from(f"!{csrc_count}I", data, RTP_HEADER_BYTES)
        profile: int | None = None
        extension = b""
        if first & 0x10:
            offset = RTP_HEADER_BYTES + 4 * csrc_count
            profile, words = _EXTENSION_HEADER.unpack_from(data, offset)
            extension = data[offset + 4 : offset + 4 + 4 * words]
        return cls(
            payload_type=second & 0x7F,
            sequence_number=seq,
            timestamp=ts,
            ssrc=ssrc,
            payload=data[start:end],
            marker=bool(second & 0x80),
            csrc=csrc,
            extension_profile=profile,
            extension=extension,
            padding_bytes=len(data) - end,
        )

    def serialize(self) -> bytes:
        """The packet on the wire.

        Raises:
            ValueError: a field does not fit its width (PT > 127, more than 15
                CSRCs, an extension that is not whole 32-bit words, padding
                outside 0..255).
        """
        if not 0 <= self.payload_type <= 0x7F:
            raise ValueError(f"RTP payload type {self.payload_type} does not fit 7 bits")
        if len(self.csrc) > 15:
            raise ValueError(f"RTP CSRC list of {len(self.csrc)} entries, at most 15 fit")
        if len(self.extension) % 4:
            raise ValueError("RTP header extension must be whole 32-bit words")
        if not 0 <= self.padding_bytes <= 255:
            raise ValueError(f"RTP padding of {self.padding_bytes} bytes does not fit one byte")
        first = 0x80 | len(self.csrc)
        if self.padding_bytes:
            first |= 0x20
        if self.extension_profile is not None:
            first |= 0x10
        second = self.payload_type | (0x80 if self.marker else 0)
        parts = [
            _RTP_HEADER.pack(first, second, self.sequence_number, self.timestamp, self.ssrc),
            struct.pack(f"!{len(self.csrc)}I", *self.csrc),
        ]
        if self.extension_profile is not None:
            words = len(self.extension) // 4
            parts.append(_EXTENSION_HEADER.pack(self.extension_profile, words))
            parts.append(self.extension)
        parts.append(self.payload)
        if self.padding_bytes:
            parts.append(bytes(self.padding_bytes - 1) + bytes((self.padding_bytes,)))
        return b"".join(parts)


def is_rtcp(data: bytes) -> bool:
    """RTP/RTCP demultiplexing on one port (RFC 5761 §4): RTCP PT 192..223 in byte 1."""
    return len(data) >= 2 and 192 <= data[1] <= 223


# ---------------------------------------------------------------- RTCP


def ntp_from_seconds(seconds: float) -> int:
    """A 64-bit NTP timestamp (32.32 fixed point) from seconds."""
    return int(seconds * _NTP_FRACTION) & 0xFFFFFFFFFFFFFFFF


def ntp_middle_32(ntp: int) -> int:
    """The middle 32 bits of an NTP timestamp (the LSR field of a report block)."""
    return (ntp >> 16) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One reception report (RFC 3550 §6.4.1): what a receiver saw of ``ssrc``.

    ``fraction_lost`` is 8-bit fixed point (lost / expected * 256) since the
    previous report; ``cumulative_lost`` is signed (duplicates can make it
    negative); ``jitter`` is in timestamp units; ``lsr`` and ``dlsr`` (delay
    since last SR, 1/65536 s) give the round trip.
    """

    ssrc: int
    fraction_lost: int
    cumulative_lost: int
    highest_sequence: int
    jitter: int
    lsr: int = 0
    dlsr: int = 0

    def serialize(self) -> bytes:
        lost = max(-(1 << 23), min(self.cumulative_lost, (1 << 23) - 1)) & 0xFFFFFF
        return _REPORT_BLOCK.pack(
            self.ssrc,
            (self.fraction_lost & 0xFF) << 24 | lost,
            self.highest_sequence,
            self.jitter,
            self.lsr,
            self.dlsr,
        )

    @classmethod
    def parse(cls, data: bytes, offset: int) -> ReportBlock:
        ssrc, lost_word, highest, jitter, lsr, dlsr = _REPORT_BLOCK.unpack_from(data, offset)
        lost = lost_word & 0xFFFFFF
        if lost & 0x800000:
            lost -= 1 << 24
        return cls(ssrc, lost_word >> 24, lost, highest, jitter, lsr, dlsr)


@dataclass(frozen=True, slots=True)
class RtcpSenderReport:
    """SR, PT 200 (RFC 3550 §6.4.1)."""

    ssrc: int
    ntp_timestamp: int
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...] = ()

    def serialize(self) -> bytes:
        body = _SENDER_INFO.pack(
            self.ssrc,
            self.ntp_timestamp,
            self.rtp_timestamp,
            self.packet_count & 0xFFFFFFFF,
            self.octet_count & 0xFFFFFFFF,
        )
        return _rtcp(RTCP_SR, len(self.reports), body + _blocks(self.reports))


@dataclass(frozen=True, slots=True)
class RtcpReceiverReport:
    """RR, PT 201 (RFC 3550 §6.4.2)."""

    ssrc: int
    reports: tuple[ReportBlock, ...] = ()

    def serialize(self) -> bytes:
        return _rtcp(RTCP_RR, len(self.reports), _U32.pack(self.ssrc) + _blocks(self.reports))


@dataclass(frozen=True, slots=True)
class SdesChunk:
    """The SDES items of one source: ``(item type, value)`` pairs, CNAME = type 1."""

    ssrc: int
    items: tuple[tuple[int, bytes], ...] = ()

    @property
    def cname(self) -> str | None:
        for item_type, value in self.items:
            if item_type == SDES_CNAME:
                return value.decode("utf-8", "replace")
        return None

    def serialize(self) -> bytes:
        parts = [_U32.pack(self.ssrc)]
        for item_type, value in self.items:
            if not 1 <= item_type <= 255 or len(value) > 255:
                raise ValueError(f"SDES item type {item_type} or length {len(value)} out of range")
            parts.append(bytes((item_type, len(value))) + value)
        chunk = b"".join(parts)
        # At least one zero byte ends the item list, then pad to 32 bits (§6.5).
        return chunk + bytes(4 - len(chunk) % 4)


@dataclass(frozen=True, slots=True)
class RtcpSourceDescription:
    """SDES, PT 202 (RFC 3550 §6.5)."""

    chunks: tuple[SdesChunk, ...]

    def serialize(self) -> bytes:
        body = b"".join(chunk.serialize() for chunk in self.chunks)
        return _rtcp(RTCP_SDES, len(self.chunks), body)


@dataclass(frozen=True, slots=True)
class RtcpBye:
    """BYE, PT 203 (RFC 3550 §6.6)."""

    ssrcs: tuple[int, ...]
    reason: str = ""

    def serialize(self) -> bytes:
        body = b"".join(_U32.pack(ssrc) for ssrc in self.ssrcs)
        if self.reason:
            text = self.reason.encode()[:255]
            reason = bytes((len(text),)) + text
            body += reason + bytes(-len(reason) % 4)
        return _rtcp(RTCP_BYE, len(self.ssrcs), body)


@dataclass(frozen=True, slots=True)
class RtcpOther:
    """An RTCP packet of a type we do not decode (APP, feedback, XR...), kept raw."""

    packet_type: int
    count: int
    body: bytes = field(repr=False)

    def serialize(self) -> bytes:
        return _rtcp(self.packet_type, self.count, self.body)


RtcpPacket = RtcpSenderReport | RtcpReceiverReport | RtcpSourceDescription | RtcpBye | RtcpOther


def _blocks(reports: tuple[ReportBlock, ...]) -> bytes:
    return b"".join(block.serialize() for block in reports)


def _rtcp(packet_type: int, count: int, body: bytes) -> bytes:
    if count > _MAX_COUNT:
        raise ValueError(f"RTCP count {count} does not fit 5 bits")
    if len(body) % 4:
        raise ValueError("RTCP body must be whole 32-bit words")
    return _RTCP_HEADER.pack(0x80 | count, packet_type, len(body) // 4) + body


def serialize_rtcp(packets: list[RtcpPacket] | tuple[RtcpPacket, ...]) -> bytes:
    """A compound RTCP packet (RFC 3550 §6.1): the packets back to back."""
    return b"".join(packet.serialize() for packet in packets)


def parse_rtcp(data: bytes) -> list[RtcpPacket]:
    """Parse a compound RTCP packet.

    Raises:
        ValueError: any packet of the compound is malformed (too short for its
            header, bad version, length beyond the datagram, bad padding, a
            count that does not fit its length); nothing of the compound is
            returned then.
    """
    packets: list[RtcpPacket] = []
    offset = 0
    size = len(data)
    if size == 0:
        raise ValueError("RTCP packet is empty")
    while offset < size:
        if size - offset < _RTCP_HEADER_BYTES:
            raise ValueError(f"RTCP packet too short: {size - offset} bytes left at {offset}")
        first, packet_type, words = _RTCP_HEADER.unpack_from(data, offset)
        if first >> 6 != RTP_VERSION:
            raise ValueError(f"RTCP version {first >> 6} at offset {offset}, expected 2")
        end = offset + _RTCP_HEADER_BYTES + 4 * words
        if end > size:
            raise ValueError(
                f"RTCP length overrun: PT {packet_type} at {offset} claims {end - offset} "
                f"bytes, {size - offset} left"
            )
        body_end = end
        if first & 0x20:
            padding_bytes = data[end - 1] if end > offset + _RTCP_HEADER_BYTES else 0
            if padding_bytes == 0 or padding_bytes > end - offset - _RTCP_HEADER_BYTES:
                raise ValueError(f"RTCP bad padding count {padding_bytes} at offset {offset}")
            body_end -= padding_bytes
        body = data[offset + _RTCP_HEADER_BYTES : body_end]
        packets.append(_parse_one(packet_type, first & 0x1F, body))
        offset = end
    return packets


def _parse_one(packet_type: int, count: int, body: bytes) -> RtcpPacket:
    if packet_type == RTCP_SR:
        return _parse_sr(count, body)
    if packet_type == RTCP_RR:
        return _parse_rr(count, body)
    if packet_type == RTCP_SDES:
        return _parse_sdes(count, body)
    if packet_type == RTCP_BYE:
        return _parse_bye(count, body)
    return RtcpOther(packet_type, count, body)


def _parse_blocks(count: int, body: bytes, offset: int, what: str) -> tuple[ReportBlock, ...]:
    needed = offset + count * _REPORT_BLOCK_BYTES
    if len(body) < needed:
        raise ValueError(
            f"RTCP {what} with {count} report blocks needs {needed} bytes of body, got {len(body)}"
        )
    return tuple(ReportBlock.parse(body, offset + i * _REPORT_BLOCK_BYTES) for i in range(count))


def _parse_sr(count: int, body: bytes) -> RtcpSenderReport:
    if len(body) < _SENDER_INFO_BYTES:
        raise ValueError(f"RTCP SR too short: {len(body)} bytes of body, sender info needs 24")
    ssrc, ntp, rtp_ts, packets, octets = _SENDER_INFO.unpack_from(body)
    reports = _parse_blocks(count, body, _SENDER_INFO_BYTES, "SR")
    return RtcpSenderReport(ssrc, ntp, rtp_ts, packets, octets, reports)


def _parse_rr(count: int, body: bytes) -> RtcpReceiverReport:
    if len(body) < 4:
        raise ValueError(f"RTCP RR too short: {len(body)} bytes of body, needs 4 for the SSRC")
    (ssrc,) = _U32.unpack_from(body)
    return RtcpReceiverReport(ssrc, _parse_blocks(count, body, 4, "RR"))


def _parse_sdes(count: int, body: bytes) -> RtcpSourceDescription:
    chunks: list[SdesChunk] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(body):
            raise ValueError(f"RTCP SDES chunk truncated at {offset}: no room for its SSRC")
        (ssrc,) = _U32.unpack_from(body, offset)
        offset += 4
        items: list[tuple[int, bytes]] = []
        while True:
            if offset >= len(body):
                raise ValueError("RTCP SDES chunk truncated: item list not terminated")
            item_type = body[offset]
            if item_type == 0:
                offset = (offset + 4) & ~3  # the null item plus padding to 32 bits
                break
            if offset + 2 > len(body) or offset + 2 + body[offset + 1] > len(body):
                raise ValueError(f"RTCP SDES item truncated at {offset}")
            length = body[offset + 1]
            items.append((item_type, body[offset + 2 : offset + 2 + length]))
            offset += 2 + length
        chunks.append(SdesChunk(ssrc, tuple(items)))
    return RtcpSourceDescription(tuple(chunks))


def _parse_bye(count: int, body: bytes) -> RtcpBye:
    needed = 4 * count
    if len(body) < needed:
        raise ValueError(f"RTCP BYE with {count} sources needs {needed} bytes, got {len(body)}")
    ssrcs = struct.unpack_from(f"!{count}I", body)
    reason = ""
    if len(body) > needed:
        length = body[needed]
        if needed + 1 + length > len(body):
            raise ValueError(f"RTCP BYE reason of {length} bytes overruns the packet")
        reason = body[needed + 1 : needed + 1 + length].decode("utf-8", "replace")
    return RtcpBye(tuple(ssrcs), reason)

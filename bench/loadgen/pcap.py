"""TCP segments from a pcapng file, read in Python (what ``dumpcap`` writes).

``WireCapture`` used to read its capture back with ``tshark -T fields -e
tcp.payload``: tshark dissects every segment up to WebSocket and JSON and
prints each payload as colon-separated hex, which the bench then held in
memory whole. At 500 media-stream calls a 20 s window is about a million
segments: tshark took tens of minutes on a slow host and the hex text ran to
gigabytes. Nothing past TCP is needed to time a ``media`` message (the
WebSocket frames are parsed by ``wire._WsStream``), so this reader walks the
file's blocks itself: Section Header, Interface Description (link type and
``if_tsresol``) and Enhanced Packet blocks; link types Ethernet (what
``dumpcap -i lo`` records), Linux cooked v1/v2, BSD loopback and raw IP; IPv4
and IPv6 (no extension headers: loopback traffic has none). It streams: one
segment at a time from a memory map.

Format: the pcapng specification (draft-ietf-opsawg-pcapng), sections 4.1
(SHB), 4.2 (IDB, option 9 ``if_tsresol``) and 4.3 (EPB).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["PcapError", "TcpSegment", "tcp_segments"]

_SHB = 0x0A0D0D0A
_IDB = 0x00000001
_EPB = 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_IF_TSRESOL = 9

# link type -> bytes before the network header, and where the EtherType is (None: look
# at the IP version nibble)
_ETHERNET, _NULL, _RAW, _SLL, _SLL2 = 1, 0, 101, 113, 276
_LINK_HEADER = {_ETHERNET: 14, _NULL: 4, _RAW: 0, _SLL: 16, _SLL2: 20}
_ETHERTYPE_AT = {_ETHERNET: 12, _SLL: 14, _SLL2: 0}
_IPV4, _IPV6, _VLAN = 0x0800, 0x86DD, 0x8100
_TCP = 6


class PcapError(ValueError):
    """The file is not a pcapng capture this reader understands."""


class TcpSegment(NamedTuple):
    t_ns: int  # capture time, ns since the epoch (at the interface's resolution)
    src_port: int
    dst_port: int
    seq: int
    payload: bytes


class _Interface(NamedTuple):
    link_type: int
    ns_per_unit: float  # nanoseconds per timestamp unit
    units_per_s: int  # for exact integer arithmetic with decimal resolutions (0 if binary)


def _tsresol(value: int) -> tuple[float, int]:
    if value & 0x80:  # a power of two
        return 1e9 / (1 << (value & 0x7F)), 0
    units = 10**value
    return 1e9 / units, units


def _interface(body: bytes | memoryview, endian: str) -> _Interface:
    link_type = struct.unpack_from(endian + "H", body, 0)[0]
    ns, units = _tsresol(6)  # the default: microseconds
    pos = 8
    while pos + 4 <= len(body):
        code, length = struct.unpack_from(endian + "HH", body, pos)
        if code == 0:  # opt_endofopt
            break
        if code == _IF_TSRESOL and length >= 1:
            ns, units = _tsresol(body[pos + 4])
        pos += 4 + (length + 3) // 4 * 4
    return _Interface(link_type, ns, units)


def _tcp(data: bytes | memoryview, link_type: int) -> tuple[int, int, int, bytes] | None:
    """(source port, destination port, sequence number, payload) of a TCP packet, else None."""
    off = _LINK_HEADER.get(link_type)
    if off is None or len(data) < off + 20:
        return None
    at = _ETHERTYPE_AT.get(link_type)
    if at is not None:
        ethertype = int.from_bytes(data[at : at + 2], "big")
        if link_type == _ETHERNET and ethertype == _VLAN:
            ethertype = int.from_bytes(data[16:18], "big")
            off += 4
        if ethertype not in (_IPV4, _IPV6):
            return None
    version = data[off] >> 4
    if version == 4:
        ihl = (data[off] & 0x0F) * 4
        if data[off + 9] != _TCP or ihl < 20:
            return None
        total = int.from_bytes(data[off + 2 : off + 4], "big")
        if int.from_bytes(data[off + 6 : off + 8], "big") & 0x3FFF:
            return None  # a fragment (never on loopback): its TCP header may be elsewhere
        end = off + total if total else len(data)
        tcp = off + ihl
    elif version == 6:
        if data[off + 6] != _TCP:
            return None
        end = off + 40 + int.from_bytes(data[off + 4 : off + 6], "big")
        tcp = off + 40
    else:
        return None
    end = min(end, len(data))  # a snapped capture keeps what it has
    if end < tcp + 20:
        return None
    src, dst, seq = struct.unpack_from("!HHI", data, tcp)
    start = tcp + (data[tcp + 12] >> 4) * 4
    return src, dst, seq, bytes(data[start:end])


def tcp_segments(path: Path | str) -> Iterator[TcpSegment]:
    """Every TCP segment with a payload in the capture, in file order."""
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return
    with mm:
        view = memoryview(mm)
        try:
            yield from _walk(view)
        finally:
            view.release()


def _walk(view: memoryview) -> Iterator[TcpSegment]:
    size = len(view)
    pos = 0
    endian = "<"
    interfaces: list[_Interface] = []
    while pos + 12 <= size:
        block_type = struct.unpack_from(endian + "I", view, pos)[0]
        if block_type == _SHB:
            magic = struct.unpack_from("<I", view, pos + 8)[0]
            if magic == _BYTE_ORDER_MAGIC:
                endian = "<"
            elif magic == struct.unpack("<I", struct.pack(">I", _BYTE_ORDER_MAGIC))[0]:
                endian = ">"
            else:
                raise PcapError(f"section header at {pos}: bad byte-order magic {magic:#x}")
            interfaces = []  # interface ids are per section
        elif pos == 0:
            raise PcapError("not a pcapng file (no section header block first)")
        length = struct.unpack_from(endian + "I", view, pos + 4)[0]
        if length < 12 or length % 4 or pos + length > size:
            if pos + length > size and length >= 12:
                return  # the capture was cut mid-block (dumpcap killed): stop there
            raise PcapError(f"block at {pos}: bad length {length}")
        body = view[pos + 8 : pos + length - 4]
        if block_type == _IDB:
            interfaces.append(_interface(body, endian))
        elif block_type == _EPB:
            iface_id, ts_hi, ts_lo, cap_len = struct.unpack_from(endian + "IIII", body, 0)
            if iface_id >= len(interfaces):
                raise PcapError(f"packet at {pos} names interface {iface_id}, not described")
            iface = interfaces[iface_id]
            got = _tcp(body[20 : 20 + cap_len], iface.link_type)
            if got is not None and got[3]:
                ts = (ts_hi << 32) | ts_lo
                if iface.units_per_s:
                    t_ns = ts * 1_000_000_000 // iface.units_per_s
                else:
                    t_ns = round(ts * iface.ns_per_unit)
                yield TcpSegment(t_ns, got[0], got[1], got[2], got[3])
        body.release()
        pos += length

"""RTP/RTCP packet parse and serialize: hand-built vectors byte for byte, the
malformed variants, and aiortc's independent parser as a second opinion."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiortc import rtp as aiortc_rtp
from hypothesis import given
from hypothesis import strategies as st

from bridge.rtp.packet import (
    ReportBlock,
    RtcpBye,
    RtcpOther,
    RtcpReceiverReport,
    RtcpSenderReport,
    RtcpSourceDescription,
    RtpPacket,
    SdesChunk,
    build_rtp,
    is_rtcp,
    ntp_from_seconds,
    ntp_middle_32,
    parse_rtcp,
    parse_rtp_header,
    serialize_rtcp,
)

FIXTURES = Path(__file__).parent / "fixtures"

# V=2 P=0 X=0 CC=0 | M=1 PT=0 | seq 0x1234 | ts 0xDEADBEEF | SSRC 0x01020304 | 4 bytes mu-law
PLAIN = bytes.fromhex("80 80 1234 deadbeef 01020304 fffe7f00")


def test_plain_packet_fields() -> None:
    packet = RtpPacket.parse(PLAIN)
    assert packet == RtpPacket(
        payload_type=0,
        sequence_number=0x1234,
        timestamp=0xDEADBEEF,
        ssrc=0x01020304,
        payload=bytes.fromhex("fffe7f00"),
        marker=True,
    )
    assert packet.serialize() == PLAIN
    assert build_rtp(0, 0x1234, 0xDEADBEEF, 0x01020304, bytes.fromhex("fffe7f00"), True) == PLAIN


def test_build_rtp_without_marker_and_pt_8() -> None:
    data = build_rtp(8, 65535, 2**32 - 1, 7, b"\xd5" * 3, False)
    assert data == bytes.fromhex("80 08 ffff ffffffff 00000007 d5d5d5")


def test_csrc_extension_padding_vector() -> None:
    # V=2 P=1 X=1 CC=2 -> 0xB2; M=0 PT=101; seq 1; ts 160; ssrc 0xAABBCCDD
    data = bytes.fromhex(
        "b2 65 0001 000000a0 aabbccdd"
        "11111111 22222222"  # CSRC list
        "bede 0001 10ff0000"  # one-byte-header extension profile, 1 word
        "0a0a00a0"  # payload: RFC 4733 digit 0... (any 4 bytes)
        "000003"  # 3 bytes of padding, last byte is the count
    )
    packet = RtpPacket.parse(data)
    assert packet.csrc == (0x11111111, 0x22222222)
    assert packet.extension_profile == 0xBEDE
    assert packet.extension == bytes.fromhex("10ff0000")
    assert packet.payload == bytes.fromhex("0a0a00a0")
    assert packet.padding_bytes == 3
    assert packet.payload_type == 101 and not packet.marker
    assert packet.serialize() == data
    ours = parse_rtp_header(data)
    assert ours == (101, 1, 160, 0xAABBCCDD, 28, 32)


def test_only_padding_is_an_empty_payload() -> None:
    data = bytes.fromhex("a0 00 0001 00000000 00000001") + bytes(3) + b"\x04"
    packet = RtpPacket.parse(data)
    assert packet.payload == b"" and packet.padding_bytes == 4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short: 0 bytes"),
        (PLAIN[:11], "too short: 11 bytes"),
        (b"\x40" + PLAIN[1:], "version 1, expected 2"),
        (b"\x00" + PLAIN[1:], "version 0, expected 2"),
        (b"\x83" + PLAIN[1:], "CSRC list overrun: CC=3 needs 24 bytes, got 16"),
        (b"\x90" + PLAIN[1:12], "extension overrun: its header needs 16 bytes, got 12"),
        (b"\x90" + PLAIN[1:12] + bytes.fromhex("bede0002 00000000"), "2 words need 24"),
        (b"\xa0" + PLAIN[1:12], "P bit set but no byte follows"),
        (b"\xa0" + PLAIN[1:-1] + b"\x00", "padding count is 0"),
        (b"\xa0" + PLAIN[1:-1] + b"\x05", "count 5 exceeds the 4 bytes"),
    ],
)
def test_malformed_rtp_raises_precise_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RtpPacket.parse(data)
    with pytest.raises(ValueError, match=message):
        parse_rtp_header(data)


def test_serialize_rejects_fields_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="payload type 128"):
        RtpPacket(128, 0, 0, 0).serialize()
    with pytest.raises(ValueError, match="16 entries"):
        RtpPacket(0, 0, 0, 0, csrc=tuple(range(16))).serialize()
    with pytest.raises(ValueError, match="whole 32-bit words"):
        RtpPacket(0, 0, 0, 0, extension_profile=1, extension=b"abc").serialize()


@given(
    pt=st.integers(0, 127),
    seq=st.integers(0, 65535),
    ts=st.integers(0, 2**32 - 1),
    ssrc=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=200),
    marker=st.booleans(),
    csrc=st.lists(st.integers(0, 2**32 - 1), max_size=15),
    padding=st.integers(0, 255),
)
def test_round_trip_and_agreement_with_aiortc(
    pt: int,
    seq: int,
    ts: int,
    ssrc: int,
    payload: bytes,
    marker: bool,
    csrc: list[int],
    padding: int,
) -> None:
    packet = RtpPacket(pt, seq, ts, ssrc, payload, marker, tuple(csrc), padding_bytes=padding)
    data = packet.serialize()
    assert RtpPacket.parse(data) == packet
    theirs = aiortc_rtp.RtpPacket.parse(data)
    assert (theirs.payload_type, theirs.sequence_number, theirs.timestamp, theirs.ssrc) == (
        pt,
        seq,
        ts,
        ssrc,
    )
    assert (theirs.payload, bool(theirs.marker), theirs.csrc) == (payload, marker, csrc)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_raise_value_error(data: bytes) -> None:
    try:
        packet = RtpPacket.parse(data)
    except ValueError:
        return
    assert len(packet.payload) <= len(data) - 12


def test_is_rtcp_demultiplexes_by_second_byte() -> None:
    assert not is_rtcp(PLAIN)
    assert is_rtcp(bytes.fromhex("80c8"))  # SR
    assert is_rtcp(bytes.fromhex("81c9"))  # RR
    assert not is_rtcp(bytes.fromhex("80e0"))  # PT 96 with marker: 224, RTP
    assert not is_rtcp(b"\x80")


# ---------------------------------------------------------------- RTCP

SR_VECTOR = bytes.fromhex(
    "81 c8 000c"  # V=2 RC=1 PT=200 length 12 words
    "01020304"  # SSRC
    "e0b0c0d0 80000000"  # NTP (seconds.half)
    "0000a000"  # RTP ts
    "00000064"  # 100 packets
    "00003e80"  # 16000 octets
    "0a0b0c0d"  # report block: source SSRC
    "40 fffffe"  # fraction 64 (25 %), cumulative lost -2
    "0001ffff"  # extended highest sequence
    "00000020"  # jitter 32
    "b0c0d080"  # LSR
    "00010000"  # DLSR one second
)

RR_SDES_BYE_VECTOR = bytes.fromhex(
    "80 c9 0001 01020304"  # RR without report blocks
    "81 ca 0003 01020304"  # SDES, one chunk
    "01 05 616c696365"  # CNAME "alice"
    "00"  # terminator: 4 + 7 + 1 = 12 bytes of body
    "81 cb 0003 01020304"  # BYE with a reason
    "04 62796521 000000"  # "bye!" + 3 bytes of padding
)


def test_sender_report_vector() -> None:
    (sr,) = parse_rtcp(SR_VECTOR)
    assert sr == RtcpSenderReport(
        ssrc=0x01020304,
        ntp_timestamp=0xE0B0C0D080000000,
        rtp_timestamp=0xA000,
        packet_count=100,
        octet_count=16000,
        reports=(ReportBlock(0x0A0B0C0D, 64, -2, 0x1FFFF, 32, 0xB0C0D080, 0x10000),),
    )
    assert sr.serialize() == SR_VECTOR
    theirs = aiortc_rtp.RtcpPacket.parse(SR_VECTOR)[0]
    assert isinstance(theirs, aiortc_rtp.RtcpSrPacket)
    assert theirs.reports[0].packets_lost == -2
    assert theirs.sender_info.ntp_timestamp == 0xE0B0C0D080000000


def test_compound_rr_sdes_bye_vector() -> None:
    packets = parse_rtcp(RR_SDES_BYE_VECTOR)
    assert packets == [
        RtcpReceiverReport(0x01020304),
        RtcpSourceDescription((SdesChunk(0x01020304, ((1, b"alice"),)),)),
        RtcpBye((0x01020304,), "bye!"),
    ]
    sdes = packets[1]
    assert isinstance(sdes, RtcpSourceDescription) and sdes.chunks[0].cname == "alice"
    assert serialize_rtcp(packets) == RR_SDES_BYE_VECTOR
    assert len(aiortc_rtp.RtcpPacket.parse(RR_SDES_BYE_VECTOR)) == 3


def test_unknown_rtcp_types_are_kept_raw() -> None:
    app = bytes.fromhex("80 cc 0002 01020304 6e616d65")  # APP "name"
    packets = parse_rtcp(RR_SDES_BYE_VECTOR[:8] + app)
    assert packets[1] == RtcpOther(204, 0, bytes.fromhex("01020304 6e616d65"))
    assert serialize_rtcp(packets) == RR_SDES_BYE_VECTOR[:8] + app


def test_rtcp_padding_is_skipped() -> None:
    # RR with P set: one padding word whose last byte says 4.
    data = bytes.fromhex("a0 c9 0002 01020304 00000004")
    assert parse_rtcp(data) == [RtcpReceiverReport(0x01020304)]


def test_sdes_multi_chunk_round_trip() -> None:
    packet = RtcpSourceDescription(
        (
            SdesChunk(1, ((1, b"abc"),)),  # 4 + 5 -> 12 bytes (3 padding)
            SdesChunk(2, ((1, b"host@example"), (6, b"callbridge"))),
            SdesChunk(3, ()),
        )
    )
    data = packet.serialize()
    assert len(data) % 4 == 0
    assert parse_rtcp(data) == [packet]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (bytes.fromhex("80c9"), "too short: 2 bytes"),
        (bytes.fromhex("40c9 0001 01020304"), "version 1"),
        (bytes.fromhex("80c9 0002 01020304"), "length overrun"),
        # RR claiming one report block but only carrying its SSRC (AST-2017-008 shape).
        (bytes.fromhex("81c9 0001 01020304"), "1 report blocks needs 28 bytes of body, got 4"),
        (bytes.fromhex("81c8 0001 01020304"), "SR too short"),
        (bytes.fromhex("80c9 0000"), "RR too short"),
        (bytes.fromhex("a0c9 0001 01020300"), "bad padding count 0"),
        (bytes.fromhex("a0c9 0001 01020309"), "bad padding count 9"),
        (bytes.fromhex("81ca 0002 01020304 0105616c"), "SDES item truncated"),
        (bytes.fromhex("81ca 0002 01020304 01026100"), "not terminated"),
        (bytes.fromhex("82ca 0002 01020304 00000000"), "SDES chunk truncated"),
        (bytes.fromhex("82cb 0001 01020304"), "BYE with 2 sources needs 8"),
        (bytes.fromhex("81cb 0002 01020304 09616263"), "reason of 9 bytes overruns"),
        (SR_VECTOR + b"\x80", "too short: 1 bytes left"),
    ],
)
def test_malformed_rtcp_raises_precise_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rtcp(data)


@given(st.binary(max_size=80))
def test_arbitrary_bytes_rtcp_parse_or_raise_value_error(data: bytes) -> None:
    try:
        packets = parse_rtcp(data)
    except ValueError:
        return
    assert packets


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.bin")))
def test_binary_fixtures(name: str) -> None:
    """Each fixture file is named ``<kind>_<case>.bin``; invalid ones must raise."""
    data = (FIXTURES / name).read_bytes()
    kind = name.split("_", 1)[0]
    parse = RtpPacket.parse if kind == "rtp" else parse_rtcp
    if "invalid" in name or "truncated" in name:
        with pytest.raises(ValueError):
            parse(data)
    else:
        parsed = parse(data)
        again = parsed.serialize() if isinstance(parsed, RtpPacket) else serialize_rtcp(parsed)
        assert again == data


def test_ntp_helpers() -> None:
    ntp = ntp_from_seconds(3.5)
    assert ntp == (3 << 32) | (1 << 31)
    assert ntp_middle_32(ntp) == (3 << 16) | (1 << 15)


def test_report_block_clamps_cumulative_lost_to_24_bits() -> None:
    data = ReportBlock(1, 0, -(1 << 30), 0, 0).serialize()
    assert ReportBlock.parse(data, 0).cumulative_lost == -(1 << 23)
    data = ReportBlock(1, 0, 1 << 30, 0, 0).serialize()
    assert ReportBlock.parse(data, 0).cumulative_lost == (1 << 23) - 1

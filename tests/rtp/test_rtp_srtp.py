"""SDES a=crypto parse/build and SRTP/SRTCP round trips over libsrtp."""

from __future__ import annotations

import random

import pytest

from bridge.rtp.packet import RtcpReceiverReport, build_rtp, parse_rtcp, serialize_rtcp
from bridge.rtp.session import RtpFrame, RtpSession, RtpSessionConfig
from bridge.rtp.srtp import SdesCrypto, SrtpContext

RFC4568_KEY = "PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"  # RFC 4568 §9.1 example key


def key(seed: int, tag: int = 1) -> SdesCrypto:
    return SdesCrypto.generate(tag, random.Random(seed).randbytes)


def test_parse_rfc4568_example_and_build_back() -> None:
    crypto = SdesCrypto.parse(f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}|2^20")
    assert crypto.tag == 1 and crypto.lifetime == "2^20" and len(crypto.key_salt) == 30
    assert crypto.to_attribute() == f"crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}|2^20"
    assert SdesCrypto.parse(crypto.to_attribute()) == crypto
    bare = SdesCrypto.parse(f"7 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}")
    assert bare.tag == 7 and bare.lifetime is None and bare.key_salt == crypto.key_salt


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("crypto:1 AES_CM_128_HMAC_SHA1_80", "needs tag, suite and key params"),
        (f"crypto:x AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}", "tag must be 1-9 digits"),
        (f"crypto:1 AES_256_CM_HMAC_SHA1_80 inline:{RFC4568_KEY}", "unsupported crypto suite"),
        (f"crypto:1 AES_CM_128_HMAC_SHA1_80 uri:{RFC4568_KEY}", "method must be inline"),
        ("crypto:1 AES_CM_128_HMAC_SHA1_80 inline:not*base64", "not base64"),
        ("crypto:1 AES_CM_128_HMAC_SHA1_80 inline:AAAA", "is 3 bytes"),
        (f"crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}|2^20|1:32", "MKI"),
        (
            f"crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY};inline:{RFC4568_KEY}",
            "several crypto keys",
        ),
    ],
)
def test_bad_crypto_attributes(attribute: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SdesCrypto.parse(attribute)


def pair() -> tuple[SrtpContext, SrtpContext]:
    alice, bob = key(1), key(2)
    return SrtpContext(alice, bob), SrtpContext(bob, alice)


def test_rtp_round_trip_tamper_and_replay() -> None:
    a, b = pair()
    packets = [
        build_rtp(0, seq, seq * 160, 0xABCDEF, bytes([seq]) * 160, seq == 0) for seq in range(5)
    ]
    protected = [a.protect(p) for p in packets]
    assert all(len(s) == len(p) + 10 for s, p in zip(protected, packets, strict=True))  # 80-bit tag
    assert protected[1][12:172] != packets[1][12:]  # payload encrypted
    assert [b.unprotect(s) for s in protected] == packets
    with pytest.raises(ValueError, match="SRTP unprotect failed"):
        b.unprotect(protected[2])  # replay
    tampered = bytearray(a.protect(build_rtp(0, 9, 1440, 0xABCDEF, b"\xff" * 160, False)))
    tampered[20] ^= 1
    with pytest.raises(ValueError, match="SRTP unprotect failed"):
        b.unprotect(bytes(tampered))
    with pytest.raises(ValueError, match="SRTP protect failed"):
        a.protect(packets[0])  # the same sequence number twice
    fresh = a.protect(build_rtp(0, 10, 1600, 0xABCDEF, b"\xff" * 160, False))
    with pytest.raises(ValueError, match="SRTP unprotect failed"):
        SrtpContext(key(3), key(4)).unprotect(fresh)  # wrong key


def test_rtcp_round_trip() -> None:
    a, b = pair()
    rtcp = serialize_rtcp([RtcpReceiverReport(0xABCDEF)])
    assert parse_rtcp(b.unprotect_rtcp(a.protect_rtcp(rtcp))) == [RtcpReceiverReport(0xABCDEF)]
    with pytest.raises(ValueError, match="SRTCP unprotect failed"):
        b.unprotect_rtcp(rtcp + bytes(14))


def test_unprotect_before_the_session_keeps_forgeries_out() -> None:
    a, b = pair()
    session = RtpSession(RtpSessionConfig(latch=True), None, 0.0, random.Random(1))
    forged = build_rtp(0, 1, 160, 0x666, b"\x00" * 160, False) + bytes(10)
    for data, source in [
        (forged, ("198.51.100.66", 9)),
        (a.protect(build_rtp(0, 1, 160, 7, b"\xff" * 160, False)), ("192.0.2.1", 4000)),
    ]:
        try:
            clear = b.unprotect(data)
        except ValueError:
            continue
        session.receive_datagram(clear, source, 0.0)
    assert session.remote_addr == ("192.0.2.1", 4000)
    frame = session.pop_frame(0.1)
    assert isinstance(frame, RtpFrame) and frame.payload == b"\xff" * 160

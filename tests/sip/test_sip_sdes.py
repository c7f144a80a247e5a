"""SDES (RFC 4568) in SDP: a=crypto with AES_CM_128_HMAC_SHA1_80 and _32, offer and
answer, keys never in a repr; and the SRTP context keyed from it (both suites)."""

from __future__ import annotations

import logging
import random

import pytest

from bridge.rtp.packet import build_rtp
from bridge.rtp.srtp import SrtpContext
from bridge.sip.sdp import (
    SDES_SUITES,
    SdesCrypto,
    SdpError,
    build_answer,
    build_offer,
    choose_crypto,
    negotiate,
    parse_sdp,
)

RFC4568_KEY = "PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"  # RFC 4568 §9.1 example key


def rand(seed: int) -> random.Random:
    return random.Random(seed)


@pytest.mark.parametrize("suite", SDES_SUITES)
def test_both_suites_parse_and_build_back(suite: str) -> None:
    crypto = SdesCrypto.parse(f"a=crypto:2 {suite} inline:{RFC4568_KEY}|2^20")
    assert (crypto.tag, crypto.suite, crypto.lifetime) == (2, suite, "2^20")
    assert crypto.auth_tag_bits == (32 if suite.endswith("_32") else 80)
    assert crypto.to_attribute() == f"crypto:2 {suite} inline:{RFC4568_KEY}|2^20"
    assert SdesCrypto.parse(crypto.to_attribute()) == crypto


def test_the_key_is_never_in_a_repr_or_an_error(caplog: pytest.LogCaptureFixture) -> None:
    crypto = SdesCrypto.parse(f"crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{RFC4568_KEY}")
    offer = build_offer("192.0.2.1", 4000, 1, 1, crypto=(crypto,))
    media = parse_sdp(offer).media[0]
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("offer media %r %s", media, crypto)
    for text in (repr(crypto), str(crypto), repr(media), repr(parse_sdp(offer)), caplog.text):
        assert RFC4568_KEY not in text and repr(crypto.key_salt) not in text
    bad_key = RFC4568_KEY[:-4] + "*AAA"
    with pytest.raises(SdpError) as info:
        SdesCrypto.parse(f"crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{bad_key}")
    assert bad_key not in str(info.value) and "not base64" in str(info.value)


def test_offer_lists_keys_and_the_answer_picks_the_first_supported() -> None:
    ours = [
        SdesCrypto.generate(1, rand(1).randbytes),
        SdesCrypto.generate(2, rand(2).randbytes, "AES_CM_128_HMAC_SHA1_32"),
    ]
    offer_text = build_offer("192.0.2.1", 4000, 1, 1, crypto=ours)
    assert "m=audio 4000 RTP/SAVP 0 8 101\r\n" in offer_text
    # a peer's offer: an AES-256 suite we do not have first, a malformed line, then ours
    theirs = offer_text.replace(
        "a=crypto:1",
        "a=crypto:9 AES_256_CM_HMAC_SHA1_80 inline:"
        + "A" * 64
        + "\r\na=crypto:8 garbage\r\na=crypto:1",
    )
    media = parse_sdp(theirs).media[0]
    assert [(c.tag, c.suite) for c in media.crypto] == [(1, SDES_SUITES[0]), (2, SDES_SUITES[1])]
    answer_key = choose_crypto(media.crypto, rand(3).randbytes)
    assert answer_key is not None
    assert (answer_key.tag, answer_key.suite) == (1, SDES_SUITES[0])
    assert answer_key.key_salt != media.crypto[0].key_salt  # our own key, not theirs
    assert choose_crypto((), rand(3).randbytes) is None


def test_answer_carries_one_crypto_line_and_savp() -> None:
    offer = parse_sdp(build_offer("192.0.2.1", 4000, 1, 1))
    audio = negotiate(offer, ("PCMU",))
    assert audio is not None
    key = SdesCrypto.generate(5, rand(4).randbytes, "AES_CM_128_HMAC_SHA1_32")
    answer = build_answer(offer, audio, "198.51.100.4", 30000, 7, 1, crypto=key)
    media = parse_sdp(answer).media[0]
    assert media.proto == "RTP/SAVP" and media.crypto == (key,)
    plain = build_answer(offer, audio, "198.51.100.4", 30000, 7, 1)
    assert "RTP/AVP" in plain and "a=crypto" not in plain


def test_negotiate_does_not_take_savp_as_plain_rtp_yet() -> None:
    key = SdesCrypto.generate(1, rand(5).randbytes)
    assert (
        negotiate(parse_sdp(build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,))), ("PCMU",)) is None
    )


@pytest.mark.parametrize("suite", SDES_SUITES)
def test_srtp_round_trip_from_an_offer_answer_pair(suite: str) -> None:
    offered = SdesCrypto.generate(1, rand(6).randbytes, suite)
    media = parse_sdp(build_offer("192.0.2.1", 4000, 1, 1, crypto=(offered,))).media[0]
    answered = choose_crypto(media.crypto, rand(7).randbytes)
    assert answered is not None
    caller, callee = SrtpContext(offered, answered), SrtpContext(answered, media.crypto[0])
    packet = build_rtp(0, 1, 160, 0x1234, b"\x7f" * 160, True)
    protected = caller.protect(packet)
    assert len(protected) == len(packet) + answered.auth_tag_bits // 8
    assert callee.unprotect(protected) == packet
    reply = build_rtp(0, 9, 160, 0x9999, b"\xff" * 160, False)
    assert caller.unprotect(callee.protect(reply)) == reply

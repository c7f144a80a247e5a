"""SDES (RFC 4568) in SDP: a=crypto with AES_CM_128_HMAC_SHA1_80 and _32, offer and
answer, keys never in a repr; and the SRTP context keyed from it (both suites)."""

from __future__ import annotations

import logging
import random
from dataclasses import replace

import pytest

from bridge.rtp.packet import build_rtp
from bridge.rtp.srtp import SrtpContext
from bridge.sip.events import CallEstablished, CallOffered, OutboundCallAnswered, SrtpKeyChanged
from bridge.sip.message import SipResponse
from bridge.sip.sdp import (
    SDES_SUITES,
    NegotiatedAudio,
    SdesCrypto,
    SdpError,
    build_answer,
    build_offer,
    choose_crypto,
    negotiate,
    parse_sdp,
    srtp_refusal,
)
from bridge.sip.settings import SipSecurity

from .test_sip_ua import A_URI, B_ADDR, B_URI, BASE, make

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


def test_the_answer_carries_one_crypto_line_in_the_offers_profile() -> None:
    key = SdesCrypto.generate(5, rand(4).randbytes, "AES_CM_128_HMAC_SHA1_32")
    savp = parse_sdp(build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,)))
    audio = negotiate(savp, ("PCMU",))
    assert audio is not None and audio.proto == "RTP/SAVP"
    answer = build_answer(savp, audio, "198.51.100.4", 30000, 7, 1, crypto=key)
    media = parse_sdp(answer).media[0]
    assert media.proto == "RTP/SAVP" and media.crypto == (key,)
    # best effort (RTP/AVP with a=crypto): answered in RTP/AVP, with or without a key
    best_effort = parse_sdp(build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,), proto="RTP/AVP"))
    audio = negotiate(best_effort, ("PCMU",))
    assert audio is not None and (audio.proto, audio.crypto) == ("RTP/AVP", (key,))
    keyed = parse_sdp(build_answer(best_effort, audio, "198.51.100.4", 30000, 7, 1, crypto=key))
    assert (keyed.media[0].proto, keyed.media[0].crypto) == ("RTP/AVP", (key,))
    plain = build_answer(best_effort, audio, "198.51.100.4", 30000, 7, 1)
    assert "RTP/AVP" in plain and "a=crypto" not in plain


def test_negotiate_takes_savp_and_keeps_its_keys() -> None:
    key = SdesCrypto.generate(1, rand(5).randbytes)
    audio = negotiate(parse_sdp(build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,))), ("PCMU",))
    assert audio is not None
    assert (audio.proto, audio.crypto, audio.codec) == ("RTP/SAVP", (key,), "PCMU")


def _audio(proto: str, keyed: bool) -> NegotiatedAudio:
    key = SdesCrypto.generate(1, rand(6).randbytes)
    sdp = build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,) if keyed else (), proto=proto)
    audio = negotiate(parse_sdp(sdp), ("PCMU",))
    assert audio is not None
    return audio


@pytest.mark.parametrize(
    ("proto", "keyed", "transport", "srtp", "why"),
    [
        ("RTP/SAVP", True, "TLS", "offer", None),
        ("RTP/SAVP", True, "TLS", "require", None),
        ("RTP/AVP", True, "TLS", "offer", None),  # best effort: taken
        ("RTP/AVP", True, "TLS", "off", None),  # best effort: answered plain
        ("RTP/AVP", False, "TLS", "offer", None),
        ("RTP/AVP", False, "UDP", "off", None),
        ("RTP/SAVP", True, "UDP", "offer", "SDES keys (a=crypto) are taken over TLS only"),
        ("RTP/AVP", True, "TCP", "off", "SDES keys (a=crypto) are taken over TLS only"),
        ("RTP/SAVP", False, "TLS", "offer", "RTP/SAVP without a supported crypto suite"),
        ("RTP/SAVP", True, "TLS", "off", "SRTP is off here"),
        ("RTP/AVP", False, "TLS", "require", "SRTP is required here"),
    ],
)
def test_srtp_refusal_takes_sdes_only_over_tls_and_as_the_mode_says(
    proto: str, keyed: bool, transport: str, srtp: str, why: str | None
) -> None:
    assert srtp_refusal(_audio(proto, keyed), transport, srtp) == why


def _sdes_offer(
    proto: str = "RTP/SAVP", keyed: bool = True, direction: str = "sendrecv", seed: int = 8
) -> str:
    key = SdesCrypto.generate(3, rand(seed).randbytes)
    return build_offer(
        "127.0.0.1", 30000, 11, 1, crypto=(key,) if keyed else (), proto=proto,
        direction=direction,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("transport", "srtp", "proto", "keyed", "status"),
    [
        ("TLS", "offer", "RTP/SAVP", True, None),
        ("UDP", "off", "RTP/SAVP", True, "488"),
        ("TCP", "off", "RTP/AVP", True, "488"),
        ("TLS", "off", "RTP/SAVP", True, "488"),
        ("TLS", "require", "RTP/AVP", False, "488"),
    ],
)
def test_the_user_agent_answers_an_srtp_mismatch_with_488_and_counts_it(
    transport: str, srtp: str, proto: str, keyed: bool, status: str | None
) -> None:
    b = replace(BASE, local_port=5060, transport=transport, security=SipSecurity(srtp=srtp))
    sim, a, _b = make(b=b)
    a.invite(B_URI, A_URI, _sdes_offer(proto, keyed), B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    offered = [e for e in sim.take(B_ADDR) if isinstance(e, CallOffered)]
    finals = [m for m in sim.wire if m.startswith(b"SIP/2.0 4")]
    if status is None:
        assert len(offered) == 1 and finals == []
        assert not _b.take_refusals()
    else:
        assert offered == [] and finals[0].startswith(b"SIP/2.0 488 Not Acceptable Here\r\n")
        assert b"\r\nWarning: 399 callbridge " in finals[0]
        assert _b.take_refusals() == {"srtp_mismatch": 1}


def test_a_reinvite_of_an_srtp_call_keeps_our_key_and_cannot_drop_srtp() -> None:
    b = replace(BASE, local_port=5060, transport="TLS", security=SipSecurity(srtp="require"))
    sim, a, ua_b = make(b=b)
    call_id = a.invite(B_URI, A_URI, _sdes_offer(), B_ADDR, sim.now)
    sim.run_until(sim.now + 0.01)
    (offered,) = [e for e in sim.take(B_ADDR) if isinstance(e, CallOffered)]
    offer_sdp = parse_sdp(offered.offer_sdp)
    audio = negotiate(offer_sdp, ("PCMU",))
    assert audio is not None
    ours = choose_crypto(audio.crypto, rand(9).randbytes)
    assert ours is not None
    answer = build_answer(offer_sdp, audio, "127.0.0.1", 40000, 22, 1, crypto=ours)
    ua_b.answer(offered.call_id, answer, sim.now)
    sim.run_until(sim.now + 0.01)
    answers: list[str] = []
    original_send = ua_b._send

    def spy(message: object, peer: object) -> None:
        if isinstance(message, SipResponse):
            answers.append(f"{message.status} {message.body.decode()}")
        original_send(message, peer)  # type: ignore[arg-type]

    ua_b._send = spy  # type: ignore[method-assign]
    a.reinvite(call_id, _sdes_offer(direction="sendonly"), sim.now)
    sim.run_until(sim.now + 0.01)
    status, _, body = answers[-1].partition(" ")
    held = parse_sdp(body).media[0]
    assert status == "200" and held.direction == "recvonly"
    assert held.crypto == (ours,) and held.proto == "RTP/SAVP"
    assert not [e for e in sim.take(B_ADDR) if isinstance(e, SrtpKeyChanged)]  # same key
    # the peer re-keys (RFC 4568 §7.1.4): reported; our answer keeps our key
    rekeyed = _sdes_offer(seed=99)
    a.reinvite(call_id, rekeyed, sim.now)
    sim.run_until(sim.now + 0.01)
    [new_key] = parse_sdp(rekeyed).media[0].crypto
    changed = [e for e in sim.take(B_ADDR) if isinstance(e, SrtpKeyChanged)]
    assert changed == [SrtpKeyChanged(call_id, new_key)]
    assert parse_sdp(answers[-1].partition(" ")[2]).media[0].crypto == (ours,)
    a.reinvite(call_id, _sdes_offer("RTP/AVP", keyed=False), sim.now)
    sim.run_until(sim.now + 0.01)
    assert answers[-1].startswith("488 ")


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


def test_the_events_that_carry_sdp_keep_it_out_of_their_repr() -> None:
    key = SdesCrypto.generate(1, rand(10).randbytes)
    sdp = build_offer("192.0.2.1", 4000, 1, 1, crypto=(key,))
    secret = key.to_attribute().split("inline:")[1]
    offered = CallOffered("c", "sip:a@x", "sip:b@y", sdp, ("192.0.2.1", 5061), "sips:b@y")
    events = (offered, OutboundCallAnswered("c", sdp), CallEstablished("c", sdp))
    for event in events:
        assert secret not in repr(event)
    assert offered.offer_sdp == sdp  # still there to be read


def test_a_context_rekeyed_for_the_peer_unprotects_its_new_key_and_keeps_ours() -> None:
    ours, theirs, new = (SdesCrypto.generate(1, rand(n).randbytes) for n in (20, 21, 22))
    us, peer = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
    packet = build_rtp(0, 1, 160, 0x42, b"\x7f" * 160, False)
    assert us.unprotect(peer.protect(packet)) == packet
    us.rekey_remote(new)
    rekeyed_peer = SrtpContext(new, ours)
    later = build_rtp(0, 2, 320, 0x42, b"\x7f" * 160, False)
    assert us.unprotect(rekeyed_peer.protect(later)) == later
    with pytest.raises(ValueError):
        us.unprotect(peer.protect(build_rtp(0, 3, 480, 0x42, b"\x7f" * 160, False)))
    assert peer.unprotect(us.protect(packet)) == packet  # ours unchanged

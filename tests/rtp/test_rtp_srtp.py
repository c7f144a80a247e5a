"""SDES a=crypto parse/build and SRTP/SRTCP round trips over libsrtp."""

from __future__ import annotations

import gc
import random
import threading
from typing import Any

import pylibsrtp
import pytest

import bridge.rtp.srtp as srtp_module
from bridge.rtp.packet import RtcpReceiverReport, build_rtp, parse_rtcp, serialize_rtcp
from bridge.rtp.session import RtpFrame, RtpSession, RtpSessionConfig
from bridge.rtp.srtp import SdesCrypto, SrtpContext
from bridge.sip.sdp import SDES_SUITES

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


# --- the direct libsrtp path against pylibsrtp's own Session -------------------------


PYLIBSRTP_PROFILES = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}


def suite_key(seed: int, suite: str) -> SdesCrypto:
    return SdesCrypto.generate(1, random.Random(seed).randbytes, suite)


def reference(crypto: SdesCrypto, ssrc_type: int) -> pylibsrtp.Session:
    """pylibsrtp's own session with the same key: what SrtpContext must agree with."""
    policy = pylibsrtp.Policy(
        key=crypto.key_salt, ssrc_type=ssrc_type, srtp_profile=PYLIBSRTP_PROFILES[crypto.suite]
    )
    return pylibsrtp.Session(policy=policy)


def g711(seq: int, ssrc: int = 0x5EED) -> bytes:
    return build_rtp(0, seq & 0xFFFF, seq * 160, ssrc, bytes([seq & 0xFF]) * 160, seq == 0)


@pytest.mark.parametrize("suite", SDES_SUITES)
def test_protect_matches_pylibsrtp_and_round_trips(suite: str) -> None:
    ours, theirs = suite_key(11, suite), suite_key(12, suite)
    sender, receiver = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
    ref_tx = reference(ours, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
    ref_rx = reference(ours, pylibsrtp.Policy.SSRC_ANY_INBOUND)
    tag = 10 if suite.endswith("_80") else 4
    packets = [g711(seq) for seq in range(40)] + [g711(seq, 0xBEEF) for seq in range(3)]
    for packet in packets:
        protected = sender.protect(packet)
        assert protected == ref_tx.protect(packet)  # the same ciphertext and tag
        assert len(protected) == len(packet) + tag
        assert receiver.unprotect(protected) == packet
        assert ref_rx.unprotect(protected) == packet  # pylibsrtp reads ours
    # and ours reads pylibsrtp's
    theirs_rx = SrtpContext(theirs, ours)
    ref_tx2 = reference(ours, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
    assert [theirs_rx.unprotect(ref_tx2.protect(p)) for p in packets] == packets


@pytest.mark.parametrize("suite", SDES_SUITES)
def test_rtcp_matches_pylibsrtp(suite: str) -> None:
    ours, theirs = suite_key(21, suite), suite_key(22, suite)
    sender, receiver = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
    ref_tx = reference(ours, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
    for n in range(3):
        rtcp = serialize_rtcp([RtcpReceiverReport(0x5EED + n)])
        protected = sender.protect_rtcp(rtcp)
        assert protected == ref_tx.protect_rtcp(rtcp)
        assert receiver.unprotect_rtcp(protected) == rtcp
    with pytest.raises(ValueError, match="SRTCP unprotect failed: replay check failed"):
        receiver.unprotect_rtcp(protected)
    tampered = bytearray(sender.protect_rtcp(rtcp))
    tampered[-1] ^= 1
    with pytest.raises(ValueError, match="SRTCP unprotect failed: authentication failure"):
        receiver.unprotect_rtcp(bytes(tampered))


@pytest.mark.parametrize("suite", SDES_SUITES)
def test_tampered_tag_replay_and_wrong_key_raise_like_pylibsrtp(suite: str) -> None:
    ours, theirs = suite_key(31, suite), suite_key(32, suite)
    sender, receiver = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
    ref_rx = reference(ours, pylibsrtp.Policy.SSRC_ANY_INBOUND)
    first = sender.protect(g711(1))
    assert receiver.unprotect(first) == ref_rx.unprotect(first) == g711(1)
    with pytest.raises(ValueError, match="SRTP unprotect failed: replay check failed"):
        receiver.unprotect(first)
    with pytest.raises(pylibsrtp.Error, match="replay check failed"):
        ref_rx.unprotect(first)
    tampered = bytearray(sender.protect(g711(2)))
    tampered[-1] ^= 0x80  # the tag
    with pytest.raises(ValueError, match="SRTP unprotect failed: authentication failure"):
        receiver.unprotect(bytes(tampered))
    with pytest.raises(pylibsrtp.Error, match="authentication failure"):
        ref_rx.unprotect(bytes(tampered))
    # the failed packet left the session as it was: the genuine one still opens
    tampered[-1] ^= 0x80
    assert receiver.unprotect(bytes(tampered)) == g711(2)
    with pytest.raises(ValueError, match="SRTP protect failed"):
        sender.protect(g711(2))  # the same sequence number twice
    with pytest.raises(ValueError, match="SRTP unprotect failed"):
        receiver.unprotect(g711(3)[:8])  # not even an RTP header
    with pytest.raises(ValueError, match="too long"):
        sender.protect(build_rtp(0, 4, 640, 0x5EED, bytes(1400), False))


def test_rekey_remote_starts_a_new_session() -> None:
    alice, bob, bob2 = key(41), key(42), key(43)
    a, b = SrtpContext(alice, bob), SrtpContext(bob, alice)
    a.rekey_remote(bob2)
    b2 = SrtpContext(bob2, alice)
    with pytest.raises(ValueError, match="authentication failure"):
        a.unprotect(b.protect(g711(1)))  # the old key no longer opens
    assert a.unprotect(b2.protect(g711(2))) == g711(2)
    assert b.unprotect(a.protect(g711(3))) == g711(3)  # ours unchanged


class _GcSpy:
    """``ffi`` with ``gc`` counting what its destructors free (the rest is the real one)."""

    def __init__(self, ffi: Any, freed: list[object]) -> None:
        self._ffi, self._freed = ffi, freed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ffi, name)

    def gc(self, cdata: Any, destructor: Any) -> Any:
        def counting(pointer: Any) -> Any:
            self._freed.append(pointer)
            return destructor(pointer)

        return self._ffi.gc(cdata, counting)


def test_threads_have_their_own_buffer() -> None:
    """Every context made on a thread goes through one buffer (``_scratch``); cffi releases
    the GIL during the libsrtp call, so another thread's contexts must use another."""
    seen: dict[str, object] = {}
    results: dict[str, bool] = {}

    def run(name: str, seed: int) -> None:
        ours, theirs = suite_key(seed, SDES_SUITES[0]), suite_key(seed + 1, SDES_SUITES[0])
        sender, receiver = SrtpContext(ours, theirs), SrtpContext(theirs, ours)
        ref_tx = reference(ours, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        ok = True
        for seq in range(3000):
            packet = g711(seq, seed)
            protected = sender.protect(packet)
            ok = ok and protected == ref_tx.protect(packet)
            ok = ok and receiver.unprotect(protected) == packet
        # the same buffer (compiled, the tuple itself is boxed afresh on each read)
        assert all(a is b for a, b in zip(sender._scratch, receiver._scratch, strict=True))
        seen[name] = sender._scratch[0]
        results[name] = ok

    threads = [threading.Thread(target=run, args=(f"t{i}", 100 + 10 * i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"t0": True, "t1": True}
    assert seen["t0"] is not seen["t1"]


def test_sessions_are_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each libsrtp session goes with its context, or when re-keying replaces it
    (``srtp_dealloc`` through ``ffi.gc``)."""
    freed: list[object] = []
    monkeypatch.setattr(srtp_module, "_ffi", _GcSpy(srtp_module._ffi, freed))
    context, peer = SrtpContext(key(51), key(52)), SrtpContext(key(53), key(51))
    context.rekey_remote(key(53))
    gc.collect()
    assert len(freed) == 1  # the first receive session, replaced
    assert context.unprotect(peer.protect(g711(1))) == g711(1)  # the new one works
    del context
    gc.collect()
    assert len(freed) == 3  # its two
    del peer
    gc.collect()
    assert len(freed) == 5

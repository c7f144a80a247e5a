"""SRTP with SDES key exchange (RFC 4568 ``a=crypto``, RFC 3711) over libsrtp.

Theory of operation
-------------------
The suites are ``AES_CM_128_HMAC_SHA1_80`` (mandatory) and ``_32``: a
16-byte master key and a 14-byte master salt, sent base64'd in the SDP as
``a=crypto:<tag> <suite> inline:<key||salt>`` with an optional
``|lifetime`` (accepted, libsrtp's own limit applies) and no MKI (rejected:
nothing here needs several keys).

The attribute itself is ``bridge.sip.sdp.SdesCrypto`` (re-exported here):
``parse`` reads one (with or without ``a=`` / ``crypto:``) and raises
``SdpError`` (a ``ValueError``) naming what is wrong; ``to_attribute()``
writes it; ``generate(tag, random_bytes)`` makes our own key (the shell
passes ``secrets.token_bytes``). The key is never in its ``repr``.

``SrtpContext(local, remote)`` holds two libsrtp sessions: one protecting
what we send with our key, one unprotecting what arrives with the peer's
key (any SSRC). ``unprotect`` verifies the authentication tag and the replay
window and raises ``ValueError`` on failure: the shell must unprotect a
datagram *before* handing it to ``RtpSession.receive_datagram``, so a forged
packet can neither latch nor reach the jitter buffer (reliability notes §2.3
rule 7).
"""

from __future__ import annotations

from typing import Final

import pylibsrtp

from bridge.sip.sdp import SDES_SUITES, SdesCrypto

__all__ = ["SRTP_SUITE", "SdesCrypto", "SrtpContext"]

SRTP_SUITE: Final = SDES_SUITES[0]
_PROFILES: Final = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}


class SrtpContext:
    """Protect outbound and unprotect inbound RTP/RTCP of one call leg."""

    __slots__ = ("_rx", "_tx")

    def __init__(self, local: SdesCrypto, remote: SdesCrypto) -> None:
        """``local`` protects what we send, ``remote`` unprotects what arrives (the
        two attributes of one offer/answer: the same suite, two keys)."""
        self._tx = pylibsrtp.Session(policy=_policy(local, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
        self._rx = pylibsrtp.Session(policy=_policy(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND))

    def rekey_remote(self, remote: SdesCrypto) -> None:
        """The peer's re-offer brought a new key (RFC 4568 §7.1.4): unprotect with it
        from now on (a new session: a new replay window too); ours stays."""
        self._rx = pylibsrtp.Session(policy=_policy(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND))

    def protect(self, rtp: bytes) -> bytes:
        """Encrypt and authenticate one RTP packet.

        Raises:
            ValueError: libsrtp refused (a sequence number protected twice,
                a packet that is not RTP).
        """
        try:
            return bytes(self._tx.protect(rtp))
        except pylibsrtp.Error as exc:
            raise ValueError(f"SRTP protect failed: {exc}") from None

    def protect_rtcp(self, rtcp: bytes) -> bytes:
        """Encrypt and authenticate one (compound) RTCP packet.

        Raises:
            ValueError: libsrtp refused the packet.
        """
        try:
            return bytes(self._tx.protect_rtcp(rtcp))
        except pylibsrtp.Error as exc:
            raise ValueError(f"SRTCP protect failed: {exc}") from None

    def unprotect(self, srtp: bytes) -> bytes:
        """Verify and decrypt one SRTP packet.

        Raises:
            ValueError: authentication failed, replayed, or malformed.
        """
        try:
            return bytes(self._rx.unprotect(srtp))
        except pylibsrtp.Error as exc:
            raise ValueError(f"SRTP unprotect failed: {exc}") from None

    def unprotect_rtcp(self, srtcp: bytes) -> bytes:
        """Verify and decrypt one SRTCP packet.

        Raises:
            ValueError: authentication failed, replayed, or malformed.
        """
        try:
            return bytes(self._rx.unprotect_rtcp(srtcp))
        except pylibsrtp.Error as exc:
            raise ValueError(f"SRTCP unprotect failed: {exc}") from None


def _policy(crypto: SdesCrypto, ssrc_type: int) -> pylibsrtp.Policy:
    return pylibsrtp.Policy(
        key=crypto.key_salt,
        ssrc_type=ssrc_type,
        srtp_profile=_PROFILES[crypto.suite],
    )

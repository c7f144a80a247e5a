"""SRTP with SDES key exchange (RFC 4568 ``a=crypto``, RFC 3711) over libsrtp.

Theory of operation
-------------------
Only the mandatory suite ``AES_CM_128_HMAC_SHA1_80`` is offered and
accepted: a 16-byte master key and a 14-byte master salt, sent base64'd in
the SDP as ``a=crypto:<tag> AES_CM_128_HMAC_SHA1_80 inline:<key||salt>``
with an optional ``|lifetime`` (accepted, libsrtp's own limit applies) and
no MKI (rejected: nothing here needs several keys).

``SdesCrypto.parse`` reads one attribute (with or without ``a=`` /
``crypto:``) and raises ``ValueError`` naming what is wrong;
``SdesCrypto.to_attribute()`` writes it. ``SdesCrypto.generate(tag,
random_bytes)`` makes our own key; the shell passes ``secrets.token_bytes``.

``SrtpContext(local, remote)`` holds two libsrtp sessions: one protecting
what we send with our key, one unprotecting what arrives with the peer's
key (any SSRC). ``unprotect`` verifies the authentication tag and the replay
window and raises ``ValueError`` on failure: the shell must unprotect a
datagram *before* handing it to ``RtpSession.receive_datagram``, so a forged
packet can neither latch nor reach the jitter buffer (reliability notes §2.3
rule 7).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pylibsrtp

__all__ = ["SRTP_SUITE", "SdesCrypto", "SrtpContext"]

SRTP_SUITE: Final = "AES_CM_128_HMAC_SHA1_80"
_KEY_SALT_BYTES: Final = 30  # 16-byte master key + 14-byte master salt


@dataclass(frozen=True, slots=True)
class SdesCrypto:
    """One ``a=crypto`` attribute of the suite AES_CM_128_HMAC_SHA1_80."""

    tag: int
    key_salt: bytes
    lifetime: str | None = None
    suite: str = SRTP_SUITE

    @classmethod
    def generate(cls, tag: int, random_bytes: Callable[[int], bytes]) -> SdesCrypto:
        """A fresh key for our side (``random_bytes`` = ``secrets.token_bytes``)."""
        return cls(tag, random_bytes(_KEY_SALT_BYTES))

    @classmethod
    def parse(cls, attribute: str) -> SdesCrypto:
        """Parse ``a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:KEY[|lifetime]``.

        Raises:
            ValueError: malformed attribute, another suite, a key that is not
                30 bytes of base64, an MKI, or several keys.
        """
        text = attribute.strip().removeprefix("a=").removeprefix("crypto:")
        fields = text.split()
        if len(fields) < 3:
            raise ValueError(f"crypto attribute needs tag, suite and key params: {attribute!r}")
        tag_text, suite, key_params = fields[:3]
        if not (tag_text.isascii() and tag_text.isdigit()) or len(tag_text) > 9:
            raise ValueError(f"crypto tag must be 1-9 digits, got {tag_text!r}")
        if suite != SRTP_SUITE:
            raise ValueError(f"unsupported crypto suite {suite}, only {SRTP_SUITE}")
        if ";" in key_params:
            raise ValueError("several crypto keys (';') are not supported")
        method, _, key_info = key_params.partition(":")
        if method != "inline":
            raise ValueError(f"crypto key method must be inline, got {method!r}")
        key_text, *params = key_info.split("|")
        try:
            key_salt = base64.b64decode(key_text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"crypto key is not base64: {key_text!r}") from None
        if len(key_salt) != _KEY_SALT_BYTES:
            raise ValueError(f"crypto key||salt is {len(key_salt)} bytes, {SRTP_SUITE} needs 30")
        lifetime = None
        for param in params:
            if ":" in param:
                raise ValueError("crypto MKI is not supported")
            lifetime = param
        return cls(int(tag_text), key_salt, lifetime)

    def to_attribute(self) -> str:
        """The SDP attribute value, without the ``a=`` prefix."""
        key = base64.b64encode(self.key_salt).decode("ascii")
        lifetime = f"|{self.lifetime}" if self.lifetime else ""
        return f"crypto:{self.tag} {self.suite} inline:{key}{lifetime}"


class SrtpContext:
    """Protect outbound and unprotect inbound RTP/RTCP of one call leg."""

    __slots__ = ("_rx", "_tx")

    def __init__(self, local: SdesCrypto, remote: SdesCrypto) -> None:
        self._tx = pylibsrtp.Session(policy=_policy(local, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
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
        srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    )

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

Each direction is one libsrtp session (``srtp_t``) called through
pylibsrtp's cffi binding (``pylibsrtp._binding``: ``ffi``, ``lib``) rather
than through ``pylibsrtp.Session``: a packet is one copy into a preallocated
buffer, one ``srtp_protect``/``srtp_unprotect`` call and one slice out
(``Session`` adds a type check, an ``int *`` allocated per packet, two method
calls and an error helper: about a third of the time, 2.6 against 1.7 µs per
protect + unprotect, ``bench/bench_srtp.py``). The session is created with
the policy ``pylibsrtp.Policy`` would set (the
suite's profile for RTP and RTCP, the master key and salt, any SSRC) and
freed by ``srtp_dealloc`` when its pointer is collected (``ffi.gc``); the
tests check the ciphertext against ``pylibsrtp.Session``'s. Errors are
pylibsrtp's: the same message table, raised as ``ValueError``.

The buffer and the length that libsrtp reads and writes are one pair per
thread, shared by every context made on that thread (``_scratch``), not a pair
per direction of each context. In the daemon a context's state is cold by the time its next
packet comes (20 ms and every other call's work later) and most of what
libsrtp costs there is waiting for memory (``bench/bench_srtp.py
--round-robin``: 1.7 µs per protect + unprotect when hot, 5-6 µs with 150-500
legs whose state was evicted to DRAM between packets, the stalls on the first
loads of libsrtp's and OpenSSL's per-session structures); a buffer shared by
all contexts is always warm, and each packet touches four fewer cold objects
(the buffer, its Python view, the length and its cdata): 0.5-0.7 µs less per
protect + unprotect in that bench with 150-500 legs evicted to DRAM, the same
when all is hot). Per thread
because cffi releases the GIL during the libsrtp call: two threads must not
share the buffer, so a context is used on the thread that made it (the
daemon's are made and used on the event loop's).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Final

import pylibsrtp

from bridge.sip.sdp import SDES_SUITES, SdesCrypto

__all__ = ["SRTP_SUITE", "SdesCrypto", "SrtpContext"]

# pylibsrtp's cffi binding has no type information: its ``ffi`` and ``lib`` (and every
# cdata made with them) are typed Any here
_binding: Any = importlib.import_module("pylibsrtp._binding")
_ffi: Any = _binding.ffi  # not Final: the tests watch its gc (sessions freed)
_lib: Final[Any] = _binding.lib
_srtp_protect: Final[Any] = _lib.srtp_protect
_srtp_unprotect: Final[Any] = _lib.srtp_unprotect
_srtp_protect_rtcp: Final[Any] = _lib.srtp_protect_rtcp
_srtp_unprotect_rtcp: Final[Any] = _lib.srtp_unprotect_rtcp

SRTP_SUITE: Final = SDES_SUITES[0]
_PROFILES: Final = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
_ERRORS: Final[list[str]] = list(pylibsrtp.ERRORS)  # srtp_err_status_t -> its text

_BUFFER: Final = 1500
"""Bytes of each session's buffer (as ``pylibsrtp.Session``'s): a packet and the trailer
libsrtp appends to it."""
_RTP_MAX: Final = _BUFFER - (16 + 128)
"""The longest RTP packet protected: room for SRTP_MAX_TRAILER_LEN (tag + MKI)."""
_RTCP_MAX: Final = _BUFFER - (4 + 16 + 128)
"""The longest RTCP packet protected: room for SRTP_MAX_SRTCP_TRAILER_LEN (index + tag + MKI)."""

_SCRATCH: Final = threading.local()
"""Each thread's ``(buffer, its Python view, int *)`` as ``.pair`` (``_scratch``)."""


def _scratch() -> tuple[Any, Any, Any]:
    """This thread's buffer (``char[_BUFFER]``), a Python buffer over it (slices in and
    out) and the ``int *`` libsrtp reads and writes the length through (cdata: Any);
    made for the thread's first context, shared by all its contexts."""
    try:
        pair: tuple[Any, Any, Any] = _SCRATCH.pair
    except AttributeError:
        buf = _ffi.new("char[]", _BUFFER)
        pair = (buf, _ffi.buffer(buf), _ffi.new("int *"))
        _SCRATCH.pair = pair
    return pair


class SrtpContext:
    """Protect outbound and unprotect inbound RTP/RTCP of one call leg."""

    __slots__ = ("_rx", "_scratch", "_tx")

    def __init__(self, local: SdesCrypto, remote: SdesCrypto) -> None:
        """``local`` protects what we send, ``remote`` unprotects what arrives (the
        two attributes of one offer/answer: the same suite, two keys)."""
        # cdata (Any): each direction's srtp_t
        self._tx: Any = _session(local, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        self._rx: Any = _session(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND)
        self._scratch = _scratch()  # the buffer of the thread that makes the context

    def rekey_remote(self, remote: SdesCrypto) -> None:
        """The peer's re-offer brought a new key (RFC 4568 §7.1.4): unprotect with it
        from now on (a new session: a new replay window too); ours stays."""
        self._rx = _session(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND)

    def protect(self, rtp: bytes) -> bytes:
        """Encrypt and authenticate one RTP packet.

        Raises:
            ValueError: libsrtp refused (a sequence number protected twice,
                a packet that is not RTP, one too long).
        """
        n = len(rtp)
        if n > _RTP_MAX:
            raise ValueError("SRTP protect failed: packet is too long")
        buf, out, length = self._scratch
        length[0] = n
        out[0:n] = rtp
        status = _srtp_protect(self._tx, buf, length)
        if status:
            raise ValueError(f"SRTP protect failed: {_error(status)}")
        result: bytes = out[0 : length[0]]
        return result

    def protect_rtcp(self, rtcp: bytes) -> bytes:
        """Encrypt and authenticate one (compound) RTCP packet.

        Raises:
            ValueError: libsrtp refused the packet.
        """
        n = len(rtcp)
        if n > _RTCP_MAX:
            raise ValueError("SRTCP protect failed: packet is too long")
        buf, out, length = self._scratch
        length[0] = n
        out[0:n] = rtcp
        status = _srtp_protect_rtcp(self._tx, buf, length)
        if status:
            raise ValueError(f"SRTCP protect failed: {_error(status)}")
        result: bytes = out[0 : length[0]]
        return result

    def unprotect(self, srtp: bytes) -> bytes:
        """Verify and decrypt one SRTP packet.

        Raises:
            ValueError: authentication failed, replayed, or malformed.
        """
        n = len(srtp)
        if n > _BUFFER:
            raise ValueError("SRTP unprotect failed: packet is too long")
        buf, out, length = self._scratch
        length[0] = n
        out[0:n] = srtp
        status = _srtp_unprotect(self._rx, buf, length)
        if status:
            raise ValueError(f"SRTP unprotect failed: {_error(status)}")
        result: bytes = out[0 : length[0]]
        return result

    def unprotect_rtcp(self, srtcp: bytes) -> bytes:
        """Verify and decrypt one SRTCP packet.

        Raises:
            ValueError: authentication failed, replayed, or malformed.
        """
        n = len(srtcp)
        if n > _BUFFER:
            raise ValueError("SRTCP unprotect failed: packet is too long")
        buf, out, length = self._scratch
        length[0] = n
        out[0:n] = srtcp
        status = _srtp_unprotect_rtcp(self._rx, buf, length)
        if status:
            raise ValueError(f"SRTCP unprotect failed: {_error(status)}")
        result: bytes = out[0 : length[0]]
        return result


def _error(status: int) -> str:
    return _ERRORS[status] if 0 <= status < len(_ERRORS) else f"libsrtp error {status}"


def _session(crypto: SdesCrypto, ssrc_type: int) -> Any:
    """A libsrtp session (``srtp_t``, cdata: Any) for one direction, with the policy
    ``pylibsrtp.Policy(key, ssrc_type, profile)`` sets; freed when collected."""
    profile = _PROFILES[crypto.suite]
    policy = _ffi.new("srtp_policy_t *")  # zeroed: no MKI, default window, no repeat tx
    _check(_lib.srtp_crypto_policy_set_from_profile_for_rtp(_ffi.addressof(policy.rtp), profile))
    _check(_lib.srtp_crypto_policy_set_from_profile_for_rtcp(_ffi.addressof(policy.rtcp), profile))
    need = _lib.srtp_profile_get_master_key_length(
        profile
    ) + _lib.srtp_profile_get_master_salt_length(profile)
    if len(crypto.key_salt) < need:
        raise ValueError(f"key must contain at least {need} bytes")
    size = len(crypto.key_salt)
    key = _ffi.new("unsigned char[]", crypto.key_salt)
    policy.key = key
    policy.ssrc.type = ssrc_type
    handle = _ffi.new("srtp_t *")
    status = _lib.srtp_create(handle, policy)
    # libsrtp has copied the key: wipe ours. This use of ``key`` also keeps its memory
    # alive until here: compiled (mypyc), a local is released after its last use, and
    # the policy only points at it
    _ffi.memmove(key, bytes(size), size)
    _check(status)
    return _ffi.gc(handle[0], _lib.srtp_dealloc)


def _check(status: int) -> None:
    if status != _lib.srtp_err_status_ok:
        raise ValueError(f"libsrtp: {_error(status)}")

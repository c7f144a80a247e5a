"""L16: 16-bit linear PCM in either byte order.

Theory of operation
-------------------
Internally every linear sample is signed 16-bit little-endian (s16le). RTP
L16 (RFC 3551 §4.5.11) is big-endian, network order; some media-stream
carriers send little-endian. Converting between the two swaps the two bytes
of every sample; the operation is its own inverse and stateless, so a chunk
must hold whole samples (stream code keeps a dangling odd byte itself).
"""

from __future__ import annotations

import numpy as np

__all__ = ["from_big_endian", "swap_bytes", "to_big_endian", "to_little_endian"]


def swap_bytes(pcm: bytes) -> bytes:
    """Swap the bytes of every 16-bit sample (s16le <-> s16be).

    Raises:
        ValueError: ``pcm`` has an odd number of bytes.
    """
    if len(pcm) % 2:
        raise ValueError(f"16-bit PCM must have an even number of bytes, got {len(pcm)}")
    return np.frombuffer(pcm, dtype=np.uint16).byteswap().tobytes()


def to_big_endian(pcm_s16le: bytes) -> bytes:
    """Convert s16le samples to s16be (network order, RTP L16)."""
    return swap_bytes(pcm_s16le)


def from_big_endian(pcm_s16be: bytes) -> bytes:
    """Convert s16be samples (network order, RTP L16) to s16le."""
    return swap_bytes(pcm_s16be)


def to_little_endian(pcm_s16be: bytes) -> bytes:
    """Alias of ``from_big_endian``: s16be in, s16le out."""
    return swap_bytes(pcm_s16be)

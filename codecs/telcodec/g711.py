"""G.711 mu-law (PCMU) and A-law (PCMA) encode and decode.

Theory of operation
-------------------
G.711 maps one 16-bit linear sample to one byte and back, sample by sample,
with no state. Nothing here is streaming: a chunk of any whole number of
samples can be converted independently of its neighbours.

* mu-law works on the 14-bit magnitude (``x >> 2``), clipped to 8159, biased
  by 33, and coded as a 3-bit segment (position of the leading one) plus a
  4-bit mantissa; the sign bit is 0x80 for positive and all eight bits are
  inverted on the wire. ``0xFF`` is +0, the silence byte.
* A-law works on 13 bits (``x >> 3``), negative values as ``-x - 1``, no
  bias; segments 0 and 1 share one step size; the sign bit is set for
  positive values and the even bits are inverted (XOR 0x55). ``0xD5`` (+8) is
  the silence byte; A-law has no exact zero.

The byte functions use the C implementation in ``audioop`` (stdlib up to
Python 3.12, the ``audioop-lts`` package from 3.13), which implements exactly
this sox-derived algorithm; the tests check every code point and every
16-bit input against the algorithm written out independently. ``audioop``
works in native byte order, so on a big-endian host the linear side is
byte-swapped around it. The numpy helpers use 256-entry decode and
65536-entry encode tables built once from the same functions.

Rules:

1. Linear audio is always signed 16-bit little-endian (``s16le``) bytes, or an
   ``int16`` numpy array for the ``*_array`` helpers.
2. Linear input of odd byte length is a caller error and raises ``ValueError``
   (stream code keeps dangling bytes itself; see ``telcodec.resample``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

with warnings.catch_warnings():
    # audioop is deprecated in 3.11-3.12; from 3.13 it comes from audioop-lts.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = [
    "ALAW_ENCODE_TABLE",
    "ALAW_SILENCE",
    "ULAW_ENCODE_TABLE",
    "ULAW_SILENCE",
    "alaw_decode",
    "alaw_decode_array",
    "alaw_encode",
    "alaw_encode_array",
    "alaw_to_ulaw",
    "native_decoder",
    "ulaw_decode",
    "ulaw_decode_array",
    "ulaw_encode",
    "ulaw_encode_array",
    "ulaw_to_alaw",
]

ULAW_SILENCE = 0xFF
"""mu-law code of +0 (``0x7F`` is -0)."""

ALAW_SILENCE = 0xD5
"""A-law code that ``alaw_encode`` produces for 0 (decodes to +8)."""

_SAMPLE_WIDTH_BYTES = 2
_NATIVE_IS_LE = sys.byteorder == "little"

Int16Array: TypeAlias = npt.NDArray[np.int16]


def _check_linear(pcm_s16le: bytes) -> None:
    if len(pcm_s16le) % _SAMPLE_WIDTH_BYTES:
        raise ValueError(f"s16le input must have an even number of bytes, got {len(pcm_s16le)}")


def _to_native(pcm_s16le: bytes) -> bytes:
    return pcm_s16le if _NATIVE_IS_LE else audioop.byteswap(pcm_s16le, _SAMPLE_WIDTH_BYTES)


def _from_native(pcm: bytes) -> bytes:
    return pcm if _NATIVE_IS_LE else audioop.byteswap(pcm, _SAMPLE_WIDTH_BYTES)


def ulaw_encode(pcm_s16le: bytes) -> bytes:
    """Encode s16le samples to mu-law, one byte per sample.

    Raises:
        ValueError: ``pcm_s16le`` has an odd number of bytes.
    """
    _check_linear(pcm_s16le)
    return audioop.lin2ulaw(_to_native(pcm_s16le), _SAMPLE_WIDTH_BYTES)


def ulaw_decode(data: bytes) -> bytes:
    """Decode mu-law bytes to s16le samples (two bytes out per byte in)."""
    if _NATIVE_IS_LE:  # every frame of a call goes through here: no second call
        return audioop.ulaw2lin(data, _SAMPLE_WIDTH_BYTES)
    return _from_native(audioop.ulaw2lin(data, _SAMPLE_WIDTH_BYTES))


def native_decoder(encoding: str) -> Callable[[bytes, int], bytes] | None:
    """``ulaw_decode``/``alaw_decode`` without their Python frame, for a per-frame path.

    The C decoder of ``"mulaw"`` or ``"alaw"``, to call as ``decode(data, 2)``,
    when its native output is s16le (little-endian hosts); ``None`` otherwise
    (another encoding, or a big-endian host: use the functions above).
    """
    if not _NATIVE_IS_LE:
        return None
    return {"mulaw": audioop.ulaw2lin, "alaw": audioop.alaw2lin}.get(encoding)


def alaw_encode(pcm_s16le: bytes) -> bytes:
    """Encode s16le samples to A-law, one byte per sample.

    Raises:
        ValueError: ``pcm_s16le`` has an odd number of bytes.
    """
    _check_linear(pcm_s16le)
    return audioop.lin2alaw(_to_native(pcm_s16le), _SAMPLE_WIDTH_BYTES)


def alaw_decode(data: bytes) -> bytes:
    """Decode A-law bytes to s16le samples (two bytes out per byte in)."""
    if _NATIVE_IS_LE:
        return audioop.alaw2lin(data, _SAMPLE_WIDTH_BYTES)
    return _from_native(audioop.alaw2lin(data, _SAMPLE_WIDTH_BYTES))


def _decode_table(decode: bytes) -> Int16Array:
    table = np.frombuffer(decode, dtype="<i2").astype(np.int16)
    table.setflags(write=False)
    return table


def _encode_table(encode: bytes) -> npt.NDArray[np.uint8]:
    table = np.frombuffer(encode, dtype=np.uint8).copy()
    table.setflags(write=False)
    return table


# Indexed by the code byte.
_ULAW_DECODE = _decode_table(ulaw_decode(bytes(range(256))))
_ALAW_DECODE = _decode_table(alaw_decode(bytes(range(256))))
# Indexed by the sample's two's complement bit pattern (the int16 viewed as uint16).
_EVERY_SAMPLE_S16LE = np.arange(65536, dtype="<u2").tobytes()
_ULAW_ENCODE = _encode_table(ulaw_encode(_EVERY_SAMPLE_S16LE))
_ALAW_ENCODE = _encode_table(alaw_encode(_EVERY_SAMPLE_S16LE))
del _EVERY_SAMPLE_S16LE
ULAW_ENCODE_TABLE: npt.NDArray[np.uint8] = _ULAW_ENCODE
"""Read-only: the mu-law code of every int16 sample, indexed by its bit pattern (uint16)."""
ALAW_ENCODE_TABLE: npt.NDArray[np.uint8] = _ALAW_ENCODE
"""Read-only: the A-law code of every int16 sample, indexed by its bit pattern (uint16)."""

# One-byte-to-one-byte transcoding tables for bytes.translate.
_ULAW_TO_ALAW = bytes(_ALAW_ENCODE[_ULAW_DECODE.view(np.uint16)])
_ALAW_TO_ULAW = bytes(_ULAW_ENCODE[_ALAW_DECODE.view(np.uint16)])


def ulaw_decode_array(data: bytes) -> Int16Array:
    """Decode mu-law bytes to a new ``int16`` array."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode_array(data: bytes) -> Int16Array:
    """Decode A-law bytes to a new ``int16`` array."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def ulaw_encode_array(samples: Int16Array) -> bytes:
    """Encode an ``int16`` array to mu-law bytes.

    Raises:
        TypeError: ``samples`` is not of dtype ``int16``.
    """
    return bytes(_ULAW_ENCODE[_as_uint16(samples)])


def alaw_encode_array(samples: Int16Array) -> bytes:
    """Encode an ``int16`` array to A-law bytes.

    Raises:
        TypeError: ``samples`` is not of dtype ``int16``.
    """
    return bytes(_ALAW_ENCODE[_as_uint16(samples)])


def _as_uint16(samples: Int16Array) -> npt.NDArray[np.uint16]:
    if samples.dtype != np.int16:
        raise TypeError(f"expected an int16 array, got {samples.dtype}")
    return samples.view(np.uint16)


def ulaw_to_alaw(data: bytes) -> bytes:
    """Transcode mu-law to A-law (decode then encode, via one 256-byte table)."""
    return data.translate(_ULAW_TO_ALAW)


def alaw_to_ulaw(data: bytes) -> bytes:
    """Transcode A-law to mu-law (decode then encode, via one 256-byte table)."""
    return data.translate(_ALAW_TO_ULAW)

"""L16 byte order."""

from __future__ import annotations

import struct

import pytest

from telcodec import l16


def test_swap_bytes_swaps_each_sample() -> None:
    assert l16.swap_bytes(b"\x01\x02\x03\x04") == b"\x02\x01\x04\x03"
    assert l16.swap_bytes(b"") == b""


def test_big_and_little_endian_agree_with_struct() -> None:
    samples = [0, 1, -1, 256, -256, 32767, -32768, 12345]
    le = struct.pack(f"<{len(samples)}h", *samples)
    be = struct.pack(f">{len(samples)}h", *samples)
    assert l16.to_big_endian(le) == be
    assert l16.from_big_endian(be) == le
    assert l16.to_little_endian(be) == le


def test_swap_is_an_involution() -> None:
    data = bytes(range(256)) * 4
    assert l16.swap_bytes(l16.swap_bytes(data)) == data


def test_odd_length_raises() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        l16.swap_bytes(b"\x00\x01\x02")

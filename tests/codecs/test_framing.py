"""FrameCutter: exact frames from arbitrary chunks."""

from __future__ import annotations

import random

import pytest

from telcodec.framing import FrameCutter


def _random_chunks(data: bytes, rng: random.Random, max_len: int) -> list[bytes]:
    chunks, i = [], 0
    while i < len(data):
        n = rng.randint(0, max_len)
        chunks.append(data[i : i + n])
        i += n
    return chunks


def test_default_frame_is_320_bytes() -> None:
    cutter = FrameCutter()
    assert cutter.frame_bytes == 320
    frames = cutter.push(bytes(range(256)) * 5)  # 1280 bytes = 4 frames
    assert [len(f) for f in frames] == [320] * 4
    assert cutter.pending_bytes == 0


def test_remainder_is_kept_and_completed_by_next_push() -> None:
    cutter = FrameCutter(160)
    assert cutter.push(b"a" * 100) == []
    assert cutter.pending_bytes == 100
    frames = cutter.push(b"b" * 250)
    assert frames == [b"a" * 100 + b"b" * 60, b"b" * 160]
    assert cutter.pending_bytes == 30
    assert all(type(f) is bytes for f in frames)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("frame_bytes", [160, 320])
def test_random_chunking_preserves_every_byte_in_order(seed: int, frame_bytes: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(20_011)
    cutter = FrameCutter(frame_bytes)
    out: list[bytes] = []
    for chunk in _random_chunks(data, rng, max_len=1000):
        out.extend(cutter.push(chunk))
    assert all(len(f) == frame_bytes for f in out)
    assert len(out) == len(data) // frame_bytes
    assert b"".join(out) == data[: len(out) * frame_bytes]
    assert cutter.pending_bytes == len(data) % frame_bytes
    last = cutter.flush(b"\xff")
    assert last is not None
    assert last == data[len(out) * frame_bytes :] + b"\xff" * (
        frame_bytes - len(data) % frame_bytes
    )


def test_byte_at_a_time() -> None:
    cutter = FrameCutter(4)
    out = [f for b in b"0123456789" for f in cutter.push(bytes([b]))]
    assert out == [b"0123", b"4567"]
    assert cutter.pending_bytes == 2


def test_flush_pads_with_repeated_pattern_and_empties() -> None:
    cutter = FrameCutter(8)
    cutter.push(b"xyz")
    assert cutter.flush(b"\x00\x01") == b"xyz\x00\x01\x00\x01\x00"
    assert cutter.pending_bytes == 0
    assert cutter.flush(b"\x00") is None


def test_flush_with_nothing_pending_returns_none() -> None:
    cutter = FrameCutter(160)
    assert cutter.push(b"\x01" * 320) == [b"\x01" * 160] * 2
    assert cutter.flush(b"\xd5") is None


def test_flush_rejects_empty_pad() -> None:
    cutter = FrameCutter(8)
    cutter.push(b"abc")
    with pytest.raises(ValueError):
        cutter.flush(b"")


def test_clear_drops_partial_frame() -> None:
    cutter = FrameCutter(160)
    cutter.push(b"o" * 200)
    cutter.clear()
    assert cutter.pending_bytes == 0
    assert cutter.push(b"n" * 160) == [b"n" * 160]


def test_accepts_bytearray_and_memoryview_and_returns_bytes() -> None:
    cutter = FrameCutter(2)
    frames = cutter.push(bytearray(b"abcd")) + cutter.push(memoryview(b"ef"))  # type: ignore[arg-type]
    assert frames == [b"ab", b"cd", b"ef"]
    assert all(type(f) is bytes for f in frames)


def test_invalid_frame_size() -> None:
    with pytest.raises(ValueError):
        FrameCutter(0)


def test_missing_bytes_is_what_completes_the_partial_frame() -> None:
    cutter = FrameCutter(160)
    assert cutter.missing_bytes == 160
    cutter.push(b"\x00" * 200)
    assert cutter.missing_bytes == 120

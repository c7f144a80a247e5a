"""G.711 against the algorithm written out from its definition (protocols.md §4.1/4.2).

The expected values are computed here, sample by sample, from the segment /
bias description of G.711 (the sox-derived form that telephony stacks use),
never from ``audioop``: every one of the 256 codes is decoded and every one of
the 65536 linear values is encoded.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from telcodec import g711

# --- reference implementation, from the definition ---------------------------

ULAW_SEGMENT_END = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)
ULAW_CLIP = 8159  # 14-bit magnitude clip (32635 on the 16-bit scale)
ULAW_BIAS = 33  # 132 on the 16-bit scale

ALAW_SEGMENT_END = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)


def _segment(value: int, ends: tuple[int, ...]) -> int:
    for seg, end in enumerate(ends):
        if value <= end:
            return seg
    return len(ends)


def ref_ulaw_encode(sample: int) -> int:
    magnitude = sample >> 2  # 14-bit
    if magnitude < 0:
        magnitude, sign_mask = -magnitude, 0x7F
    else:
        sign_mask = 0xFF
    magnitude = min(magnitude, ULAW_CLIP) + ULAW_BIAS
    seg = _segment(magnitude, ULAW_SEGMENT_END)
    if seg == 8:
        return 0x7F ^ sign_mask
    mantissa = (magnitude >> (seg + 1)) & 0x0F
    return ((seg << 4) | mantissa) ^ sign_mask


def ref_ulaw_decode(code: int) -> int:
    code = ~code & 0xFF
    seg = (code >> 4) & 0x07
    mantissa = code & 0x0F
    # Middle of the quantisation interval, ((2m + 33) << seg) - 33 on the 14-bit
    # scale (bias removed), then back on the 16-bit scale.
    magnitude_14 = ((2 * mantissa + ULAW_BIAS) << seg) - ULAW_BIAS
    magnitude = magnitude_14 * 4
    return -magnitude if code & 0x80 else magnitude


def ref_alaw_encode(sample: int) -> int:
    value = sample >> 3  # 13-bit
    if value >= 0:
        mask = 0xD5
    else:
        mask = 0x55
        value = -value - 1
    seg = _segment(value, ALAW_SEGMENT_END)
    if seg == 8:
        return 0x7F ^ mask
    shift = 1 if seg < 2 else seg
    return ((seg << 4) | ((value >> shift) & 0x0F)) ^ mask


def ref_alaw_decode(code: int) -> int:
    code ^= 0x55
    seg = (code >> 4) & 0x07
    mantissa = code & 0x0F
    # Middle of the quantisation interval on the 16-bit scale: segment 0 is
    # linear with step 16; segment s >= 1 starts at 256 << (s - 1), step 16 << (s - 1).
    magnitude = (2 * mantissa + 1) << 3 if seg == 0 else (2 * mantissa + 33) << (seg + 2)
    return magnitude if code & 0x80 else -magnitude


EVERY_SAMPLE = np.arange(-32768, 32768, dtype="<i2")
EVERY_CODE = bytes(range(256))


# --- decode: all 256 codes ---------------------------------------------------


def test_ulaw_decode_matches_definition_for_all_256_codes() -> None:
    expected = np.array([ref_ulaw_decode(c) for c in EVERY_CODE], dtype="<i2").tobytes()
    assert g711.ulaw_decode(EVERY_CODE) == expected


def test_alaw_decode_matches_definition_for_all_256_codes() -> None:
    expected = np.array([ref_alaw_decode(c) for c in EVERY_CODE], dtype="<i2").tobytes()
    assert g711.alaw_decode(EVERY_CODE) == expected


def test_decode_array_helpers_match_definition() -> None:
    ulaw = g711.ulaw_decode_array(EVERY_CODE)
    alaw = g711.alaw_decode_array(EVERY_CODE)
    assert ulaw.dtype == np.int16 and alaw.dtype == np.int16
    assert ulaw.tolist() == [ref_ulaw_decode(c) for c in EVERY_CODE]
    assert alaw.tolist() == [ref_alaw_decode(c) for c in EVERY_CODE]


# --- encode: all 65536 linear values -----------------------------------------


def test_ulaw_encode_matches_definition_for_all_65536_values() -> None:
    expected = bytes(ref_ulaw_encode(int(s)) for s in EVERY_SAMPLE)
    assert g711.ulaw_encode(EVERY_SAMPLE.tobytes()) == expected
    assert g711.ulaw_encode_array(EVERY_SAMPLE.astype(np.int16)) == expected


def test_alaw_encode_matches_definition_for_all_65536_values() -> None:
    expected = bytes(ref_alaw_encode(int(s)) for s in EVERY_SAMPLE)
    assert g711.alaw_encode(EVERY_SAMPLE.tobytes()) == expected
    assert g711.alaw_encode_array(EVERY_SAMPLE.astype(np.int16)) == expected


# --- landmarks and silence ---------------------------------------------------


def test_silence_constants() -> None:
    assert g711.ULAW_SILENCE == 0xFF
    assert g711.ALAW_SILENCE == 0xD5
    assert g711.ulaw_encode(b"\x00\x00" * 3) == b"\xff" * 3
    assert g711.alaw_encode(b"\x00\x00" * 3) == b"\xd5" * 3
    assert g711.ulaw_decode(b"\xff\x7f") == b"\x00\x00\x00\x00"  # +0 and -0
    assert g711.alaw_decode(b"\xd5\x55") == np.array([8, -8], "<i2").tobytes()


def test_full_scale_landmarks() -> None:
    extremes = np.array([32767, -32768], "<i2").tobytes()
    assert g711.ulaw_encode(extremes) == b"\x80\x00"
    assert g711.alaw_encode(extremes) == b"\xaa\x2a"
    assert g711.ulaw_decode(b"\x80\x00") == np.array([32124, -32124], "<i2").tobytes()
    assert g711.alaw_decode(b"\xaa\x2a") == np.array([32256, -32256], "<i2").tobytes()


# --- round trips -------------------------------------------------------------


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
)
def test_code_round_trip_is_identity(
    encode: Callable[[bytes], bytes], decode: Callable[[bytes], bytes]
) -> None:
    # decode then encode returns every code, except mu-law -0 (0x7F) which becomes +0.
    round_tripped = encode(decode(EVERY_CODE))
    differing = [c for c in EVERY_CODE if round_tripped[c] != c]
    assert differing in ([], [0x7F])
    if differing:
        assert round_tripped[0x7F] == 0xFF


def test_linear_round_trip_error_is_within_half_a_step() -> None:
    x = EVERY_SAMPLE.astype(np.int64)
    for encode, decode, max_step in (
        (g711.ulaw_encode, g711.ulaw_decode, 1024),
        (g711.alaw_encode, g711.alaw_decode, 1024),
    ):
        y = np.frombuffer(decode(encode(EVERY_SAMPLE.tobytes())), "<i2").astype(np.int64)
        inside = np.abs(x) < 32000  # beyond the top decision level the codec clips
        err = np.abs(y - x)[inside]
        assert err.max() <= max_step // 2 + 8
        # Relative error is small away from zero: the point of companding.
        big = np.abs(x) > 256
        rel = (np.abs(y - x)[big & inside]) / np.abs(x[big & inside])
        assert rel.max() < 0.07


def test_transcoding_tables_equal_decode_then_encode() -> None:
    assert g711.ulaw_to_alaw(EVERY_CODE) == g711.alaw_encode(g711.ulaw_decode(EVERY_CODE))
    assert g711.alaw_to_ulaw(EVERY_CODE) == g711.ulaw_encode(g711.alaw_decode(EVERY_CODE))
    assert g711.ulaw_to_alaw(bytes([g711.ULAW_SILENCE])) == bytes([g711.ALAW_SILENCE])


def test_odd_length_linear_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        g711.ulaw_encode(b"\x00\x00\x00")
    with pytest.raises(ValueError, match="even number of bytes"):
        g711.alaw_encode(b"\x00")


def test_encode_array_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError):
        g711.ulaw_encode_array(np.zeros(4, np.int32))


def test_empty_input() -> None:
    assert g711.ulaw_encode(b"") == b""
    assert g711.alaw_decode(b"") == b""
    assert g711.ulaw_decode_array(b"").size == 0


def test_native_decoder_decodes_as_the_functions_do() -> None:
    codes = bytes(range(256))
    for encoding, decode in (("mulaw", g711.ulaw_decode), ("alaw", g711.alaw_decode)):
        native = g711.native_decoder(encoding)
        if native is not None:  # little-endian hosts
            assert native(codes, 2) == decode(codes)
            assert native(b"", 2) == b""
    assert g711.native_decoder("pcm_s16le") is None

"""JitterBuffer on its own: extended sequence numbers in, playout order out."""

from __future__ import annotations

import pytest

from bridge.rtp.jitter import FrameLost, JitterBuffer, RtpFrame


def frame(ext: int) -> RtpFrame:
    return RtpFrame(bytes([ext & 0xFF]), ext & 0xFFFF, ext * 160, 0, False)


def test_extended_numbers_across_a_wrap_and_placeholders() -> None:
    jb = JitterBuffer(depth_frames=2, max_frames=8)
    for ext in (65535, 65537, 65536):
        jb.insert(ext, frame(ext), 0.0)
    jb.insert(65538, None, 0.0)  # telephone-event slot
    jb.insert(65540, frame(65540), 0.0)
    out = [jb.pop(0.02 * i) for i in range(7)]
    assert out == [
        frame(65535),
        frame(65536),
        frame(65537),
        None,
        FrameLost(65539 & 0xFFFF),
        frame(65540),
        None,
    ]
    assert (jb.frames_lost, jb.underruns) == (1, 1)


def test_flush_restarts_numbering() -> None:
    jb = JitterBuffer(depth_frames=1, max_frames=4)
    jb.insert(500, frame(500), 0.0)
    assert jb.pop(0.0) == frame(500)
    jb.flush()
    jb.insert(3, frame(3), 1.0)  # would be "late" without the flush
    assert jb.pop(1.0) == frame(3) and jb.dropped_late == 0


def test_parameters_validated() -> None:
    with pytest.raises(ValueError, match="depth_frames"):
        JitterBuffer(depth_frames=0)
    with pytest.raises(ValueError, match="max_frames"):
        JitterBuffer(depth_frames=5, max_frames=4)

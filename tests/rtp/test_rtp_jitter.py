"""JitterBuffer on its own: extended sequence numbers in, playout order out."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge.rtp.jitter import FrameLost, JitterBuffer, RtpFrame


def _pure_jitter() -> ModuleType:
    """``bridge/rtp/jitter.py`` loaded from its source, apart from the imported module.

    The module under test may be compiled (mypyc), and a compiled class cannot
    be subclassed by a test: the reference below subclasses this copy.
    """
    path = Path(bridge.__file__).parent / "rtp" / "jitter.py"
    spec = importlib.util.spec_from_file_location("_pure_bridge_rtp_jitter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


class _ScanTrimBuffer(_pure_jitter().JitterBuffer):  # type: ignore[misc]
    """The buffer with the original overflow trim (scan every held entry): the reference."""

    def _trim(self, buffer: dict[int, RtpFrame | None]) -> int:
        keep_from = self._highest - self._depth_frames + 1
        for ext in [e for e in buffer if e < keep_from]:
            del buffer[ext]
            self.dropped_overflow += 1
        self._next = min(buffer) if buffer else keep_from
        return self._next


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("run"), st.integers(1, 15), st.booleans()),
            st.tuples(st.just("insert"), st.integers(-5, 30), st.booleans()),
            st.tuples(st.just("jump"), st.integers(20, 5000), st.booleans()),
            st.tuples(st.just("pop"), st.integers(1, 3), st.just(False)),
        ),
        max_size=100,
    )
)
def test_overflow_trim_matches_the_full_scan(ops: list[tuple[str, int, bool]]) -> None:
    fast, ref = JitterBuffer(3, 10), _ScanTrimBuffer(3, 10)
    top = 0  # next number of a sequential run
    now = 0.0

    def insert(ext: int, placeholder: bool) -> None:
        item = None if placeholder or ext < 0 else frame(ext)
        fast.insert(max(ext, 0), item, now)
        ref.insert(max(ext, 0), item, now)

    for op, value, placeholder in ops:
        if op == "pop":
            for _ in range(value):
                now += 0.02
                assert fast.pop(now) == ref.pop(now)
        elif op == "run":  # a burst of in-order packets (a network stall released)
            for _ in range(value):
                insert(top, False)
                top += 1
        elif op == "insert":  # a reordered or duplicate one
            insert(top + value, placeholder)
        else:  # the source's numbering jumps ahead
            top += value
    for name in ("dropped_overflow", "dropped_late", "dropped_duplicate", "frames_lost"):
        assert getattr(fast, name) == getattr(ref, name)


def test_arrivals_are_taken_on_the_tick_they_arrive_two_ticks_before_playout() -> None:
    """The barge-in detector's input: a steady stream, one packet per tick, reaches
    ``take_arrived`` on the tick it arrives, and ``pop`` two ticks later (depth 3)."""
    jb = JitterBuffer(depth_frames=3, max_frames=10, keep_arrivals=True)
    arrived_at: dict[int, int] = {}
    played_at: dict[int, int] = {}
    for tick in range(8):
        now = 0.02 * tick
        jb.insert(100 + tick, frame(100 + tick), now - 0.005)
        for f in jb.take_arrived():
            arrived_at[f.sequence_number] = tick
        out = jb.pop(now)
        if isinstance(out, RtpFrame):
            played_at[out.sequence_number] = tick
    assert arrived_at == {100 + t: t for t in range(8)}
    assert played_at == {100 + t: t + 2 for t in range(6)}


def test_arrivals_skip_late_duplicate_and_placeholder_entries_and_keep_reordering() -> None:
    jb = JitterBuffer(depth_frames=1, max_frames=8, keep_arrivals=True)
    jb.insert(10, frame(10), 0.0)
    assert jb.pop(0.0) == frame(10) and jb.take_arrived() == [frame(10)]
    jb.insert(12, frame(12), 0.01)
    jb.insert(11, frame(11), 0.01)  # reordered: both kept, in the order they came
    jb.insert(12, frame(12), 0.01)  # duplicate of a held one
    jb.insert(10, frame(10), 0.01)  # late: already played
    jb.insert(13, None, 0.01)  # a telephone-event placeholder
    assert jb.take_arrived() == [frame(12), frame(11)]
    assert jb.take_arrived() == []
    assert (jb.dropped_duplicate, jb.dropped_late) == (1, 1)


def test_arrivals_are_not_kept_unless_asked_for() -> None:
    jb = JitterBuffer(depth_frames=1, max_frames=4)
    for ext in range(20):
        jb.insert(ext, frame(ext), 0.0)
        jb.pop(0.0)
    assert jb.take_arrived() == []


def test_a_burst_keeps_only_the_newest_max_frames_arrivals() -> None:
    """A stall's backlog (or a flooding peer) costs the detector at most ``max_frames``
    frames per take, the newest."""
    jb = JitterBuffer(depth_frames=2, max_frames=4, keep_arrivals=True)
    for ext in range(10):
        jb.insert(ext, frame(ext), 0.0)
    assert jb.take_arrived() == [frame(ext) for ext in range(6, 10)]

"""The media-stream leg hands the caller's audio to the call in whole 20 ms frames.

A carrier's ``media`` payload is usually exactly one frame; the leg then
passes it on as it is, and only a payload of another size goes through the
``FrameCutter``. Either way the call sees the same frames in the same order.
"""

from __future__ import annotations

from bridge.io.streams_leg import _Stream
from bridge.streams.base import AudioReceived
from telcodec.framing import FrameCutter


class _Call:
    finished = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def caller_audio(self, frame: bytes) -> None:
        self.frames.append(frame)


def _stream() -> tuple[_Stream, _Call]:
    stream = object.__new__(_Stream)  # only what the audio path reads
    call = _Call()
    stream.call = call  # type: ignore[assignment]
    stream.cutter = FrameCutter(160)
    return stream, call


def test_whole_frames_pass_as_they_are_and_other_sizes_are_cut() -> None:
    stream, call = _stream()
    whole = bytes(range(160))
    stream._on_audio(whole)
    assert call.frames == [whole] and call.frames[0] is whole
    audio = bytes(i % 251 for i in range(800))
    for piece in (audio[:100], audio[100:260], audio[260:420], audio[420:800]):
        stream._on_audio(piece)  # 100 B held, then whole-sized pieces that are not aligned
    assert call.frames[1:] == [audio[i : i + 160] for i in range(0, 800, 160)]
    assert stream.cutter is not None and stream.cutter.pending_bytes == 0
    stream._on_audio(whole)  # aligned again: passed as it is
    assert call.frames[-1] is whole and len(call.frames) == 7


def test_audio_before_the_call_started_is_dropped() -> None:
    stream, call = _stream()
    stream.call = None
    stream._on_event(AudioReceived(bytes(160), "mulaw", 8000, 20, 1))
    assert call.frames == []

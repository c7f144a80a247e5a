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
    stream.preempt = lambda: None
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


class _Loop:
    def time(self) -> float:
        return 1.0


def test_messages_reach_the_call_taken_or_through_the_engine_events() -> None:
    import base64
    import json

    from bridge.streams.twilio import TwilioStreamProtocol

    sid = "MZ18ad3ab5a668481ce02b83e7395059f0"
    engine = TwilioStreamProtocol()
    engine.connection_made(0.0)
    engine.receive_text(
        json.dumps(
            {
                "event": "start",
                "sequenceNumber": "1",
                "streamSid": sid,
                "start": {"streamSid": sid, "accountSid": "AC1", "callSid": "CA1"},
            }
        ),
        0.0,
    )
    engine.actions_to_send()
    engine.events_received()
    stream, call = _stream()
    stream.engine, stream.loop, stream.timer = engine, _Loop(), None  # type: ignore[assignment]
    pumped: list[int] = []
    real_pump = stream.pump

    def pump() -> None:
        pumped.append(1)
        real_pump()

    stream.pump = pump  # type: ignore[method-assign]

    def media(seq: int, audio: bytes) -> str:
        payload = base64.b64encode(audio).decode()
        return (
            f'{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound",'
            f'"chunk":"{seq}","timestamp":"{20 * seq}","payload":"{payload}"}},'
            f'"streamSid":"{sid}"}}'
        )

    frames = [bytes([n]) * 160 for n in range(4)]
    stream._on_message(media(2, frames[0]))  # plain: taken, no pump
    stream._on_message(media(3, frames[1]))
    assert call.frames == frames[:2] and pumped == []
    stream._on_message(media(5, frames[2]))  # a gap: the engine's events, pumped
    assert call.frames == frames[:3] and pumped == [1]
    stream._on_message(media(6, frames[3]))  # back in sequence: taken again
    assert call.frames == frames and pumped == [1]
    # every message, taken or through the engine, first gives the ticker a preemption point
    stream.preempt = lambda: call.frames.append(b"preempt")  # type: ignore[method-assign]
    stream._on_message(media(7, frames[0]))
    stream._on_message(media(9, frames[1]))
    assert call.frames[4:] == [b"preempt", frames[0], b"preempt", frames[1]] and pumped == [1, 1]

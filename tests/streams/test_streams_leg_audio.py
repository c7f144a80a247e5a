"""The media-stream leg hands the caller's audio to the call in whole 20 ms frames.

A carrier's ``media`` payload is usually exactly one frame; the leg then
passes it on as it is, and only a payload of another size goes through the
``FrameCutter``. Either way the call sees the same frames in the same order.
"""

from __future__ import annotations

from typing import Any

from bridge.io.legs.stream_call import StreamCall
from bridge.streams.base import AudioReceived
from telcodec.framing import FrameCutter


class _Call:
    finished = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def caller_audio(self, frame: bytes) -> None:
        self.frames.append(frame)


class _Loop:
    def time(self) -> float:
        return 1.0


class _Timer:
    """A pending engine timer: ``pump`` cancels it (and arms the engine's next, if any)."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _started(stream: StreamCall, event: Any) -> None:
    raise AssertionError("no stream starts here")


def _stream(engine: Any = None) -> tuple[StreamCall, _Call]:
    if engine is None:
        from bridge.streams.twilio import TwilioStreamProtocol

        engine = TwilioStreamProtocol()
    conn: Any = None  # the audio path writes nothing
    stream = StreamCall(conn, engine, _Loop(), lambda: None, _started)  # type: ignore[arg-type]
    call = _Call()
    stream.call = call
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
    stream, call = _stream(engine)
    pumped: list[int] = []
    timer = _Timer()

    def message(text: str) -> None:
        """``_on_message``; a pump (it cancels the pending timer) is counted in ``pumped``."""
        nonlocal timer
        timer = _Timer()
        stream.timer = timer  # type: ignore[assignment]
        stream._on_message(text)
        if timer.cancelled:
            pumped.append(1)

    def media(seq: int, audio: bytes) -> str:
        payload = base64.b64encode(audio).decode()
        return (
            f'{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound",'
            f'"chunk":"{seq}","timestamp":"{20 * seq}","payload":"{payload}"}},'
            f'"streamSid":"{sid}"}}'
        )

    frames = [bytes([n]) * 160 for n in range(4)]
    message(media(2, frames[0]))  # plain: taken, no pump
    message(media(3, frames[1]))
    assert call.frames == frames[:2] and pumped == []
    message(media(5, frames[2]))  # a gap: the engine's events, pumped
    assert call.frames == frames[:3] and pumped == [1]
    message(media(6, frames[3]))  # back in sequence: taken again
    assert call.frames == frames and pumped == [1]
    # every message, taken or through the engine, first gives the ticker a preemption point
    stream.preempt = lambda: call.frames.append(b"preempt")
    message(media(7, frames[0]))
    message(media(9, frames[1]))
    assert call.frames[4:] == [b"preempt", frames[0], b"preempt", frames[1]] and pumped == [1, 1]

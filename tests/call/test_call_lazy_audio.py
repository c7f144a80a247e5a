"""CallBridge transcodes provider audio on demand, a few frames ahead of the clock.

A provider sends a turn faster than real time. The call keeps what arrives
as it came (``undecoded_bytes``) and transcodes it tick by tick; the first
chunk of a turn is transcoded at once (added latency). Every figure the call
reports must be what eager transcoding gave: the equivalence tests replay one
scenario with ``max_undecoded_bytes=0`` (every chunk transcoded at arrival,
the old behaviour) and with the defaults, and compare everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from call_harness import PCM_24K, SIP, TWILIO, Harness, at, of_type, tone_s16le, tone_ulaw_frames

from bridge.commands import TurnFinished, TurnInterrupted
from bridge.media.call_audio import Framer
from bridge.media.call_types import CallOptions, SendMark
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    TurnFailed,
    WordsTimed,
    WordTiming,
)
from bridge.providers.kletso.client import VoiceInterrupted
from telcodec import g711
from telcodec.transcode import ToTelephony

EAGER = CallOptions(max_undecoded_ms=0)
AHEAD = CallOptions().decode_ahead_frames
PIECE_FRAMES = CallOptions().decode_piece_ms // 20


def ulaw_turn(seconds: float) -> bytes:
    return b"".join(tone_ulaw_frames(round(seconds * 50)))


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[k : k + size] for k in range(0, len(data), size)]


def burst(h: Harness, turn_id: str, data: bytes, size: int, fmt: AudioFormat, now: float) -> None:
    for piece in chunks(data, size):
        h.audio(turn_id, piece, now, audio_format=fmt)


def pcm_turn_in_one_burst(seconds: float) -> Harness:
    """A call with one 24 kHz PCM turn, all of it received at once in 100 ms chunks."""
    h = Harness()
    h.say("t1")
    burst(h, "t1", tone_s16le(440.0, seconds, 24000, peak=0.5), 4800, PCM_24K, now=0.0)
    h.done("t1", now=0.0)
    return h


def test_a_15_s_turn_in_one_burst_is_transcoded_over_the_ticks_not_at_arrival() -> None:
    h = Harness()
    h.say("t1")
    pcm = tone_s16le(440.0, 15.0, 24000, peak=0.5)
    burst(h, "t1", pcm, 4800, PCM_24K, now=0.0)  # 150 chunks of 100 ms, all at once
    h.done("t1", now=0.0)
    # At arrival: only the first chunk became frames (100 ms = at most 5 frames).
    assert h.call.queued_frames <= 5
    assert h.call.undecoded_bytes == len(pcm) - 4800
    out: list[bytes] = []
    n = 1
    held: list[int] = []
    while (frame := h.tick(n)) is not None:
        out.append(frame)
        held.append(h.call.queued_frames)
        n += 1
    # Each tick transcodes a little: never more than a piece's frames are
    # waiting beyond the look-ahead (plus the soxr filter's release burst).
    assert max(held) <= AHEAD + PIECE_FRAMES + 3
    assert len(set(held)) > 3  # the count moves: the work is spread over the ticks
    assert h.call.undecoded_bytes == 0
    reference = ToTelephony("pcm_s16le", 24000, "mulaw")
    expected = reference.push(pcm) + reference.flush()
    assert out == expected  # identical however it was chunked
    _, events = h.take()
    assert events[-1] == TurnFinished("t1", len(expected) * 20, "")
    assert h.call.stats().underruns == 0


def test_the_look_ahead_is_transcoded_by_feed_after_the_tick_not_inside_it() -> None:
    # The shell calls ``feed`` once the tick's frame has left, so a piece's
    # transcoding never delays the frames of the other calls in that wake-up.
    call = pcm_turn_in_one_burst(4.0).call
    n, fed = 1, 0
    while call.undecoded_bytes:
        undecoded, queued = call.undecoded_bytes, call.queued_frames
        assert queued > 0  # the look-ahead kept a frame ready for every tick
        assert call.tick(at(n)) is not None
        assert call.undecoded_bytes == undecoded  # the tick itself transcoded nothing
        if call.feed_due():
            assert call.queued_frames < AHEAD
            call.feed(at(n))
            fed += 1
            assert call.undecoded_bytes < undecoded
            assert call.queued_frames >= AHEAD
        n += 1
    assert fed >= 4000 // CallOptions().decode_piece_ms - 1
    assert call.stats().underruns == 0


def test_a_tick_with_no_frame_ready_transcodes_at_once_rather_than_run_dry() -> None:
    call = pcm_turn_in_one_burst(3.0).call
    n = 1
    while call.queued_frames:  # ticks without ``feed``: the look-ahead runs out
        assert call.tick(at(n)) is not None
        n += 1
    undecoded = call.undecoded_bytes
    assert undecoded > 0
    assert call.frame_ready()  # transcodes what the next tick needs
    assert call.undecoded_bytes < undecoded
    while call.queued_frames:
        call.tick(at(n))
        n += 1
    assert call.tick(at(n)) is not None  # a tick finding nothing ready transcodes too
    assert call.stats().underruns == 0


def test_undecoded_audio_held_per_turn_is_bounded() -> None:
    h = Harness(options=CallOptions(max_undecoded_ms=1000))
    h.say("t1")
    data = ulaw_turn(30.0)
    burst(h, "t1", data, 1600, MULAW_8K, now=0.0)
    assert h.call.undecoded_bytes <= 8000
    # what did not fit was transcoded (oldest first), nothing dropped
    assert h.call.queued_frames + h.call.undecoded_bytes // 160 == len(data) // 160
    assert h.call.stats().overflow_frames_dropped == 0


def test_pass_through_frames_are_the_provider_bytes_in_order() -> None:
    h = Harness()
    h.say("t1")
    data = ulaw_turn(2.0)
    burst(h, "t1", data, 1111, MULAW_8K, now=0.0)  # chunks cut mid-frame
    h.done("t1", now=0.0)
    out = []
    n = 1
    while (frame := h.tick(n)) is not None:
        out.append(frame)
        n += 1
    assert b"".join(out) == data


def test_barge_in_drops_the_untranscoded_audio_and_later_audio() -> None:
    h = Harness()
    h.say("t1")
    burst(h, "t1", ulaw_turn(10.0), 1600, MULAW_8K, now=0.0)
    for n in range(1, 11):
        assert h.tick(n) is not None
    assert h.call.undecoded_bytes > 0
    h.call.barge_in("speech", at(10) + 0.001)
    h.drain()
    assert h.call.undecoded_bytes == 0
    assert h.call.queued_frames == 0
    assert h.tick(11) is None
    h.audio("t1", b"\x00" * 1600, at(11))
    assert h.call.undecoded_bytes == 0
    assert h.call.stats().late_chunks_dropped == 1
    _, events = h.take()
    (cut,) = of_type(events, TurnInterrupted)
    assert cut.heard_ms == 200


def test_the_next_turn_starts_on_the_tick_after_the_last_frame_of_the_first() -> None:
    h = Harness()
    h.say("a")
    h.say("b")
    a = ulaw_turn(1.0)
    b = ulaw_turn(1.0)[::-1]
    burst(h, "a", a, 1600, MULAW_8K, now=0.0)
    burst(h, "b", b, 1600, MULAW_8K, now=0.0)
    h.done("b", now=0.0)
    h.done("a", now=0.0)
    out = [h.tick(n) for n in range(1, 102)]
    assert b"".join(f for f in out[:100] if f is not None) == a + b
    assert out[100] is None
    assert h.call.stats().underruns == 0


# ---------------------------------------------------------------- equivalence


Scenario = Callable[[Harness], None]


def run(scenario: Scenario, leg: Any, options: CallOptions | None) -> list[Any]:
    """Everything observable: per tick the frame, the actions and the events."""
    h = Harness(leg, options=options)
    trace: list[Any] = []
    original_tick = h.tick

    def tick(n: int) -> bytes | None:
        frame = original_tick(n)
        actions, events = h.take()
        trace.append((n, frame, actions, events))
        return frame

    h.tick = tick  # type: ignore[method-assign]
    scenario(h)
    actions, events = h.take()
    trace.append(("end", actions, events, h.call.stats()))
    return trace


def same_both_ways(scenario: Scenario, leg: Any = SIP) -> None:
    eager = run(scenario, leg, EAGER)
    lazy = run(scenario, leg, None)
    assert lazy == eager


def test_equivalent_pcm_turn_with_words_and_a_barge_in() -> None:
    def scenario(h: Harness) -> None:
        h.say("t1")
        words = tuple(WordTiming(f"w{i}", i * 0.3, i * 0.3 + 0.25) for i in range(20))
        h.provide(WordsTimed("t1", words), 0.0)
        burst(h, "t1", tone_s16le(300.0, 6.0, 24000), 4801, PCM_24K, now=0.0)
        for n in range(1, 120):
            h.tick(n)
        h.call.barge_in("speech", at(119) + 0.001)
        for n in range(120, 125):
            h.tick(n)

    same_both_ways(scenario)


def test_equivalent_marks_on_a_media_stream_leg() -> None:
    def scenario(h: Harness) -> None:
        h.say("t1")
        h.say("t2")
        burst(h, "t1", ulaw_turn(3.0), 800, MULAW_8K, now=0.0)
        h.done("t1", 0.0)
        burst(h, "t2", tone_s16le(500.0, 2.0, 16000), 3200, AudioFormat("pcm_s16le", 16000), 0.0)
        h.done("t2", 0.0)
        for n in range(1, 300):
            h.tick(n)
            if n % 10 == 0:
                for name in [a.name for a in h.actions if isinstance(a, SendMark)]:
                    h.call.mark_echoed(name, False, at(n))

    same_both_ways(scenario, TWILIO)


def test_equivalent_when_the_provider_is_slower_than_real_time() -> None:
    def scenario(h: Harness) -> None:
        h.say("t1")
        data = ulaw_turn(4.0)
        parts = chunks(data, 480)  # 60 ms every 80 ms: underruns
        for n in range(1, 260):
            if n % 4 == 0 and parts:
                h.audio("t1", parts.pop(0), at(n) - 0.005)
            if n == 250:
                h.done("t1", at(n) - 0.005)
            h.tick(n)

    same_both_ways(scenario)


def test_equivalent_format_change_and_provider_error_mid_turn() -> None:
    def scenario(h: Harness) -> None:
        h.say("t1")
        burst(h, "t1", ulaw_turn(1.0), 1600, MULAW_8K, 0.0)
        burst(h, "t1", tone_s16le(440.0, 1.0, 24000), 4800, PCM_24K, 0.0)
        h.provide(AudioReceived("t1", b"\x00" * 100, AudioFormat("pcm_s16le", 0)), 0.0)
        for n in range(1, 120):
            h.tick(n)
        h.say("t2")
        burst(h, "t2", ulaw_turn(1.0), 1600, MULAW_8K, at(120))
        h.provide(TurnFailed("t2", "server_error", "boom"), at(120))
        for n in range(120, 200):
            h.tick(n)

    same_both_ways(scenario)


def test_equivalent_voice_agent_truncation_by_position() -> None:
    from bridge.commands import HandOver
    from bridge.providers.base import TurnStarted

    def scenario(h: Harness) -> None:
        h.call.execute(HandOver(voice_agent="kletso"), 0.0)
        h.provide(TurnStarted("voice-1", "item_1"), 0.0)
        burst(h, "voice-1", tone_s16le(300.0, 3.0, 24000), 4800, PCM_24K, 0.0)
        for n in range(1, 30):
            h.tick(n)
        h.provide(VoiceInterrupted("item_1", 1700), at(30))
        for n in range(30, 120):
            h.tick(n)

    same_both_ways(scenario)


def test_ulaw_helper_round_trip() -> None:
    # the synthetic turns above are real mu-law (decodable, 160 bytes per frame)
    data = ulaw_turn(0.1)
    assert len(data) == 800
    assert len(g711.ulaw_decode(data)) == 1600


# ---------------------------------------------------------------- the idle tick


def test_a_tick_that_changes_nothing_leaves_nothing_to_drain() -> None:
    """The shell pumps after a tick only when ``has_output`` says so."""
    h = Harness()
    for n in range(1, 5):
        assert h.call.tick(at(n)) is None
        assert not h.call.has_output()
    h.say("t1")
    assert not h.call.has_output()  # drained by the harness
    h.frames("t1", tone_ulaw_frames(3), at(5))
    h.done("t1", at(5))
    assert h.call.tick(at(6)) is not None
    assert h.call.has_output()  # TurnBegan
    h.drain()
    assert h.call.tick(at(7)) is not None
    assert not h.call.has_output()  # a frame in the middle of a turn: nothing to report
    assert h.call.tick(at(8)) is not None
    assert h.call.has_output()  # TurnFinished
    h.drain()
    assert h.call.tick(at(9)) is None
    assert not h.call.has_output()


def _against_unreleased(
    played: list[bytes], pcm: bytes
) -> tuple[npt.NDArray[np.int_], npt.NDArray[np.int_]]:
    """The played mu-law frames and 24 kHz ``pcm`` framed without a release, both decoded
    (as many frames each: asserted)."""
    reference = ToTelephony("pcm_s16le", 24000, "mulaw")
    expected = reference.push(pcm) + reference.flush()
    assert len(played) == len(expected)
    got = np.frombuffer(g711.ulaw_decode(b"".join(played)), "<i2").astype(int)
    want = np.frombuffer(g711.ulaw_decode(b"".join(expected)), "<i2").astype(int)
    return got, want


def test_a_turn_about_to_run_dry_gets_the_audio_inside_the_resampler() -> None:
    """A provider a little ahead of real time: a 120 ms word every 100 ms. soxr
    holds about half of a first chunk back (block latency): without a release
    the turn would play 3 frames and then silence. The call hands that audio
    out instead, and the frames are the unreleased stream's, within rounding."""
    h = Harness()
    h.say("t1")
    pcm = tone_s16le(440.0, 1.2, 24000, peak=0.5)
    word = 24000 * 2 * 120 // 1000  # bytes of a 120 ms chunk
    out: list[bytes] = []
    n = 1
    for k in range(0, len(pcm), word):
        h.audio("t1", pcm[k : k + word], at(n - 1) + 0.001, audio_format=PCM_24K)
        for _ in range(5):  # 100 ms of ticks before the next word
            out.append(h.tick(n) or b"")
            n += 1
    h.done("t1", at(n - 1) + 0.001)
    while (frame := h.tick(n)) is not None:
        out.append(frame)
        n += 1
    assert h.call.stats().underruns == 0 and all(out)
    got, want = _against_unreleased([f for f in out if f], pcm)
    assert np.max(np.abs(got - want)) <= 64  # one mu-law step at this level, at most


def test_a_provider_one_frame_and_5_ms_ahead_never_runs_dry() -> None:
    """Each tick the provider has sent the frame's audio and 5 ms more: less than the
    resampler keeps back for an exact join (12 ms). The release keeps back less then,
    so every frame plays; the audio is the unreleased stream's within a few percent
    of its peak at the joins (``tests/codecs``: the shorter tail's error)."""
    h = Harness()
    h.say("t1")
    pcm = tone_s16le(440.0, 1.0, 24000, peak=0.5)
    ms = 48  # bytes of 1 ms at 24 kHz
    h.audio("t1", pcm[: 25 * ms], at(0) - 0.001, audio_format=PCM_24K)
    out: list[bytes] = []
    n, sent = 0, 25 * ms
    while sent < len(pcm):
        out.append(h.tick(n) or b"")
        n += 1
        h.audio("t1", pcm[sent : sent + 20 * ms], at(n) - 0.001, audio_format=PCM_24K)
        sent += 20 * ms
    h.done("t1", at(n) - 0.001)
    while (frame := h.tick(n)) is not None:
        out.append(frame)
        n += 1
    assert h.call.stats().underruns == 0 and all(out)
    got, want = _against_unreleased(out, pcm)
    assert np.max(np.abs(got - want)) <= 0.03 * 0.5 * 32767


class _NoRelease:
    """A framer that never hands out what its resampler holds (a call holding audio)."""

    def __init__(self, inner: Framer) -> None:
        self.inner = inner
        self.is_pass_through = inner.is_pass_through

    def push(self, chunk: bytes) -> list[bytes]:
        return self.inner.push(chunk)

    def flush(self) -> list[bytes]:
        return self.inner.flush()

    def release(self) -> list[bytes]:
        return []

    def reset(self) -> None:
        self.inner.reset()


def test_an_underrun_the_provider_caused_is_told_apart_from_one_the_call_held() -> None:
    """A provider slower than real time: every dry tick is the provider's
    (``underruns_provider``), flagged for the shell, which can hand one back
    (``Underruns.unread``: its audio was waiting unread on a socket). A call that holds
    audio it has (here a framer that releases nothing) counts its own."""
    h = Harness()
    h.say("t1")
    frames = tone_ulaw_frames(20)
    h.frames("t1", frames[:3], at(0))
    for n in range(5):
        h.tick(n)
    stats = h.call.stats()
    assert stats.underruns == 2 and stats.underruns_provider == 2
    assert h.call.underruns.silent_tick() == "t1"  # the shell's next silent tick
    h.call.underruns.unread()
    assert h.call.stats().underruns_provider == 1

    held = Harness()
    held.say("t1")
    pcm = tone_s16le(440.0, 0.2, 24000, peak=0.5)
    held.audio("t1", pcm, at(0), audio_format=PCM_24K)  # 200 ms, of which soxr holds some
    turn = held.call._turns.get("t1")
    assert turn is not None and turn.framer is not None
    turn.framer = _NoRelease(turn.framer)
    n = 0
    while held.call.stats().underruns == 0 and n < 10:
        held.tick(n)
        n += 1
    stats = held.call.stats()
    assert stats.underruns == 1 and stats.underruns_provider == 0
    assert held.call.underruns.silent_tick() is None

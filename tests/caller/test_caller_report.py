"""The caller's report (``bridge.control.report``) on synthetic arrival data: pure, no clock."""

from __future__ import annotations

import json
import math
import struct

import pytest

from bridge.control.report import (
    LEVEL_FLOOR_DBFS,
    BargeIn,
    CallRecording,
    ReceivedFrame,
    SequenceGap,
    SilenceGap,
    build_report,
    first_speech_frame,
    format_report,
    level_dbfs,
    pacing_stats,
    sequence_gaps,
    silence_gaps,
)

SPEECH = -12.0
QUIET = LEVEL_FLOOR_DBFS


def sine(amplitude: float, samples: int, freq_hz: float = 440.0) -> bytes:
    values = [
        round(amplitude * 32767 * math.sin(2 * math.pi * freq_hz * n / 8000))
        for n in range(samples)
    ]
    return struct.pack(f"<{samples}h", *values)


def frames(start_s: float, count: int, level: float, seq0: int = 0) -> list[ReceivedFrame]:
    return [ReceivedFrame(start_s + i * 0.020, level, seq0 + i) for i in range(count)]


# --- levels --------------------------------------------------------------------------------


def test_level_of_a_sine_is_its_rms_in_dbfs() -> None:
    # A sine of peak A has RMS A/sqrt(2): 0.1 full scale -> 20*log10(0.1/sqrt(2)) = -23.0 dBFS.
    assert level_dbfs(sine(0.1, 1600)) == pytest.approx(-23.0, abs=0.05)
    assert level_dbfs(struct.pack("<2h", 32767, -32767)) == pytest.approx(0.0, abs=0.01)


def test_level_of_digital_silence_and_nothing_is_the_floor() -> None:
    assert level_dbfs(bytes(320)) == LEVEL_FLOOR_DBFS
    assert level_dbfs(b"") == LEVEL_FLOOR_DBFS


def test_first_speech_frame_finds_the_onset_above_minus_40_dbfs() -> None:
    quiet = sine(0.005, 160 * 3)  # -49 dBFS: below the threshold
    assert first_speech_frame(quiet + sine(0.1, 160 * 2)) == 3
    assert first_speech_frame(quiet) is None


# --- pacing --------------------------------------------------------------------------------


def test_pacing_is_the_deviation_of_inter_arrival_from_20_ms() -> None:
    intervals_ms = [20, 20, 21, 19, 25]
    arrivals = [0.0]
    for ms in intervals_ms:
        arrivals.append(arrivals[-1] + ms / 1000)
    stats = pacing_stats(arrivals)
    assert stats is not None
    # deviations sorted: 0, 0, 1, 1, 5 -> nearest rank p50 = 3rd = 1, p99 = 5th = 5.
    assert (stats.p50_ms, stats.p99_ms, stats.max_ms) == pytest.approx((1.0, 5.0, 5.0))
    assert stats.intervals == 5


def test_pacing_leaves_out_pauses_when_asked_and_needs_two_arrivals() -> None:
    arrivals = [0.0, 0.020, 0.040, 0.540, 0.560]
    with_pause = pacing_stats(arrivals)
    without = pacing_stats(arrivals, max_interarrival_s=0.25)
    assert with_pause is not None and without is not None
    assert with_pause.max_ms == pytest.approx(480.0)
    assert without.max_ms == pytest.approx(0.0, abs=1e-6) and without.intervals == 3
    assert pacing_stats([1.0]) is None


# --- gaps ----------------------------------------------------------------------------------


def test_sequence_gaps_across_the_wrap_and_not_for_reordering() -> None:
    assert sequence_gaps([65533, 65534, 65535, 1, 2]) == (SequenceGap(65535, 1),)
    assert sequence_gaps([5, 7, 6, 8]) == ()
    assert sequence_gaps([10, 11, 15, 16, 20]) == (SequenceGap(11, 3), SequenceGap(16, 3))


def test_silence_gaps_longer_than_60_ms_between_speech_frames() -> None:
    speech = [1.00, 1.02, 1.04, 1.14, 1.16, 1.22]  # quiet: 80 ms after 1.04, 40 ms after 1.16
    assert silence_gaps(speech, origin_s=1.0) == (SilenceGap(0.06, 80.0),)


# --- whole report --------------------------------------------------------------------------


def sip_recording(**kw: object) -> CallRecording:
    """Answered 0.1 s after the INVITE; 0.3 s of silence, then 2 s of speech, then silence."""
    rx = frames(0.1, 15, QUIET) + frames(0.4, 100, SPEECH, seq0=15) + frames(2.4, 50, QUIET, 115)
    base: dict[str, object] = {
        "transport": "sip",
        "started_at_s": 0.0,
        "answered_at_s": 0.1,
        "ended_at_s": 3.4,
        "frames": tuple(rx),
        "ended_by": "local-hangup",
    }
    base.update(kw)
    return CallRecording(**base)  # type: ignore[arg-type]


def test_sip_report_setup_first_audio_frames_and_loss() -> None:
    rec = sip_recording()
    dropped = tuple(f for f in rec.frames if f.seq not in (40, 41, 90))
    report = build_report(sip_recording(frames=dropped))
    assert report.answered and report.failure is None
    assert report.setup_ms == pytest.approx(100.0)
    assert report.first_audio_ms == pytest.approx(300.0)
    assert report.frames_received == 165 - 3
    assert report.lost_packets == 3
    assert report.sequence_gaps == (SequenceGap(39, 2), SequenceGap(89, 1))
    assert report.pacing is not None and report.pacing.max_ms == pytest.approx(40.0)
    assert report.duration_s == pytest.approx(3.3)


def test_telephone_event_packets_fill_the_sequence_space() -> None:
    audio = tuple(f for f in sip_recording().frames if f.seq not in (20, 21))
    assert build_report(sip_recording(frames=audio)).lost_packets == 2
    report = build_report(sip_recording(frames=audio, event_seqs=(20, 21)))
    assert report.lost_packets == 0


def test_barge_in_stops_at_the_end_of_the_last_speech_frame() -> None:
    # Speech arrives 0.4 .. 2.38 s; the caller started speaking at 1.9 s.
    report = build_report(sip_recording(speech_onsets_s=(1.9,)))
    (barge,) = report.barge_ins
    assert barge.outcome == "stopped"
    assert barge.stopped_s == pytest.approx(2.4 - 0.1)
    assert barge.barge_in_ms == pytest.approx(500.0)


def test_barge_in_ignores_short_pauses_and_later_turns() -> None:
    # Speech 0.4-1.0, a 200 ms pause, speech 1.2-2.0, then 1 s of silence, then a new turn.
    rx = (
        frames(0.4, 30, SPEECH)
        + frames(1.0, 10, QUIET, 30)
        + frames(1.2, 40, SPEECH, 40)
        + frames(2.0, 50, QUIET, 80)
        + frames(3.0, 20, SPEECH, 130)
    )
    report = build_report(sip_recording(frames=tuple(rx), speech_onsets_s=(0.9,), ended_at_s=4))
    assert report.barge_ins == (BargeIn(0.8, "stopped", stopped_s=1.9, barge_in_ms=1100.0),)
    assert report.silence_gaps == (SilenceGap(0.9, 200.0), SilenceGap(1.9, 1000.0))


def test_barge_in_not_measured_when_the_far_side_was_silent() -> None:
    report = build_report(sip_recording(speech_onsets_s=(3.0,)))
    assert report.barge_ins == (BargeIn(2.9, "not-speaking"),)


def test_barge_in_still_speaking_when_the_call_ends_in_speech() -> None:
    rx = frames(0.1, 100, SPEECH)
    report = build_report(sip_recording(frames=tuple(rx), speech_onsets_s=(1.0,), ended_at_s=2.1))
    assert report.barge_ins[0].outcome == "still-speaking"
    assert report.barge_ins[0].barge_in_ms is None


def test_ws_clear_ends_the_speech_when_it_comes_first() -> None:
    # Media stream: greeting media 0.05 .. 2.05 s; the caller spoke at 1.0; clear at 1.25.
    rx = frames(0.05, 100, SPEECH)
    rec = CallRecording(
        transport="ws",
        started_at_s=0.0,
        answered_at_s=0.0,
        ended_at_s=4.0,
        frames=tuple(ReceivedFrame(f.at_s, f.level_dbfs) for f in rx),
        speech_onsets_s=(1.0,),
        clears_at_s=(1.25,),
    )
    report = build_report(rec)
    assert report.setup_ms == pytest.approx(50.0)
    assert report.barge_ins == (BargeIn(1.0, "cleared", stopped_s=1.25, barge_in_ms=250.0),)
    assert report.clears_received == 1
    assert report.lost_packets == 0 and report.sequence_gaps == ()


def test_ws_media_that_stops_arriving_is_a_stop_and_a_pause_is_no_pacing_error() -> None:
    rx = frames(0.05, 60, SPEECH) + frames(3.0, 10, SPEECH)
    rec = CallRecording(
        transport="ws",
        started_at_s=0.0,
        answered_at_s=0.0,
        ended_at_s=4.0,
        frames=tuple(rx),
        speech_onsets_s=(0.5,),
    )
    report = build_report(rec)
    assert report.barge_ins == (BargeIn(0.5, "stopped", stopped_s=1.25, barge_in_ms=750.0),)
    assert report.pacing is not None and report.pacing.max_ms == pytest.approx(0.0, abs=1e-6)


def test_unanswered_call_reports_the_failure() -> None:
    rec = CallRecording(
        transport="sip",
        started_at_s=5.0,
        answered_at_s=None,
        ended_at_s=5.2,
        failure="486 Busy Here",
        ended_by="failed",
    )
    report = build_report(rec)
    assert not report.answered
    assert report.setup_ms is None and report.first_audio_ms is None
    assert report.frames_received == 0 and report.pacing is None
    assert "no (486 Busy Here)" in format_report(report)


def test_json_and_text_carry_the_same_figures() -> None:
    rec = sip_recording(speech_onsets_s=(1.9,), dtmf_sent=((1.0, "1"), (1.3, "2")))
    report = build_report(rec)
    data = json.loads(report.to_json())
    assert data["setup_ms"] == report.setup_ms == pytest.approx(100.0)
    assert data["barge_ins"][0]["barge_in_ms"] == pytest.approx(500.0)
    assert data["dtmf_sent"] == "12"
    text = format_report(report)
    assert "setup time:        100.0 ms" in text
    assert "barge-in:          onset at 1.800 s -> 500.0 ms (stopped)" in text
    assert "lost packets:      0" in text


def test_media_stream_gaps_and_barge_in_use_what_was_heard_when_given() -> None:
    # Media was sent 200 ms ahead: it stopped *arriving* at 0.8 s, but played until 1.0 s.
    arrivals = frames(0.0, 40, SPEECH)
    heard = frames(0.0, 50, SPEECH) + frames(1.0, 100, QUIET)
    rec = CallRecording(
        transport="ws",
        started_at_s=0.0,
        answered_at_s=0.0,
        ended_at_s=3.0,
        frames=tuple(arrivals),
        heard_frames=tuple(heard),
        speech_onsets_s=(0.7,),
    )
    report = build_report(rec)
    assert report.barge_ins == (BargeIn(0.7, "stopped", stopped_s=1.0, barge_in_ms=300.0),)
    assert report.frames_received == 40 and report.speech_frames_received == 40

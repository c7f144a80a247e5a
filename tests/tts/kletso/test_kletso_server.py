"""The Kletso server session: error frames, ordering rules, timers and the happy path.

Times are literal numbers; synthesis results are fed by hand.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from bridge.engine import Action, CloseConnection, SendBytes, SendText
from bridge.providers.base import WordTiming
from bridge.providers.kletso.server import PATHS, SESSION, EnergyDetector, KletsoServerSession
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

START = {"type": "voice.start", "mode": "ptt", "sampleRate": 24000, "clientId": "c1"}


def tone(ms: int, amplitude: int = 3000) -> bytes:
    n = 24 * ms
    wave = amplitude * np.sin(2 * np.pi * 440 * np.arange(n) / 24000)
    return wave.astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(48 * ms)


def mic(pcm: bytes) -> bytes:
    return b"\x01" + pcm


def decode(actions: list[Action]) -> list[Any]:
    """JSON frames as dicts, binary frames as ("bin", bytes), other actions as they are."""
    out: list[Any] = []
    for action in actions:
        if isinstance(action, SendText):
            out.append(json.loads(action.text))
        elif isinstance(action, SendBytes):
            out.append(("bin", action.data))
        else:
            out.append(action)
    return out


def types(frames: list[Any]) -> list[str]:
    return [f["type"] if isinstance(f, dict) else type(f).__name__ for f in frames]


def new_session(**kw: Any) -> KletsoServerSession:
    session = KletsoServerSession(ServerOptions(), **kw)
    session.connection_made("/v1/realtime", {}, {}, 0.0)
    return session


def send(session: KletsoServerSession, frame: object, now: float) -> list[Any]:
    session.receive_text(json.dumps(frame), now)
    return decode(session.actions_to_send())


def started(mode: str = "ptt", **kw: Any) -> KletsoServerSession:
    session = new_session(**kw)
    send(session, {**START, "mode": mode}, 0.0)
    return session


def feed_audio(session: KletsoServerSession, pcm: bytes, now: float) -> list[Any]:
    """Feed 20 ms frames, advancing time with the audio; return every frame produced."""
    out: list[Any] = []
    for start in range(0, len(pcm), 960):
        session.receive_bytes(mic(pcm[start : start + 960]), now)
        out.extend(decode(session.actions_to_send()))
        now += 0.02
    return out


def error(code: str, message: str) -> dict[str, str]:
    return {"type": "error", "code": code, "message": message}


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"type": "voice.stop", "reason": "user"}, "voice_unavailable"),
        ({"type": "voice.commit"}, "voice_unavailable"),
        ({"type": "voice.played", "itemId": "current", "ms": 0}, "voice_unavailable"),
        ({"type": "voice.text", "text": "hi"}, "voice_unavailable"),
        ({"type": "chat.send", "text": "hi"}, "invalid_request"),
        ({**START, "mode": "always"}, "invalid_request"),
        ({**START, "sampleRate": 16000}, "invalid_request"),
        ({**START, "sampleRate": "24000"}, "invalid_request"),
        ({**START, "clientId": ""}, "invalid_request"),
        ({"type": "voice.start", "mode": "vad", "sampleRate": 24000}, "invalid_request"),
    ],
)
def test_bad_frames_before_a_session(frame: dict[str, Any], code: str) -> None:
    session = new_session()
    (reply,) = send(session, frame, 0.0)
    assert reply["type"] == "error" and reply["code"] == code
    assert isinstance(reply["message"], str) and reply["message"]


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (START, "a voice session is already running"),
        ({"type": "voice.stop", "reason": "bored"}, 'reason must be "user" or "background"'),
        ({"type": "voice.played", "itemId": 7, "ms": 0}, "itemId must be a string"),
        ({"type": "voice.played", "itemId": "current", "ms": "1"}, "ms must be a number"),
        (
            {"type": "voice.played", "itemId": "current", "ms": -5},
            "ms must be a finite number >= 0",
        ),
        ({"type": "voice.played", "itemId": "item_99", "ms": 5}, "unknown itemId 'item_99'"),
        ({"type": "voice.text", "text": "  "}, "text must be a non-empty string"),
        ({"type": "voice.text"}, "text must be a non-empty string"),
    ],
)
def test_bad_frames_in_a_session(frame: dict[str, Any], message: str) -> None:
    session = started()
    code = "conflict" if frame is START else "invalid_request"
    assert send(session, frame, 1.0) == [error(code, message)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "frame is not valid JSON"),
        ("[1]", "frame must be an object with a string type"),
        ('{"type": 1}', "frame must be an object with a string type"),
        ("[" * 50000, "frame is not valid JSON"),
        ('{"type": "voice.text", "text": "' + "a" * 70000 + '"}', "frame over 65536 characters"),
    ],
)
def test_malformed_text_frames(text: str, message: str) -> None:
    session = started()
    session.receive_text(text, 1.0)
    assert decode(session.actions_to_send()) == [error("invalid_request", message)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty binary frame"),
        (b"\x01" + bytes(16 * 1024), "binary frame of 16385 bytes is over 16 KB"),
        (b"\x02\x00\x00", "binary kind 0x02 is not microphone audio (0x01)"),
        (b"\x07\x00\x00", "binary kind 0x07 is not microphone audio (0x01)"),
        (b"\x01\x00", "PCM payload must be whole 16-bit samples"),
    ],
)
def test_bad_binary_frames(data: bytes, message: str) -> None:
    session = started()
    session.receive_bytes(data, 1.0)
    assert decode(session.actions_to_send()) == [error("invalid_request", message)]


def test_audio_before_start_is_voice_unavailable() -> None:
    session = new_session()
    session.receive_bytes(mic(silence(20)), 0.0)
    assert decode(session.actions_to_send()) == [
        error("voice_unavailable", "audio before voice.start")
    ]


def test_the_largest_whole_sample_frame_under_16_kb_is_accepted() -> None:
    session = started()
    session.receive_bytes(b"\x01" + bytes(16 * 1024 - 2), 1.0)  # 16383 bytes, whole samples
    assert session.actions_to_send() == []


def test_not_configured_answers_error_and_voice_ended() -> None:
    session = new_session(not_configured=True)
    assert send(session, START, 0.0) == [
        error("not_configured", "no OpenAI key on the agent"),
        {
            "type": "voice.ended",
            "seq": 1,
            "data": {
                "reason": "not_configured",
                "usage": {"audioInSeconds": 0.0, "audioOutSeconds": 0.0, "costMicros": 0},
            },
        },
    ]


def test_voice_off_is_voice_unavailable() -> None:
    session = new_session(voice_enabled=False)
    assert send(session, START, 0.0) == [error("voice_unavailable", "voice is off for this agent")]


def test_rate_limit_counts_starts_per_minute() -> None:
    session = new_session(max_starts_per_minute=2)
    for now in (0.0, 10.0):
        assert types(send(session, START, now))[0] == "voice.started"
        assert types(send(session, {"type": "voice.stop", "reason": "background"}, now))[-1] == (
            "voice.ended"
        )
    assert send(session, START, 20.0) == [
        error("voice_rate_limited", "too many voice sessions, retry later")
    ]
    assert types(send(session, START, 60.5))[0] == "voice.started"


def test_wrong_bearer_token_closes_with_1008() -> None:
    options = ServerOptions(api_keys=frozenset({"k1"}))
    session = KletsoServerSession(options)
    session.connection_made("/v1/realtime", {}, {"authorization": "Bearer nope"}, 0.0)
    assert session.actions_to_send() == [CloseConnection(1008, "unauthorized")]
    session.receive_text(json.dumps(START), 0.0)
    assert session.actions_to_send() == []
    good = KletsoServerSession(options)
    good.connection_made("/v1/realtime", {}, {"authorization": "Bearer k1"}, 0.0)
    assert types(send(good, START, 0.0))[0] == "voice.started"


# ------------------------------------------------------------------ happy paths


def test_start_announces_session_mood_and_state() -> None:
    session = new_session(max_seconds=300.0, idle_seconds=30.0)
    assert PATHS == ("/v1/realtime",) and SESSION is KletsoServerSession
    frames = send(session, {**START, "mode": "vad"}, 0.0)
    assert frames == [
        {
            "type": "voice.started",
            "seq": 1,
            "data": {
                "voiceSessionId": "vs_1",
                "model": "kletso-voice-1",
                "voice": "joe",
                "limits": {"maxSeconds": 300.0, "idleSeconds": 30.0},
            },
        },
        {"type": "avatar.mood", "seq": 2, "data": {"mood": "neutral", "source": "rule"}},
        {"type": "voice.state", "seq": 3, "data": {"state": "listening"}},
    ]


def test_text_turn_full_sequence() -> None:
    session = started()
    frames = send(session, {"type": "voice.text", "text": "Hi"}, 1.0)
    assert frames[:-1] == [
        {
            "type": "message.created",
            "seq": 4,
            "data": {"itemId": "item_1", "role": "user", "modality": "text"},
        },
        {
            "type": "message.completed",
            "seq": 5,
            "data": {"itemId": "item_1", "role": "user", "modality": "text", "text": "Hi"},
        },
        {"type": "voice.state", "seq": 6, "data": {"state": "thinking"}},
        {
            "type": "message.created",
            "seq": 7,
            "data": {"itemId": "item_2", "role": "assistant", "modality": "voice"},
        },
    ]
    assert frames[-1] == Synthesize("item_2", "You wrote: Hi", "joe", 24000)
    words = (WordTiming("You", 0.0, 0.1), WordTiming("wrote:", 0.1, 0.2))
    pcm = bytes(range(256)) * 16  # 4096 bytes
    session.synthesis_audio("item_2", pcm, words, 1.2)
    frames = decode(session.actions_to_send())
    assert frames[0] == {"type": "voice.state", "seq": 8, "data": {"state": "speaking"}}
    binary = [f[1] for f in frames if isinstance(f, tuple)]
    assert [len(b) for b in binary] == [1921, 1921, 257]
    assert all(b[0] == 0x02 for b in binary) and b"".join(b[1:] for b in binary) == pcm
    assert frames[-1] == {
        "type": "message.delta",
        "seq": 9,
        "data": {"itemId": "item_2", "delta": "You wrote:"},
    }
    session.synthesis_audio("item_2", b"\x00\x00", (WordTiming("Hi", 0.2, 0.3),), 1.3)
    assert decode(session.actions_to_send())[-1]["data"]["delta"] == " Hi"
    session.synthesis_done("item_2", 1.4)
    assert decode(session.actions_to_send()) == [
        {
            "type": "message.completed",
            "seq": 11,
            "data": {
                "itemId": "item_2",
                "role": "assistant",
                "modality": "voice",
                "text": "You wrote: Hi",
            },
        },
        {"type": "voice.state", "seq": 12, "data": {"state": "idle"}},
    ]


def test_answers_queue_and_run_one_at_a_time() -> None:
    session = started()
    first = send(session, {"type": "voice.text", "text": "one"}, 1.0)
    second = send(session, {"type": "voice.text", "text": "two"}, 1.1)
    assert [a for a in first if isinstance(a, Synthesize)] == [
        Synthesize("item_2", "You wrote: one", "joe", 24000)
    ]
    assert not [a for a in second if isinstance(a, Synthesize)]
    session.synthesis_done("item_2", 1.5)
    frames = decode(session.actions_to_send())
    # still "thinking" (no audio came), so no voice.state: message.created starts the reply
    assert types(frames) == ["message.delta", "message.completed", "message.created", "Synthesize"]
    assert frames[-1] == Synthesize("item_4", "You wrote: two", "joe", 24000)


def test_vad_end_of_utterance_answers_with_the_speech_length() -> None:
    session = started("vad")
    frames = feed_audio(session, silence(100) + tone(1200) + silence(700), 1.0)
    assert types(frames) == [
        "voice.transcript",
        "voice.transcript",
        "message.created",
        "message.completed",
        "voice.state",
        "message.created",
        "Synthesize",
    ]
    assert frames[0]["data"] == {"role": "user", "text": "", "final": False}
    assert frames[1]["data"] == {"role": "user", "text": "[speech, 1.2 s]", "final": True}
    assert frames[2]["data"]["modality"] == "voice"
    assert frames[-1] == Synthesize("item_2", "I heard you speak for 1.2 seconds.", "joe", 24000)


def test_ptt_answers_only_on_commit() -> None:
    session = started("ptt")
    frames = feed_audio(session, tone(800) + silence(1000), 1.0)
    assert types(frames) == ["voice.transcript", "voice.state"]
    assert frames[1]["data"] == {"state": "listening"}
    frames = send(session, {"type": "voice.commit"}, 3.0)
    assert frames[0]["data"] == {"role": "user", "text": "[speech, 0.8 s]", "final": True}
    assert frames[-1] == Synthesize("item_2", "I heard you speak for 0.8 seconds.", "joe", 24000)


def test_commit_with_nothing_heard() -> None:
    session = started("ptt")
    frames = send(session, {"type": "voice.commit"}, 1.0)
    assert frames[0]["data"] == {"role": "user", "text": "[silence]", "final": True}
    assert frames[-1] == Synthesize("item_2", "I heard nothing.", "joe", 24000)


def test_speech_during_the_reply_interrupts_it() -> None:
    session = started("vad")
    send(session, {"type": "voice.text", "text": "long story"}, 1.0)
    session.synthesis_audio("item_2", silence(500), (WordTiming("You", 0.0, 0.2),), 1.1)
    session.actions_to_send()
    send(session, {"type": "voice.played", "itemId": "current", "ms": 180}, 1.3)
    frames = feed_audio(session, tone(100), 1.4)
    assert types(frames) == [
        "voice.transcript",
        "CancelSynthesis",
        "voice.interrupted",
        "message.completed",
        "voice.state",
    ]
    assert frames[1] == CancelSynthesis("item_2")
    assert frames[2]["data"] == {"itemId": "item_2", "audioEndMs": 180}
    assert frames[3]["data"]["text"] == "You"
    assert frames[4]["data"] == {"state": "listening"}
    session.synthesis_audio("item_2", silence(100), (), 1.6)
    session.synthesis_done("item_2", 1.7)
    assert session.actions_to_send() == []


def test_speech_while_thinking_interrupts_at_zero() -> None:
    session = started("vad")
    send(session, {"type": "voice.text", "text": "x"}, 1.0)
    frames = feed_audio(session, tone(100), 1.1)
    assert frames[2]["data"] == {"itemId": "item_2", "audioEndMs": 0}


def test_played_then_new_speech_interrupts_a_finished_reply() -> None:
    session = started("vad")
    send(session, {"type": "voice.text", "text": "x"}, 1.0)
    session.synthesis_audio("item_2", silence(1000), (), 1.1)
    session.synthesis_done("item_2", 1.2)
    session.actions_to_send()
    send(session, {"type": "voice.played", "itemId": "item_2", "ms": 400}, 1.5)
    frames = feed_audio(session, tone(100), 1.6)
    assert types(frames) == ["voice.transcript", "voice.interrupted"]
    assert frames[1]["data"] == {"itemId": "item_2", "audioEndMs": 400}
    later = feed_audio(session, silence(700) + tone(100), 2.0)  # answered, then cut at once
    interrupted = [
        f["data"] for f in later if isinstance(f, dict) and f["type"] == "voice.interrupted"
    ]
    assert interrupted == [{"itemId": "item_4", "audioEndMs": 0}]


def test_fully_played_reply_is_not_interrupted() -> None:
    session = started("vad")
    send(session, {"type": "voice.text", "text": "x"}, 1.0)
    session.synthesis_audio("item_2", silence(200), (), 1.1)
    session.synthesis_done("item_2", 1.2)
    send(session, {"type": "voice.played", "itemId": "item_2", "ms": 200}, 1.5)
    assert "voice.interrupted" not in types(feed_audio(session, tone(100), 1.6))


def test_stop_cancels_the_job_and_reports_usage() -> None:
    session = started()
    feed_audio(session, silence(1000), 0.5)
    send(session, {"type": "voice.text", "text": "x"}, 2.0)
    session.synthesis_audio("item_2", silence(480), (), 2.1)
    session.actions_to_send()
    frames = send(session, {"type": "voice.stop", "reason": "user"}, 2.5)
    assert frames[0] == CancelSynthesis("item_2")
    assert frames[1]["data"] == {"state": "idle"}
    assert frames[2]["type"] == "voice.ended"
    assert frames[2]["data"] == {
        "reason": "user",
        "usage": {"audioInSeconds": 1.0, "audioOutSeconds": 0.48, "costMicros": 220},
    }
    assert session.next_deadline() is None
    assert send(session, {"type": "voice.commit"}, 3.0)[0]["code"] == "voice_unavailable"


def test_synthesis_failure_is_provider_error_then_ended() -> None:
    session = started()
    send(session, {"type": "voice.text", "text": "x"}, 1.0)
    session.synthesis_failed("item_2", "model crashed", 1.1)
    frames = decode(session.actions_to_send())
    assert frames[0] == error("voice_provider_error", "synthesis failed: model crashed")
    assert frames[-1]["type"] == "voice.ended" and frames[-1]["data"]["reason"] == "error"


def test_idle_timer_ends_the_session() -> None:
    session = started(idle_seconds=30.0)
    assert session.next_deadline() == 30.0
    send(session, {"type": "voice.text", "text": "x"}, 10.0)
    assert session.next_deadline() == 600.0  # no idle timer while answering
    session.synthesis_done("item_2", 12.0)
    session.actions_to_send()
    assert session.next_deadline() == 42.0
    session.handle_timer(41.9)
    assert session.actions_to_send() == []
    session.handle_timer(42.0)
    frames = decode(session.actions_to_send())
    assert frames[-1]["type"] == "voice.ended" and frames[-1]["data"]["reason"] == "idle"


def test_limit_timer_ends_the_session() -> None:
    session = started(max_seconds=5.0, idle_seconds=30.0)
    send(session, {"type": "voice.text", "text": "x"}, 1.0)
    assert session.next_deadline() == 5.0
    session.handle_timer(5.0)
    frames = decode(session.actions_to_send())
    assert frames[0] == CancelSynthesis("item_2")
    assert frames[-1]["data"]["reason"] == "limit"


def test_speech_detector_is_chunk_invariant() -> None:
    pcm = silence(60) + tone(500) + silence(300) + tone(200) + silence(700)
    whole = EnergyDetector().process(pcm)
    detector = EnergyDetector()
    pieces = [e for i in range(0, len(pcm), 7) for e in detector.process(pcm[i : i + 7])]
    assert whole == pieces == [("started", 0), ("ended", 1000)]

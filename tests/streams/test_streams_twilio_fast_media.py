"""Twilio's inbound ``media`` fast path (no ``json.loads``) judges every text as the full path does.

``TwilioStreamProtocol.receive_text`` reads a ``media`` message written the
way Twilio writes it from a regular expression match; anything else goes
through ``MediaStreamProtocol.receive_text``. Each case here is fed to two
engines in the same state, one through ``receive_text`` and one through the
full path only, and everything observable must be equal: events, actions,
state, the next expected sequence number.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.streams import base as base_module
from bridge.streams.base import AudioReceived, MediaStreamProtocol, StreamSettings, StreamState
from bridge.streams.twilio import TwilioStreamProtocol

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
START = {
    "event": "start",
    "sequenceNumber": "1",
    "streamSid": SID,
    "start": {
        "streamSid": SID,
        "accountSid": "AC1",
        "callSid": "CA1",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
}
PAYLOAD = base64.b64encode(bytes(range(160))).decode()


def media(
    seq: str = "2",
    track: str = "inbound",
    chunk: str = "1",
    timestamp: str = "20",
    payload: str = PAYLOAD,
    sid: str = SID,
    spaced: bool = False,
) -> str:
    text = (
        f'{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"{track}",'
        f'"chunk":"{chunk}","timestamp":"{timestamp}","payload":"{payload}"}},'
        f'"streamSid":"{sid}"}}'
    )
    return text.replace('":', '": ').replace(',"', ', "') if spaced else text


def _pair(settings: StreamSettings | None = None) -> tuple[TwilioStreamProtocol, ...]:
    engines = []
    for _ in range(2):
        e = TwilioStreamProtocol(settings)
        e.connection_made(0.0)
        e.receive_text(json.dumps(START), 0.0)
        assert e.state is StreamState.STREAMING
        e.actions_to_send()
        e.events_received()
        engines.append(e)
    return tuple(engines)


def _observed(e: MediaStreamProtocol) -> tuple[Any, ...]:
    return (e.events_received(), e.actions_to_send(), e.state, e._expected_seq)


def _same(texts: list[str], settings: StreamSettings | None = None) -> list[Any]:
    fast, slow = _pair(settings)
    out = []
    for i, text in enumerate(texts):
        now = 0.02 * (i + 1)
        fast.receive_text(text, now)
        MediaStreamProtocol.receive_text(slow, text, now)
        got = _observed(fast)
        assert got == _observed(slow), text[:200]
        out.append(got)
    return out


def _forbid_json_loads(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    def no_json(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"json.loads called on the {path} path")

    monkeypatch.setattr(base_module.json, "loads", no_json)


def test_twilio_media_is_read_without_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = _pair()
    _forbid_json_loads(monkeypatch, "fast")
    for seq, spaced in ((2, False), (3, True)):
        fast.receive_text(media(seq=str(seq), spaced=spaced), 0.02)
        (event,) = fast.events_received()
        assert event == AudioReceived(bytes(range(160)), "mulaw", 8000, 20, 1)


_CASES = [  # messages both fast paths must treat as the full path does
    [media()],
    [media(seq="2"), media(seq="3"), media(seq="7"), media(seq="5")],  # gaps, repeats
    [media(track="outbound"), media(track="inbound_track"), media(track="")],
    [media(payload="")],  # empty audio: nothing emitted
    [media(payload="AAA")],  # bad padding: 1007
    [media(payload="AA==AA==")],
    [media(sid="MZother")],  # another stream: 1002
    [media(sid="")],
    [media(seq="1" * 19)],  # too many digits: the full path's error
    [media(chunk="0" * 18, timestamp="999999999999999999")],
    [media().replace('"payload"', '"payload2"')],  # no payload: the full path
    [media().replace("}", "", 1)],  # not JSON
    [media() + " "],  # trailing whitespace is still JSON
    [media().replace("inbound", "in\\u0062ound")],  # an escape: the full path
    [media(), '{"event":"stop","sequenceNumber":"3","streamSid":"' + SID + '"}', media()],
]
_TAKE_CASES = [
    *_CASES,
    [media(payload="AA AA")],
    [media(payload='AAAA\\"')],  # an escaped quote in the payload
    [media(sid=SID + '", "x": "y')],  # more keys after the stream id
    [media().replace('"},', '"} ,')],
    [media(), media(seq="3").replace('"streamSid":"', '"streamSid": "')],  # mixed spacing
    [media(seq="\u0663")],  # a digit, not ASCII: the full path's error
    [media(chunk="\u00b2"), media(timestamp="1\u0661", seq="3")],  # (isdigit() says yes)
    [media(chunk="1 ")],
    [media(timestamp="")],
    [media(chunk="9" * 19)],
    [media(timestamp="9" * 19)],
    [media().replace('"event":"media","', '"event":"media", "')],  # spaced after the head
    [media(track="inbound", spaced=True), media(seq="3", track="inbound_")],
]


@pytest.mark.parametrize("texts", _CASES)
def test_fast_and_full_paths_agree(texts: list[str]) -> None:
    _same(texts)


def test_oversized_media_is_refused_as_before() -> None:
    (got,) = _same([media()], StreamSettings(max_message_bytes=320))
    assert got[2] is StreamState.CLOSED


_digits = st.text("0123456789", min_size=0, max_size=20)
_b64ish = st.text("ABCDEFabcdef0189+/=", min_size=0, max_size=12)
_media_cases = st.lists(
    st.tuples(_digits, st.sampled_from(["inbound", "outbound", "", "x_y"]), _digits,
              _digits, _b64ish, st.sampled_from([SID, "", "MZ1"]), st.booleans()),
    min_size=1,
    max_size=6,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_media_cases)
def test_fuzzed_media_agree(cases: list[tuple[str, str, str, str, str, str, bool]]) -> None:
    _same([media(s, t, c, ts, p, sid, spaced) for s, t, c, ts, p, sid, spaced in cases])


# ------------------------------------------ take_media_text: the leg's per-message path


def _same_taken(texts: list[str], settings: StreamSettings | None = None) -> int:
    """Each text through ``take_media_text`` (else ``receive_text``) and through the full
    path only: a taken text is exactly one ``AudioReceived`` of that audio on the full
    path and nothing queued on the taking engine; everything else observable is equal.
    Returns how many texts were taken."""
    taking, slow = _pair(settings)
    taken = 0
    for i, text in enumerate(texts):
        now = 0.02 * (i + 1)
        audio = taking.take_media_text(text)
        if audio is None:
            taking.receive_text(text, now)
        MediaStreamProtocol.receive_text(slow, text, now)
        events, actions, state, seq = _observed(slow)
        if audio is not None:
            taken += 1
            assert [e for e in events if type(e) is AudioReceived] == events, text[:200]
            assert [e.payload for e in events] == [audio], text[:200]
            assert _observed(taking) == ([], [], state, seq) and actions == [], text[:200]
        else:
            assert _observed(taking) == (events, actions, state, seq), text[:200]
    return taken


def test_plain_media_is_taken_without_events_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    taking, _ = _pair()
    _forbid_json_loads(monkeypatch, "take")
    for seq, spaced, track in ((2, False, "inbound"), (3, True, ""), (4, False, "inbound_track")):
        audio = taking.take_media_text(media(seq=str(seq), spaced=spaced, track=track))
        assert audio == bytes(range(160))
        assert taking.events_received() == [] and taking.actions_to_send() == []
    assert taking._expected_seq == 5


@pytest.mark.parametrize("texts", _TAKE_CASES)
def test_taken_and_full_paths_agree(texts: list[str]) -> None:
    _same_taken(texts)


def test_plain_media_is_taken_in_order() -> None:
    texts = [media(seq=str(n), spaced=n % 2 == 0) for n in range(2, 12)]
    assert _same_taken(texts) == 10


def test_oversized_media_is_not_taken() -> None:
    assert _same_taken([media()], StreamSettings(max_message_bytes=320)) == 0


def test_a_stream_id_json_would_escape_is_never_taken() -> None:
    sid = 'MZ"q'
    start = json.loads(json.dumps(START))
    start["streamSid"] = start["start"]["streamSid"] = sid
    e = TwilioStreamProtocol()
    e.connection_made(0.0)
    e.receive_text(json.dumps(start), 0.0)
    assert e.state is StreamState.STREAMING
    text = media().replace(f'"streamSid":"{SID}"', '"streamSid":"MZ\\"q"')
    assert e.take_media_text(text) is None
    assert e.take_media_text(media().replace(SID, sid)) is None  # not JSON


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_media_cases)
def test_fuzzed_media_taken_agree(cases: list[tuple[str, str, str, str, str, str, bool]]) -> None:
    _same_taken([media(s, t, c, ts, p, sid, spaced) for s, t, c, ts, p, sid, spaced in cases])

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


def test_twilio_media_is_read_without_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _ = _pair()

    def no_json(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("json.loads called on the fast path")

    monkeypatch.setattr(base_module.json, "loads", no_json)
    for seq, spaced in ((2, False), (3, True)):
        fast.receive_text(media(seq=str(seq), spaced=spaced), 0.02)
        (event,) = fast.events_received()
        assert event == AudioReceived(bytes(range(160)), "mulaw", 8000, 20, 1)


@pytest.mark.parametrize(
    "texts",
    [
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
    ],
)
def test_fast_and_full_paths_agree(texts: list[str]) -> None:
    _same(texts)


def test_oversized_media_is_refused_as_before() -> None:
    (got,) = _same([media()], StreamSettings(max_message_bytes=320))
    assert got[2] is StreamState.CLOSED


_digits = st.text("0123456789", min_size=0, max_size=20)
_b64ish = st.text("ABCDEFabcdef0189+/=", min_size=0, max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(_digits, st.sampled_from(["inbound", "outbound", "", "x_y"]), _digits,
                  _digits, _b64ish, st.sampled_from([SID, "", "MZ1"]), st.booleans()),
        min_size=1,
        max_size=6,
    )
)  # fmt: skip
def test_fuzzed_media_agree(cases: list[tuple[str, str, str, str, str, str, bool]]) -> None:
    _same([media(s, t, c, ts, p, sid, spaced) for s, t, c, ts, p, sid, spaced in cases])

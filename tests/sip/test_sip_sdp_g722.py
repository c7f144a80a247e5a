"""G.722 in SDP: static payload type 9, ``G722/8000`` (RFC 3551 §4.5.2), negotiated when
offered and first in our preference order; in our offers when configured (issue 34)."""

from __future__ import annotations

import random

import pytest

from bridge.config import ConfigError, parse_config
from bridge.engine import SendDatagram
from bridge.sip.message import SipResponse, parse_message
from bridge.sip.sdp import build_answer, build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipSettings, TrunkConfig
from bridge.sip.ua import SipUserAgent

from .test_sip_trunks import CARRIER, invite

WIDEBAND_OFFER = (
    "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 9 0 8 101\r\n"
    "a=rtpmap:9 G722/8000\r\na=rtpmap:101 telephone-event/8000\r\na=ptime:20\r\n"
)


def test_g722_is_chosen_when_offered_and_preferred() -> None:
    sdp = parse_sdp(WIDEBAND_OFFER)
    audio = negotiate(sdp, ("G722", "PCMU", "PCMA"))
    assert audio is not None
    assert (audio.codec, audio.payload_type, audio.telephone_event_pt) == ("G722", 9, 101)
    answer = build_answer(sdp, audio, "203.0.113.10", 40002, 1, 1)
    assert "m=audio 40002 RTP/AVP 9 101\r\n" in answer
    assert "a=rtpmap:9 G722/8000\r\n" in answer  # the RTP clock, not the 16 kHz audio
    assert "G722/16000" not in answer


def test_g722_is_not_chosen_unless_first_or_alone() -> None:
    sdp = parse_sdp(WIDEBAND_OFFER)
    for codecs in (("PCMU", "PCMA"), ("PCMU", "G722"), ("PCMA", "G722", "PCMU")):
        audio = negotiate(sdp, codecs)
        assert audio is not None and audio.codec == codecs[0]
    g711_only = WIDEBAND_OFFER.replace(" 9 0 8 101", " 0 101")
    audio = negotiate(parse_sdp(g711_only), ("G722", "PCMU"))
    assert audio is not None and audio.codec == "PCMU"  # not offered: the next one
    assert negotiate(parse_sdp(g711_only), ("G722",)) is None  # 488


def test_static_pt_9_without_rtpmap_and_a_dynamic_pt_mapped_to_g722() -> None:
    bare = WIDEBAND_OFFER.replace("a=rtpmap:9 G722/8000\r\n", "")
    audio = negotiate(parse_sdp(bare), ("G722",))
    assert audio is not None and (audio.codec, audio.payload_type) == ("G722", 9)
    dynamic = WIDEBAND_OFFER.replace(" 9 0 8 101", " 97 0 101").replace(
        "rtpmap:9 G722", "rtpmap:97 g722"
    )
    audio = negotiate(parse_sdp(dynamic), ("G722",))
    assert audio is not None and (audio.codec, audio.payload_type) == ("G722", 97)


def test_g722_at_a_16khz_clock_is_not_taken() -> None:
    """``G722/16000`` is not the registered clock: a peer writing it would stamp 320 per
    frame, which we do not (RFC 3551 §4.5.2)."""
    wrong = WIDEBAND_OFFER.replace(" 9 0 8 101", " 9 101").replace("G722/8000", "G722/16000")
    assert negotiate(parse_sdp(wrong), ("G722", "PCMU")) is None


def test_unknown_names_in_our_list_are_passed_over() -> None:
    speex = WIDEBAND_OFFER.replace(" 9 0 8 101", " 97 0 101").replace(
        "a=rtpmap:9 G722/8000", "a=rtpmap:97 speex/8000"
    )
    audio = negotiate(parse_sdp(speex), ("SPEEX", "PCMU"))
    assert audio is not None and audio.codec == "PCMU"


def test_offer_includes_g722_when_configured_and_reads_the_answer() -> None:
    offer = build_offer("203.0.113.10", 40000, 5, 1, codecs=("G722", "PCMU", "PCMA"))
    assert "m=audio 40000 RTP/AVP 9 0 8 101\r\n" in offer
    assert "a=rtpmap:9 G722/8000\r\n" in offer
    assert " 9 " not in build_offer("203.0.113.10", 40000, 5, 1)  # G.711 by default
    answer = parse_sdp(offer)  # a peer answering with the same stream
    audio = negotiate(answer, ("PCMU", "G722"))
    assert audio is not None and audio.codec == "PCMU"
    audio = negotiate(answer, ("G722",))
    assert audio is not None and audio.codec == "G722"


MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
api_key = "sk-inline-secret"
[[routes]]
match = "*"
provider = "p"
"""


def test_config_accepts_g722_and_keeps_g711_the_default() -> None:
    cfg = parse_config(MINIMAL, "<string>", {})
    assert cfg.sip.codecs == ("PCMU", "PCMA")
    text = MINIMAL + '[sip]\ncodecs = ["G722", "PCMU"]\n'
    text += '[trunks.t]\noutbound_proxy = "sip:10.0.0.1"\ncodecs = ["G722", "PCMA"]\n'
    cfg = parse_config(text, "<string>", {})
    assert cfg.sip.codecs == ("G722", "PCMU")
    assert cfg.trunks[0].codecs == ("G722", "PCMA")


@pytest.mark.parametrize("where", ["sip", "trunks.t"])
def test_config_still_names_the_key_of_an_unknown_codec(where: str) -> None:
    text = MINIMAL + f'[{where}]\ncodecs = ["G722", "SPEEX"]\n'
    if where != "sip":
        text += 'outbound_proxy = "sip:10.0.0.1"\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text, "<string>", {})
    assert any("codecs" in e and "'SPEEX'" in e for e in info.value.errors), info.value.errors


def _answer_sdp(ua: SipUserAgent) -> str:
    for action in ua.actions_to_send():
        assert isinstance(action, SendDatagram)
        message = parse_message(action.data)
        assert isinstance(message, SipResponse)
        if message.body:
            return message.body.decode()
    return ""


def test_a_trunk_preferring_g722_gets_it_from_the_user_agent() -> None:
    wide = TrunkConfig("w", "sip:c.example", sources=("192.0.2.0/24",), codecs=("G722", "PCMU"))
    settings = SipSettings(local_host="127.0.0.1", session_expires_s=0, trunks=(wide,))
    ua = SipUserAgent(settings, random.Random(3))
    ua.receive_datagram(invite("c1", CARRIER, sdp=WIDEBAND_OFFER), CARRIER, 0.0)
    (offered,) = [e for e in ua.events_received() if type(e).__name__ == "CallOffered"]
    audio = negotiate(parse_sdp(offered.offer_sdp), wide.codecs)  # what the leg answers with
    assert audio is not None and audio.codec == "G722"

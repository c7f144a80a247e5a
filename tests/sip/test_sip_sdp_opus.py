"""Opus in SDP (RFC 7587): a dynamic payload type, ``opus/48000/2`` always, the peer's
``a=fmtp`` read, telephone-event at 48 kHz beside it; config accepts ``OPUS`` (issue 34)."""

from __future__ import annotations

import random

import pytest

from bridge.config import ConfigError, parse_config
from bridge.sip.events import CallOffered
from bridge.sip.sdp import (
    OPUS_EVENT_PT,
    OPUS_PT,
    OpusParams,
    build_answer,
    build_offer,
    negotiate,
    parse_sdp,
)
from bridge.sip.settings import SipSettings, TrunkConfig
from bridge.sip.ua import SipUserAgent

from .test_sip_sdp_g722 import MINIMAL
from .test_sip_trunks import CARRIER, invite

# as a WebRTC gateway or a softphone offers it: Opus first, both telephone-events
OPUS_OFFER = (
    "v=0\r\no=- 1 1 IN IP4 192.0.2.10\r\ns=-\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 107 0 8 105 101\r\n"
    "a=rtpmap:107 opus/48000/2\r\n"
    "a=fmtp:107 maxplaybackrate=24000; sprop-stereo=1;useinbandfec=1;bogus;x=y\r\n"
    "a=rtpmap:105 telephone-event/48000\r\na=fmtp:105 0-16\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\na=ptime:20\r\n"
)


def test_opus_at_the_peers_payload_type_with_its_48khz_events() -> None:
    sdp = parse_sdp(OPUS_OFFER)
    audio = negotiate(sdp, ("OPUS", "PCMU"))
    assert audio is not None
    assert (audio.codec, audio.payload_type, audio.telephone_event_pt) == ("OPUS", 107, 105)
    assert (audio.clock_rate_hz, audio.samples_per_frame) == (48000, 960)
    assert audio.opus == OpusParams(
        max_playback_rate_hz=24000, stereo=False, sprop_stereo=True, use_inband_fec=True
    )
    answer = build_answer(sdp, audio, "203.0.113.10", 40002, 1, 1)
    assert "m=audio 40002 RTP/AVP 107 105\r\n" in answer
    assert "a=rtpmap:107 opus/48000/2\r\n" in answer  # RFC 7587 §7: /2 even for mono
    assert "a=fmtp:107 maxplaybackrate=16000;sprop-maxcapturerate=16000\r\n" in answer
    assert "a=rtpmap:105 telephone-event/48000\r\n" in answer
    assert "telephone-event/8000" not in answer


def test_g711_calls_keep_their_8khz_events() -> None:
    audio = negotiate(parse_sdp(OPUS_OFFER), ("PCMU", "OPUS"))
    assert audio is not None
    assert (audio.codec, audio.telephone_event_pt, audio.clock_rate_hz) == ("PCMU", 101, 8000)
    assert audio.opus is None and audio.samples_per_frame == 160


def test_opus_with_only_8khz_events_gets_none() -> None:
    """RFC 4733 §2.1: the events' clock is the audio's; the call listens in-band instead."""
    only8k = OPUS_OFFER.replace(" 105 101", " 101").replace(
        "a=rtpmap:105 telephone-event/48000\r\na=fmtp:105 0-16\r\n", ""
    )
    audio = negotiate(parse_sdp(only8k), ("OPUS",))
    assert audio is not None and audio.codec == "OPUS" and audio.telephone_event_pt is None


def test_opus_needs_its_48khz_clock_and_a_mapping() -> None:
    wrong = OPUS_OFFER.replace("opus/48000/2", "opus/16000")
    audio = negotiate(parse_sdp(wrong), ("OPUS", "PCMU"))
    assert audio is not None and audio.codec == "PCMU"
    no_channels = OPUS_OFFER.replace("opus/48000/2", "OPUS/48000")  # lenient on the rest
    audio = negotiate(parse_sdp(no_channels), ("OPUS",))
    assert audio is not None and audio.codec == "OPUS"
    unmapped = OPUS_OFFER.replace("a=rtpmap:107 opus/48000/2\r\n", "")
    assert negotiate(parse_sdp(unmapped), ("OPUS",)) is None  # 488


def test_fmtp_defaults_and_garbage() -> None:
    assert OpusParams.parse("") == OpusParams()
    assert OpusParams.parse("maxplaybackrate=abc;stereo=1").max_playback_rate_hz == 48000
    assert OpusParams.parse("stereo=1").stereo
    bare = OPUS_OFFER.replace(
        "a=fmtp:107 maxplaybackrate=24000; sprop-stereo=1;useinbandfec=1;bogus;x=y\r\n", ""
    )
    audio = negotiate(parse_sdp(bare), ("OPUS",))
    assert audio is not None and audio.opus == OpusParams()


def test_offer_with_opus_has_111_and_both_event_clocks() -> None:
    offer = build_offer("203.0.113.10", 40000, 5, 1, codecs=("OPUS", "PCMU"))
    assert f"m=audio 40000 RTP/AVP {OPUS_PT} 0 101 {OPUS_EVENT_PT}\r\n" in offer
    assert "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 maxplaybackrate=16000" in offer
    assert "a=rtpmap:101 telephone-event/8000\r\n" in offer
    assert "a=rtpmap:110 telephone-event/48000\r\n" in offer
    only = build_offer("203.0.113.10", 40000, 5, 1, codecs=("OPUS",))
    assert "m=audio 40000 RTP/AVP 111 110\r\n" in only and "/8000" not in only
    assert "opus" not in build_offer("203.0.113.10", 40000, 5, 1)  # G.711 by default


@pytest.mark.parametrize(
    ("answered", "codec", "te"), [("111 110", "OPUS", 110), ("0 101", "PCMU", 101)]
)
def test_reading_the_answer_to_our_offer(answered: str, codec: str, te: int) -> None:
    offer = build_offer("203.0.113.10", 40000, 5, 1, codecs=("OPUS", "PCMU"))
    answer = offer.replace(f"RTP/AVP {OPUS_PT} 0 101 {OPUS_EVENT_PT}", f"RTP/AVP {answered}")
    audio = negotiate(parse_sdp(answer), ("PCMU", "PCMA", "G722", "OPUS"))  # as the UA does
    assert audio is not None and (audio.codec, audio.telephone_event_pt) == (codec, te)


def test_config_accepts_opus() -> None:
    text = MINIMAL + '[sip]\ncodecs = ["OPUS", "G722", "PCMU"]\n'
    text += '[trunks.t]\noutbound_proxy = "sip:10.0.0.1"\ncodecs = ["OPUS", "PCMA"]\n'
    cfg = parse_config(text, "<string>", {})
    assert cfg.sip.codecs == ("OPUS", "G722", "PCMU")
    assert cfg.trunks[0].codecs == ("OPUS", "PCMA")
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + '[sip]\ncodecs = ["OPUS", "ILBC"]\n', "<string>", {})
    assert any("codecs" in e and "'ILBC'" in e for e in info.value.errors), info.value.errors


def test_a_trunk_preferring_opus_gets_it_from_the_user_agent() -> None:
    wide = TrunkConfig("w", "sip:c.example", sources=("192.0.2.0/24",), codecs=("OPUS", "PCMU"))
    settings = SipSettings(local_host="127.0.0.1", session_expires_s=0, trunks=(wide,))
    ua = SipUserAgent(settings, random.Random(3))
    ua.receive_datagram(invite("c1", CARRIER, sdp=OPUS_OFFER), CARRIER, 0.0)
    (offered,) = [e for e in ua.events_received() if isinstance(e, CallOffered)]
    audio = negotiate(parse_sdp(offered.offer_sdp), wide.codecs)
    assert audio is not None and audio.codec == "OPUS"

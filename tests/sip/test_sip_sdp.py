"""SDP offer/answer for audio (RFC 3264, 8866, 3551, 4733)."""

from __future__ import annotations

import pytest

from bridge.sip.sdp import (
    SdpError,
    answer_direction,
    build_answer,
    build_offer,
    negotiate,
    parse_sdp,
    srtp_refusal,
)

OFFER = (
    "v=0\r\n"
    "o=carrier 2890844526 2890844526 IN IP4 198.51.100.10\r\n"
    "s=call\r\n"
    "c=IN IP4 198.51.100.10\r\n"
    "t=0 0\r\n"
    "m=audio 49170 RTP/AVP 9 8 0 96\r\n"
    "a=rtpmap:9 G722/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:96 telephone-event/8000\r\n"
    "a=fmtp:96 0-15\r\n"
    "a=ptime:20\r\n"
    "m=video 51372 RTP/AVP 31\r\n"
    "a=rtpmap:31 H261/90000\r\n"
)


def test_parse_offer_fields() -> None:
    sdp = parse_sdp(OFFER)
    assert sdp.origin.session_version == 2890844526
    assert sdp.connection == "198.51.100.10"
    audio, video = sdp.media
    assert audio.port == 49170 and audio.formats == ("9", "8", "0", "96")
    assert (96, "telephone-event", 8000) in audio.rtpmap
    assert audio.fmtp == ((96, "0-15"),) and audio.ptime_ms == 20
    assert video.media == "video"


def test_preference_order_and_echoed_telephone_event_pt() -> None:
    sdp = parse_sdp(OFFER)
    pcmu_first = negotiate(sdp, ("PCMU", "PCMA"))
    assert pcmu_first is not None
    assert (pcmu_first.codec, pcmu_first.payload_type) == ("PCMU", 0)
    assert pcmu_first.telephone_event_pt == 96
    assert pcmu_first.remote_addr == ("198.51.100.10", 49170)
    pcma_first = negotiate(sdp, ("PCMA", "PCMU"))
    assert pcma_first is not None and pcma_first.payload_type == 8


def test_answer_keeps_m_lines_and_rejects_video_with_port_zero() -> None:
    sdp = parse_sdp(OFFER)
    audio = negotiate(sdp, ("PCMU",))
    assert audio is not None
    answer = build_answer(sdp, audio, "203.0.113.10", 40000, 1, 1)
    parsed = parse_sdp(answer)
    assert [m.media for m in parsed.media] == ["audio", "video"]
    assert parsed.media[1].port == 0
    ours = parsed.media[0]
    assert ours.port == 40000 and ours.formats == ("0", "96")
    assert ours.direction == "sendrecv" and ours.ptime_ms == 20
    assert parsed.connection == "203.0.113.10"
    assert "a=rtpmap:96 telephone-event/8000" in answer


@pytest.mark.parametrize(
    ("offered", "answered"),
    [
        ("sendrecv", "sendrecv"),
        ("sendonly", "recvonly"),
        ("recvonly", "sendonly"),
        ("inactive", "inactive"),
    ],
)
def test_direction_rules(offered: str, answered: str) -> None:
    sdp = parse_sdp(OFFER.replace("a=ptime:20\r\n", f"a=ptime:20\r\na={offered}\r\n"))
    audio = negotiate(sdp, ("PCMU",))
    assert audio is not None and audio.remote_direction == offered
    assert audio.remote_on_hold is (offered in ("sendonly", "inactive"))
    assert (
        parse_sdp(build_answer(sdp, audio, "203.0.113.10", 4000, 1, 2)).media[0].direction
        == answered
    )


def test_answer_direction_intersects_with_what_we_want() -> None:
    assert answer_direction("sendrecv", "sendonly") == "sendonly"
    assert answer_direction("sendonly", "sendonly") == "inactive"
    assert answer_direction("recvonly", "inactive") == "inactive"


def test_session_level_direction_and_media_level_override() -> None:
    text = OFFER.replace("t=0 0\r\n", "t=0 0\r\na=sendonly\r\n")
    audio = negotiate(parse_sdp(text), ("PCMU",))
    assert audio is not None and audio.remote_direction == "sendonly"
    text2 = text.replace("a=ptime:20\r\n", "a=ptime:20\r\na=sendrecv\r\n")
    audio2 = negotiate(parse_sdp(text2), ("PCMU",))
    assert audio2 is not None and audio2.remote_direction == "sendrecv"


def test_legacy_hold_with_zero_address_and_media_level_ipv6() -> None:
    held = negotiate(
        parse_sdp(OFFER.replace("c=IN IP4 198.51.100.10", "c=IN IP4 0.0.0.0")), ("PCMU",)
    )
    assert held is not None and held.remote_addr is None and held.remote_on_hold
    v6 = OFFER.replace("a=ptime:20\r\n", "a=ptime:20\r\nc=IN IP6 2001:db8::7\r\n")
    audio = negotiate(parse_sdp(v6), ("PCMU",))
    assert audio is not None and audio.remote_addr == ("2001:db8::7", 49170)
    answer = build_answer(parse_sdp(v6), audio, "2001:db8::1", 4000, 5, 5)
    assert "c=IN IP6 2001:db8::1" in answer


def test_no_acceptable_codec_or_rejected_stream_means_488() -> None:
    g722_only = OFFER.replace("m=audio 49170 RTP/AVP 9 8 0 96", "m=audio 49170 RTP/AVP 9 96")
    assert negotiate(parse_sdp(g722_only), ("PCMU", "PCMA")) is None
    port_zero = OFFER.replace("m=audio 49170", "m=audio 0")
    assert negotiate(parse_sdp(port_zero), ("PCMU",)) is None
    # RTP/SAVP with no key is negotiated, and refused by srtp_refusal (488) in any mode
    srtp = OFFER.replace("RTP/AVP 9 8 0 96", "RTP/SAVP 9 8 0 96")
    audio = negotiate(parse_sdp(srtp), ("PCMU",))
    assert audio is not None and (audio.proto, audio.crypto) == ("RTP/SAVP", ())
    for mode in ("off", "offer", "require"):
        assert srtp_refusal(audio, "TLS", mode) == "RTP/SAVP without a supported crypto suite"


def test_dynamic_payload_type_mapped_to_pcmu_is_kept() -> None:
    text = OFFER.replace("m=audio 49170 RTP/AVP 9 8 0 96", "m=audio 49170 RTP/AVP 110").replace(
        "a=rtpmap:9 G722/8000", "a=rtpmap:110 PCMU/8000"
    )
    audio = negotiate(parse_sdp(text), ("PCMU",))
    assert audio is not None and audio.payload_type == 110 and audio.telephone_event_pt is None


def test_offer_roundtrip_and_answer_to_it() -> None:
    offer = build_offer("203.0.113.10", 40002, 77, 1, codecs=("PCMA", "PCMU"))
    parsed = parse_sdp(offer)
    assert parsed.media[0].formats == ("8", "0", "101")
    assert parsed.origin.session_id == "77"
    audio = negotiate(parsed, ("PCMU", "PCMA"))
    assert audio is not None and audio.codec == "PCMU" and audio.telephone_event_pt == 101


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "v=1\r\n",
        "v=0\r\ns=x\r\n",
        "v=0\r\no=- x y IN IP4 1.2.3.4\r\n",
        OFFER.replace("m=audio 49170", "m=audio 99999"),
        OFFER.replace("c=IN IP4 198.51.100.10", "c=IN IPX 1"),
        OFFER.replace("a=rtpmap:8 PCMA/8000", "a=rtpmap:800 PCMA/8000"),
        "v=0\r\n" + "junk\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\n" + "m=audio 1 RTP/AVP 0\r\n" * 17,
    ],
)
def test_malformed_sdp_raises_sdp_error(bad: str) -> None:
    with pytest.raises(SdpError):
        parse_sdp(bad)

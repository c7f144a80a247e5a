"""A G.722 SIP call as the call engine sees it: a 16 kHz linear leg (``_SipCall`` encodes
and decodes G.722 around it with the call's own codecs). The provider is asked for 16 kHz
PCM, bot frames encode to 160-byte payloads, and the caller's G.722 speech barges in
after decoding (issue 34)."""

from __future__ import annotations

import pytest
from call_harness import (
    SIP_16K,
    Harness,
    peak_hz,
    ticks_until_caller_barges_in,
    tone_s16le,
    tone_turn_through_codec,
)

from bridge.providers.base import AudioFormat
from bridge.rtp.dtmf import InbandDtmf
from telcodec import g722
from telcodec.dtmf import generate as dtmf_tones


def test_the_provider_is_asked_for_16khz_and_frames_encode_to_g722_payloads() -> None:
    payloads, heard = tone_turn_through_codec(
        g722.G722Encoder(), g722.G722Decoder(), tone_s=0.2, ticks=12
    )
    # one RTP packet each, 160 ticks of the 8 kHz RTP clock
    assert [len(p) for p in payloads] == [160] * 11
    assert peak_hz(heard, 1600, 3200) == pytest.approx(6000, abs=20)


def test_the_provider_at_another_rate_is_resampled_to_16khz() -> None:
    h = Harness(SIP_16K)
    h.say("t1")
    h.audio("t1", tone_s16le(1000.0, 0.2, 24000), 0.0, AudioFormat("pcm_s16le", 24000))
    h.done("t1", now=0.0)
    frames = [f for f in (h.tick(n) for n in range(1, 13)) if f is not None]
    assert len(frames) in (10, 11) and all(len(f) == g722.FRAME_BYTES for f in frames)


def test_caller_speech_decoded_from_g722_barges_in() -> None:
    # the phone's encoder, and the leg's decoder
    n = ticks_until_caller_barges_in(g722.G722Encoder(), g722.G722Decoder())
    assert n < 20  # within a few hundred ms of speech, as on G.711


def test_inband_dtmf_is_heard_on_decoded_g722_at_16khz() -> None:
    """No telephone-event negotiated: the leg's in-band detector reads the decoded audio."""
    tones = dtmf_tones("59", sample_rate_hz=16000, tone_ms=100, gap_ms=100)
    tones += bytes(-len(tones) % g722.FRAME_BYTES)
    encoder, decoder = g722.G722Encoder(), g722.G722Decoder()
    inband = InbandDtmf("linear", 16000)
    digits = []
    for i in range(0, len(tones), g722.FRAME_BYTES):
        digits += inband.process(decoder.decode(encoder.encode(tones[i : i + g722.FRAME_BYTES])))
    assert digits == ["5", "9"]

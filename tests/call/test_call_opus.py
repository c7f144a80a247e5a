"""An Opus SIP call as the call engine sees it: the same 16 kHz linear leg as G.722
(``_SipCall`` encodes and decodes Opus around it). Bot frames encode to Opus packets that
carry a 6 kHz tone, and the caller's Opus speech barges in after decoding (issue 34)."""

from __future__ import annotations

import pytest
from call_harness import peak_hz, ticks_until_caller_barges_in, tone_turn_through_codec

from telcodec import opus


def test_the_provider_is_asked_for_16khz_and_frames_encode_to_opus_packets() -> None:
    payloads, heard = tone_turn_through_codec(
        opus.OpusEncoder(), opus.OpusDecoder(), tone_s=0.3, ticks=16
    )
    # one RTP packet of 960 ticks each, its size varies
    assert len(payloads) == 15 and all(0 < len(p) < 400 for p in payloads)
    assert peak_hz(heard, 1600, 4800) == pytest.approx(6000, abs=20)


def test_caller_speech_decoded_from_opus_barges_in() -> None:
    # the phone's encoder, and the leg's decoder
    n = ticks_until_caller_barges_in(opus.OpusEncoder(), opus.OpusDecoder())
    assert n < 20  # within a few hundred ms of speech, as on G.711 and G.722

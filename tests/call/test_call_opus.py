"""An Opus SIP call as the call engine sees it: the same 16 kHz linear leg as G.722
(``_SipCall`` encodes and decodes Opus around it). Bot frames encode to Opus packets that
carry a 6 kHz tone, and the caller's Opus speech barges in after decoding (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest
from call_harness import Harness, at, of_type, tone_s16le, voiced_s16le

from bridge.commands import TurnInterrupted
from bridge.media.call_types import LegProfile, OpenTurn
from bridge.providers.base import AudioFormat
from telcodec import opus

pytestmark = pytest.mark.skipif(not opus.available(), reason="PyAV with libopus not installed")

OPUS_LEG = LegProfile(kind="sip", codec="pcm_s16le", sample_rate_hz=16000, heard_from="frames")
"""What ``bridge.io.legs.sip`` builds for a call that negotiated Opus."""


def test_the_provider_is_asked_for_16khz_and_frames_encode_to_opus_packets() -> None:
    h = Harness(OPUS_LEG)
    h.say("t1")
    actions, _ = h.take()
    assert isinstance(actions[0], OpenTurn)
    assert actions[0].settings.audio_format == AudioFormat("pcm_s16le", 16000)
    h.audio("t1", tone_s16le(6000.0, 0.3, 16000, peak=0.3), 0.0, AudioFormat("pcm_s16le", 16000))
    h.done("t1", now=0.0)
    encoder, decoder = opus.OpusEncoder(), opus.OpusDecoder()
    heard = b""
    for n in range(1, 16):
        frame = h.tick(n)
        payload = encoder.encode_silence() if frame is None else encoder.encode(frame)
        assert 0 < len(payload) < 400  # one RTP packet of 960 ticks, its size varies
        heard += decoder.decode(payload)
    pcm = np.frombuffer(heard, dtype="<i2").astype(np.float64)[1600:4800]
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    assert np.fft.rfftfreq(len(pcm), 1 / 16000)[spectrum.argmax()] == pytest.approx(6000, abs=20)


def test_caller_speech_decoded_from_opus_barges_in() -> None:
    h = Harness(OPUS_LEG)
    h.say("t1")
    h.audio("t1", bytes(640) * 50, now=0.0, audio_format=AudioFormat("pcm_s16le", 16000))
    voice = voiced_s16le(1.0, rate_hz=16000)
    caller_side, ours = opus.OpusEncoder(), opus.OpusDecoder()  # the phone's, and the leg's
    n = 0
    for n in range(1, 50):
        assert h.tick(n) == bytes(640)
        h.caller(ours.decode(caller_side.encode(voice[(n - 1) * 640 : n * 640])), at(n) + 0.005)
        if of_type(h.events, TurnInterrupted):
            break
    assert of_type(h.events, TurnInterrupted)[0].reason == "speech"
    assert n < 20  # within a few hundred ms of speech, as on G.711 and G.722

"""A G.722 SIP call as the call engine sees it: a 16 kHz linear leg (``_SipCall`` encodes
and decodes G.722 around it with the call's own codecs). The provider is asked for 16 kHz
PCM, bot frames encode to 160-byte payloads, and the caller's G.722 speech barges in
after decoding (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest
from call_harness import Harness, at, of_type, tone_s16le, voiced_s16le

from bridge.commands import TurnInterrupted
from bridge.media.call_types import LegProfile, OpenTurn
from bridge.providers.base import AudioFormat
from bridge.rtp.dtmf import InbandDtmf
from telcodec import g722
from telcodec.dtmf import generate as dtmf_tones

pytestmark = pytest.mark.skipif(not g722.available(), reason="PyAV with G.722 not installed")

G722_LEG = LegProfile(kind="sip", codec="pcm_s16le", sample_rate_hz=16000, heard_from="frames")
"""What ``bridge.io.legs.sip`` builds for a call that negotiated G.722."""


def test_the_provider_is_asked_for_16khz_and_frames_encode_to_g722_payloads() -> None:
    h = Harness(G722_LEG)
    h.say("t1")
    actions, _ = h.take()
    assert isinstance(actions[0], OpenTurn)
    assert actions[0].settings.audio_format == AudioFormat("pcm_s16le", 16000)
    # a 6 kHz tone: only a 16 kHz leg carries it (a provider at 8 kHz could not send it)
    h.audio("t1", tone_s16le(6000.0, 0.2, 16000, peak=0.3), 0.0, AudioFormat("pcm_s16le", 16000))
    h.done("t1", now=0.0)
    encoder, decoder = g722.G722Encoder(), g722.G722Decoder()
    heard = b""
    for n in range(1, 12):
        frame = h.tick(n)
        payload = encoder.encode_silence() if frame is None else encoder.encode(frame)
        assert len(payload) == 160  # one RTP packet, 160 ticks of the 8 kHz RTP clock
        heard += decoder.decode(payload)
    pcm = np.frombuffer(heard, dtype="<i2").astype(np.float64)[1600:3200]
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    assert np.fft.rfftfreq(len(pcm), 1 / 16000)[spectrum.argmax()] == pytest.approx(6000, abs=20)


def test_the_provider_at_another_rate_is_resampled_to_16khz() -> None:
    h = Harness(G722_LEG)
    h.say("t1")
    h.audio("t1", tone_s16le(1000.0, 0.2, 24000), 0.0, AudioFormat("pcm_s16le", 24000))
    h.done("t1", now=0.0)
    frames = [f for f in (h.tick(n) for n in range(1, 13)) if f is not None]
    assert len(frames) in (10, 11) and all(len(f) == g722.FRAME_BYTES for f in frames)


def test_caller_speech_decoded_from_g722_barges_in() -> None:
    h = Harness(G722_LEG)
    h.say("t1")
    h.audio("t1", bytes(640) * 50, now=0.0, audio_format=AudioFormat("pcm_s16le", 16000))
    voice = voiced_s16le(1.0, rate_hz=16000)
    caller_side, ours = g722.G722Encoder(), g722.G722Decoder()  # the phone's, and the leg's
    n = 0
    for n in range(1, 50):
        assert h.tick(n) == bytes(640)
        payload = caller_side.encode(voice[(n - 1) * 640 : n * 640])
        h.caller(ours.decode(payload), at(n) + 0.005)
        if of_type(h.events, TurnInterrupted):
            break
    assert of_type(h.events, TurnInterrupted)[0].reason == "speech"
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

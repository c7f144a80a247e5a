"""The SIP leg's G.722 codecs (``G722Media``): each caller packet decoded once, as it
arrives, and the playout path given that decode by sequence number (issue 34)."""

from __future__ import annotations

import numpy as np

from bridge.io.legs.sip_call import G722_HELD_DECODES, G722Media
from telcodec import g722


def _payloads(count: int) -> list[bytes]:
    t = np.arange(count * g722.FRAME_SAMPLES) / g722.SAMPLE_RATE_HZ
    pcm = (8000 * np.sin(2 * np.pi * 700 * t)).astype("<i2").tobytes()
    return [g722.G722Encoder().encode(pcm)[i : i + 160] for i in range(0, count * 160, 160)]


def test_playout_gets_the_decode_made_on_arrival() -> None:
    payloads = _payloads(5)
    reference = g722.G722Decoder()
    media = G722Media()
    for seq, payload in enumerate(payloads):
        heard = media.arrived(seq, payload)
        assert heard == reference.decode(payload)  # one decoder, fed in order
        assert media.played(seq, payload) is heard  # not decoded twice
    assert media.decoded == {}


def test_a_packet_not_seen_arriving_is_decoded_when_played() -> None:
    payloads = _payloads(3)
    media = G722Media()
    media.arrived(0, payloads[0])
    media.played(0, payloads[0])
    assert len(media.played(1, payloads[1])) == g722.FRAME_BYTES


def test_decodes_the_jitter_buffer_never_plays_are_bounded() -> None:
    media = G722Media()
    payload = _payloads(1)[0]
    for seq in range(G722_HELD_DECODES + 10):
        media.arrived(seq, payload)
    assert len(media.decoded) == G722_HELD_DECODES
    assert min(media.decoded) == 10  # the oldest went first

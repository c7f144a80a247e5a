"""G.722 (ITU-T, 64 kbit/s sub-band ADPCM): 16 kHz wideband in 20 ms frames.

Theory of operation
-------------------
G.722 splits 16 kHz audio into two 8 kHz sub-bands (QMF) and codes each with
ADPCM: 6 bits a sample for the low band, 2 for the high band, one byte per
pair of input samples. 20 ms is 320 samples of s16le (640 bytes) in, 160
bytes out. Unlike G.711 it is **stateful**: the predictor and the QMF
filters carry over from one frame to the next, so each direction of a call
needs its own ``G722Encoder`` or ``G722Decoder``, fed every frame in order
(a frame skipped, or fed twice, costs a short glitch while the state
re-converges). The codec's delay is 22 samples (1.4 ms) end to end.

In RTP (RFC 3551 §4.5.2) G.722 is static payload type 9 with a clock rate
of 8000, a historical error kept for compatibility: a 20 ms frame advances
the RTP timestamp by 160 although it carries 320 samples. That is the RTP
layer's business; nothing here knows about timestamps.

The codec is libavcodec's, through PyAV (``av``), which aiortc depends on
(``aiortc/codecs/g722.py`` uses it the same way): no new dependency, and C
speed (about 17 µs to encode a frame and 9 µs to decode one, see
``bench/bench_g722.py``). ``av`` is imported when the first encoder or
decoder is made, not with this module, so the rest of ``telcodec`` keeps
its few dependencies; ``available()`` says whether it can be.

Rules:

1. Linear audio is signed 16-bit little-endian (``s16le``) at 16 kHz.
2. ``G722Encoder.encode`` takes whole 20 ms frames (a multiple of 640 bytes)
   and ``G722Decoder.decode`` any whole number of bytes; anything else is a
   caller error and raises ``ValueError``.
"""

from __future__ import annotations

from typing import Final

from telcodec import _av

__all__ = [
    "FRAME_BYTES",
    "FRAME_SAMPLES",
    "PAYLOAD_BYTES",
    "RTP_CLOCK_RATE_HZ",
    "SAMPLE_RATE_HZ",
    "G722Decoder",
    "G722Encoder",
    "available",
]

SAMPLE_RATE_HZ: Final = _av.SAMPLE_RATE_HZ
"""The audio's sample rate."""
RTP_CLOCK_RATE_HZ: Final = 8000
"""The RTP clock rate of payload type 9 (RFC 3551 §4.5.2): half the sample rate."""
FRAME_SAMPLES: Final = _av.FRAME_SAMPLES
"""Samples in one 20 ms frame at 16 kHz."""
FRAME_BYTES: Final = FRAME_SAMPLES * 2
"""Bytes of one 20 ms frame of s16le."""
PAYLOAD_BYTES: Final = FRAME_SAMPLES // 2
"""Bytes of one 20 ms G.722 frame (64 kbit/s)."""


def available() -> bool:
    """Whether PyAV, and its G.722 codec, can be loaded here."""
    return _av.available("g722")


class G722Encoder:
    """One stream of s16le 16 kHz in, G.722 out (one per call direction)."""

    __slots__ = ("_context", "_frame_type", "_pts")

    def __init__(self) -> None:
        from av import AudioFrame

        self._context = _av.context("g722", "w", SAMPLE_RATE_HZ, "G.722")
        self._frame_type = AudioFrame
        self._pts = 0

    def encode(self, pcm_s16le: bytes) -> bytes:
        """Encode whole 20 ms frames: 640 bytes in, 160 bytes out each.

        Raises:
            ValueError: ``pcm_s16le`` is not a whole number of 640-byte frames.
        """
        size = len(pcm_s16le)
        if size % FRAME_BYTES:
            raise ValueError(f"G.722 encodes whole 20 ms frames of {FRAME_BYTES} bytes, got {size}")
        out = []
        samples = _av.samples(pcm_s16le)
        for start in range(0, size // 2, FRAME_SAMPLES):
            frame = _av.frame(self._frame_type, samples[start : start + FRAME_SAMPLES], self._pts)
            self._pts += FRAME_SAMPLES
            for packet in self._context.encode(frame):
                out.append(bytes(packet))
        return b"".join(out)

    def encode_silence(self) -> bytes:
        """One 20 ms frame of silence, through the stream's state (comfort noise between
        turns keeps the encoder's history the far end's decoder has)."""
        return self.encode(bytes(FRAME_BYTES))


class G722Decoder:
    """One stream of G.722 in, s16le 16 kHz out (one per call direction)."""

    __slots__ = ("_context", "_packet_type")

    def __init__(self) -> None:
        from av import Packet

        self._context = _av.context("g722", "r", SAMPLE_RATE_HZ, "G.722")
        self._packet_type = Packet

    def decode(self, payload: bytes) -> bytes:
        """Decode G.722 bytes: each byte is two samples (160 bytes: one 20 ms frame, 640 out)."""
        if not payload:
            return b""
        pcm = [_av.pcm(frame) for frame in self._context.decode(self._packet_type(payload))]
        return pcm[0] if len(pcm) == 1 else b"".join(pcm)

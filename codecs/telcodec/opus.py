"""Opus (RFC 6716) for a telephony leg: 16 kHz mono s16le <-> one packet per 20 ms.

Theory of operation
-------------------
Opus codes speech with SILK and/or CELT at a variable bit rate: a 20 ms
packet is tens of bytes and its size varies from packet to packet. It is
**stateful** in both directions, so each direction of a call needs its own
``OpusEncoder`` or ``OpusDecoder``, fed every frame in order.

In RTP (RFC 7587) Opus has a dynamic payload type, its ``rtpmap`` is always
``opus/48000/2`` (even for mono) and its RTP clock is always 48 kHz, so a
20 ms packet advances the timestamp by 960 whatever the audio's sample
rate. That is the RTP layer's business; nothing here knows about timestamps.

This module's side is 16 kHz, the rate the call engine already runs a
wideband (G.722) leg at: the engine's per-frame work (VAD, barge-in,
playout, provider audio resampled to the leg) is on 320 samples rather than
the 960 of 48 kHz, and a speech provider asked for 16 kHz needs no
resampling at all. Opus's encoder takes 16 kHz as it is (wideband: audio up
to 8 kHz). Its decoder, as FFmpeg wraps libopus, always produces 48 kHz; a
resampler per stream (FFmpeg's swresample, in C) brings that to 16 kHz and
the decoder hands out whole 20 ms frames (the resampler's start-up delay, 16
samples, is padded with silence once).

The codec is libopus through PyAV (``av``), which aiortc depends on
(``aiortc/codecs/opus.py`` uses it the same way): no new dependency, and C
speed (``bench/bench_opus.py``). ``av`` is imported when the first encoder
or decoder is made, not with this module; ``available()`` says whether it
can be.

Not here: stereo (we send mono; a peer's stereo packets are decoded to
mono by libopus), DTX, in-band FEC on receive (FFmpeg's libopus decoder does
not expose it) and packet loss concealment (PyAV cannot hand the decoder a
missing packet: an empty packet is end of stream). A lost packet is
silence to the leg; the decoder simply goes on with the next packet.

Rules:

1. Linear audio is signed 16-bit little-endian (``s16le``) at 16 kHz.
2. ``OpusEncoder.encode`` takes one whole 20 ms frame (640 bytes) and
   returns one packet; anything else is a caller error (``ValueError``).
3. ``OpusDecoder.decode`` takes one packet (any size) and returns the whole
   20 ms frames it decoded to (640 bytes for a 20 ms packet); a packet the
   decoder refuses (corrupt) decodes to nothing, it never raises.
"""

from __future__ import annotations

from typing import Any, Final

from telcodec import _av

__all__ = [
    "BIT_RATE",
    "COMPLEXITY",
    "DECODER_RATE_HZ",
    "FRAME_BYTES",
    "FRAME_SAMPLES",
    "RTP_CLOCK_RATE_HZ",
    "RTP_FRAME_TICKS",
    "SAMPLE_RATE_HZ",
    "SILENCE_PRIMING_FRAMES",
    "OpusDecoder",
    "OpusEncoder",
    "available",
]

SAMPLE_RATE_HZ: Final = _av.SAMPLE_RATE_HZ
"""The audio's sample rate on this module's side."""
RTP_CLOCK_RATE_HZ: Final = 48000
"""Opus's RTP clock (RFC 7587 §4.1), whatever the audio's rate."""
RTP_FRAME_TICKS: Final = 960
"""RTP timestamp units of one 20 ms packet."""
DECODER_RATE_HZ: Final = 48000
"""What FFmpeg's libopus decoder produces (resampled to ``SAMPLE_RATE_HZ`` here)."""
FRAME_SAMPLES: Final = _av.FRAME_SAMPLES
"""Samples in one 20 ms frame at 16 kHz."""
FRAME_BYTES: Final = FRAME_SAMPLES * 2
"""Bytes of one 20 ms frame of s16le."""
BIT_RATE: Final = 24000
"""The encoder's target, bits per second: wideband speech is transparent-ish well below it."""
COMPLEXITY: Final = 5
"""libopus complexity 0-10 (FFmpeg's ``compression_level``): 5 costs about two thirds of
the default 10 per frame for speech that sounds the same on a phone call (WebRTC uses 5
on mobile); ``bench/bench_opus.py`` measures it."""
SILENCE_PRIMING_FRAMES: Final = 5
"""Frames of a silent stretch encoded through the encoder before ``encode_silence``
repeats the last packet (see its docstring)."""
_CUTOFF_HZ: Final = {8000: "4000", 12000: "6000"}
"""A peer's ``maxplaybackrate`` below ours -> the encoder's audio bandwidth (FFmpeg ``cutoff``)."""


def available() -> bool:
    """Whether PyAV, and its libopus encoder and decoder, can be loaded here."""
    return _av.available("libopus")


class OpusEncoder:
    """One stream of s16le 16 kHz in, one Opus packet per 20 ms out (one per call direction).

    Args:
        bit_rate: target bits per second.
        complexity: libopus complexity, 0 (cheapest) to 10.
        max_playback_rate_hz: the peer's ``maxplaybackrate`` (RFC 7587 §6.1): below
            16000 the encoder codes narrower audio (8000: narrowband, 12000: mediumband).
        fec: add in-band FEC (the peer said ``useinbandfec=1``), for an expected loss of
            a few percent.
    """

    __slots__ = ("_context", "_frame_type", "_pts", "_silence", "_silent_frames")

    def __init__(
        self,
        bit_rate: int = BIT_RATE,
        complexity: int = COMPLEXITY,
        max_playback_rate_hz: int = SAMPLE_RATE_HZ,
        fec: bool = False,
    ) -> None:
        from av import AudioFrame

        context = _av.context("libopus", "w", SAMPLE_RATE_HZ, "Opus")
        context.bit_rate = bit_rate
        options = {
            "application": "voip",
            "compression_level": str(complexity),
            "frame_duration": "20",
        }
        if max_playback_rate_hz < SAMPLE_RATE_HZ:
            options["cutoff"] = _CUTOFF_HZ[8000 if max_playback_rate_hz < 12000 else 12000]
        if fec:
            options["fec"] = "1"
            options["packet_loss"] = "5"
        context.options = options
        self._context = context
        self._frame_type = AudioFrame
        self._pts = 0
        self._silent_frames = 0
        """``encode_silence`` calls since the last ``encode``."""
        self._silence = b""
        """The last silence packet encoded."""

    def encode(self, pcm_s16le: bytes) -> bytes:
        """Encode one 20 ms frame (640 bytes) into one packet (its size varies).

        Raises:
            ValueError: ``pcm_s16le`` is not 640 bytes.
        """
        size = len(pcm_s16le)
        if size != FRAME_BYTES:
            raise ValueError(f"Opus encodes one 20 ms frame of {FRAME_BYTES} bytes, got {size}")
        frame = _av.frame(self._frame_type, _av.samples(pcm_s16le), self._pts)
        self._pts += FRAME_SAMPLES
        self._silent_frames = 0
        packets = self._context.encode(frame)
        # libopus at 20 ms frames: one packet per frame, no look-ahead held back
        return bytes(packets[0]) if len(packets) == 1 else b"".join(bytes(p) for p in packets)

    def encode_silence(self) -> bytes:
        """One 20 ms packet of silence (comfort silence between turns).

        The first ``SILENCE_PRIMING_FRAMES`` of a silent stretch go through the
        encoder, so its state (and the far decoder's) settles on silence after
        the turn's tail; from then on the last of them is sent again instead of
        encoding zeros (an encode costs tens of µs, ``bench/bench_opus.py``;
        libopus's packet for settled digital silence is the same few bytes
        each time). The encoder's state then stays at settled silence, which is
        what the far decoder has too, so the next turn starts as it would have.
        """
        silent = self._silent_frames
        if silent >= SILENCE_PRIMING_FRAMES:
            return self._silence
        packet = self.encode(bytes(FRAME_BYTES))
        self._silent_frames = silent + 1
        self._silence = packet
        return packet


class OpusDecoder:
    """One stream of Opus packets in, s16le 16 kHz out (one per call direction)."""

    __slots__ = ("_context", "_packet_type", "_pending", "_resampler", "decode_errors")

    def __init__(self) -> None:
        from av import AudioResampler, Packet

        self._context = _av.context("libopus", "r", DECODER_RATE_HZ, "Opus")
        self._resampler: Any = AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE_HZ)
        self._packet_type = Packet
        self._pending = b""
        """Resampled audio short of a whole frame (the resampler's start-up delay)."""
        self.decode_errors = 0
        """Packets the decoder refused."""

    def decode(self, payload: bytes) -> bytes:
        """Decode one packet: its whole 20 ms frames of 16 kHz s16le (b"" for none)."""
        if not payload:
            return b""
        try:
            frames = self._context.decode(self._packet_type(payload))
        except Exception:  # av.error.InvalidDataError and kin: a corrupt packet
            self.decode_errors += 1
            return b""
        pcm = [_av.pcm(out) for frame in frames for out in self._resampler.resample(frame)]
        data = pcm[0] if len(pcm) == 1 else b"".join(pcm)
        pending = self._pending
        if pending:
            data = pending + data
        whole = len(data) - len(data) % FRAME_BYTES
        if whole == len(data):
            self._pending = b""
            return data
        if whole == 0 and not pending and data:
            # the first packet: the resampler kept its filter's delay back; pad it once
            return bytes(FRAME_BYTES - len(data)) + data
        self._pending = data[whole:]
        return data[:whole]

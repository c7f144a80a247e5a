"""Provider audio to telephony frames, and telephony audio to a voice backend.

Theory of operation
-------------------
``ToTelephony`` is the outbound pipeline of one utterance stream::

    chunk -> decode to s16le -> resample to 8 kHz -> encode -> cut 20 ms frames

Each stage is skipped when it has nothing to do. When the provider already
sends 8 kHz audio in the wire encoding (Kova ``response_format``, Coda
``audio/pcmu`` at 8000) the chunk goes straight to the frame cutter: no
decode, no filter, no encode (the pass-through path). mu-law <-> A-law at
8 kHz is one ``bytes.translate``. Every frame returned is exactly 20 ms at
8 kHz: 160 bytes of G.711 or 320 bytes of s16le.

* ``push(chunk)`` returns the frames completed so far (often none: the
  resampler releases audio in bursts).
* ``flush()`` ends the utterance: it drains the resampler and returns the
  last frames, the final one padded with the encoding's silence (0xFF
  mu-law, 0xD5 A-law, zero s16le). The pipeline is then ready for the next
  utterance.
* ``reset()`` drops everything buffered (barge-in).

``FromTelephony`` is the inbound direction for voice backends that want
linear audio at 16 or 24 kHz: decode 8 kHz G.711 (or take s16le) and
resample up. It does not frame; it returns whatever the resampler releases.

s16le input may arrive split mid-sample; the dangling byte is kept by the
resampler (also in its pass-through mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal

from telcodec import g711
from telcodec.framing import FrameCutter
from telcodec.resample import EncodeTable, StreamResampler

__all__ = ["TELEPHONY_RATE_HZ", "Encoding", "FromTelephony", "ToTelephony"]

Encoding = Literal["pcm_s16le", "mulaw", "alaw"]

TELEPHONY_RATE_HZ: Final = 8000
FRAME_SAMPLES: Final = 160  # 20 ms at 8 kHz

_BYTES_PER_SAMPLE: Final[dict[str, int]] = {"pcm_s16le": 2, "mulaw": 1, "alaw": 1}
_SILENCE: Final[dict[str, bytes]] = {
    "pcm_s16le": b"\x00",
    "mulaw": bytes([g711.ULAW_SILENCE]),
    "alaw": bytes([g711.ALAW_SILENCE]),
}
_DECODE: Final[dict[str, Callable[[bytes], bytes]]] = {
    "mulaw": g711.ulaw_decode,
    "alaw": g711.alaw_decode,
}
_ENCODE_TABLE: Final[dict[str, EncodeTable]] = {
    "mulaw": g711.ULAW_ENCODE_TABLE,
    "alaw": g711.ALAW_ENCODE_TABLE,
}
_TRANSLATE: Final[dict[tuple[str, str], Callable[[bytes], bytes]]] = {
    ("mulaw", "alaw"): g711.ulaw_to_alaw,
    ("alaw", "mulaw"): g711.alaw_to_ulaw,
}


def _check_encoding(encoding: str) -> None:
    if encoding not in _BYTES_PER_SAMPLE:
        raise ValueError(f"unknown encoding {encoding!r}, expected one of {sorted(_SILENCE)}")


class ToTelephony:
    """Turn provider audio chunks into exact 20 ms frames at 8 kHz.

    Args:
        in_encoding: encoding of the provider's chunks.
        in_rate_hz: sample rate of the provider's chunks.
        out_encoding: encoding of the frames on the wire.
        quality: soxr quality when resampling (see ``telcodec.resample``).

    Raises:
        ValueError: unknown encoding or non-positive rate.
    """

    __slots__ = (
        "_cutter",
        "_decode",
        "_out_encoding",
        "_resampler",
        "_table",
        "_translate",
    )

    def __init__(
        self,
        in_encoding: Encoding,
        in_rate_hz: int,
        out_encoding: Encoding,
        quality: str = "HQ",
    ) -> None:
        _check_encoding(in_encoding)
        _check_encoding(out_encoding)
        self._out_encoding: Encoding = out_encoding
        self._cutter = FrameCutter(FRAME_SAMPLES * _BYTES_PER_SAMPLE[out_encoding])
        self._translate: Callable[[bytes], bytes] | None = None
        self._decode: Callable[[bytes], bytes] | None = None
        self._resampler: StreamResampler | None = None
        self._table: EncodeTable | None = None
        """G.711 out of the resampler: encoded by it, from its float output (no s16le)."""
        if in_rate_hz == TELEPHONY_RATE_HZ and in_encoding == out_encoding:
            return  # pass-through: the cutter alone (it also copes with odd bytes)
        if in_rate_hz == TELEPHONY_RATE_HZ and (in_encoding, out_encoding) in _TRANSLATE:
            self._translate = _TRANSLATE[(in_encoding, out_encoding)]
            return
        self._decode = _DECODE.get(in_encoding)
        self._resampler = StreamResampler(in_rate_hz, TELEPHONY_RATE_HZ, quality)
        self._table = _ENCODE_TABLE.get(out_encoding)

    @property
    def is_pass_through(self) -> bool:
        """True when chunks are only cut into frames (no decode, filter or encode)."""
        return self._resampler is None and self._translate is None

    @property
    def frame_bytes(self) -> int:
        """Size of every frame returned: 160 for G.711, 320 for s16le."""
        return self._cutter.frame_bytes

    def push(self, chunk: bytes) -> list[bytes]:
        """Feed one provider chunk; return the whole frames it completes."""
        return self._cutter.push(self._convert(chunk))

    def push_parts(self, parts: Sequence[bytes | memoryview]) -> list[bytes]:
        """``push`` of the parts joined; a resampled s16le stream takes them unjoined."""
        if self._resampler is not None and self._decode is None:
            return self._cutter.push(self._resampler.process_parts(parts, self._table))
        return self.push(b"".join(parts))

    def flush(self) -> list[bytes]:
        """End the utterance: return the remaining frames, the last one padded."""
        frames = []
        if self._resampler is not None:
            frames = self._cutter.push(self._resampler.flush(self._table))
        last = self._cutter.flush(_SILENCE[self._out_encoding])
        if last is not None:
            frames.append(last)
        return frames

    def release(self) -> list[bytes]:
        """Whole frames of what the resampler holds back; the stream goes on.

        ``StreamResampler.release``, for a turn about to run dry while its audio is
        inside the filter: it hands out at least what completes the frame the
        cutter has begun, keeping back less than usual if it must. Nothing for
        a pass-through or a plain translation (they hold nothing).
        """
        if self._resampler is None:
            return []
        least = self._cutter.missing_bytes // _BYTES_PER_SAMPLE[self._out_encoding]
        return self._cutter.push(self._resampler.release(least, self._table))

    def reset(self) -> None:
        """Drop everything buffered without output (barge-in)."""
        self._cutter.clear()
        if self._resampler is not None:
            self._resampler.reset()

    def _convert(self, chunk: bytes) -> bytes:
        if self._resampler is None:
            return chunk if self._translate is None else self._translate(chunk)
        if self._decode is not None:
            chunk = self._decode(chunk)
        return self._resampler.process(chunk, self._table)


class FromTelephony:
    """Turn 8 kHz telephony audio into s16le at a voice backend's rate.

    Args:
        in_encoding: encoding of the telephony audio (8 kHz).
        out_rate_hz: sample rate wanted, e.g. 16000 or 24000.
        quality: soxr quality when resampling.

    Raises:
        ValueError: unknown encoding or non-positive rate.
    """

    __slots__ = ("_decode", "_resampler")

    def __init__(self, in_encoding: Encoding, out_rate_hz: int, quality: str = "HQ") -> None:
        _check_encoding(in_encoding)
        self._decode = _DECODE.get(in_encoding)
        self._resampler = StreamResampler(TELEPHONY_RATE_HZ, out_rate_hz, quality)

    @property
    def out_rate_hz(self) -> int:
        """Sample rate of the s16le output."""
        return self._resampler.out_rate_hz

    def push(self, chunk: bytes) -> bytes:
        """Feed telephony audio; return the s16le audio released so far."""
        if self._decode is not None:
            chunk = self._decode(chunk)
        return self._resampler.process(chunk)

    def flush(self) -> bytes:
        """End the stream: return the resampler's remaining output and re-arm."""
        return self._resampler.flush()

    def reset(self) -> None:
        """Drop buffered audio without output."""
        self._resampler.reset()

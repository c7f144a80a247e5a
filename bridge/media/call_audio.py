"""Audio plumbing of one call: provider audio to leg frames, leg audio to PCM.

Theory of operation
-------------------
Three small pipelines built from ``telcodec``, none of which knows about
turns or time:

* ``TurnFramer`` (outbound, one per turn and provider format): provider
  chunks become exact 20 ms frames in the leg codec. On 8 kHz legs it is
  ``telcodec.transcode.ToTelephony`` (with its G.711 pass-through when the
  provider honoured the requested format). On 16 kHz linear legs (WebRTC
  L16/16000) it decodes, resamples to 16 kHz and cuts 640-byte frames.
* ``decode_leg`` (inbound): a caller frame in the leg codec to s16le at the
  leg rate, for the VAD and the level meter. ``frame_level_dbfs`` is the same
  for outbound frames (the barge-in echo guard).
* ``AgentUplink`` (inbound, voice agents only): caller audio resampled up to
  the agent's rate (``FromTelephony`` on 8 kHz legs) and re-cut into pieces
  of ``batch_ms`` to 1.5 x ``batch_ms`` (40-60 ms by default).

Input formats come from remote peers: constructors raise ``ValueError`` on a
format they cannot convert and the call turns that into a provider error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from bridge.media.call_types import LegProfile
from bridge.media.vad import energy_dbfs
from bridge.providers.base import AudioFormat
from telcodec import g711
from telcodec.framing import FrameCutter
from telcodec.resample import StreamResampler
from telcodec.transcode import FromTelephony, ToTelephony

__all__ = [
    "AgentUplink",
    "Framer",
    "TurnFramer",
    "check_format",
    "decode_leg",
    "frame_level_dbfs",
    "leg_decoder",
    "leg_level",
    "make_framer",
]

_DECODE: Final[dict[str, Callable[[bytes], bytes]]] = {
    "mulaw": g711.ulaw_decode,
    "alaw": g711.alaw_decode,
}
_ENCODINGS: Final = ("pcm_s16le", "mulaw", "alaw")


class Framer(Protocol):
    """Provider chunks in, whole leg frames out (see ``make_framer``)."""

    @property
    def is_pass_through(self) -> bool: ...

    def push(self, chunk: bytes) -> list[bytes]: ...

    def push_parts(self, parts: list[bytes | memoryview]) -> list[bytes]: ...

    def flush(self) -> list[bytes]: ...

    def release(self) -> list[bytes]: ...

    def reset(self) -> None: ...


class TurnFramer:
    """Provider audio to 20 ms s16le frames at 16 kHz (``ToTelephony`` covers 8 kHz)."""

    __slots__ = ("_cutter", "_decode", "_resampler")

    def __init__(self, in_format: AudioFormat, out_rate_hz: int, quality: str = "HQ") -> None:
        check_format(in_format)
        self._decode = _DECODE.get(in_format.encoding)
        self._cutter = FrameCutter(out_rate_hz // 50 * 2)
        self._resampler: StreamResampler | None = None
        if in_format.sample_rate_hz != out_rate_hz or in_format.encoding != "pcm_s16le":
            self._resampler = StreamResampler(in_format.sample_rate_hz, out_rate_hz, quality)

    @property
    def is_pass_through(self) -> bool:
        return self._resampler is None

    def push(self, chunk: bytes) -> list[bytes]:
        if self._resampler is None:
            return self._cutter.push(chunk)
        if self._decode is not None:
            chunk = self._decode(chunk)
        return self._cutter.push(self._resampler.process(chunk))

    def push_parts(self, parts: list[bytes | memoryview]) -> list[bytes]:
        return self.push(b"".join(parts))

    def flush(self) -> list[bytes]:
        frames = [] if self._resampler is None else self._cutter.push(self._resampler.flush())
        last = self._cutter.flush(b"\x00")
        if last is not None:
            frames.append(last)
        return frames

    def release(self) -> list[bytes]:
        """Whole frames of what the resampler holds back (``ToTelephony.release``)."""
        if self._resampler is None:
            return []
        return self._cutter.push(self._resampler.release(self._cutter.missing_bytes // 2))

    def reset(self) -> None:
        self._cutter.clear()
        if self._resampler is not None:
            self._resampler.reset()


def check_format(audio_format: AudioFormat) -> None:
    """Raise ``ValueError`` for a provider format no framer can convert."""
    if audio_format.encoding not in _ENCODINGS:
        raise ValueError(f"unknown encoding {audio_format.encoding!r}")
    if audio_format.sample_rate_hz <= 0:
        raise ValueError(f"bad sample rate {audio_format.sample_rate_hz}")


def make_framer(in_format: AudioFormat, leg: LegProfile, quality: str = "HQ") -> Framer:
    """The outbound pipeline for one turn's audio in ``in_format``.

    Raises:
        ValueError: an encoding or rate that cannot be converted (remote input).
    """
    check_format(in_format)
    if leg.sample_rate_hz == 8000:
        return ToTelephony(in_format.encoding, in_format.sample_rate_hz, leg.codec, quality)
    return TurnFramer(in_format, leg.sample_rate_hz, quality)


def decode_leg(frame: bytes, codec: str) -> bytes:
    """A leg frame as s16le at the leg's rate (odd trailing bytes of s16le are kept)."""
    decode = _DECODE.get(codec)
    return frame if decode is None else decode(frame)


def leg_decoder(codec: str) -> Callable[[bytes], bytes] | None:
    """``decode_leg`` for one codec, looked up once per call (``None``: already s16le)."""
    return _DECODE.get(codec)


def leg_level(codec: str) -> Callable[[bytes], float]:
    """``frame_level_dbfs`` for one codec, looked up once per call."""
    decode = _DECODE.get(codec)
    if decode is None:
        return energy_dbfs
    return lambda frame: energy_dbfs(decode(frame))


def frame_level_dbfs(frame: bytes, codec: str) -> float:
    """RMS level of a leg frame in dBFS (for the echo guard)."""
    return energy_dbfs(decode_leg(frame, codec))


class AgentUplink:
    """Caller audio up to a voice agent's rate, batched.

    Args:
        leg: the caller leg (codec and rate of the frames pushed).
        out_rate_hz: the agent's rate (24000 for Kletso).
        batch_ms: smallest piece released (the largest is 1.5 x this).
        quality: soxr quality.
    """

    __slots__ = ("_batch_bytes", "_buffer", "_from_8k", "_max_piece_bytes", "_resampler")

    def __init__(self, leg: LegProfile, out_rate_hz: int, batch_ms: int, quality: str = "HQ"):
        self._from_8k: FromTelephony | None = None
        self._resampler: StreamResampler | None = None
        if leg.sample_rate_hz == 8000:
            self._from_8k = FromTelephony(leg.codec, out_rate_hz, quality)
        else:
            self._resampler = StreamResampler(leg.sample_rate_hz, out_rate_hz, quality)
        self._batch_bytes = max(2, out_rate_hz * batch_ms // 1000 * 2)
        self._max_piece_bytes = self._batch_bytes * 3 // 2 & ~1
        self._buffer = bytearray()

    def push(self, frame: bytes) -> list[bytes]:
        """Feed one caller frame; return the pieces of s16le now ready (often none).

        The resampler releases audio in bursts (soxr HQ: about 61 ms every
        third 20 ms frame), so pieces are re-cut to ``batch_ms`` .. 1.5 x
        ``batch_ms`` and the remainder waits for the next burst.
        """
        if self._from_8k is not None:
            self._buffer += self._from_8k.push(frame)
        elif self._resampler is not None:
            self._buffer += self._resampler.process(frame)
        pieces = []
        while len(self._buffer) >= self._batch_bytes:
            size = min(len(self._buffer) & ~1, self._max_piece_bytes)
            pieces.append(bytes(self._buffer[:size]))
            del self._buffer[:size]
        return pieces

    def reset(self) -> None:
        """Drop what is buffered (the agent session ended)."""
        self._buffer.clear()
        if self._from_8k is not None:
            self._from_8k.reset()
        elif self._resampler is not None:
            self._resampler.reset()

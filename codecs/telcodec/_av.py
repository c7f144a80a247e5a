"""The PyAV plumbing ``g722`` and ``opus`` share: 16 kHz mono s16le in and out of a
libavcodec stream.

Both codecs are libavcodec's through PyAV (``av``), imported when a context is made
rather than with the modules, so that the rest of ``telcodec`` keeps its few
dependencies. Each encoder feeds 20 ms frames of 320 native-order samples stamped with a
running ``pts`` in samples; each decoder's output frames are s16 mono, one plane that
may be padded past its samples.
"""

from __future__ import annotations

import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from av import AudioFrame
    from av.audio.codeccontext import AudioCodecContext

__all__ = ["FRAME_SAMPLES", "SAMPLE_RATE_HZ", "available", "context", "frame", "pcm", "samples"]

SAMPLE_RATE_HZ: Final = 16000
"""The audio's sample rate on the callers' side (the decoder's may differ)."""
FRAME_SAMPLES: Final = 320
"""Samples in one 20 ms frame at 16 kHz."""
_TIME_BASE: Final = Fraction(1, SAMPLE_RATE_HZ)
_BIG_ENDIAN: Final = sys.byteorder == "big"


def available(codec: str) -> bool:
    """Whether PyAV, and libavcodec's encoder and decoder named ``codec``, can be loaded."""
    try:
        import av

        av.codec.Codec(codec, "w")
        av.codec.Codec(codec, "r")
    except Exception:  # ImportError, or an FFmpeg build without the codec
        return False
    return True


def context(codec: str, mode: Literal["r", "w"], rate_hz: int, name: str) -> AudioCodecContext:
    """A mono s16 encoder (``"w"``, its time base one 16 kHz sample) or decoder (``"r"``)
    of ``codec`` at ``rate_hz``; ``name`` is the codec's in the error without PyAV."""
    try:
        from av import CodecContext
        from av.audio.codeccontext import AudioCodecContext
    except ImportError as exc:  # pragma: no cover - av comes with aiortc
        raise RuntimeError(f"{name} needs PyAV (the av package, installed with aiortc)") from exc
    made = CodecContext.create(codec, mode)
    assert isinstance(made, AudioCodecContext)
    made.format = "s16"
    made.layout = "mono"
    made.sample_rate = rate_hz
    if mode == "w":
        made.time_base = _TIME_BASE
    return made


def samples(pcm_s16le: bytes) -> npt.NDArray[np.int16]:
    """``pcm_s16le`` as native-order samples (what a frame wants)."""
    out = np.frombuffer(pcm_s16le, dtype="<i2")
    if _BIG_ENDIAN:  # pragma: no cover
        out = out.astype(np.int16)
    return out


def frame(frame_type: type[AudioFrame], one_frame: npt.NDArray[np.int16], pts: int) -> AudioFrame:
    """One 20 ms frame of 16 kHz samples (``FRAME_SAMPLES`` of them) stamped ``pts``;
    ``frame_type`` is ``av.AudioFrame``, kept by the encoder so as not to import it each
    frame."""
    made = frame_type.from_ndarray(one_frame.reshape(1, FRAME_SAMPLES), format="s16", layout="mono")
    made.sample_rate = SAMPLE_RATE_HZ
    made.pts = pts
    return made


def pcm(decoded: AudioFrame) -> bytes:
    """A decoded s16 mono frame's samples as s16le."""
    # the plane may be padded past the samples; native order is s16le here
    data = bytes(decoded.planes[0])[: decoded.samples * 2]
    if _BIG_ENDIAN:  # pragma: no cover
        data = np.frombuffer(data, dtype=np.int16).astype("<i2").tobytes()
    return data

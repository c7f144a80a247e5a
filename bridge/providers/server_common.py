"""Small pure helpers the protocol server sessions share.

Theory of operation
-------------------
Every server session (``bridge/providers/<protocol>/server.py``) gets a job's output
from the shell as 16-bit little-endian mono PCM in pieces of any length, with
word timings counted from the start of that *job*, and must put it on the
wire in the client's format with times counted from the start of the
*context*. The steps that are the same in several protocols live here:

* ``whole_samples(carry, pcm)``: PCM cut at a sample boundary; the odd byte
  (if any) is carried to the next piece, so no sample is split or lost.
* ``encode_pcm(encoding, pcm)``: s16le to ``mulaw`` / ``alaw``; any other
  encoding name (``pcm``, ``linear16``, ``wav``...) passes PCM unchanged.
* ``byte_chunks(data, max_bytes)``: the wire's chunk or frame size limit.
* ``offset_words(words, offset_s)``: job-relative word timings moved to the
  context's timeline.
* ``timing_arrays(words, offset_s, ...)``: the parallel-array shape
  (``words`` plus start and end seconds) Kova and zwst send, rounded as each
  protocol documents.

Rules: no I/O, no clock, no state; nothing here raises on valid PCM.
"""

from __future__ import annotations

from bridge.providers.base import WordTiming
from telcodec import g711

__all__ = ["byte_chunks", "encode_pcm", "offset_words", "timing_arrays", "whole_samples"]


def whole_samples(carry: bytes, pcm: bytes) -> tuple[bytes, bytes]:
    """``carry + pcm`` split into (whole 16-bit samples, the odd byte left over)."""
    data = carry + pcm
    whole = len(data) - len(data) % 2
    return data[:whole], data[whole:]


def encode_pcm(encoding: str, pcm_s16le: bytes) -> bytes:
    """PCM in the wire encoding: G.711 for ``mulaw``/``alaw``, else unchanged."""
    if encoding == "mulaw":
        return g711.ulaw_encode(pcm_s16le)
    if encoding == "alaw":
        return g711.alaw_encode(pcm_s16le)
    return pcm_s16le


def byte_chunks(data: bytes, max_bytes: int) -> list[bytes]:
    """``data`` in consecutive pieces of ``max_bytes`` (the last may be shorter)."""
    return [data[start : start + max_bytes] for start in range(0, len(data), max_bytes)]


def offset_words(words: tuple[WordTiming, ...], offset_s: float) -> tuple[WordTiming, ...]:
    """Word timings moved ``offset_s`` later (job start -> context start)."""
    return tuple(WordTiming(w.word, offset_s + w.start_s, offset_s + w.end_s) for w in words)


def timing_arrays(
    words: tuple[WordTiming, ...],
    offset_s: float,
    *,
    start_key: str,
    end_key: str,
    ndigits: int,
) -> dict[str, object]:
    """``{"words": [...], start_key: [...], end_key: [...]}``, times moved and rounded."""
    return {
        "words": [w.word for w in words],
        start_key: [round(offset_s + w.start_s, ndigits) for w in words],
        end_key: [round(offset_s + w.end_s, ndigits) for w in words],
    }

"""Synthesis engines for the local TTS server, and the renderer that feeds sessions.

Theory of operation
-------------------
A ``SynthEngine`` turns text into PCM (16-bit little-endian mono at its
``native_rate_hz``) sentence by sentence, with word timings in seconds from
the start of the text. ``render(engine, job)`` wraps it for one
``Synthesize`` job: it resamples each chunk to the job's rate with a
streaming soxr resampler (state kept across chunks, flushed at the end), so a
session receives audio at exactly the rate it asked for.

Two engines exist:

* ``ToneEngine``: deterministic audio whose content encodes the text, for
  tests and benchmarks. Each word becomes a sine burst whose frequency comes
  from a CRC of the word and whose length is proportional to the word's
  length, separated by short gaps, so a test can check which words were
  played, in which order, and where.
* ``PiperEngine`` (``bridge/ttsd/piper_engine.py``): the Piper neural voice
  from the ``local-tts`` extra. It is the only module that imports piper
  (GPL), and only the TTS server process loads it.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bridge.providers.base import WordTiming
from bridge.providers.server_base import Synthesize
from telcodec.resample import StreamResampler

__all__ = [
    "SynthChunk",
    "SynthEngine",
    "ToneEngine",
    "render",
    "split_sentences",
    "split_words",
    "tone_frequency_hz",
]

_SENTENCE = re.compile(r"[^.!?;:]+[.!?;:]*\s*|[.!?;:]+\s*")
_WORD = re.compile(r"[^\s]+")


@dataclass(frozen=True, slots=True)
class SynthChunk:
    """PCM s16le mono at the engine's native rate, and the words it holds."""

    pcm: bytes
    words: tuple[WordTiming, ...]


class SynthEngine(Protocol):
    """Turns text into audio, one chunk per sentence (or smaller)."""

    name: str
    native_rate_hz: int
    # An engine with a true ``inline`` attribute runs on the server's loop;
    # any other runs on its synthesis workers (``SynthLimits``).

    def synthesize(self, text: str, voice: str, speed: float) -> Iterator[SynthChunk]: ...


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (punctuation kept), blank ones dropped."""
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def split_words(text: str) -> list[str]:
    return _WORD.findall(text)


# ------------------------------------------------------------------ tone

TONE_WORD_S_PER_CHAR = 0.03
TONE_WORD_MIN_S = 0.08
TONE_GAP_S = 0.04
TONE_AMPLITUDE = 0.25 * 32767
TONE_RAMP_S = 0.004


def tone_frequency_hz(word: str) -> float:
    """The tone a word becomes: 400..3400 Hz in 100 Hz steps (inside the phone band)."""
    return 400.0 + 100.0 * (zlib.crc32(word.lower().encode()) % 31)


@functools.lru_cache(maxsize=1024)
def _tone_word_pcm(word: str, n: int, rate: int) -> bytes:
    """A word's sine burst (``n`` samples at ``rate``, ramped) and the gap after it.

    Cached (about 15 MB at most, at 24 kHz): texts repeat their words, and the
    reference server renders every turn of every call (at 500 calls this
    rendering was half of the server's CPU in the capacity bench).
    """
    i = np.arange(n)
    wave = np.sin(2 * math.pi * tone_frequency_hz(word) * i / rate)
    ramp = min(n // 2, round(TONE_RAMP_S * rate))
    env = np.ones(n)
    env[:ramp] = np.linspace(0.0, 1.0, ramp)
    env[n - ramp :] = np.linspace(1.0, 0.0, ramp)
    gap = np.zeros(round(TONE_GAP_S * rate))
    pcm = np.concatenate([wave * env * TONE_AMPLITUDE, gap])
    return pcm.round().astype("<i2").tobytes()


class ToneEngine:
    """Deterministic test audio: each word a sine burst, each gap silence."""

    name = "tone"
    inline = True
    """Rendered on the server's event loop, not on its synthesis workers (next to no CPU)."""

    def __init__(self, native_rate_hz: int = 24000) -> None:
        self.native_rate_hz = native_rate_hz

    def word_duration_s(self, word: str, speed: float = 1.0) -> float:
        return max(TONE_WORD_MIN_S, TONE_WORD_S_PER_CHAR * len(word)) / max(speed, 0.25)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        """One chunk per word (a streaming provider's granularity)."""
        rate = self.native_rate_hz
        t_s = 0.0
        for word in split_words(text):
            n = round(self.word_duration_s(word, speed) * rate)
            pcm = _tone_word_pcm(word, n, rate)
            timing = WordTiming(word, t_s, t_s + n / rate)
            t_s += len(pcm) // 2 / rate
            yield SynthChunk(pcm, (timing,))

    def at_rate(self, sample_rate_hz: int) -> ToneEngine:
        """The same engine generating directly at ``sample_rate_hz`` (no resampling)."""
        return ToneEngine(sample_rate_hz)


# ---------------------------------------------------------------- render


def render(engine: SynthEngine, job: Synthesize) -> Iterator[SynthChunk]:
    """Synthesise ``job`` with ``engine`` and resample every chunk to ``job.sample_rate_hz``.

    Word timings are in seconds and need no resampling; the audio is
    resampled with one streaming resampler for the whole job so chunk joins
    stay continuous.
    """
    if isinstance(engine, ToneEngine):
        engine = engine.at_rate(job.sample_rate_hz)
    if engine.native_rate_hz == job.sample_rate_hz:
        yield from engine.synthesize(job.text, job.voice, job.speed)
        return
    rs = StreamResampler(engine.native_rate_hz, job.sample_rate_hz)
    pending: tuple[WordTiming, ...] = ()
    for chunk in engine.synthesize(job.text, job.voice, job.speed):
        out = rs.process(chunk.pcm)
        words = pending + chunk.words
        if out:
            yield SynthChunk(out, words)
            pending = ()
        else:
            pending = words
    tail = rs.flush()
    if tail or pending:
        yield SynthChunk(tail, pending)

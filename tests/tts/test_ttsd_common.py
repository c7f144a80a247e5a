"""The pure helpers the protocol server sessions share (bridge.providers.server_common)."""

from __future__ import annotations

import importlib
import json
from urllib.parse import parse_qsl, urlsplit

import pytest

from bridge.engine import SendText
from bridge.providers.base import WordTiming
from bridge.providers.server_base import ServerOptions
from bridge.providers.server_common import (
    byte_chunks,
    encode_pcm,
    offset_words,
    timing_arrays,
    whole_samples,
)
from bridge.providers.zwst import server as zwst
from telcodec import g711

WORDS = (WordTiming("hello", 0.0, 0.3333333), WordTiming("world", 0.4, 0.9))


def test_whole_samples_carries_the_odd_byte_to_the_next_piece() -> None:
    assert whole_samples(b"", b"\x01\x02\x03") == (b"\x01\x02", b"\x03")
    assert whole_samples(b"\x03", b"\x04\x05\x06") == (b"\x03\x04\x05\x06", b"")
    assert whole_samples(b"", b"") == (b"", b"")
    assert whole_samples(b"\x07", b"") == (b"", b"\x07")


def test_encode_pcm_only_touches_g711() -> None:
    pcm = bytes(range(16))
    assert encode_pcm("mulaw", pcm) == g711.ulaw_encode(pcm)
    assert encode_pcm("alaw", pcm) == g711.alaw_encode(pcm)
    assert len(encode_pcm("mulaw", pcm)) == len(pcm) // 2
    for name in ("pcm", "linear16", "wav"):
        assert encode_pcm(name, pcm) == pcm


def test_byte_chunks() -> None:
    assert byte_chunks(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert byte_chunks(b"abcdef", 3) == [b"abc", b"def"]
    assert byte_chunks(b"", 3) == []


def test_offset_words_moves_job_times_to_the_context() -> None:
    assert offset_words(WORDS, 2.0) == (
        WordTiming("hello", 2.0, 2.3333333),
        WordTiming("world", 2.4, 2.9),
    )
    assert offset_words((), 1.0) == ()


def test_timing_arrays_in_each_protocols_keys_and_rounding() -> None:
    assert timing_arrays(WORDS, 1.0, start_key="start", end_key="end", ndigits=3) == {
        "words": ["hello", "world"],
        "start": [1.0, 1.4],
        "end": [1.333, 1.9],
    }
    kova = timing_arrays(WORDS, 0.5, start_key="start_seconds", end_key="end_seconds", ndigits=6)
    assert list(kova) == ["words", "start_seconds", "end_seconds"]
    assert kova["end_seconds"] == [0.833333, 1.4]


@pytest.mark.parametrize("protocol", ["coda", "kletso", "kova", "kugelaudio", "zwst"])
def test_no_server_raises_on_json_too_deep_to_parse(protocol: str) -> None:
    module = importlib.import_module(f"bridge.providers.{protocol}.server")
    session = module.SESSION(ServerOptions())
    path, query = module.PATHS[0], {}
    if protocol == "zwst":
        status, body = module.handle_session_request(b"{}", ServerOptions(), "ws://x", now=0.0)
        assert status == 200
        parts = urlsplit(json.loads(body)["url"])
        path, query = parts.path, dict(parse_qsl(parts.query))
    session.connection_made(path, query, {}, 0.0)
    session.actions_to_send()
    session.receive_text("[" * 100_000, 1.0)
    answers = [a for a in session.actions_to_send() if isinstance(a, SendText)]
    assert len(answers) == 1
    answer = json.loads(answers[0].text)
    assert "error" in answer or answer["type"] == "error"


def test_zwst_session_route_answers_400_to_json_too_deep_to_parse() -> None:
    status, body = zwst.handle_session_request(b"[" * 100_000, ServerOptions(), "ws://x", now=0.0)
    assert status == 400
    assert json.loads(body)["error"] == "invalid_json"

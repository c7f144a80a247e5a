"""The pure helpers the provider clients share (bridge.providers.client_common)."""

from __future__ import annotations

import base64
import binascii
import importlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.engine import CloseConnection
from bridge.providers.base import (
    ProviderFailed,
    ProviderSettings,
    WordTiming,
)
from bridge.providers.client_common import (
    TimingsWording,
    b64decode_fast,
    bearer_headers,
    json_object,
    json_text,
    non_negative_seconds,
    parallel_word_timings,
    scrub_secret,
)

WORDING = TimingsWording("not arrays", "lengths differ", "bad entry")


class _FrameError(ValueError):
    pass


def test_json_object_accepts_only_objects() -> None:
    assert json_object('{"a": [1, 2]}') == {"a": [1, 2]}
    assert json_object("[1, 2]") is None
    assert json_object('"text"') is None
    assert json_object("{not json") is None


def test_json_object_survives_nesting_that_exhausts_the_parser() -> None:
    assert json_object("[" * 100_000) is None
    assert json_object('{"a":' * 100_000) is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), (1, 1.0), (0.25, 0.25), (-0.1, None), (True, None), ("1", None), (None, None)],
)
def test_non_negative_seconds(value: object, seconds: float | None) -> None:
    assert non_negative_seconds(value) == seconds


def test_non_negative_seconds_refuses_non_finite_numbers() -> None:
    assert non_negative_seconds(math.inf) is None
    assert non_negative_seconds(math.nan) is None


def test_parallel_word_timings() -> None:
    timings = parallel_word_timings(
        ["hi", "there"], [0, 0.5], [0.4, 1], wording=WORDING, error=_FrameError
    )
    assert timings == (WordTiming("hi", 0.0, 0.4), WordTiming("there", 0.5, 1.0))
    assert parallel_word_timings([], [], [], wording=WORDING, error=_FrameError) == ()


@pytest.mark.parametrize(
    ("words", "starts", "ends", "message"),
    [
        (None, [], [], "not arrays"),
        (["a"], "0", [1], "not arrays"),
        (["a", "b"], [0], [1], "lengths differ"),
        ([1], [0], [1], "bad entry"),
        (["a"], [-1], [1], "bad entry"),
        (["a"], [0], [True], "bad entry"),
    ],
)
def test_parallel_word_timings_raise_the_callers_error(
    words: object, starts: object, ends: object, message: str
) -> None:
    with pytest.raises(_FrameError, match=f"^{message}$"):
        parallel_word_timings(words, starts, ends, wording=WORDING, error=_FrameError)


def test_json_text() -> None:
    assert json_text("boom") == "boom"
    assert json_text({"code": 1}) == '{"code": 1}'
    assert json_text(None) == "null"


def test_bearer_headers_only_with_a_key() -> None:
    assert bearer_headers("k1") == (("Authorization", "Bearer k1"),)
    assert bearer_headers("") == ()


def test_scrub_secret() -> None:
    assert scrub_secret("key k1 and k1 again", "k1") == "key *** and *** again"
    assert scrub_secret("nothing to hide", "") == "nothing to hide"


@pytest.mark.parametrize("protocol", ["coda", "kletso", "kova", "kugelaudio", "zwst"])
def test_every_client_fails_the_connection_on_json_too_deep_to_parse(protocol: str) -> None:
    engine_cls = importlib.import_module(f"bridge.providers.{protocol}.client").ENGINE
    engine = engine_cls(
        ProviderSettings(
            name="deep",
            protocol=protocol,
            url="wss://provider.example/v1/stream",
            api_key="k",
            voice="v",
        )
    )
    if engine.session_request() is not None:
        engine.session_response(200, b'{"url": "wss://provider.example/v1/stream?t=1"}', 0.0)
    engine.connection_made("rime.v1.json" if protocol == "coda" else None, 0.0)
    engine.events_received()
    engine.receive_text("[" * 100_000, 1.0)
    failures = [e for e in engine.events_received() if isinstance(e, ProviderFailed)]
    assert len(failures) == 1
    assert any(isinstance(a, CloseConnection) for a in engine.actions_to_send())


def _timings_one_by_one(words: list[object], starts: list[object], ends: list[object]) -> object:
    """The per-value rule, written out: what parallel_word_timings must give for lists."""
    out = []
    for word, start, end in zip(words, starts, ends, strict=True):
        start_s, end_s = non_negative_seconds(start), non_negative_seconds(end)
        if not isinstance(word, str) or start_s is None or end_s is None:
            return "bad entry"
        out.append(WordTiming(word, start_s, end_s))
    return tuple(out)


_SECONDS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-2, max_value=10),
    st.booleans(),
    st.sampled_from([0.0, -0.0, 0.5, 1.25]),
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_parallel_word_timings_float_lists_agree_with_the_per_value_rule(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(min_value=0, max_value=4))
    words = data.draw(
        st.lists(st.one_of(st.text(max_size=3), st.integers()), min_size=n, max_size=n)
    )
    starts = data.draw(st.lists(_SECONDS, min_size=n, max_size=n))
    ends = data.draw(st.lists(_SECONDS, min_size=n, max_size=n))
    try:
        got: object = parallel_word_timings(words, starts, ends, wording=WORDING, error=_FrameError)
    except _FrameError as exc:
        got = str(exc)
    assert got == _timings_one_by_one(words, starts, ends)


@pytest.mark.parametrize(
    ("words", "starts", "ends", "message"),
    [
        ([1], [0.0], [1.0], "bad entry"),
        (["a"], [math.nan], [1.0], "bad entry"),
        (["a"], [0.0], [math.inf], "bad entry"),
        (["a"], [-0.5], [1.0], "bad entry"),
    ],
)
def test_parallel_word_timings_float_lists_raise_the_callers_error(
    words: object, starts: object, ends: object, message: str
) -> None:
    with pytest.raises(_FrameError, match=f"^{message}$"):
        parallel_word_timings(words, starts, ends, wording=WORDING, error=_FrameError)


# b64decode_fast: pybase64 where it is strictly valid, the engine's own decode otherwise

_B64_TEXT = st.text(
    alphabet=st.sampled_from(
        list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        + list('=\\\n -_"é')
    ),
    max_size=24,
)


@given(st.binary(max_size=200))
def test_b64decode_fast_decodes_what_the_standard_library_encodes(raw: bytes) -> None:
    assert b64decode_fast(base64.b64encode(raw).decode("ascii")) == raw


@settings(max_examples=3000)
@given(_B64_TEXT)
def test_b64decode_fast_accepts_only_what_the_standard_library_decodes_the_same(text: str) -> None:
    got = b64decode_fast(text)
    if got is not None:
        assert binascii.a2b_base64(text, strict_mode=True) == got
        assert base64.b64decode(text, validate=True) == got


@pytest.mark.parametrize(
    "text",
    ["QUAZ=", "QUFB\nQUFB", "QU FB", "QUFB\\u0041", "QUFBé", "QUF", "QUFB==QUFB", "-_-_"],
)
def test_b64decode_fast_leaves_odd_base64_to_the_engine(text: str) -> None:
    # excess padding (which binascii's strict mode tolerates), whitespace, JSON escapes,
    # non-ASCII, bad length, padding inside, the URL-safe alphabet: None, never other bytes
    assert b64decode_fast(text) is None

"""TCP framing (fed in arbitrary chunks, one byte at a time) and parser fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.sip.errors import SipParseError
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, parse_message

FIXTURES = Path(__file__).parent / "fixtures"
STREAM_FIXTURES = [
    "valid_tortuous.txt",
    "valid_escapes.txt",
    "valid_ipv6.txt",
    "valid_empty_reason.txt",
]


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes().replace(b"\n", b"\r\n")


def stream() -> tuple[bytes, list[bytes]]:
    messages = [load(name) for name in STREAM_FIXTURES]
    return b"\r\n\r\n".join(messages) + b"\r\n", messages


def test_one_byte_at_a_time() -> None:
    data, expected = stream()
    framer = SipStreamFramer()
    out: list[bytes] = []
    for i in range(len(data)):
        out.extend(framer.feed(data[i : i + 1]))
    assert out == expected
    assert framer.buffered_bytes == 0
    parsed = [parse_message(m) for m in out]
    assert isinstance(parsed[0], SipRequest) and parsed[0].method == "INVITE"


def test_all_at_once_and_messages_split_across_chunks() -> None:
    data, expected = stream()
    assert SipStreamFramer().feed(data) == expected
    framer = SipStreamFramer()
    first = framer.feed(data[:700])
    rest = framer.feed(data[700:])
    assert first + rest == expected


@given(st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=60))
def test_any_chunking_gives_the_same_messages(sizes: list[int]) -> None:
    data, expected = stream()
    framer = SipStreamFramer()
    out: list[bytes] = []
    pos = 0
    for size in sizes:
        out.extend(framer.feed(data[pos : pos + size]))
        pos += size
    out.extend(framer.feed(data[pos:]))
    assert out == expected


def test_missing_content_length_is_a_framing_error_and_sticks() -> None:
    data = load("valid_rfc2543.txt")
    framer = SipStreamFramer()
    with pytest.raises(SipParseError, match="missing Content-Length"):
        framer.feed(data)
    with pytest.raises(SipParseError):
        framer.feed(load("valid_escapes.txt"))


def test_buffer_is_bounded() -> None:
    framer = SipStreamFramer(max_message_bytes=1000)
    with pytest.raises(SipParseError, match="header section too long"):
        for _ in range(20):
            framer.feed(b"X-Junk: " + b"a" * 90 + b"\r\n")
    big = SipStreamFramer(max_message_bytes=1000)
    head = load("valid_escapes.txt").replace(b"Content-Length: 0", b"Content-Length: 5000")
    with pytest.raises(SipParseError) as info:
        big.feed(head)
    assert info.value.status == 513


def test_keepalives_only() -> None:
    framer = SipStreamFramer()
    assert framer.feed(b"\r\n\r\n") == []
    assert framer.feed(b"\r\n") == []
    assert framer.buffered_bytes == 0


@settings(max_examples=400)
@given(st.binary(max_size=600))
def test_parser_raises_only_sip_parse_error_on_random_bytes(data: bytes) -> None:
    try:
        parse_message(data)
    except SipParseError as exc:
        assert exc.reason


@settings(max_examples=400)
@given(st.data())
def test_parser_raises_only_sip_parse_error_on_mutated_messages(data: st.DataObject) -> None:
    base = bytearray(
        load(data.draw(st.sampled_from([*STREAM_FIXTURES, "valid_semicolon_user.txt"])))
    )
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(base) - 1))
        choice = data.draw(
            st.sampled_from(
                [
                    b";",
                    b",",
                    b'"',
                    b"<",
                    b">",
                    b" ",
                    b"\r\n",
                    b":",
                    b"%",
                    b"\x00",
                    b"\xff",
                    b"@",
                    b"[",
                ]
            )
        )
        if data.draw(st.booleans()):
            base[pos : pos + 1] = choice
        else:
            base[pos:pos] = choice
    try:
        message = parse_message(bytes(base))
    except SipParseError as exc:
        assert exc.reason
    else:
        # A message that validated has parseable mandatory headers.
        assert message.vias() and message.cseq().number >= 0
        assert message.from_().uri and message.to().uri
        assert parse_message(message.to_bytes()).call_id == message.call_id

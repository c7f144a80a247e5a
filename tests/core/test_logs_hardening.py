"""Logging that never fails a call and never prints what it must not (issue 33)."""

from __future__ import annotations

import errno
import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from bridge.logs import CALLER_REDACTED, REDACTED, configure, dropped_lines, get_logger


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


class FailingStream(io.StringIO):
    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [BrokenPipeError(errno.EPIPE, "Broken pipe"), OSError(errno.ENOSPC, "No space left")],
    ids=["EPIPE", "ENOSPC"],
)
def test_a_sink_that_cannot_write_never_raises_into_the_caller(error: OSError) -> None:
    configure("info", "json", stream=FailingStream(error))
    get_logger("test").info("call.started", call_id="c1")
    get_logger("test").error("call.failed", call_id="c1")
    logging.getLogger("websockets.client").warning("a library line")
    assert dropped_lines() == 3


def test_a_closed_stream_is_a_dropped_line_too() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    buf.close()
    get_logger("test").info("after.close")
    assert dropped_lines() == 1


def test_caller_numbers_digits_and_heard_text_are_redacted_by_default() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    log = get_logger("test")
    log.info("call.started", from_="+15551234567", to="+15557654321")
    log.info("call.dtmf", digit="7")
    log.info("turn.interrupted", heard_text="your card number is", heard_ms=900)
    log.info("streams.transfer_unsupported", target="tel:+15550000000")
    started, dtmf, cut, transfer = lines(buf)
    assert started["from_"] == started["to"] == CALLER_REDACTED
    assert dtmf["digit"] == CALLER_REDACTED
    assert cut["heard_text"] == "[19 chars]" and cut["heard_ms"] == 900
    assert transfer["target"] == CALLER_REDACTED
    # whole numbers: a short digit run could occur in a timestamp by chance
    for secret in ("+15551234567", "+15557654321", "+15550000000", "card"):
        assert secret not in buf.getvalue()


def test_caller_data_is_logged_when_the_config_asks_for_it() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf, log_caller_data=True)
    get_logger("test").info("call.dtmf", digit="7", heard_text="hello")
    (line,) = lines(buf)
    assert line["digit"] == "7" and line["heard_text"] == "hello"


def test_basic_auth_url_userinfo_and_nested_values_are_redacted() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    deep: dict[str, object] = {"password": "pw-deep"}
    for _ in range(10):
        deep = {"next": deep}
    get_logger("test").info(
        "provider.connect",
        url="wss://exotel-key:exotel-pass@b.example/exotel?x=1",
        note="Authorization: Basic ZXhvdGVsOnNlY3JldA== sent",
        headers=[("Authorization", "Basic ZXhvdGVsOnNlY3JldA=="), ("X-Twilio-Signature", "sig")],
        event_body={"start": {"custom_parameters": {"token": "v1.1.n.m", "route": "r"}}},
        frames=[{"api_key": "pk-nested"}],
        raw=b"Bearer raw-bytes-token",
        deep=deep,
    )
    text = buf.getvalue()
    for secret in ("exotel-pass", "ZXhvdGVsOnNlY3JldA", "v1.1.n.m", "pk-nested", "pw-deep"):
        assert secret not in text, secret
    assert "raw-bytes-token" not in text
    (line,) = lines(buf)
    assert line["url"] == f"wss://exotel-key:{REDACTED}@b.example/exotel?x=1"
    assert line["headers"] == [["Authorization", REDACTED], ["X-Twilio-Signature", REDACTED]]
    assert line["event_body"] == {"start": {"custom_parameters": {"token": REDACTED, "route": "r"}}}


def test_configured_secrets_are_masked_wherever_they_appear() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf, secrets=("s3cret-value-42", "ab"))
    log = get_logger("test")
    log.info("odd.place", message="the peer echoed s3cret-value-42 back")
    log.info("s3cret-value-42 in the event name")
    log.info("a fabulous line")
    try:
        raise ValueError("bad key s3cret-value-42")
    except ValueError:
        log.exception("call.failed")
    text = buf.getvalue()
    assert "s3cret-value-42" not in text
    assert text.count(REDACTED) >= 3
    assert "fabulous" in text  # "ab" is too short to mask without masking everything


def test_standard_library_records_go_through_the_same_processors() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    logging.getLogger("websockets.client").info(
        "connecting to wss://u:pw-lib@host/x?token=tok-lib with Bearer bear-lib"
    )
    logging.getLogger("asyncio").debug("below the level: not written")
    (line,) = lines(buf)
    assert line["logger"] == "websockets.client" and line["level"] == "info"
    for secret in ("pw-lib", "tok-lib", "bear-lib"):
        assert secret not in buf.getvalue()
    assert "timestamp" in line

"""Logging: JSON lines, call_id bound per call, secrets redacted."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from bridge.logs import REDACTED, bind_call, configure, get_logger, unbind_call


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """These tests configure structlog (a warning level, a buffer): put it back after, or
    later tests that capture info lines see none."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_lines_with_call_id_and_redaction() -> None:
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    log = get_logger("test")
    bind_call("call-42")
    try:
        log.info(
            "provider.connect",
            url="wss://x.example/ws/tts/stream?api_key=sk-live-123&voice=a",
            api_key="sk-live-123",
            headers={"Authorization": "Bearer abc.def", "X-Other": "fine"},
            note="sent Bearer tok-999 upstream",
        )
    finally:
        unbind_call()
    log.info("after")
    first, second = _lines(buf)
    assert first["call_id"] == "call-42"
    assert first["api_key"] == REDACTED
    assert first["headers"] == {"Authorization": REDACTED, "X-Other": "fine"}
    assert first["url"] == f"wss://x.example/ws/tts/stream?api_key={REDACTED}&voice=a"
    assert first["note"] == f"sent Bearer {REDACTED} upstream"
    assert "sk-live-123" not in buf.getvalue() and "tok-999" not in buf.getvalue()
    assert "call_id" not in second


def test_level_filtering() -> None:
    buf = io.StringIO()
    configure("warning", "json", stream=buf)
    log = get_logger("test")
    log.info("hidden")
    log.warning("shown")
    assert [line["event"] for line in _lines(buf)] == ["shown"]

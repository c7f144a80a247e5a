"""Structured logging: structlog, JSON off a terminal, secrets redacted.

``configure(level, fmt)`` sets structlog up once per process. ``call_id`` is
bound per call with ``bind_call(call_id)`` (structlog contextvars), so every
line logged while handling a call carries it. ``redact_secrets`` runs last
before rendering: any key that names a secret (``api_key``, ``token``,
``password``, ``authorization``, ``signature``...) has its value replaced,
and secret-looking query parameters and bearer tokens inside string values
are masked too.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["bind_call", "configure", "get_logger", "redact_secrets", "unbind_call"]

REDACTED = "[redacted]"
_SECRET_KEY = re.compile(
    r"(api[_-]?key|token|password|passwd|secret|authorization|signature|credential|auth_token)",
    re.IGNORECASE,
)
_SECRET_IN_TEXT = [
    (
        re.compile(r"((?:api_key|apikey|token|key|password|secret)=)[^&\s\"']+", re.I),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I), r"\1" + REDACTED),
    (re.compile(r"(Digest\s+[^\n]*response=\")[0-9a-fA-F]+", re.I), r"\1" + REDACTED),
]


def _mask_text(value: str) -> str:
    for pattern, repl in _SECRET_IN_TEXT:
        value = pattern.sub(repl, value)
    return value


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > 4:
        return value
    if isinstance(value, str):
        return _mask_text(value)
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _SECRET_KEY.search(k) and v
                else _redact(v, depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_redact(v, depth + 1) for v in value)
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask secret-named keys and secrets inside strings."""
    for key in list(event_dict):
        value = event_dict[key]
        if _SECRET_KEY.search(key) and value:
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _redact(value)
    return event_dict


def configure(level: str = "info", fmt: str = "auto", stream: Any = None) -> None:
    """Configure structlog for the process.

    Args:
        level: debug, info, warning or error.
        fmt: ``json``, ``console``, or ``auto`` (console on a terminal, else JSON).
        stream: where lines go (default stderr, which journald captures).
    """
    out = stream if stream is not None else sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and getattr(out, "isatty", lambda: False)())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "callbridge") -> Any:
    """A structlog logger; ``call_id`` is added from context when bound."""
    return structlog.get_logger(name)


def bind_call(call_id: str, **fields: Any) -> None:
    """Bind ``call_id`` (and more) to every log line in the current context."""
    structlog.contextvars.bind_contextvars(call_id=call_id, **fields)


def unbind_call() -> None:
    structlog.contextvars.unbind_contextvars("call_id")

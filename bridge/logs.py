"""Structured logging: structlog, JSON off a terminal, secrets and caller data redacted.

``configure(level, fmt, log_caller_data=False, secrets=())`` sets structlog up
once per process. ``call_id`` is bound per call with ``bind_call(call_id)``
(structlog contextvars), so every line logged while handling a call carries it.

Rules the processors enforce, on every line (ours, and the standard
library's: websockets, asyncio and the engines' ``logging`` calls go through
the same chain via a ``ProcessorFormatter`` on the root logger):

1. **Secrets never reach a line.** A key that names a secret (``api_key``,
   ``token``, ``password``, ``authorization``, ``signature``...) has its value
   replaced, at any depth of nested dicts, lists and ``(name, value)`` pairs
   (deeper than ``MAX_DEPTH`` a value is replaced whole); inside strings,
   secret query parameters, ``Bearer``/``Basic`` credentials, digest
   responses and URL user-info passwords (``wss://user:pass@host``) are
   masked; and the configured secrets themselves (``secrets``) are masked
   wherever they appear in the rendered line.
2. **Caller data is opt-in.** Numbers (``from_``, ``to``, ``target``),
   DTMF digits (``digit``, ``digits``: PINs, card numbers) and what the caller
   heard (``heard_text``, ``text``) are logged as ``***`` (text as its length)
   unless ``[daemon] log_caller_data = true``.
3. **Logging never raises into the caller.** The sink catches what writing
   raises (``EPIPE``, ``ENOSPC``, a closed stream) and counts the lines it
   dropped (``dropped_lines()``); a call never fails because its log could not
   be written.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

__all__ = [
    "MAX_DEPTH",
    "REDACTED",
    "SafeSink",
    "bind_call",
    "configure",
    "dropped_lines",
    "get_logger",
    "redact_caller_data",
    "redact_secrets",
    "unbind_call",
]

REDACTED = "[redacted]"
CALLER_REDACTED = "***"
MAX_DEPTH = 6
"""Nesting below which values are not inspected but replaced whole."""
_SECRET_KEY = re.compile(
    r"(api[_-]?key|token|password|passwd|secret|authorization|signature|credential|auth_token"
    r"|cookie|\bsig\b|private[_-]?key)",
    re.IGNORECASE,
)
_SECRET_IN_TEXT = [
    (
        re.compile(
            r"((?:api_key|apikey|token|key|password|passwd|secret|signature|sig|auth)=)"
            r"[^&\s\"']+",
            re.I,
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"((?:Bearer|Basic)\s+)[^\s\"',;]+", re.I), r"\1" + REDACTED),
    (re.compile(r"(Digest\s+[^\n]*response=\")[^\"]+", re.I), r"\1" + REDACTED),
    # URL user-info: scheme://user:password@host (the password part)
    (
        re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@\"']*:)[^/\s@\"']+@", re.I),
        r"\1" + REDACTED + "@",
    ),
]
_CALLER_NUMBER_KEYS = frozenset({"from_", "from", "to", "target", "caller", "callee"})
_CALLER_DIGIT_KEYS = frozenset({"digit", "digits"})
_CALLER_TEXT_KEYS = frozenset({"heard_text", "text"})


def _mask_text(value: str) -> str:
    for pattern, repl in _SECRET_IN_TEXT:
        value = pattern.sub(repl, value)
    return value


def _redact(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _mask_text(value)
    if isinstance(value, bytes | bytearray):
        return _mask_text(bytes(value).decode("utf-8", "replace"))
    if not isinstance(value, dict | list | tuple | set | frozenset):
        return value
    if depth >= MAX_DEPTH:
        return REDACTED  # not inspected: never printed unmasked
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _SECRET_KEY.search(k) and v
                else _redact(v, depth + 1)
            )
            for k, v in value.items()
        }
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and _SECRET_KEY.search(value[0])
    ):
        return (value[0], REDACTED)  # a (name, value) header pair
    items = [_redact(v, depth + 1) for v in value]
    return items if isinstance(value, set | frozenset) else type(value)(items)


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask secret-named keys and secrets inside values."""
    for key in list(event_dict):
        value = event_dict[key]
        if _SECRET_KEY.search(key) and value:
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _redact(value)
    return event_dict


def _caller_value(key: str, value: Any) -> Any:
    if value is None or value == "":
        return value
    if key in _CALLER_TEXT_KEYS and isinstance(value, str):
        return f"[{len(value)} chars]"
    return CALLER_REDACTED


def redact_caller_data(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: caller numbers, digits and heard text as ``***`` / a length."""
    for key in list(event_dict):
        if key in _CALLER_NUMBER_KEYS or key in _CALLER_DIGIT_KEYS or key in _CALLER_TEXT_KEYS:
            event_dict[key] = _caller_value(key, event_dict[key])
    return event_dict


class SafeSink:
    """Where rendered lines go: writes never raise, configured secrets are masked.

    A failed write (``EPIPE`` when journald goes away, ``ENOSPC``, a closed or
    non-blocking stream that is full) drops the line and counts it.
    """

    def __init__(self, stream: TextIO, secrets: Iterable[str] = ()) -> None:
        self.stream = stream
        # longest first, so a secret containing another is masked whole
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        self.dropped = 0

    def mask(self, line: str) -> str:
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED)
        return line

    def write_line(self, line: str) -> None:
        try:
            self.stream.write(self.mask(line) + "\n")
            self.stream.flush()
        except Exception:  # a log line must never fail a call
            self.dropped += 1

    # structlog's logger interface (PrintLogger's): every level is one line
    def msg(self, message: str) -> None:
        self.write_line(message)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


class _SinkFactory:
    def __init__(self, sink: SafeSink) -> None:
        self.sink = sink

    def __call__(self, *args: Any) -> SafeSink:
        return self.sink


class _SinkHandler(logging.Handler):
    """The standard library's records, formatted by our processors, into the sink."""

    def __init__(self, sink: SafeSink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a record that cannot be formatted is dropped
            self.sink.dropped += 1
            return
        self.sink.write_line(line)


_sink: SafeSink | None = None
_handler: _SinkHandler | None = None


def dropped_lines() -> int:
    """Lines the sink could not write since ``configure``."""
    return _sink.dropped if _sink is not None else 0


def configure(
    level: str = "info",
    fmt: str = "auto",
    stream: Any = None,
    *,
    log_caller_data: bool = False,
    secrets: Iterable[str] = (),
) -> None:
    """Configure structlog, and the standard library's root logger, for the process.

    Args:
        level: debug, info, warning or error.
        fmt: ``json``, ``console``, or ``auto`` (console on a terminal, else JSON).
        stream: where lines go (default stderr, which journald captures).
        log_caller_data: log caller numbers, digits and heard text as they are.
        secrets: values masked wherever they appear in a line (the config's secrets).
    """
    global _sink, _handler
    out = stream if stream is not None else sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and getattr(out, "isatty", lambda: False)())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer()
    )
    chain: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if not log_caller_data:
        chain.append(redact_caller_data)
    chain.append(redact_secrets)
    _sink = SafeSink(out, secrets)
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *chain, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=_SinkFactory(_sink),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = _SinkHandler(_sink)
    _handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                *chain,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root.addHandler(_handler)
    root.setLevel(numeric_level)


def get_logger(name: str = "callbridge") -> Any:
    """A structlog logger; ``call_id`` is added from context when bound."""
    return structlog.get_logger(name)


def bind_call(call_id: str, **fields: Any) -> None:
    """Bind ``call_id`` (and more) to every log line in the current context."""
    structlog.contextvars.bind_contextvars(call_id=call_id, **fields)


def unbind_call() -> None:
    structlog.contextvars.unbind_contextvars("call_id")

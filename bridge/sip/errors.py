"""Errors raised by the SIP parsers (never out of an engine: the UA turns them into responses)."""

from __future__ import annotations

from bridge.engine import RemoteProtocolError

__all__ = ["SipParseError"]


class SipParseError(RemoteProtocolError):
    """A SIP message (or a value inside one) is malformed.

    ``reason`` is a short, precise, ASCII description that the UAS may send as
    the reason phrase of ``400 <reason>``; ``status`` is the response code the
    defect maps to (400, 505 for an unknown version, 513 for an oversized
    message...).
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason, status)
        self.reason = reason
        self.status: int = status
        # The request or response as far as it could be split into a start
        # line and header fields, when it got that far (``SipMessage``); the UAS
        # uses it to decide whether it can answer (reliability.md §1.7).
        self.partial: object | None = None

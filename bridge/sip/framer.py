"""Cutting SIP messages out of a byte stream (TCP/TLS; RFC 3261 §18.3).

Theory of operation
-------------------
A stream carries messages back to back; the only framing is the empty line
that ends the header section and the mandatory ``Content-Length``. The framer
is a generator-based parser in the python-websockets style: ``_parse()`` is a
coroutine that ``yield from``s ``_read_until`` / ``_read_exact`` helpers, and
``feed(data)`` resumes it with whatever chunk arrived (one byte or a megabyte)
and returns the complete messages found so far.

Rules:

1. CRLFs between messages are keepalives (RFC 5626 §3.5.1, §4.4.1), never
   garbage: a double CRLF is a *ping* (to be answered with a CRLF), a single
   CRLF a *pong* (the answer to ours). They are counted, not returned as
   messages; ``take_keepalives()`` hands the counts over. A ping split across
   reads (``CRLF`` | ``CRLF``) counts as a pong, then a ping: its first half
   could have been a pong as far as anyone can tell, and a peer that pings
   wants the pong either way. ``expect_pong()`` forgets such a half (we just
   sent a ping: the next lone CRLF is its pong, not the rest of theirs). Stray
   CR or LF bytes between messages are skipped, as before.
2. The buffer never grows beyond ``max_message_bytes``: a header section that
   has not ended by then, or a Content-Length that would exceed it, is a
   framing error.
3. A framing error (missing or bad Content-Length, oversized message) raises
   :class:`SipParseError`; the stream cannot be resynchronised, so the owner
   closes the connection (reliability.md §1.7 point 4). After an error every
   further ``feed`` raises again.
4. The framer does not validate messages; ``parse_message`` does that.
"""

from __future__ import annotations

import re
from collections.abc import Generator

from bridge.sip.errors import SipParseError
from bridge.sip.message import MAX_MESSAGE_BYTES, parse_content_length

__all__ = ["SipStreamFramer"]

_CONTENT_LENGTH_RE = re.compile(rb"^(?:content-length|l)[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)

# The coroutine yields when it needs more input and receives nothing back.
_Parser = Generator[None, None, None]


class SipStreamFramer:
    """Incremental message framer for one stream connection."""

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._max_message_bytes = max_message_bytes
        self._buffer = bytearray()
        self._messages: list[bytes] = []
        self._error: SipParseError | None = None
        self._pings = 0
        self._pongs = 0
        self._half_ping = False
        """The last thing read was a lone CRLF at the end of the input: a CRLF next
        completes a ping."""
        self._parser = self._parse()
        next(self._parser)

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def take_keepalives(self) -> tuple[int, int]:
        """The (pings, pongs) read since the last call (rule 1)."""
        taken = (self._pings, self._pongs)
        self._pings = self._pongs = 0
        return taken

    def expect_pong(self) -> None:
        """We sent a ping: a CRLF read next is its pong, not the second half of a ping."""
        self._half_ping = False

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data`` and return every message it completed, in order.

        Raises:
            SipParseError: the stream is broken; close the connection.
        """
        if self._error is not None:
            raise self._error
        self._buffer += data
        try:
            next(self._parser)
        except SipParseError as exc:
            self._error = exc
            self._buffer.clear()
            raise
        messages, self._messages = self._messages, []
        return messages

    def _parse(self) -> _Parser:
        while True:
            yield from self._skip_keepalives()
            head = yield from self._read_until(b"\r\n\r\n")
            matches = _CONTENT_LENGTH_RE.findall(head)
            if len(matches) != 1:
                reason = "missing Content-Length" if not matches else "multiple Content-Length"
                raise SipParseError(f"{reason} on a stream transport")
            length = parse_content_length(matches[0].decode("latin-1").strip(" \t\r"))
            if len(head) + length > self._max_message_bytes:
                raise SipParseError("Message Too Large", 513)
            body = yield from self._read_exact(length)
            self._messages.append(head + body)

    def _skip_keepalives(self) -> _Parser:
        buffer = self._buffer
        while True:
            if not buffer or buffer == b"\r":
                yield  # nothing yet, or maybe the first half of a CRLF
                continue
            if buffer.startswith(b"\r\n"):
                if self._half_ping:  # the second half of a ping split across reads
                    self._half_ping = False
                    self._pings += 1
                    del buffer[:2]
                elif buffer.startswith(b"\r\n\r\n"):
                    self._pings += 1
                    del buffer[:4]
                else:  # CRLF, then a message, a lone CR or nothing: a pong
                    self._pongs += 1
                    del buffer[:2]
                    self._half_ping = len(buffer) == 0 or buffer == b"\r"
                continue
            self._half_ping = False
            if buffer[0] in b"\r\n":  # a stray CR or LF: skipped
                del buffer[:1]
                continue
            return

    def _read_until(self, marker: bytes) -> Generator[None, None, bytes]:
        start = 0
        while True:
            index = self._buffer.find(marker, start)
            if index >= 0:
                end = index + len(marker)
                chunk = bytes(self._buffer[:end])
                del self._buffer[:end]
                return chunk
            if len(self._buffer) > self._max_message_bytes:
                raise SipParseError("header section too long")
            start = max(0, len(self._buffer) - len(marker) + 1)
            yield

    def _read_exact(self, size: int) -> Generator[None, None, bytes]:
        while len(self._buffer) < size:
            yield
        chunk = bytes(self._buffer[:size])
        del self._buffer[:size]
        return chunk

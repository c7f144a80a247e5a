"""SIP message parsing and serialisation (RFC 3261 §7, §18.3, §20, §25).

Theory of operation
-------------------
``parse_message(data)`` turns one complete message (a UDP datagram, or one
message cut out of a stream by :mod:`bridge.sip.framer`) into a
:class:`SipRequest` or :class:`SipResponse`, in two steps:

1. *Split*: the start line and the header fields are separated, folded lines
   (CRLF followed by SP/HTAB) are unfolded, compact names are expanded
   (``i`` -> Call-ID ...), and the body is framed by Content-Length (on a
   datagram, octets after Content-Length are ignored; with no Content-Length
   the body is the rest of the datagram).
2. *Validate*: version, Request-URI, mandatory headers, single-valued headers
   that appear twice, CSeq (number and method), Max-Forwards, Expires, From,
   To, Via and Contact grammar.

Any defect raises :class:`SipParseError` whose ``reason`` is precise enough to
be the reason phrase of a ``400``. When step 1 succeeded, ``partial`` holds
the split message, so the user agent can decide whether it can answer
(``can_answer``) or must drop (reliability.md §1.7).

Security limits are named constants checked *before* work is done: message
size, header count, header line length, Via count, numeric ranges.

Header storage: an ordered list of ``(key, name, value)`` where ``key`` is the
lower-case long form used for lookup and ``name`` the spelling used on output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from bridge.sip.errors import SipParseError
from bridge.sip.uri import (
    PARSE_CACHE_SIZE,
    NameAddr,
    Params,
    Uri,
    ascii_digits,
    format_params,
    is_token,
    parse_host_port,
    parse_name_addr,
    parse_params,
    parse_uri,
    split_list,
)

__all__ = [
    "MAX_CONTENT_LENGTH",
    "MAX_HEADERS",
    "MAX_HEADER_LINE_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_VIA_COUNT",
    "CSeq",
    "SipMessage",
    "SipRequest",
    "SipResponse",
    "Via",
    "build_response",
    "can_answer",
    "parse_cseq",
    "parse_message",
    "parse_via",
]

# --- security limits (reliability.md rule 2) --------------------------------
MAX_MESSAGE_BYTES = 65_535
"""Largest message accepted, head and body together (larger: 513)."""
MAX_HEADERS = 200
"""Most header fields in one message (after unfolding)."""
MAX_HEADER_LINE_BYTES = 8_192
"""Longest single header field after unfolding."""
MAX_VIA_COUNT = 70
"""Most Via values in one message."""
MAX_CONTENT_LENGTH = MAX_MESSAGE_BYTES
MAX_CSEQ = 2**32 - 1
MAX_MAX_FORWARDS = 255
MAX_EXPIRES = 2**32 - 1

SIP_VERSION = "SIP/2.0"

COMPACT_FORMS = {
    "a": "accept-contact",
    "b": "referred-by",
    "c": "content-type",
    "d": "request-disposition",
    "e": "content-encoding",
    "f": "from",
    "i": "call-id",
    "j": "reject-contact",
    "k": "supported",
    "l": "content-length",
    "m": "contact",
    "n": "identity-info",
    "o": "event",
    "r": "refer-to",
    "s": "subject",
    "t": "to",
    "u": "allow-events",
    "v": "via",
    "x": "session-expires",
    "y": "identity",
}
_CANONICAL = {
    "call-id": "Call-ID",
    "cseq": "CSeq",
    "www-authenticate": "WWW-Authenticate",
    "min-se": "Min-SE",
    "rack": "RAck",
    "rseq": "RSeq",
}
_SINGLE_VALUED = ("call-id", "cseq", "from", "to", "max-forwards", "content-length", "content-type")
_REQUIRED = ("via", "from", "to", "call-id", "cseq")
_VIA_RE = re.compile(r"^([^\s/]+)\s*/\s*([^\s/]+)\s*/\s*([^\s/]+)\s+([^;]+?)\s*(;.*)?$")
_WS = " \t"


def _display_name(key: str) -> str:
    return _CANONICAL.get(key) or "-".join(part.capitalize() for part in key.split("-"))


@dataclass(frozen=True, slots=True)
class Via:
    """One Via value: ``SIP/2.0/<transport> host[:port];params``."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()

    @property
    def branch(self) -> str | None:
        return self.param("branch")

    @property
    def rport(self) -> str | None:
        """``""`` when ``;rport`` has no value, the value, or None when absent."""
        return self.param("rport")

    @property
    def received(self) -> str | None:
        return self.param("received")

    def param(self, name: str) -> str | None:
        for key, value in self.params:
            if key.lower() == name:
                return "" if value is None else value
        return None

    def with_param(self, name: str, value: str | None) -> Via:
        """Set (or replace) one parameter, keeping the others in order."""
        params = list(self.params)
        for index, (key, _) in enumerate(params):
            if key.lower() == name:
                params[index] = (key, value)
                return replace(self, params=tuple(params))
        return replace(self, params=(*params, (name, value)))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port is None else f":{self.port}"
        return f"SIP/2.0/{self.transport} {host}{port}{format_params(self.params)}"


@dataclass(frozen=True, slots=True)
class CSeq:
    """The CSeq header: sequence number and method."""

    number: int
    method: str

    def __str__(self) -> str:
        return f"{self.number} {self.method}"


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def parse_via(value: str) -> Via:
    """Parse one Via value (one element of the comma list)."""
    match = _VIA_RE.match(value.strip(_WS))
    if match is None:
        raise SipParseError("malformed Via")
    name, version, transport, sent_by, ptext = match.groups()
    if name.upper() != "SIP" or version != "2.0" or not is_token(transport):
        raise SipParseError("bad Via sent-protocol")
    host, port = parse_host_port(sent_by.replace(" ", "").replace("\t", ""))
    params = parse_params(ptext) if ptext else ()
    via = Via(transport.upper(), host, port, params)
    rport = via.rport
    if rport and (not ascii_digits(rport) or int(rport) > 65535):
        raise SipParseError("bad Via rport")
    return via


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def parse_cseq(value: str) -> CSeq:
    number, _, method = value.strip(_WS).partition(" ")
    method = method.strip(_WS)
    if not ascii_digits(number) or len(number) > 12 or int(number) > MAX_CSEQ:
        raise SipParseError("CSeq number out of range")
    if not is_token(method):
        raise SipParseError("bad CSeq method")
    return CSeq(int(number), method)


@dataclass(slots=True)
class SipMessage:
    """Fields and body shared by requests and responses."""

    headers: list[tuple[str, str, str]] = field(default_factory=list)
    body: bytes = b""

    # --- header access -----------------------------------------------------
    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (any case, compact form allowed)."""
        key = _key(name)
        for k, _, value in self.headers:
            if k == key:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of ``name``: all lines, each split on top-level commas."""
        key = _key(name)
        out: list[str] = []
        for k, _, value in self.headers:
            if k == key:
                out.extend(split_list(value))
        return out

    def get_lines(self, name: str) -> list[str]:
        """Every line of ``name`` unsplit (for values with commas inside, e.g. challenges)."""
        key = _key(name)
        return [value for k, _, value in self.headers if k == key]

    def count(self, name: str) -> int:
        key = _key(name)
        return sum(1 for k, _, _ in self.headers if k == key)

    def add(self, name: str, value: str) -> None:
        key = _key(name)
        self.headers.append((key, _display_name(key), value))

    def set(self, name: str, value: str) -> None:
        """Replace every line of ``name`` by one line (appended if absent)."""
        key = _key(name)
        for index, (k, _, _) in enumerate(self.headers):
            if k == key:
                self.headers[index] = (key, _display_name(key), value)
                self.headers[:] = [
                    h for i, h in enumerate(self.headers) if i <= index or h[0] != key
                ]
                return
        self.add(name, value)

    def remove(self, name: str) -> None:
        key = _key(name)
        self.headers[:] = [h for h in self.headers if h[0] != key]

    # --- parsed views ------------------------------------------------------
    def vias(self) -> list[Via]:
        return [parse_via(v) for v in self.get_all("via")]

    def top_via(self) -> Via:
        for k, _, value in self.headers:
            if k == "via":
                values = split_list(value)
                if values:
                    return parse_via(values[0])
        raise SipParseError("missing Via header")

    def cseq(self) -> CSeq:
        return parse_cseq(self._required("cseq"))

    def from_(self) -> NameAddr:
        return parse_name_addr(self._required("from"))

    def to(self) -> NameAddr:
        return parse_name_addr(self._required("to"))

    @property
    def call_id(self) -> str:
        return self._required("call-id").strip(_WS)

    def contacts(self) -> list[NameAddr]:
        return [parse_name_addr(v) for v in self.get_all("contact") if v != "*"]

    def _required(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise SipParseError(f"missing {_display_name(key)} header")
        return value

    def _head_lines(self) -> list[str]:
        lines = [f"{name}: {value}" for k, name, value in self.headers if k != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return lines


_KEYS: dict[str, str] = {}
_KEYS_MAX = 1024


def _key(name: str) -> str:
    key = _KEYS.get(name)
    if key is None:
        lowered = name.lower()
        key = COMPACT_FORMS.get(lowered, lowered)
        if len(_KEYS) < _KEYS_MAX:  # names come from the wire too: keep the memo bounded
            _KEYS[name] = key
    return key


@dataclass(slots=True)
class SipRequest(SipMessage):
    """A request; ``uri`` is the Request-URI text exactly as received or built."""

    method: str = ""
    uri: str = ""
    version: str = SIP_VERSION

    def request_uri(self) -> Uri:
        return parse_uri(self.uri)

    def to_bytes(self) -> bytes:
        start = f"{self.method} {self.uri} {SIP_VERSION}"
        head = "\r\n".join([start, *self._head_lines()])
        return head.encode() + b"\r\n\r\n" + self.body


@dataclass(slots=True)
class SipResponse(SipMessage):
    """A response; ``reason`` may be empty or contain UTF-8."""

    status: int = 0
    reason: str = ""

    def to_bytes(self) -> bytes:
        start = f"{SIP_VERSION} {self.status} {self.reason}"
        head = "\r\n".join([start, *self._head_lines()])
        return head.encode() + b"\r\n\r\n" + self.body


# --- parsing ----------------------------------------------------------------


def parse_message(data: bytes) -> SipRequest | SipResponse:
    """Parse one complete message (datagram semantics for the body).

    Raises:
        SipParseError: with ``partial`` set when the header section was split.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("Message Too Large", 513)
    message, rest = _split(data)
    lines: dict[str, list[str]] = {}
    for key, _, value in message.headers:
        values = lines.get(key)
        if values is None:
            lines[key] = [value]
        else:
            values.append(value)
    try:
        message.body = _frame_body(lines, rest)
        if isinstance(message, SipRequest):
            _validate_request(message, lines)
        else:
            _validate_response(message, lines)
    except SipParseError as exc:
        exc.partial = message
        raise
    return message


def _split(data: bytes) -> tuple[SipRequest | SipResponse, bytes]:
    data = data.lstrip(b"\r\n")
    end = data.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = data.find(b"\n\n"), 2
    if end < 0:
        raise SipParseError("no empty line after the header section")
    try:
        head = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("header section is not UTF-8") from None
    if "\x00" in head:
        raise SipParseError("NUL octet in the header section")
    lines = head.replace("\r\n", "\n").split("\n")
    try:
        message = _start_line(lines[0])
    except SipParseError as exc:
        if not lines[0].upper().startswith("SIP/"):
            # Keep the header fields so that a 400 can still be answered.
            stub = SipRequest(method=lines[0].split(" ", 1)[0] or "UNKNOWN")
            try:
                stub.headers = _header_fields(lines[1:])
                exc.partial = stub
            except SipParseError:
                pass
        raise
    message.headers = _header_fields(lines[1:])
    return message, data[end + sep :]


def _start_line(line: str) -> SipRequest | SipResponse:
    if line.upper().startswith("SIP/"):
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if version.upper() != SIP_VERSION:
            raise SipParseError("bad version in status line", 505)
        if len(code) != 3 or not ascii_digits(code) or not 100 <= int(code) <= 699:
            raise SipParseError("bad status code")
        return SipResponse(status=int(code), reason=reason)
    parts = line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise SipParseError("malformed request line")
    method, uri, version = parts
    if not is_token(method):
        raise SipParseError("bad method")
    # The version is checked in validation so that 505 can still be answered.
    return SipRequest(method=method, uri=uri, version=version.upper())


def _header_fields(lines: list[str]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            if not out:
                raise SipParseError("continuation line before any header")
            key, display, value = out[-1]
            out[-1] = (key, display, value + " " + line.strip(_WS))
        else:
            name, colon, value = line.partition(":")
            name = name.rstrip(_WS)
            if not colon or not is_token(name):
                raise SipParseError("malformed header line")
            key = _key(name)
            out.append((key, _display_name(key) if len(name) == 1 else name, value.strip(_WS)))
        if len(out) > MAX_HEADERS:
            raise SipParseError("too many headers")
        if len(out[-1][2]) > MAX_HEADER_LINE_BYTES:
            raise SipParseError("header line too long")
    return out


def _frame_body(lines: dict[str, list[str]], rest: bytes) -> bytes:
    values = lines.get("content-length")
    if values is None:
        return rest
    if len(values) > 1:
        raise SipParseError("multiple Content-Length headers")
    text = values[0]
    length = parse_content_length(text)
    if length > len(rest):
        raise SipParseError("Content-Length larger than message")
    return rest[:length]


def parse_content_length(text: str) -> int:
    """Parse a Content-Length value; raise on negative or overlarge values."""
    text = text.strip(_WS)
    if text.startswith("-"):
        raise SipParseError("negative Content-Length")
    if not ascii_digits(text) or len(text) > 10 or int(text) > MAX_CONTENT_LENGTH:
        raise SipParseError("bad Content-Length")
    return int(text)


def _validate_common(message: SipMessage, lines: dict[str, list[str]]) -> None:
    """``lines``: the message's header values grouped by key, in order."""
    for key in _REQUIRED:
        if key not in lines:
            raise SipParseError(f"missing {_display_name(key)} header")
    for key in _SINGLE_VALUED:
        values = lines.get(key)
        if values is not None and (
            len(values) > 1 or (key != "content-type" and len(split_list(values[0])) > 1)
        ):
            raise SipParseError(f"multiple {_display_name(key)} headers")
    vias = [via for line in lines["via"] for via in split_list(line)]
    if not vias:
        raise SipParseError("empty Via header")  # top_via() would raise later
    if len(vias) > MAX_VIA_COUNT:
        raise SipParseError("too many Via headers")
    for value in vias:
        parse_via(value)
    parse_name_addr(lines["from"][0])
    parse_name_addr(lines["to"][0])
    for key in ("contact", "record-route", "route"):
        for line in lines.get(key, ()):
            for value in split_list(line):
                if value != "*":
                    parse_name_addr(value)
    if not lines["call-id"][0].strip(_WS):
        raise SipParseError("empty Call-ID")


def _validate_request(request: SipRequest, lines: dict[str, list[str]]) -> None:
    if request.version != SIP_VERSION:
        raise SipParseError("Version Not Supported", 505)
    try:
        uri = request.request_uri()
    except SipParseError as exc:
        raise SipParseError(f"bad Request-URI: {exc.reason}") from None
    if uri.headers:
        raise SipParseError("headers in Request-URI")
    _validate_common(request, lines)
    cseq = parse_cseq(lines["cseq"][0])
    if cseq.method != request.method:
        raise SipParseError("CSeq method does not match request method")
    _check_scalar(lines, "max-forwards", MAX_MAX_FORWARDS)
    _check_scalar(lines, "expires", MAX_EXPIRES)


def _validate_response(response: SipResponse, lines: dict[str, list[str]]) -> None:
    _validate_common(response, lines)
    parse_cseq(lines["cseq"][0])
    _check_scalar(lines, "expires", MAX_EXPIRES)


def _check_scalar(lines: dict[str, list[str]], key: str, limit: int) -> None:
    values = lines.get(key)
    if values is None:
        return
    value = values[0].strip(_WS)
    if not ascii_digits(value) or len(value) > 12 or int(value) > limit:
        raise SipParseError(f"{_display_name(key)} out of range")


def can_answer(message: object) -> bool:
    """True if ``message`` (a ``partial``) is a non-ACK request with a parseable
    top Via and Call-ID, CSeq, From and To present: enough to build a response."""
    if not isinstance(message, SipRequest) or message.method == "ACK":
        return False
    if any(message.get(key) is None for key in ("call-id", "cseq", "from", "to")):
        return False
    try:
        message.top_via()
    except SipParseError:
        return False
    return True


def build_response(
    request: SipRequest, status: int, reason: str, to_tag: str | None = None
) -> SipResponse:
    """A response to ``request`` (RFC 3261 §8.2.6): Via (all, in order), From,
    To (with ``to_tag`` added when the To has none), Call-ID and CSeq copied.

    Values are copied verbatim, so this works on a ``partial`` message too.
    """
    response = SipResponse(status=status, reason=reason)
    for key, name, value in request.headers:
        if key in ("via", "from", "call-id", "cseq"):
            response.headers.append((key, name, value))
        elif key == "to":
            if to_tag is not None and ";tag=" not in value.replace(" ", "").lower():
                value = f"{value};tag={to_tag}"
            response.headers.append((key, name, value))
    if 100 < status < 300:  # dialog-creating responses copy Record-Route (§12.1.1)
        for key, name, value in request.headers:
            if key == "record-route":
                response.headers.append((key, name, value))
    return response

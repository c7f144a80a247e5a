"""SIP URIs, name-addr values and header parameters (RFC 3261 §19.1, §20.10, §25.1).

Theory of operation
-------------------
These are pure parsing helpers for the values inside SIP headers. Each parser
takes one already-unfolded header value (or one element of a comma list) and
returns a frozen dataclass, or raises :class:`SipParseError` with a precise
reason. Nothing here allocates more than a small multiple of its input.

Rules:

1. The user part is kept as it appeared on the wire (``%HH`` escapes intact)
   so that serialisation round-trips; ``user_unescaped`` decodes it, including
   ``%00`` (never truncated).
2. An addr-spec without ``<>`` cannot carry URI parameters: every ``;param``
   after it is a header parameter (RFC 3261 §20.10). ``?`` or ``,`` in such an
   addr-spec is rejected, as is whitespace inside it.
3. IPv6 hosts must be bracketed (RFC 5118 §4.10); brackets are removed in
   ``host`` and restored on output.
4. Unknown schemes are accepted and kept opaque (RFC 4475 unksm2); the user
   agent decides whether to answer 416.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from functools import lru_cache

from bridge.sip.errors import SipParseError

__all__ = [
    "NameAddr",
    "OutboundTarget",
    "Params",
    "TargetError",
    "Uri",
    "ascii_digits",
    "e164",
    "format_params",
    "is_token",
    "outbound_target",
    "parse_name_addr",
    "parse_params",
    "parse_uri",
    "split_list",
    "unquote",
]

Params = tuple[tuple[str, str | None], ...]

# RFC 3261 §25.1 token characters.
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")
_WS = " \t"
_URI_FORBIDDEN = frozenset(" \t\r\n<>")
_ADDR_SPEC_RESERVED = frozenset(",? \t")
_BAD_PARAM_VALUE = frozenset(' \t,"')
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
MAX_PORT = 65535
PARSE_CACHE_SIZE = 256
"""Header values whose parse result is memoised (per parser). Results are frozen
dataclasses, so a value seen again (a header re-read by the user agent, the
From of an ACK after its INVITE) costs one dict lookup instead of a parse.
Small on purpose: almost every hit is a re-read within one message or one
transaction, and most values (tags, branches) are unique per call, so a large
memo only holds dead entries (4 096 per parser held ~10 MB of RSS, which
`bench_memory` saw as 18 KB of growth per completed call over 800 calls)."""


def ascii_digits(text: str) -> bool:
    """True if ``text`` is one or more ASCII digits (``str.isdigit`` also takes ``²``, ``٣``)."""
    return text.isascii() and text.isdigit()


def is_token(text: str) -> bool:
    """Return True if ``text`` is a non-empty RFC 3261 token."""
    return bool(text) and _TOKEN_CHARS.issuperset(text)


@dataclass(frozen=True, slots=True)
class Uri:
    """A parsed URI. For ``sip``/``sips``/``tel`` the fields are filled; other
    schemes keep everything after the colon in ``opaque``."""

    scheme: str
    user: str | None = None
    password: str | None = None
    host: str = ""
    port: int | None = None
    params: Params = ()
    headers: str = ""
    opaque: str = ""

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")

    @property
    def user_unescaped(self) -> str | None:
        return None if self.user is None else _unescape(self.user)

    def param(self, name: str) -> str | None:
        """The value of URI parameter ``name`` ("" for a valueless one), or None."""
        return _lookup(self.params, name)

    def has_param(self, name: str) -> bool:
        return any(key.lower() == name.lower() for key, _ in self.params)

    @property
    def host_port(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def with_params(self, params: Params) -> Uri:
        return replace(self, params=params)

    def __str__(self) -> str:
        if not self.is_sip and self.scheme != "tel":
            return f"{self.scheme}:{self.opaque}"
        if self.scheme == "tel":
            return f"tel:{self.user or ''}{format_params(self.params)}"
        userinfo = ""
        if self.user is not None:
            userinfo = self.user if self.password is None else f"{self.user}:{self.password}"
            userinfo += "@"
        tail = f"?{self.headers}" if self.headers else ""
        return f"{self.scheme}:{userinfo}{self.host_port}{format_params(self.params)}{tail}"


@dataclass(frozen=True, slots=True)
class NameAddr:
    """A From/To/Contact/Route value: optional display name, URI, header params."""

    uri: Uri
    display_name: str | None = None
    params: Params = ()

    @property
    def tag(self) -> str | None:
        return _lookup(self.params, "tag")

    def param(self, name: str) -> str | None:
        return _lookup(self.params, name)

    def with_tag(self, tag: str) -> NameAddr:
        kept = tuple(p for p in self.params if p[0].lower() != "tag")
        return replace(self, params=(*kept, ("tag", tag)))

    def __str__(self) -> str:
        name = ""
        if self.display_name is not None:
            escaped = self.display_name.replace("\\", "\\\\").replace('"', '\\"')
            name = f'"{escaped}" '
        return f"{name}<{self.uri}>{format_params(self.params)}"


def _lookup(params: Params, name: str) -> str | None:
    lname = name.lower()
    for key, value in params:
        if key.lower() == lname:
            return "" if value is None else value
    return None


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in text)


def format_params(params: Params) -> str:
    """Serialise parameters as ``;name=value`` / ``;name``."""
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params)


def unquote(value: str) -> str:
    """Remove the quotes and backslash escapes of a quoted-string (or return as is)."""
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        inner = value[1:-1]
        out: list[str] = []
        i = 0
        while i < len(inner):
            if inner[i] == "\\" and i + 1 < len(inner):
                i += 1
            out.append(inner[i])
            i += 1
        return "".join(out)
    return value


def _scan_quoted(text: str, start: int) -> int:
    """Return the index just past the quoted-string starting at ``text[start]``."""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        i += 1
    raise SipParseError("unterminated quoted string")


def split_list(value: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside quoted strings and ``<...>``; strip each element."""
    if sep not in value:  # the common case: one element
        value = value.strip(_WS)
        if '"' in value:
            _check_quotes(value)
        return [value] if value else []
    if '"' not in value and "<" not in value and ">" not in value:
        return [p for p in (part.strip(_WS) for part in value.split(sep)) if p]
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == '"':
            i = _scan_quoted(value, i)
            continue
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(value[start:i].strip(_WS))
            start = i + 1
        i += 1
    parts.append(value[start:].strip(_WS))
    return [p for p in parts if p]


def _check_quotes(text: str) -> None:
    """Raise as the full scan would on an unterminated quoted string."""
    i = text.find('"')
    while i >= 0:
        i = text.find('"', _scan_quoted(text, i))


def parse_params(text: str) -> Params:
    """Parse ``;a=b;c;d="q"`` (leading ``;`` optional, LWS tolerated around ``;``/``=``).

    Empty parameters (``;;``) are an error (RFC 4475 badinv01).
    """
    text = text.strip(_WS)
    if text.startswith(";"):
        text = text[1:]
    if not text.strip(_WS):
        raise SipParseError("empty parameter")
    out: list[tuple[str, str | None]] = []
    for item in _split_keep_empty(text, ";"):
        name, eq, value = item.partition("=")
        name = name.strip(_WS)
        if not is_token(name):
            raise SipParseError("empty parameter" if not name else "bad parameter name")
        if not eq:
            out.append((name, None))
            continue
        value = value.strip(_WS)
        if value.startswith('"'):
            if _scan_quoted(value, 0) != len(value):
                raise SipParseError("garbage after quoted parameter value")
        elif not value or not _BAD_PARAM_VALUE.isdisjoint(value):
            raise SipParseError(f"bad value for parameter {name[:32]!r}")
        out.append((name, value))
    return tuple(out)


def _split_keep_empty(text: str, sep: str) -> list[str]:
    if '"' not in text:
        return text.split(sep)
    parts: list[str] = []
    start = 0
    i = 0
    while i < len(text):
        if text[i] == '"':
            i = _scan_quoted(text, i)
            continue
        if text[i] == sep:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def parse_host_port(text: str) -> tuple[str, int | None]:
    """Parse ``host[:port]`` with bracketed IPv6; return (host without brackets, port)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipParseError("unterminated IPv6 reference")
        host, rest = text[1:end], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SipParseError("bad IPv6 address") from None
    else:
        host, colon, port_text = text.partition(":")
        if ":" in port_text:
            raise SipParseError("IPv6 address without brackets")
        rest = colon + port_text
        if not host or not _HOST_CHARS.issuperset(host):
            raise SipParseError(f"bad host {host[:64]!r}")
    if not rest:
        return host, None
    if not rest.startswith(":") or not ascii_digits(rest[1:]) or len(rest) > 6:
        raise SipParseError("bad port")
    port = int(rest[1:])
    if port > MAX_PORT:
        raise SipParseError("port out of range")
    return host, port


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def parse_uri(text: str) -> Uri:
    """Parse a URI (``sip:``, ``sips:``, ``tel:`` fully; other schemes opaquely)."""
    scheme, colon, rest = text.partition(":")
    if not colon or not scheme or not scheme[0].isalpha():
        raise SipParseError("URI without scheme")
    if not _SCHEME_CHARS.issuperset(scheme):
        raise SipParseError("bad URI scheme")
    if not _URI_FORBIDDEN.isdisjoint(text):
        raise SipParseError("whitespace or brackets inside URI")
    scheme = scheme.lower()
    if scheme == "tel":
        number, _, ptext = rest.partition(";")
        if not number:
            raise SipParseError("empty tel URI")
        return Uri(scheme="tel", user=number, params=parse_params(ptext) if ptext else ())
    if scheme not in ("sip", "sips"):
        if not rest:
            raise SipParseError("empty URI")
        return Uri(scheme=scheme, opaque=rest)
    return _parse_sip_uri(scheme, rest)


def _parse_sip_uri(scheme: str, rest: str) -> Uri:
    user: str | None = None
    password: str | None = None
    at = rest.find("@")
    question = rest.find("?")
    if at >= 0 and (question < 0 or at < question):
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, pw = userinfo.partition(":")
        password = pw if colon else None
        if not user:
            raise SipParseError("empty user part")
    rest, _, headers = rest.partition("?")
    hostport, _, ptext = rest.partition(";")
    host, port = parse_host_port(hostport)
    params = parse_params(ptext) if ptext else ()
    return Uri(scheme, user, password, host, port, params, headers)


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def parse_name_addr(value: str) -> NameAddr:
    """Parse ``"Name" <uri>;params``, ``Name <uri>;params`` or ``uri;params``."""
    value = value.strip(_WS)
    if not value:
        raise SipParseError("empty name-addr")
    display: str | None = None
    if value.startswith('"'):
        end = _scan_quoted(value, 0)
        display = unquote(value[:end])
        rest = value[end:].lstrip(_WS)
        if not rest.startswith("<"):
            raise SipParseError("quoted display name not followed by <")
        return _parse_bracketed(rest, display)
    lt = value.find("<")
    if lt >= 0:
        words = value[:lt].split()
        if not all(is_token(w) for w in words):
            raise SipParseError("display name is not a token or quoted string")
        display = " ".join(words) if words else None
        return _parse_bracketed(value[lt:], display)
    uri_text, _, ptext = value.partition(";")
    uri_text = uri_text.strip(_WS)
    if not _ADDR_SPEC_RESERVED.isdisjoint(uri_text):
        raise SipParseError("addr-spec with reserved characters needs <>")
    return NameAddr(parse_uri(uri_text), None, parse_params(ptext) if ptext else ())


def _parse_bracketed(rest: str, display: str | None) -> NameAddr:
    gt = rest.find(">")
    if gt < 0:
        raise SipParseError("missing > in name-addr")
    uri = parse_uri(rest[1:gt].strip(_WS))
    tail = rest[gt + 1 :].strip(_WS)
    if tail and not tail.startswith(";"):
        raise SipParseError("garbage after name-addr")
    return NameAddr(uri, display, parse_params(tail) if tail else ())


# --- outbound targets ---------------------------------------------------------------------

_TEL_VISUAL_SEPARATORS = str.maketrans("", "", "-.()")
E164_MAX_DIGITS = 15


class TargetError(ValueError):
    """An outbound call target we cannot call; the message says why, for the API's answer."""


@dataclass(frozen=True, slots=True)
class OutboundTarget:
    """Where an outbound INVITE goes (``outbound_target``)."""

    request_uri: str
    """Request-URI and To."""
    host: str
    """Next hop: the outbound proxy, the tel: gateway, or the target's own host."""
    port: int
    transport: str
    """``UDP``, ``TCP`` or ``TLS`` (``sips:`` or ``;transport=tls``: port 5061 by default)."""
    via_proxy: bool = False
    """The next hop is the outbound proxy: put it in a Route header (``;lr``)."""
    named_port: int | None = None
    """The next hop URI's own port; None: it names none (``port`` is the default, and
    RFC 3263 server location may find another by SRV: ``bridge.sip.locate``)."""
    scheme: str = "sip"
    """The next hop URI's scheme (``sips``: TLS only, SRV ``_sips._tcp``)."""
    named_transport: str | None = None
    """The next hop URI's ``transport`` parameter (upper case); None: it names none."""


def e164(number: str) -> str:
    """A global tel: number (RFC 3966 §5.1.4) as ``+`` and digits, separators removed.

    Raises:
        TargetError: not ``+`` followed by 1-15 digits (local numbers need a
            phone-context we do not have).
    """
    digits = number.translate(_TEL_VISUAL_SEPARATORS)
    if not digits.startswith("+") or not digits[1:].isdigit():
        raise TargetError(f"tel: target {number!r} is not a global number (+ and digits, E.164)")
    if len(digits) - 1 > E164_MAX_DIGITS:
        raise TargetError(f"tel: target {number!r} has more than {E164_MAX_DIGITS} digits")
    return digits


def _transport_of(uri: Uri) -> str:
    """``UDP``, ``TCP`` or ``TLS``: a ``sips:`` URI is TLS (RFC 3261 §26.2: never
    anything weaker), as is ``;transport=tls``."""
    transport = (uri.param("transport") or ("tls" if uri.scheme == "sips" else "udp")).lower()
    if uri.scheme == "sips" and transport != "tls":
        raise TargetError(f"{uri}: a sips: URI goes over TLS only, not {transport}")
    if transport not in ("udp", "tcp", "tls"):
        raise TargetError(f"{uri}: transport {transport!r} not supported (udp, tcp, tls)")
    return transport.upper()


def outbound_target(
    target: str, proxy: str | None = None, gateway: str | None = None
) -> OutboundTarget:
    """Resolve an outbound call target (``sip:``/``sips:`` URI or ``tel:+E164``).

    Args:
        target: what the caller of ``POST /v1/calls`` named.
        proxy: the outbound proxy's ``sip:`` URI: every call's next hop when set.
        gateway: the ``sip:`` URI whose host turns a ``tel:`` number into a call
            (the outbound proxy or the registrar, until trunks exist).

    Raises:
        TargetError: unparseable, ``sips:`` with a transport other than TLS, a
            tel: number that is not global, a tel: target without a gateway,
            another scheme.
    """
    try:
        uri = parse_uri(target.strip().strip("<>"))
        hop_uri = parse_uri(proxy) if proxy else None
        gateway_uri = parse_uri(gateway) if gateway else hop_uri
    except SipParseError as exc:
        raise TargetError(f"cannot parse the target: {exc.reason}") from None
    if uri.scheme == "tel":
        number = e164(uri.user or "")
        if gateway_uri is None or not gateway_uri.is_sip:
            raise TargetError("tel: targets need [sip] outbound_proxy or a registration")
        _transport_of(gateway_uri)
        request_uri = f"sip:{number}@{gateway_uri.host_port};user=phone"
        hop = hop_uri or gateway_uri
    elif uri.is_sip:
        _transport_of(uri)
        request_uri = str(uri)
        hop = hop_uri or uri
    else:
        raise TargetError(f"cannot call a {uri.scheme}: URI (sip:, tel:)")
    if not hop.is_sip or not hop.host:
        raise TargetError(f"no host to send the call to in {str(hop)!r}")
    transport = _transport_of(hop)
    default_port = 5061 if transport == "TLS" else 5060
    named = hop.param("transport")
    return OutboundTarget(
        request_uri,
        hop.host,
        hop.port or default_port,
        transport,
        via_proxy=hop_uri is not None,
        named_port=hop.port or None,
        scheme=hop.scheme.lower(),
        named_transport=named.upper() if named else None,
    )

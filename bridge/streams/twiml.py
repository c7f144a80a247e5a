"""TwiML for ``POST /twiml``: connect the call to our Twilio media-stream WebSocket.

Theory of operation
-------------------
Twilio asks our voice webhook what to do with a call; we answer
``<Response><Connect><Stream url="wss://.../twilio">`` with nested
``<Parameter>`` elements (protocols.md §1.1). ``<Connect>`` makes the stream
bidirectional, and Twilio runs no later verb until we close the socket, so
closing it hangs up. Rules the function enforces (Twilio's, from the
``<Stream>`` reference):

* the URL is ``wss://`` (``ws://`` is accepted for loopback tests only) and
  carries **no query string**: Twilio does not support one; data goes in
  ``<Parameter>`` and arrives in ``start.customParameters``;
* each parameter's name + value is under 500 characters;
* the route travels as the parameter ``route`` (what the Twilio engine reads).

The XML is built with the ``twilio`` library's ``VoiceResponse`` /
``Connect`` / ``Stream`` / ``Parameter`` (pure string building, no I/O), so
escaping is the library's.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from twilio.twiml.voice_response import Connect, VoiceResponse

__all__ = ["MAX_PARAMETER_CHARS", "twiml_for_route"]

#: name + value of one ``<Parameter>`` must stay below this (Twilio).
MAX_PARAMETER_CHARS = 500


def twiml_for_route(
    stream_url: str, route: str | None, parameters: Mapping[str, str] | None = None
) -> str:
    """The TwiML document connecting a call to ``stream_url``.

    Args:
        stream_url: public ``wss://host/twilio`` URL of our media-stream listener.
        route: the route the call takes (sent as parameter ``route``), or ``None``.
        parameters: more ``<Parameter>`` pairs (e.g. the single-use ``token``).

    Raises:
        ValueError: a URL Twilio would not accept, a parameter too long, or
            ``route`` given twice.
    """
    parts = urlsplit(stream_url)
    if parts.scheme not in ("wss", "ws") or not parts.netloc:
        raise ValueError(f"<Stream url> must be a wss:// URL, got {stream_url!r}")
    if parts.query or parts.fragment:
        raise ValueError("<Stream url> must not carry a query string; use parameters")
    pairs: list[tuple[str, str]] = []
    if route is not None:
        pairs.append(("route", route))
    for name, value in (parameters or {}).items():
        if name == "route" and route is not None:
            raise ValueError("'route' given both as route and as a parameter")
        pairs.append((name, value))
    for name, value in pairs:
        if not name or len(name) + len(value) >= MAX_PARAMETER_CHARS:
            raise ValueError(f"<Parameter {name[:32]!r}>: name + value must be under 500 chars")
    response = VoiceResponse()
    connect = Connect()
    stream = connect.stream(url=stream_url)
    for name, value in pairs:
        stream.parameter(name=name, value=value)
    response.append(connect)
    return str(response)

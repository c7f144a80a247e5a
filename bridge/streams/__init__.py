"""Media-stream WebSocket protocols: Twilio and the Telnyx/Plivo/Exotel/Vonage dialects.

Every dialect is a sans-I/O engine with the interface of
``bridge.streams.base.MediaStreamProtocol``; the shell picks one by the
request path of the upgrade (``DIALECTS``) and the per-call bridge never needs
to know which carrier it talks to. See docs/media-streams.md.
"""

from __future__ import annotations

from bridge.streams.base import MediaStreamProtocol, StreamSettings
from bridge.streams.exotel import ExotelStreamProtocol
from bridge.streams.plivo import PlivoStreamProtocol
from bridge.streams.telnyx import TelnyxStreamProtocol
from bridge.streams.twilio import TwilioStreamProtocol
from bridge.streams.vonage import VonageStreamProtocol

__all__ = ["DIALECTS", "engine_for_path"]

#: Request path of the WebSocket upgrade -> the dialect's engine class.
DIALECTS: dict[str, type[MediaStreamProtocol]] = {
    cls.PATH: cls
    for cls in (
        TwilioStreamProtocol,
        TelnyxStreamProtocol,
        PlivoStreamProtocol,
        ExotelStreamProtocol,
        VonageStreamProtocol,
    )
}


def engine_for_path(
    path: str, settings: StreamSettings | None = None, *, route: str | None = None
) -> MediaStreamProtocol | None:
    """A fresh engine for an upgrade to ``path`` (query string ignored), or ``None``."""
    cls = DIALECTS.get(path.split("?", 1)[0].rstrip("/") or "/")
    return None if cls is None else cls(settings, route=route)

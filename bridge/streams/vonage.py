"""Vonage Voice API WebSocket endpoint (L16 binary audio), path ``/vonage``.

Theory of operation
-------------------
A Vonage NCCO ``connect`` action with a ``websocket`` endpoint makes Vonage
open our URL (protocols.md §2.4, Vonage "WebSockets" guide). The socket is a
call *participant*: it receives the mix of the other legs and what it sends
is played into the conversation. Audio both ways is **binary** 16-bit linear
PCM, mono, 20 ms per message: 320 B at 8 kHz, 640 B at 16 kHz. Vonage does not
state the byte order; little-endian is what its SDK examples and every
integration do. Control is small JSON text messages.

From Vonage (handled by)::

    websocket:connected {content-type, ...NCCO headers at top level}
                                         _on_connected -> StreamStarted
    <binary>                             _on_binary    -> AudioReceived
    websocket:dtmf {digit, duration}     _on_dtmf      -> DtmfReceived
    websocket:notify {payload{name}}     _on_notify    -> MarkPlayed(cleared=False)
    websocket:cleared {}                 _on_cleared   -> MarkPlayed(cleared=True) for
                                         every mark pending at the clear

To Vonage::

    <binary>                             exactly one 20 ms frame (320/640 B) per message
    {"action": "notify", "payload": {"name": ...}}   our mark: answered by
                                         websocket:notify once the audio queued before
                                         it has played
    {"action": "clear"}                  drop the queued audio; confirmed by
                                         websocket:cleared (marks are then not echoed)

Vonage sends no ``start`` and no ``stop``: ``websocket:connected`` plays the
role of ``start`` (the NCCO ``headers`` are the custom parameters; a header
``uuid`` or ``call_id`` names the call, the daemon's NCCO puts it there) and
the stream ends when the socket closes. Closing the socket from our side
makes Vonage raise ``disconnected`` on the ``eventUrl``; ending the *call*
needs the REST API (``PUT /v1/calls/{uuid}``), which is the shell's job.
There is no message to send DTMF on the socket.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from bridge.streams.base import (
    CLOSE_UNSUPPORTED_DATA,
    MediaStreamProtocol,
    StreamSettings,
    StreamState,
    int_field,
    malformed,
    obj_field,
    str_field,
)

__all__ = ["VonageStreamProtocol", "parse_content_type"]

_RATES_HZ = frozenset({8000, 16000})
_RESERVED_KEYS = frozenset({"event", "content-type"})


class VonageStreamProtocol(MediaStreamProtocol):
    """One accepted Vonage Voice API WebSocket (see the module docstring)."""

    DIALECT: ClassVar[str] = "vonage"
    PATH: ClassVar[str] = "/vonage"
    BINARY_AUDIO: ClassVar[bool] = True
    HANDLERS: ClassVar[Mapping[str, str]] = {
        "websocket:connected": "_on_connected",
        "websocket:dtmf": "_on_dtmf",
        "websocket:notify": "_on_notify",
        "websocket:cleared": "_on_cleared",
    }

    def __init__(self, settings: StreamSettings | None = None, *, route: str | None = None) -> None:
        super().__init__(settings, route=route)
        self._frames_received = 0

    # ----------------------------------------------------------- from Vonage

    def _on_connected(self, msg: dict[str, Any], now: float) -> None:
        if self.state is not StreamState.AWAITING_START:
            raise malformed("second websocket:connected")
        rate_hz = parse_content_type(str_field(msg, "content-type"))
        params = {
            key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            for key, value in msg.items()
            if key not in _RESERVED_KEYS
        }
        call_id = params.get("call_id") or params.get("uuid", "")
        self._started(
            stream_id=params.get("uuid") or call_id,
            call_id=call_id,
            account_id=params.get("account_id", ""),
            tracks=("mixed",),
            custom_parameters=params,
            codec="pcm_s16le",
            sample_rate_hz=rate_hz,
        )

    def _on_binary(self, data: bytes, now: float) -> None:
        self._require_streaming("binary audio")
        self._frames_received += 1
        self._audio(data, None, self._frames_received)

    def _on_dtmf(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("websocket:dtmf")
        source = obj_field(msg, "dtmf") if "dtmf" in msg else msg
        self._dtmf(str_field(source, "digit"), int_field(source, "duration", optional=True))

    def _on_notify(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("websocket:notify")
        self._mark_answered(str_field(obj_field(msg, "payload"), "name"))

    def _on_cleared(self, msg: dict[str, Any], now: float) -> None:
        self._clear_confirmed()

    # ------------------------------------------------------------- to Vonage

    def _wire_frame(self, frame: bytes) -> None:
        self._send_bytes(frame)
        self._count_sent(len(frame))

    def _wire_mark(self, name: str) -> None:
        self._send_json({"action": "notify", "payload": {"name": name}})

    def _wire_clear(self) -> None:
        self._send_json({"action": "clear"})


def parse_content_type(value: str) -> int:
    """``audio/l16;rate=16000`` -> 16000 (8000 and 16000 only).

    Raises the engine's private malformed error for anything else.
    """
    media_type, _, params = value.partition(";")
    rate_hz: int | None = None
    for param in params.split(";"):
        name, _, raw = param.partition("=")
        if name.strip().lower() == "rate" and raw.strip().isascii() and raw.strip().isdigit():
            rate_hz = int(raw.strip())
    if media_type.strip().lower() != "audio/l16" or rate_hz not in _RATES_HZ:
        raise malformed(f"unsupported content-type {value[:48]!r}", CLOSE_UNSUPPORTED_DATA)
    return rate_hz

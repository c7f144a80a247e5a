"""Plivo audio streaming, bidirectional (``<Stream bidirectional="true">``), path ``/plivo``.

Theory of operation
-------------------
Plivo opens the WebSocket given as the text of the ``<Stream>`` XML element
(protocols.md §2.2, Plivo "Stream Event Protocol"). Field names are camelCase
like Twilio's, but ``sequenceNumber`` and ``chunk`` are JSON *numbers*
(digit strings are accepted too). There is no ``connected`` message and no
``stop`` is documented: the stream ends when the socket closes (a ``stop``,
should one come, is handled like Twilio's).

From Plivo (handled by)::

    start {sequenceNumber, start{callId, streamId, accountId, tracks[],
           mediaFormat{encoding, sampleRate}}, extra_headers}  _on_start -> StreamStarted
    media {sequenceNumber, streamId, media{track, timestamp, chunk, payload}}
                                                     _on_media -> AudioReceived
    dtmf {sequenceNumber, streamId, dtmf{digit}}     _on_dtmf  -> DtmfReceived
    playedStream {streamId, name}                    _on_played -> MarkPlayed(cleared=False)
    clearedAudio {streamId}                          _on_cleared -> MarkPlayed(cleared=True)
                                                     for every checkpoint pending at the clear
    stop                                             _on_stop (undocumented, tolerated)

To Plivo::

    playAudio {streamId, media{contentType, sampleRate, payload}}  one per 20 ms frame
    checkpoint {streamId, name}    the mark: answered by playedStream only if the
                                   audio before it actually played
    clearAudio {streamId}          answered by one clearedAudio; cleared checkpoints
                                   are never answered, so clearedAudio releases them
    sendDTMF {dtmf: "<digits>"}    (``supports_send_dtmf``)

Codecs (``contentType``): ``audio/x-mulaw`` at 8000 Hz and ``audio/x-l16`` at
8000 or 16000 Hz (Plivo's default is L16 8 kHz). Plivo does not state the
L16 byte order; little-endian is taken, as the carrier SDK examples and every
other media-stream dialect use it (docs/media-streams.md). Custom parameters
come from ``extra_headers``: a JSON object, or the ``k=v,k2=v2`` string the
``extraHeaders`` attribute is written in.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from bridge.streams._json_dialect import TwilioShapedProtocol
from bridge.streams.base import (
    CLOSE_UNSUPPORTED_DATA,
    Codec,
    StreamSettings,
    int_field,
    malformed,
    obj_field,
    str_field,
    string_map,
    tracks_field,
)

__all__ = ["PlivoStreamProtocol", "parse_extra_headers"]

_CONTENT_TYPES: dict[str, Codec] = {"audio/x-mulaw": "mulaw", "audio/x-l16": "pcm_s16le"}


class PlivoStreamProtocol(TwilioShapedProtocol):
    """One accepted Plivo audio-stream WebSocket (see the module docstring).

    ``media`` and ``dtmf`` are the shared ``TwilioShapedProtocol`` handlers;
    everything else (``start``, the playback answers, the outbound messages)
    is Plivo's own.
    """

    DIALECT: ClassVar[str] = "plivo"
    PATH: ClassVar[str] = "/plivo"
    SEQUENCE_KEY: ClassVar[str | None] = "sequenceNumber"
    STREAM_ID_KEY: ClassVar[str] = "streamId"
    supports_send_dtmf: ClassVar[bool] = True
    HANDLERS: ClassVar[Mapping[str, str]] = {
        "start": "_on_start",
        "media": "_on_media",
        "dtmf": "_on_dtmf",
        "playedStream": "_on_played",
        "clearedAudio": "_on_cleared",
        "stop": "_on_stop",
    }

    def __init__(self, settings: StreamSettings | None = None, *, route: str | None = None) -> None:
        super().__init__(settings, route=route)
        self._content_type = "audio/x-mulaw"

    # ------------------------------------------------------------ from Plivo

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        start = obj_field(msg, "start")
        stream_id = str_field(start, "streamId")
        if not stream_id:
            raise malformed("start: empty streamId")
        fmt = obj_field(start, "mediaFormat")
        encoding = str_field(fmt, "encoding").split(";")[0].strip()
        rate_hz = int_field(fmt, "sampleRate", optional=True) or 8000
        codec = _CONTENT_TYPES.get(encoding)
        allowed = {8000, 16000} if codec == "pcm_s16le" else {8000}
        if codec is None or rate_hz not in allowed:
            raise malformed(
                f"start: unsupported {encoding[:32]!r} at {rate_hz} Hz", CLOSE_UNSUPPORTED_DATA
            )
        self._content_type = encoding
        self._started(
            stream_id=stream_id,
            call_id=str_field(start, "callId"),
            account_id=str_field(start, "accountId", optional=True),
            tracks=tracks_field(start.get("tracks"), ("inbound",)),
            custom_parameters=parse_extra_headers(msg.get("extra_headers")),
            codec=codec,
            sample_rate_hz=rate_hz,
        )

    def _on_played(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("playedStream")
        self._check_message_stream(msg)
        self._mark_answered(str_field(msg, "name"))

    def _on_cleared(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("clearedAudio")
        self._check_message_stream(msg)
        self._clear_confirmed()

    def _on_stop(self, msg: dict[str, Any], now: float) -> None:
        """Undocumented ``stop``: tolerated, whatever stream it names."""
        self._require_streaming("stop")
        self._stopped("stop")

    # -------------------------------------------------------------- to Plivo

    def _wire_frame(self, frame: bytes) -> None:
        media = {
            "contentType": self._content_type,
            "sampleRate": self.sample_rate_hz,
            "payload": base64.b64encode(frame).decode("ascii"),
        }
        self._send_json({"event": "playAudio", **self._stream_ref(), "media": media})
        self._count_sent(len(frame))

    def _wire_mark(self, name: str) -> None:
        self._send_json({"event": "checkpoint", **self._stream_ref(), "name": name})

    def _wire_clear(self) -> None:
        self._send_json({"event": "clearAudio", **self._stream_ref()})

    def _wire_dtmf(self, digits: str) -> None:
        self._send_json({"event": "sendDTMF", "dtmf": digits})


def parse_extra_headers(value: Any) -> dict[str, str]:
    """Plivo ``extra_headers``: absent, a JSON object, its JSON text, or ``k=v,k2=v2``.

    Raises the engine's private malformed error (caught by ``receive_text``)
    for any other shape.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise malformed("extra_headers: invalid JSON") from None
        else:
            pairs = (item.partition("=") for item in text.split(",") if item.strip())
            return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}
    return string_map(value, "extra_headers")

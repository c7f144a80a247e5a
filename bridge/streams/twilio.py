"""Twilio Media Streams, bidirectional (``<Connect><Stream>``), path ``/twilio``.

Theory of operation
-------------------
Twilio opens the WebSocket named in the TwiML ``<Stream url>`` and speaks JSON
text messages (protocols.md §1.3-1.4, Twilio "Media Streams - WebSocket
Messages"). Every numeric field arrives as a JSON *string* except
``mediaFormat.sampleRate``/``channels``; ``sequenceNumber`` is ``"1"`` on
``start`` and grows by one on every later message (``connected`` has none).

From Twilio (handled by)::

    connected {protocol, version}                       _on_connected (before start only)
    start {sequenceNumber, streamSid, start{streamSid, accountSid, callSid,
           tracks[], customParameters{}, mediaFormat{encoding, sampleRate,
           channels}}}                                  _on_start -> StreamStarted
    media {sequenceNumber, streamSid, media{track, chunk, timestamp,
           payload}}                                    _on_media -> AudioReceived
    dtmf {sequenceNumber, streamSid, dtmf{track, digit}} _on_dtmf -> DtmfReceived
    mark {sequenceNumber, streamSid, mark{name}}        _on_mark  -> MarkPlayed
    stop {sequenceNumber, streamSid, stop{accountSid, callSid}}  _on_stop -> StreamStopped

To Twilio (no ``sequenceNumber``; ``streamSid`` on each)::

    media {streamSid, media{payload}}    one per 20 ms frame (160 B mu-law)
    mark  {streamSid, mark{name}}        echoed when the audio before it has played,
                                         at once if nothing is buffered
    clear {streamSid}                    Twilio drops its buffer and echoes every
                                         pending mark (reported cleared=True)

Only ``audio/x-mulaw`` at 8000 Hz, mono exists (documented as always); any
other ``mediaFormat`` is refused (close 1003). On a bidirectional stream only
the ``inbound`` track is sent; media of another track is ignored. The route
comes from ``customParameters.route``. Twilio has no message to send DTMF on
a media stream (``supports_send_dtmf`` is false): the call plays tones
in-band. Closing the socket ends ``<Connect>``; with no TwiML after it the
call hangs up.
"""

from __future__ import annotations

import base64
from typing import Any, ClassVar

from bridge.streams.base import (
    CLOSE_UNSUPPORTED_DATA,
    MediaStreamProtocol,
    StreamSettings,
    StreamState,
    b64_field,
    int_field,
    malformed,
    obj_field,
    str_field,
    string_map,
    tracks_field,
)

__all__ = ["TwilioStreamProtocol"]

_ENCODING = "audio/x-mulaw"
_INBOUND_TRACKS = frozenset({"inbound", "inbound_track"})


class TwilioStreamProtocol(MediaStreamProtocol):
    """One accepted Twilio Media Streams WebSocket (see the module docstring)."""

    DIALECT: ClassVar[str] = "twilio"
    PATH: ClassVar[str] = "/twilio"
    SEQUENCE_KEY: ClassVar[str | None] = "sequenceNumber"

    def __init__(self, settings: StreamSettings | None = None, *, route: str | None = None) -> None:
        super().__init__(settings, route=route)
        self._handlers = {
            "connected": self._on_connected,
            "start": self._on_start,
            "media": self._on_media,
            "dtmf": self._on_dtmf,
            "mark": self._on_mark,
            "stop": self._on_stop,
        }

    # ----------------------------------------------------------- from Twilio

    def _on_connected(self, msg: dict[str, Any], now: float) -> None:
        if self.state is not StreamState.AWAITING_START:
            raise malformed("connected after start")
        str_field(msg, "protocol", optional=True)
        str_field(msg, "version", optional=True)

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        start = obj_field(msg, "start")
        stream_sid = str_field(start, "streamSid")
        top_sid = str_field(msg, "streamSid", optional=True)
        if not stream_sid or (top_sid and top_sid != stream_sid):
            raise malformed("start: missing or inconsistent streamSid")
        fmt = start.get("mediaFormat")
        if fmt is not None:
            fmt = obj_field(start, "mediaFormat")
            encoding = str_field(fmt, "encoding")
            rate = int_field(fmt, "sampleRate")
            channels = int_field(fmt, "channels", optional=True)
            if encoding != _ENCODING or rate != 8000 or channels not in (None, 1):
                raise malformed(
                    f"start: unsupported mediaFormat {encoding[:32]}/{rate}/{channels}",
                    CLOSE_UNSUPPORTED_DATA,
                )
        self._started(
            stream_id=stream_sid,
            call_id=str_field(start, "callSid"),
            account_id=str_field(start, "accountSid", optional=True),
            tracks=tracks_field(start.get("tracks"), ("inbound",)),
            custom_parameters=string_map(start.get("customParameters"), "customParameters"),
            codec="mulaw",
            sample_rate_hz=8000,
        )

    def _on_media(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("media")
        self._check_stream_id(str_field(msg, "streamSid", optional=True))
        media = obj_field(msg, "media")
        track = str_field(media, "track", optional=True) or "inbound"
        chunk = int_field(media, "chunk", optional=True)
        timestamp_ms = int_field(media, "timestamp", optional=True)
        payload = b64_field(media, "payload")
        if track in _INBOUND_TRACKS:
            self._audio(payload, timestamp_ms, chunk)

    def _on_dtmf(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("dtmf")
        self._check_stream_id(str_field(msg, "streamSid", optional=True))
        self._dtmf(str_field(obj_field(msg, "dtmf"), "digit"))

    def _on_mark(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("mark")
        self._check_stream_id(str_field(msg, "streamSid", optional=True))
        self._mark_answered(str_field(obj_field(msg, "mark"), "name"))

    def _on_stop(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("stop")
        self._check_stream_id(str_field(msg, "streamSid", optional=True))
        self._stopped("stop")

    # ------------------------------------------------------------- to Twilio

    def _wire_frame(self, frame: bytes) -> None:
        payload = base64.b64encode(frame).decode("ascii")
        self._send_json(
            {"event": "media", "streamSid": self.stream_id, "media": {"payload": payload}}
        )
        self._count_sent(len(frame))

    def _wire_mark(self, name: str) -> None:
        self._send_json({"event": "mark", "streamSid": self.stream_id, "mark": {"name": name}})

    def _wire_clear(self) -> None:
        self._send_json({"event": "clear", "streamSid": self.stream_id})

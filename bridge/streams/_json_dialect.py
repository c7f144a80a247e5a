"""What the Twilio-shaped JSON dialects (Twilio, Telnyx, Exotel, Plivo) share.

Theory of operation
-------------------
Twilio, Telnyx and Exotel speak the same JSON media-stream protocol under
different key spellings, and Plivo reuses its ``media`` and ``dtmf``
messages. ``TwilioShapedProtocol`` holds the handlers and renderers that are
the same in all of them, parametrised by class constants; each dialect module
keeps only what really differs (its ``start``, its codecs, its extra
messages) and documents its wire format.

Inbound (the default handler table, ``HANDLERS``; a dialect may add to it or
replace it)::

    connected {<CONNECTED_FIELDS>?}        _on_connected (before start only)
    media {<STREAM_ID_KEY>, media{track?, chunk?, timestamp?, payload}}
                                           _on_media -> AudioReceived
    dtmf {<STREAM_ID_KEY>, dtmf{digit, <DTMF_DURATION_KEY>?}}
                                           _on_dtmf  -> DtmfReceived
    mark {<STREAM_ID_KEY>, mark{name}}     _on_mark  -> MarkPlayed
    stop {<STREAM_ID_KEY>}                 _on_stop  -> StreamStopped

``start`` is always the dialect's own (``_on_start``). Every handler but
``connected`` checks the message's stream id against ours (a message for
another stream is a violation); media of a track outside ``INBOUND_TRACKS``
is read and checked but not passed on.

Outbound (``SEND_STREAM_ID``: whether each message names the stream)::

    media {<STREAM_ID_KEY>, media{payload}}
    mark  {<STREAM_ID_KEY>, mark{name}}
    clear {<STREAM_ID_KEY>}

Hooks: ``_inbound_payload`` / ``_outbound_payload`` turn the wire payload to
and from the leg's codec (Telnyx L16 is big-endian on the wire);
``_send_media`` renders one ``media`` message of any size (Exotel packs
several frames into one).

Outbound ``media`` is the hot path (50 messages a second per call), so it is
not built with ``json.dumps``: the JSON around the payload is constant for a
stream (``{"event":"media","streamSid":"MZ..","media":{"payload":"`` and
``"}}``), rendered once with ``json.dumps`` at the first frame, after
``start`` fixed the stream id. Each frame is then ``prefix + base64 + suffix``
as UTF-8 bytes in a ``SendEncodedText`` (a ``SendText`` whose bytes the shell
writes as they are); the bytes are exactly what ``json.dumps`` gives.

Rules that keep this module honest: its only state is that template, and it
reads every field through the ``bridge.streams.base`` field helpers, so bad
remote input still ends as ``ProtocolViolation`` in ``receive_text``.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from bridge.streams.base import (
    MediaStreamProtocol,
    SendEncodedText,
    StreamSettings,
    StreamState,
    b64_field,
    int_field,
    malformed,
    obj_field,
    str_field,
)

__all__ = ["TwilioShapedProtocol"]


class TwilioShapedProtocol(MediaStreamProtocol):
    """The common part of the Twilio-shaped JSON dialects (see the module docstring)."""

    #: Key naming the stream at the top of inbound (and outbound) messages.
    STREAM_ID_KEY: ClassVar[str] = "streamSid"
    #: Whether outbound messages carry ``STREAM_ID_KEY`` (Telnyx: no).
    SEND_STREAM_ID: ClassVar[bool] = True
    #: Optional string fields of ``connected`` that must be strings if present.
    CONNECTED_FIELDS: ClassVar[tuple[str, ...]] = ()
    HANDLERS: ClassVar[Mapping[str, str]] = {
        "connected": "_on_connected",
        "start": "_on_start",
        "media": "_on_media",
        "dtmf": "_on_dtmf",
        "mark": "_on_mark",
        "stop": "_on_stop",
    }
    #: Tracks whose media is the caller's; ``None``: no ``track`` field is read.
    INBOUND_TRACKS: ClassVar[frozenset[str] | None] = frozenset({"inbound", "inbound_track"})
    #: Key of the key-press duration inside ``dtmf``, or ``None``.
    DTMF_DURATION_KEY: ClassVar[str | None] = None

    def __init__(self, settings: StreamSettings | None = None, *, route: str | None = None) -> None:
        super().__init__(settings, route=route)
        self._media_template: tuple[bytes, bytes] | None = None
        cls = type(self)
        # frame_message renders what _wire_frame would queue: only where a dialect
        # keeps the one-frame-one-message rendering (not Exotel's packing, not Plivo's)
        self._frame_is_message = (
            cls._wire_frame is TwilioShapedProtocol._wire_frame
            and cls._send_media is TwilioShapedProtocol._send_media
        )
        self._payload_as_is = cls._outbound_payload is TwilioShapedProtocol._outbound_payload

    # ------------------------------------------------------------- inbound

    def _on_connected(self, msg: dict[str, Any], now: float) -> None:
        if self.state is not StreamState.AWAITING_START:
            raise malformed("connected after start")
        for key in self.CONNECTED_FIELDS:
            str_field(msg, key, optional=True)

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _on_media(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("media")
        self._check_message_stream(msg)
        media = obj_field(msg, "media")
        inbound = True
        if self.INBOUND_TRACKS is not None:
            track = str_field(media, "track", optional=True) or "inbound"
            inbound = track in self.INBOUND_TRACKS
        chunk = int_field(media, "chunk", optional=True)
        timestamp_ms = int_field(media, "timestamp", optional=True)
        payload = b64_field(media, "payload")
        if inbound:
            self._audio(self._inbound_payload(payload), timestamp_ms, chunk)

    def _on_dtmf(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("dtmf")
        self._check_message_stream(msg)
        dtmf = obj_field(msg, "dtmf")
        digit = str_field(dtmf, "digit")
        duration_ms = None
        if self.DTMF_DURATION_KEY is not None:
            duration_ms = int_field(dtmf, self.DTMF_DURATION_KEY, optional=True)
        self._dtmf(digit, duration_ms)

    def _on_mark(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("mark")
        self._check_message_stream(msg)
        self._mark_answered(str_field(obj_field(msg, "mark"), "name"))

    def _on_stop(self, msg: dict[str, Any], now: float) -> None:
        self._require_streaming("stop")
        self._check_message_stream(msg)
        self._stopped("stop")

    def _inbound_payload(self, payload: bytes) -> bytes:
        """The wire payload of inbound media in the leg's codec (default: as is)."""
        return payload

    # ------------------------------------------------------------ outbound

    def _wire_frame(self, frame: bytes) -> None:
        self._send_media(frame)

    def _wire_mark(self, name: str) -> None:
        self._send_json({"event": "mark", **self._stream_ref(), "mark": {"name": name}})

    def _wire_clear(self) -> None:
        self._send_json({"event": "clear", **self._stream_ref()})

    def frame_message(self, frame: bytes) -> bytes | None:
        """As ``MediaStreamProtocol.frame_message``: the bytes ``_send_media`` would queue."""
        if (
            self._state is not StreamState.STREAMING
            or not self._frame_is_message
            or len(frame) != self.frame_bytes
        ):
            return None
        self._sent_bytes += len(frame)
        return self._media_message(frame)

    def _send_media(self, audio: bytes) -> None:
        """One outbound ``media`` message carrying ``audio`` (in the leg's codec)."""
        self._actions.append(SendEncodedText(self._media_message(audio)))
        self._sent_bytes += len(audio)

    def _media_message(self, audio: bytes) -> bytes:
        """The UTF-8 bytes of one ``media`` message carrying ``audio``, from the template."""
        template = self._media_template
        if template is None:
            template = self._media_template = self._render_media_template()
        wire = audio if self._payload_as_is else self._outbound_payload(audio)
        return b"".join((template[0], binascii.b2a_base64(wire, newline=False), template[1]))

    def _render_media_template(self) -> tuple[bytes, bytes]:
        """The bytes before and after the payload of this stream's ``media`` (``json.dumps``)."""
        msg = {"event": "media", **self._stream_ref(), "media": {"payload": ""}}
        text = json.dumps(msg, separators=(",", ":"))
        tail = '""}}'
        assert text.endswith(tail), text  # the payload is the last value rendered
        return text[: -len(tail) + 1].encode(), tail[1:].encode()

    def _outbound_payload(self, audio: bytes) -> bytes:
        """Outbound audio as the wire carries it (default: as is)."""
        return audio

    # ------------------------------------------------------------- helpers

    def _check_message_stream(self, msg: dict[str, Any]) -> None:
        """The message's ``STREAM_ID_KEY`` (if any) must name our stream."""
        self._check_stream_id(str_field(msg, self.STREAM_ID_KEY, optional=True))

    def _start_stream_id(self, msg: dict[str, Any], start: dict[str, Any]) -> str:
        """The stream id of a ``start`` that names it inside ``start`` and maybe on top."""
        key = self.STREAM_ID_KEY
        stream_id = str_field(start, key)
        top_id = str_field(msg, key, optional=True)
        if not stream_id or (top_id and top_id != stream_id):
            raise malformed(f"start: missing or inconsistent {key}")
        return stream_id

    def _stream_ref(self) -> dict[str, str]:
        return {self.STREAM_ID_KEY: self.stream_id} if self.SEND_STREAM_ID else {}

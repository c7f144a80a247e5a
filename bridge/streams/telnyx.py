"""Telnyx media streaming, bidirectional RTP mode, path ``/telnyx``.

Theory of operation
-------------------
Telnyx opens the ``stream_url`` given to ``dial``/``answer``/``streaming_start``
(or TeXML ``<Stream>``) and speaks Twilio-shaped JSON with snake_case keys and
a top-level ``stream_id`` (protocols.md §2.1, Telnyx "Media Streaming" and its
AsyncAPI page). Numbers arrive as strings (``sequence_number``, ``chunk``,
``timestamp``); ``media_format.sample_rate`` may be a number or a string.

From Telnyx (handled by)::

    connected {version}                                   _on_connected
    start {sequence_number, stream_id, start{user_id, call_control_id,
           call_session_id, from, to, client_state, custom_parameters?,
           media_format{encoding, sample_rate, channels}}} _on_start -> StreamStarted
    media {sequence_number, stream_id, media{track, chunk, timestamp,
           payload}}                                      _on_media -> AudioReceived
    dtmf {sequence_number, stream_id, occurred_at, dtmf{digit}}  _on_dtmf
    mark {sequence_number, stream_id, mark{name}}         _on_mark  -> MarkPlayed
    error {stream_id, payload{code, title, detail}}       _on_error -> CarrierErrorReceived
    stop {sequence_number, stream_id, stop{user_id, call_control_id}}  _on_stop

To Telnyx (``stream_bidirectional_mode: rtp``)::

    media {media{payload}}   base64 RTP payload, no RTP header; one 20 ms frame per
                             message (the minimum Telnyx accepts is 20 ms)
    mark  {mark{name}}       echoed when played, at once if nothing is queued
    clear {}                 stops playback, empties the queue, echoes pending marks

Codecs: ``PCMU`` (also the older spelling ``audio/x-mulaw``) and ``PCMA``
(``audio/x-alaw``) at 8000 Hz, and ``L16`` at 8000 or 16000 Hz. L16 is an RTP
payload, so network byte order (RFC 3551 §4.5.11): the engine swaps it to
s16le on the way in and back on the way out, so the call always sees
``pcm_s16le``. G722, OPUS and AMR-WB are refused (close 1003). The outbound
codec is taken to be the inbound one (configure ``stream_bidirectional_codec``
to match ``stream_codec``). Custom parameters come from
``start.custom_parameters`` (an object or a list of ``{name, value}``) plus
``client_state`` as given. Telnyx does not guarantee the order of media and
DTMF messages: sequence jumps are reported as ``SequenceGap`` and the audio is
passed on in arrival order (no reordering buffer). Telnyx has no DTMF message
on the stream (``send_dtmf`` is Call Control's job).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from bridge.streams._json_dialect import TwilioShapedProtocol
from bridge.streams.base import (
    CLOSE_UNSUPPORTED_DATA,
    CarrierErrorReceived,
    Codec,
    int_field,
    malformed,
    obj_field,
    str_field,
    string_map,
    tracks_field,
)
from telcodec.l16 import swap_bytes

__all__ = ["TelnyxStreamProtocol"]

#: ``media_format.encoding`` -> our codec name.
_ENCODINGS: dict[str, Codec] = {
    "PCMU": "mulaw",
    "audio/x-mulaw": "mulaw",
    "PCMA": "alaw",
    "audio/x-alaw": "alaw",
    "L16": "pcm_s16le",
    "audio/x-l16": "pcm_s16le",
}
_L16_RATES_HZ = frozenset({8000, 16000})


class TelnyxStreamProtocol(TwilioShapedProtocol):
    """One accepted Telnyx media-streaming WebSocket (see the module docstring).

    The shared ``TwilioShapedProtocol`` handles ``connected``, ``media``,
    ``dtmf``, ``mark``, ``stop`` and renders the outbound messages (without a
    stream id); Telnyx adds its ``start``, ``error`` and the L16 byte swap.
    """

    DIALECT: ClassVar[str] = "telnyx"
    PATH: ClassVar[str] = "/telnyx"
    SEQUENCE_KEY: ClassVar[str | None] = "sequence_number"
    STREAM_ID_KEY: ClassVar[str] = "stream_id"
    SEND_STREAM_ID: ClassVar[bool] = False
    CONNECTED_FIELDS: ClassVar[tuple[str, ...]] = ("version",)
    HANDLERS: ClassVar[Mapping[str, str]] = {
        **TwilioShapedProtocol.HANDLERS,
        "error": "_on_error",
    }

    # ----------------------------------------------------------- from Telnyx

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        start = obj_field(msg, "start")
        stream_id = str_field(msg, "stream_id")
        if not stream_id:
            raise malformed("start: empty stream_id")
        codec, rate_hz = _media_format(obj_field(start, "media_format"))
        params = _custom_parameters(start.get("custom_parameters"))
        client_state = str_field(start, "client_state", optional=True)
        if client_state:
            params.setdefault("client_state", client_state)
        self._started(
            stream_id=stream_id,
            call_id=str_field(start, "call_control_id"),
            account_id=str_field(start, "user_id", optional=True),
            tracks=tracks_field(start.get("tracks"), ("inbound",)),
            custom_parameters=params,
            codec=codec,
            sample_rate_hz=rate_hz,
        )

    def _inbound_payload(self, payload: bytes) -> bytes:
        if self.codec != "pcm_s16le":
            return payload
        if len(payload) % 2:
            raise malformed(f"odd-length L16 payload ({len(payload)} bytes)")
        return swap_bytes(payload)

    def _on_error(self, msg: dict[str, Any], now: float) -> None:
        payload = obj_field(msg, "payload")
        code = payload.get("code")
        if not isinstance(code, (str, int)) or isinstance(code, bool):
            raise malformed("error: 'code' must be a string or a number")
        title = str_field(payload, "title", optional=True)
        detail = str_field(payload, "detail", optional=True)
        self._events.append(CarrierErrorReceived(str(code)[:32], title[:200], detail[:500]))

    # ------------------------------------------------------------- to Telnyx

    def _outbound_payload(self, audio: bytes) -> bytes:
        return swap_bytes(audio) if self.codec == "pcm_s16le" else audio


def _media_format(fmt: dict[str, Any]) -> tuple[Codec, int]:
    encoding = str_field(fmt, "encoding")
    rate_hz = int_field(fmt, "sample_rate", optional=True) or 8000
    channels = int_field(fmt, "channels", optional=True)
    codec = _ENCODINGS.get(encoding)
    if codec is None or channels not in (None, 1):
        raise malformed(f"start: unsupported encoding {encoding[:32]!r}", CLOSE_UNSUPPORTED_DATA)
    allowed = _L16_RATES_HZ if codec == "pcm_s16le" else {8000}
    if rate_hz not in allowed:
        raise malformed(f"start: unsupported {encoding} rate {rate_hz}", CLOSE_UNSUPPORTED_DATA)
    return codec, rate_hz


def _custom_parameters(value: Any) -> dict[str, str]:
    """``custom_parameters`` as an object, or as a list of ``{name, value}``."""
    if not isinstance(value, list):
        return string_map(value, "custom_parameters")
    out: dict[str, str] = {}
    for item in value:
        if not isinstance(item, dict):
            raise malformed("custom_parameters: items must be objects")
        out[str_field(item, "name")] = str_field(item, "value")
    return out

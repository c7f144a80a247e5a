"""Exotel Voicebot applet (bidirectional AgentStream), path ``/exotel``.

Theory of operation
-------------------
Exotel opens the ``wss://`` URL configured in the Voicebot applet and speaks
Twilio-shaped JSON with snake_case keys (protocols.md §2.3, Exotel
"AgentStream WebSocket protocol"). Audio both ways is raw 16-bit
little-endian mono PCM ("slin"), base64 in JSON, at the rate of the URL's
``?sample-rate=8000|16000|24000`` (default 8000).

From Exotel (handled by)::

    connected {}                                       _on_connected
    start {sequence_number, stream_sid, start{stream_sid, call_sid, account_sid,
           from, to, custom_parameters{}, media_format{encoding, sample_rate,
           bit_rate}}}                                 _on_start -> StreamStarted
    media {sequence_number, stream_sid, media{chunk, timestamp, payload}}
                                                       _on_media -> AudioReceived
    dtmf {sequence_number, stream_sid, dtmf{digit, duration}}  _on_dtmf
    mark {sequence_number, stream_sid, mark{name}}     _on_mark  -> MarkPlayed
    stop {sequence_number, stream_sid, stop{call_sid, account_sid, reason}}  _on_stop

To Exotel::

    media {stream_sid, media{payload}}   one *chunk* (below)
    mark  {stream_sid, mark{name}}       echoed when the audio before it has played
    clear {stream_sid}                   Exotel drops its buffer; pending marks are
                                         reported cleared (Twilio semantics assumed)

Packing. Exotel wants outbound payloads that are a multiple of 320 bytes,
at least 3200 B and at most 100 000 B: smaller chunks cause jitter, odd sizes
make the platform play a short packet and then wait 20 ms. ``send_frame``
therefore appends the 20 ms frame to a buffer and sends a ``media`` message
each time ``chunk_bytes`` (default 3200: 200 ms at 8 kHz, 100 ms at 16 kHz)
have gathered. ``mark`` and ``flush`` send what is buffered at once, padded
with silence (zero samples) up to ``chunk_bytes``, so a mark always sits right
after the audio it follows. Consequences, documented in docs/media-streams.md:

* the first audio of a turn leaves up to one chunk (200 ms at 8 kHz) later
  than it would on Twilio; the media clock's lead absorbs it;
* a turn's tail is padded with up to ``chunk_bytes - frame_bytes`` of silence,
  which delays that turn's mark echo by as much;
* ``clear`` drops the unsent buffer too: that audio never left, so it can
  never have been heard, and ``sent_ms`` never counted it.

Exotel has no DTMF message to send.
"""

from __future__ import annotations

from typing import Any, ClassVar

from bridge.streams._json_dialect import TwilioShapedProtocol
from bridge.streams.base import (
    CLOSE_UNSUPPORTED_DATA,
    StreamSettings,
    int_field,
    malformed,
    obj_field,
    str_field,
    string_map,
)

__all__ = ["CHUNK_ALIGN_BYTES", "MAX_CHUNK_BYTES", "MIN_CHUNK_BYTES", "ExotelStreamProtocol"]

CHUNK_ALIGN_BYTES = 320
MIN_CHUNK_BYTES = 3200
MAX_CHUNK_BYTES = 100_000
_RATES_HZ = frozenset({8000, 16000, 24000})


class ExotelStreamProtocol(TwilioShapedProtocol):
    """One accepted Exotel Voicebot WebSocket (see the module docstring).

    The shared ``TwilioShapedProtocol`` handles ``connected``, ``media`` (no
    track field), ``dtmf`` (with ``duration``), ``mark`` and ``stop`` and
    renders ``mark``/``clear``; Exotel adds its ``start`` and the packing of
    outbound audio into chunks.
    """

    DIALECT: ClassVar[str] = "exotel"
    PATH: ClassVar[str] = "/exotel"
    SEQUENCE_KEY: ClassVar[str | None] = "sequence_number"
    STREAM_ID_KEY: ClassVar[str] = "stream_sid"
    INBOUND_TRACKS: ClassVar[frozenset[str] | None] = None
    DTMF_DURATION_KEY: ClassVar[str | None] = "duration"

    def __init__(
        self,
        settings: StreamSettings | None = None,
        *,
        route: str | None = None,
        chunk_bytes: int = MIN_CHUNK_BYTES,
    ) -> None:
        """Args:
        chunk_bytes: outbound ``media`` payload size; a multiple of 320 in
            [3200, 100000].

        Raises:
            ValueError: ``chunk_bytes`` breaks Exotel's rules.
        """
        if chunk_bytes % CHUNK_ALIGN_BYTES or not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"Exotel chunks are multiples of 320 in [3200, 100000], got {chunk_bytes}"
            )
        super().__init__(settings, route=route)
        self.chunk_bytes = chunk_bytes
        self._unsent = bytearray()

    @property
    def unsent_bytes(self) -> int:
        """Audio held back until a chunk is complete (or a mark/flush)."""
        return len(self._unsent)

    # ----------------------------------------------------------- from Exotel

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        start = obj_field(msg, "start")
        stream_sid = self._start_stream_id(msg, start)
        rate_hz = 8000
        fmt = start.get("media_format")
        if fmt is not None:
            fmt = obj_field(start, "media_format")
            rate_hz = int_field(fmt, "sample_rate", optional=True) or 8000
            bits = int_field(fmt, "bit_rate", optional=True)
            if rate_hz not in _RATES_HZ or bits not in (None, 16):
                raise malformed(
                    f"start: unsupported format {rate_hz} Hz/{bits} bit", CLOSE_UNSUPPORTED_DATA
                )
        self._started(
            stream_id=stream_sid,
            call_id=str_field(start, "call_sid"),
            account_id=str_field(start, "account_sid", optional=True),
            tracks=("inbound",),
            custom_parameters=string_map(start.get("custom_parameters"), "custom_parameters"),
            codec="pcm_s16le",
            sample_rate_hz=rate_hz,
        )

    # ------------------------------------------------------------- to Exotel

    def _wire_frame(self, frame: bytes) -> None:
        self._unsent += frame
        while len(self._unsent) >= self.chunk_bytes:
            self._send_media(bytes(self._unsent[: self.chunk_bytes]))
            del self._unsent[: self.chunk_bytes]

    def _wire_flush(self) -> None:
        if self._unsent:
            padding = bytes(self.chunk_bytes - len(self._unsent))
            self._send_media(bytes(self._unsent) + padding)
            self._unsent.clear()

    def _drop_unsent(self) -> None:
        self._unsent.clear()

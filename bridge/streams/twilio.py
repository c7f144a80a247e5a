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

import binascii
import re
from typing import Any, ClassVar

from bridge.streams._json_dialect import TwilioShapedProtocol
from bridge.streams.base import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_UNSUPPORTED_DATA,
    AudioReceived,
    StreamState,
    _Malformed,
    int_field,
    malformed,
    obj_field,
    str_field,
    string_map,
    tracks_field,
)

__all__ = ["TwilioStreamProtocol"]

_ENCODING = "audio/x-mulaw"

#: A ``media`` message as Twilio writes it: its keys in Twilio's order, no
#: escape in any string, numbers as strings of 1-18 ASCII digits (what
#: ``int_field`` accepts), a stream id of letters and digits. Such a text is
#: valid JSON whose ``json.loads`` would give exactly these fields, so the
#: fast path in ``receive_text`` reads them from the match; any other text
#: (another key order, spaces elsewhere, escapes, a malformed message) takes
#: the full path and is judged exactly as before.
_MEDIA_TEXT = re.compile(
    r'\{"event": ?"media", ?"sequenceNumber": ?"([0-9]{1,18})", ?'
    r'"media": ?\{"track": ?"([A-Za-z_]*)", ?"chunk": ?"([0-9]{1,18})", ?'
    r'"timestamp": ?"([0-9]{1,18})", ?"payload": ?"([A-Za-z0-9+/=]*)"\}, ?'
    r'"streamSid": ?"([A-Za-z0-9]*)"\}'
)

#: The part of ``_MEDIA_TEXT`` before the payload's characters, for
#: ``take_media_text``: a match, then the payload up to the next quote, then
#: exactly one of ``_media_tails`` is a text ``_MEDIA_TEXT`` matches too.
_MEDIA_HEAD = re.compile(
    r'\{"event": ?"media", ?"sequenceNumber": ?"([0-9]{1,18})", ?'
    r'"media": ?\{"track": ?"([A-Za-z_]*)", ?"chunk": ?"[0-9]{1,18}", ?'
    r'"timestamp": ?"[0-9]{1,18}", ?"payload": ?"'
)
_STREAM_SID = re.compile(r"[A-Za-z0-9]+")


class TwilioStreamProtocol(TwilioShapedProtocol):
    """One accepted Twilio Media Streams WebSocket (see the module docstring).

    ``connected``, ``media``, ``dtmf``, ``mark``, ``stop`` and the outbound
    messages are the shared ``TwilioShapedProtocol`` ones; only ``start`` is
    Twilio's own.
    """

    DIALECT: ClassVar[str] = "twilio"
    PATH: ClassVar[str] = "/twilio"
    SEQUENCE_KEY: ClassVar[str | None] = "sequenceNumber"
    STREAM_ID_KEY: ClassVar[str] = "streamSid"
    CONNECTED_FIELDS: ClassVar[tuple[str, ...]] = ("protocol", "version")

    def _on_start(self, msg: dict[str, Any], now: float) -> None:
        start = obj_field(msg, "start")
        stream_sid = self._start_stream_id(msg, start)
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

    _media_tails: frozenset[str] | None = None
    """What may follow a ``media`` payload naming this stream (set at the first ``take``)."""

    def take_media_text(self, text: str) -> bytes | None:
        """As ``MediaStreamProtocol.take_media_text``, for a ``media`` message as Twilio writes it.

        Taken: a text ``_MEDIA_TEXT`` matches (checked in pieces: the
        head, the payload up to the next quote, a tail naming this stream,
        which must be letters and digits) whose sequence number is the one
        expected, whose track is inbound and whose payload is strict,
        non-empty base64. That is the fast path of ``receive_text`` with no
        ``SequenceGap``, violation or ignored track possible, minus the
        ``AudioReceived`` (its timestamp and chunk are not read).
        """
        if self._state is not StreamState.STREAMING or len(text) > self.settings.max_message_bytes:
            return None
        head = _MEDIA_HEAD.match(text)
        if head is None:
            return None
        start = head.end()
        end = text.find('"', start)
        tails = self._media_tails
        if tails is None:
            tails = self._media_tails = self._render_media_tails()
        if end < 0 or text[end:] not in tails:
            return None
        seq, track = head.groups()
        tracks = self.INBOUND_TRACKS
        if int(seq) != self._expected_seq or (track and tracks is not None and track not in tracks):
            return None
        try:
            audio = binascii.a2b_base64(text[start:end], strict_mode=True)
        except (binascii.Error, ValueError):
            return None
        if not audio:
            return None
        self._expected_seq += 1
        return audio

    def _render_media_tails(self) -> frozenset[str]:
        sid = self.stream_id
        if not _STREAM_SID.fullmatch(sid):
            return frozenset()  # only what _MEDIA_TEXT's stream id group allows
        return frozenset(
            f'"}}{comma}"streamSid":{colon}"{sid}"}}'
            for comma in (",", ", ")
            for colon in ("", " ")
        )

    def receive_text(self, text: str, now: float) -> None:
        """As ``MediaStreamProtocol.receive_text``; Twilio's own ``media`` without ``json.loads``.

        The fast path does what the full path does for such a message, in
        the same order: sequence check, stream id check, track, base64
        (strict), ``AudioReceived``. Measured in ``bench/bench_streams.py``.
        """
        match = _MEDIA_TEXT.fullmatch(text) if self._state is StreamState.STREAMING else None
        if match is None or len(text) > self.settings.max_message_bytes:
            super().receive_text(text, now)
            return
        seq, track, chunk, timestamp, payload, stream_sid = match.groups()
        try:
            got = int(seq)
            if got == self._expected_seq:  # the common case of _sequence_seen
                self._expected_seq = got + 1
            else:
                self._sequence_seen(got)
            if stream_sid != self.stream_id:
                self._check_stream_id(stream_sid)
            try:
                # b64decode(validate=True) is exactly this, after encoding the str
                audio = binascii.a2b_base64(payload, strict_mode=True)
            except (binascii.Error, ValueError):
                raise _Malformed("'payload' is not base64", CLOSE_INVALID_PAYLOAD) from None
            tracks = self.INBOUND_TRACKS
            if tracks is None or (track or "inbound") in tracks:
                if audio and self.codec == "mulaw":  # _audio's common case, STREAMING
                    self._events.append(
                        AudioReceived(
                            audio, "mulaw", self.sample_rate_hz, int(timestamp), int(chunk)
                        )
                    )
                else:
                    self._audio(audio, int(timestamp), int(chunk))
        except _Malformed as exc:
            self._violate(exc.reason, exc.code)

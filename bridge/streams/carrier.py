"""The carrier side of a Twilio Media Stream, sans-I/O: what Twilio does to us.

Written from the reference (protocols.md §1.3-1.4, Twilio "Media Streams -
WebSocket Messages"), not from our engine, so pairing the two tests one
against an independent reading of the documents. The stream tests pair it
with ``bridge.streams.twilio`` in-process; ``callbridge call ws://.../twilio``
(``bridge.io.caller``) drives it over a real WebSocket.

Theory of operation
-------------------
What it does, as Twilio does it:

* produces ``connected`` (no sequence number), then ``start`` (sequence
  ``"1"``), ``media`` (``chunk`` from ``"1"``, ``timestamp`` in ms since the
  stream started), ``dtmf`` and ``stop``, every number a JSON *string* except
  ``mediaFormat.sampleRate``/``channels``, the sequence growing by one on
  every message including mark echoes;
* consumes ``media`` / ``mark`` / ``clear``: checks ``streamSid``, base64 and
  the absence of ``sequenceNumber``; anything else is recorded in
  ``errors()`` (never raised, so a driver over a real socket keeps going);
* buffers outbound audio and plays it at 8000 bytes of mu-law per second
  against ``now`` (real time), starting when audio arrives to an idle
  buffer; echoes a mark when all audio queued before it has played, at once
  if nothing is buffered; on ``clear`` drops the buffer and echoes every
  pending mark immediately;
* records the arrival time and payload of every outbound ``media`` message
  (``arrival_times()``, ``received_media()``), the time of every ``clear``
  (``clear_times()``), what was played (``played_audio()``, and
  ``heard_audio(until_s)``: the same bytes at the times they played, with
  mu-law silence where nothing did), every echo (``marks_echoed()``) and
  gaps in playout (``playout_gaps()``).

The API for a driver (in-process or over a socket)::

    carrier = TwilioCarrier(custom_parameters={"route": "demo"})
    carrier.connect(now)                      # queue connected + start
    carrier.send_audio(mulaw_bytes, now)      # queue media, 160 B per message
    for text in carrier.frames_to_send(now):  # drain what Twilio sends now
        ws.send(text)
    carrier.receive(text_from_daemon, now)    # feed what the daemon sent
    carrier.next_deadline()                   # when the next mark echo is due

Every method that takes ``now`` first plays the buffer out up to ``now``, so
echoes are produced in time order. Nothing here reads a clock.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BYTES_PER_SECOND",
    "MAX_BUFFER_S",
    "MULAW_SILENCE",
    "MarkEcho",
    "TwilioCarrier",
]

#: mu-law at 8000 Hz: one byte per sample.
BYTES_PER_SECOND = 8000
#: Twilio discards media beyond 10 minutes of buffer (warning 31931).
MAX_BUFFER_S = 600.0
_CHUNK_BYTES = 160
#: The mu-law byte of digital silence (what ``heard_audio`` fills idle time with).
MULAW_SILENCE = 0xFF
#: Float rounding when a frame arrives exactly as the buffer drains is no gap.
_GAP_TOLERANCE_S = 1e-6


@dataclass(frozen=True, slots=True)
class MarkEcho:
    """One ``mark`` Twilio sent back: when, and whether a ``clear`` caused it."""

    name: str
    at_s: float
    cleared: bool


class TwilioCarrier:
    """The Twilio side of one bidirectional media stream (see the module docstring)."""

    def __init__(
        self,
        *,
        stream_sid: str = "MZ00000000000000000000000000000001",
        call_sid: str = "CA00000000000000000000000000000001",
        account_sid: str = "AC00000000000000000000000000000001",
        custom_parameters: dict[str, str] | None = None,
    ) -> None:
        self.stream_sid = stream_sid
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.custom_parameters = dict(custom_parameters or {})
        self._outbox: list[str] = []
        self._sequence = 0
        self._chunk = 0
        self._origin_s: float | None = None
        self._stopped = False
        # Playout: audio chunks (bytes) and mark names (str) in arrival order.
        self._buffer: deque[bytes | str] = deque()
        self._buffered_bytes = 0
        self._clock_s = 0.0
        self._idle_since_s: float | None = None
        self._played = bytearray()
        self._arrivals: list[float] = []
        self._echoes: list[MarkEcho] = []
        self._gaps: list[tuple[float, float]] = []
        self._errors: list[str] = []
        self._media_sizes: list[int] = []
        self._media: list[tuple[float, bytes]] = []
        self._clears: list[float] = []
        self._segments: list[tuple[float, bytes]] = []

    # ----------------------------------------------------- carrier -> server

    def connect(self, now: float) -> None:
        """Queue ``connected`` and ``start``; the stream's clock starts at ``now``."""
        self._advance(now)
        self._origin_s = now
        self._clock_s = now
        self._outbox.append(
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        )
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": self.custom_parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        self._emit({"event": "start", "start": start})

    def send_audio(self, mulaw: bytes, now: float) -> None:
        """Queue the caller's audio as ``media`` messages of 160 bytes (20 ms) each."""
        self._advance(now)
        base_ms = self._elapsed_ms(now)
        for offset in range(0, len(mulaw), _CHUNK_BYTES):
            self._chunk += 1
            media = {
                "track": "inbound",
                "chunk": str(self._chunk),
                "timestamp": str(base_ms + offset // 8),
                "payload": base64.b64encode(mulaw[offset : offset + _CHUNK_BYTES]).decode(),
            }
            self._emit({"event": "media", "media": media})

    def send_dtmf(self, digit: str, now: float) -> None:
        """Queue a ``dtmf`` message (track is always ``inbound_track``)."""
        self._advance(now)
        self._emit({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}})

    def send_stop(self, now: float) -> None:
        """Queue ``stop``: the call ended."""
        self._advance(now)
        self._emit(
            {"event": "stop", "stop": {"accountSid": self.account_sid, "callSid": self.call_sid}}
        )
        self._stopped = True

    def skip_sequence_numbers(self, count: int) -> None:
        """Lose ``count`` messages: the next one jumps its ``sequenceNumber``."""
        self._sequence += count

    def frames_to_send(self, now: float) -> list[str]:
        """Drain the text messages Twilio sends by ``now`` (mark echoes included)."""
        self._advance(now)
        out, self._outbox = self._outbox, []
        return out

    # ----------------------------------------------------- server -> carrier

    def receive(self, text: str, now: float) -> None:
        """Consume one text message from the server at ``now``."""
        self._advance(now)
        try:
            msg = json.loads(text)
        except ValueError:
            self._errors.append("not JSON")
            return
        if not isinstance(msg, dict):
            self._errors.append("not a JSON object")
            return
        if "sequenceNumber" in msg:
            self._errors.append("outbound messages carry no sequenceNumber")
        if msg.get("streamSid") != self.stream_sid:
            self._errors.append(f"wrong or missing streamSid: {msg.get('streamSid')!r}")
            return
        if self._origin_s is None or self._stopped:
            self._errors.append(f"{msg.get('event')} outside a started stream")
            return
        handler = {"media": self._on_media, "mark": self._on_mark, "clear": self._on_clear}
        event = msg.get("event")
        if not isinstance(event, str) or event not in handler:
            self._errors.append(f"unknown event {event!r}")
            return
        handler[event](msg, now)
        self._advance(now)

    def next_deadline(self) -> float | None:
        """When the next queued mark will be reached, or ``None`` without one."""
        t = self._clock_s
        for item in self._buffer:
            if isinstance(item, str):
                return t
            t += len(item) / BYTES_PER_SECOND
        return None

    # ------------------------------------------------------------ observation

    def played_audio(self) -> bytes:
        """Every byte played to the caller so far, in order."""
        return bytes(self._played)

    def arrival_times(self) -> list[float]:
        """``now`` of each outbound ``media`` message received."""
        return list(self._arrivals)

    def media_sizes(self) -> list[int]:
        """Decoded payload size of each outbound ``media`` message."""
        return list(self._media_sizes)

    def received_media(self) -> list[tuple[float, bytes]]:
        """(arrival time, decoded payload) of each outbound ``media`` message."""
        return list(self._media)

    def clear_times(self) -> list[float]:
        """``now`` of each ``clear`` received."""
        return list(self._clears)

    def heard_audio(self, until_s: float) -> bytes:
        """What the caller heard from ``connect`` to ``until_s``, as mu-law at 8000 Hz.

        Played audio sits at the time it played; idle time (nothing buffered,
        or after a ``clear``) is ``MULAW_SILENCE``. Empty before ``connect``.
        """
        self._advance(until_s)
        if self._origin_s is None:
            return b""
        out = bytearray([MULAW_SILENCE]) * max(
            0, round((until_s - self._origin_s) * BYTES_PER_SECOND)
        )
        for start_s, audio in self._segments:
            offset = round((start_s - self._origin_s) * BYTES_PER_SECOND)
            if offset >= len(out):
                break
            out[offset : offset + len(audio)] = audio[: len(out) - offset]
        return bytes(out)

    def marks_echoed(self) -> list[MarkEcho]:
        """Every mark echoed, in order."""
        return list(self._echoes)

    def playout_gaps(self) -> list[tuple[float, float]]:
        """(start, length) in seconds of each silence between two played stretches."""
        return list(self._gaps)

    def buffered_ms(self, now: float) -> float:
        """Audio queued and not yet played at ``now``."""
        self._advance(now)
        return self._buffered_bytes * 1000 / BYTES_PER_SECOND

    def errors(self) -> list[str]:
        """Protocol mistakes the server made (empty for a conforming server)."""
        return list(self._errors)

    # ----------------------------------------------------------------- private

    def _on_media(self, msg: dict[str, Any], now: float) -> None:
        media = msg.get("media")
        payload = media.get("payload") if isinstance(media, dict) else None
        if not isinstance(payload, str):
            self._errors.append("media without media.payload")
            return
        try:
            audio = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            self._errors.append("media payload is not base64")
            return
        self._arrivals.append(now)
        self._media_sizes.append(len(audio))
        self._media.append((now, audio))
        if (self._buffered_bytes + len(audio)) / BYTES_PER_SECOND > MAX_BUFFER_S:
            self._errors.append("31931 media discarded: more than 10 minutes buffered")
            return
        idle_since = self._idle_since_s
        if not self._buffer and idle_since is not None and now - idle_since > _GAP_TOLERANCE_S:
            self._gaps.append((idle_since, now - idle_since))
        if not self._buffer:
            self._clock_s = now
            self._idle_since_s = None
        self._buffer.append(audio)
        self._buffered_bytes += len(audio)

    def _on_mark(self, msg: dict[str, Any], now: float) -> None:
        mark = msg.get("mark")
        name = mark.get("name") if isinstance(mark, dict) else None
        if not isinstance(name, str):
            self._errors.append("mark without mark.name")
            return
        if not self._buffer:
            self._clock_s = now
        self._buffer.append(name)

    def _on_clear(self, msg: dict[str, Any], now: float) -> None:
        self._clears.append(now)
        pending = [item for item in self._buffer if isinstance(item, str)]
        self._buffer.clear()
        self._buffered_bytes = 0
        self._clock_s = now
        self._idle_since_s = None
        for name in pending:
            self._echo(name, now, cleared=True)

    def _advance(self, now: float) -> None:
        """Play the buffer out up to ``now``, echoing marks as they are reached."""
        while self._buffer:
            item = self._buffer[0]
            if isinstance(item, str):
                self._buffer.popleft()
                self._echo(item, self._clock_s, cleared=False)
                continue
            due_bytes = round((now - self._clock_s) * BYTES_PER_SECOND)
            if due_bytes <= 0:
                return
            played = item[:due_bytes]
            self._played += played
            self._segments.append((self._clock_s, played))
            self._buffered_bytes -= len(played)
            self._clock_s += len(played) / BYTES_PER_SECOND
            if len(played) < len(item):
                self._buffer[0] = item[len(played) :]
                return
            self._buffer.popleft()
            if not self._buffer:
                self._idle_since_s = self._clock_s

    def _echo(self, name: str, at_s: float, *, cleared: bool) -> None:
        self._echoes.append(MarkEcho(name, at_s, cleared))
        self._emit({"event": "mark", "mark": {"name": name}})

    def _emit(self, msg: dict[str, Any]) -> None:
        self._sequence += 1
        body = {
            "event": msg["event"],
            "sequenceNumber": str(self._sequence),
            **{k: v for k, v in msg.items() if k != "event"},
            "streamSid": self.stream_sid,
        }
        self._outbox.append(json.dumps(body))

    def _elapsed_ms(self, now: float) -> int:
        return 0 if self._origin_s is None else round((now - self._origin_s) * 1000)

"""``callbridge call TARGET``: place one test call, play and record audio, print a report.

Theory of operation
-------------------
Two kinds of target, one shape:

* ``sip:USER@HOST[:PORT]``: a SIP UAC over UDP. A ``SipUserAgent`` on one
  UDP socket and an ``RtpSession`` on another, both bound to the local address
  that routes to the target (127.0.0.1 for a loopback target; the target's
  address family). The offer is PCMU/PCMA + telephone-event 101, ptime 20
  (``--codecs``: another list, e.g. ``G722,PCMU`` to offer G.722 first; a
  G.722 call sends its 8 kHz clips interpolated to 16 kHz and decodes what it
  hears with its own G.722 codecs, the recording resampled to 8 kHz and also
  kept at 16 kHz in ``CallResult.heard_wideband_pcm_s16le``; ``OPUS`` offers
  Opus at payload type 111, ``opus/48000/2``, with telephone-event/48000 beside
  it, and an Opus call does the same with its own Opus codecs, its RTP clock
  and DTMF at 48 kHz).
* ``ws://HOST:PORT/twilio``: the carrier side of a Twilio media stream, the
  sans-I/O ``TwilioCarrier`` (``bridge.streams.carrier``) over a websockets
  client: ``connected`` + ``start`` (``customParameters.route`` from
  ``--route``), ``media`` every 20 ms, ``dtmf`` at its times, ``stop``.

Both shells only move bytes: each datagram or message goes into its engine
with ``loop.time()``, then the shell sends the engine's actions and handles
its events (``_pump``); the SIP engine's one timer is re-armed from
``next_deadline()``.

One media clock per call: frame ``n`` is due at ``answer + n * 20 ms`` on the
loop's monotonic clock (absolute deadlines, so no drift). A wake-up more than
``MAX_LATE_FRAMES`` late skips ahead (counted, never a burst). On each tick
the caller sends frame ``n`` of its ``Uplink`` (the ``--speak`` clips laid on
silence, mu-law or A-law as negotiated) or, on SIP, the RFC 4733 packet the
``DtmfSender`` has for this tick (in-band tones when telephone-event was not
negotiated); and it takes one inbound frame for the recording (the RTP jitter
buffer on SIP; on media streams the carrier plays its buffer against the same
clock, like Twilio, and ``heard_audio`` gives the result with silence where
nothing played).

What it records (arrival time and level of each received frame, sequence
numbers, speech onsets sent, ``clear`` times...) becomes a
``bridge.control.report.CallRecording``; the figures are computed there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import secrets
import socket
import sys
import wave
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from bridge.control.report import (
    CallRecording,
    ReceivedFrame,
    build_report,
    first_speech_frame,
    format_report,
    level_dbfs,
)
from bridge.engine import LocalProtocolError, SendDatagram
from bridge.logs import get_logger
from bridge.rtp.dtmf import DtmfReceived, DtmfSender
from bridge.rtp.packet import parse_rtp_header
from bridge.rtp.session import (
    RemoteLatched,
    RtpFrame,
    RtpSession,
    RtpSessionConfig,
    silence_frame,
)
from bridge.sip.errors import SipParseError
from bridge.sip.events import CallEnded, OutboundCallAnswered, OutboundCallFailed
from bridge.sip.message import SipResponse, parse_message
from bridge.sip.sdp import NegotiatedAudio, SdpError, build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent
from bridge.sip.uri import Uri, parse_uri
from bridge.streams.carrier import MULAW_SILENCE, TwilioCarrier
from telcodec import g711
from telcodec.dtmf import generate as dtmf_tones
from telcodec.g722 import G722Decoder, G722Encoder
from telcodec.opus import OpusDecoder, OpusEncoder
from telcodec.resample import StreamResampler

__all__ = ["CallerError", "CallerOptions", "SpeakClip", "Uplink", "place_call", "run_caller"]

log = get_logger("callbridge.caller")

FRAME_S = 0.020
SAMPLE_RATE_HZ = 8000
FRAME_PCM_BYTES = 320
SILENCE_PCM = bytes(FRAME_PCM_BYTES)
CODECS = ("PCMU", "PCMA")
KNOWN_CODECS = ("PCMU", "PCMA", "G722", "OPUS")
TELEPHONE_EVENT_PT = 101
DTMF_DIGITS = "0123456789*#ABCD"
DTMF_DEFAULT_AT_S = 1.0
SPEAK_DEFAULT_AT_S = 1.0
DTMF_SPACING_S = 0.300
DTMF_TONE_MS = 100
MAX_LATE_FRAMES = 5
RTP_BIND_ATTEMPTS = 64
HANGUP_GRACE_S = 1.0
WS_OPEN_TIMEOUT_S = 10.0
WS_MAX_MESSAGE_BYTES = 1 << 20
EXIT_OK, EXIT_NOT_ANSWERED, EXIT_USAGE = 0, 1, 2


class CallerError(Exception):
    """Unusable options (bad target, unreadable WAV): a message for the user."""


@dataclass(frozen=True, slots=True)
class SpeakClip:
    """One ``--speak`` WAV, converted to 8 kHz mono s16le, sent from ``at_s`` after the answer."""

    path: str
    at_s: float
    pcm_s16le: bytes


@dataclass(frozen=True, slots=True)
class CallerOptions:
    target: str
    dtmf: tuple[tuple[float, str], ...] = ()
    """(seconds after the answer, digit), one entry per key press."""
    speak: tuple[SpeakClip, ...] = ()
    record: str | None = None
    duration_s: float = 10.0
    route: str | None = None
    as_json: bool = False
    codecs: tuple[str, ...] = CODECS
    """SIP: the offer's codecs, in preference order (``G722``, ``OPUS`` too)."""


@dataclass(frozen=True, slots=True)
class CallResult:
    recording: CallRecording
    heard_pcm_s16le: bytes
    """What the caller heard, 8 kHz mono, from the answer on."""
    codec: str = ""
    """SIP: the codec of the answer (``PCMU``, ``PCMA``, ``G722``, ``OPUS``)."""
    heard_wideband_pcm_s16le: bytes = b""
    """A G.722 or Opus call: what the caller heard at 16 kHz, as decoded."""


# --- options --------------------------------------------------------------------------------


def _split_at(spec: str, default_s: float) -> tuple[str, float]:
    head, at, tail = spec.rpartition("@")
    if not at:
        return spec, default_s
    try:
        at_s = float(tail)
    except ValueError:
        raise CallerError(f"bad time in {spec!r}: expected VALUE@SECONDS") from None
    if not math.isfinite(at_s) or at_s < 0:
        raise CallerError(f"bad time in {spec!r}: must be >= 0")
    return head, at_s


def parse_dtmf(specs: Sequence[str]) -> tuple[tuple[float, str], ...]:
    """``DIGITS[@S]`` (S s after the answer, default 1) as one entry per digit, 300 ms apart."""
    presses: list[tuple[float, str]] = []
    for spec in specs:
        digits, at_s = _split_at(spec, DTMF_DEFAULT_AT_S)
        if not digits or any(d not in DTMF_DIGITS for d in digits.upper()):
            raise CallerError(f"bad DTMF digits {digits!r}: use 0-9 * # A-D")
        presses += [(at_s + i * DTMF_SPACING_S, d) for i, d in enumerate(digits.upper())]
    return tuple(sorted(presses))


def load_wav_8k_mono(path: str) -> bytes:
    """Read a PCM WAV of any rate, width and channel count as 8 kHz mono s16le."""
    try:
        with wave.open(path, "rb") as wav:
            channels, width, rate_hz = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise CallerError(f"cannot read {path}: {exc}") from None
    if width == 1:
        samples = (np.frombuffer(data, np.uint8).astype(np.int32) - 128) << 8
    elif width in (2, 3, 4):
        raw = np.frombuffer(data, np.uint8).reshape(-1, width)
        samples = raw[:, -2:].copy().view("<i2").reshape(-1).astype(np.int32)
    else:
        raise CallerError(f"{path}: unsupported sample width {width} bytes")
    mono = samples.reshape(-1, channels).mean(axis=1)
    pcm = np.clip(np.round(mono), -32768, 32767).astype("<i2").tobytes()
    resampler = StreamResampler(rate_hz, SAMPLE_RATE_HZ)
    return resampler.process(pcm) + resampler.flush()


def options_from_args(args: argparse.Namespace) -> CallerOptions:
    """The ``call`` subcommand's namespace (``bridge.cli``) as checked options."""
    target = str(args.target)
    if not target.startswith(("sip:", "ws://", "wss://")):
        raise CallerError(
            f"unsupported target {target!r}: sip:USER@HOST[:PORT] or ws://HOST/twilio"
        )
    if target.startswith("ws") and urlsplit(target).path.rstrip("/") != "/twilio":
        raise CallerError("media streams: only the /twilio dialect is implemented in the caller")
    if not args.duration > 0:
        raise CallerError("--duration must be > 0")
    codecs = tuple(c.strip().upper() for c in str(getattr(args, "codecs", "") or "").split(","))
    codecs = tuple(c for c in codecs if c) or CODECS
    unknown = [c for c in codecs if c not in KNOWN_CODECS]
    if unknown:
        raise CallerError(f"--codecs: unknown codec {unknown[0]!r} ({', '.join(KNOWN_CODECS)})")
    clips = []
    for spec in args.speak or ():
        path, at_s = _split_at(spec, SPEAK_DEFAULT_AT_S)
        clips.append(SpeakClip(path, at_s, load_wav_8k_mono(path)))
    return CallerOptions(
        target=target,
        dtmf=parse_dtmf(args.dtmf or ()),
        speak=tuple(clips),
        record=args.record,
        duration_s=float(args.duration),
        route=getattr(args, "route", None),
        as_json=bool(args.json),
        codecs=codecs,
    )


# --- the uplink -----------------------------------------------------------------------------


class Uplink:
    """The caller's audio by frame index since the answer: clips laid on silence.

    ``pcm(n)`` is frame ``n`` (320 bytes of s16le) or None for silence;
    ``onset_frames`` are the frames where each clip's speech starts (its first
    frame at or above the speech threshold).
    """

    def __init__(self, clips: Sequence[SpeakClip]) -> None:
        self._frames: dict[int, bytes] = {}
        onsets = set()
        for clip in clips:
            start = round(clip.at_s / FRAME_S)
            self._lay(start, clip.pcm_s16le)
            onset = first_speech_frame(clip.pcm_s16le)
            if onset is not None:
                onsets.add(start + onset)
        self.onset_frames = frozenset(onsets)

    def _lay(self, start: int, pcm: bytes) -> None:
        for k, offset in enumerate(range(0, len(pcm), FRAME_PCM_BYTES)):
            chunk = pcm[offset : offset + FRAME_PCM_BYTES]
            self._frames[start + k] = chunk + SILENCE_PCM[len(chunk) :]

    def add_inband_dtmf(self, presses: Sequence[tuple[float, str]]) -> None:
        """Lay DTMF tones into the audio (for a leg without telephone-event)."""
        for at_s, digit in presses:
            self._lay(round(at_s / FRAME_S), dtmf_tones(digit, tone_ms=DTMF_TONE_MS, gap_ms=0))

    def pcm(self, n: int) -> bytes | None:
        return self._frames.get(n)


def write_wav(path: str, pcm_s16le: bytes) -> None:
    with wave.open(path, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE_HZ)
        wav.writeframes(pcm_s16le)


async def run_media_clock(
    origin_s: float,
    on_frame: Callable[[int, float], Awaitable[bool]],
    extra_deadline: Callable[[], float | None] | None = None,
    on_wake: Callable[[float], Awaitable[None]] | None = None,
) -> int:
    """Call ``on_frame(n, now)`` at ``origin_s + n * 20 ms`` until it returns False.

    ``extra_deadline()`` may ask for wake-ups between frames (``on_wake(now)``).
    Returns how many frames were skipped because the loop woke too late.
    """
    loop = asyncio.get_running_loop()
    n = slipped = 0
    while True:
        due = origin_s + n * FRAME_S
        extra = extra_deadline() if extra_deadline is not None else None
        wake = due if extra is None or extra > due else extra
        delay = wake - loop.time()
        await asyncio.sleep(max(0.0, delay))
        now = max(wake, loop.time())
        if now < due:
            if on_wake is not None:
                await on_wake(now)
            continue
        late = int((now - due) / FRAME_S)
        if late > MAX_LATE_FRAMES:
            n, slipped = n + late, slipped + late
        if not await on_frame(n, now):
            return slipped
        n += 1


# --- SIP ------------------------------------------------------------------------------------


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self._on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self._on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP unreachable (a peer without an RTCP port, a gone peer): the engines time out.
        log.debug("caller.udp_error", error=str(exc))


def _local_address_for(family: int, addr: tuple[str, int]) -> str:
    """The local address the kernel routes to ``addr`` from (no packet is sent)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(addr)
        return str(probe.getsockname()[0])


def _is_bye_answer(data: bytes) -> bool:
    try:
        message = parse_message(data)
        return (
            isinstance(message, SipResponse)
            and message.status >= 200
            and message.cseq().method == "BYE"
        )
    except (SipParseError, ValueError):
        return False


class _SipCaller:
    """The SIP UAC shell of one call (module docstring)."""

    def __init__(self, opts: CallerOptions, uri: Uri) -> None:
        self.opts = opts
        self.uri = uri
        self.loop = asyncio.get_running_loop()
        self.uplink = Uplink(opts.speak)
        self.finished = asyncio.Event()
        self.settled = asyncio.Event()  # BYE answered, or the INVITE's final failure
        self.ua: SipUserAgent | None = None
        self.rtp: RtpSession | None = None
        self.audio: NegotiatedAudio | None = None
        self.sip_transport: asyncio.DatagramTransport | None = None
        self.rtp_transport: asyncio.DatagramTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.clock: asyncio.Task[int] | None = None
        self.call_id = ""
        self.hung_up = False
        self.dtmf_queue = list(opts.dtmf)
        self.dtmf_sender = DtmfSender()
        self.started_at = 0.0
        self.answered_at: float | None = None
        self.ended_at: float | None = None
        self.ended_by = ""
        self.failure: str | None = None
        self.frames: list[ReceivedFrame] = []
        self.event_seqs: list[int] = []
        self.onsets: list[float] = []
        self.dtmf_sent: list[tuple[float, str]] = []
        self.dtmf_received: list[tuple[float, str]] = []
        self.heard = bytearray()
        self.heard_wide = bytearray()
        self.errors: list[str] = []
        self.wide: _G722Caller | None = None

    async def run(self) -> CallResult:
        port = self.uri.port or 5060
        infos = await self.loop.getaddrinfo(self.uri.host, port, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        dest = (str(sockaddr[0]), int(sockaddr[1]))
        local_ip = _local_address_for(family, dest)
        sip_t, _ = await self.loop.create_datagram_endpoint(
            lambda: _Datagrams(self._on_sip), local_addr=(local_ip, 0)
        )
        rtp_t = await self._bind_even_rtp_port(local_ip)
        self.sip_transport, self.rtp_transport = sip_t, rtp_t
        try:
            await self._call(dest, local_ip, sip_t.get_extra_info("sockname")[1])
        finally:
            if self.timer is not None:
                self.timer.cancel()
            if self.clock is not None:
                self.clock.cancel()
                await asyncio.gather(self.clock, return_exceptions=True)
            sip_t.close()
            rtp_t.close()
        return self._result()

    async def _bind_even_rtp_port(self, local_ip: str) -> asyncio.DatagramTransport:
        """RTP on an even port (RFC 3550 §11): some peers pick RTP vs RTCP by port parity."""
        for _ in range(RTP_BIND_ATTEMPTS):
            transport, _ = await self.loop.create_datagram_endpoint(
                lambda: _Datagrams(self._on_rtp), local_addr=(local_ip, 0)
            )
            if transport.get_extra_info("sockname")[1] % 2 == 0:
                return transport
            transport.close()
        raise CallerError(f"no even UDP port for RTP on {local_ip}")

    async def _call(self, dest: tuple[str, int], local_ip: str, sip_port: int) -> None:
        assert self.rtp_transport is not None
        rtp_port = int(self.rtp_transport.get_extra_info("sockname")[1])
        settings = SipSettings(
            local_host=local_ip, local_port=sip_port, user_agent="callbridge-caller",
            session_expires_s=0,
        )  # fmt: skip
        self.ua = SipUserAgent(settings)
        offer = build_offer(
            local_ip, rtp_port, random.getrandbits(31), 1, self.opts.codecs, TELEPHONE_EVENT_PT
        )
        host = f"[{local_ip}]" if ":" in local_ip else local_ip
        self.started_at = now = self.loop.time()
        self.call_id = self.ua.invite(
            self.opts.target, f"sip:caller@{host}:{sip_port}", offer, dest, now
        )
        self._pump()
        give_up = self.loop.call_at(now + self.opts.duration_s, self._give_up)
        try:
            await self.finished.wait()
        finally:
            give_up.cancel()
        if self.hung_up:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), HANGUP_GRACE_S)

    def _result(self) -> CallResult:
        recording = CallRecording(
            transport="sip",
            started_at_s=self.started_at,
            answered_at_s=self.answered_at,
            ended_at_s=self.ended_at if self.ended_at is not None else self.loop.time(),
            frames=tuple(self.frames),
            event_seqs=tuple(self.event_seqs),
            speech_onsets_s=tuple(self.onsets),
            failure=self.failure,
            dtmf_sent=tuple(self.dtmf_sent),
            dtmf_received=tuple(self.dtmf_received),
            ended_by=self.ended_by,
            slipped_frames=self._slipped_frames(),
            protocol_errors=tuple(self.errors),
        )
        if self.wide is not None:
            self.heard += self.wide.to_8k.flush()
        codec = self.audio.codec if self.audio is not None else ""
        return CallResult(recording, bytes(self.heard), codec, bytes(self.heard_wide))

    def _slipped_frames(self) -> int:
        clock = self.clock
        if clock is None or not clock.done() or clock.cancelled() or clock.exception():
            return 0
        return clock.result()

    # --- SIP engine pump ----------------------------------------------------------
    def _pump(self) -> None:
        ua, transport = self.ua, self.sip_transport
        assert ua is not None and transport is not None
        while True:
            actions, events = ua.actions_to_send(), ua.events_received()
            if not actions and not events:
                break
            for action in actions:
                if isinstance(action, SendDatagram):
                    transport.sendto(action.data, action.addr)
            now = self.loop.time()
            for event in events:
                self._on_sip_event(event, now)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        deadline = ua.next_deadline()
        if deadline is not None:
            self.timer = self.loop.call_at(deadline, self._on_timer, deadline)

    def _on_timer(self, deadline: float) -> None:
        self.timer = None
        assert self.ua is not None
        self.ua.handle_timer(max(deadline, self.loop.time()))
        self._pump()

    def _on_sip(self, data: bytes, source: tuple[str, int]) -> None:
        if self.ua is None:
            return
        if self.hung_up and _is_bye_answer(data):
            self.settled.set()
        self.ua.receive_datagram(data, source, self.loop.time())
        self._pump()

    def _on_sip_event(self, event: object, now: float) -> None:
        match event:
            case OutboundCallAnswered(answer_sdp=sdp):
                self._answered(sdp, now)
            case OutboundCallFailed(status=status, reason=reason):
                self.failure = self.failure or f"{status} {reason}"
                self.settled.set()
                self._finish(now, "failed")
            case CallEnded(reason=reason):
                self._finish(now, reason)

    def _finish(self, now: float, reason: str) -> None:
        if self.ended_at is None:
            self.ended_at, self.ended_by = now, reason
        self.finished.set()

    def _give_up(self) -> None:
        if self.answered_at is None:
            self.failure = f"no answer within {self.opts.duration_s:g} s"
            self._hangup(self.loop.time())

    def _hangup(self, now: float) -> None:
        if self.hung_up or self.ua is None:
            return
        self.hung_up = True
        self._finish(now, "local-hangup")
        with contextlib.suppress(LocalProtocolError):  # the far side ended it first
            self.ua.hangup(self.call_id, now)
        if self.rtp is not None:
            self.rtp.close(now)
            self._drain_rtp(now)
        self._pump()

    # --- media ------------------------------------------------------------------------
    def _answered(self, sdp: str, now: float) -> None:
        self.answered_at = now
        try:
            audio = negotiate(parse_sdp(sdp), self.opts.codecs) if sdp else None
        except SdpError:
            audio = None
        if audio is None or audio.remote_addr is None:
            self.failure = "no usable audio stream in the SDP answer"
            self._hangup(now)
            return
        self.audio = audio
        if audio.codec == "G722":
            self.wide = _G722Caller()
        elif audio.codec == "OPUS":
            self.wide = _G722Caller(opus=True)
        self.dtmf_sender = DtmfSender(samples_per_frame=audio.samples_per_frame)
        config = RtpSessionConfig(
            payload_types=frozenset({audio.payload_type}),
            telephone_event_pt=audio.telephone_event_pt,
            clock_rate_hz=audio.clock_rate_hz,  # Opus: 48 kHz, 960 per frame
            samples_per_frame=audio.samples_per_frame,
            latch=True,
        )
        self.rtp = RtpSession(config, audio.remote_addr, now)
        if audio.telephone_event_pt is None:
            self.uplink.add_inband_dtmf(self.opts.dtmf)
        self.clock = self.loop.create_task(run_media_clock(now, self._tick))
        self.clock.add_done_callback(self._clock_ended)

    def _clock_ended(self, clock: asyncio.Task[int]) -> None:
        if clock.cancelled() or clock.exception() is None:
            return
        # A bug in the tick: end the call (with its report) instead of hanging until killed.
        log.error("caller.media_clock_failed", exc_info=clock.exception())
        self.failure = f"caller error: {clock.exception()!r}"
        self._hangup(self.loop.time())

    async def _tick(self, n: int, now: float) -> bool:
        rtp, audio = self.rtp, self.audio
        assert rtp is not None and audio is not None and self.answered_at is not None
        if self.hung_up or self.finished.is_set():
            return False
        if now - self.answered_at >= self.opts.duration_s:
            self._hangup(now)
            return False
        while self.dtmf_queue and self.dtmf_queue[0][0] <= n * FRAME_S + 1e-9:
            digit = self.dtmf_queue.pop(0)[1]
            if audio.telephone_event_pt is not None:
                self.dtmf_sender.send_digits(digit, tone_ms=DTMF_TONE_MS)
            self.dtmf_sent.append((now, digit))
        packet = self.dtmf_sender.next_packet()
        if packet is not None:
            rtp.send_telephone_event(packet, now, n)
        else:
            rtp.send_frame(self._encode(self.uplink.pcm(n)), audio.payload_type, now, n)
        if n in self.uplink.onset_frames:
            self.onsets.append(now)
        frame = rtp.pop_frame(now)
        wide = self.wide
        if wide is not None:
            pcm = wide.heard.decode(frame.payload) if isinstance(frame, RtpFrame) else b""
            pcm = pcm or bytes(2 * FRAME_PCM_BYTES)
            self.heard_wide += pcm
            self.heard += wide.to_8k.process(pcm)
        else:
            heard = self._decode(frame.payload) if isinstance(frame, RtpFrame) else SILENCE_PCM
            self.heard += heard
        deadline = rtp.next_deadline()
        if deadline is not None and deadline <= now:
            rtp.handle_timer(now)
        self._drain_rtp(now)
        return True

    def _encode(self, pcm: bytes | None) -> bytes:
        assert self.audio is not None
        if self.wide is not None:
            return self.wide.encode(pcm)
        if pcm is None:
            return silence_frame(self.audio.payload_type)
        return g711.ulaw_encode(pcm) if self.audio.codec == "PCMU" else g711.alaw_encode(pcm)

    def _decode(self, payload: bytes) -> bytes:
        """A payload as it arrives (its level); a G.722 one at 16 kHz."""
        assert self.audio is not None
        if self.wide is not None:
            return self.wide.arrived.decode(payload)
        if self.audio.codec == "PCMU":
            return g711.ulaw_decode(payload)
        return g711.alaw_decode(payload)

    def _on_rtp(self, data: bytes, source: tuple[str, int]) -> None:
        rtp, audio = self.rtp, self.audio
        if rtp is None or audio is None:
            return  # early media before the answer: nothing to measure against yet
        now = self.loop.time()
        try:
            second, seq, _ts, _ssrc, start, end = parse_rtp_header(data)
        except ValueError:
            pass  # the session counts it as malformed
        else:
            pt = second & 0x7F
            if pt == audio.payload_type:
                level = level_dbfs(self._decode(data[start:end]))
                self.frames.append(ReceivedFrame(now, level, seq))
            elif pt == audio.telephone_event_pt:
                self.event_seqs.append(seq)
        rtp.receive_datagram(data, source, now)
        self._drain_rtp(now)

    def _drain_rtp(self, now: float) -> None:
        assert self.rtp is not None and self.rtp_transport is not None
        for action in self.rtp.actions_to_send():
            if isinstance(action, SendDatagram):
                self.rtp_transport.sendto(action.data, action.addr)
        for event in self.rtp.events_received():
            if isinstance(event, DtmfReceived):
                self.dtmf_received.append((now, event.digit))
            elif isinstance(event, RemoteLatched) and self.audio is not None:
                sdp_addr = self.audio.remote_addr
                if sdp_addr is not None and event.addr != sdp_addr:
                    self.errors.append(
                        f"RTP comes from {event.addr[0]}:{event.addr[1]}, the SDP answer "
                        f"named {sdp_addr[0]}:{sdp_addr[1]} (we now send there)"
                    )


class _G722Caller:
    """A G.722 (or, ``opus``, an Opus) call's codecs: one encoder, one decoder per order
    of arrival (levels as packets arrive, the recording in the jitter buffer's order),
    16 kHz to 8 kHz."""

    def __init__(self, opus: bool = False) -> None:
        self.encoder: G722Encoder | OpusEncoder = OpusEncoder() if opus else G722Encoder()
        self.arrived: G722Decoder | OpusDecoder = OpusDecoder() if opus else G722Decoder()
        self.heard: G722Decoder | OpusDecoder = OpusDecoder() if opus else G722Decoder()
        self.to_8k = StreamResampler(16000, 8000)
        self._last = 0.0

    def encode(self, pcm: bytes | None) -> bytes:
        """An 8 kHz frame (None: silence) to 16 kHz by linear interpolation, encoded."""
        if pcm is None:
            self._last = 0.0
            return self.encoder.encode_silence()
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        wide = np.empty(2 * len(x))
        wide[1::2] = x
        wide[0::2] = (np.concatenate(([self._last], x[:-1])) + x) / 2
        self._last = float(x[-1])
        return self.encoder.encode(np.round(wide).astype("<i2").tobytes())


# --- media streams (Twilio) ---------------------------------------------------------------


class _TwilioCaller:
    """The carrier side of one Twilio media stream over a real WebSocket."""

    def __init__(self, opts: CallerOptions) -> None:
        self.opts = opts
        self.loop = asyncio.get_running_loop()
        params = {"route": opts.route} if opts.route else None
        suffix = secrets.token_hex(16)  # every call its own SIDs, as Twilio's are
        self.carrier = TwilioCarrier(
            stream_sid=f"MZ{suffix}",
            call_sid=f"CA{suffix}",
            custom_parameters=params,
        )
        self.uplink = Uplink(opts.speak)
        self.dtmf_queue = list(opts.dtmf)
        self.ws: ClientConnection | None = None
        self.opened_at = 0.0
        self.closed_by_peer = False
        self.ending = False
        self.stopped = False
        """``stop`` sent: as Twilio, the carrier now drops whatever the server still sends
        (frames in flight when it read ``stop`` are not the server's mistake)."""
        self.onsets: list[float] = []
        self.dtmf_sent: list[tuple[float, str]] = []
        self.errors: list[str] = []

    async def run(self) -> CallResult:
        started = self.loop.time()
        try:
            self.ws = await connect(
                self.opts.target,
                open_timeout=WS_OPEN_TIMEOUT_S,
                max_size=WS_MAX_MESSAGE_BYTES,
                compression=None,
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            failed = CallRecording("ws", started, None, self.loop.time(), failure=str(exc))
            return CallResult(failed, b"")
        self.opened_at = now = self.loop.time()
        self.carrier.connect(now)
        await self._flush(now)
        reader = self.loop.create_task(self._read())
        try:
            slipped = await run_media_clock(
                now, self._tick, self.carrier.next_deadline, self._flush
            )
        finally:
            ended_at = self.loop.time()
            self.ending = True
            await self.ws.close()
            await asyncio.gather(reader, return_exceptions=True)
        return self._result(ended_at, slipped)

    def _result(self, ended_at: float, slipped: int) -> CallResult:
        carrier = self.carrier
        frames = tuple(
            ReceivedFrame(at_s, level_dbfs(g711.ulaw_decode(audio)))
            for at_s, audio in carrier.received_media()
        )
        heard = g711.ulaw_decode(carrier.heard_audio(ended_at))
        heard_frames = tuple(
            ReceivedFrame(self.opened_at + i * FRAME_S, level_dbfs(heard[offset : offset + 320]))
            for i, offset in enumerate(range(0, len(heard), FRAME_PCM_BYTES))
        )
        recording = CallRecording(
            transport="ws",
            started_at_s=self.opened_at,
            answered_at_s=self.opened_at,
            ended_at_s=ended_at,
            frames=frames,
            heard_frames=heard_frames,
            speech_onsets_s=tuple(self.onsets),
            clears_at_s=tuple(carrier.clear_times()),
            dtmf_sent=tuple(self.dtmf_sent),
            ended_by="closed-by-server" if self.closed_by_peer else "stop",
            slipped_frames=slipped,
            protocol_errors=tuple(self.errors + carrier.errors()),
        )
        return CallResult(recording, heard)

    async def _tick(self, n: int, now: float) -> bool:
        if self.closed_by_peer:
            return False
        if now - self.opened_at >= self.opts.duration_s:
            self.carrier.send_stop(now)
            self.stopped = True
            await self._flush(now)
            return False
        while self.dtmf_queue and self.dtmf_queue[0][0] <= n * FRAME_S + 1e-9:
            digit = self.dtmf_queue.pop(0)[1]
            self.carrier.send_dtmf(digit, now)
            self.dtmf_sent.append((now, digit))
        pcm = self.uplink.pcm(n)
        frame = g711.ulaw_encode(pcm) if pcm is not None else bytes([MULAW_SILENCE]) * 160
        self.carrier.send_audio(frame, now)
        if n in self.uplink.onset_frames:
            self.onsets.append(now)
        await self._flush(now)
        return True

    async def _flush(self, now: float) -> None:
        assert self.ws is not None
        for text in self.carrier.frames_to_send(now):
            try:
                await self.ws.send(text)
            except ConnectionClosed:
                self.closed_by_peer = not self.ending
                return

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                now = self.loop.time()
                if self.stopped:
                    continue
                if isinstance(message, str):
                    self.carrier.receive(message, now)
                else:
                    self.errors.append("binary message on a Twilio stream")
                await self._flush(now)
        except ConnectionClosed:
            pass
        if not self.ending:
            self.closed_by_peer = True


# --- entry points ---------------------------------------------------------------------------


async def place_call(opts: CallerOptions) -> CallResult:
    """Place the call described by ``opts`` and return what it recorded."""
    if opts.target.startswith("sip:"):
        try:
            uri = parse_uri(opts.target)
        except SipParseError as exc:
            raise CallerError(f"bad SIP target {opts.target!r}: {exc}") from None
        return await _SipCaller(opts, uri).run()
    return await _TwilioCaller(opts).run()


def run_caller(args: argparse.Namespace) -> int:
    """``callbridge call``: 0 answered, 1 not answered, 2 unusable options."""
    try:
        opts = options_from_args(args)
        result = asyncio.run(place_call(opts))
    except CallerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = build_report(result.recording)
    if opts.record:
        write_wav(opts.record, result.heard_pcm_s16le)
    print(report.to_json() if opts.as_json else format_report(report))
    return EXIT_OK if report.answered else EXIT_NOT_ANSWERED

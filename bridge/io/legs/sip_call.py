"""One SIP call's media: its RTP session and sockets, driven by the media ticker.

The per-frame half of the SIP leg (``bridge.io.legs.sip`` has the rest: the
listeners, the user agents, routing and answering). Each 20 ms tick of the
call's media clock sends one RTP packet (the turn's frame, comfort silence
between turns, or an RFC 4733 event while DTMF is being sent), reads the
call's RTP socket, hands every audio frame that arrived to the VAD/barge-in
path at once (``caller_speech``: it does not wait out the jitter buffer's
playout delay, 40 ms on a steady stream) and takes one frame from the jitter
buffer for the in-order path (``caller_playout``: a voice agent, in-band DTMF;
once the caller's audio has started, a tick with nothing arrived and nothing
to play gives the detector silence).
A call with SRTP (SDES keys, ``bridge.rtp.srtp``) protects
every RTP and RTCP packet as it leaves and unprotects each as it arrives,
before the RTP engine sees it: a packet that fails authentication is dropped
(counted in ``srtp_dropped``) and can neither latch nor reach the jitter
buffer.
A G.722 call (``G722Media``) is a 16 kHz linear leg to the call engine: the
call's own encoder turns each 640-byte frame it sends (comfort silence too,
so the far decoder's ADPCM state follows ours) into a 160-byte payload, and
its own decoder turns each payload back into 16 kHz s16le once, as it
arrives (the barge-in path); the in-order playout path takes that decode by
sequence number (``bench/bench_g722.py``: a second decoder fed in the jitter
buffer's order cost 10 µs more per call per 20 ms, for a better decode of a
reordered packet only).
An Opus call (``OpusMedia``, RFC 7587) is the same kind of 16 kHz linear
leg: its encoder makes one variable-size packet per 20 ms frame, its decoder
turns each packet back into one 20 ms frame of 16 kHz s16le (libopus decodes
at 48 kHz and the decoder resamples), decoded once on arrival the same way.
Its RTP clock is 48 kHz: the session stamps 960 per frame, and
telephone-event runs on that clock too. A lost Opus packet is silence to the
engine (no PLC through PyAV); a packet that does not decode to one 20 ms
frame (a peer ignoring ``ptime:20``) is not played.
This module is compiled with mypyc (``bridge/native.py``): it runs 50 times
a second for every call, and the signalling half, which runs once per SIP
message, stays interpreted.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from bridge.engine import SendDatagram
from bridge.io.rtpsock import SCM_TIMESTAMPNS, recv_stamped
from bridge.io.services import Services
from bridge.io.ticker import InboundCallback, ProcessCallback
from bridge.logs import get_logger
from bridge.rtp.dtmf import DtmfReceived, DtmfSender, InbandDtmf
from bridge.rtp.jitter import FrameLost
from bridge.rtp.packet import is_rtcp
from bridge.rtp.session import (
    LatchingMode,
    RemoteLatched,
    RtpSession,
    RtpSessionConfig,
    RtpTimedOut,
    latch_policy,
    silence_frame,
)
from bridge.sip.sdp import NegotiatedAudio
from bridge.sip.ua import SipUserAgent
from telcodec import g711
from telcodec.dtmf import generate as dtmf_tones
from telcodec.g722 import FRAME_BYTES as G722_PCM_FRAME_BYTES
from telcodec.g722 import G722Decoder, G722Encoder
from telcodec.opus import OpusDecoder, OpusEncoder

if TYPE_CHECKING:
    from bridge.rtp.srtp import SrtpContext  # loaded only where SRTP is configured

__all__ = [
    "SO_TIMESTAMPNS",
    "CallerSide",
    "G722Media",
    "OpusMedia",
    "Signalling",
    "_DatagramProtocol",
    "_SipCall",
]

log = get_logger("callbridge.sip")

SO_TIMESTAMPNS = SCM_TIMESTAMPNS if sys.platform == "linux" else None
"""Linux: the kernel stamps each datagram's arrival (``SCM_TIMESTAMPNS``, CLOCK_REALTIME)."""
FRAME_S = 0.02
MAX_READS_PER_TICK = 32
"""A call's RTP socket is read at its tick; a backlog larger than this waits for the next one."""
INBAND_TONE_MS = 100
INBAND_GAP_MS = 60
"""DTMF played as tones: each key 100 ms, 60 ms apart (as the RFC 4733 sender's)."""


class CallerSide(Protocol):
    """What a SIP call hands the caller's audio, digits and hang-up to: its ``CallRunner``."""

    def caller_speech(self, frame: bytes) -> None: ...

    def caller_playout(self, frame: bytes) -> None: ...

    def caller_dtmf(self, digit: str) -> None: ...

    def hangup(self, reason: str) -> None: ...

    def leg_ended(self, reason: str) -> None: ...

    def early_media_expired(self) -> None: ...


class Signalling(Protocol):
    """The user agent a SIP call's dialog lives in (the leg's ``_UaRunner``): a hang-up or
    a transfer is a request on it, then a pump that sends it."""

    ua: SipUserAgent

    def pump(self) -> None: ...

    def refer_target(self, call_id: str, target: str, trunk: str = "") -> str:
        """A transfer's Refer-To (``tel:`` at the host of ``trunk`` or the call's trunk)."""
        ...


G722_HELD_DECODES = 64
"""Decoded caller frames kept for the playout path (a jitter buffer's worth and more)."""


class G722Media:
    """The wideband codecs of one call (G.722 here, Opus in ``OpusMedia``): each keeps
    one direction's state."""

    __slots__ = ("decoded", "decoder", "encoder")

    def __init__(self) -> None:
        self.encoder: G722Encoder | OpusEncoder = G722Encoder()
        """Our frames and comfort silence, in the order sent."""
        self.decoder: G722Decoder | OpusDecoder = G722Decoder()
        """The caller's payloads, in arrival order."""
        self.decoded: dict[int, bytes] = {}
        """Sequence number -> decoded frame, until the jitter buffer plays it."""

    def arrived(self, sequence_number: int, payload: bytes) -> bytes:
        """A payload as it arrives (``caller_speech``), kept for its playout."""
        pcm = self.decoder.decode(payload)
        decoded = self.decoded
        if len(decoded) >= G722_HELD_DECODES:  # frames the jitter buffer dropped
            del decoded[next(iter(decoded))]
        decoded[sequence_number] = pcm
        return pcm

    def played(self, sequence_number: int, payload: bytes) -> bytes:
        """A payload the jitter buffer plays (``caller_playout``): its decode on arrival,
        or decoded now if it was not seen arriving."""
        pcm = self.decoded.pop(sequence_number, None)
        return self.decoder.decode(payload) if pcm is None else pcm


class OpusMedia(G722Media):
    """An Opus call's codecs (``telcodec.opus``, 16 kHz): the encoder follows the peer's
    ``maxplaybackrate`` and ``useinbandfec`` (``bridge.sip.sdp.OpusParams``)."""

    __slots__ = ()

    def __init__(self, max_playback_rate_hz: int = 48000, fec: bool = False) -> None:
        self.encoder = OpusEncoder(max_playback_rate_hz=max_playback_rate_hz, fec=fec)
        self.decoder = OpusDecoder()
        self.decoded = {}


class _DatagramProtocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:  # ICMP unreachable and the like
        log.debug("udp.error", error=str(exc))


class _SipCall:
    """``LegAdapter`` of one SIP call: its RTP session and sockets."""

    kind = "sip"
    # Slots: the per-frame path (send_frame, _inbound, _process) reads a dozen of
    # these on every tick; slot reads are the cheapest attribute access in CPython.
    # They serve the pure-Python build: compiled, the class is a C struct and mypyc
    # ignores ``__slots__`` (``__weakref__`` included: no weak references then).
    __slots__ = (
        "__weakref__",
        "_inbound_cb",
        "_process_cb",
        "_rx",
        "_rx_addr",
        "_rx_at",
        "_rx_data",
        "_rx_key",
        "_rx_source",
        "audio",
        "call_id",
        "caller_silence",
        "created_at",
        "dtmf",
        "dtmf_active",
        "ended",
        "heard_audio",
        "inband",
        "inband_out",
        "loop",
        "outbound",
        "outbox",
        "payload_bytes",
        "port_key",
        "pt",
        "rtcp_transport",
        "rtp",
        "rtp_port",
        "rtp_sock",
        "runner",
        "sending_audio",
        "services",
        "silence",
        "srtp",
        "srtp_dropped",
        "ticker",
        "ua",
        "wide",
    )

    def __init__(self, services: Services, ua: Signalling, call_id: str, rtp_port: int) -> None:
        self.services = services
        self.ua = ua
        self.call_id = call_id
        self.port_key = call_id
        self.rtp_port = rtp_port
        self.loop = asyncio.get_running_loop()
        self.audio: NegotiatedAudio | None = None
        self.rtp = RtpSession(RtpSessionConfig(), None, self.loop.time())  # until negotiated
        self.pt = 0
        self.silence = silence_frame(0)
        """Comfort silence sent between turns (G.711; a G.722 call encodes it)."""
        self.caller_silence = self.silence
        """What the runner hears for a frame that did not arrive (the leg's format)."""
        self.wide: G722Media | None = None
        """A G.722 or Opus call's codecs (None: G.711, stateless)."""
        self.inband_out: deque[bytes] = deque()
        """DTMF played as tones in the audio (no telephone-event negotiated): the next
        frames to send, in the form ``send_frame`` takes (G.711, or PCM on a wide leg)."""
        self.payload_bytes = 160
        """The size of a caller's 20 ms payload (G.711, G.722); 0: any (Opus varies)."""
        self.dtmf = DtmfSender()
        self.dtmf_active = False
        """Digits queued on ``dtmf``: ticks ask it for a packet only then."""
        self.inband: InbandDtmf | None = None
        self.rtp_sock: socket.socket | None = None
        """The RTP socket: read at the call's tick (``_inbound``), not by the loop."""
        self.rtcp_transport: asyncio.DatagramTransport | None = None
        self.srtp: SrtpContext | None = None
        """The call's SRTP keys (None: plain RTP)."""
        self.srtp_dropped = 0
        """Inbound packets dropped by SRTP: authentication or replay check failed."""
        self.ticker = services.ticker
        self.outbox = self.ticker.outbox
        self._inbound_cb: InboundCallback = self._inbound
        self._process_cb: ProcessCallback = self._process
        self._rx_data: bytes | None = None
        """The first datagram this tick's ``_inbound`` read, for its ``_process`` (None: none)."""
        self._rx_addr: Any = None
        self._rx_at = 0.0
        """The first datagram's source and arrival time."""
        self._rx_key = -2
        self._rx_source: tuple[str, int] | None = None
        """The last datagram's source, and its key from ``rtpsock.recv_stamped`` (-2: none yet)."""
        self._rx: list[tuple[bytes, Any, float]] = []
        """(datagram, source, arrival) of any further datagrams read by this tick's ``_inbound``."""
        self.runner: CallerSide | None = None
        self.heard_audio = False
        """An audio frame has arrived: from then on a tick with none gives the detector
        silence (before, silence would only teach its noise floor a line it never heard)."""
        self.sending_audio = False
        self.ended = False
        self.outbound = False
        self.created_at = self.loop.time()

    def start_media(
        self,
        audio: NegotiatedAudio,
        signalling_host: str | None = None,
        latching: LatchingMode = "strict",
        srtp: SrtpContext | None = None,
    ) -> None:
        """Offer/answer is done: the RTP session for the negotiated stream.

        ``latching``: ``[sip] latching``; ``signalling_host``: where the call's SIP
        came from (or went to), which ``learn`` compares with the SDP address;
        ``srtp``: the keys of an SRTP call.
        """
        self.audio = audio
        self.srtp = srtp
        host = audio.remote_addr[0] if audio.remote_addr else None
        policy = latch_policy(latching, host, signalling_host)
        self.rtp = RtpSession(
            RtpSessionConfig(
                payload_types=frozenset({audio.payload_type}),
                telephone_event_pt=audio.telephone_event_pt,
                clock_rate_hz=audio.clock_rate_hz,  # Opus: 48 kHz, 960 per frame
                samples_per_frame=audio.samples_per_frame,
                latch=True,
                latch_host=policy.latch_host,
                learn_window_s=policy.learn_window_s,
                rebind_packets=policy.rebind_packets,
                timeout_s=self.services.config.sip.rtp_timeout_s,
                keep_arrivals=True,
            ),
            audio.remote_addr,
            self.loop.time(),
        )
        self.pt = audio.payload_type
        # by codec, not payload type: a dynamic PT may carry G.711 too
        self.silence = silence_frame(8 if audio.codec == "PCMA" else 0)
        self.caller_silence = self.silence
        encoding: Literal["ulaw", "alaw", "linear"] = "alaw" if audio.codec == "PCMA" else "ulaw"
        rate_hz = 8000
        if audio.codec == "G722":
            self.wide = G722Media()
            self.caller_silence = bytes(G722_PCM_FRAME_BYTES)
            encoding, rate_hz = "linear", 16000
        elif audio.codec == "OPUS":
            params = audio.opus
            self.wide = (
                OpusMedia(params.max_playback_rate_hz, params.use_inband_fec)
                if params is not None
                else OpusMedia()
            )
            self.caller_silence = bytes(G722_PCM_FRAME_BYTES)  # 20 ms at 16 kHz too
            self.payload_bytes = 0
            encoding, rate_hz = "linear", 16000
        # telephone-event on the codec's clock (Opus: 960 per 20 ms)
        self.dtmf = DtmfSender(samples_per_frame=audio.samples_per_frame)
        # no telephone-event negotiated: listen for in-band tones instead
        no_events = audio.telephone_event_pt is None
        self.inband = InbandDtmf(encoding, rate_hz) if no_events else None

    @property
    def codec(self) -> str:
        """The leg's codec to the call engine: G.722 and Opus calls are 16 kHz s16le to it."""
        audio = self.audio
        if audio is None or audio.codec == "PCMU":
            return "mulaw"
        return "alaw" if audio.codec == "PCMA" else "pcm_s16le"

    @property
    def sample_rate_hz(self) -> int:
        """The leg's rate to the call engine: 16 kHz for G.722 (whose RTP clock is 8 kHz)
        and Opus (whose RTP clock is 48 kHz)."""
        audio = self.audio
        return 16000 if audio is not None and audio.codec in ("G722", "OPUS") else 8000

    def bind_sockets(self, host: str) -> tuple[socket.socket, socket.socket]:
        """Bind the RTP/RTCP port pair now (raises OSError if either is taken)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        pair: list[socket.socket] = []
        try:
            for port in (self.rtp_port, self.rtp_port + 1):
                sock = socket.socket(family, socket.SOCK_DGRAM)
                pair.append(sock)
                sock.setblocking(False)
                sock.bind((host, port))
            if SO_TIMESTAMPNS is not None:
                with contextlib.suppress(OSError):
                    pair[0].setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            for sock in pair:
                sock.close()
            raise
        return pair[0], pair[1]

    async def attach(self, socks: tuple[socket.socket, socket.socket]) -> None:
        """Take the bound port pair: RTCP is read by the loop, RTP at each tick."""
        self.rtp_sock = socks[0]
        rtcp = _DatagramProtocol(self._on_rtcp)
        t2, _ = await self.loop.create_datagram_endpoint(lambda: rtcp, sock=socks[1])
        self.rtcp_transport = t2
        if self.ended:
            self.close()

    def _on_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.srtp is not None:
            opened = self._unprotect(data)
            if opened is None:
                return
            data = opened
        self.rtp.receive_rtcp(data, addr, self.loop.time())
        self._pump_rtp()

    def _unprotect(self, data: bytes) -> bytes | None:
        """An SRTP/SRTCP packet verified and decrypted; None (counted) if it fails."""
        srtp = self.srtp
        assert srtp is not None
        try:
            return srtp.unprotect_rtcp(data) if is_rtcp(data) else srtp.unprotect(data)
        except ValueError:
            self.srtp_dropped += 1
            return None

    def _pump_rtp(self) -> None:
        srtp = self.srtp
        for action in self.rtp.actions_to_send():
            if isinstance(action, SendDatagram) and self.rtp_sock is not None:
                data = action.data
                rtcp = is_rtcp(data)
                if srtp is not None:
                    try:
                        data = srtp.protect_rtcp(data) if rtcp else srtp.protect(data)
                    except ValueError:
                        self.ticker.send_errors += 1
                        continue
                # by content, not by the destination's parity: RTP must leave from the RTP
                # port (symmetric RTP, RFC 4961) even when the peer's port is odd (NAT)
                if rtcp and self.rtcp_transport is not None:
                    self.rtcp_transport.sendto(data, action.addr)
                else:
                    try:
                        self.rtp_sock.sendto(data, action.addr)
                    except OSError:  # full buffer or closed: RTP does not queue
                        self.ticker.send_errors += 1
        for event in self.rtp.events_received():
            if isinstance(event, DtmfReceived) and self.runner is not None:
                self.runner.caller_dtmf(event.digit)
            elif isinstance(event, RemoteLatched):
                log.info("sip.rtp_latched", call_id=self.call_id, addr=list(event.addr))
            elif isinstance(event, RtpTimedOut):
                log.info("sip.rtp_timeout", call_id=self.call_id)
                if self.runner is not None:
                    self.runner.hangup("rtp_timeout")

    # --- LegAdapter ---------------------------------------------------------

    def send_frame(self, frame: bytes | None, n: int, now: float) -> InboundCallback:
        """This tick's RTP packet out (the per-call hot path); returns the tick's inbound work.

        The common tick builds one datagram (``RtpSession.frame_packet``) and
        queues it on the ticker's outbox, which sends every due call's packet
        back to back (``bridge.io.ticker``): no action object, no outbox
        lists of the engine. ``_inbound`` runs after that send.
        """
        rtp = self.rtp
        if self.dtmf_active:
            packet = self.dtmf.next_packet()
            if packet is None and self.dtmf.idle:
                self.dtmf_active = False
            if packet is not None:
                rtp.send_telephone_event(packet, now, n)
                self._pump_rtp()
                return self._inbound_cb
        wide = self.wide
        if self.inband_out:  # a key press played as tones takes the frame's place
            frame = self.inband_out.popleft()
        if frame is None:
            frame = self.silence if wide is None else wide.encoder.encode_silence()
            self.sending_audio = False
        else:
            if not self.sending_audio:
                rtp.start_talkspurt()
                self.sending_audio = True
            if wide is not None:
                frame = wide.encoder.encode(frame)
        data = rtp.frame_packet(frame, self.pt, now, n)
        if data is not None:
            srtp = self.srtp
            if srtp is not None:
                try:
                    data = srtp.protect(data)
                except ValueError:  # libsrtp refused (a sequence number protected twice)
                    self.ticker.send_errors += 1
                    return self._inbound_cb
            sock = self.rtp_sock
            if sock is not None:
                self.outbox.append((sock, data, rtp.remote_addr))
        return self._inbound_cb

    def _inbound(self, now: float) -> ProcessCallback:
        """The tick's read of the RTP socket; returns the work on what was read (``_process``).

        The socket is read here rather than by the loop: one ``recvmsg`` per
        call per tick instead of a loop wake-up and a callback per datagram,
        and the ticker runs every due call's read back to back (the kernel's
        receive path stays warm). Each datagram keeps its kernel arrival time
        (``SO_TIMESTAMPNS``) for the jitter buffer and the RFC 3550 jitter.
        Reading stops at the first datagram that arrived within the last
        frame period (anything queued behind it is younger still and is read
        at the next tick), so a backlog drains and the common tick costs a
        single ``recvmsg`` (through ``bridge.io.rtpsock``).
        """
        sock = self.rtp_sock
        if sock is None or self._rx_data is not None:
            # (not yet processed: a talkspurt start moved this tick ahead of the last
            # one's third phase, which the ticker had put off; the socket keeps the rest)
            return self._process_cb
        # the common tick: one datagram, kept in three slots (no tuple, no list)
        try:
            got = recv_stamped(sock, self._rx_key)
        except OSError:  # the socket was closed
            return self._process_cb
        if got is None:  # nothing queued
            return self._process_cb
        data, stamp, key, addr = got
        if addr is not None:  # a source other than the last one (or not IPv4)
            self._rx_key = key
            self._rx_source = addr
        self._rx_data = data
        self._rx_addr = self._rx_source
        if stamp >= 0.0:
            arrival = stamp + self.ticker.real_to_mono
            if arrival > now:
                arrival = now
            self._rx_at = arrival
            if arrival > now - FRAME_S:
                return self._process_cb
        else:
            self._rx_at = now  # no kernel stamp: read until the queue is empty
        # a backlog: the rest, in order, behind the first
        rx = self._rx
        mono = self.ticker.real_to_mono
        for _ in range(MAX_READS_PER_TICK - 1):
            try:
                got = recv_stamped(sock, self._rx_key)
            except OSError:
                break
            if got is None:
                break
            data, stamp, key, addr = got
            if addr is not None:
                self._rx_key = key
                self._rx_source = addr
            if stamp < 0.0:
                rx.append((data, self._rx_source, now))
                continue
            arrival = stamp + mono
            if arrival > now:
                arrival = now
            rx.append((data, self._rx_source, arrival))
            if arrival > now - FRAME_S:
                break
        return self._process_cb

    def _process(self, now: float) -> None:
        """The caller's side of the tick: what was read into the RTP engine, one frame on."""
        rtp = self.rtp
        pump = False
        data = self._rx_data
        if data is not None:
            self._rx_data = None
            srtp = self.srtp
            if srtp is not None:
                data = self._unprotect(data)
            # (host, port): rtpsock gives IPv6 sources without flow info and scope
            if data is not None and rtp.receive_datagram(data, self._rx_addr, self._rx_at):
                pump = True  # the engine queued something (latch, DTMF, SSRC, ...)
            rx = self._rx
            if rx:
                for packet, addr, arrival in rx:
                    opened = packet if srtp is None else self._unprotect(packet)
                    if opened is not None and rtp.receive_datagram(opened, addr, arrival):
                        pump = True
                rx.clear()
        # RTCP report, RTP timeout, DTMF end: every few seconds (poll_timer's own first test)
        if now >= rtp.timer_floor and rtp.poll_timer(now):
            pump = True
        arrived = rtp.take_arrived()
        inbound = rtp.pop_frame(now)
        if pump:
            self._pump_rtp()
        runner = self.runner
        if runner is None:
            return
        # barge-in hears each frame as it arrives; the jitter buffer's order is for playout
        wide = self.wide
        fixed = self.payload_bytes
        if arrived:
            self.heard_audio = True
            for frame in arrived:
                size = len(frame.payload)
                if size == fixed:  # 20 ms of G.711 or of G.722
                    if wide is None:
                        runner.caller_speech(frame.payload)
                    else:
                        runner.caller_speech(wide.arrived(frame.sequence_number, frame.payload))
                elif not fixed and size and wide is not None:  # Opus: any size
                    pcm = wide.arrived(frame.sequence_number, frame.payload)
                    if len(pcm) == G722_PCM_FRAME_BYTES:
                        runner.caller_speech(pcm)
        if inbound is None or isinstance(inbound, FrameLost):
            if not arrived and self.heard_audio:  # the caller stopped: the detector hears silence
                runner.caller_speech(self.caller_silence)
            runner.caller_playout(self.caller_silence)
        elif (size := len(payload := inbound.payload)) == fixed or (not fixed and size):
            if wide is not None:
                payload = wide.played(inbound.sequence_number, payload)
                if len(payload) != G722_PCM_FRAME_BYTES:  # Opus: not one 20 ms frame
                    runner.caller_playout(self.caller_silence)
                    return
            runner.caller_playout(payload)
            if self.inband is not None:
                for digit in self.inband.process(payload):
                    runner.caller_dtmf(digit)

    def send_mark(self, name: str) -> None:
        """RTP has no marks: a frame sent is a frame heard."""

    def clear(self) -> None:
        """RTP has no far-end buffer to clear: not sending is enough."""

    def hangup(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            with contextlib.suppress(Exception):  # the dialog may already be gone
                self.ua.ua.hangup(self.call_id, self.loop.time())
            self.ua.pump()

    def transfer(self, target: str, trunk: str = "") -> None:
        target = self.ua.refer_target(self.call_id, target, trunk)  # a trunk's tel: rewritten
        self.ua.ua.refer(self.call_id, target, self.loop.time())
        self.ua.pump()

    def send_dtmf(self, digits: str) -> None:
        """RFC 4733 events where telephone-event was negotiated; otherwise the digits are
        played as tones in the audio (as the in-band fallback hears them), in place of
        the bot's frames while they last."""
        audio = self.audio
        if audio is None:
            return
        if audio.telephone_event_pt is not None:
            self.dtmf.send_digits(digits)
            self.dtmf_active = True
            return
        rate_hz = 8000 if self.wide is None else 16000
        pcm = dtmf_tones(
            digits, rate_hz, tone_ms=INBAND_TONE_MS, gap_ms=INBAND_GAP_MS, level_dbfs=-10.0
        )
        step = rate_hz // 50 * 2  # 20 ms of s16le
        frames = [pcm[at : at + step] for at in range(0, len(pcm) - step + 1, step)]
        if self.wide is None:  # G.711 here; the wide encoder takes PCM in send_frame
            encode = g711.alaw_encode if audio.codec == "PCMA" else g711.ulaw_encode
            frames = [encode(f) for f in frames]
        self.inband_out.extend(frames)

    def close(self) -> None:
        self.rtp.close(self.loop.time())
        self._pump_rtp()
        if self.rtcp_transport is not None:
            self.rtcp_transport.close()
        if self.rtp_sock is not None:
            self.rtp_sock.close()

    def drop_cycles(self) -> None:
        """The call is over: break the reference cycles through it.

        Its runner holds it as its leg, and the bound methods cached for the
        ticker hold it too; left alone the ended call (tens of KB with its
        bridge) waits for a full GC pass, or with the GC policy for the next
        thaw (``tests/e2e/test_call_release.py``). A tick already under way
        reads nothing more.
        """
        self.runner = None
        self._inbound_cb = self._process_cb = _read_nothing


def _read_nothing(now: float) -> None:
    """A closed call's tick work: nothing to read or process."""

"""An Opus SIP call's media (issue 34): the RTP clock at 48 kHz (960 per frame, for audio
and telephone-event alike), variable-size payloads decoded once on arrival into 20 ms of
16 kHz PCM, a lost packet heard as silence, and ``OpusMedia`` itself.

Real UDP sockets on loopback, as in ``test_sip_rtp_read``; the tick's ``now`` is a number
the test passes.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from bridge.io.legs.sip_call import G722_HELD_DECODES, OpusMedia, _SipCall
from bridge.io.ticker import MediaTicker
from bridge.sip.sdp import NegotiatedAudio, OpusParams
from telcodec import opus

from .test_sip_rtp_read import _free_port, _Runner, _services, _tick

_HDR = struct.Struct("!BBHII")
OPUS_PT, EVENT_PT = 107, 105


def _tone_frames(count: int, hz: float = 1000.0) -> list[bytes]:
    t = np.arange(count * opus.FRAME_SAMPLES) / opus.SAMPLE_RATE_HZ
    pcm = (8000 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()
    return [pcm[i : i + opus.FRAME_BYTES] for i in range(0, len(pcm), opus.FRAME_BYTES)]


def _rms(frame: bytes) -> float:
    return float(np.sqrt(np.mean(np.frombuffer(frame, dtype="<i2").astype(np.float64) ** 2)))


async def _opus_call(peer: socket.socket, events: bool = True) -> _SipCall:
    services = _services(MediaTicker(asyncio.get_running_loop()))
    for _ in range(50):
        call = _SipCall(services, None, "opus-1", _free_port() & ~1)  # type: ignore[arg-type]
        try:
            socks = call.bind_sockets("127.0.0.1")
            break
        except OSError:
            continue
    await call.attach(socks)
    audio = NegotiatedAudio(
        0, "OPUS", OPUS_PT, EVENT_PT if events else None, peer.getsockname(), "sendrecv", 20,
        clock_rate_hz=48000, opus=OpusParams(),
    )  # fmt: skip
    call.start_media(audio)
    call.runner = _Runner()  # type: ignore[assignment]
    return call


@asynccontextmanager
async def _opus_leg(events: bool = True) -> AsyncIterator[tuple[socket.socket, _SipCall]]:
    """A peer's UDP socket on loopback and an Opus call sending to it, closed after."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        call = await _opus_call(peer, events)
        yield peer, call
        call.close()


def test_the_leg_is_16khz_linear_to_the_engine() -> None:
    async def main() -> None:
        async with _opus_leg() as (_, call):
            assert (call.codec, call.sample_rate_hz) == ("pcm_s16le", 16000)
            assert isinstance(call.wide, OpusMedia) and call.payload_bytes == 0
            assert call.inband is None  # telephone-event/48000 negotiated
        async with _opus_leg(events=False) as (_, no_events):
            assert no_events.inband is not None  # listens in-band on the decoded 16 kHz

    asyncio.run(main())


def test_frames_out_are_opus_packets_stamped_960_apart() -> None:
    async def main() -> None:
        async with _opus_leg() as (_, call):
            frames = _tone_frames(6)
            now = time.monotonic()
            for n, frame in enumerate(frames):
                call.send_frame(frame, n, now + 0.02 * n)
            call.send_frame(None, 6, now + 0.12)  # comfort silence, through the encoder too
            packets = [data for _, data, _ in call.outbox]
            assert len(packets) == 7
            headers = [_HDR.unpack_from(p) for p in packets]
            assert {h[1] & 0x7F for h in headers} == {OPUS_PT}
            stamps = [h[3] for h in headers]
            assert [b - a for a, b in itertools.pairwise(stamps)] == [960] * 6
            decoder = opus.OpusDecoder()
            pcm = [decoder.decode(p[12:]) for p in packets]
            assert all(len(f) == opus.FRAME_BYTES for f in pcm)
            assert _rms(pcm[4]) > 2000
            assert len({len(p) for p in packets}) > 1  # variable sizes

    asyncio.run(main())


def test_caller_packets_of_any_size_are_decoded_once_and_a_lost_one_is_silence() -> None:
    async def main() -> None:
        async with _opus_leg() as (peer, call):
            runner: Any = call.runner
            encoder = opus.OpusEncoder()
            payloads = [encoder.encode(f) for f in _tone_frames(12)]
            base = time.monotonic()
            for k, payload in enumerate(payloads):
                if k == 6:
                    _tick(call, base + 0.001 + 0.02 * k)  # lost on the way
                    continue
                header = _HDR.pack(0x80, OPUS_PT, k + 1, 5000 + k * 960, 0x1234)
                peer.sendto(header + payload, ("127.0.0.1", call.rtp_port))
                _tick(call, base + 0.001 + 0.02 * k)
            assert len(runner.heard) == 11  # as they arrived (playout had a frame at the loss)
            assert all(len(f) == opus.FRAME_BYTES for f in runner.heard + runner.frames)
            assert _rms(runner.heard[-1]) > 2000  # decoding went on after the loss
            assert any(f == bytes(opus.FRAME_BYTES) for f in runner.frames)  # FrameLost
            assert _rms(runner.frames[-1]) > 2000

    asyncio.run(main())


def test_dtmf_both_ways_on_the_48khz_clock() -> None:
    async def main() -> None:
        async with _opus_leg() as (peer, call):
            peer.settimeout(1.0)
            runner: Any = call.runner
            base = time.monotonic()
            # the caller presses 7 for 100 ms: durations in 48 kHz units (RFC 4733)
            for k, (duration, end) in enumerate(
                [(960, 0), (2880, 0), (4800, 0x80)] + [(4800, 0x80)] * 2
            ):
                payload = struct.pack("!BBH", 7, end | 10, duration)
                header = _HDR.pack(0x80, EVENT_PT | (0x80 if k == 0 else 0), k + 1, 9000, 0x1234)
                peer.sendto(header + payload, ("127.0.0.1", call.rtp_port))
                _tick(call, base + 0.001 + 0.02 * k)
            assert runner.digits == ["7"]
            # the bot sends 1: each packet's duration grows by 960 per tick
            call.send_dtmf("1")
            durations = []
            for n in range(40):
                call.send_frame(None, n, base + 0.02 * n)
                if not call.dtmf_active:
                    break
            peer.settimeout(0.2)
            while True:
                try:
                    data = peer.recv(2048)
                except TimeoutError:
                    break
                if data[1] & 0x7F == EVENT_PT:
                    durations.append(struct.unpack_from("!H", data, 14)[0])
            assert durations and durations[0] == 960
            assert all(d % 960 == 0 for d in durations)

    asyncio.run(main())


def test_opus_media_keeps_each_decode_until_played_and_bounds_them() -> None:
    encoder = opus.OpusEncoder()
    payloads = [encoder.encode(f) for f in _tone_frames(3)]
    media = OpusMedia()
    heard = media.arrived(0, payloads[0])
    assert media.played(0, payloads[0]) is heard
    assert len(media.played(1, payloads[1])) == opus.FRAME_BYTES  # not seen arriving
    for seq in range(G722_HELD_DECODES + 5):
        media.arrived(seq, payloads[2])
    assert len(media.decoded) == G722_HELD_DECODES

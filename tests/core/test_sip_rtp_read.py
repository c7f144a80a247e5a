"""A SIP call's RTP socket is read at the call's tick, with the kernel's arrival times;
what it sends for DTMF (events, or tones without telephone-event).

Real UDP sockets on loopback; the tick's ``now`` is a number the test passes.
Datagrams sent on loopback are queued before ``sendto`` returns, so nothing
here waits.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.config import parse_config
from bridge.io.legs.sip_call import _SipCall
from bridge.io.services import Services
from bridge.io.ticker import MediaTicker
from bridge.sip.sdp import NegotiatedAudio
from telcodec import g711
from telcodec.dtmf import DtmfDetector

_HDR = struct.Struct("!BBHII")
CONFIG = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""


def _services(ticker: MediaTicker) -> Services:
    return Services.standalone(parse_config(CONFIG, "test.toml"), ticker)


class _Runner:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        """What ``caller_playout`` got: one frame per tick, out of the jitter buffer."""
        self.heard: list[bytes] = []
        """What ``caller_speech`` got: the frames as they arrived (silence if none)."""
        self.digits: list[str] = []

    def caller_speech(self, frame: bytes) -> None:
        self.heard.append(frame)

    def caller_playout(self, frame: bytes) -> None:
        self.frames.append(frame)

    def caller_dtmf(self, digit: str) -> None:
        self.digits.append(digit)


async def _call(peer: socket.socket) -> _SipCall:
    ticker = MediaTicker(asyncio.get_running_loop())
    services = _services(ticker)
    for _ in range(50):  # a free port pair, bound the way the leg binds it
        call = _SipCall(services, None, "call-1", _free_port() & ~1)  # type: ignore[arg-type]
        try:
            sock, rtcp = call.bind_sockets("127.0.0.1")
            break
        except OSError:
            continue
    await call.attach((sock, rtcp))
    call.start_media(NegotiatedAudio(0, "PCMU", 0, 101, peer.getsockname(), "sendrecv", 20))
    call.runner = _Runner()  # type: ignore[assignment]
    return call


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(peer: socket.socket, call: _SipCall, seq: int) -> None:
    peer.sendto(
        _HDR.pack(0x80, 0, seq, 1000 + seq * 160, 0x1234) + bytes(160), ("127.0.0.1", call.rtp_port)
    )


def _send_payload(peer: socket.socket, call: _SipCall, seq: int, payload: bytes) -> None:
    peer.sendto(
        _HDR.pack(0x80, 0, seq, 1000 + seq * 160, 0x1234) + payload, ("127.0.0.1", call.rtp_port)
    )


def _tick(call: _SipCall, now: float) -> None:
    """The tick's second phase (the read) and third (the work on it)."""
    call._inbound(now)(now)


def _received(call: _SipCall) -> int:
    return call.rtp.reception_stats().received


def test_a_backlog_is_read_in_one_tick_and_a_fresh_datagram_ends_the_read() -> None:
    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            for seq in range(1, 7):
                _send(peer, call, seq)
            _tick(call, time.monotonic() + 0.1)  # all six queued 100 ms before this tick
            assert _received(call) == 6
            _send(peer, call, 7)
            _send(peer, call, 8)
            now = time.monotonic()
            _tick(call, now)  # seq 7 arrived in this frame period: 8 waits for the next tick
            assert _received(call) == 7
            _tick(call, now + 0.03)
            assert _received(call) == 8
            _tick(call, now + 0.05)  # nothing queued
            assert _received(call) == 8
            assert len(call.runner.frames) == 4  # type: ignore[union-attr]  # one per tick
            call.close()

    asyncio.run(main())


def test_barge_in_hears_a_frame_on_the_tick_it_arrives_and_playout_two_ticks_later() -> None:
    """The detector's input does not wait out the jitter buffer (depth 3): each
    frame goes to ``caller_speech`` on the tick that reads it, and the in-order
    ``caller_playout`` gets it two ticks later (silence until the buffer starts)."""

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            runner: Any = call.runner
            payloads = [bytes([0x10 + seq]) * 160 for seq in range(1, 6)]
            base = time.monotonic()
            for k, payload in enumerate(payloads):
                _send_payload(peer, call, k + 1, payload)
                _tick(call, base + 0.001 + 0.02 * k)
                assert runner.heard == payloads[: k + 1]  # heard on its own tick
            silence = call.silence
            assert runner.frames == [silence, silence, *payloads[:3]]
            _tick(call, base + 0.001 + 0.02 * 5)  # nothing arrived: playout goes on
            assert runner.heard == payloads
            assert runner.frames[-1] == payloads[3]
            call.close()

    asyncio.run(main())


def test_the_detector_hears_silence_when_the_caller_stops_not_before_it_starts() -> None:
    """Before the caller's first packet the detector hears nothing (silence would
    start its noise floor on a line it never heard); once the caller has sent, a
    tick with nothing arrived and nothing to play is silence to it, as a gap is."""

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            runner: Any = call.runner
            now = time.monotonic()
            _tick(call, now)
            _tick(call, now + 0.02)
            assert runner.heard == []
            assert runner.frames == [call.silence, call.silence]  # playout goes on
            payload = b"\x42" * 160
            _send_payload(peer, call, 1, payload)
            _tick(call, time.monotonic() + 0.001)
            assert runner.heard == [payload]
            _tick(call, time.monotonic() + 0.1)  # the buffer plays seq 1 (waited 60 ms)
            assert runner.heard == [payload]
            assert runner.frames[-1] == payload
            _tick(call, time.monotonic() + 0.12)  # nothing arrived, nothing to play
            assert runner.heard == [payload, call.silence]
            call.close()

    asyncio.run(main())


def test_the_rfc3550_jitter_is_taken_from_the_kernel_arrival_time_not_the_tick() -> None:
    async def main() -> None:
        # A host that deschedules us between the two sends makes them arrive apart (and
        # the jitter smaller): measure again until they left within 5 ms of each other.
        for _attempt in range(20):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
                peer.bind(("127.0.0.1", 0))
                call = await _call(peer)
                now = time.monotonic()
                _send(peer, call, 1)
                _tick(call, now + 0.005)
                _send(peer, call, 2)  # 20 ms of media later, but it arrives at once
                sent_apart_s = time.monotonic() - now
                _tick(call, now + 0.025)  # on the tick grid: by tick times, no jitter at all
                jitter_ms = call.rtp.reception_stats().jitter_ms
                call.close()
            if sent_apart_s < 0.005:
                break
        assert sent_apart_s < 0.005, "never two sends within 5 ms in 20 tries"
        # by arrival times the second packet came over 15 ms early: |D| >= 120 units, J = D/16
        assert jitter_ms > 0.8

    asyncio.run(main())


def test_a_closed_call_reads_nothing_and_its_queued_frame_is_dropped_and_counted() -> None:
    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            second = call.send_frame(b"\xff" * 160, 0, time.monotonic())
            assert len(call.ticker.outbox) == 1
            call.close()
            second(time.monotonic())(time.monotonic())
            call.ticker.flush()
            assert call.ticker.send_errors == 1 and call.ticker.outbox == []
            assert call.runner.frames == [call.silence]  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_sip_message_is_followed_by_a_preemption_point_for_the_ticker() -> None:
    """The loop hands a socket's queued SIP datagrams over in one pass; after each
    one is handled (its answer sent) the ticker may run the frames due meanwhile."""
    from bridge.io.legs.sip import _UaRunner
    from bridge.sip.settings import SipSettings

    async def main() -> None:
        order: list[str] = []
        ticker = SimpleNamespace(run_if_due=lambda: order.append("ticker"))
        leg: Any = SimpleNamespace(
            services=SimpleNamespace(ticker=ticker),
            count_response=lambda data: order.append(data.split(b" ", 2)[1].decode()),
        )
        runner = _UaRunner(leg, SipSettings())
        options = (
            b"OPTIONS sip:x@127.0.0.1 SIP/2.0\r\n"
            b"Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK1\r\n"
            b"From: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:x@127.0.0.1>\r\n"
            b"Call-ID: c1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
        runner._on_datagram(options, ("127.0.0.1", 5070))
        runner._on_datagram(b"garbage", ("127.0.0.1", 5070))  # dropped: still a point
        assert order == ["200", "ticker", "ticker"]

    asyncio.run(main())


def test_without_kernel_stamps_every_queued_datagram_is_read_in_order_in_one_tick() -> None:
    from bridge.io.legs.sip_call import SO_TIMESTAMPNS

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            assert call.rtp_sock is not None
            if SO_TIMESTAMPNS is not None:
                call.rtp_sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 0)
            for seq in range(1, 5):
                _send(peer, call, seq)
            _tick(call, time.monotonic())  # no arrival times: the queue is read to its end
            assert _received(call) == 4
            assert call.rtp.counters().dropped_late == 0  # in sequence order
            _tick(call, time.monotonic() + 0.02)  # nothing queued: nothing read, nothing kept
            assert _received(call) == 4
            call.close()

    asyncio.run(main())


@pytest.mark.needs("ipv6")
def test_ipv6_sources_are_latched_and_read_as_host_and_port() -> None:
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    peer.bind(("::1", 0))

    async def main() -> None:
        with peer:
            ticker = MediaTicker(asyncio.get_running_loop())
            services = _services(ticker)
            call = _SipCall(services, None, "call-6", _free_port() & ~1)  # type: ignore[arg-type]
            await call.attach(call.bind_sockets("::1"))
            call.start_media(
                NegotiatedAudio(0, "PCMU", 0, 101, ("::1", peer.getsockname()[1]), "sendrecv", 20)
            )
            call.runner = _Runner()  # type: ignore[assignment]
            port = call.rtp_port
            for seq in range(1, 4):  # the first read alone, the others as a backlog
                peer.sendto(
                    _HDR.pack(0x80, 0, seq, 1000 + seq * 160, 0x1234) + bytes(160), ("::1", port)
                )
            _tick(call, time.monotonic() + 0.1)
            assert _received(call) == 3
            assert call.rtp.remote_addr == ("::1", peer.getsockname()[1])
            call.close()

    asyncio.run(main())


def test_a_read_before_the_last_one_was_processed_keeps_it_and_loses_nothing() -> None:
    """The ticker may put a tick's third phase off behind the next wake-up's
    frames; a talkspurt start can then bring the call's next read first."""

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            call = await _call(peer)
            now = time.monotonic() + 0.1
            _send(peer, call, 1)
            first = call._inbound(now)
            _send(peer, call, 2)
            second = call._inbound(now + 0.004)  # before ``first`` ran
            first(now + 0.004)
            second(now + 0.005)
            assert _received(call) == 1  # seq 1, once; seq 2 still queued in the socket
            _tick(call, now + 0.02)
            assert _received(call) == 2
            call.close()

    asyncio.run(main())


# ------------------------------------------------- DTMF sent: RFC 4733 or in-band tones
# A peer that did not negotiate telephone-event gets the app's DTMF as tones in the
# audio (in place of the bot's frames while they last); one that did gets RFC 4733
# events. What the call queued is decoded and run through the DTMF detector.

RTP_HEADER = 12


async def _dtmf_run(
    codec: str, pt: int, te: int | None
) -> tuple[_SipCall, list[bytes], list[bytes]]:
    """The call's audio packets (what it queued for the ticker) and the datagrams it sent
    at once (RFC 4733 events), over 40 ticks with "5#" asked for at the third."""
    ticker = MediaTicker(asyncio.get_running_loop())
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    services = _services(ticker)
    call = _SipCall(services, None, "call-1", 0)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    call.rtp_sock = sock
    call.start_media(NegotiatedAudio(0, codec, pt, te, peer.getsockname(), "sendrecv", 20))  # type: ignore[arg-type]
    sent: list[bytes] = []
    for n in range(40):  # 800 ms: two digits of 160 ms, then the bot's silence
        if n == 2:
            call.send_dtmf("5#")
        call.send_frame(None, n, n * 0.02)
        sent.extend(data for _, data, _ in call.outbox)
        call.outbox.clear()
    sock.close()
    direct: list[bytes] = []
    while True:
        try:
            direct.append(peer.recv(2048))
        except BlockingIOError:
            break
    peer.close()
    return call, sent, direct


@pytest.mark.parametrize(
    ("codec", "pt", "decode"), [("PCMU", 0, g711.ulaw_decode), ("PCMA", 8, g711.alaw_decode)]
)
def test_without_telephone_event_the_digits_are_tones_in_the_audio(
    codec: str, pt: int, decode: object
) -> None:
    call, sent, direct = asyncio.run(_dtmf_run(codec, pt, None))
    assert direct == []  # no events
    assert len(sent) == 40  # one packet a tick, none skipped or doubled
    assert {p[1] & 0x7F for p in sent} == {pt}  # audio payloads only: no event packets
    detector = DtmfDetector(8000)
    heard = [d for p in sent for d in detector.process(decode(p[RTP_HEADER:]))]  # type: ignore[operator]
    assert heard == ["5", "#"]
    assert not call.inband_out  # played out; the frames after it are the bot's again
    assert sent[-1][RTP_HEADER:] == call.silence


def test_with_telephone_event_the_digits_are_rfc4733_events() -> None:
    call, sent, direct = asyncio.run(_dtmf_run("PCMU", 0, 101))
    assert {p[1] & 0x7F for p in direct} == {101}
    events = [p[RTP_HEADER] for p in direct if p[1] & 0x80]  # each event's first packet
    assert events == [5, 11]  # RFC 4733: "#" is event 11
    detector = DtmfDetector(8000)
    heard = [d for p in sent for d in detector.process(g711.ulaw_decode(p[RTP_HEADER:]))]
    assert heard == []  # the audio carries no tones
    assert not call.inband_out


def test_on_a_g722_call_the_tones_are_wideband_audio() -> None:
    from telcodec.g722 import G722Decoder

    _, sent, direct = asyncio.run(_dtmf_run("G722", 9, None))
    assert direct == [] and len(sent) == 40
    decoder, detector = G722Decoder(), DtmfDetector(16000)
    heard = [d for p in sent for d in detector.process(decoder.decode(p[RTP_HEADER:]))]
    assert heard == ["5", "#"]

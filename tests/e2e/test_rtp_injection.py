"""RTP from an address other than the call's peer is ignored (RTP injection, reliability §2.3).

A call is up (the caller behind a fault-free relay on 127.0.0.3, whose RTP
socket is the address the daemon's SDP answer locked onto); a third address,
127.0.0.9, sprays the daemon's RTP port for that call with loud speech
packets (the call's own payload type, sequence numbers and timestamps that
would be accepted from the peer). None of it may count: the daemon's RTP
session counts every injected packet as from the wrong source, the
application hears no speech and no barge-in, and the turn plays to its end.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

import pytest

from bench.loadgen.faultrelay import Faults, SipRtpRelay
from bridge.io import caller
from bridge.io.caller import CallerOptions, place_call

from .harness import FACTOR, AppServer, app_route, speech_mulaw, stack

INJECTOR = "127.0.0.9"
TEXT = " ".join(f"word{i}" for i in range(20)) + "."


async def inject(sock: socket.socket, dest: tuple[str, int], audio: bytes) -> int:
    """100 packets of speech, one every 20 ms, as the peer would send them."""
    ssrc = 0x1234ABCD
    for n in range(100):
        payload = audio[n * 160 : (n + 1) * 160]
        header = struct.pack("!BBHII", 0x80, 0, 1000 + n, 160 * n, ssrc)
        sock.sendto(header + payload, dest)
        await asyncio.sleep(0.02)
    return 100


async def wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while loop.time() < deadline and not cond():
        await asyncio.sleep(0.02)
    return cond()


def test_rtp_from_a_third_address_is_dropped_and_counted_and_never_barges_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(caller, "HANGUP_GRACE_S", 5.0)
    speech = speech_mulaw(2.0, level=12000.0)

    async def body() -> None:
        async with AppServer() as app, stack(app_route(app.url), sip="0") as st:
            app.on_started = [{"type": "say", "turn_id": "t", "text": TEXT, "final": True}]
            leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
            daemon_sip = leg.runners[0].udp.get_extra_info("sockname")[:2]  # type: ignore[attr-defined]
            relay = SipRtpRelay(daemon_sip, Faults(), seed=0)
            await relay.start()
            injector = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            injector.bind((INJECTOR, 0))
            try:
                host, port = relay.sip_front
                # the 4.1 s turn finishes before the caller hangs up, however loaded the host
                target = f"sip:demo@{host}:{port}"
                call = asyncio.ensure_future(
                    place_call(CallerOptions(target=target, duration_s=6.0 * FACTOR))
                )
                await app.wait_for("turn.started", timeout_s=10)
                assert relay.daemon_rtp is not None
                (sip_call,) = leg.calls.values()  # type: ignore[attr-defined]
                sent = await inject(injector, relay.daemon_rtp, speech)

                def counted() -> int:
                    return int(sip_call.rtp.counters().dropped_wrong_source)

                # the daemon reads its RTP socket at its media tick: wait for the last ones
                await wait_for(lambda: counted() >= sent, 5)
                injected_counted = counted()
                peer_packets = sip_call.rtp.counters().packets_received
                result = await call
                await app.wait_for("call.ended", timeout_s=10)
            finally:
                injector.close()
                relay.close()
            assert result.recording.answered_at_s is not None, result.recording.failure
            assert result.recording.ended_by == "local-hangup"
            assert injected_counted == sent, (injected_counted, sent)
            assert peer_packets > 0  # the caller's own packets were taken meanwhile
            assert app.of("turn.interrupted") == [] and app.of("speech.started") == []
            assert [e["turn_id"] for e in app.of("turn.finished")] == ["t"]

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

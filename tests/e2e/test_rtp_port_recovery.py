"""The RTP port allocator recovers from failed binds, and ``/readyz`` tells the truth.

A real daemon in-process with a range of two port pairs. Ports held by
another process (EADDRINUSE) refuse the call with 503, are left out for the
cool-down only, make ``/readyz`` unready while none is usable, and are
handed out again once free; a bind that fails for want of descriptors
(EMFILE) refuses that call and marks nothing.
"""

from __future__ import annotations

import asyncio
import errno
import json
import random
import socket

import pytest

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call
from bridge.io.legs.sip import SipLeg
from bridge.io.legs.sip_call import _SipCall

from .harness import FACTOR, stack

GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from the bridge."
"""


def _occupy_range() -> tuple[int, list[socket.socket]]:
    """Four free UDP ports N..N+3 (N even), each held by a socket of ours. Above Linux's
    ephemeral range (32768-60999): once the test lets them go, no other process's
    connect() or bind to port 0 takes one before the call that needs them."""
    for _ in range(50):
        base = random.randrange(61000, 65500, 2)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + 4):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base, held
        except OSError:
            for s in held:
                s.close()
    raise AssertionError("no free range of 4 UDP ports found")


async def _readyz(port: int) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 10 * FACTOR)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def _call(sip: int) -> tuple[bool, str | None]:
    result = await place_call(CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=1.0))
    report = build_report(result.recording)
    return report.answered, report.failure


def test_ports_in_use_recover_after_the_cool_down_and_readyz_follows() -> None:
    async def body() -> None:
        base, held = _occupy_range()
        try:
            async with stack(GREETING_ROUTE, rtp=f"{base}-{base + 3}") as s:
                sip = s.sip_port
                leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
                leg.port_cooldown_s = 0.5 * FACTOR
                assert (await _readyz(s.api_port))[0] == 200

                answered, failure = await _call(sip)  # both pairs are someone else's
                assert not answered and failure is not None and "503" in failure
                assert leg.ports.unusable_count == 2
                status, state = await _readyz(s.api_port)
                assert status == 503 and state["unable"] == ["sip"]

                for sock in held:
                    sock.close()
                held.clear()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30 * FACTOR
                while (await _readyz(s.api_port))[0] != 200 and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                assert (await _readyz(s.api_port))[0] == 200
                answered, failure = await _call(sip)
                assert answered, failure
                assert leg.ports.unusable_count == 0
        finally:
            for sock in held:
                sock.close()

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))


def test_descriptor_exhaustion_refuses_the_call_and_marks_no_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_descriptors(self: _SipCall, host: str) -> tuple[socket.socket, socket.socket]:
        raise OSError(errno.EMFILE, "Too many open files")

    async def body() -> None:
        async with stack(GREETING_ROUTE) as s:
            sip = s.sip_port
            leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
            usable = leg.ports.usable_count(0.0)
            with monkeypatch.context() as m:
                m.setattr(_SipCall, "bind_sockets", no_descriptors)
                answered, failure = await _call(sip)
            assert not answered and failure is not None and "503" in failure
            assert leg.ports.unusable_count == 0
            assert leg.ports.usable_count(0.0) == usable and leg.ports.allocated_count == 0
            assert (await _readyz(s.api_port))[0] == 200
            answered, failure = await _call(sip)  # descriptors back: the next call connects
            assert answered, failure

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))

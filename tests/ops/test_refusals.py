"""Every refusal path moves ``callbridge_rejected_total`` under its documented reason.

The daemon runs in-process (SIP on UDP port 0, media streams on port 0, the
tone TTS server beside it); requests come from plain sockets bound to loopback
addresses, so one config covers a trusted proxy (127.0.0.1), an allowed direct
source (127.0.0.2) and a source outside ``allow`` (127.0.0.3). Each step waits
for the counter it expects (with a scaled timeout), then checks the answers
the client got: the count of answers and of metric increments must agree.
``auth_failed`` is counted by the SIP engine like the other engine reasons
(``tests/sip/test_sip_proxy_trust.py``); the leg exports them all alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import websockets

from bridge.io.daemon import Daemon
from bridge.metrics import REJECT_REASONS

from .conftest import FACTOR
from .inprocess import Overloaded, with_daemon
from .scaleout import metric_sum

PROXY, DIRECT, STRANGER = "127.0.0.1", "127.0.0.2", "127.0.0.3"
SDP = (
    "v=0\r\no=c 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)


TWILIO_START = {
    "event": "start",
    "sequenceNumber": "1",
    "streamSid": "MZ1",
    "start": {
        "streamSid": "MZ1",
        "callSid": "CA1",
        "accountSid": "AC1",
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
}


def config(tts_port: int) -> str:
    return f"""
[daemon]
log_format = "json"
event_loop = "asyncio"
drain_timeout_s = 1

[sip]
listen = ["127.0.0.1:0"]
transports = ["udp"]
rtp_ports = "39000-39099"
allow = ["{DIRECT}/32", "198.51.100.0/24"]
trusted_proxies = ["{PROXY}"]
max_calls = 1
invite_rate_per_source = 0.1

[media_streams]
listen = "127.0.0.1:0"
stream_token = "shared-secret"
plivo_auth_token = "plivo-secret"
single_use_tokens = true

[api]
listen = "127.0.0.1:0"

[providers.main]
protocol = "kova"
url = "ws://127.0.0.1:{tts_port}/v1/ws/kova"
api_key = "k"
voice = "tone"

[[routes]]
match = "demo"
provider = "main"
greeting = "Hello."
"""


class SipClient:
    """A UDP socket on one loopback address that sends INVITEs and keeps the
    final answers it gets ('CODE Reason'; provisional ones skipped)."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.host, self.port = self.sock.getsockname()
        self.target = target
        self.answers: list[str] = []
        self.answered: set[str] = set()

    def invite(self, caller: str | None = None, user: str = "demo", sdp: str = "") -> None:
        branch = "z9hG4bK" + uuid.uuid4().hex[:16]
        source = f"X-Callbridge-Source: {caller}\r\n" if caller else ""
        body = f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
        msg = (
            f"INVITE sip:{user}@{self.target[0]}:{self.target[1]} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {self.host}:{self.port};branch={branch};rport\r\n"
            f"From: <sip:c@{self.host}>;tag={uuid.uuid4().hex[:8]}\r\n"
            f"To: <sip:{user}@{self.target[0]}>\r\n"
            f"Call-ID: {uuid.uuid4().hex}\r\nCSeq: 1 INVITE\r\n"
            f"Contact: <sip:c@{self.host}:{self.port}>\r\nMax-Forwards: 70\r\n"
            f"{source}{body}"
        )
        self.sock.sendto(msg.encode(), self.target)

    def read(self) -> list[str]:
        """The final answers so far, one per call: this client sends no ACK, so the
        daemon retransmits a final answer (Timer G) and a copy can arrive late."""
        with contextlib.suppress(BlockingIOError):
            while True:
                data = self.sock.recv(65535).decode("utf-8", "replace")
                m = re.match(r"SIP/2\.0 (\d{3}) ([^\r]*)", data)
                call = re.search(r"^Call-ID: *(\S+)", data, re.M | re.I)
                if m and int(m.group(1)) >= 200 and call and call.group(1) not in self.answered:
                    self.answered.add(call.group(1))
                    self.answers.append(f"{m.group(1)} {m.group(2)}")
        return self.answers


async def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s * FACTOR
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


class NoPorts:
    """An RTP port allocator with every pair taken."""

    def allocate(self, key: str, now: float | None = None) -> int | None:
        return None

    def usable_count(self, now: float) -> int:
        return 0

    def release(self, key: str) -> None:
        pass


async def upgrade_status(url: str) -> int:
    """101 if the upgrade was accepted (then closed), else the HTTP status."""
    try:
        async with websockets.connect(url):
            return 101
    except websockets.InvalidStatus as e:
        return int(e.response.status_code)


@pytest.fixture
def clients() -> Iterator[list[SipClient]]:
    made: list[SipClient] = []
    yield made
    for c in made:
        c.sock.close()


def test_every_refusal_path_moves_its_reason(clients: list[SipClient]) -> None:
    async def body() -> None:
        await with_daemon(config, "refusals.toml", steps)

    async def steps(daemon: Daemon) -> None:
        sip_leg = next(leg for leg in daemon.legs if leg.name == "sip")
        streams = next(leg for leg in daemon.legs if leg.name == "media_streams")
        runner = sip_leg.runners[0]  # type: ignore[attr-defined]
        target = runner.udp.get_extra_info("sockname")[:2]
        ws = f"ws://127.0.0.1:{streams.port}"  # type: ignore[attr-defined]

        def rejected(reason: str) -> float:
            text = daemon.metrics.render().decode()
            return metric_sum(text, "callbridge_rejected_total", reason=reason)

        text = daemon.metrics.render().decode()
        for reason in REJECT_REASONS:  # every reason is exported from the start, at 0
            assert f'callbridge_rejected_total{{reason="{reason}"}} 0.0' in text, reason

        def client(host: str) -> SipClient:
            c = SipClient(host, target)
            clients.append(c)
            return c

        proxy, direct, stranger = client(PROXY), client(DIRECT), client(STRANGER)

        # a source outside `allow`: dropped silently, counted
        stranger.invite(sdp=SDP)
        assert await wait_for(lambda: rejected("not_allowed") == 1)
        # a caller outside `allow` behind the trusted proxy: 403
        proxy.invite(caller="203.0.113.5", sdp=SDP)
        assert await wait_for(lambda: proxy.read() == ["403 Forbidden"]), proxy.answers
        assert rejected("not_allowed") == 2

        # no route: 404 (the proxy's own INVITEs are never rate-limited)
        proxy.invite(user="nowhere", sdp=SDP)
        assert await wait_for(lambda: len(proxy.read()) == 2)
        assert proxy.answers[-1] == "404 Not Found" and rejected("no_route") == 1
        # no codec in common (the engine's 488), and no offer at all (the leg's 488)
        proxy.invite(sdp=SDP.replace("RTP/AVP 0", "RTP/AVP 18").replace(":0 PCMU", ":18 G729"))
        proxy.invite()
        assert await wait_for(lambda: len(proxy.read()) == 4)
        assert proxy.answers[-2:] == ["488 Not Acceptable Here"] * 2
        assert rejected("no_codec") == 2

        # the media clock lags: a new SIP call and a new stream get 503
        real = daemon.services.ticker
        daemon.services.ticker = Overloaded(real)  # type: ignore[assignment]
        try:
            proxy.invite(sdp=SDP)
            assert await wait_for(lambda: len(proxy.read()) == 5)
            assert await upgrade_status(f"{ws}/twilio") == 503
        finally:
            daemon.services.ticker = real
        assert proxy.answers[-1] == "503 Service Unavailable"
        assert rejected("overloaded") == 2

        # a stream whose route matches nothing is closed
        async with websockets.connect(f"{ws}/twilio") as conn:
            await conn.send(json.dumps({"event": "connected", "protocol": "Call"}))
            await conn.send(json.dumps(TWILIO_START))
            with contextlib.suppress(websockets.ConnectionClosed):
                async for _ in conn:
                    pass
        assert rejected("no_route") == 2
        # a Twilio stream whose single-use token is garbage is closed
        async with websockets.connect(f"{ws}/twilio") as conn:
            start = json.loads(json.dumps(TWILIO_START))
            start["start"]["customParameters"] = {
                "route": "demo",
                "stream_token": "shared-secret",  # /twilio checks the shared token too
                "token": "garbage",
            }
            await conn.send(json.dumps({"event": "connected", "protocol": "Call"}))
            await conn.send(json.dumps(start))
            with contextlib.suppress(websockets.ConnectionClosed):
                async for _ in conn:
                    pass
        assert rejected("token_malformed") == 1
        # a Plivo upgrade without its signature: 403
        assert await upgrade_status(f"{ws}/plivo") == 403
        assert rejected("bad_signature") == 1
        # a shared-token dialect without its token: 403
        assert await upgrade_status(f"{ws}/telnyx") == 403
        assert rejected("bad_token") == 1

        # every RTP port pair taken: 503
        real_ports = sip_leg.ports  # type: ignore[attr-defined]
        sip_leg.ports = NoPorts()  # type: ignore[attr-defined]
        try:
            proxy.invite(sdp=SDP)
            assert await wait_for(lambda: rejected("no_ports") == 1)
        finally:
            sip_leg.ports = real_ports  # type: ignore[attr-defined]
        assert await wait_for(lambda: proxy.read().count("503 Service Unavailable") == 2)

        # max_calls = 1: with one call up the next INVITE gets 503
        proxy.invite(sdp=SDP)
        assert await wait_for(lambda: sip_leg.active_calls() == 1)
        proxy.invite(sdp=SDP)
        assert await wait_for(lambda: rejected("max_calls") == 1)
        assert await wait_for(lambda: proxy.read().count("503 Service Unavailable") == 3)

        # draining: new calls and new streams get 503
        sip_leg.set_draining(True)
        streams.set_draining(True)
        assert await upgrade_status(f"{ws}/twilio") == 503
        assert rejected("draining") == 1
        proxy.invite(sdp=SDP)
        assert await wait_for(lambda: rejected("draining") == 2)

        # over the INVITE rate (burst 10, 0.1/s): a direct source is dropped
        # silently, a caller behind the trusted proxy gets 503 Rate Limited;
        # every INVITE is either refused as draining (answered) or rate-limited
        before = rejected("draining")
        for _ in range(15):
            direct.invite(sdp=SDP)

        def refused() -> float:
            return rejected("draining") + rejected("rate_limited")

        assert await wait_for(lambda: refused() == before + 15)
        assert await wait_for(lambda: len(direct.read()) == rejected("draining") - before)
        assert set(direct.answers) == {"503 Service Unavailable"}
        silent = rejected("rate_limited")
        assert silent >= 1

        before = rejected("draining")
        seen = len(proxy.read())
        for _ in range(15):
            proxy.invite(caller="198.51.100.7", sdp=SDP)
        assert await wait_for(lambda: len(proxy.read()) == seen + 15)
        answers = proxy.answers[seen:]
        assert answers.count("503 Rate Limited") == rejected("rate_limited") - silent >= 1
        assert answers.count("503 Service Unavailable") == rejected("draining") - before
        assert stranger.read() == [], "a source outside `allow` never hears back"

    asyncio.run(asyncio.wait_for(body(), 120 * FACTOR))


def test_every_reason_in_the_code_is_in_the_documented_set() -> None:
    """Each literal ``rejected_total.labels(...)`` reason and each engine refusal is
    one of ``REJECT_REASONS``, and docs/operations.md lists every one of them."""
    from bridge.sip.guard import REFUSAL_REASONS

    root = Path(__file__).resolve().parents[2]
    used = set(REFUSAL_REASONS)
    for path in (root / "bridge").rglob("*.py"):
        used |= set(re.findall(r'rejected_total\.labels\("(\w+)"\)', path.read_text()))
    assert used >= {"draining", "overloaded", "no_route", "no_ports", "bad_token"}
    assert used <= set(REJECT_REASONS), used - set(REJECT_REASONS)
    operations = (root / "docs" / "operations.md").read_text()
    for reason in REJECT_REASONS:
        assert f"`{reason}`" in operations, reason

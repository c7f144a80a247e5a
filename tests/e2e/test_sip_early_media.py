"""Early media against SIPp (issue 34): both ways, on the wire.

Inbound: a route with ``early_media = "greeting"`` answers SIPp's INVITE with
183 and SDP, the greeting's RTP reaches the test's phone before any 200, and
the 200 repeats the 183's SDP; ``early_media = "only"`` plays the greeting in
early media and ends with the route's final status (486), never a 200.
Outbound: SIPp as the callee sends 180 (no SDP), 183 with SDP and then 200 or
486; the daemon reads the far end's early media (its RTP session latches
before the answer) and reports the progress.

Order is read from the phone's arrival times and SIPp's message trace, both
on this host's wall clock; nothing here asserts a duration. The delay from
the 183 to the greeting's first audible packet is printed (``-s``) for the
bench notes, not checked.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import stack
from test_sip_peers import (
    GREETING,
    ROUTES,
    SILENT_SAMPLE_LEVEL,
    RtpPhone,
    SippResult,
    SkippedFrames,
    _rtp_range,
    audible_span_s,
    free_udp_port,
    greeting_speech_s,
    requires_sipp,
    run,
    run_sipp,
    sip_leg,
    sipp_uac_args,
    start_sipp_uas,
    wait_for,
)

from bridge.io.api_shell import Directory
from telcodec import g711

LONG_GREETING = (
    "Hello caller, welcome to the bridge. Every agent is busy, please hold the line "
    "and somebody will be with you shortly."
)
EARLY_ROUTES = (
    ROUTES
    + f"""
[[routes]]
match = "early"
provider = ["main"]
greeting = "{GREETING}"
early_media = "greeting"

[[routes]]
match = "closed"
provider = ["main"]
greeting = "{GREETING}"
early_media = "only"
early_media_status = 486

[[routes]]
match = "capped"
provider = ["main"]
greeting = "{LONG_GREETING}"
early_media = "greeting"
early_media_max_s = 1.0
"""
)


def received_at(result: SippResult, start_line: str, cseq: str = "") -> list[float]:
    """Wall-clock times (epoch s) at which SIPp received messages starting ``start_line``
    (and, given ``cseq``, whose CSeq method is that)."""
    out: list[float] = []
    blocks = re.split(r"^-+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\s*$", result.messages, flags=re.M)
    for stamp, body in zip(blocks[1::2], blocks[2::2], strict=True):
        _, received, message = body.partition("message received")
        message = message.split("\n", 1)[1].lstrip("\r\n") if "\n" in message else ""
        if not received or not message.startswith(start_line):
            continue
        if cseq and not re.search(rf"^CSeq:\s*\d+ {cseq}\s*$", message, re.M | re.I):
            continue
        out.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return out


class WallPhone(RtpPhone):
    """An ``RtpPhone`` that also keeps each packet's wall-clock arrival (SIPp's clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.wall: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        before = len(self.received)
        super().datagram_received(data, addr)
        if len(self.received) > before:
            self.wall.append(time.time())

    def audible_walls(self) -> list[float]:
        """Wall-clock arrivals of the packets with audible PCMU, in order."""
        out = []
        for wall, packet in zip(self.wall, self.received, strict=True):
            if packet.pt != 0:
                continue
            samples = memoryview(g711.ulaw_decode(packet.payload)).cast("h")
            if any(abs(s) > SILENT_SAMPLE_LEVEL for s in samples):
                out.append(wall)
        return out

    def first_audible_wall(self) -> float | None:
        walls = self.audible_walls()
        return walls[0] if walls else None


@pytest.mark.peers
@requires_sipp
def test_sipp_hears_the_greeting_in_early_media_before_the_200(tmp_path: Path) -> None:
    """183 with SDP, the greeting's RTP, then 200 with the same SDP, ACK, BYE."""

    async def main() -> None:
        async with stack(EARLY_ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = await WallPhone().open(free_udp_port(odd=False))
            try:
                args = sipp_uac_args(
                    "uac_early_media.xml", st.sip_port, "early", rtp_port=phone.port
                )
                result = await run_sipp(tmp_path, "early", [*args, "-d", "1000"], timeout_s=30)
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            ports = re.search(r"ports early=(\d+) answer=(\d+)", result.log)
            assert ports is not None and ports[1] == ports[2], result.explain()
            early = received_at(result, "SIP/2.0 183")
            ok = received_at(result, "SIP/2.0 200 OK")
            assert early and ok and early[0] < ok[0], (early, ok)
            first_audible = phone.first_audible_wall()
            assert first_audible is not None, "no audible RTP received"
            # the greeting is heard before the call is answered
            assert first_audible < ok[0], (first_audible, ok[0])
            print(
                f"\n183 -> first audible greeting RTP: {(first_audible - early[0]) * 1000:.1f} ms"
            )
            span = audible_span_s(phone.pcm())
            assert span is not None
            expected_s = greeting_speech_s(GREETING)
            assert abs((span[1] - span[0]) - expected_s) <= skips.slack(), (span, expected_s)
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls

    run(main())


@pytest.mark.peers
@requires_sipp
def test_sipp_hears_an_announcement_then_a_final_error(tmp_path: Path) -> None:
    """``only``: 183, the greeting's RTP, 486 Busy Here; never a 200."""

    async def main() -> None:
        async with stack(EARLY_ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            phone = await WallPhone().open(free_udp_port(odd=False))
            try:
                args = sipp_uac_args(
                    "uac_early_only.xml", st.sip_port, "closed", rtp_port=phone.port
                )
                result = await run_sipp(tmp_path, "only", args, timeout_s=30)
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            assert "final=486" in result.log, result.explain()
            assert not received_at(result, "SIP/2.0 200", "INVITE"), result.explain()
            busy = received_at(result, "SIP/2.0 486")
            first_audible = phone.first_audible_wall()
            assert busy and first_audible is not None and first_audible < busy[0]
            assert audible_span_s(phone.pcm()) is not None
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls

    run(main())


@pytest.mark.peers
@requires_sipp
def test_early_media_cap_answers_while_the_greeting_plays(tmp_path: Path) -> None:
    """``early_media_max_s = 1`` and a longer greeting: the 200 comes at the cap, with the
    greeting heard before it and still after it (the call goes on)."""

    async def main() -> None:
        async with stack(EARLY_ROUTES, rtp=_rtp_range()) as st:
            phone = await WallPhone().open(free_udp_port(odd=False))
            try:
                args = sipp_uac_args(
                    "uac_early_media.xml", st.sip_port, "capped", rtp_port=phone.port
                )
                result = await run_sipp(tmp_path, "capped", [*args, "-d", "3000"], timeout_s=30)
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            ok = received_at(result, "SIP/2.0 200", "INVITE")
            audible = phone.audible_walls()
            assert greeting_speech_s(LONG_GREETING) > 2.5  # the 1 s cap falls inside it
            assert ok and audible and audible[0] < ok[0] < audible[-1], (ok, audible[:1])

    run(main())


class QuietPhone(WallPhone):
    """A phone that sends no RTP until ``speak()`` (many send none before the 200)."""

    def __init__(self) -> None:
        super().__init__()
        self.learned: tuple[str, int] | None = None
        self.speaking = False

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        super().datagram_received(data, addr)
        if not self.speaking:
            self.learned = self.learned or self.remote
            self.remote = None  # held back: the sender sends nothing

    def speak(self) -> None:
        self.speaking = True
        self.remote = self.learned


@pytest.mark.peers
@requires_sipp
def test_a_caller_silent_in_early_media_is_not_timed_out(tmp_path: Path) -> None:
    """``rtp_timeout_s = 2``, a 3.8 s early greeting, a caller that sends no RTP until the
    200: the whole greeting is heard and answered (the RTP timeout starts at the 200)."""

    async def main() -> None:
        routes = EARLY_ROUTES.replace('match = "capped"', 'match = "long"').replace(
            "early_media_max_s = 1.0", ""
        )
        async with stack(routes, rtp=_rtp_range(), sip_extra="rtp_timeout_s = 2") as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = await QuietPhone().open(free_udp_port(odd=False))
            try:
                args = sipp_uac_args(
                    "uac_early_media.xml", st.sip_port, "long", rtp_port=phone.port
                )
                sipp = asyncio.ensure_future(
                    run_sipp(tmp_path, "quiet", [*args, "-d", "1500"], timeout_s=30)
                )
                assert await wait_for(lambda: bool(leg.early) or sipp.done(), 5.0)
                assert await wait_for(lambda: not leg.early or sipp.done(), 10.0)
                phone.speak()  # answered: from now on the caller's RTP is expected
                result = await sipp
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            span = audible_span_s(phone.pcm())
            expected_s = greeting_speech_s(LONG_GREETING)
            assert expected_s > 2 + 1  # longer than the RTP timeout, with a margin
            assert span is not None and abs((span[1] - span[0]) - expected_s) <= skips.slack()

    run(main())


@pytest.mark.peers
@requires_sipp
def test_cancel_during_early_media_stops_the_greeting(tmp_path: Path) -> None:
    """CANCEL half a second into the early greeting: 200, 487, no 200 for the INVITE; the
    greeting is cut (the phone hears only its start) and the call's ports are freed."""

    async def main() -> None:
        async with stack(EARLY_ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            phone = await WallPhone().open(free_udp_port(odd=False))
            try:
                args = sipp_uac_args(
                    "uac_early_cancel.xml", st.sip_port, "early", rtp_port=phone.port
                )
                result = await run_sipp(tmp_path, "cancel", args, timeout_s=30)
                assert await wait_for(lambda: not leg.calls, 2.0)
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            assert received_at(result, "SIP/2.0 200", "CANCEL"), result.explain()
            assert not received_at(result, "SIP/2.0 200", "INVITE"), result.explain()
            assert received_at(result, "SIP/2.0 487"), result.explain()
            span = audible_span_s(phone.pcm())
            assert span is not None, "nothing of the greeting was heard"
            assert span[1] - span[0] < greeting_speech_s(GREETING) - 0.5, span
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())


@pytest.mark.peers
@requires_sipp
@pytest.mark.parametrize(
    ("scenario", "answered"), [("uas_early_answer.xml", True), ("uas_early_busy.xml", False)]
)
def test_daemon_calls_out_and_gets_the_far_ends_early_media(
    tmp_path: Path, scenario: str, answered: bool
) -> None:
    """180 without SDP (ringing), 183 with SDP: the far end's RTP reaches the call's RTP
    session before any answer; then 200 (the call runs) or 486 (it ends, ports freed)."""

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range()) as st:
            leg = sip_leg(st)
            phone = await RtpPhone().open(free_udp_port(odd=False))
            try:
                uas_port, uas = await start_sipp_uas(
                    tmp_path, "uas_early", scenario, 20, rtp_port=phone.port
                )
                call_id = leg.originate(
                    f"sip:bot@127.0.0.1:{uas_port}", "sip:callbridge@127.0.0.1", "announce"
                )
                call = leg.calls[call_id]
                # early media: our comfort noise reaches the phone, which answers with its
                # own RTP; the call's session latches it, all before any runner (answer)
                heard_early = await wait_for(
                    lambda: (
                        call.runner is None
                        and call.rtp.reception_stats().received > 0
                        and phone.first_packet.is_set()
                    ),
                    5.0,
                )
                assert heard_early, (call.runner, call.rtp.reception_stats())
                # the API's call record says so (GET /v1/calls/{call_id})
                info = Directory(st.daemon).get_call(call_id)
                assert info is not None and info.state == "early_media", info
                result = await uas
            finally:
                phone.close()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            if answered:
                span = audible_span_s(phone.pcm())
                assert span is not None, "the callee heard nothing after the answer"
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            assert not leg.calls and not leg.early_out
            assert Directory(st.daemon).get_call(call_id) is None

    run(main())

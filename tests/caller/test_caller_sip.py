"""The caller's SIP side over loopback: against a tiny in-test UAS and against SIPp.

The UAS is built from the project's engines (``SipUserAgent`` + ``RtpSession``)
with its own asyncio shell below: it answers, plays a 1 s tone, then
silence, and collects RFC 4733 digits. Every wait is bounded by ``TIMEOUT_S``
(scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import struct
import subprocess
import wave
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import main as cli_main
from bridge.control.report import build_report, level_dbfs
from bridge.engine import SendDatagram
from bridge.io.caller import CallerOptions, SpeakClip, place_call, run_media_clock, write_wav
from bridge.rtp.dtmf import DtmfReceived
from bridge.rtp.session import RtpSession, RtpSessionConfig, silence_frame
from bridge.sip.events import CallEnded, CallOffered
from bridge.sip.sdp import build_answer, negotiate, parse_sdp
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent
from telcodec import g711

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 15.0 * FACTOR
TONE_FRAMES = 50  # 1 s


def tone_pcm(frames: int, amplitude: float = 0.3, freq_hz: float = 440.0) -> bytes:
    samples = frames * 160
    return struct.pack(
        f"<{samples}h",
        *(
            round(amplitude * 32767 * math.sin(2 * math.pi * freq_hz * n / 8000))
            for n in range(samples)
        ),
    )


class Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.on_datagram(data, (addr[0], addr[1]))


class ToneUas:
    """Answers every INVITE, plays ``tone_frames`` of tone then silence, records digits.

    With ``stop_on_speech`` the tone stops on the first inbound frame at or above
    -40 dBFS (a barge-in by the simplest possible policy).
    """

    def __init__(
        self, tone_frames: int = TONE_FRAMES, stop_on_speech: bool = False, odd_source: bool = False
    ) -> None:
        self.odd_source = odd_source
        self.loop = asyncio.get_running_loop()
        self.tone = g711.ulaw_encode(tone_pcm(tone_frames))
        self.stop_on_speech = stop_on_speech
        self.digits: list[DtmfReceived] = []
        self.ended = asyncio.Event()
        self.speech_heard_at: float | None = None
        self.tone_stopped_frame: int | None = None
        self.rtp: RtpSession | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: list[asyncio.Task[int]] = []
        self.tone_frames_sent = 0
        self.frames_sent = 0
        self.last_frame = -1
        """Frames its clock skipped (woke over 100 ms late): last_frame + 1 - frames_sent."""

    async def start(self) -> int:
        self.sip_t, _ = await self.loop.create_datagram_endpoint(
            lambda: Datagrams(self.on_sip), local_addr=("127.0.0.1", 0)
        )
        self.rtp_t, _ = await self.loop.create_datagram_endpoint(
            lambda: Datagrams(self.on_rtp), local_addr=("127.0.0.1", 0)
        )
        self.send_t = self.rtp_t
        if self.odd_source:  # send RTP from another socket than the SDP names
            self.send_t, _ = await self.loop.create_datagram_endpoint(
                lambda: Datagrams(self.on_rtp), local_addr=("127.0.0.1", 0)
            )
        port = int(self.sip_t.get_extra_info("sockname")[1])
        self.ua = SipUserAgent(SipSettings(local_host="127.0.0.1", local_port=port))
        return port

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.timer is not None:
            self.timer.cancel()
        self.sip_t.close()
        self.rtp_t.close()
        self.send_t.close()

    def pump(self) -> None:
        now = self.loop.time()
        for event in self.ua.events_received():
            if isinstance(event, CallOffered):
                self.answer(event, now)
            elif isinstance(event, CallEnded):
                self.ended.set()
        for action in self.ua.actions_to_send():
            assert isinstance(action, SendDatagram)
            self.sip_t.sendto(action.data, action.addr)
        if self.timer is not None:
            self.timer.cancel()
        deadline = self.ua.next_deadline()
        self.timer = None if deadline is None else self.loop.call_at(deadline, self.on_timer)

    def on_timer(self) -> None:
        self.ua.handle_timer(self.loop.time() + 0.001)
        self.pump()

    def on_sip(self, data: bytes, source: tuple[str, int]) -> None:
        self.ua.receive_datagram(data, source, self.loop.time())
        self.pump()

    def answer(self, event: CallOffered, now: float) -> None:
        offer = parse_sdp(event.offer_sdp)
        audio = negotiate(offer, ("PCMU",))
        assert audio is not None and audio.telephone_event_pt == 101
        config = RtpSessionConfig(
            payload_types=frozenset({0}), telephone_event_pt=audio.telephone_event_pt
        )
        self.rtp = RtpSession(config, audio.remote_addr, now)
        port = int(self.rtp_t.get_extra_info("sockname")[1])
        self.ua.answer(event.call_id, build_answer(offer, audio, "127.0.0.1", port, 7, 1), now)
        self.tasks.append(self.loop.create_task(run_media_clock(now, self.tick)))

    async def tick(self, n: int, now: float) -> bool:
        assert self.rtp is not None
        if self.ended.is_set():
            return False
        playing = n < len(self.tone) // 160 and self.tone_stopped_frame is None
        if self.stop_on_speech and self.speech_heard_at is not None and playing:
            self.tone_stopped_frame, playing = n, False
        frame = self.tone[n * 160 : (n + 1) * 160] if playing else silence_frame(0)
        self.rtp.send_frame(frame, 0, now, n)
        self.frames_sent += 1
        self.tone_frames_sent += playing
        self.last_frame = n
        self.drain_rtp()
        return True

    def on_rtp(self, data: bytes, source: tuple[str, int]) -> None:
        if self.rtp is None:
            return
        now = self.loop.time()
        self.rtp.receive_datagram(data, source, now)
        audio = len(data) == 172 and data[1] & 0x7F == 0
        if audio and self.speech_heard_at is None and level_dbfs(g711.ulaw_decode(data[12:])) > -40:
            self.speech_heard_at = now
        self.drain_rtp()

    def drain_rtp(self) -> None:
        assert self.rtp is not None
        for action in self.rtp.actions_to_send():
            assert isinstance(action, SendDatagram)
            self.send_t.sendto(action.data, action.addr)
        self.digits += [e for e in self.rtp.events_received() if isinstance(e, DtmfReceived)]


def speech_frames(pcm: bytes) -> list[int]:
    return [i for i in range(len(pcm) // 320) if level_dbfs(pcm[i * 320 : (i + 1) * 320]) >= -40]


def test_sip_call_answered_tone_recorded_and_dtmf_received(tmp_path: Path) -> None:
    async def main() -> None:
        uas = ToneUas()
        port = await uas.start()
        try:
            opts = CallerOptions(
                target=f"sip:bot@127.0.0.1:{port}",
                dtmf=((0.5, "1"), (0.8, "#")),
                duration_s=2.0,
            )
            result = await asyncio.wait_for(place_call(opts), TIMEOUT_S)
            await asyncio.wait_for(uas.ended.wait(), TIMEOUT_S)  # our BYE arrived
        finally:
            uas.close()
        report = build_report(result.recording)
        assert report.answered and report.failure is None
        assert report.ended_by == "local-hangup"
        # How long setup and first audio take is measured in bench/ (bench_sip, bench_latency).
        assert report.setup_ms is not None and report.setup_ms > 0
        assert report.first_audio_ms is not None and report.first_audio_ms >= 0
        # Every frame the UAS sent arrived (over loopback), the tone whole; a frame its
        # clock skipped (it woke over 100 ms late) is a hole in the sequence numbers.
        skipped = uas.last_frame + 1 - uas.frames_sent
        assert report.frames_received == uas.frames_sent >= 50
        assert report.speech_frames_received == uas.tone_frames_sent
        assert uas.tone_frames_sent + skipped >= TONE_FRAMES
        assert report.lost_packets == skipped
        assert report.pacing is not None and report.pacing.intervals == report.frames_received - 1
        # The UAS got both digits as RFC 4733 events, each with its end packets.
        assert [d.digit for d in uas.digits] == ["1", "#"]
        assert all(d.ended and d.duration_ms == 100 for d in uas.digits)
        assert report.dtmf_sent == "1#"
        # The recording: 2 s from the answer, the tone exactly 1 s long, right at the start.
        path = tmp_path / "heard.wav"
        write_wav(str(path), result.heard_pcm_s16le)
        with wave.open(str(path), "rb") as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (8000, 1, 2)
            pcm = wav.readframes(wav.getnframes())
        tone = speech_frames(pcm)
        if skipped == 0 and result.recording.slipped_frames == 0:
            # neither clock skipped: 2 s recorded, the tone whole and contiguous, right after
            # the jitter buffer's depth (3 frames) plus transit
            assert abs(len(pcm) // 320 - 100) <= 1
            assert tone == list(range(tone[0], tone[0] + TONE_FRAMES)) and tone[0] <= 5
        else:  # a loop stalled: what was played is in order, only what was skipped is missing
            assert tone and tone[-1] - tone[0] < TONE_FRAMES + skipped + 3
            assert len(tone) >= uas.tone_frames_sent - result.recording.slipped_frames - 3

    asyncio.run(main())


def test_sip_barge_in_measured_on_what_was_received(tmp_path: Path) -> None:
    async def main() -> None:
        uas = ToneUas(tone_frames=150, stop_on_speech=True)
        port = await uas.start()
        speech = bytes(160 * 2 * 10) + tone_pcm(25, amplitude=0.2, freq_hz=300.0)
        try:
            opts = CallerOptions(
                target=f"sip:bot@127.0.0.1:{port}",
                speak=(SpeakClip("speech.wav", 0.6, speech),),
                duration_s=2.5,
            )
            result = await asyncio.wait_for(place_call(opts), TIMEOUT_S)
        finally:
            uas.close()
        report = build_report(result.recording)
        (barge,) = report.barge_ins
        # Speech starts 10 frames into the clip: onset at 0.8 s after the answer, never
        # earlier (later only if the caller's loop woke late).
        assert barge.onset_s >= 0.8 - 0.001
        assert barge.outcome == "stopped"
        # The UAS stops its tone on the first speech frame it hears (how fast: bench_bargein),
        # and the caller received exactly the tone frames sent before that.
        assert barge.barge_in_ms is not None and barge.stopped_s is not None
        assert barge.stopped_s >= barge.onset_s
        assert uas.tone_stopped_frame is not None and uas.tone_stopped_frame >= 40
        assert report.speech_frames_received == uas.tone_frames_sent
        skipped = uas.last_frame + 1 - uas.frames_sent  # frames its clock skipped, if any
        assert uas.tone_stopped_frame - skipped <= uas.tone_frames_sent <= uas.tone_stopped_frame

    asyncio.run(main())


def test_caller_rtp_port_is_even_and_a_wrong_rtp_source_is_reported() -> None:
    async def main() -> None:
        uas = ToneUas(odd_source=True)
        port = await uas.start()
        try:
            opts = CallerOptions(target=f"sip:bot@127.0.0.1:{port}", duration_s=0.5)
            result = await asyncio.wait_for(place_call(opts), TIMEOUT_S)
        finally:
            uas.close()
        assert uas.rtp is not None and uas.rtp.remote_addr is not None
        assert uas.rtp.remote_addr[1] % 2 == 0  # RFC 3550 §11
        report = build_report(result.recording)
        sdp_port = uas.rtp_t.get_extra_info("sockname")[1]
        source_port = uas.send_t.get_extra_info("sockname")[1]
        assert report.protocol_errors == (
            f"RTP comes from 127.0.0.1:{source_port}, the SDP answer named "
            f"127.0.0.1:{sdp_port} (we now send there)",
        )
        assert report.frames_received > 0  # still measured: the caller latched on

    asyncio.run(main())


def test_unanswered_call_reports_the_failure() -> None:
    async def main() -> None:
        # A UAS socket that never answers: the caller gives up after --duration.
        loop = asyncio.get_running_loop()
        silent, _ = await loop.create_datagram_endpoint(
            lambda: Datagrams(lambda data, addr: None), local_addr=("127.0.0.1", 0)
        )
        port = silent.get_extra_info("sockname")[1]
        try:
            opts = CallerOptions(target=f"sip:bot@127.0.0.1:{port}", duration_s=0.3)
            result = await asyncio.wait_for(place_call(opts), TIMEOUT_S)
        finally:
            silent.close()
        report = build_report(result.recording)
        assert not report.answered
        assert report.failure == "no answer within 0.3 s"
        assert report.setup_ms is None and report.frames_received == 0

    asyncio.run(main())


@pytest.mark.peers
@pytest.mark.needs("sipp")
def test_sipp_uas_answers_the_caller(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Interop with a real SIP stack: SIPp's built-in ``uas`` scenario, one call."""
    record = tmp_path / "sipp.wav"
    for _attempt in range(3):  # SIPp needs its port up front: a new one if it was taken
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
        probe.close()
        sipp = subprocess.Popen(
            ["sipp", "-sn", "uas", "-i", "127.0.0.1", "-p", str(port), "-m", "1", "-nostdin"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            # No wait for SIPp to bind: if the INVITE comes too early, Timer A retransmits it.
            argv = ["call", f"sip:service@127.0.0.1:{port}", "--duration", "1", "--json"]
            rc = cli_main([*argv, "--dtmf", "5@0.2", "--record", str(record)])
            code = sipp.wait(timeout=TIMEOUT_S)
        finally:
            if sipp.poll() is None:
                sipp.kill()
                sipp.wait()
        errors = sipp.stderr.read().decode(errors="replace") if sipp.stderr else ""
        if code == 0 or "already in use" not in errors:
            break
        capsys.readouterr()  # that attempt's report
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["answered"] is True
    assert report["setup_ms"] is not None and report["setup_ms"] > 0
    assert report["ended_by"] == "local-hangup" and report["dtmf_sent"] == "5"
    assert code == 0, errors  # SIPp counted one successful call: INVITE, ACK, BYE as scripted
    with wave.open(str(record), "rb") as wav:
        assert abs(wav.getnframes() - 8000) <= 160 * 2  # 1 s of what was heard (silence)

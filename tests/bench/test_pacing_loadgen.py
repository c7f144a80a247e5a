"""The pacing benchmark's measuring parts: grid fit, per-call figures, drift, and the UAS
that answers baresip (bench/loadgen/analysis.py, bench/loadgen/rtp.py)."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from bench.loadgen.analysis import (
    pacing_summary,
    per_call_figures,
    rtp_deviations_ns,
    rtp_gap_frames,
)
from bench.loadgen.rtp import RtpLoad
from bridge.engine import SendDatagram
from bridge.sip.events import OutboundCallAnswered
from bridge.sip.sdp import build_offer, negotiate, parse_sdp
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

MS = 1_000_000


def stream(
    n: int, ppm: float = 0.0, jitter_ms: np.ndarray | None = None
) -> tuple[list[int], list[int], list[int]]:
    """``n`` packets of one talkspurt sent on a 20 ms grid running ``ppm`` slow."""
    k = np.arange(n)
    arrival = 1_000 * MS + k * 20 * MS * (1 + ppm * 1e-6)
    if jitter_ms is not None:
        arrival = arrival + jitter_ms * MS
    ts = (4_294_960_000 + k * 160) % (1 << 32)  # wraps mid-stream
    marker = [1] + [0] * (n - 1)
    return [int(x) for x in arrival], [int(x) for x in ts], marker


def test_drift_of_a_slow_grid_is_reported_in_ms_per_minute() -> None:
    per = [rtp_deviations_ns(*stream(3000, ppm=100.0))]  # one minute
    [call] = per_call_figures(per)
    assert call["drift_ppm"] == pytest.approx(100.0, rel=1e-3)
    assert call["drift_ms_per_min"] == pytest.approx(6.0, rel=1e-3)
    summary = pacing_summary(per)
    assert summary["drift_ms_per_min_median"] == pytest.approx(6.0, rel=1e-3)
    # 100 ppm over 60 s is 6 ms end to end: +-3 ms around the talkspurt's median grid
    assert summary["max_ms"] == pytest.approx(3.0, rel=1e-2)


def test_per_call_figures_keep_each_call_apart() -> None:
    late = np.zeros(500)
    late[250] = 7.0  # one packet 7 ms late
    per = [rtp_deviations_ns(*stream(500)), rtp_deviations_ns(*stream(500, jitter_ms=late))]
    calls = per_call_figures(per)
    assert [c["max_ms"] for c in calls] == [0.0, 7.0]
    summary = pacing_summary(per)
    assert summary["calls"] == 2
    assert summary["max_ms"] == 7.0
    assert summary["call_max_ms_median"] == 3.5
    assert summary["call_p50_ms_median"] == 0.0


def test_a_talkspurt_is_anchored_on_its_marker_packet() -> None:
    arrival, ts, marker = stream(100)
    # a second talkspurt 3 ms off the first one's grid: its own anchor, no deviation
    arrival[50:] = [a + 3 * MS for a in arrival[50:]]
    marker[50] = 1
    _, dev = rtp_deviations_ns(arrival, ts, marker)
    assert not dev.any()


def test_an_early_first_packet_is_its_own_deviation_not_every_packets() -> None:
    arrival, ts, marker = stream(100)
    arrival[0] -= 4 * MS  # the talkspurt's first frame left 4 ms before the grid
    _, dev = rtp_deviations_ns(arrival, ts, marker)
    assert dev[0] == -4 * MS
    assert not dev[1:].any()


def test_frames_never_received_are_counted_from_rtp_timestamp_steps() -> None:
    _, ts, _ = stream(100)  # wraps mid-stream
    assert rtp_gap_frames(ts) == 0
    kept = ts[:10] + ts[13:50] + ts[51:]  # 3 frames skipped, then 1 lost
    assert rtp_gap_frames(kept) == 4
    assert rtp_gap_frames([*ts[:10], (ts[10] + 160 * 10_000) % (1 << 32)]) == 0  # new base


def _pump(ua: SipUserAgent, sock: socket.socket) -> list[object]:
    for action in ua.actions_to_send():
        if isinstance(action, SendDatagram):
            sock.sendto(action.data, action.addr)
    return list(ua.events_received())


def test_the_load_generator_answers_an_offered_call_and_timestamps_its_rtp() -> None:
    """The baresip baseline's path: a peer calls the load generator, which answers with SDP
    naming a measured socket; RTP sent there is recorded with its timestamp and marker."""
    load = RtpLoad(("127.0.0.1", 9), route="unused")
    load.accept_incoming = True
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.settimeout(0.05)
    port = peer.getsockname()[1]
    ua = SipUserAgent(SipSettings(local_host="127.0.0.1", local_port=port, transport="UDP"))
    try:
        host, sip_port = load.sip_addr
        offer = build_offer("127.0.0.1", port, 1, 1, ("PCMU",))
        ua.invite(f"sip:pace@{host}:{sip_port}", "sip:peer@127.0.0.1", offer, load.sip_addr, 0.0)
        answer = None
        deadline = time.monotonic() + 5
        while answer is None and time.monotonic() < deadline:
            _pump(ua, peer)
            load.run_for(0.02)
            try:
                data, addr = peer.recvfrom(65536)
            except TimeoutError:
                continue
            ua.receive_datagram(data, (addr[0], addr[1]), time.monotonic())
            for event in _pump(ua, peer):
                if isinstance(event, OutboundCallAnswered):
                    answer = event.answer_sdp
        assert answer is not None
        audio = negotiate(parse_sdp(answer), ("PCMU",))
        assert audio is not None and audio.remote_addr is not None
        [call] = load.calls
        assert audio.remote_addr == ("127.0.0.1", call.port)
        assert call.remote == ("127.0.0.1", port)

        load.recording = True
        before = time.monotonic_ns()
        for i in range(3):
            header = struct.pack("!BBHII", 0x80, 0x80 if i == 0 else 0, i, 160 * i, 7)
            peer.sendto(header + bytes(160), audio.remote_addr)
        load.run_for(0.1)
        assert list(call.rtp_ts) == [0, 160, 320]
        assert list(call.marker) == [1, 0, 0]
        assert all(before <= a <= time.monotonic_ns() for a in call.arrival_ns)
        # another stream sent to this port (an earlier call's, on a reused port) is not this
        # call's: it is counted, not put on this call's grid
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stray:
            stray.bind(("127.0.0.1", 0))
            to = audio.remote_addr
            stray.sendto(struct.pack("!BBHII", 0x80, 0, 9, 99_000, 8) + bytes(160), to)
            peer.sendto(struct.pack("!BBHII", 0x80, 0, 3, 480, 7) + bytes(160), to)
            load.run_for(0.1)
        assert list(call.rtp_ts) == [0, 160, 320, 480] and call.strays == 1
        # RTP sockets are read after each call's send slot, not waited on (no wake-up
        # charged to the sender): what arrived since is read when recording stops
        peer.sendto(struct.pack("!BBHII", 0x80, 0, 4, 640, 7) + bytes(160), to)
        load.recording = False
        assert list(call.rtp_ts) == [0, 160, 320, 480, 640]
    finally:
        load.close()
        peer.close()


def test_an_offered_call_is_declined_unless_the_load_generator_accepts() -> None:
    load = RtpLoad(("127.0.0.1", 9), route="unused")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.settimeout(0.05)
    port = peer.getsockname()[1]
    ua = SipUserAgent(SipSettings(local_host="127.0.0.1", local_port=port, transport="UDP"))
    try:
        host, sip_port = load.sip_addr
        offer = build_offer("127.0.0.1", port, 1, 1, ("PCMU",))
        ua.invite(f"sip:pace@{host}:{sip_port}", "sip:peer@127.0.0.1", offer, load.sip_addr, 0.0)
        statuses: list[str] = []
        deadline = time.monotonic() + 5
        while not statuses and time.monotonic() < deadline:
            _pump(ua, peer)
            load.run_for(0.02)
            try:
                data, _ = peer.recvfrom(65536)
            except TimeoutError:
                continue
            line = data.split(b"\r\n", 1)[0].decode()
            if not line.startswith("SIP/2.0 1"):
                statuses.append(line)
        assert statuses == ["SIP/2.0 603 Decline"]
        assert load.calls == []
    finally:
        load.close()
        peer.close()

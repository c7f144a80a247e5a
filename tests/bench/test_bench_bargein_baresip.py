"""The baresip barge-in bench's analysis: synthetic packet timelines, a hand-built pcap.

No clock and no peers: the wire capture is replaced by (time, level) lists and by a
pcap file built here, and the expected stop latencies follow from the definitions
(``bench/bench_bargein_baresip.py``: onset = the caller's first packet at or above
-40 dBFS; stop = the end of the bot's last speech packet before 0.5 s of none).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bench.bench_bargein_baresip import (
    Packet,
    after_tick_ms,
    pcmu_level_dbfs,
    read_pcap,
    stop_latency,
    timelines,
)
from telcodec import g711

LOUD = -12.0
QUIET = -90.0


def frames(start_s: float, end_s: float, level: float) -> list[tuple[float, float]]:
    """One packet per 20 ms in ``[start_s, end_s)`` at ``level``."""
    n = round((end_s - start_s) / 0.02)
    return [(round(start_s + i * 0.02, 6), level) for i in range(n)]


def test_the_stop_is_the_end_of_the_bots_last_speech_packet_after_the_onset() -> None:
    caller = frames(0.0, 2.0, QUIET) + frames(2.0, 3.5, LOUD)  # onset: the packet at 2.0 s
    # the bot talks in words with 40 ms gaps (two quiet packets), then stops at 2.1 s
    bot: list[tuple[float, float]] = []
    t = 0.0
    while t < 2.1 - 1e-9:
        bot += frames(t, min(t + 0.2, 2.1), LOUD)
        t = round(t + 0.2, 6)
        bot += frames(t, t + 0.04, QUIET)
        t = round(t + 0.04, 6)
    bot = [(at, level) for at, level in bot if at < 2.1] + frames(2.1, 4.0, QUIET)
    stop = stop_latency(caller, bot, ended_at_s=4.0)
    assert stop.outcome == "stopped"
    assert stop.onset_s == 2.0
    last_loud = max(at for at, level in bot if level >= -40.0)
    assert stop.stopped_s == pytest.approx(last_loud + 0.02)
    assert stop.barge_in_ms == pytest.approx((last_loud + 0.02 - 2.0) * 1000, abs=0.05)


def test_word_gaps_after_the_onset_do_not_count_as_the_stop() -> None:
    caller = frames(1.0, 1.5, LOUD)
    # loud to 1.1, a 100 ms pause (shorter than the 0.5 s hold), loud again 1.2-1.3, then quiet
    bot = frames(0.0, 1.1, LOUD) + frames(1.1, 1.2, QUIET) + frames(1.2, 1.3, LOUD)
    stop = stop_latency(caller, bot + frames(1.3, 3.0, QUIET), ended_at_s=3.0)
    assert stop.outcome == "stopped"
    assert stop.barge_in_ms == pytest.approx(300.0)  # the end of the packet at 1.28 s


def test_the_outcomes_without_a_latency() -> None:
    talking = frames(0.0, 5.0, LOUD)
    assert stop_latency(frames(0.0, 5.0, QUIET), talking, 5.0).outcome == "no-onset"
    # the bot silent for the 0.5 s before the onset
    quiet_bot = frames(0.0, 1.0, LOUD) + frames(1.0, 5.0, QUIET)
    not_speaking = stop_latency(frames(2.0, 3.0, LOUD), quiet_bot, 5.0)
    assert (not_speaking.outcome, not_speaking.barge_in_ms) == ("not-speaking", None)
    # it talks to the end of the capture, or stops too near the end to tell
    assert stop_latency(frames(2.0, 3.0, LOUD), talking, 5.0).outcome == "still-speaking"
    late = stop_latency(frames(2.0, 3.0, LOUD), frames(0.0, 4.7, LOUD), 5.0)
    assert late.outcome == "still-speaking"


def rtp(pt: int, payload: bytes) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, 1, 160, 0x1234) + payload


def loud_pcmu() -> bytes:
    t = np.arange(160) / 8000
    pcm = (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    return bytes(g711.ulaw_encode(pcm))


def test_levels_and_directions_of_one_calls_packets() -> None:
    silence = b"\xff" * 160  # mu-law zero
    assert pcmu_level_dbfs(rtp(0, loud_pcmu())) == pytest.approx(-15.2, abs=0.3)
    assert pcmu_level_dbfs(rtp(0, silence)) == -120.0
    assert pcmu_level_dbfs(rtp(101, b"\x01\x80\x00\xa0")) is None  # telephone-event
    assert pcmu_level_dbfs(b"probe") is None
    assert pcmu_level_dbfs(struct.pack("!BBH", 0x81, 200, 6) + b"\0" * 24) is None  # RTCP SR
    daemon = {40010}  # the call's RTP port
    packets = [
        Packet(1.0, 50000, 40010, rtp(0, loud_pcmu())),  # the caller
        Packet(1.01, 40010, 50000, rtp(0, silence)),  # the bot
        Packet(1.02, 40010, 50000, struct.pack("!BBH", 0x81, 200, 6) + b"\0" * 24),  # RTCP
        Packet(1.03, 50002, 40020, rtp(0, loud_pcmu())),  # another call on the host
        Packet(9.0, 50000, 40010, rtp(0, loud_pcmu())),  # outside the window
    ]
    caller, bot = timelines(packets, daemon, 0.5, 2.0)
    assert [t for t, _ in caller] == [1.0] and [t for t, _ in bot] == [1.01]
    assert bot[0][1] == -120.0


def test_read_pcap_gives_time_ports_and_payload() -> None:
    def record(at_s: float, src: int, dst: int, payload: bytes) -> bytes:
        udp = struct.pack("!HHHH", src, dst, 8 + len(payload), 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                         bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))  # fmt: skip
        frame = b"\0" * 12 + b"\x08\x00" + ip + udp  # Ethernet
        sec, usec = int(at_s), round((at_s - int(at_s)) * 1e6)
        return struct.pack("<IIII", sec, usec, len(frame), len(frame)) + frame

    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    data = header + record(10.25, 50000, 40010, b"abc") + record(10.5, 40010, 50000, b"de")
    packets = read_pcap(data)
    assert [(p.at_s, p.src_port, p.dst_port, p.payload) for p in packets] == [
        (10.25, 50000, 40010, b"abc"),
        (10.5, 40010, 50000, b"de"),
    ]
    with pytest.raises(ValueError):
        read_pcap(b"\0" * 24)


def test_how_long_after_the_daemons_tick_the_callers_packets_land() -> None:
    ticks = [round(0.02 * k, 6) for k in range(50)]
    caller = [round(t + 0.0025, 6) for t in ticks[5:]]  # 2.5 ms after each tick
    caller[3] += 0.015  # one late packet does not move the median
    assert after_tick_ms(caller, ticks) == pytest.approx(2.5)
    assert after_tick_ms(caller, []) is None
    assert after_tick_ms([5.0], ticks) is None  # long after the daemon's last packet

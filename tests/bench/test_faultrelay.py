"""The fault relay's pure parts: the seeded schedule and the SIP/SDP rewriting."""

from __future__ import annotations

import pytest

from bench.loadgen.faultrelay import (
    Faults,
    FaultSchedule,
    rewrite_contact,
    rewrite_sip,
    sdp_audio_port,
)

FAULTS = Faults(loss=0.1, duplicate=0.05, reorder=0.05, jitter_s=0.06, blackouts=((2.0, 4.0),))


def run(seed: int, name: str = "rtp:up", packets: int = 1000) -> list[list[float]]:
    schedule = FaultSchedule(FAULTS, seed, name, start=100.0)
    return [schedule.deliveries(100.0 + i * 0.02) for i in range(packets)]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_or_direction_another() -> None:
    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(7, "rtp:up") != run(7, "rtp:down")


def test_every_fault_happens_at_about_its_rate_and_the_blackout_drops_everything() -> None:
    schedule = FaultSchedule(FAULTS, 3, "x", start=0.0)
    out = [(i * 0.02, schedule.deliveries(i * 0.02)) for i in range(2000)]  # 40 s
    c = schedule.counters
    assert c.packets == 2000
    in_blackout = [copies for t, copies in out if 2.0 <= t < 4.0]
    assert len(in_blackout) == 100 and not any(in_blackout)
    assert c.blacked_out == 100
    outside = 1900
    assert 0.06 * outside < c.lost < 0.14 * outside
    assert 0.02 * outside < c.duplicated < 0.08 * outside
    assert 0.02 * outside < c.reordered < 0.08 * outside
    assert c.sent == outside - c.lost + c.duplicated
    for t, copies in out:
        for at in copies:  # never early, never later than jitter + reorder + duplicate jitter
            assert t <= at <= t + 0.06 + 0.045 + 0.06


def test_a_schedule_without_faults_passes_every_packet_once_at_once() -> None:
    schedule = FaultSchedule(Faults(), 1, "x", start=0.0)
    assert all(schedule.deliveries(t / 50) == [t / 50] for t in range(500))


@pytest.mark.parametrize("name", ["loss", "duplicate", "reorder"])
def test_a_probability_outside_zero_to_one_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"faults.{name}"):
        Faults(**{name: 1.5})  # type: ignore[arg-type]


def test_rewrite_sip_replaces_whole_ports_only_and_fixes_content_length() -> None:
    body = b"v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 40000 RTP/AVP 0\r\n"
    msg = (
        b"INVITE sip:a@127.0.0.1:5000 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:50001\r\n"
        b"Contact: <sip:c@127.0.0.1:5000>\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    out = rewrite_sip(
        msg,
        [
            (b"127.0.0.1:5000", b"127.0.0.3:6"),
            (b"m=audio 40000 ", b"m=audio 123456 "),
            (b"IN IP4 127.0.0.1", b"IN IP4 127.0.0.33"),
        ],
    )
    head, _, new_body = out.partition(b"\r\n\r\n")
    assert b"sip:a@127.0.0.3:6 SIP/2.0" in head and b"127.0.0.1:50001" in head
    assert new_body == b"v=0\r\nc=IN IP4 127.0.0.33\r\nm=audio 123456 RTP/AVP 0\r\n"
    assert head.endswith(b"Content-Length: %d" % len(new_body))
    assert sdp_audio_port(out) == 123456
    assert rewrite_contact(out, b"10.0.0.1:7").count(b"<sip:c@10.0.0.1:7>") == 1

"""SIP over TLS and SRTP (SDES) against real peers: baresip, and SIPp through HAProxy.

baresip (its ``srtp`` module, ``mediaenc=srtp-mand``: ``RTP/SAVP`` with
``a=crypto``) calls the daemon's TLS listener, verifying the daemon's
certificate against a CA made for the test; its recording holds the greeting,
and a tshark capture on loopback shows that no RTP payload of the call is the
G.711 either side sent (comfort silence is 160 bytes of 0xFF in the clear).
The Debian SIPp is built without TLS (``-t l1``: "you must compile SIPp with
OpenSSL"), so SIPp's TCP is carried over TLS by HAProxy (``ssl verify
required``), a real TLS client of the daemon's listener.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .harness import FACTOR, stack
from .test_sip_peers import (
    GREETING,
    ROUTES,
    Baresip,
    RtpPhone,
    SkippedFrames,
    _rtp_range,
    audible_segments_s,
    audible_span_s,
    free_udp_port,
    greeting_speech_s,
    prompt_played,
    read_pcap_udp,
    run,
    run_sipp,
    sip_leg,
    sipp_uac_args,
    wait_for,
)
from .test_sip_tls import tls_extra, tls_runner
from .tlscerts import Issued, make_ca_and_leaf

requires_baresip = pytest.mark.needs("baresip")
requires_tshark = pytest.mark.needs("tshark")
requires_root = pytest.mark.needs("root", why="capturing on lo with tshark (CI runs as root)")
requires_sipp = pytest.mark.needs("sipp")
requires_haproxy = pytest.mark.needs("haproxy")

SRTP_80_OVERHEAD_BYTES = 10
"""The HMAC-SHA1-80 tag each SRTP packet carries (baresip offers this suite first)."""
CLEAR_SILENCE = b"\xff" * 16
"""A run that plain PCMU comfort silence is made of; in ciphertext about 2^-128 likely."""


@dataclass
class TlsBaresip(Baresip):
    """baresip with the ``srtp`` module, the test CA, and an account that requires SRTP."""

    ca_file: Path = field(default_factory=Path)
    certificate: Path | None = None
    """Its own certificate and key in one PEM (to take calls on its TLS port, SIP + 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        config = self.workdir / "config"
        extra = f"module\t\t\tsrtp.so\nsip_cafile\t\t{self.ca_file}\n"
        if self.certificate is not None:
            extra += f"sip_certificate\t\t{self.certificate}\n"
        config.write_text(config.read_text() + extra)
        accounts = self.workdir / "accounts"
        line = accounts.read_text().strip().splitlines()[-1]
        accounts.write_text(line + ";mediaenc=srtp-mand\n")


async def start_capture(pcap: Path, port_range: str) -> asyncio.subprocess.Process:
    """tshark on lo for UDP in ``port_range`` (LOW-HIGH), once it captures."""
    lo, hi = (int(p) for p in port_range.split("-"))
    tshark = await asyncio.create_subprocess_exec(
        "tshark", "-i", "lo", "-f", f"udp portrange {lo}-{hi}", "-F", "pcap",
        "-w", str(pcap), "-q",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert tshark.stderr is not None
    started = b""
    while b"Capturing on" not in started:  # after a warning line when root
        line = await asyncio.wait_for(tshark.stderr.readline(), 10 * FACTOR)
        assert line, f"tshark did not start: {started!r}"
        started += line
    # it says so before its filter is attached: probe (not RTP) until it captures
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _ in range(int(200 * FACTOR)):
            if pcap.exists() and pcap.stat().st_size > 24:  # past the file header
                break
            probe.sendto(b"probe", ("127.0.0.1", hi))
            await asyncio.sleep(0.05)
        assert pcap.stat().st_size > 24, "tshark captured nothing"
    return tshark


async def stop_capture(tshark: asyncio.subprocess.Process) -> None:
    if tshark.returncode is None:
        tshark.send_signal(signal.SIGINT)
        await asyncio.wait_for(tshark.wait(), 10 * FACTOR)


@pytest.mark.peers
@requires_baresip
@requires_tshark
@requires_root
def test_baresip_calls_over_tls_with_srtp_hears_the_greeting_and_the_wire_has_no_clear_rtp(
    tmp_path: Path,
) -> None:
    certs = make_ca_and_leaf(tmp_path / "pki", "daemon")
    pcap = tmp_path / "srtp.pcap"
    rtp_range = _rtp_range()

    async def main() -> None:
        extra = tls_extra(certs, extra='srtp = "require"\n')
        async with stack(ROUTES, rtp=rtp_range, sip_extra=extra) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            tls_port = tls_runner(st).ua.settings.local_port
            phone = TlsBaresip(tmp_path / "baresip", ca_file=certs.ca_file)
            tshark = await start_capture(pcap, rtp_range)
            try:
                await phone.start(dial=f"sip:greet@127.0.0.1:{tls_port};transport=tls")
                established = await wait_for(lambda: phone.said("Call established"), 10.0)
                assert established, phone.explain()
                calls = list(leg.calls.values())
                assert len(calls) == 1 and calls[0].srtp is not None
                assert await wait_for(lambda: prompt_played(leg), 10.0)
                assert await wait_for(phone.heard_through, 10.0), phone.explain()
                # the daemon hears baresip: its SRTP verified and decrypted (baresip 1.0
                # also sends an RTCP APP packet in the clear, dropped: srtp_dropped)
                heard = calls[0].rtp.reception_stats()
                await phone.stop()  # baresip hangs up as it quits
                assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
            finally:
                await stop_capture(tshark)
        assert phone.said("SRTP is Enabled"), phone.explain()
        assert heard.received >= 20, heard
        segments = audible_segments_s(phone.received_pcm())
        assert len(segments) == 1, segments
        [(start_s, end_s)] = segments
        expected_s = greeting_speech_s(GREETING)
        assert abs((end_s - start_s) - expected_s) <= skips.slack(), (segments, expected_s)
        # the wire: RTP both ways, every payload ciphertext
        rtp = [data for _, data in read_pcap_udp(pcap) if data != b"probe" and len(data) >= 12]
        media = [data for data in rtp if data[0] >> 6 == 2 and not 192 <= data[1] <= 223]
        assert len(media) >= 100, len(media)
        assert not [data for data in media if CLEAR_SILENCE in data[12:]]
        sizes = {len(data) for data in media}
        assert sizes == {12 + 160 + SRTP_80_OVERHEAD_BYTES}, sizes

    run(main())


@pytest.mark.peers
@requires_baresip
def test_daemon_calls_baresip_over_tls_with_srtp_which_hears_the_greeting(tmp_path: Path) -> None:
    """The reverse direction: originate over TLS to baresip's TLS port (its certificate
    verified against tls_ca_file); RTP/SAVP offered, SRTP on both sides; baresip hangs
    up and its BYE reaches the daemon."""
    daemon_certs = make_ca_and_leaf(tmp_path / "pki", "daemon")
    phone_certs = make_ca_and_leaf(tmp_path / "pki", "phone")
    combined = tmp_path / "pki" / "phone-combined.pem"
    combined.write_bytes(phone_certs.cert_file.read_bytes() + phone_certs.key_file.read_bytes())
    combined.chmod(0o600)

    async def main() -> None:
        extra = tls_extra(daemon_certs, phone_certs.ca_file, 'srtp = "require"\n')
        async with stack(ROUTES, rtp=_rtp_range(), sip_extra=extra) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            phone = TlsBaresip(
                tmp_path / "baresip", ca_file=daemon_certs.ca_file, certificate=combined
            )
            await phone.start()
            # sip:;transport=tls, not sips: (libre 1.0 sends no in-dialog request to a
            # sips: Contact, ENOSYS: its BYE would never leave)
            target = f"sip:tester@127.0.0.1:{phone.sip_port + 1};transport=tls"
            call_id = leg.originate(target, "sip:callbridge@127.0.0.1", "greet")
            established = await wait_for(lambda: phone.said("Call established"), 10.0)
            assert established, phone.explain()
            assert leg.calls[call_id].srtp is not None
            assert await wait_for(lambda: prompt_played(leg), 10.0)
            assert await wait_for(phone.heard_through, 10.0), phone.explain()
            heard = leg.calls[call_id].rtp.reception_stats()
            await phone.command("hangup")  # (what comes back may be its CALL_CLOSED event)
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 5.0), phone.explain()
            await phone.stop()
        assert phone.said("SRTP is Enabled"), phone.explain()
        assert heard.received >= 20, heard
        segments = audible_segments_s(phone.received_pcm())
        assert len(segments) == 1, segments
        [(start_s, end_s)] = segments
        expected_s = greeting_speech_s(GREETING)
        assert abs((end_s - start_s) - expected_s) <= skips.slack(), (segments, expected_s)

    run(main())


HAPROXY_CFG = """global
    log stdout format raw local0 info
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend sip_tcp
    bind 127.0.0.1:{front}
    default_backend daemon_tls
backend daemon_tls
    server daemon 127.0.0.1:{tls_port} ssl verify required ca-file {ca_file} sni str(localhost)
"""


async def start_haproxy(
    workdir: Path, certs: Issued, tls_port: int
) -> tuple[int, asyncio.subprocess.Process]:
    """HAProxy taking plain TCP on a free port and carrying it over TLS to the daemon."""
    workdir.mkdir(parents=True, exist_ok=True)
    for _attempt in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            front = int(s.getsockname()[1])
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(front=front, tls_port=tls_port, ca_file=certs.ca_file))
        proc = await asyncio.create_subprocess_exec(
            "haproxy", "-db", "-f", str(cfg),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

        def listening(port: int = front) -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        up = await wait_for(lambda p=proc: p.returncode is not None or listening(), 10.0)  # type: ignore[misc]
        if up and proc.returncode is None:
            return front, proc
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    raise AssertionError("HAProxy did not start in 5 attempts")


@pytest.mark.peers
@requires_sipp
@requires_haproxy
def test_sipp_places_a_call_over_the_tls_listener_through_haproxy(tmp_path: Path) -> None:
    """SIPp (TCP, ``-t t1``) → HAProxy (TLS, verifying the daemon's certificate) → the
    daemon's TLS listener: INVITE/200/ACK, the greeting's RTP at the phone, BYE/200."""
    certs = make_ca_and_leaf(tmp_path / "pki", "daemon")

    async def main() -> None:
        async with stack(ROUTES, rtp=_rtp_range(), sip_extra=tls_extra(certs)) as st:
            leg = sip_leg(st)
            skips = SkippedFrames(leg)
            runner = tls_runner(st)
            front, haproxy = await start_haproxy(
                tmp_path / "haproxy", certs, runner.ua.settings.local_port
            )
            phone = await RtpPhone().open(free_udp_port())
            try:
                args = sipp_uac_args("uac_greeting.xml", front, "greet", rtp_port=phone.port)
                result = await run_sipp(tmp_path, "greet-tls", [*args, "-t", "t1", "-d", "2500"])
            finally:
                phone.close()
                haproxy.terminate()
                await haproxy.wait()
            assert result.returncode == 0, result.explain()
            assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
            # the daemon answered on its TLS listener (SIPp dialled sip:, not sips:)
            port = runner.ua.settings.local_port
            assert f"<sip:callbridge@127.0.0.1:{port};transport=tls>" in result.messages
            span = audible_span_s(phone.pcm())
            assert span is not None, "no audible RTP received"
            assert abs((span[1] - span[0]) - greeting_speech_s(GREETING)) <= skips.slack(), span
            assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)

    run(main())

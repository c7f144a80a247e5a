"""SRTP with SDES keys on the real daemon's SIP leg, over TLS, with a Python peer.

The peer offers ``RTP/SAVP`` with its own key over the TLS listener, keys its
SRTP from the answer, and hears the greeting only by decrypting it; the daemon
hears the peer's protected RTP, drops a forged packet, and logs neither key.
The CA and certificate are made per test (``tlscerts``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import secrets
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import structlog

from bridge.logs import configure
from bridge.rtp.srtp import SrtpContext
from bridge.sip.sdp import SdesCrypto, build_offer, parse_sdp
from telcodec import g711

from .harness import FACTOR, stack
from .test_sip_tls import ROUTES, SipStream, request, run, sip_leg, tls_extra, tls_runner, wait_for
from .tlscerts import make_ca_and_leaf


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def rtp(seq: int, ts: int, ssrc: int, payload: bytes) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, seq, ts, ssrc) + payload


def loud(packet: bytes) -> bool:
    pcm = np.frombuffer(g711.ulaw_decode(packet[12:]), dtype="<i2").astype(np.int32)
    return packet[1] & 0x7F == 0 and int(np.abs(pcm).max()) > 2000


def heard_through(plain: list[bytes], quiet_packets: int = 15) -> bool:
    """Some audible audio, then ``quiet_packets`` silent ones: the greeting was heard."""
    marks = [loud(p) for p in plain]
    return any(marks) and len(marks) - 1 - marks[::-1].index(True) >= quiet_packets + 1


def string_fields(value: object) -> Iterator[str]:
    """Every string in a parsed JSON log line (keys and values, nested)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from string_fields(v)
    elif isinstance(value, list):
        for v in value:
            yield from string_fields(v)


@pytest.mark.parametrize("suite", ["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"])
def test_an_srtp_call_over_tls_is_heard_only_decrypted_and_no_key_is_logged(
    tmp_path: Path, suite: str
) -> None:
    certs = make_ca_and_leaf(tmp_path, "daemon")
    ours = SdesCrypto.generate(1, secrets.token_bytes, suite)
    keys: list[str] = [base64.b64encode(ours.key_salt).decode()]
    buf = io.StringIO()

    async def body() -> None:
        extra = tls_extra(certs, extra='srtp = "require"\n')
        async with stack(ROUTES, sip_extra=extra) as s:
            leg = sip_leg(s)
            port = tls_runner(s).ua.settings.local_port
            media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            media.bind(("127.0.0.1", 0))
            media.setblocking(False)
            loop = asyncio.get_running_loop()
            context = ssl.create_default_context(cafile=str(certs.ca_file))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            peer = SipStream(reader, writer)
            uri = f"sips:greet@127.0.0.1:{port}"
            offer = build_offer("127.0.0.1", media.getsockname()[1], 1, 1, ("PCMU",), crypto=[ours])
            peer.send(request("INVITE", uri, "srtp-call", 1, body=offer))
            ok = await peer.final()
            assert ok.status == 200, ok
            answer = parse_sdp(ok.body.decode())
            [audio] = answer.media
            assert audio.proto == "RTP/SAVP"
            [theirs] = audio.crypto
            assert (theirs.tag, theirs.suite) == (1, suite) and theirs.key_salt != ours.key_salt
            keys.append(base64.b64encode(theirs.key_salt).decode())
            srtp = SrtpContext(ours, theirs)
            daemon_rtp = (answer.connection or "127.0.0.1", audio.port)
            to_tag = (ok.get("to") or "").split("tag=")[1]
            peer.send(request("ACK", uri, "srtp-call", 1, to_tag))

            raw: list[bytes] = []
            plain: list[bytes] = []
            silence = bytes([g711.ULAW_SILENCE]) * 160
            ssrc = secrets.randbits(32)
            t0 = loop.time()
            deadline = t0 + 15 * FACTOR
            n = 0
            # the peer's protected silence every 20 ms, reading the daemon's SRTP, until
            # the greeting was heard and then 0.3 s of the silence after it
            while not heard_through(plain) and loop.time() < deadline:
                media.sendto(srtp.protect(rtp(n, n * 160, ssrc, silence)), daemon_rtp)
                while True:
                    try:
                        packet = media.recv(2048)
                    except BlockingIOError:
                        break
                    raw.append(packet)
                    plain.append(srtp.unprotect(packet))  # raises if not our keys' SRTP
                n += 1
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - loop.time()))
            assert heard_through(plain), f"{len(plain)} packets, no whole greeting"
            call = leg.calls["srtp-call"]
            assert call.srtp is not None and call.srtp_dropped == 0
            assert call.rtp.reception_stats().received >= 10  # it hears the peer
            # a packet under another key: dropped before the RTP engine sees it
            forged = SrtpContext(SdesCrypto.generate(1, secrets.token_bytes, suite), theirs)
            received = call.rtp.reception_stats().received
            media.sendto(forged.protect(rtp(500, 500 * 160, ssrc, silence)), daemon_rtp)
            assert await wait_for(lambda: call.srtp_dropped == 1)
            assert call.rtp.reception_stats().received <= received + 5
            peer.send(request("BYE", uri, "srtp-call", 2, to_tag))
            assert (await peer.final()).status == 200
            writer.close()
            media.close()
            assert await wait_for(lambda: leg.ports.allocated_count == 0)
        # what the peer heard: the greeting, once decrypted; on the wire, not G.711 of it
        assert sum(loud(p) for p in plain) >= 10, "less than 0.2 s of the greeting heard"
        assert all(r[12 : 12 + 160] != p[12:] for r, p in zip(raw, plain, strict=True))
        assert all(
            len(r) == len(p) + (10 if suite.endswith("_80") else 4)
            for r, p in zip(raw, plain, strict=True)
        )

    configure("debug", "json", stream=buf)
    run(body())
    lines = [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]
    assert any(e.get("event") == "sip.listening" for e in lines)
    for line in lines:
        for text in string_fields(line):
            assert not any(key in text for key in keys), line.get("event")


def test_an_offer_with_sdes_keys_over_udp_is_refused_with_488(tmp_path: Path) -> None:
    """SDES keys sent in clear SIP are refused, whatever [sip] srtp says."""
    certs = make_ca_and_leaf(tmp_path, "daemon")
    key = SdesCrypto.generate(1, secrets.token_bytes)

    async def body() -> None:
        async with stack(ROUTES, sip_extra=tls_extra(certs, extra='srtp = "offer"\n')) as s:
            udp = next(r for r in sip_leg(s).runners if r.kind == "UDP")
            port = udp.ua.settings.local_port
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            offer = build_offer("127.0.0.1", 40000, 1, 1, crypto=[key])
            text = request("INVITE", f"sip:greet@127.0.0.1:{port}", "udp-sdes", 1, body=offer)
            text = text.replace(
                "SIP/2.0/TLS 127.0.0.1:5999", f"SIP/2.0/UDP 127.0.0.1:{sock.getsockname()[1]}"
            )
            loop = asyncio.get_running_loop()
            await loop.sock_sendto(sock, text.encode(), ("127.0.0.1", port))
            while True:
                data = await asyncio.wait_for(loop.sock_recv(sock, 65535), 5 * FACTOR)
                if not data.startswith(b"SIP/2.0 100"):
                    break
            sock.close()
            head = data.decode().split("\r\n")
            assert head[0] == "SIP/2.0 488 Not Acceptable Here"
            assert 'Warning: 399 callbridge "SDES keys (a=crypto) are taken over TLS only"' in head
            assert not sip_leg(s).calls

    run(body())


def test_a_reinvite_with_a_new_key_rekeys_what_the_daemon_accepts(tmp_path: Path) -> None:
    """RFC 4568 §7.1.4: the peer re-offers with a new key; the daemon answers with its
    own unchanged key and from then on takes the new key only."""
    certs = make_ca_and_leaf(tmp_path, "daemon")
    first, second = (SdesCrypto.generate(1, secrets.token_bytes) for _ in range(2))

    async def body() -> None:
        async with stack(ROUTES, sip_extra=tls_extra(certs, extra='srtp = "offer"\n')) as s:
            leg = sip_leg(s)
            port = tls_runner(s).ua.settings.local_port
            media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            media.bind(("127.0.0.1", 0))
            context = ssl.create_default_context(cafile=str(certs.ca_file))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            peer = SipStream(reader, writer)
            uri = f"sips:greet@127.0.0.1:{port}"
            local = media.getsockname()[1]
            offer = build_offer("127.0.0.1", local, 1, 1, ("PCMU",), crypto=[first])
            peer.send(request("INVITE", uri, "rekey", 1, body=offer))
            ok = await peer.final()
            answer = parse_sdp(ok.body.decode())
            [theirs] = answer.media[0].crypto
            daemon_rtp = ("127.0.0.1", answer.media[0].port)
            to_tag = (ok.get("to") or "").split("tag=")[1]
            peer.send(request("ACK", uri, "rekey", 1, to_tag))
            call = leg.calls["rekey"]
            silence = bytes([g711.ULAW_SILENCE]) * 160
            ssrc = secrets.randbits(32)

            def send(key: SdesCrypto, seqs: range) -> None:
                srtp = SrtpContext(key, theirs)
                for n in seqs:
                    media.sendto(srtp.protect(rtp(n, n * 160, ssrc, silence)), daemon_rtp)

            send(first, range(10))
            assert await wait_for(lambda: call.rtp.reception_stats().received >= 10)
            reoffer = build_offer("127.0.0.1", local, 1, 2, ("PCMU",), crypto=[second])
            peer.send(request("INVITE", uri, "rekey", 2, to_tag, body=reoffer))
            reanswered = await peer.final()
            assert reanswered.status == 200
            assert parse_sdp(reanswered.body.decode()).media[0].crypto == (theirs,)
            send(second, range(10, 20))
            assert await wait_for(lambda: call.rtp.reception_stats().received >= 20)
            assert call.srtp_dropped == 0
            send(first, range(20, 21))  # the old key is no longer taken
            assert await wait_for(lambda: call.srtp_dropped == 1)
            peer.send(request("ACK", uri, "rekey", 2, to_tag))
            peer.send(request("BYE", uri, "rekey", 3, to_tag))
            assert (await peer.final()).status == 200
            writer.close()
            media.close()

    run(body())

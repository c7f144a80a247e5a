"""A daemon whose listeners are all on port 0 (how these tests start it): SIP binds one
free port for UDP and TCP alike, and what it sends names that port, never 0.

Before the fix the SIP user agents' settings were built before their sockets were
bound, so a ``[sip] listen`` on port 0 advertised port 0 in its Contact and Via.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .conftest import FACTOR, daemon_config, listeners


def _invite(port: int, transport: str) -> bytes:
    branch = "z9hG4bK" + uuid.uuid4().hex[:16]
    sdp = (
        "v=0\r\no=t 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\n"
        "t=0 0\r\nm=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    return (
        f"INVITE sip:demo@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/{transport} 127.0.0.1:9;branch={branch};rport\r\n"
        f"From: <sip:t@127.0.0.1>;tag={uuid.uuid4().hex[:8]}\r\n"
        f"To: <sip:demo@127.0.0.1:{port}>\r\n"
        f"Call-ID: {uuid.uuid4().hex}@127.0.0.1\r\n"
        "CSeq: 1 INVITE\r\n"
        "Contact: <sip:t@127.0.0.1:9>\r\n"
        "Max-Forwards: 70\r\n"
        "Content-Type: application/sdp\r\n"
        f"Content-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def _final(read: Callable[[], bytes]) -> str:
    """The first final response ``read`` brings (provisional ones skipped)."""
    deadline = time.monotonic() + 20 * FACTOR
    buf = b""
    while time.monotonic() < deadline:
        buf += read()
        for m in re.finditer(rb"SIP/2\.0 (\d{3})[^\r]*\r\n(?:.+?\r\n)*?\r\n", buf, re.S):
            if int(m.group(1)) >= 200:
                return m.group(0).decode()
    raise AssertionError(f"no final response: {buf[-500:]!r}")


def _header(response: str, name: str) -> str:
    m = re.search(rf"^{name}:\s*(.+?)\r$", response, re.M | re.I)
    assert m, response
    return m.group(1)


def test_a_sip_listener_on_port_0_names_the_port_it_bound(
    tmp_path: Path, run_daemon: Callable[..., subprocess.Popen[bytes]]
) -> None:
    proc = run_daemon(daemon_config(tmp_path))
    ports = listeners(proc, timeout_s=60)
    assert ports.sip > 0 and ports.media_streams > 0 and ports.api > 0

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.5)
        udp.sendto(_invite(ports.sip, "UDP"), ("127.0.0.1", ports.sip))

        def read_udp() -> bytes:
            try:
                return udp.recv(65535)
            except TimeoutError:
                return b""

        ok = _final(read_udp)
    assert ok.startswith("SIP/2.0 200"), ok
    assert re.fullmatch(rf"<sip:callbridge@127\.0\.0\.1:{ports.sip}>", _header(ok, "Contact"))

    with socket.create_connection(("127.0.0.1", ports.sip), 10 * FACTOR) as tcp:
        tcp.settimeout(0.5)
        tcp.sendall(_invite(ports.sip, "TCP"))

        def read_tcp() -> bytes:
            try:
                return tcp.recv(65535)
            except TimeoutError:
                return b""

        ok = _final(read_tcp)
    assert ok.startswith("SIP/2.0 200"), ok
    contact = _header(ok, "Contact")
    assert re.fullmatch(rf"<sip:callbridge@127\.0\.0\.1:{ports.sip};transport=tcp>", contact)

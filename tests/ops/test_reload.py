"""SIGHUP applies what can change live and refuses what cannot, and systemd's state stays right.

The real daemon as a process, with a fake systemd's notify socket. A reload
takes a revoked digest password and a narrowed ``[sip] allow`` at once; a
reload that changes a listener is refused whole (``daemon.reload_refused``
naming the key; nothing of that file applies); every ``RELOADING=1`` is
followed by ``READY=1``, the rejected and refused ones included.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

from bridge.sip.digest import authorization, choose_challenge

from .conftest import FACTOR, daemon_config, listeners
from .test_systemd import NotifyReceiver, _not_ready


def _connect(port: int, source: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), 10 * FACTOR, (source, 0))
    s.settimeout(10 * FACTOR)
    return s


def _read_response(s: socket.socket, buf: bytearray) -> tuple[int, dict[str, list[str]]]:
    """The next final response on ``s`` (provisional ones skipped): status, headers."""
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, "the daemon closed the connection"
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        headers: dict[str, list[str]] = {}
        for line in head.decode().split("\r\n")[1:]:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        length = int(headers.get("content-length", ["0"])[0])
        while len(rest) < length:
            chunk = s.recv(65536)
            assert chunk, "the daemon closed the connection"
            rest += chunk
        del buf[:]
        buf += rest[length:]
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            return status, headers


def _invite(
    s: socket.socket, buf: bytearray, port: int, source: str, auth: str | None, cseq: int
) -> tuple[int, dict[str, list[str]]]:
    """An INVITE to a user no route matches (accepted: 404; challenged: 401), then its ACK."""
    uri = f"sip:nobody@127.0.0.1:{port};transport=tcp"
    branch = f"z9hG4bK-{uuid.uuid4().hex}"
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    common = (
        f"Via: SIP/2.0/TCP {source}:5999;branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:alice@{source}>;tag=a{cseq}\r\n"
        f"To: <sip:nobody@127.0.0.1:{port}>\r\n"
        f"Call-ID: reload-{cseq}-{source}\r\n"
    )
    lines = (
        f"INVITE {uri} SIP/2.0\r\n{common}CSeq: {cseq} INVITE\r\n"
        f"Contact: <sip:alice@{source}:5999;transport=tcp>\r\n"
        + (f"Authorization: {auth}\r\n" if auth else "")
        + f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    )
    s.sendall(lines.encode())
    status, headers = _read_response(s, buf)
    to = headers.get("to", [""])[0]
    ack = (
        f"ACK {uri} SIP/2.0\r\n{common.replace(f'To: <sip:nobody@127.0.0.1:{port}>', f'To: {to}')}"
    )
    s.sendall(f"{ack}CSeq: {cseq} ACK\r\nContent-Length: 0\r\n\r\n".encode())
    return status, headers


def _invite_as_alice(port: int, source: str, password: str, cseq: int) -> int:
    """Challenged, then answered with ``password``: the final status of the second INVITE."""
    with _connect(port, source) as s:
        buf = bytearray()
        status, headers = _invite(s, buf, port, source, None, cseq)
        assert status == 401, status
        challenge = choose_challenge(headers["www-authenticate"])
        assert challenge is not None
        auth = authorization(
            challenge,
            username="alice",
            password=password,
            method="INVITE",
            uri=f"sip:nobody@127.0.0.1:{port};transport=tcp",
            cnonce=uuid.uuid4().hex[:16],
        )
        return _invite(s, buf, port, source, auth, cseq + 1)[0]


def _closed_at_accept(port: int, source: str) -> bool:
    with _connect(port, source) as s:
        try:
            return s.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def _with(cfg: str, allow: str, password: str) -> str:
    sip = cfg.index("[sip]\n") + len("[sip]\n")
    extra = f'allow = ["{allow}"]\n'
    text = cfg[:sip] + extra + cfg[sip:]
    return text + f'\n[sip.auth.users]\nalice = "{password}"\n'


def test_reload_applies_allow_and_auth_refuses_listener_changes_and_always_reports_ready(
    tmp_path: Path, run_daemon: Callable[..., subprocess.Popen[bytes]]
) -> None:
    path = daemon_config(tmp_path)
    base = path.read_text().replace('match = "*"', 'match = "demo"')
    path.write_text(_with(base, "127.0.0.0/8", "pw1"))
    rx = NotifyReceiver(tmp_path / "notify.sock")
    proc = run_daemon(path, {"NOTIFY_SOCKET": str(rx.path)})
    out = ""
    try:
        rx.poll(lambda: rx.seen("READY") >= 1 or proc.poll() is not None, 60)
        assert rx.seen("READY") == 1, _not_ready(proc, rx)
        sip = listeners(proc).sip
        assert _invite_as_alice(sip, "127.0.0.1", "pw1", 1) == 404  # accepted, then no route

        def reload(text: str) -> dict[str, str]:
            path.write_text(text)
            readies = rx.seen("READY")
            proc.send_signal(signal.SIGHUP)
            rx.poll(lambda: rx.seen("READY") > readies, 30)
            assert rx.seen("READY") == readies + 1, rx.messages
            return next(m for _, m in reversed(rx.messages) if "READY" in m)

        # the password is revoked, allow narrowed and the log level raised: all three
        # hold from the next request (and line) on
        quiet = base.replace("[daemon]\n", '[daemon]\nlog_level = "warning"\n')
        done = reload(_with(quiet, "127.0.0.2/32", "pw2"))
        assert "reload" not in done["STATUS"], done
        assert _invite_as_alice(sip, "127.0.0.2", "pw1", 3) == 401
        assert _invite_as_alice(sip, "127.0.0.2", "pw2", 5) == 404
        assert _closed_at_accept(sip, "127.0.0.1")

        # a changed listener: refused whole, the old config stays (allow included)
        moved = _with(quiet, "127.0.0.0/8", "pw2").replace(
            '[api]\nlisten = "127.0.0.1:0"', '[api]\nlisten = "127.0.0.2:0"'
        )
        done = reload(moved)
        assert "refused" in done["STATUS"] and "api.listen" in done["STATUS"], done
        assert _closed_at_accept(sip, "127.0.0.1")

        # an invalid file: rejected, and systemd still hears READY=1
        done = reload(base.replace('protocol = "kova"', 'protocol = "kovaa"'))
        assert "rejected" in done["STATUS"], done
        assert _invite_as_alice(sip, "127.0.0.2", "pw2", 7) == 404

        # every RELOADING=1 was followed by a READY=1
        kinds = [
            "R" if "RELOADING" in m else "Y"
            for _, m in rx.messages
            if "RELOADING" in m or "READY" in m
        ]
        assert kinds == ["Y", "R", "Y", "R", "Y", "R", "Y"], kinds
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30 * FACTOR) == 0
    finally:
        rx.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    refused = [line for line in lines if line.get("event") == "daemon.reload_refused"]
    assert [r["key"] for r in refused] == ["api.listen"], refused
    events = [line.get("event") for line in lines]
    assert "daemon.ready" in events  # at info, before the reload raised the level
    assert "config.reloaded" not in events  # at info, after it
    assert "pw1" not in out and "pw2" not in out  # the passwords never reach the log

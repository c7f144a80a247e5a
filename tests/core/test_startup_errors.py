"""``callbridge serve`` start-up failures a user can cause (issue 31): one line naming the key,
the address and the cause, a distinct exit status (``bridge.io.startup``), no traceback.

Every occupied port is really occupied: the test binds port 0, keeps the socket, and
configures the port it got.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.config import parse_config
from bridge.io import daemon as daemon_module
from bridge.io.embedded import EmbeddedTts
from bridge.io.startup import EXIT_CONFIG, EXIT_EMBEDDED, EXIT_LISTEN, listen_error

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
ROOT = Path(__file__).resolve().parents[2]

PROVIDER = """
[providers.main]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"

[[routes]]
match = "*"
provider = "main"
"""


def config(sip: str = "", media_streams: str = "", api: str = "", provider: str = PROVIDER) -> str:
    return f"""
[daemon]
log_format = "json"
event_loop = "asyncio"

[sip]
{sip or "enabled = false"}

[media_streams]
{media_streams or "enabled = false"}

[api]
{api or "enabled = false"}
{provider}
"""


def serve(
    directory: Path, text: str, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    path = directory / "callbridge.toml"
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'codecs'}", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60 * FACTOR,
        env=env,
        cwd=directory,
        preexec_fn=preexec,
    )


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def udp_taken() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.fixture
def tcp_taken() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_sip_port_names_the_key_address_and_cause(tmp_path: Path, udp_taken: int) -> None:
    sip = f'listen = "127.0.0.1:{udp_taken}"\ntransports = ["udp"]'
    done = serve(tmp_path, config(sip=sip))
    assert error_lines(done) == [
        f"error: sip.listen: 127.0.0.1:{udp_taken} (udp): address already in use"
    ]
    assert done.returncode == EXIT_LISTEN


def test_a_taken_sip_tcp_port_after_a_good_one_names_the_one_that_failed(
    tmp_path: Path, udp_taken: int, tcp_taken: int
) -> None:
    sip = f'listen = ["127.0.0.1:0", "127.0.0.1:{tcp_taken}"]\ntransports = ["tcp"]'
    done = serve(tmp_path, config(sip=sip))
    assert error_lines(done) == [
        f"error: sip.listen: 127.0.0.1:{tcp_taken} (tcp): address already in use"
    ]
    assert done.returncode == EXIT_LISTEN


def test_a_taken_api_port(tmp_path: Path, tcp_taken: int) -> None:
    done = serve(tmp_path, config(api=f'listen = "127.0.0.1:{tcp_taken}"'))
    assert error_lines(done) == [
        f"error: api.listen: 127.0.0.1:{tcp_taken} (tcp): address already in use"
    ]
    assert done.returncode == EXIT_LISTEN


def test_a_taken_media_stream_port(tmp_path: Path, tcp_taken: int) -> None:
    done = serve(tmp_path, config(media_streams=f'listen = "127.0.0.1:{tcp_taken}"'))
    assert error_lines(done) == [
        f"error: media_streams.listen: 127.0.0.1:{tcp_taken} (tcp): address already in use"
    ]
    assert done.returncode == EXIT_LISTEN


def test_an_address_not_of_this_host(tmp_path: Path) -> None:
    public = (  # TEST-NET-1, with the credential a public listener needs
        'listen = "192.0.2.1:8080"\nstream_token = "0123456789abcdef"\n'
        'public_url = "wss://bridge.example.com"'
    )
    done = serve(tmp_path, config(media_streams=public))
    assert error_lines(done) == [
        "error: media_streams.listen: 192.0.2.1:8080 (tcp): cannot assign requested address "
        "(not an address of this host)"
    ]
    assert done.returncode == EXIT_LISTEN


def _privileged_port_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


CAP_NET_BIND_SERVICE = 10
PR_CAPBSET_DROP = 24


def _without_bind_capability() -> None:
    """In the child before exec: drop CAP_NET_BIND_SERVICE from the bounding set, so the
    daemon runs (even as root) as a service without the capability does."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_NET_BIND_SERVICE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.skipif(_privileged_port_start() <= 1, reason="this kernel lets anyone bind every port")
def test_a_privileged_port_without_the_capability(tmp_path: Path) -> None:
    """As root the daemon runs without CAP_NET_BIND_SERVICE (root may bind any port)."""
    port = min(1023, _privileged_port_start() - 1)
    preexec = _without_bind_capability if os.geteuid() == 0 else None
    if preexec is not None:
        try:
            subprocess.run([sys.executable, "-c", "pass"], preexec_fn=preexec, check=True)
        except subprocess.SubprocessError:
            pytest.skip("root here, and the capability cannot be dropped (no CAP_SETPCAP)")
    sip = f'listen = "127.0.0.1:{port}"\ntransports = ["udp"]'
    done = serve(tmp_path, config(sip=sip), preexec)
    assert error_lines(done) == [
        f"error: sip.listen: 127.0.0.1:{port} (udp): permission denied "
        "(ports below 1024 need CAP_NET_BIND_SERVICE (docs/deployment.md))"
    ]
    assert done.returncode == EXIT_LISTEN


def test_an_unreadable_secret_file_is_a_config_error(tmp_path: Path) -> None:
    provider = PROVIDER.replace('url = "ws', f'api_key_file = "{tmp_path}/missing.key"\nurl = "ws')
    done = serve(tmp_path, config(provider=provider))
    assert error_lines(done) == [
        f"error: providers.main.api_key_file: cannot read '{tmp_path}/missing.key': "
        "No such file or directory"
    ]
    assert done.returncode == EXIT_CONFIG


def test_an_embedded_tts_that_does_not_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The child's failure itself is simulated (``EmbeddedTts._spawn`` raises as it does
    when ``tts-server`` exits early); the daemon's handling of it is the real one."""

    async def failing_spawn(self: Any) -> None:
        raise RuntimeError("tts-server exited with 1")

    monkeypatch.setattr(EmbeddedTts, "_spawn", failing_spawn)
    # the process-wide logging set-up would bind this test's captured stderr for good
    monkeypatch.setattr(daemon_module, "configure", lambda *args, **kwargs: None)
    text = config(provider=PROVIDER.replace('"ws://127.0.0.1:1/v1/ws/kova"', '"embedded"'))
    status = daemon_module.run_daemon(parse_config(text, "t.toml"))
    assert status == EXIT_EMBEDDED
    err = capsys.readouterr().err
    assert "error: providers.main.url: the embedded TTS server did not start: " in err
    assert "tts-server exited with 1" in err
    assert "Traceback" not in err


def test_the_exit_statuses_differ() -> None:
    assert len({EXIT_CONFIG, EXIT_LISTEN, EXIT_EMBEDDED, 0, 1}) == 5


def test_a_resolver_error_keeps_its_own_text() -> None:
    error = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert str(listen_error("sip.listen", "nosuch.invalid:5060", "udp", error)) == (
        "sip.listen: nosuch.invalid:5060 (udp): name or service not known"
    )
    assert listen_error("api.listen", "x:1", "tcp", OSError(errno.EADDRINUSE, "x")).exit_status == 3

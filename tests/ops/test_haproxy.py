"""Media-stream WebSockets behind HAProxy (config/haproxy/haproxy.cfg, unchanged).

HAProxy checks each node's ``GET /readyz`` on its API port; a node that
drains (503) gets no new WebSocket upgrades while its established streams
continue. Two kinds of node, as in test_scaleout.py:
  * ``WsNode``: a WebSocket server plus a ``/readyz`` endpoint with the
    daemon's drain behaviour, to test the HAProxy configuration itself;
  * real callbridge daemons: the end-to-end test, which skips with the reason
    "media-stream leg not wired into the daemon" only while a daemon's
    media-stream port refuses connections.
"""

from __future__ import annotations

import contextlib
import csv
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import Server, ServerConnection, serve

from .conftest import FACTOR, daemon_config, free_port, listeners
from .scaleout import (
    ROOT,
    START_ATTEMPTS,
    address_in_use,
    http_get,
    metric_sum,
    stop_process,
    wait_until,
)

HAPROXY_CFG = ROOT / "config" / "haproxy" / "haproxy.cfg"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.peers,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed"),
]


class WsNode:
    """A WebSocket node: every message is echoed prefixed with the node name;
    ``/readyz`` on a separate API port answers 200, or 503 while draining."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.draining = False
        self.refusing = False
        """Refuse new upgrades with 503 (a drain its health check has not seen yet)."""
        self.refused = 0
        self.streams = 0
        """Upgrades accepted: counted before the 101 is sent (so a client that has its
        101 is counted), under a lock (each connection has its own thread)."""
        lock = threading.Lock()
        node = self

        def handler(ws: ServerConnection) -> None:
            for msg in ws:
                ws.send(f"{node.name}:{msg!s}")

        def process_request(ws: ServerConnection, request: Request) -> Response | None:
            with lock:
                if node.refusing or node.draining:
                    node.refused += 1
                    return ws.respond(503, "draining\n")
                node.streams += 1
            return None

        self.ws: Server = serve(handler, "127.0.0.1", 0, process_request=process_request)
        self.port: int = self.ws.socket.getsockname()[1]

        class Ready(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = 503 if node.draining else 200
                body = b'{"ready": false}' if node.draining else b'{"ready": true}'
                self.send_response(code if self.path == "/readyz" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
        self.api_port: int = self.api.server_address[1]
        self._threads = [
            threading.Thread(target=self.ws.serve_forever, daemon=True),
            threading.Thread(target=self.api.serve_forever, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.ws.shutdown()
        self.api.shutdown()
        self.api.server_close()
        for t in self._threads:
            t.join(5)


@dataclass
class HaProxy:
    proc: subprocess.Popen[bytes]
    port: int
    admin: Path
    log: Path

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the media backend: server name -> its CSV row."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(self.admin))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode().lstrip("# ").splitlines()
        rows = csv.DictReader(line for line in lines if line)
        return {r["svname"]: r for r in rows if r["pxname"] == "callbridge_media"}

    def status(self, server: str) -> str:
        return self.servers().get(server, {}).get("status", "")

    def answers(self) -> bool:
        """Whether it answers ``show stat`` (it has bound every listener by then)."""
        try:
            return bool(self.servers())
        except OSError:
            return False


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[[list[tuple[int, int]]], HaProxy]]:
    started: list[HaProxy] = []

    def start(nodes: list[tuple[int, int]]) -> HaProxy:
        """HAProxy on ports free a moment ago, once it answers on its admin socket (a
        port taken meanwhile: it exits saying so, and is started again on others)."""
        for attempt in range(START_ATTEMPTS):
            h = start_once(nodes)
            up = wait_until(lambda h=h: h.proc.poll() is not None or h.answers(), 10)
            if up and h.proc.poll() is None:
                started.append(h)
                return h
            stop_process(h.proc)
            text = h.log.read_text(errors="replace")
            if not address_in_use(text) or attempt == START_ATTEMPTS - 1:
                raise AssertionError(f"haproxy did not start:\n{text[-3000:]}")
        raise AssertionError("unreachable")

    def start_once(nodes: list[tuple[int, int]]) -> HaProxy:
        (a_port, a_api), (b_port, b_api) = nodes
        port = free_port()
        env = {
            **os.environ,
            "CB_HAPROXY_BIND": f"127.0.0.1:{port}",
            "CB_HAPROXY_STATS": f"127.0.0.1:{free_port()}",
            "CB_HAPROXY_RUNDIR": str(tmp_path),
            "CB_HAPROXY_MAXCONN": "1000",
            "CB_NODE_A": f"127.0.0.1:{a_port}",
            "CB_NODE_A_API": str(a_api),
            "CB_NODE_B": f"127.0.0.1:{b_port}",
            "CB_NODE_B_API": str(b_api),
        }
        log = tmp_path / "haproxy.log"
        admin = tmp_path / "callbridge-admin.sock"
        admin.unlink(missing_ok=True)  # a failed start's socket file
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(HAPROXY_CFG)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return HaProxy(proc, port, admin, log)

    yield start
    for h in started:
        stop_process(h.proc)


@pytest.fixture
def nodes() -> Iterator[list[WsNode]]:
    pair = [WsNode("a"), WsNode("b")]
    yield pair
    for n in pair:
        n.close()


def test_config_checks() -> None:
    out = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Configuration file is valid" in out.stdout + out.stderr
    assert "warning" not in (out.stdout + out.stderr).lower()


@pytest.fixture
def ws_open() -> Iterator[Callable[[str], ClientConnection]]:
    """Open WebSocket clients that are all closed at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda url: stack.enter_context(connect(url))


def _echo(ws: ClientConnection, text: str) -> str:
    ws.send(text)
    return str(ws.recv(timeout=5 * FACTOR))


def test_draining_node_gets_no_new_streams_and_keeps_its_own(
    haproxy: Callable[[list[tuple[int, int]]], HaProxy],
    nodes: list[WsNode],
    ws_open: Callable[[str], ClientConnection],
) -> None:
    a, b = nodes
    h = haproxy([(a.port, a.api_port), (b.port, b.api_port)])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "UP", 10), h.servers()

    # leastconn spreads four streams two and two
    streams = [ws_open(f"ws://127.0.0.1:{h.port}/twilio") for _ in range(4)]
    owners = [_echo(ws, "hello").split(":")[0] for ws in streams]
    assert sorted(owners) == ["a", "a", "b", "b"]

    a.draining = True
    assert wait_until(lambda: h.status("node-a") == "DOWN", 5), h.servers()
    assert h.status("node-b") == "UP"

    # new upgrades all go to b; a's established streams still carry messages
    new = [ws_open(f"ws://127.0.0.1:{h.port}/twilio") for _ in range(3)]
    assert [_echo(ws, "new").split(":")[0] for ws in new] == ["b", "b", "b"]
    for ws, owner in zip(streams, owners, strict=True):
        assert _echo(ws, "still there") == f"{owner}:still there"
    assert a.streams == 2 and b.streams == 5

    # a node that comes back gets streams again after `rise` good checks
    a.draining = False
    assert wait_until(lambda: h.status("node-a") == "UP", 5), h.servers()
    back = ws_open(f"ws://127.0.0.1:{h.port}/twilio")
    assert _echo(back, "x") == "a:x", "leastconn picks the node with fewer streams"


def upgrades_every_20ms(
    url: str,
    count: int,
    stack: contextlib.ExitStack,
    at: dict[int, Callable[[list[ClientConnection]], None]],
) -> list[int]:
    """Open `count` WebSockets, one every 20 ms (on a grid: a slow upgrade does
    not push the next ones back), kept open in `stack`; `at[n]` runs just before
    upgrade n with the streams open so far. The status each got: 101, or the
    refusal's HTTP status."""
    statuses = []
    opened: list[ClientConnection] = []
    start = time.monotonic()
    for n in range(count):
        if n in at:
            at[n](opened)
            start = time.monotonic() - n * 0.020
        try:
            opened.append(stack.enter_context(connect(url, open_timeout=10 * FACTOR)))
            statuses.append(101)
        except InvalidStatus as e:
            statuses.append(e.response.status_code)
        time.sleep(max(0.0, start + (n + 1) * 0.020 - time.monotonic()))
    return statuses


def twilio_start(ws: ClientConnection, n: int) -> None:
    """Make a Twilio stream a call: ``connected`` then ``start``."""
    ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
    start = {
        "streamSid": f"MZ{n}",
        "callSid": f"CA{n}",
        "accountSid": "AC1",
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }
    ws.send(
        json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": f"MZ{n}", "start": start})
    )


def test_upgrades_refused_by_a_draining_node_go_to_the_other_node(
    haproxy: Callable[[list[tuple[int, int]]], HaProxy], nodes: list[WsNode]
) -> None:
    """Between a node's SIGTERM and the check that marks it down, its 503s to new
    upgrades are retried on the other node: not one reaches the carrier."""
    a, b = nodes
    h = haproxy([(a.port, a.api_port), (b.port, b.api_port)])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "UP", 10), h.servers()
    url = f"ws://127.0.0.1:{h.port}/twilio"

    def sigterm(_: list[ClientConnection]) -> None:  # refused at once; the check says 200
        a.refusing = True

    with contextlib.ExitStack() as stack:
        statuses = upgrades_every_20ms(url, 60, stack, {10: sigterm})
        assert statuses == [101] * 60, statuses
        assert h.status("node-a") == "UP", "the check never saw the drain: HAProxy retried"
        # leastconn kept choosing node a (it holds fewer streams): every upgrade
        # after the drain was refused there once and went to node b
        assert a.refused >= 1 and a.streams + b.streams == 60
        assert a.streams <= 10 and b.streams == 60 - a.streams
        wredis = {n: int(r["wredis"]) for n, r in h.servers().items() if n.startswith("node-")}
        assert wredis["node-a"] == a.refused, (wredis, a.refused)


def test_unknown_paths_are_refused_at_the_proxy(
    haproxy: Callable[[list[tuple[int, int]]], HaProxy], nodes: list[WsNode]
) -> None:
    a, b = nodes
    h = haproxy([(a.port, a.api_port), (b.port, b.api_port)])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "UP", 10)
    assert http_get(f"http://127.0.0.1:{h.port}/v1/calls")[0] == 404
    with pytest.raises(InvalidStatus) as e, connect(f"ws://127.0.0.1:{h.port}/admin"):
        pass
    assert e.value.response.status_code == 404
    assert a.streams == b.streams == 0


def test_no_node_up_refuses_upgrades(
    haproxy: Callable[[list[tuple[int, int]]], HaProxy], nodes: list[WsNode]
) -> None:
    a, b = nodes
    a.draining = b.draining = True
    h = haproxy([(a.port, a.api_port), (b.port, b.api_port)])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "DOWN", 10)
    with pytest.raises(InvalidStatus) as e, connect(f"ws://127.0.0.1:{h.port}/twilio"):
        pass
    assert e.value.response.status_code == 503


# ------------------------------------------------------- the real daemons


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_two_daemons_behind_haproxy_drain(
    tmp_path: Path,
    haproxy: Callable[[list[tuple[int, int]]], HaProxy],
    run_daemon: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """Needs the daemon's Twilio endpoint to accept an upgrade and keep the
    stream (a call) open until the client closes it."""
    daemons = []
    for i, name in enumerate("ab"):
        d = tmp_path / name
        d.mkdir()
        lo = 34000 + 1000 * i
        cfg = daemon_config(d, drain=60, rtp_lo=lo, rtp_hi=lo + 999)
        proc = run_daemon(cfg)
        ports = listeners(proc, timeout_s=60)
        daemons.append((proc, ports.api, ports.media_streams))
    for _proc, api, _ms in daemons:
        assert wait_until(lambda api=api: http_get(f"http://127.0.0.1:{api}/readyz")[0] == 200, 60)
    h = haproxy([(ms, api) for _proc, api, ms in daemons])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "UP", 10), h.servers()
    for _proc, _api, ms in daemons:
        assert not _refuses(ms), "the daemon refuses media-stream upgrades"

    (pa, api_a, _), (pb, api_b, _) = daemons
    url = f"ws://127.0.0.1:{h.port}/twilio"

    def active(api: int) -> float:
        text = http_get(f"http://127.0.0.1:{api}/metrics")[1]
        return metric_sum(text, "callbridge_calls_active")

    def call(stack: contextlib.ExitStack, n: int) -> ClientConnection:
        """A Twilio stream that becomes a call (``connected`` then ``start``)."""
        ws = stack.enter_context(connect(url))
        ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        start = {
            "streamSid": f"MZ{n}",
            "callSid": f"CA{n}",
            "accountSid": "AC1",
            "tracks": ["inbound"],
            "customParameters": {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        ws.send(
            json.dumps(
                {"event": "start", "sequenceNumber": "1", "streamSid": f"MZ{n}", "start": start}
            )
        )
        return ws

    with contextlib.ExitStack() as stack:
        # one call lands on each node (leastconn)
        first = [call(stack, n) for n in range(2)]
        assert wait_until(lambda: active(api_a) == 1 and active(api_b) == 1, 10)
        stot = {n: int(r["stot"]) for n, r in h.servers().items() if n.startswith("node-")}
        assert stot == {"node-a": 1, "node-b": 1}, stot

        pa.send_signal(signal.SIGTERM)  # drain: /readyz 503, the call continues
        assert wait_until(lambda: http_get(f"http://127.0.0.1:{api_a}/readyz")[0] == 503, 5)
        assert wait_until(lambda: h.status("node-a") == "DOWN", 5), h.servers()
        for n in range(2, 5):
            call(stack, n)
        assert wait_until(lambda: active(api_b) == 4, 10), active(api_b)
        after = {n: int(r["stot"]) for n, r in h.servers().items() if n.startswith("node-")}
        assert after == {"node-a": 1, "node-b": 4}, "new streams all went to node b"
        assert pa.poll() is None, "the draining daemon waits for its call"
        assert active(api_a) == 1
        assert all(ws.state.name == "OPEN" for ws in first)
    assert pa.wait(60 * FACTOR) == 0, "the drained daemon exits 0 once its call is over"
    assert pb.poll() is None


def test_new_streams_every_20ms_across_a_daemons_sigterm(
    tmp_path: Path,
    haproxy: Callable[[list[tuple[int, int]]], HaProxy],
    run_daemon: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """Upgrades every 20 ms through HAProxy while node a gets SIGTERM, without
    waiting for its check to mark it down: none is refused. The upgrades that
    reached node a between its drain and that check were refused there (its
    `draining` count) and redispatched by HAProxy (its `wredis` count)."""
    daemons = []
    for i, name in enumerate("ab"):
        d = tmp_path / name
        d.mkdir()
        lo = 35000 + 1000 * i
        cfg = daemon_config(d, drain=60, rtp_lo=lo, rtp_hi=lo + 999)
        # no overload refusals (lag guard off): on a loaded host both nodes could
        # refuse an upgrade for a reason that is not this test's
        cfg.write_text(cfg.read_text().replace("[daemon]\n", "[daemon]\nmax_loop_lag_ms = 0\n"))
        # node b's output (it takes most streams) goes to a file: a pipe left unread fills
        proc = run_daemon(cfg, log=d / "daemon.log" if name == "b" else None)
        ports = listeners(proc, timeout_s=60)
        daemons.append((proc, ports.api, ports.media_streams))
    for _proc, api, _ms in daemons:
        assert wait_until(lambda api=api: http_get(f"http://127.0.0.1:{api}/readyz")[0] == 200, 60)
    h = haproxy([(ms, api) for _proc, api, ms in daemons])
    assert wait_until(lambda: h.status("node-a") == h.status("node-b") == "UP", 10), h.servers()
    (pa, api_a, _), (pb, _, _) = daemons

    def draining_refusals() -> float:
        text = http_get(f"http://127.0.0.1:{api_a}/metrics")[1]
        return metric_sum(text, "callbridge_rejected_total", reason="draining")

    def active(api: int) -> float:
        return metric_sum(http_get(f"http://127.0.0.1:{api}/metrics")[1], "callbridge_calls_active")

    def sigterm(opened: list[ClientConnection]) -> None:
        # the streams so far become calls, so node a drains (and stays up) for its own
        for n, ws in enumerate(opened):
            twilio_start(ws, n)
        assert wait_until(lambda: active(api_a) >= 1, 10)
        pa.send_signal(signal.SIGTERM)

    with contextlib.ExitStack() as stack:
        statuses = upgrades_every_20ms(f"ws://127.0.0.1:{h.port}/twilio", 100, stack, {10: sigterm})
        assert statuses == [101] * 100, statuses
        assert h.status("node-b") == "UP"
        # node a is still up (draining for its calls): every upgrade it refused
        # was redispatched by HAProxy, and it counted each one
        assert pa.poll() is None, "a drains for its calls"
        wredis = int(h.servers()["node-a"]["wredis"])
        assert wredis == draining_refusals(), (wredis, draining_refusals())
        assert wait_until(lambda: h.status("node-a") == "DOWN", 10), h.servers()
    assert pa.wait(60 * FACTOR) == 0, "the drained daemon exits 0 once its calls are over"
    out = pa.stdout.read().decode() if pa.stdout else ""
    assert 0 <= out.find("daemon.draining") < out.find("daemon.drained"), out[-2000:]
    assert pb.poll() is None

"""Helpers for the scale-out tests: Kamailio and SIPp as processes, a SIP probe,
a minimal SIP node that stands in for a callbridge node, and /metrics parsing.

Everything binds to 127.0.0.1. Every process started here is stopped by the
fixture that started it.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .conftest import FACTOR, _socket_ports, free_port

ROOT = Path(__file__).resolve().parents[2]
KAMAILIO_CFG = ROOT / "config" / "kamailio" / "kamailio.cfg"
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "uac_call.xml"


# ------------------------------------------------------------------ SIP bits


def sip_options(port: int, timeout_s: float = 2.0) -> int | None:
    """Send one OPTIONS to 127.0.0.1:port over UDP; the status code, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
        branch = "z9hG4bK" + uuid.uuid4().hex[:16]
        msg = (
            f"OPTIONS sip:127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch={branch};rport\r\n"
            f"From: <sip:probe@127.0.0.1:{local}>;tag={uuid.uuid4().hex[:8]}\r\n"
            f"To: <sip:127.0.0.1:{port}>\r\n"
            f"Call-ID: {uuid.uuid4().hex}@127.0.0.1\r\n"
            "CSeq: 1 OPTIONS\r\n"
            "Max-Forwards: 70\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
        deadline = time.monotonic() + timeout_s
        s.settimeout(0.25)
        while time.monotonic() < deadline:
            s.sendto(msg, ("127.0.0.1", port))
            try:
                data = s.recv(65535)
            except (TimeoutError, ConnectionRefusedError):
                continue
            m = re.match(rb"SIP/2\.0 (\d{3})", data)
            if m and int(m.group(1)) >= 200:
                return int(m.group(1))
        return None


def _headers(text: str) -> tuple[str, list[tuple[str, str]], str]:
    head, _, body = text.partition("\r\n\r\n")
    lines = head.split("\r\n")
    hdrs = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        hdrs.append((name.strip(), value.strip()))
    return lines[0], hdrs, body


@dataclass
class SipNode:
    """A minimal UDP SIP user agent standing in for one callbridge node.

    It behaves like the daemon's SIP leg towards a proxy: OPTIONS 200 (503
    while draining), INVITE 100 + 200 with SDP (503 + Retry-After while
    draining), ACK absorbed, BYE 200 (also while draining). It lets the
    Kamailio configuration be tested on its own, whatever state the daemon's
    SIP leg is in.
    """

    draining: bool = False
    rate_limited: bool = False
    """Answer every INVITE "503 Rate Limited" (a caller over the node's rate)."""
    invites: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    sources: list[list[str]] = field(default_factory=list)
    """The X-Callbridge-Source values of each INVITE received (the proxy's report)."""
    byes: list[str] = field(default_factory=list)
    options: int = 0

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        with self._lock:
            return len(set(self.invites) - set(self.byes))

    def silence(self) -> None:
        """Stop answering anything (a node that died without a goodbye)."""
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        self.silence()
        self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self._handle(data.decode("utf-8", "replace"), addr)

    def _reply(
        self,
        addr: tuple[str, int],
        start: str,
        hdrs: list[tuple[str, str]],
        code: int,
        reason: str,
        extra: list[str] | None = None,
        body: str = "",
    ) -> None:
        out = [f"SIP/2.0 {code} {reason}"]
        for name, value in hdrs:
            low = name.lower()
            if low in ("via", "v", "from", "f", "call-id", "i", "cseq"):
                out.append(f"{name}: {value}")
            elif low in ("to", "t"):
                if ";tag=" not in value and code > 100:
                    value += f";tag={self.port}x"
                out.append(f"{name}: {value}")
            elif low == "record-route" and code == 200 and start.startswith("INVITE"):
                out.append(f"{name}: {value}")
        out += extra or []
        if body:
            out.append("Content-Type: application/sdp")
        out.append(f"Content-Length: {len(body.encode())}")
        self.sock.sendto(("\r\n".join(out) + "\r\n\r\n" + body).encode(), addr)

    def _handle(self, text: str, addr: tuple[str, int]) -> None:
        if text.startswith("SIP/2.0"):
            return
        start, hdrs, _ = _headers(text)
        method = start.split(" ", 1)[0]
        call_id = next((v for n, v in hdrs if n.lower() in ("call-id", "i")), "")
        with self._lock:
            if method == "OPTIONS":
                self.options += 1
                if self.draining:
                    self._reply(addr, start, hdrs, 503, "Draining", ["Retry-After: 10"])
                else:
                    self._reply(addr, start, hdrs, 200, "OK")
            elif method == "INVITE":
                if call_id in self.invites or call_id in self.refused:  # retransmission
                    return
                self.sources.append([v for n, v in hdrs if n.lower() == "x-callbridge-source"])
                if self.rate_limited:
                    self.refused.append(call_id)
                    self._reply(addr, start, hdrs, 503, "Rate Limited", ["Retry-After: 3"])
                    return
                if self.draining:
                    self.refused.append(call_id)
                    self._reply(addr, start, hdrs, 503, "Draining", ["Retry-After: 10"])
                    return
                self.invites.append(call_id)
                self._reply(addr, start, hdrs, 100, "Trying")
                sdp = (
                    "v=0\r\no=node 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\n"
                    "t=0 0\r\nm=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
                )
                contact = [f"Contact: <sip:node@127.0.0.1:{self.port}>"]
                self._reply(addr, start, hdrs, 200, "OK", contact, sdp)
            elif method == "BYE":
                if call_id not in self.byes:
                    self.byes.append(call_id)
                self._reply(addr, start, hdrs, 200, "OK")
            elif method == "CANCEL":
                self._reply(addr, start, hdrs, 200, "OK")
            # ACK: nothing to answer


# ------------------------------------------------------------------- Kamailio


@dataclass
class Kamailio:
    proc: subprocess.Popen[bytes]
    port: int
    ctl: str
    dispatcher_list: Path
    log: Path

    def dispatcher_flags(self) -> dict[int, str]:
        """Node port -> dispatcher flags ("AP" active, "IP" inactive, ...)."""
        out = subprocess.run(
            ["kamcmd", "-s", self.ctl, "dispatcher.list"],
            capture_output=True,
            text=True,
            timeout=5 * FACTOR,
        )
        pairs = re.findall(r"URI: sip:127\.0\.0\.1:(\d+)\s+FLAGS: (\w+)", out.stdout)
        return {int(p): f for p, f in pairs}

    def wait_flags(self, port: int, prefix: str, timeout_s: float) -> bool:
        return wait_until(
            lambda: self.dispatcher_flags().get(port, "").startswith(prefix), timeout_s
        )


def start_kamailio(
    tmp: Path,
    node_ports: list[int],
    ping_interval_s: int = 1,
    fr_timer_ms: int = 1000,
    inactive_threshold: int = 1,
) -> Kamailio:
    """Run config/kamailio/kamailio.cfg unchanged, parameterised through the
    callbridge-local.cfg it imports, in the foreground as the current user."""
    for attempt in range(START_ATTEMPTS):
        k = _start_kamailio_once(tmp, node_ports, ping_interval_s, fr_timer_ms, inactive_threshold)
        if k.proc.poll() is None:
            return k
        text = k.log.read_text(errors="replace")
        if not address_in_use(text) or attempt == START_ATTEMPTS - 1:
            raise RuntimeError("kamailio did not start:\n" + text[-3000:])
    raise AssertionError("unreachable")


def _start_kamailio_once(
    tmp: Path,
    node_ports: list[int],
    ping_interval_s: int,
    fr_timer_ms: int,
    inactive_threshold: int,
) -> Kamailio:
    """Kamailio on a port free a moment ago: answering OPTIONS, or exited (its log
    says why; "address in use" if another process took the port meanwhile)."""
    kdir = tmp / "kamailio"
    run = kdir / "run"
    run.mkdir(parents=True, exist_ok=True)
    port = free_port(socket.SOCK_DGRAM)
    shutil.copy(KAMAILIO_CFG, kdir / "kamailio.cfg")
    dslist = kdir / "dispatcher.list"
    dslist.write_text(
        "".join(f"1 sip:127.0.0.1:{p} 0 0 duid=node{i}\n" for i, p in enumerate(node_ports))
    )
    (kdir / "callbridge-local.cfg").write_text(
        f'#!substdef "!CB_LISTEN!udp:127.0.0.1:{port}!g"\n'
        f'#!substdef "!CB_DISPATCHER_LIST!{dslist}!g"\n'
        f'#!substdef "!CB_RUNDIR!{run}!g"\n'
        f"#!define CB_PING_INTERVAL_S {ping_interval_s}\n"
        f"#!define CB_FR_TIMER_MS {fr_timer_ms}\n"
        f"#!define CB_INACTIVE_THRESHOLD {inactive_threshold}\n"
        "#!define CB_CHILDREN 2\n"
    )
    log = kdir / "kamailio.log"
    cmd = ["kamailio", "-DD", "-E", "-f", str(kdir / "kamailio.cfg")]
    cmd += ["-m", "32", "-M", "4", "-Y", str(run), "-w", str(kdir)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    k = Kamailio(proc, port, f"unix:{run}/kamailio_ctl", dslist, log)
    if not wait_until(lambda: proc.poll() is not None or sip_options(port, 0.5) == 200, 20):
        stop_process(proc)
        raise RuntimeError("kamailio did not start:\n" + log.read_text()[-3000:])
    return k


# ----------------------------------------------------------------------- SIPp


def sipp(
    tmp: Path,
    proxy_port: int,
    calls: int,
    rate_cps: float,
    duration_ms: int,
    tag: str,
    source: str = "127.0.0.1",
) -> subprocess.Popen[bytes]:
    """Start SIPp as a UAC placing `calls` calls through the proxy, from the
    loopback address `source` (one caller as the proxy sees it); returns once it has
    bound its SIP and media ports (ports free a moment ago: taken meanwhile, SIPp
    exits saying so, and is started again on others)."""
    for attempt in range(START_ATTEMPTS):
        proc, ports = _sipp_once(tmp, proxy_port, calls, rate_cps, duration_ms, tag, source)
        up = wait_until(lambda p=proc, w=ports: p.poll() is not None or w <= udp_ports(p.pid), 20)
        if up and proc.poll() is None:
            return proc
        stop_process(proc)
        out = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
        if not address_in_use(out) or attempt == START_ATTEMPTS - 1:
            raise RuntimeError(f"sipp did not start (exit {proc.returncode}):\n{out[-3000:]}")
    raise AssertionError("unreachable")


def _sipp_once(
    tmp: Path,
    proxy_port: int,
    calls: int,
    rate_cps: float,
    duration_ms: int,
    tag: str,
    source: str,
) -> tuple[subprocess.Popen[bytes], set[int]]:
    sip_port, media_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    err = tmp / f"sipp-{tag}-errors.log"
    cmd = [
        "sipp",
        f"127.0.0.1:{proxy_port}",
        "-sf",
        str(SCENARIO),
        "-s",
        "1000",
        "-i",
        source,
        "-p",
        str(sip_port),
        "-mp",
        str(media_port),
        "-m",
        str(calls),
        "-r",
        str(rate_cps),
        "-d",
        str(duration_ms),
        "-nostdin",
        "-timeout",
        f"{int(60 * FACTOR)}s",
        "-timeout_error",
        "-trace_err",
        "-error_file",
        str(err),
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    return proc, {sip_port, media_port}


def sipp_wait(proc: subprocess.Popen[bytes], timeout_s: float = 90) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s * FACTOR)
    return proc.returncode, out.decode("utf-8", "replace")[-3000:]


# -------------------------------------------------------------------- helpers


START_ATTEMPTS = 5
"""Starts of an external peer told a port up front, when another process took it."""


def address_in_use(text: str) -> bool:
    """Whether a peer's own output says a bind found its address taken."""
    return "address already in use" in text.lower()


def udp_ports(pid: int) -> set[int]:
    """The UDP ports process ``pid`` has bound."""
    return _socket_ports(pid, ("udp", "udp6"), "07")


def wait_until(cond: object, timeout_s: float, every_s: float = 0.1) -> bool:
    assert callable(cond)
    deadline = time.monotonic() + timeout_s * FACTOR
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return bool(cond())


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2 * FACTOR) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample of `name` whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total

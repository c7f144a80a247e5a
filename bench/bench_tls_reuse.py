"""TLS connection reuse: one handshake per trunk peer across many INVITEs (issue 34).

The daemon (``callbridge serve``, pinned to core 0) has a trunk with
``transport = "tls"`` whose ``outbound_proxy`` is a TLS SIP peer in this
process (asyncio + ssl, a CA and certificate made for the run with
``tests/e2e/tlscerts.py``; the trunk verifies it with ``tls_ca_file``). Calls
are placed through the trunk with the HTTP API (``POST /v1/calls``, one
connection per request, at ``--rate`` per second, a ``tel:`` number per call);
the peer answers each INVITE at once with 486 Busy Here (no media: the call
ends with the daemon's ACK), so the whole outbound INVITE path runs: the API,
the trunk's limits (set far above the run's), the engine's client transaction
and the peer's connection. The peer counts its accepted connections (TLS
handshakes), the INVITEs and ACKs it got, and times, per call:

* ``post_to_invite``: the API request sent → its INVITE read by the peer (the
  daemon's outbound set-up as the peer sees it);
* ``busy_to_ack``: the peer's 486 written → the daemon's ACK read (the daemon's
  handling of a final response).

And the daemon's CPU time (``/proc/<pid>/stat``) over the placement, per INVITE.
The goal: handshakes == 1.

    python -m bench.bench_tls_reuse            # 10 000 INVITEs at 200/s
    python -m bench.bench_tls_reuse --quick    # 500
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import re
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import summary_ms, write
from bench.loadgen.procs import ROOT, DaemonUnderTest, TtsProcess, pin_self
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, parse_message

_NUMBER = re.compile(r"^sips?:\+?(\d+)@")


def make_certs(directory: Path, label: str) -> Any:
    """A CA and a leaf for 127.0.0.1 (``tests/e2e/tlscerts.py``, loaded by path)."""
    spec = importlib.util.spec_from_file_location(
        "_bench_tlscerts", ROOT / "tests" / "e2e" / "tlscerts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module.make_ca_and_leaf(directory, label)


@dataclass
class BusyPeer:
    """A TLS SIP peer that answers every INVITE with 486 and counts what it got."""

    context: ssl.SSLContext
    handshakes: int = 0
    invites: int = 0
    acks: int = 0
    other_requests: int = 0
    pings: int = 0
    invite_at: dict[int, float] = field(default_factory=dict)
    """The first INVITE's arrival per called number."""
    busy_at: dict[str, float] = field(default_factory=dict)
    ack_after: list[float] = field(default_factory=list)
    server: asyncio.Server | None = None
    port: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> BusyPeer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        """Stop listening and close the connections (their readers end)."""
        if self.server is not None:
            self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.sleep(0.1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # the handshake is done when the server hands the stream over
        self.writers.append(writer)
        framer = SipStreamFramer()
        try:
            while data := await reader.read(65536):
                now = time.monotonic()
                messages = framer.feed(data)
                pings, _ = framer.take_keepalives()
                if pings:
                    self.pings += pings
                    writer.write(b"\r\n")
                for raw in messages:
                    message = parse_message(raw)
                    if isinstance(message, SipRequest):
                        self._request(message, writer, now)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def _request(self, message: SipRequest, writer: asyncio.StreamWriter, now: float) -> None:
        call_id = message.get("call-id") or ""
        if message.method == "ACK":
            self.acks += 1
            sent = self.busy_at.pop(call_id, None)
            if sent is not None:
                self.ack_after.append(now - sent)
            return
        if message.method == "INVITE":
            self.invites += 1
            m = _NUMBER.match(message.uri)
            if m is not None:
                self.invite_at.setdefault(int(m.group(1)), now)
            status = "486 Busy Here"
        else:
            self.other_requests += 1
            status = "200 OK"
        headers = "".join(f"{n}: {message.get(n)}\r\n" for n in ("via", "from", "call-id", "cseq"))
        to = message.get("to") or ""
        to += "" if "tag=" in to else ";tag=busy"
        writer.write(f"SIP/2.0 {status}\r\n{headers}To: {to}\r\nContent-Length: 0\r\n\r\n".encode())
        if message.method == "INVITE":
            self.busy_at[call_id] = time.monotonic()


async def post_call(api_port: int, number: int, trunk: str) -> int:
    """``POST /v1/calls`` through ``trunk`` to ``tel:+<number>``; the HTTP status."""
    body = json.dumps({"to": f"tel:+{number}", "trunk": trunk, "route": "busy"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", api_port)
    try:
        writer.write(
            b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        line = await reader.readline()
        await reader.read()
        return int(line.split()[1]) if line.startswith(b"HTTP/") else 0
    finally:
        writer.close()


BASE = 15550000000


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    peer_certs = make_certs(workdir, "peer")
    daemon_certs = make_certs(workdir, "daemon")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(peer_certs.cert_file, peer_certs.key_file)
    peer = await BusyPeer(context).start()
    trunk = f"""
[trunks.peer]
outbound_proxy = "sip:127.0.0.1:{peer.port}"
transport = "tls"
tls_ca_file = "{peer_certs.ca_file}"
calls_per_second = {max(1000, int(args.rate * 10))}
max_calls = 100000
"""
    tts = TtsProcess.start(workdir)
    d = DaemonUnderTest.start(
        workdir, tts.port, tls=(daemon_certs.cert_file, daemon_certs.key_file), extra=trunk
    )
    statuses: dict[int, int] = {}
    posted_at: dict[int, float] = {}
    try:
        c0, t0 = d.cpu_s(), time.monotonic()
        inflight = asyncio.Semaphore(256)
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int) -> None:
            async with inflight:
                posted_at[BASE + i] = time.monotonic()
                try:
                    status = await post_call(d.api_port, BASE + i, "peer")
                except OSError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1

        gap = 1.0 / args.rate
        tenth = max(1, args.invites // 10)
        marks: list[float] = []  # the daemon's CPU seconds at each tenth of the calls placed
        for i in range(args.invites):
            delay = t0 + i * gap - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if i % tenth == 0:
                marks.append(d.cpu_s())
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        placed_s = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while (peer.invites < args.invites or peer.acks < peer.invites) and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.1)
        c1, t1 = d.cpu_s(), time.monotonic()
        await asyncio.sleep(0.5)
        active = d.active_calls()
    finally:
        d.stop()
        tts.stop()
        await peer.close()
    setup = [peer.invite_at[n] - posted_at[n] for n in peer.invite_at if n in posted_at]
    cpu_s = c1 - c0
    return {
        "invites_placed": args.invites,
        "api_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "invites_received": peer.invites,
        "distinct_numbers_invited": len(peer.invite_at),
        "acks_received": peer.acks,
        "other_requests": peer.other_requests,
        "keepalive_pings": peer.pings,
        "tls_handshakes": peer.handshakes,
        "calls_active_after": active,
        "placement_s": round(placed_s, 2),
        "rate_achieved_per_s": round(args.invites / placed_s, 1),
        "post_to_invite": summary_ms(setup),
        "busy_to_ack": summary_ms(peer.ack_after),
        "daemon_cpu_s": round(cpu_s, 2),
        "daemon_cpu_pct": round(100 * cpu_s / (t1 - t0), 1),
        "daemon_cpu_us_per_invite": round(1e6 * cpu_s / max(1, peer.invites), 1),
        # per tenth of the run (CPU clock ticks of 10 ms: coarse for a short run); a cost
        # that grows with the calls placed shows here
        "daemon_cpu_us_per_invite_by_tenth": [
            round(1e6 * (b - a) / tenth, 1) for a, b in itertools.pairwise(marks)
        ],
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="500 INVITEs")
    ap.add_argument("--invites", type=int, default=0, help="default 10 000 (500 with --quick)")
    ap.add_argument("--rate", type=float, default=200.0, help="calls placed per second")
    ap.add_argument("--out", default="", help="result name or path (default tls_reuse[_quick])")
    args = ap.parse_args()
    args.invites = args.invites or (500 if args.quick else 10_000)
    pin_self()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    figures["loadavg_at_start"] = load_before
    build = "pure Python" if os.environ.get("CALLBRIDGE_PURE_PYTHON") else "default"
    settings = {"invites": args.invites, "rate_per_s": args.rate, "answer": "486 Busy Here",
                "build": build}  # fmt: skip
    print(json.dumps(figures, indent=2))
    print(
        f"tls_reuse: {figures['invites_received']} INVITEs over {figures['tls_handshakes']}"
        f" TLS handshake(s); daemon {figures['daemon_cpu_us_per_invite']} µs CPU per INVITE;"
        f" load {load_before} -> {figures['loadavg_at_end']} (shared host)"
    )
    path = write(args.out or ("tls_reuse_quick" if args.quick else "tls_reuse"), figures, settings)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

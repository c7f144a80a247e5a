"""Symmetric RTP through a real NAT: a caller in a network namespace behind SNAT.

``test_sip_latching.py`` proves ``latching = "learn"`` over loopback, with the test
choosing which socket the caller's RTP leaves from. Here the kernel's NAT does it: the
caller (``nat_caller.py``, run with ``ip netns exec``) binds a private address that only
its namespace has (192.168.x.2 on the namespace's loopback) and names it in its SDP; the
namespace's ``iptables -t nat`` SNAT rewrites every UDP packet it sends out of its veth
to the namespace's outside address and a port of a range. The daemon listens on the
veth's other end, in this namespace (the test's). It can reach the caller only through
the NAT's mapping: the caller hearing the bot proves the daemon latched. Then the NAT
rebinds (the SNAT rule moves to another port range and the namespace's conntrack table
is flushed), and the caller hears the bot again only if the daemon followed the new port.

Needs root, ``ip``, ``iptables`` and ``conntrack`` (iptables and conntrack are in the
Makefile's peers). Each test makes its own namespace and veth pair with unique names and
a free subnet, and deletes them (with the namespace's rules and conntrack table) even
when it fails. Waits are for events, bounded by timeouts scaled by the suite's factor.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import FACTOR, stack
from .test_sip_peers import wait_for
from .test_sip_tls import sip_leg

pytestmark = pytest.mark.needs(
    "root", "ip", "iptables", "conntrack", why="a network namespace, a veth pair and SNAT"
)

CALLER = Path(__file__).resolve().parent / "nat_caller.py"
ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello there, you are calling from behind a network address translator. \
This greeting goes on for a while, so that every part of the test hears it: \
the first part of the call, the moment the translator moves the call to another port, \
and the part after it, until the caller hangs up."
"""
FIRST_PORTS = (41000, 41099)
REBOUND_PORTS = (42000, 42099)
WAIT_S = 10.0 * FACTOR

# what the kernel or the container says when the capability itself is missing
_MISSING = re.compile(
    r"Operation not permitted|Permission denied|Unknown device type|"
    r"Table does not exist|can't initialize iptables table|Could not fetch rule set|"
    r"Protocol not supported|Address family not supported|No chain/target/match|"
    r"Couldn't load target|Failed to initialize nft|Extension .* revision 0 not supported",
)


@dataclass(frozen=True)
class Netns:
    name: str
    host_if: str
    inner_if: str
    host_ip: str  # the daemon, on the veth's end outside
    public_ip: str  # the NAT's outside address: the source the daemon sees
    private_ip: str  # the phone: what its SDP names, reachable only inside

    def run(self, *cmd: str) -> str:
        return _run("ip", "netns", "exec", self.name, *cmd)

    def snat(self, ports: tuple[int, int], replace: bool = False) -> None:
        rule = ["-o", self.inner_if, "-p", "udp", "-j", "SNAT"]
        rule += ["--to-source", f"{self.public_ip}:{ports[0]}-{ports[1]}"]
        where = ["-R", "POSTROUTING", "1"] if replace else ["-A", "POSTROUTING"]
        self.run("iptables", "-t", "nat", *where, *rule)

    def mappings(self, private_port: int) -> list[int]:
        """The outside ports conntrack maps the phone's ``private_port`` to."""
        out = self.run("conntrack", "-L", "-p", "udp", "--orig-src", self.private_ip)
        ports = []
        for line in out.splitlines():
            sports = re.findall(r"sport=(\d+)", line)
            if len(sports) == 2 and int(sports[0]) == private_port:
                # the reply tuple's dport is the mapped source port
                ports += [int(p) for p in re.findall(r"dport=(\d+)", line)[1:2]]
        return ports


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return done.stdout


def _setup(*cmd: str) -> None:
    """One set-up command: a skip naming the error when the capability is missing here."""
    try:
        _run(*cmd)
    except subprocess.CalledProcessError as e:
        if _MISSING.search(e.stderr or ""):
            pytest.skip(f"`{' '.join(cmd)}` cannot run here: {e.stderr.strip()}")
        raise AssertionError(f"`{' '.join(cmd)}` failed: {e.stderr.strip()}") from None


def _free_subnet() -> tuple[str, str]:
    """(10.a.b.c, 192.168.d) not used by any address or route here."""
    used = _run("ip", "-4", "-o", "addr", "show")
    used += _run("ip", "-4", "route", "show", "table", "all")
    rng = random.Random()
    for _ in range(100):
        outer = f"10.{rng.randrange(200, 250)}.{rng.randrange(256)}"
        inner = f"192.168.{rng.randrange(256)}"
        if f"{outer}." not in used and f"{inner}." not in used:
            return f"{outer}.{rng.randrange(0, 256, 4)}", inner
    raise AssertionError("no free 10.x.y.0/30 and 192.168.z.0/24 here")


@pytest.fixture
def netns() -> Iterator[Netns]:
    tag = os.urandom(3).hex()
    base, inner = _free_subnet()
    prefix, _, last = base.rpartition(".")
    ns = Netns(
        name=f"cbnat-{os.getpid()}-{tag}",
        host_if=f"cbn{tag}h",
        inner_if=f"cbn{tag}c",
        host_ip=f"{prefix}.{int(last) + 1}",
        public_ip=f"{prefix}.{int(last) + 2}",
        private_ip=f"{inner}.2",
    )
    try:
        _setup("ip", "netns", "add", ns.name)
        _setup("ip", "link", "add", ns.host_if, "type", "veth", "peer", "name", ns.inner_if)
        _setup("ip", "link", "set", ns.inner_if, "netns", ns.name)
        _setup("ip", "addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
        _setup("ip", "link", "set", ns.host_if, "up")
        _setup("ip", "-n", ns.name, "addr", "add", f"{ns.public_ip}/30", "dev", ns.inner_if)
        _setup("ip", "-n", ns.name, "link", "set", ns.inner_if, "up")
        _setup("ip", "-n", ns.name, "addr", "add", f"{ns.private_ip}/32", "dev", "lo")
        _setup("ip", "-n", ns.name, "link", "set", "lo", "up")
        try:
            ns.snat(FIRST_PORTS)
        except subprocess.CalledProcessError as e:
            if _MISSING.search(e.stderr or ""):
                pytest.skip(f"iptables cannot SNAT in a network namespace here: {e.stderr.strip()}")
            raise
        yield ns
    finally:
        # the namespace takes its iptables rules, its conntrack table and its veth end
        # (so the pair) with it; the host end is deleted too in case the move failed
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", ns.host_if], capture_output=True, timeout=30)


class CallerProcess:
    """``nat_caller.py`` in the namespace: commands in, JSON events out."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.seen: list[dict[str, object]] = []

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def event(self, name: str) -> dict[str, object]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT_S)
            if not line:
                raise AssertionError(f"the caller exited before {name!r}: {self.seen}")
            event = json.loads(line)
            self.seen.append(event)
            if event["event"] == name:
                return event
            if event["event"] in ("failed", "deadline"):
                raise AssertionError(f"the caller: {event} (waiting for {name!r})")


def in_range(addr: tuple[str, int] | None, host: str, ports: tuple[int, int]) -> bool:
    return addr is not None and addr[0] == host and ports[0] <= addr[1] <= ports[1]


def inject(source: tuple[str, int], dest: tuple[str, int], count: int) -> None:
    """``count`` PCMU packets of one stream (its own SSRC) from ``source`` to ``dest``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(source)
        for seq in range(count):
            header = struct.pack("!BBHII", 0x80, 0, 7000 + seq, 160 * seq, 0x1DEC0DE)
            sock.sendto(header + b"\xff" * 160, dest)


def test_a_caller_behind_snat_in_a_netns_is_latched_and_followed_across_a_rebind(
    netns: Netns,
) -> None:
    """The caller's SDP names 192.168.x.2 (unreachable from here); its SIP and RTP come
    from the NAT's outside address and a port of the first range. The daemon answers at
    the source (rport), latches onto the mapping of the caller's RTP and the caller hears
    the greeting; after the NAT moves the flow to a port of the second range, the daemon
    follows it (one rebind) and the caller hears the greeting again, then hangs up. RTP
    injected from a third address in between is dropped and moves nothing."""

    async def main() -> None:
        sip_extra = f'latching = "learn"\nallow = ["{netns.public_ip}/32"]'
        async with stack(ROUTES, sip_host=netns.host_ip, sip_extra=sip_extra) as st:
            leg = sip_leg(st)
            call_id = f"nat-{os.urandom(6).hex()}"
            proc = await asyncio.create_subprocess_exec(
                *("ip", "netns", "exec", netns.name, sys.executable, str(CALLER)),
                *("--local", netns.private_ip, "--target", f"{netns.host_ip}:{st.sip_port}"),
                *("--call-id", call_id, "--deadline", str(6 * WAIT_S)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            caller = CallerProcess(proc)
            try:
                answered = await caller.event("answered")
                daemon_rtp = answered["daemon_rtp"]
                assert isinstance(daemon_rtp, list) and daemon_rtp[0] == netns.host_ip
                sdp_port = answered["sdp_port"]
                assert isinstance(sdp_port, int)
                call = leg.calls[call_id]
                # latched: onto the NAT's mapping of the caller's RTP, not the SDP address
                assert await wait_for(
                    lambda: in_range(call.rtp.remote_addr, netns.public_ip, FIRST_PORTS), 10.0
                ), call.rtp.remote_addr
                first = call.rtp.remote_addr
                assert first is not None
                assert first[1] in netns.mappings(sdp_port), netns.run("conntrack", "-L")
                await caller.send("mark 10")
                heard = await caller.event("heard")
                assert heard["sources"] == [daemon_rtp], heard
                # audio injected from a third address (neither the SDP's nor the NAT's) is
                # dropped, and the latched mapping stays
                before = call.rtp.counters().dropped_wrong_source
                inject(("127.0.0.1", 0), (netns.host_ip, int(daemon_rtp[1])), 25)
                assert await wait_for(
                    lambda: call.rtp.counters().dropped_wrong_source >= before + 25, 10.0
                ), call.rtp.counters()
                assert call.rtp.remote_addr == first
                assert call.rtp.counters().source_rebinds == 0
                # the NAT rebinds: new mappings come from the second range, the old are gone
                netns.snat(REBOUND_PORTS, replace=True)
                netns.run("conntrack", "-D", "-p", "udp")
                assert await wait_for(
                    lambda: in_range(call.rtp.remote_addr, netns.public_ip, REBOUND_PORTS), 10.0
                ), (first, call.rtp.remote_addr)
                rebound = call.rtp.remote_addr
                assert rebound is not None
                assert rebound[1] in netns.mappings(sdp_port), netns.run("conntrack", "-L")
                assert call.rtp.counters().source_rebinds == 1
                await caller.send("mark 10")  # heard only along the new mapping
                heard = await caller.event("heard")
                assert heard["sources"] == [daemon_rtp], heard
                # the caller's BYE leaves from a new SIP mapping too: answered at its source
                await caller.send("bye")
                bye = await caller.event("bye")
                assert bye["status"] == 200, bye
                assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
                assert await wait_for(lambda: call_id not in leg.calls, 5.0)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    asyncio.run(main())

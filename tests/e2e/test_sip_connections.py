"""The daemon's outbound TCP and TLS connections: one per peer, shared by calls and
REGISTERs, opened again when they drop.

The peers are small Python SIP ends on a listener of this test (port 0) that count
the connections they accept and note on which one each request came; the TLS one
has a certificate made per test (``tlscerts``). Each wait is for an event, bounded
by a timeout scaled by the suite's time factor.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable
from pathlib import Path

import pytest

from bridge.io.legs.sip import SipLeg, _UaRunner
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, parse_message

from .harness import FACTOR, Stack, stack
from .tlscerts import make_ca_and_leaf

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello."
"""
SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)
GRANTED_S = 2
"""What the registrar grants: the daemon refreshes at half of it."""


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))


async def wait_for(predicate: object, timeout_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while not predicate():  # type: ignore[operator]
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


class Peer:
    """A SIP end on a TCP (or TLS) listener: answers INVITE, BYE and REGISTER with 200
    (REGISTER granted ``GRANTED_S``), counts its connections and notes each request."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context
        self.connections = 0
        self.requests: list[tuple[int, SipRequest]] = []
        """(connection number, request)."""
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Peer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def methods(self, method: str) -> list[int]:
        """The connection numbers ``method`` requests came on, in order."""
        return [n for n, r in self.requests if r.method == method]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        framer = SipStreamFramer()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for raw in framer.feed(data):
                    message = parse_message(raw)
                    if isinstance(message, SipRequest):
                        self.requests.append((number, message))
                        if message.method != "ACK":
                            writer.write(self._answer(message))
        except (ConnectionError, ssl.SSLError):
            pass

    def _answer(self, request: SipRequest) -> bytes:
        body = SDP if request.method == "INVITE" else ""
        headers = "".join(f"{n}: {request.get(n)}\r\n" for n in ("via", "from", "call-id", "cseq"))
        to = request.get("to") or ""
        to += "" if "tag=" in to else ";tag=peer"
        extra = f"Expires: {GRANTED_S}\r\n" if request.method == "REGISTER" else ""
        if body:
            extra += f"Contact: <sip:bob@127.0.0.1:{self.port};transport=tcp>\r\n"
            extra += "Content-Type: application/sdp\r\n"
        return (
            f"SIP/2.0 200 OK\r\n{headers}To: {to}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

    def drop_connections(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    def close(self) -> None:
        self.drop_connections()
        if self.server is not None:
            self.server.close()


def leg_and_runner(s: Stack, kind: str) -> tuple[SipLeg, _UaRunner]:
    leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
    assert isinstance(leg, SipLeg)
    return leg, next(r for r in leg.runners if r.kind == kind)


def test_calls_out_over_tcp_to_one_peer_share_one_connection_reopened_when_it_drops() -> None:
    async def body() -> None:
        peer = await Peer().start()
        try:
            async with stack(ROUTES, sip_extra='transports = ["udp", "tcp"]') as s:
                leg, runner = leg_and_runner(s, "TCP")
                target = f"sip:bob@127.0.0.1:{peer.port};transport=tcp"
                calls = [leg.originate(target, "sip:callbridge@127.0.0.1", "") for _ in range(3)]
                assert await wait_for(lambda: len(peer.methods("ACK")) == 3), peer.requests
                assert peer.methods("INVITE") == [1, 1, 1] and peer.connections == 1
                assert all(leg.calls[c].runner is not None for c in calls)  # all answered
                peer.drop_connections()
                assert await wait_for(lambda: not runner.writers)
                leg.calls[calls[0]].hangup("done")  # the BYE opens the connection again
                assert await wait_for(lambda: peer.methods("BYE") == [2]), peer.requests
                fourth = leg.originate(target, "sip:callbridge@127.0.0.1", "")
                assert await wait_for(lambda: len(peer.methods("ACK")) == 4), peer.requests
                assert peer.methods("INVITE") == [1, 1, 1, 2] and peer.connections == 2
                assert runner.connections_opened == 2
                assert calls[1] in leg.calls and fourth in leg.calls  # the others are up
        finally:
            peer.close()

    run(body())


@pytest.mark.parametrize("owner", ["registration", "trunk"])
def test_register_over_tcp_refreshes_on_its_connection_and_registers_again_after_a_drop(
    owner: str,
) -> None:
    """A ``[sip.registrations]`` registrar with ``;transport=tcp``, or a trunk's plain
    ``sip:`` registrar with ``transport = "tcp"`` (whose call out shares the connection)."""

    async def body() -> None:
        peer = await Peer().start()
        try:
            if owner == "trunk":
                routes = ROUTES + (
                    "[trunks.carrier]\n"
                    f'outbound_proxy = "sip:127.0.0.1:{peer.port}"\n'
                    f'registrar = "sip:127.0.0.1:{peer.port}"\n'
                    'transport = "tcp"\nuser = "bot"\npassword = "secret"\n'
                )
            else:
                routes = ROUTES + (
                    "[sip.registrations.pbx]\n"
                    f'registrar = "sip:127.0.0.1:{peer.port};transport=tcp"\n'
                    'user = "bot"\npassword = "secret"\n'
                )
            # an idle timeout far below the refresh interval: it closes idle connections
            # others opened to us, not the one we keep to the registrar
            extra = 'transports = ["udp", "tcp"]\nidle_timeout_s = 0.2'
            async with stack(routes, sip_extra=extra) as s:
                leg, runner = leg_and_runner(s, "TCP")
                if owner == "trunk":
                    assert await wait_for(lambda: peer.methods("REGISTER")), peer.requests
                    leg.originate("tel:+15551230000", "", "", trunk="carrier")
                    assert await wait_for(lambda: peer.methods("ACK")), peer.requests
                    assert peer.methods("INVITE") == [1]  # the REGISTER's connection
                # the first REGISTER and its refreshes at half the granted time: one connection
                assert await wait_for(lambda: len(peer.methods("REGISTER")) >= 3), peer.requests
                assert peer.methods("REGISTER")[:3] == [1, 1, 1]
                registers = [r for _, r in peer.requests if r.method == "REGISTER"]
                first = registers[0]
                assert first.uri == f"sip:127.0.0.1:{peer.port}" + (
                    "" if owner == "trunk" else ";transport=tcp"
                )
                assert (first.get("via") or "").startswith("SIP/2.0/TCP ")
                assert ";transport=tcp" in (first.get("contact") or "")
                peer.drop_connections()  # the registrar restarts: our flow to it is gone
                assert await wait_for(lambda: 2 in peer.methods("REGISTER")), peer.requests
                registers = [r for _, r in peer.requests if r.method == "REGISTER"]
                cseqs = [r.cseq().number for r in registers]
                assert cseqs == sorted(set(cseqs))  # one registration: CSeq goes up
                assert {r.call_id for r in registers} == {first.call_id}
                assert runner.connections_opened == 2
        finally:
            peer.close()

    run(body())


@pytest.mark.parametrize("owner", ["registration", "trunk"])
def test_register_over_tls_to_a_sips_registrar(tmp_path: Path, owner: str) -> None:
    """A ``[sip.registrations]`` ``sips:`` registrar, or a trunk's plain ``sip:`` one with
    ``transport = "tls"`` (verified with the trunk's own CA; its call out shares the
    connection: one handshake)."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(peer_certs.cert_file, peer_certs.key_file)

    async def body() -> None:
        peer = await Peer(context).start()
        try:
            extra = (
                'tls_listen = ["127.0.0.1:0"]\n'
                f'tls_certificate_file = "{daemon_certs.cert_file}"\n'
                f'tls_key_file = "{daemon_certs.key_file}"\n'
            )
            if owner == "trunk":
                registrar = f"sip:127.0.0.1:{peer.port}"
                routes = ROUTES + (
                    "[trunks.carrier]\n"
                    f'outbound_proxy = "sip:127.0.0.1:{peer.port}"\n'
                    f'registrar = "{registrar}"\n'
                    f'transport = "tls"\ntls_ca_file = "{peer_certs.ca_file}"\n'
                    'user = "bot"\npassword = "secret"\n'
                )
            else:
                registrar = f"sips:127.0.0.1:{peer.port}"
                routes = ROUTES + (
                    "[sip.registrations.trunk]\n"
                    f'registrar = "{registrar}"\n'
                    'user = "bot"\npassword = "secret"\n'
                )
                extra += f'tls_ca_file = "{peer_certs.ca_file}"\n'
            async with stack(routes, sip_extra=extra) as s:
                leg, runner = leg_and_runner(s, "TLS")
                if owner == "trunk":
                    assert await wait_for(lambda: peer.methods("REGISTER")), peer.requests
                    leg.originate("tel:+15551230000", "", "", trunk="carrier")
                    assert await wait_for(lambda: peer.methods("ACK")), peer.requests
                    assert peer.methods("INVITE") == [1]  # the REGISTER's connection
                assert await wait_for(lambda: len(peer.methods("REGISTER")) >= 2), peer.requests
                assert peer.methods("REGISTER")[:2] == [1, 1] and runner.tls_handshakes == 1
                first = next(r for _, r in peer.requests if r.method == "REGISTER")
                assert first.uri == registrar
                assert (first.get("via") or "").startswith("SIP/2.0/TLS ")
                contact = first.get("contact") or ""
                if owner == "trunk":
                    assert contact.startswith("<sip:") and ";transport=tls" in contact
                else:
                    assert contact.startswith("<sips:")
        finally:
            peer.close()

    run(body())


def test_a_bye_to_a_caller_whose_connection_dropped_opens_one_to_its_contact() -> None:
    """RFC 3261 §18.1.1: the caller's TCP connection is gone when the daemon hangs up; the
    BYE goes on a new connection to the caller's Contact (a listener of this test)."""

    async def body() -> None:
        contact = await Peer().start()  # where the caller's Contact points
        try:
            async with stack(ROUTES, sip_extra='transports = ["udp", "tcp"]') as s:
                leg, runner = leg_and_runner(s, "TCP")
                reader, writer = await asyncio.open_connection("127.0.0.1", s.sip_port)
                framer = SipStreamFramer()
                invite = (
                    f"INVITE sip:greet@127.0.0.1:{s.sip_port} SIP/2.0\r\n"
                    "Via: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKdrop1;rport\r\n"
                    "Max-Forwards: 70\r\nFrom: <sip:caller@127.0.0.1>;tag=drop\r\n"
                    f"To: <sip:greet@127.0.0.1>\r\nCall-ID: drop-1\r\nCSeq: 1 INVITE\r\n"
                    f"Contact: <sip:caller@127.0.0.1:{contact.port};transport=tcp>\r\n"
                    "Content-Type: application/sdp\r\n"
                    f"Content-Length: {len(SDP)}\r\n\r\n{SDP}"
                )
                writer.write(invite.encode())
                ok = None
                while ok is None:
                    data = await asyncio.wait_for(reader.read(65536), 10 * FACTOR)
                    assert data, "the daemon closed the connection"
                    for raw in framer.feed(data):
                        message = parse_message(raw)
                        if not isinstance(message, SipRequest) and message.status == 200:
                            ok = message
                tag = ok.to().tag
                writer.write(
                    (
                        f"ACK sip:callbridge@127.0.0.1:{s.sip_port};transport=tcp SIP/2.0\r\n"
                        "Via: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKdrop2;rport\r\n"
                        "Max-Forwards: 70\r\nFrom: <sip:caller@127.0.0.1>;tag=drop\r\n"
                        f"To: <sip:greet@127.0.0.1>;tag={tag}\r\nCall-ID: drop-1\r\n"
                        "CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
                    ).encode()
                )
                await writer.drain()
                assert await wait_for(lambda: leg.calls["drop-1"].runner is not None)
                writer.close()  # the caller's connection drops
                assert await wait_for(lambda: not runner.writers)
                leg.calls["drop-1"].hangup("done")
                assert await wait_for(lambda: contact.methods("BYE") == [1]), contact.requests
                (bye,) = [r for _, r in contact.requests if r.method == "BYE"]
                assert bye.call_id == "drop-1"
                assert await wait_for(lambda: runner.ua.unanswered_requests("bye") == 0)
        finally:
            contact.close()

    run(body())

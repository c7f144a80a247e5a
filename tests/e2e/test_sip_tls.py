"""SIP over TLS on the real daemon: the listener, calls out, one connection per peer.

The daemon runs in-process; its peers here are small Python SIP ends over the
standard library's ``ssl`` (the real softphones are in ``test_sip_tls_peers.py``).
The CA and certificates are made per test (``tlscerts``).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import ssl
from collections.abc import Awaitable
from pathlib import Path

import pytest

from bridge.config import Config, ConfigError, parse_config
from bridge.io.legs.sip import SipLeg, _UaRunner
from bridge.io.sip_tls import server_context
from bridge.io.startup import StartupError
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, SipResponse, parse_message
from bridge.sip.sdp import build_answer, choose_crypto, negotiate, parse_sdp
from bridge.sip.uri import TargetError

from .harness import FACTOR, Stack, stack
from .tlscerts import Issued, make_ca_and_leaf

ROUTES = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello over TLS."
"""
SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio 9 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))


def tls_extra(daemon: Issued, ca_file: Path | None = None, extra: str = "") -> str:
    """``[sip]`` keys: a TLS listener on a free port with ``daemon``'s certificate."""
    ca = f'tls_ca_file = "{ca_file}"\n' if ca_file else ""
    return (
        'tls_listen = ["127.0.0.1:0"]\n'
        f'tls_certificate_file = "{daemon.cert_file}"\n'
        f'tls_key_file = "{daemon.key_file}"\n{ca}{extra}'
    )


def tls_runner(s: Stack) -> _UaRunner:
    leg = sip_leg(s)
    return next(r for r in leg.runners if r.kind == "TLS")


def sip_leg(s: Stack) -> SipLeg:
    leg = next(leg for leg in s.daemon.legs if isinstance(leg, SipLeg))
    assert isinstance(leg, SipLeg)
    return leg


async def wait_for(predicate: object, timeout_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while not predicate():  # type: ignore[operator]
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


class SipStream:
    """One SIP connection (TLS or plain) read message by message."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.framer = SipStreamFramer()
        self.queued: list[bytes] = []

    async def next(self) -> SipRequest | SipResponse:
        while not self.queued:
            data = await asyncio.wait_for(self.reader.read(65536), 10 * FACTOR)
            assert data, "the connection closed"
            self.queued += self.framer.feed(data)
        return parse_message(self.queued.pop(0))

    async def final(self) -> SipResponse:
        while True:
            message = await self.next()
            if isinstance(message, SipResponse) and message.status >= 200:
                return message

    def send(self, text: str) -> None:
        self.writer.write(text.encode())


_BRANCHES = itertools.count(1)


def request(
    method: str, uri: str, call_id: str, cseq: int, to_tag: str = "", body: str = ""
) -> str:
    tag = f";tag={to_tag}" if to_tag else ""
    content = "Content-Type: application/sdp\r\n" if body else ""
    return (
        f"{method} {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/TLS 127.0.0.1:5999;branch=z9hG4bK-t{next(_BRANCHES)};rport\r\n"
        "Max-Forwards: 70\r\nFrom: <sips:tester@127.0.0.1>;tag=abc\r\n"
        f"To: <{uri}>{tag}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
        f"Contact: <sips:tester@127.0.0.1:5999>\r\n{content}"
        f"Content-Length: {len(body.encode())}\r\n\r\n{body}"
    )


def test_a_call_over_the_tls_listener_is_answered_with_a_sips_contact(tmp_path: Path) -> None:
    """INVITE over TLS (the peer verifies the daemon's certificate): 200 with a sips:
    Contact and a TLS Via, ACK, BYE, 200; the port pair is freed."""
    certs = make_ca_and_leaf(tmp_path, "daemon")

    async def body() -> None:
        async with stack(ROUTES, sip_extra=tls_extra(certs)) as s:
            port = tls_runner(s).ua.settings.local_port
            context = ssl.create_default_context(cafile=str(certs.ca_file))
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="localhost"
            )
            peer = SipStream(reader, writer)
            uri = f"sips:greet@127.0.0.1:{port}"
            peer.send(request("INVITE", uri, "tls-call-1", 1, body=SDP))
            ok = await peer.final()
            assert ok.status == 200, ok
            assert ok.get("contact") == f"<sips:callbridge@127.0.0.1:{port}>"
            assert (ok.get("via") or "").startswith("SIP/2.0/TLS 127.0.0.1:5999")
            to_tag = (ok.get("to") or "").split("tag=")[1]
            leg = sip_leg(s)
            assert list(leg.calls) == ["tls-call-1"]
            peer.send(request("ACK", uri, "tls-call-1", 1, to_tag))
            peer.send(request("BYE", uri, "tls-call-1", 2, to_tag))
            bye_ok = await peer.final()
            assert (bye_ok.status, bye_ok.get("cseq")) == (200, "2 BYE")
            assert await wait_for(lambda: leg.ports.allocated_count == 0)
            writer.close()

    run(body())


def test_a_peer_that_does_not_trust_the_certificate_gets_no_sip(tmp_path: Path) -> None:
    """A client verifying against another CA fails its handshake; the listener goes on."""
    certs = make_ca_and_leaf(tmp_path, "daemon")
    other = make_ca_and_leaf(tmp_path, "other")

    async def body() -> None:
        async with stack(ROUTES, sip_extra=tls_extra(certs)) as s:
            port = tls_runner(s).ua.settings.local_port
            wrong = ssl.create_default_context(cafile=str(other.ca_file))
            with pytest.raises(ssl.SSLCertVerificationError):
                await asyncio.open_connection("127.0.0.1", port, ssl=wrong)
            right = ssl.create_default_context(cafile=str(certs.ca_file))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=right)
            peer = SipStream(reader, writer)
            peer.send(request("OPTIONS", f"sips:x@127.0.0.1:{port}", "tls-options", 1))
            assert (await peer.final()).status == 200
            writer.close()

    run(body())


ROUTE_BASE = (
    '[providers.p]\nprotocol = "kova"\nurl = "ws://127.0.0.1:1/v1/ws/kova"\n'
    '[[routes]]\nmatch = "*"\nprovider = "p"\ngreeting = "Hi."\n'
)


def test_tls_listen_without_a_readable_certificate_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'[sip]\ntls_listen = "127.0.0.1:5061"\n{ROUTE_BASE}')
    assert info.value.errors == [
        "sip.tls_certificate_file: required with sip.tls_listen",
        "sip.tls_key_file: required with sip.tls_listen",
    ]
    # LoadCredential: the paths name $CREDENTIALS_DIRECTORY; the key is not there
    certs = make_ca_and_leaf(tmp_path, "daemon")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        parse_config(
            '[sip]\ntls_listen = "127.0.0.1:5061"\n'
            f'tls_certificate_file = "$CREDENTIALS_DIRECTORY/{certs.cert_file.name}"\n'
            f'tls_key_file = "$CREDENTIALS_DIRECTORY/missing-key.pem"\n{ROUTE_BASE}'
        )
    [error] = info.value.errors
    assert error.startswith(
        "sip.tls_key_file: cannot read '$CREDENTIALS_DIRECTORY/missing-key.pem'"
    )


def test_srtp_without_a_tls_listener_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'[sip]\nsrtp = "offer"\n{ROUTE_BASE}')
    assert info.value.errors == [
        "sip.srtp: 'offer' needs sip.tls_listen: SRTP keys (SDES) travel only over TLS"
    ]


def test_a_certificate_and_key_that_are_not_a_pair_are_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    """At load (check-config) and, should the files change after it, at start."""
    certs = make_ca_and_leaf(tmp_path, "daemon")
    other = make_ca_and_leaf(tmp_path, "other")
    broken = tmp_path / "broken.pem"
    broken.write_text("not a certificate\n")
    for bad in (
        Issued(certs.ca_file, broken, certs.key_file),
        Issued(certs.ca_file, certs.cert_file, other.key_file),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[sip]\n{tls_extra(bad)}{ROUTE_BASE}")
        [error] = info.value.errors
        assert error.startswith("sip.tls_certificate_file: not a certificate chain and its key")
        with pytest.raises(StartupError) as started:
            server_context(str(bad.cert_file), str(bad.key_file))
        assert str(started.value).startswith("sip.tls_certificate_file: ")
        assert started.value.exit_status == 2
        assert "PRIVATE KEY" not in str(started.value)


class TlsUas:
    """A Python SIP end on a TLS listener that answers every INVITE with 200 and every
    BYE with 200, and counts its connections and the requests it got."""

    def __init__(self, certs: Issued, srtp: bool = False) -> None:
        self.srtp = srtp
        """Answer an offer's SDES keys with a key of our own (else: plain RTP/AVP)."""
        self.offers: list[str] = []
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs.cert_file, certs.key_file)
        self.server_names: list[str | None] = []
        """The SNI of each handshake."""
        self.context.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
        self.connections = 0
        self.failed_handshakes = 0
        self.requests: list[tuple[int, str]] = []
        """(connection number, method)."""
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> TlsUas:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._quiet_handshake_errors)
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def _quiet_handshake_errors(
        self, loop: asyncio.AbstractEventLoop, ctx: dict[str, object]
    ) -> None:
        if isinstance(ctx.get("exception"), ssl.SSLError):
            self.failed_handshakes += 1
            return
        loop.default_exception_handler(ctx)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        stream = SipStream(reader, writer)
        try:
            while True:
                message = await stream.next()
                if not isinstance(message, SipRequest):
                    continue
                self.requests.append((number, message.method))
                if message.method == "ACK":
                    continue
                body = self._answer(message) if message.method == "INVITE" else ""
                headers = "".join(
                    f"{name}: {message.get(name)}\r\n"
                    for name in ("via", "from", "call-id", "cseq")
                )
                to = message.get("to") or ""
                to += "" if "tag=" in to else ";tag=uas"
                content = "Content-Type: application/sdp\r\n" if body else ""
                writer.write(
                    (
                        f"SIP/2.0 200 OK\r\n{headers}To: {to}\r\n"
                        f"Contact: <sips:bob@127.0.0.1:{self.port}>\r\n{content}"
                        f"Content-Length: {len(body)}\r\n\r\n{body}"
                    ).encode()
                )
        except (AssertionError, ConnectionError, TimeoutError, ssl.SSLError):
            pass

    def _answer(self, invite: SipRequest) -> str:
        offer_text = invite.body.decode()
        self.offers.append(offer_text)
        offer = parse_sdp(offer_text)
        audio = negotiate(offer, ("PCMU",))
        if not self.srtp or audio is None or not audio.crypto:
            return SDP
        key = choose_crypto(audio.crypto, secrets.token_bytes)
        return build_answer(offer, audio, "127.0.0.1", 9, 1, 1, crypto=key)

    def drop_connections(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    def close(self) -> None:
        self.drop_connections()
        if self.server is not None:
            self.server.close()


def test_calls_to_one_peer_share_one_tls_connection_and_reconnect_when_it_drops(
    tmp_path: Path,
) -> None:
    """Two calls to one sips: peer: one connection, one handshake, the peer verified
    against tls_ca_file. The peer drops it: the daemon's BYE opens a new one."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer")

    async def body() -> None:
        uas = await TlsUas(peer_certs).start()
        try:
            extra = tls_extra(daemon_certs, peer_certs.ca_file)
            async with stack(ROUTES, sip_extra=extra) as s:
                leg = sip_leg(s)
                runner = tls_runner(s)
                target = f"sips:bob@127.0.0.1:{uas.port}"
                first = leg.originate(target, "sip:callbridge@127.0.0.1", "greet")
                second = leg.originate(target, "sip:callbridge@127.0.0.1", "greet")
                invites = lambda: [m for _, m in uas.requests].count("ACK") == 2  # noqa: E731
                assert await wait_for(invites), uas.requests
                assert {
                    leg.calls[first].runner is not None,
                    leg.calls[second].runner is not None,
                } == {True}
                assert (uas.connections, runner.tls_handshakes) == (1, 1)
                uas.drop_connections()
                assert await wait_for(lambda: not runner.writers)
                leg.calls[first].hangup("done")
                assert await wait_for(lambda: (2, "BYE") in uas.requests), uas.requests
                assert (uas.connections, runner.tls_handshakes) == (2, 2)
                assert second in leg.calls  # the other call is still up
        finally:
            uas.close()

    run(body())


def test_a_peer_with_an_untrusted_certificate_is_not_called_unless_opted_out(
    tmp_path: Path,
) -> None:
    """Verification is on by default: a peer whose CA the daemon does not know fails the
    call (503 to the engine, the ports freed); ``tls_unverified_hosts`` names it: called."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer")

    async def body() -> None:
        uas = await TlsUas(peer_certs).start()
        try:
            async with stack(ROUTES, sip_extra=tls_extra(daemon_certs)) as s:
                leg = sip_leg(s)
                call_id = leg.originate(f"sips:bob@127.0.0.1:{uas.port}", "sip:c@127.0.0.1", "g")
                assert await wait_for(lambda: call_id not in leg.calls)
                assert leg.ports.allocated_count == 0
                assert uas.requests == []
            opt_out = tls_extra(daemon_certs, extra='tls_unverified_hosts = ["127.0.0.1"]\n')
            async with stack(ROUTES, sip_extra=opt_out) as s:
                leg = sip_leg(s)
                leg.originate(f"sips:bob@127.0.0.1:{uas.port}", "sip:c@127.0.0.1", "g")
                assert await wait_for(lambda: (uas.connections, "ACK") in uas.requests)
        finally:
            uas.close()

    run(body())


@pytest.mark.parametrize("answers_keys", [True, False])
def test_a_call_out_with_srtp_required_offers_savp_and_ends_if_not_answered_with_a_key(
    tmp_path: Path, answers_keys: bool
) -> None:
    """``srtp = "require"``: the INVITE offers RTP/SAVP with a key per suite; an answer
    with a key for one of them keys the call's SRTP, a plain answer ends it (BYE)."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer")

    async def body() -> None:
        uas = await TlsUas(peer_certs, srtp=answers_keys).start()
        try:
            extra = tls_extra(daemon_certs, peer_certs.ca_file, 'srtp = "require"\n')
            async with stack(ROUTES, sip_extra=extra) as s:
                leg = sip_leg(s)
                with pytest.raises(TargetError, match="only over TLS"):
                    leg.originate("sip:bob@127.0.0.1:5999", "sip:c@127.0.0.1", "g")
                call_id = leg.originate(f"sips:bob@127.0.0.1:{uas.port}", "sip:c@127.0.0.1", "g")
                assert await wait_for(lambda: (1, "ACK") in uas.requests), uas.requests
                [offer] = uas.offers
                media = parse_sdp(offer).media[0]
                assert media.proto == "RTP/SAVP"
                assert [c.suite for c in media.crypto] == [
                    "AES_CM_128_HMAC_SHA1_80",
                    "AES_CM_128_HMAC_SHA1_32",
                ]
                if answers_keys:
                    assert await wait_for(lambda: leg.calls[call_id].runner is not None)
                    assert leg.calls[call_id].srtp is not None
                    assert (1, "BYE") not in uas.requests
                else:
                    assert await wait_for(lambda: (1, "BYE") in uas.requests), uas.requests
                    assert call_id not in leg.calls
        finally:
            uas.close()

    run(body())


def test_a_reload_applies_srtp_and_refuses_a_change_of_the_tls_keys(tmp_path: Path) -> None:
    from bridge.io.daemon import restart_keys

    certs = make_ca_and_leaf(tmp_path, "daemon")

    def cfg(extra: str) -> Config:
        return parse_config(f"[sip]\n{tls_extra(certs, extra=extra)}{ROUTE_BASE}")

    base = cfg("")
    assert restart_keys(base, cfg('srtp = "require"\n')) == []
    moved = parse_config(
        f"[sip]\n{tls_extra(certs).replace('127.0.0.1:0', '127.0.0.1:5071')}{ROUTE_BASE}"
    )
    assert restart_keys(base, moved) == ["sip.tls_listen"]
    opted_out = cfg('tls_unverified_hosts = ["pbx.example"]\n')
    assert restart_keys(base, opted_out) == ["sip.tls_ca_file"]


@pytest.mark.parametrize(("name", "answered"), [("localhost", True), ("pbx.example", False)])
def test_a_peer_called_by_name_gets_sni_and_must_carry_that_name(
    tmp_path: Path, name: str, answered: bool
) -> None:
    """sips:bob@localhost: SNI ``localhost``, the certificate checked for that name; a
    certificate for another name fails the call."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer", hosts=(name,))

    async def body() -> None:
        uas = await TlsUas(peer_certs).start()
        try:
            async with stack(ROUTES, sip_extra=tls_extra(daemon_certs, peer_certs.ca_file)) as s:
                leg = sip_leg(s)
                call_id = leg.originate(f"sips:bob@localhost:{uas.port}", "sip:c@x", "g")
                if answered:
                    assert await wait_for(lambda: (1, "ACK") in uas.requests), uas.requests
                else:
                    assert await wait_for(lambda: call_id not in leg.calls)
                    assert uas.requests == []
                assert uas.server_names == ["localhost"]
        finally:
            uas.close()

    run(body())

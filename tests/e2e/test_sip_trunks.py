"""Calls through a ``[trunks.NAME]`` entry with the real daemon (issue 34).

The carrier is a UDP socket of this test (bound to port 0) that answers the way a
carrier does: it challenges the INVITE, checks the answer, the From it presents and
the codecs it offers. Every wait is for an event, bounded by a timeout scaled by the
suite's time factor.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, place_call
from bridge.io.legs.sip import SipLeg
from bridge.sip.digest import AuthResult, DigestVerifier
from bridge.sip.message import SipRequest, build_response
from bridge.sip.sdp import parse_sdp
from bridge.sip.trunks import TrunkError, TrunkLimited

from .harness import FACTOR, AppServer, app_route, free_port, stack
from .test_sip_outbound_targets import ROUTES, UdpPeer, sip_leg
from .test_sip_peers import ROUTES as PEER_ROUTES
from .test_sip_peers import (
    RtpPhone,
    _rtp_range,
    free_udp_port,
    requires_sipp,
    start_sipp_uas,
    wait_for,
)
from .test_sip_tls import TlsUas, tls_extra
from .test_sip_tls import wait_for as tls_wait_for
from .tlscerts import Issued, make_ca_and_leaf

WAIT_S = 5.0 * FACTOR


def post(port: int, body: dict[str, str]) -> tuple[int, dict[str, object], dict[str, str]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/calls",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def answer_with_sdp(
    peer: UdpPeer, invite: SipRequest, addr: tuple[str, int], tag: str, user: str, media: bytes
) -> None:
    """The peer's 200 to ``invite``: Contact ``user`` at its port, an SDP with ``media``."""
    assert peer.transport is not None
    ok = build_response(invite, 200, "OK", tag)
    ok.add("Contact", f"<sip:{user}@127.0.0.1:{peer.port}>")
    ok.add("Content-Type", "application/sdp")
    ok.body = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n" + media
    peer.transport.sendto(ok.to_bytes(), addr)


async def wait_released(leg: SipLeg, call_id: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if call_id not in leg.calls:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{call_id} still up")


@pytest.mark.parametrize("status", [401, 407])
def test_tel_call_through_the_only_trunk_answers_its_challenge_as_the_trunk(status: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        _, carrier = await loop.create_datagram_endpoint(UdpPeer, local_addr=("127.0.0.1", 0))
        assert carrier.transport is not None
        verifier = DigestVerifier("carrier.test", b"k", {"acct": "s3cret"}, algorithms=("SHA-256",))
        trunk = f"""
[trunks.carrier]
outbound_proxy = "sip:127.0.0.1:{carrier.port}"
user = "acct"
password = "s3cret"
caller_id = "+15550001111"
caller_name = "Acme IVR"
codecs = ["PCMA"]
max_calls = 1
calls_per_second = 0.001
"""
        async with stack(ROUTES + trunk) as st:
            leg = sip_leg(st.daemon)
            assert st.daemon.api is not None
            api_port = st.daemon.api.port
            code, body, _ = await asyncio.to_thread(post, api_port, {"to": "tel:+1-555-123-0000"})
            assert code == 201, body
            call_id = str(body["call_id"])
            invite, addr = await carrier.next()
            assert invite.method == "INVITE" and invite.call_id == call_id
            assert invite.uri == f"sip:+15551230000@127.0.0.1:{carrier.port};user=phone"
            assert invite.get("route") == f"<sip:127.0.0.1:{carrier.port};lr>"
            assert invite.from_().display_name == "Acme IVR"
            assert str(invite.from_().uri) == "sip:+15550001111@127.0.0.1"
            assert (invite.get("via") or "").startswith("SIP/2.0/UDP ")
            (audio,) = parse_sdp(invite.body.decode()).media
            assert audio.formats == ("8", "101")  # the trunk's codecs: PCMA, no PCMU
            assert {name for pt, name, _ in audio.rtpmap if pt == 101} == {"telephone-event"}
            # the carrier challenges (as a proxy with 407, or as the callee with 401)
            name = "Proxy-Authenticate" if status == 407 else "WWW-Authenticate"
            challenge = build_response(invite, status, "Authenticate", "c1")
            for value in verifier.challenges(loop.time()):
                challenge.add(name, value)
            carrier.transport.sendto(challenge.to_bytes(), addr)
            ack, _ = await carrier.next()
            assert (ack.method, ack.cseq().number) == ("ACK", 1)
            retry, addr = await carrier.next()
            assert (retry.method, retry.cseq().number, retry.call_id) == ("INVITE", 2, call_id)
            answer = retry.get("proxy-authorization" if status == 407 else "authorization")
            assert answer is not None and 'username="acct"' in answer
            assert "algorithm=SHA-256" in answer and "qop=auth" in answer
            assert verifier.verify(answer, "INVITE", loop.time()) == AuthResult.OK
            # while it rings the trunk is full (max_calls = 1): refused before anything is sent
            with pytest.raises(TrunkLimited, match="max_calls = 1"):
                leg.originate("tel:+15551230001", "", "")
            # the same challenge again: the answer was refused; the call fails, no loop
            again = build_response(retry, status, "Authenticate", "c1")
            for value in verifier.challenges(loop.time()):
                again.add(name, value)
            carrier.transport.sendto(again.to_bytes(), addr)
            ack, _ = await carrier.next()
            assert (ack.method, ack.cseq().number) == ("ACK", 2)
            await wait_released(leg, call_id)
            assert leg.trunk_limits["carrier"].active == 0
            assert carrier.requests.empty()  # no third INVITE
            # the rate (0.001/s) is spent: refused at once with the seconds to wait
            code, body, headers = await asyncio.to_thread(
                post, api_port, {"to": "tel:+15551230002", "trunk": "carrier"}
            )
            assert code == 429, body
            assert body["error"] == {
                "code": "trunk_rate_limited",
                "message": body["error"]["message"],  # type: ignore[index]
                "field": "trunk",
            }
            assert int(headers["Retry-After"]) >= 900
            # through a trunk the target's host is never looked up (the proxy is the hop)
            code, body, _ = await asyncio.to_thread(
                post, api_port, {"to": "sip:bob@nowhere.invalid", "trunk": "carrier"}
            )
            assert code == 429, body
            code, body, _ = await asyncio.to_thread(
                post, api_port, {"to": "sip:a@127.0.0.1", "trunk": "x"}
            )
            assert code == 422 and body["error"]["field"] == "trunk", body  # type: ignore[index]
            with pytest.raises(TrunkError, match="no trunk 'x'"):
                leg.originate("tel:+15551230000", "", "", trunk="x")
            assert leg.ports.allocated_count == 0
        carrier.transport.close()

    asyncio.run(main())


def test_an_inbound_call_from_a_trunks_sources_is_its_own_and_the_app_sees_which() -> None:
    """`callbridge call` from 127.0.0.1 is the trunk's (no digest asked, though `[sip.auth]`
    has a user); the application's `call.started` names the trunk."""

    async def main() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": "Hi.", "final": True}]
            trunk = """
[sip.auth.users]
alice = "alice-pw"

[trunks.pbx]
outbound_proxy = "sip:127.0.0.1:5999"
sources = ["127.0.0.0/8"]
codecs = ["PCMU"]
max_calls = 1
"""
            async with stack(app_route(app.url) + trunk) as st:
                opts = CallerOptions(target=f"sip:demo@127.0.0.1:{st.sip_port}", duration_s=1.0)
                result = await place_call(opts)
                assert build_report(result.recording).answered
                started = await app.wait_for("call.started")
                assert started["custom_parameters"] == {"trunk": "pbx"}
                limiter = sip_leg(st.daemon).trunk_limits["pbx"]
                for _ in range(int(WAIT_S / 0.01)):  # released with the call
                    if limiter.active == 0:
                        break
                    await asyncio.sleep(0.01)
                assert limiter.active == 0

    asyncio.run(asyncio.wait_for(main(), 60 * FACTOR))


@pytest.mark.peers
@requires_sipp
def test_sipp_carrier_challenges_the_trunks_call_and_gets_its_caller_id_and_codec(
    tmp_path: Path,
) -> None:
    """SIPp as the carrier (`uas_trunk_digest.xml`): the tel: call through the trunk comes
    with its caller ID, the Route, PCMA alone; 401 is answered with credentials SIPp's
    verifyauth accepts; the answered call's RTP is PCMA; the flow hangs up."""

    async def main() -> None:
        phone = await RtpPhone().open(free_udp_port(odd=False))
        try:
            port, carrier = await start_sipp_uas(
                tmp_path, "carrier", "uas_trunk_digest.xml", 20, rtp_port=phone.port
            )
            trunk = f"""
[trunks.carrier]
outbound_proxy = "sip:127.0.0.1:{port}"
user = "acct"
password = "s3cret"
caller_id = "+15550001111"
caller_name = "Acme IVR"
codecs = ["PCMA"]
"""
            async with stack(PEER_ROUTES + trunk, rtp=_rtp_range()) as st:
                leg = sip_leg(st.daemon)
                call_id = leg.originate("tel:+15551230000", "", "announce")
                assert call_id in leg.calls
                result = await carrier
                assert result.returncode == 0, result.explain()
                assert (result.successful_calls, result.failed_calls) == (1, 0), result.explain()
                assert "Authorization: Digest" in result.messages
                assert await wait_for(lambda: leg.ports.allocated_count == 0, 2.0)
        finally:
            phone.close()
        kinds = {p.pt for p in phone.received}
        assert kinds and kinds <= {8, 101}, kinds  # the trunk's codec, nothing else

    asyncio.run(main())


def test_a_tls_trunk_verifies_with_its_own_ca_or_opts_out_and_requires_srtp(
    tmp_path: Path,
) -> None:
    """`transport = "tls"`: the call goes over TLS to the trunk, verified against the
    trunk's `tls_ca_file` (`[sip]` has none: the same peer called without the trunk is
    refused), with `srtp = "require"` offering RTP/SAVP and keyed by the answer; a trunk
    with `tls_verify = false` reaches it with no CA at all."""
    daemon_certs = make_ca_and_leaf(tmp_path, "daemon")
    peer_certs = make_ca_and_leaf(tmp_path, "peer")

    async def main() -> None:
        uas = await TlsUas(peer_certs, srtp=True).start()
        try:
            trunks = f"""
[trunks.secure]
outbound_proxy = "sip:127.0.0.1:{uas.port}"
transport = "tls"
srtp = "require"
tls_ca_file = "{peer_certs.ca_file}"

[trunks.lab]
outbound_proxy = "sip:127.0.0.1:{uas.port}"
transport = "tls"
tls_verify = false
"""
            async with stack(ROUTES + trunks, sip_extra=tls_extra(daemon_certs)) as st:
                leg = sip_leg(st.daemon)
                plain = leg.originate(f"sips:bob@127.0.0.1:{uas.port}", "", "")
                assert await tls_wait_for(lambda: plain not in leg.calls)  # system store: no
                assert uas.requests == []
                call_id = leg.originate("tel:+15551230000", "", "", trunk="secure")
                assert await tls_wait_for(lambda: (1, "ACK") in uas.requests), uas.requests
                (offer,) = uas.offers
                assert parse_sdp(offer).media[0].proto == "RTP/SAVP"
                assert await tls_wait_for(lambda: leg.calls[call_id].runner is not None)
                assert leg.calls[call_id].srtp is not None
                leg.originate("tel:+15551230000", "", "", trunk="lab")
                assert await tls_wait_for(lambda: [m for _, m in uas.requests].count("ACK") == 2)
                assert len(uas.offers) == 2
                assert parse_sdp(uas.offers[1]).media[0].proto == "RTP/AVP"  # srtp off
        finally:
            uas.close()

    asyncio.run(asyncio.wait_for(main(), 60 * FACTOR))


def test_an_answered_trunk_call_uses_its_codec_and_a_tel_transfer_goes_to_the_trunk() -> None:
    """The carrier answers PCMA: the call runs (the app sees the trunk in call.started);
    a transfer to tel:+E164 sends a REFER whose Refer-To is the number at the trunk's
    host, as a call out through it would be."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        _, carrier = await loop.create_datagram_endpoint(UdpPeer, local_addr=("127.0.0.1", 0))
        assert carrier.transport is not None
        async with AppServer() as app:
            trunk = f"""
[trunks.carrier]
outbound_proxy = "sip:127.0.0.1:{carrier.port}"
codecs = ["PCMA"]
"""
            async with stack(app_route(app.url) + trunk) as st:
                leg = sip_leg(st.daemon)
                call_id = leg.originate("tel:+15551230000", "", "")
                invite, addr = await carrier.next()
                answer_with_sdp(
                    carrier, invite, addr, "c1", "carrier",
                    b"m=audio 9 RTP/AVP 8 101\r\na=rtpmap:101 telephone-event/8000\r\n",
                )  # fmt: skip
                ack, _ = await carrier.next()
                assert ack.method == "ACK"
                started = await app.wait_for("call.started")
                assert started["custom_parameters"] == {"trunk": "carrier"}
                call = leg.calls[call_id]
                assert call.codec == "alaw"  # PCMA
                call.transfer("tel:+1-555-999-8888")
                refer, _ = await carrier.next()
                assert refer.method == "REFER"
                host = f"127.0.0.1:{carrier.port}"
                assert refer.get("refer-to") == f"<sip:+15559998888@{host};user=phone>"
        carrier.transport.close()

    asyncio.run(asyncio.wait_for(main(), 60 * FACTOR))


def test_a_transfer_names_a_trunk_for_a_call_that_is_not_on_one() -> None:
    """A call out to a plain sip: peer (no trunk): a transfer naming the trunk (a flow
    step's or the app's ``trunk``) puts a tel: target at the trunk's host; without one
    the tel: target goes as it is."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_datagram_endpoint(UdpPeer, local_addr=("127.0.0.1", 0))
        assert peer.transport is not None
        async with AppServer() as app:
            trunk = """
[trunks.carrier]
outbound_proxy = "sip:sbc.carrier.test:5099"
"""
            async with stack(app_route(app.url) + trunk) as st:
                leg = sip_leg(st.daemon)
                call_id = leg.originate(f"sip:desk@127.0.0.1:{peer.port}", "", "")
                invite, addr = await peer.next()
                assert invite.method == "INVITE"
                answer_with_sdp(peer, invite, addr, "d1", "desk", b"m=audio 9 RTP/AVP 0\r\n")
                ack, _ = await peer.next()
                assert ack.method == "ACK"
                await app.wait_for("call.started")
                call = leg.calls[call_id]
                call.transfer("tel:+1-555-999-8888", "carrier")
                refer, _ = await peer.next()
                assert refer.method == "REFER"
                via_trunk = "<sip:+15559998888@sbc.carrier.test:5099;user=phone>"
                assert refer.get("refer-to") == via_trunk
                peer.transport.sendto(build_response(refer, 202, "Accepted").to_bytes(), addr)
                call.transfer("tel:+15559998888")
                again, _ = await peer.next()
                while again.get("cseq") == refer.get("cseq"):  # the first one, sent again
                    again, _ = await peer.next()
                assert again.method == "REFER"
                assert again.get("refer-to") == "<tel:+15559998888>"
        peer.transport.close()

    asyncio.run(asyncio.wait_for(main(), 60 * FACTOR))


# ------------------------------------------------------------- Kamailio as the trunk

KAMAILIO_TRUNK_CFG = Path(__file__).resolve().parent / "scenarios" / "kamailio_trunk.cfg"


def options_status(port: int) -> int | None:
    """One OPTIONS to 127.0.0.1:port over UDP: the final status, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.25)
        local = s.getsockname()[1]
        s.sendto(
            (
                f"OPTIONS sip:127.0.0.1:{port} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{os.urandom(6).hex()}\r\n"
                f"From: <sip:probe@127.0.0.1:{local}>;tag=p\r\nTo: <sip:127.0.0.1:{port}>\r\n"
                f"Call-ID: {os.urandom(8).hex()}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
                "Content-Length: 0\r\n\r\n"
            ).encode(),
            ("127.0.0.1", port),
        )
        try:
            data = s.recv(65535)
        except (TimeoutError, ConnectionRefusedError):
            return None
        return int(data[8:11]) if data.startswith(b"SIP/2.0 ") else None


async def start_kamailio_trunk(
    tmp: Path, pstn_port: int, tls: Issued | None = None
) -> tuple[subprocess.Popen[bytes], int, int | None, Path]:
    """Kamailio with kamailio_trunk.cfg on a port free a moment ago (again on another if
    it was taken meanwhile), answering: (process, UDP port, TLS port, log). With ``tls``
    (its certificate and key) the tls module listens too, on a TCP port free a moment ago."""
    kdir = tmp / "kamailio"
    (kdir / "run").mkdir(parents=True, exist_ok=True)
    shutil.copy(KAMAILIO_TRUNK_CFG, kdir / "kamailio.cfg")
    log = kdir / "kamailio.log"
    if tls is not None:
        (kdir / "tls.cfg").write_text(
            "[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\n"
            f"require_certificate = no\ncertificate = {tls.cert_file}\n"
            f"private_key = {tls.key_file}\n\n"
            "[client:default]\nmethod = TLSv1.2+\nverify_certificate = no\n"
            "require_certificate = no\n"
        )
    for _attempt in range(5):
        port = free_udp_port()
        tls_port = free_port(socket.SOCK_STREAM) if tls is not None else None
        local = (
            f'#!substdef "!TRUNK_LISTEN!udp:127.0.0.1:{port}!g"\n'
            f'#!substdef "!TRUNK_PSTN!sip:127.0.0.1:{pstn_port}!g"\n'
            '#!substdef "!TRUNK_PASSWORD!s3cret!g"\n'
        )
        if tls_port is not None:
            local += (
                "#!define WITH_TLS\n"
                f'#!substdef "!TRUNK_TLS_LISTEN!tls:127.0.0.1:{tls_port}!g"\n'
                f'#!substdef "!TRUNK_TLS_CFG!{kdir / "tls.cfg"}!g"\n'
            )
        (kdir / "trunk-local.cfg").write_text(local)
        cmd = ["kamailio", "-DD", "-E", "-f", str(kdir / "kamailio.cfg"), "-m", "32", "-M", "4"]
        cmd += ["-Y", str(kdir / "run"), "-w", str(kdir)]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        up = await wait_for(
            lambda p=proc, k=port: p.poll() is not None or options_status(k) is not None,  # type: ignore[misc]
            20.0,
        )
        if up and proc.poll() is None:
            return proc, port, tls_port, log
        proc.kill()
        proc.wait()
        if "in use" not in log.read_text(errors="replace"):
            raise AssertionError("kamailio did not start:\n" + log.read_text()[-3000:])
    raise AssertionError("kamailio found no free port in 5 attempts")


@pytest.mark.peers
@requires_sipp
@pytest.mark.parametrize(
    "transport",
    [
        pytest.param("udp", marks=pytest.mark.needs("kamailio")),
        pytest.param("tls", marks=pytest.mark.needs("kamailio", "kamailio_tls")),
    ],
)
def test_kamailio_as_the_trunk_register_inbound_and_outbound_with_digest(
    tmp_path: Path, transport: str
) -> None:
    """Kamailio as the carrier's edge (`kamailio_trunk.cfg`): the trunk's REGISTER answers
    its 401; a call in through it (to the registered binding, `callbridge call`) is the
    trunk's; a tel: call out answers its 407 and reaches the "PSTN" (a SIPp UAS echoing
    Kamailio's Record-Route), which hears the flow and gets its BYE through Kamailio.

    ``tls``: Kamailio's tls module listens too, with a certificate made for the test; the
    trunk registers and calls out with `transport = "tls"`, verified against that
    certificate's CA, and the ACK and BYE follow the record-routed TLS side."""
    kamailio_certs = make_ca_and_leaf(tmp_path / "certs", "kamailio")
    daemon_certs = make_ca_and_leaf(tmp_path / "certs", "daemon")

    async def main() -> None:
        phone = await RtpPhone().open(free_udp_port(odd=False))
        kamailio: subprocess.Popen[bytes] | None = None
        try:
            pstn_port, pstn = await start_sipp_uas(
                tmp_path, "pstn", "uas_answer_rr.xml", 30, rtp_port=phone.port
            )
            kamailio, port, tls_port, log = await start_kamailio_trunk(
                tmp_path, pstn_port, kamailio_certs if transport == "tls" else None
            )
            sip_extra = ""
            out = ""
            if tls_port is not None:
                sip_extra = tls_extra(daemon_certs)
                out = f'transport = "tls"\ntls_ca_file = "{kamailio_certs.ca_file}"\n'
            trunk = f"""
[trunks.edge]
outbound_proxy = "sip:127.0.0.1:{tls_port or port}"
{out}registrar = "sip:127.0.0.1:{tls_port or port}"
user = "acct"
password = "s3cret"
caller_id = "+15550001111"
sources = ["127.0.0.1/32"]
"""
            async with AppServer() as app:
                app.on_started = [{"type": "say", "turn_id": "g", "text": "Hi.", "final": True}]
                routes = PEER_ROUTES + app_route(app.url) + trunk
                async with stack(routes, rtp=_rtp_range(), sip_extra=sip_extra) as st:
                    leg = sip_leg(st.daemon)
                    # the trunk's registration lives with the runner of its transport
                    registrations = [
                        reg for r in leg.runners for reg in r.ua._registrations.values()
                    ]
                    assert await wait_for(
                        lambda: bool(registrations) and all(r.registered for r in registrations),
                        10.0,
                    ), log.read_text()[-3000:]
                    # in: the carrier's call reaches the binding; it is the trunk's
                    opts = CallerOptions(target=f"sip:acct@127.0.0.1:{port}", duration_s=1.0)
                    result = await place_call(opts)
                    assert build_report(result.recording).answered
                    started = await app.wait_for("call.started")
                    assert started["custom_parameters"] == {"trunk": "edge"}
                    # out: 407 answered, then to the PSTN, the flow speaks and hangs up
                    leg.originate("tel:+15551230000", "", "announce")
                    done = await pstn
                    assert done.returncode == 0, done.explain()
                    assert (done.successful_calls, done.failed_calls) == (1, 0), done.explain()
                    text = log.read_text(errors="replace")
                    assert (
                        f"trunk: REGISTER of sip:acct@127.0.0.1 authorised over {transport}" in text
                    ), text[-3000:]
                    # the call in goes to the registered binding: over TLS on the tls edge
                    binding = r"sip:callbridge@127\.0\.0\.1:\d+"
                    if transport == "tls":
                        binding += ";transport=tls"
                    assert re.search(rf"trunk: INVITE in to {binding}\n", text), text[-3000:]
                    assert (
                        "trunk: INVITE to +15551230000 authorised, from "
                        f"sip:+15550001111@127.0.0.1 over {transport}" in text
                    ), text[-3000:]
                    # the PSTN's ACK and BYE went through Kamailio, on the trunk's transport
                    for method in ("ACK", "BYE"):
                        line = f"trunk: in-dialog {method} to sip:127.0.0.1:{pstn_port};"
                        assert re.search(re.escape(line) + rf"\S* over {transport}\n", text), text[
                            -3000:
                        ]
            assert phone.audio(), "the PSTN side heard nothing"
        finally:
            phone.close()
            if kamailio is not None:
                kamailio.terminate()
                try:
                    kamailio.wait(10)
                except subprocess.TimeoutExpired:
                    kamailio.kill()
                    kamailio.wait()

    asyncio.run(main())

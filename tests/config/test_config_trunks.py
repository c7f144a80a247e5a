"""``[trunks.NAME]``: every key read, bad values and unknown keys named, secrets kept out
of ``repr`` and logs (issue 34)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from bridge.config import ConfigError, parse_config, secret_values
from bridge.logs import configure, get_logger
from bridge.sip.settings import SipSecurity, TrunkConfig
from bridge.sip.uri import outbound_target
from tests.e2e.tlscerts import make_ca_and_leaf

MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
api_key = "sk-inline-secret"
[[routes]]
match = "*"
provider = "p"
"""
TLS = """
[sip]
tls_listen = ["127.0.0.1:0"]
tls_certificate_file = "{cert}"
tls_key_file = "{key}"
"""


def errors_of(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "<string>", env or {})
    return info.value.errors


def tls_section(tmp_path: Path) -> str:
    issued = make_ca_and_leaf(tmp_path)
    return TLS.format(cert=issued.cert_file, key=issued.key_file)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_key_is_read(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("x")
    text = (
        tls_section(tmp_path)
        + MINIMAL
        + f"""
[trunks.carrier]
outbound_proxy = "sip:sip.example.com"
transport = "tls"
registrar = "sip:sip.example.com"
user = "acct"
password = "pw-in-the-file"
realm = "sip.example.com"
srtp = "require"
tls_ca_file = "{ca_file}"
tls_verify = false
codecs = ["PCMA", "PCMU"]
max_calls = 10
calls_per_second = 2.5
caller_id = "+15551230000"
caller_name = "Acme IVR"
sources = ["192.0.2.0/24", "2001:db8::/32"]
inbound_auth = "both"
"""
    )
    (t,) = parse_config(text, "<string>", {}).trunks
    assert (t.name, t.outbound_proxy, t.transport, t.registrar) == (
        "carrier",
        "sip:sip.example.com",
        "tls",
        "sip:sip.example.com",
    )
    assert (t.user, t.password, t.realm) == ("acct", "pw-in-the-file", "sip.example.com")
    assert (t.srtp, t.tls_ca_file, t.tls_verify) == ("require", str(ca_file), False)
    assert t.codecs == ("PCMA", "PCMU")
    assert (t.max_calls, t.calls_per_second) == (10, 2.5)
    assert (t.caller_id, t.caller_name) == ("+15551230000", "Acme IVR")
    assert t.sources == ("192.0.2.0/24", "2001:db8::/32")
    assert t.inbound_auth == "both"
    assert t.next_hop == "sip:sip.example.com;transport=tls"
    assert t.security == SipSecurity("require", str(ca_file), ("sip.example.com",))


def test_defaults_are_a_plain_udp_trunk() -> None:
    text = MINIMAL + '[trunks.t]\noutbound_proxy = "sip:10.0.0.1:5070"\n'
    (t,) = parse_config(text, "<string>", {}).trunks
    assert (t.transport, t.srtp, t.tls_verify, t.inbound_auth) == ("udp", "off", True, "source")
    assert (t.max_calls, t.calls_per_second, t.codecs) == (0, 0.0, ("PCMU", "PCMA"))
    assert t.next_hop == "sip:10.0.0.1:5070"
    assert t.security == SipSecurity()
    tcp = parse_config(text + 'transport = "tcp"\n', "<string>", {}).trunks[0]
    assert tcp.next_hop == "sip:10.0.0.1:5070;transport=tcp"


def test_bad_values_and_unknown_keys_are_named() -> None:
    text = (
        MINIMAL
        + """
[trunks.bad]
outbound_proxy = "http://example.com"
transport = "sctp"
srtp = "maybe"
codecs = ["G729"]
max_calls = -1
calls_per_second = "fast"
caller_id = "bob <x>"
caller_name = "a\\"b"
sources = ["not-a-cidr"]
inbound_auth = "never"
tls_verfy = false
"""
    )
    errors = errors_of(text)
    by_key = {e.split(":", 1)[0] for e in errors}
    for key in (
        "outbound_proxy",
        "transport",
        "srtp",
        "codecs",
        "max_calls",
        "calls_per_second",
        "caller_id",
        "caller_name",
        "sources",
        "inbound_auth",
        "tls_verfy",
    ):
        assert f"trunks.bad.{key}" in by_key, (key, errors)
    assert "trunks.bad.tls_verfy: unknown key (did you mean tls_verify?)" in errors


def test_outbound_proxy_is_required() -> None:
    assert errors_of(MINIMAL + "[trunks.t]\n") == [
        "trunks.t.outbound_proxy: missing (the carrier's sip: URI)"
    ]


def test_cross_key_checks_name_their_key() -> None:
    text = (
        MINIMAL
        + """
[trunks.a]
outbound_proxy = "sips:sip.example.com"
transport = "udp"
srtp = "offer"
inbound_auth = "digest"
registrar = "sip:sip.example.com"
[trunks.b]
outbound_proxy = "sip:sip.example.com"
transport = "tls"
"""
    )
    assert sorted(errors_of(text)) == [
        "trunks.a.inbound_auth: 'digest' needs user and password",
        "trunks.a.outbound_proxy: the URI says tls, but transport is 'udp'",
        "trunks.a.registrar: needs user and password",
        "trunks.a.srtp: 'offer' needs transport = \"tls\" (SDES keys travel only over TLS)",
        "trunks.b.transport: 'tls' needs sip.tls_listen (calls out and REGISTERs over TLS "
        "leave from it)",
    ]


def test_the_registrar_goes_over_the_trunks_transport(tmp_path: Path) -> None:
    base = MINIMAL + '[trunks.t]\nuser = "u"\npassword = "p"\n'
    base += 'outbound_proxy = "sip:a.example.com"\n'

    def trunk(extra: str, head: str = "") -> TrunkConfig:
        return parse_config(head + base + extra, "<string>", {}).trunks[0]

    assert trunk('registrar = "sip:r.example.com"\n').registrar_hop == "sip:r.example.com"
    tcp = trunk('registrar = "sip:r.example.com:5080"\ntransport = "tcp"\n')
    assert tcp.registrar_hop == "sip:r.example.com:5080;transport=tcp"
    target = outbound_target(tcp.registrar_hop)
    assert (target.host, target.port, target.transport) == ("r.example.com", 5080, "TCP")
    tls = tls_section(tmp_path)
    for registrar in ("sip:r.example.com", "sips:r.example.com", "sip:r.example.com;transport=tls"):
        t = trunk(f'registrar = "{registrar}"\ntransport = "tls"\ntls_verify = false\n', tls)
        target = outbound_target(t.registrar_hop)
        assert (target.host, target.port, target.transport) == ("r.example.com", 5061, "TLS")
        # tls_verify = false: neither the proxy's host nor the registrar's is verified
        assert t.security.unverified_hosts == ("a.example.com", "r.example.com")
    assert trunk("").registrar_hop == ""


def test_a_registrar_that_contradicts_the_trunks_transport_is_an_error_naming_it() -> None:
    text = (
        MINIMAL
        + """
[trunks.a]
outbound_proxy = "sip:a.example.com"
registrar = "sips:a.example.com"
user = "u"
password = "p"
[trunks.b]
outbound_proxy = "sip:b.example.com"
registrar = "sip:b.example.com;transport=udp"
transport = "tcp"
user = "u"
password = "p"
[trunks.c]
outbound_proxy = "sip:c.example.com"
registrar = "sip:c.example.com;transport=tcp"
user = "u"
password = "p"
"""
    )
    assert sorted(errors_of(text)) == [
        "trunks.a.registrar: the URI says tls, but transport is 'udp'",
        "trunks.b.registrar: the URI says udp, but transport is 'tcp'",
        "trunks.c.registrar: the URI says tcp, but transport is 'udp'",
    ]


def test_a_trunk_transport_without_its_listener_is_an_error_naming_it() -> None:
    trunks = """
[trunks.t]
outbound_proxy = "sip:t.example.com"
transport = "tcp"
[trunks.u]
outbound_proxy = "sip:u.example.com"
"""
    udp_only = '[sip]\ntransports = ["udp"]\n' + MINIMAL + trunks
    assert errors_of(udp_only) == [
        "trunks.t.transport: 'tcp' needs 'tcp' in sip.transports (calls out and REGISTERs "
        "over TCP leave from it)"
    ]
    tcp_only = '[sip]\ntransports = ["tcp"]\n' + MINIMAL + trunks
    assert errors_of(tcp_only) == [
        "trunks.u.transport: 'udp' needs 'udp' in sip.transports (calls out and REGISTERs "
        "over UDP leave from it)"
    ]
    assert len(parse_config(MINIMAL + trunks, "<string>", {}).trunks) == 2  # udp and tcp


def test_password_from_file_and_env_never_in_repr_or_logs(tmp_path: Path) -> None:
    secret_file = tmp_path / "trunk-pw"
    secret_file.write_text("from-the-file-7Hq\n")
    base = MINIMAL + '[trunks.f]\noutbound_proxy = "sip:a.example.com"\nuser = "u"\n'
    from_file = parse_config(base + f'password_file = "{secret_file}"\n', "<string>", {})
    assert from_file.trunks[0].password == "from-the-file-7Hq"
    env = {"TRUNK_PW": "from-the-env-9Zx"}
    from_env = parse_config(base + 'password_env = "TRUNK_PW"\n', "<string>", env)
    assert from_env.trunks[0].password == "from-the-env-9Zx"
    assert "from-the-env-9Zx" not in repr(from_env)
    assert "from-the-env-9Zx" in secret_values(from_env)
    both = base + 'password = "x"\npassword_env = "TRUNK_PW"\n'
    assert errors_of(both, env) == ["trunks.f.password: give only one of password, password_env"]
    assert errors_of(base + 'password_env = "NOPE"\n') == [
        "trunks.f.password_env: environment variable 'NOPE' is not set"
    ]
    # the log sink masks every configured secret, the trunk's too
    out = io.StringIO()
    configure("debug", "json", stream=out, secrets=secret_values(from_env))
    get_logger("callbridge.test").info("trunk.debug", detail=f"pw={from_env.trunks[0].password}")
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if "trunk.debug" in x]
    assert line["detail"] == "pw=[redacted]"

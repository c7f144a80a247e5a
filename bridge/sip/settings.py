"""Configuration of the SIP engines: frozen dataclasses built by the config loader.

``SipConfig`` is the ``[sip]`` section as the config file gives it (each key a
``bridge.settings.setting`` field: what the reader checks and the reference says);
the shell turns it into the engines' own ``SipSettings``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.settings import (
    ConnectionLimits,
    Spot,
    check_cidrs,
    check_hostport,
    read,
    register_check,
    setting,
    tname,
)
from bridge.sip.locate import dns_server_address
from bridge.sip.uri import outbound_target

__all__ = [
    "CODECS",
    "DEFAULT_CODECS",
    "SRTP_MODES",
    "SipAuthUser",
    "SipConfig",
    "SipRegistration",
    "SipSecurity",
    "SipSettings",
    "SipUserConfig",
    "TimerSettings",
    "TrunkConfig",
    "check_trunks",
]


@dataclass(frozen=True, slots=True)
class TimerSettings:
    """RFC 3261 §17 base timer values (Table 4)."""

    t1_s: float = 0.5
    """RTT estimate; A, E and G start here; B, F, H, J, L, M are 64*T1."""
    t2_s: float = 4.0
    """Cap of the retransmit interval for non-INVITE requests and INVITE responses."""
    t4_s: float = 5.0
    """Longest time a message stays in the network (timers I and K)."""

    @property
    def timeout_s(self) -> float:
        """64*T1: timers B, F, H, J (UDP), L and M."""
        return 64 * self.t1_s


@dataclass(frozen=True, slots=True)
class SipAuthUser:
    """One ``[sip.auth]`` account: inbound INVITEs may be challenged for it."""

    username: str
    password: str


SRTP_MODES = ("off", "offer", "require")
"""``srtp`` settings: no SRTP; offered (taken when the peer offers it); required."""


def _file(value: str, at: Spot) -> str:
    """A path, ``$CREDENTIALS_DIRECTORY`` and other variables expanded, relative to the
    config's directory; it must be a readable file."""
    if not value:
        return ""
    path = Path(os.path.expandvars(value))
    if not path.is_absolute():
        path = at.reader.base_dir / path
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as e:
        at.error(f"cannot read {value!r}: {e.strerror}")
    return str(path)


@dataclass(frozen=True, slots=True)
class SipSecurity:
    """TLS peer verification and SRTP of the calls placed and taken (today ``[sip]``; a
    trunk will carry its own). SDES keys travel only over TLS (``docs/sip.md``)."""

    srtp: str = setting(
        "off",
        "SRTP with SDES keys (`a=crypto`, RFC 4568, `AES_CM_128_HMAC_SHA1_80` and `_32`) on "
        "calls over TLS. `offer`: an offer with crypto is answered with our own key, one "
        "without plain; calls out offer crypto in `RTP/AVP` (best effort). `require`: calls "
        "without SRTP get 488; calls out offer `RTP/SAVP`, and must be placed over TLS. Needs "
        "`tls_listen` (SDES keys travel only over TLS: an offer with `a=crypto` over UDP or TCP "
        "gets 488 whatever this says)",
        choices=SRTP_MODES,
    )  # fmt: skip
    ca_file: str = setting(
        "",
        "CA bundle (PEM) that TLS peers we call must chain to; `\"\"`: the system's store. "
        "Their certificate must also name the host we called (SNI sent for a name)",
        key="tls_ca_file", type_doc="path", check=_file,
    )  # fmt: skip
    unverified_hosts: tuple[str, ...] = setting(
        (),
        "hosts (as the target names them) called over TLS without verifying their "
        "certificate: an explicit opt-out for a lab peer with a self-signed certificate. "
        "Never set it for a carrier",
        key="tls_unverified_hosts", type_doc="list of hosts",
        check=lambda v, at: tuple(h.lower() for h in v),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SipSettings:
    """Everything a :class:`~bridge.sip.ua.SipUserAgent` needs to know."""

    local_host: str = "127.0.0.1"
    """Host (IP or name) we put in Via sent-by and Contact."""
    local_port: int = 5060
    contact_host: str = ""
    """Host put in Contact instead of ``local_host`` (``[sip] external_address``: the
    public address when the daemon sits behind NAT); empty: ``local_host``."""
    """Port of the listening transport."""
    transport: str = "UDP"
    """``UDP`` or ``TCP``: reliable transports do not retransmit (RFC 3261 §17)."""
    user_agent: str = ""
    """``User-Agent``/``Server`` header; empty sends none (no version banner)."""
    timers: TimerSettings = field(default_factory=TimerSettings)
    allowed_sources: tuple[str, ...] = ()
    """CIDRs allowed to send requests; empty allows everyone. Others are
    dropped silently (not 403: silence keeps the node invisible to scanners)."""
    trusted_proxies: tuple[str, ...] = ()
    """CIDRs of proxies whose ``X-Callbridge-Source`` header names the caller: the
    allowlist and the INVITE rate limit then apply to that caller (refused with
    403 / 503 + Retry-After, not silence); the proxy itself always passes."""
    auth_realm: str = "callbridge"
    auth_users: tuple[SipAuthUser, ...] = ()
    """When non-empty, new INVITEs must carry valid digest credentials."""
    auth_secret: bytes = b"change-me"
    """HMAC key of the stateless nonces (RFC 7616 §3.3 nonce construction)."""
    auth_nonce_lifetime_s: float = 30.0
    """How long a nonce stays valid; older ones get ``stale=true``."""
    auth_max_failures: int = 10
    """Failed digest answers from one source within ``auth_failure_window_s``
    after which it gets 403 without a challenge until the window ends; 0: no limit."""
    auth_failure_window_s: float = 60.0
    invite_rate_per_s: float = 0.0
    """Per-source token-bucket refill rate for new INVITEs; 0 disables the limit."""
    invite_burst: int = 10
    """Per-source token-bucket depth for new INVITEs."""
    max_calls: int = 0
    """Concurrent call limit; 0 disables it. Past it: 503 + Retry-After."""
    retry_after_s: int = 30
    """Retry-After value of our 503 answers."""
    session_expires_s: int = 1800
    """Session interval we ask for / accept (RFC 4028); 0 disables session timers."""
    keepalive_s: float = 120.0
    """RFC 5626 §4.4.1 CRLF keep-alive on the stream connections we open: a ping every
    ``keepalive_s`` times a jitter factor drawn in 0.8-1.0; 0 sends none."""
    min_se_s: int = 90
    """Smallest session interval we accept (Min-SE); smaller requests get 422."""
    register_expires_s: int = 3600
    """Expires we ask for in REGISTER; refreshed at half of the granted value."""
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    """SDP codec preference order."""
    security: SipSecurity = field(default_factory=SipSecurity)
    """SRTP mode and TLS peer verification (``SipSecurity``)."""
    trunks: tuple[TrunkConfig, ...] = ()
    """``[trunks]``: an INVITE from a trunk's ``sources`` (or answering as a ``digest``
    trunk's user) gets its ``inbound_auth``, codecs and SRTP mode."""


# ------------------------------------------------------------ [sip] in the config


CODECS = ("PCMU", "PCMA", "G722", "OPUS")
"""The codec names ``[sip] codecs`` and a trunk's ``codecs`` accept (``bridge.sip.sdp.Codec``)."""
DEFAULT_CODECS = ("PCMU", "PCMA")
"""G.711 only unless configured: G.722 or Opus is used when a config puts it in the list
(first, to prefer it), so a deployment opts in to the wideband path and its higher CPU."""


DEFAULT_RTP_PORTS = (20000, 20999)


def _ip_address(value: str, at: Spot) -> str:
    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            at.error(f"expected an IP address, got {value!r}")
    return value


def _dns_servers(value: tuple[str, ...], at: Spot) -> tuple[str, ...]:
    for server in value:
        try:
            dns_server_address(server)
        except ValueError as exc:
            at.error(f"expected ADDRESS or ADDRESS:PORT: {exc}")
    return value


def _sip_target(value: str, at: Spot) -> str:
    if value:
        try:
            outbound_target(value)
        except ValueError as exc:
            at.error(str(exc))
    return value


def _registrar(value: str, at: Spot) -> str:
    if not value.startswith(("sip:", "sips:")):
        at.error(f"expected a sip: URI, got {value!r}")
        return value
    try:
        outbound_target(value)
    except ValueError as exc:
        at.error(str(exc))
    return value


def _port_range(raw: object, at: Spot) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)-(\d+)", raw) if isinstance(raw, str) else None
    if m is None:
        at.error(f'expected "LOW-HIGH", got {raw!r}')
        return DEFAULT_RTP_PORTS
    lo, hi = int(m.group(1)), int(m.group(2))
    if not (1024 <= lo < hi <= 65535):
        at.error(f"range {lo}-{hi} must satisfy 1024 <= LOW < HIGH <= 65535")
        return DEFAULT_RTP_PORTS
    if lo % 2:
        at.error(f"LOW must be even (RTP on even ports, RTCP on odd), got {lo}")
    return lo, hi


@dataclass(frozen=True, slots=True)
class SipRegistration:
    """``[sip.registrations.NAME]``: keep a REGISTER binding at a PBX or trunk."""

    name: str
    registrar: str = setting(
        doc="PBX or trunk to register with: over UDP, TCP with `;transport=tcp` (needs `tcp` "
        "in `transports`) or TLS with `sips:` / `;transport=tls` (needs `tls_listen`), on one "
        "connection kept open and opened again when it drops",
        kind="str", type_doc="`sip:` URI", required="a sip: URI", check=_registrar,
    )  # fmt: skip
    user: str = setting(doc="the user name to register", kind="str")
    password: str = setting(doc="its password", kind="str", secret=True)
    expires_s: int = setting(600, "refreshed before expiry", lo=60, hi=86400)


def _auth_users(raw: object, at: Spot) -> tuple[SipUserConfig, ...]:
    if not isinstance(raw, dict):
        at.error(f"expected a table, got {tname(raw)}")
        return ()
    users = []
    for user, pw in raw.items():
        if isinstance(pw, dict):
            path = f"{at.join(at.key)}.{user}"
            users.append(read(SipUserConfig, pw, path, at.reader, preset={"user": user}))
        elif isinstance(pw, str):
            users.append(SipUserConfig(user, pw))
        else:
            at.error("expected a password string or a table", f"{at.key}.{user}")
    return tuple(users)


@dataclass(frozen=True, slots=True)
class SipUserConfig:
    """``[sip.auth.users]``: a user that may place calls to us (digest)."""

    user: str
    password: str = setting(doc="", kind="str", secret=True)


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: the SIP/RTP leg."""

    enabled: bool = setting(True, "")
    listen: tuple[str, ...] = setting(
        ("127.0.0.1:5060",),
        "IPv6 as `[::1]:5060`; HOST is an IP address or a host name; PORT 0 binds one free "
        "port for every transport, logged as `bound` in `sip.listening` and named in Via and "
        "Contact",
        type_doc="string or list of `HOST:PORT`", check=check_hostport,
    )  # fmt: skip
    transports: tuple[str, ...] = setting(
        ("udp", "tcp"), "", choices=("udp", "tcp"), noun="transport"
    )
    rtp_ports: tuple[int, int] = setting(
        DEFAULT_RTP_PORTS,
        "one even RTP port (+1 for RTCP) per call; LOW must be even",
        parse=_port_range, type_doc='`"LOW-HIGH"`', default_doc='`"20000-20999"`',
    )  # fmt: skip
    external_address: str = setting(
        "",
        "address put in SDP and Contact when the daemon sits behind NAT (default: the listen "
        "address). Replaces `rtp_address`, which is now an error",
        type_doc="IP address", check=_ip_address, formerly="rtp_address",
    )  # fmt: skip
    latching: str = setting(
        "strict",
        "symmetric RTP. `strict`: media is accepted only from the SDP address's host, the first "
        "source from it is locked. `learn` (callers behind NAT): when the offer's address is "
        "private, unspecified or not the signalling source, the first packet with a negotiated "
        "payload type from any host within 3 s of the answer is locked; a NAT rebind (a new port "
        "on the locked host, same SSRC, 5 consecutive packets while the old port is quiet) is "
        "followed. A third address is refused in both (docs/sip.md)",
        choices=("strict", "learn"),
    )  # fmt: skip
    outbound_proxy: str = setting(
        "",
        "every outbound call (`POST /v1/calls`) is sent there, with a `Route: <URI;lr>`; a "
        "`tel:+E164` target becomes `sip:+NUMBER@HOST;user=phone` at its host (without it: at "
        "the first registration's registrar host). A 401/407 is answered with the credentials "
        "of the registration whose registrar host is the next hop's or the target's. "
        "`;transport=tcp` calls out over TCP; `sips:` / `;transport=tls` over TLS (port 5061 "
        "by default; needs `tls_listen`)",
        type_doc="`sip:` URI", check=_sip_target,
    )  # fmt: skip
    codecs: tuple[str, ...] = setting(
        DEFAULT_CODECS, "preference order (`OPUS` or `G722` first: 16 kHz wideband with "
        "callers that offer it, docs/sip.md); telephone-event is always offered",
        choices=CODECS,
        noun="codec",
    )  # fmt: skip
    dns_servers: tuple[str, ...] = setting(
        (),
        "DNS servers asked to locate a next hop named by a host name without a port (an "
        "`originate` target, `outbound_proxy`, a trunk's proxy, a registrar): SRV, then "
        "A/AAAA (RFC 3263, docs/sip.md). Empty: the system's (`/etc/resolv.conf`; a host's own "
        "address also from `/etc/hosts`)",
        type_doc='list of `"ADDRESS"` or `"ADDRESS:PORT"`', check=_dns_servers,
    )  # fmt: skip
    allow: tuple[str, ...] = setting(
        ("127.0.0.0/8", "::1/128"),
        "sources allowed to send SIP; behind a trusted proxy, the callers it reports",
        type_doc="list of CIDRs", check=check_cidrs("not a CIDR"),
    )  # fmt: skip
    trusted_proxies: tuple[str, ...] = setting(
        (),
        "SIP proxies (Kamailio) whose `X-Callbridge-Source` header names the caller: `allow` "
        "and `invite_rate_per_source` then apply to that caller (answered 403, or 503 + "
        "Retry-After, not dropped), and the proxy itself always passes and is never "
        "rate-limited. The header is ignored from any other source. `docs/deployment.md`",
        type_doc="list of addresses or CIDRs", check=check_cidrs("not an address or CIDR"),
    )  # fmt: skip
    max_calls: int = setting(
        500, "concurrent calls; beyond it new INVITEs get 503 with Retry-After", lo=1, hi=100000
    )
    invite_rate_per_source: float = setting(
        20.0, "new INVITEs per second per source address", lo=0.1, hi=100000
    )
    rtp_timeout_s: float = setting(
        30.0, "no RTP for this long (and not on hold) ends the call", lo=1, hi=3600
    )
    session_expires_s: int = setting(1800, "RFC 4028 session interval", lo=90, hi=86400)
    keepalive_s: float = setting(
        120.0,
        "RFC 5626 CRLF keep-alive on the TCP and TLS connections the daemon opens (to peers, "
        "trunks, registrars): a double-CRLF ping every `keepalive_s` times a random 0.8-1.0 "
        "(120 s: one every 96-120 s, as RFC 5626 §4.4.1 recommends); no single-CRLF pong "
        "within 10 s closes the connection, so it is opened again and its registrations "
        "register again. `0`: no pings (for a peer that does not answer them). Pings from a "
        "peer are answered on every connection whatever this is. A reload applies it from "
        "each connection's next ping (from its reopening for one that had none)",
        lo=0, hi=3600,
    )  # fmt: skip
    auth_realm: str = setting("callbridge", "digest realm", key="auth.realm")
    auth_users: tuple[SipUserConfig, ...] = setting(
        (),
        "a password string, or a table with `password` / `password_file` / `password_env`; "
        "when any user is set, INVITEs must authenticate (digest)",
        key="auth.users", parse=_auth_users, type_doc="table: NAME = password",
        default_doc="`{}`",
    )  # fmt: skip
    registrations: tuple[SipRegistration, ...] = setting(
        (),
        "keep a REGISTER binding at a PBX or trunk (`[sip.registrations.NAME]`, below)",
        kind="tables", item=SipRegistration,
    )  # fmt: skip
    limits: ConnectionLimits = setting(
        ConnectionLimits(idle_timeout_s=1800.0), "", kind="flat", item=ConnectionLimits
    )
    tls_listen: tuple[str, ...] = setting(
        (),
        "SIP over TLS listeners (5061 is the usual port; 0 binds a free one). Calls to `sips:` "
        "/ `;transport=tls` targets go out from the first one. `allow` and the connection "
        "limits apply once the handshake is done (docs/sip.md)",
        type_doc="string or list of `HOST:PORT`", check=check_hostport,
    )  # fmt: skip
    tls_certificate_file: str = setting(
        "",
        "the TLS listener's certificate chain (PEM, leaf first); required with `tls_listen`; a "
        "file that cannot be read, or a certificate that does not match the key, is a config "
        "error naming the key (`check-config` too). `$CREDENTIALS_DIRECTORY` and other "
        "variables are expanded, so systemd `LoadCredential=` works; relative paths are from "
        "the config's directory",
        type_doc="path", check=_file,
    )  # fmt: skip
    tls_key_file: str = setting(
        "", "the TLS listener's private key (PEM); as `tls_certificate_file`",
        type_doc="path", check=_file,
    )  # fmt: skip
    security: SipSecurity = setting(SipSecurity(), "", kind="flat", item=SipSecurity)
    """``srtp``, ``tls_ca_file``, ``tls_unverified_hosts`` (one object a trunk can carry)."""


TRUNK_TRANSPORTS = ("udp", "tcp", "tls")
INBOUND_AUTH = ("source", "digest", "both")


def _trunk_hop(value: str, at: Spot) -> str:
    value = _sip_target(value, at)
    if value and not value.startswith(("sip:", "sips:")):
        at.error(f"expected a sip: URI, got {value!r}")
    return value


def _sip_user(value: str, at: Spot) -> str:
    if value and not re.fullmatch(r"[A-Za-z0-9+\-_.!~*'()]{1,64}", value):
        at.error(f"not a SIP user part (a number such as +15551230000): {value!r}")
    return value


def _display_name(value: str, at: Spot) -> str:
    if len(value) > 64 or any(c < " " or c in '"\\\x7f' for c in value):
        at.error("at most 64 characters, no quotes, backslashes or control characters")
    return value


@dataclass(frozen=True, slots=True)
class TrunkConfig:
    """``[trunks.NAME]``: a SIP trunk (a carrier or a PBX): where calls out go and how,
    and which inbound calls are its own. Calls without a trunk keep ``[sip]``'s settings."""

    name: str
    outbound_proxy: str = setting(
        doc="the carrier's termination URI (Twilio `sip:NAME.pstn.twilio.com`, Telnyx "
        "`sip:sip.telnyx.com`, Vonage `sip:sip.nexmo.com`): every call through the trunk goes "
        "there with a `Route: <URI;lr>`, and a `tel:+E164` target becomes "
        "`sip:+NUMBER@HOST;user=phone` at its host",
        kind="str", type_doc="`sip:` URI", required="the carrier's sip: URI", check=_trunk_hop,
    )  # fmt: skip
    transport: str = setting(
        "udp",
        "how calls out reach `outbound_proxy` and REGISTERs `registrar` (`tls`: port 5061 "
        "unless the URI names one; needs `sip.tls_listen`; `tcp` and `udp` need that transport "
        "in `sip.transports`). A URI that says otherwise (`sips:`, `;transport=`) is an error",
        choices=TRUNK_TRANSPORTS,
    )  # fmt: skip
    registrar: str = setting(
        "",
        "keep a REGISTER binding there with `user`/`password` (as `[sip.registrations]` "
        "does), over the trunk's `transport`: over TCP or TLS on the one connection to that "
        "host and port that calls share, registering again when it drops; `\"\"`: none (IP "
        "authentication)",
        type_doc="`sip:` URI", check=_registrar,
    )  # fmt: skip
    user: str = setting(
        "", "the trunk's user name: REGISTER and the answer to a 401/407 on calls out and on "
        "the requests we send within the trunk's calls, out and in (BYE, re-INVITE, REFER, "
        "INFO) (Twilio's credential list user, Telnyx's connection user name)",
    )  # fmt: skip
    password: str = setting("", "its password", secret=True)
    realm: str = setting(
        "", 'answer only challenges of this realm (`""`: any realm the trunk\'s hop asks)'
    )
    srtp: str = setting(
        "off",
        "SRTP (SDES) on this trunk's calls, as `sip.srtp`: `offer` or `require` need "
        "`transport = \"tls\"` (keys travel only over TLS)",
        choices=SRTP_MODES,
    )  # fmt: skip
    tls_ca_file: str = setting(
        "", "CA bundle (PEM) the trunk's certificate must chain to; `\"\"`: the system's store",
        type_doc="path", check=_file,
    )  # fmt: skip
    tls_verify: bool = setting(
        True,
        "`false`: call the trunk over TLS without verifying its certificate (a lab peer); "
        "never for a carrier",
    )  # fmt: skip
    codecs: tuple[str, ...] = setting(
        DEFAULT_CODECS, "offer and answer preference on this trunk's calls", choices=CODECS,
        noun="codec",
    )  # fmt: skip
    max_calls: int = setting(
        0, "concurrent calls on the trunk (out and in); `0`: no limit. One more call out is "
        "refused (API 503, `trunk_busy`), one more in gets SIP 503",
        lo=0, hi=100000,
    )  # fmt: skip
    calls_per_second: float = setting(
        0.0,
        "calls out per second (a bucket as deep as one second's calls, at least one); a call "
        "beyond it is refused at once (API 429, `trunk_rate_limited`, with the seconds to wait "
        "in `Retry-After`), never queued; `0`: no limit",
        lo=0, hi=10000,
    )  # fmt: skip
    caller_id: str = setting(
        "",
        "the From user on calls out (a number the carrier lets you present, `+15551230000`); "
        "the API's `from` overrides it; `\"\"`: `callbridge`",
        check=_sip_user,
    )  # fmt: skip
    caller_name: str = setting(
        "", 'the From display name on calls out (`""`: none)', check=_display_name
    )
    sources: tuple[str, ...] = setting(
        (),
        "addresses (CIDRs) the trunk's inbound calls come from (Twilio, Telnyx and Vonage "
        "publish theirs); such a call is the trunk's: its codecs and SRTP apply, and its "
        "route sees `trunk` in `call.started`'s `custom_parameters`. Add them to `sip.allow` "
        "too",
        type_doc="list of CIDRs", check=check_cidrs("not a CIDR"),
    )  # fmt: skip
    inbound_auth: str = setting(
        "source",
        "how an inbound call is known to be the trunk's: `source` (it comes from `sources`; "
        "no digest asked), `digest` (it answers a digest challenge for `user`/`password`, from "
        "any address `sip.allow` lets in), `both` (from `sources` and with that answer)",
        choices=INBOUND_AUTH,
    )  # fmt: skip

    @property
    def hop_transport(self) -> str:
        return self.transport.upper()

    @property
    def next_hop(self) -> str:
        """``outbound_proxy`` with the trunk's transport on it."""
        return _with_transport(self.outbound_proxy, self.transport)

    @property
    def registrar_hop(self) -> str:
        """``registrar`` with the trunk's transport on it: where and how its REGISTERs go
        (``outbound_target(registrar_hop)``); "" without a registrar."""
        return _with_transport(self.registrar, self.transport) if self.registrar else ""

    @property
    def security(self) -> SipSecurity:
        """The trunk's SRTP and TLS verification, as ``[sip]``'s ``SipSecurity``
        (``tls_verify = false``: neither the proxy's nor the registrar's host verified)."""
        unverified: list[str] = []
        if not self.tls_verify:
            for uri in (self.outbound_proxy, self.registrar):
                with contextlib.suppress(ValueError):
                    host = outbound_target(uri).host.lower() if uri else ""
                    if host and host not in unverified:
                        unverified.append(host)
        return SipSecurity(self.srtp, self.tls_ca_file, tuple(unverified))


def _with_transport(uri: str, transport: str) -> str:
    """``uri`` with ``;transport=`` for a stream transport, unless it says one itself."""
    if transport == "udp" or ";transport=" in uri.lower() or uri.startswith("sips:"):
        return uri
    head, sep, tail = uri.partition("?")
    return f"{head};transport={transport}{sep}{tail}"


def _check_trunk(values: dict[str, Any], at: Spot) -> None:
    """The URIs' own transport (the proxy's, the registrar's) agrees with ``transport``;
    SRTP only over TLS; digest needs credentials."""
    transport = values["transport"]
    for key in ("outbound_proxy", "registrar"):
        hop = values[key]
        unread = any(e.startswith(at.join(key)) for e in at.reader.errors)
        if hop and not unread:
            said = outbound_target(hop).transport.lower()
            if (hop.startswith("sips:") or ";transport=" in hop.lower()) and said != transport:
                at.error(f"the URI says {said}, but transport is {transport!r}", key)
    if values["srtp"] != "off" and transport != "tls":
        at.error(f"{values['srtp']!r} needs transport = \"tls\" (SDES keys travel only over TLS)",
                 "srtp")  # fmt: skip
    if values["inbound_auth"] != "source" and not (values["user"] and values["password"]):
        at.error(f"{values['inbound_auth']!r} needs user and password", "inbound_auth")
    if values["registrar"] and not (values["user"] and values["password"]):
        at.error("needs user and password", "registrar")


register_check(TrunkConfig, _check_trunk)


def check_trunks(trunks: tuple[TrunkConfig, ...], sip: SipConfig, at: Spot) -> None:
    """What trunks need of ``[sip]``: a listener of the trunk's transport, which its calls
    out and REGISTERs leave from (TLS: ``tls_listen``; UDP, TCP: ``transports``)."""
    have = {t.lower() for t in sip.transports} if sip.listen else set()
    for t in trunks:
        if t.transport == "tls" and not sip.tls_listen:
            at.error("'tls' needs sip.tls_listen (calls out and REGISTERs over TLS leave from "
                     "it)", f"trunks.{t.name}.transport")  # fmt: skip
        elif t.transport != "tls" and t.transport not in have:
            at.error(f"{t.transport!r} needs {t.transport!r} in sip.transports (calls out and "
                     f"REGISTERs over {t.transport.upper()} leave from it)",
                     f"trunks.{t.name}.transport")  # fmt: skip


def _check_sip_tls(values: dict[str, Any], at: Spot) -> None:
    """The certificate and key with ``tls_listen``; SDES keys only with TLS."""
    listen, cert, key = values["tls_listen"], values["tls_certificate_file"], values["tls_key_file"]
    for name in ("tls_certificate_file", "tls_key_file"):
        if listen and not values[name]:
            at.error("required with sip.tls_listen", name)
    unread = any(
        e.startswith(("sip.tls_certificate_file", "sip.tls_key_file")) for e in at.reader.errors
    )
    if listen and cert and key and not unread:
        try:  # a pair that does not match fails check-config, not only the start
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as e:
            why = getattr(e, "reason", None) or type(e).__name__
            at.error(f"not a certificate chain and its key ({why})", "tls_certificate_file")
    srtp = values["security"].srtp
    if srtp != "off" and not listen:
        at.error(f"{srtp!r} needs sip.tls_listen: SRTP keys (SDES) travel only over TLS", "srtp")
    _check_registrations(values, at)  # one check a class: register_check keeps the last


register_check(SipConfig, _check_sip_tls)


def _check_registrations(values: dict[str, Any], at: Spot) -> None:
    """A registrar's (or the outbound proxy's) transport needs a listener of that
    transport to register (or call) from."""
    have = {t.upper() for t in values["transports"] if values["listen"]}
    if values["tls_listen"]:
        have.add("TLS")
    uses = [
        (f"registrations.{r.name}.registrar", r.registrar, "REGISTER")
        for r in values["registrations"]
    ]
    if values["outbound_proxy"]:
        uses.append(("outbound_proxy", values["outbound_proxy"], "calling out"))
    for key, uri, what in uses:
        try:
            transport = outbound_target(uri).transport
        except ValueError:
            continue  # reported on the key itself
        if transport not in have:
            needs = (
                "sip.tls_listen"
                if transport == "TLS"
                else f"{transport.lower()!r} in sip.transports"
            )
            at.error(f"{uri}: {what} over {transport} needs {needs}", key)

"""Configuration of the SIP engines: frozen dataclasses built by the config loader.

``SipConfig`` is the ``[sip]`` section as the config file gives it (each key a
``bridge.settings.setting`` field: what the reader checks and the reference says);
the shell turns it into the engines' own ``SipSettings``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from bridge.settings import (
    ConnectionLimits,
    Spot,
    check_cidrs,
    check_hostport,
    read,
    setting,
    tname,
)
from bridge.sip.uri import outbound_target

__all__ = [
    "CODECS",
    "SipAuthUser",
    "SipConfig",
    "SipRegistration",
    "SipSettings",
    "SipUserConfig",
    "TimerSettings",
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
    min_se_s: int = 90
    """Smallest session interval we accept (Min-SE); smaller requests get 422."""
    register_expires_s: int = 3600
    """Expires we ask for in REGISTER; refreshed at half of the granted value."""
    codecs: tuple[str, ...] = ("PCMU", "PCMA")
    """SDP codec preference order."""


# ------------------------------------------------------------ [sip] in the config


CODECS = ("PCMU", "PCMA")


DEFAULT_RTP_PORTS = (20000, 20999)


def _ip_address(value: str, at: Spot) -> str:
    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            at.error(f"expected an IP address, got {value!r}")
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
    return _sip_target(value, at)


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
        doc="PBX or trunk to register with (`sips:` is refused: no TLS yet)",
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
        "of the registration whose registrar host is the next hop's or the target's. `sips:` / "
        '`transport=tls` are refused ("TLS transport not supported yet"), for targets too; '
        "`;transport=tcp` calls out over TCP",
        type_doc="`sip:` URI", check=_sip_target,
    )  # fmt: skip
    codecs: tuple[str, ...] = setting(
        CODECS, "preference order; telephone-event is always offered", choices=CODECS,
        noun="codec",
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

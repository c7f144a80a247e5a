"""The daemon's configuration: one TOML file, loaded once into frozen dataclasses.

Theory of operation
-------------------
``load_config(path)`` reads the file, validates *every* key, and either
returns a ``Config`` or raises ``ConfigError`` carrying every problem found,
each naming its key (``providers.main.protocol: unknown protocol 'kovaa'
(expected one of kova, kugelaudio, kletso, coda, zwst)``). Nothing is
half-loaded: a config either validates completely or is rejected whole (which
is what makes SIGHUP reload safe).

Every key is a field declared with ``bridge.settings.setting``: its type, range,
choices, whether it is a secret, and its description are written there once, and
the one reader (``bridge.settings.read``) walks those fields. The dataclasses
below are the sections; ``[bargein]`` is the detector's own ``BargeInPolicy``.
Checks of one key are functions on its field (``check``, ``parse``); checks of
several keys together are registered per class (``register_check``).

Secrets (``api_key``, ``token``, ``twilio_auth_token``, SIP passwords) may be
given inline, or as ``<key>_file`` (a path; ``$CREDENTIALS_DIRECTORY`` and
other environment variables are expanded, so systemd ``LoadCredential=``
works), or as ``<key>_env`` (the name of an environment variable). Secret
fields are excluded from ``repr`` so they never reach a log line.

The keys documented in ``config/README.md`` are the public interface.

Adding a key: one ``setting(default, "what it does", ...)`` field in its section's
dataclass (a range with ``lo``/``hi``, ``choices``, ``secret=True``, a ``check``
function for anything else).
"""

from __future__ import annotations

import dataclasses
import importlib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.media.bargein import BargeInPolicy
from bridge.settings import (
    Reader,
    Row,
    Spot,
    keys_of,
    read,
    reference_rows,
    register_check,
    setting,
    tname,
    unknown_key,
)
from bridge.sip.uri import outbound_target
from bridge.tts.base import OptionType

__all__ = [
    "PROTOCOLS",
    "ApiConfig",
    "Config",
    "ConfigError",
    "ConnectionLimits",
    "DaemonConfig",
    "FlowConfig",
    "FlowStep",
    "MediaStreamsConfig",
    "ProviderConfig",
    "RouteConfig",
    "SipAuthUser",
    "SipConfig",
    "SipRegistration",
    "load_config",
    "parse_config",
    "secret_values",
]

PROTOCOLS = ("kova", "kugelaudio", "kletso", "coda", "zwst")
CODECS = ("PCMU", "PCMA")
STEP_ACTIONS = ("say", "transfer", "hangup", "app", "voice_agent")
DEFAULT_RTP_PORTS = (20000, 20999)


class ConfigError(Exception):
    """The configuration is invalid; ``errors`` lists every problem, one per key."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ------------------------------------------------------------- validators
# Each takes the value read and where it is (``Spot``), reports what is wrong
# through it, and returns the value to keep.


def _parse_hostport(value: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", value)
    if not m:
        return None
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        return None
    return host, port


_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+")


def _host_problem(host: str) -> str | None:
    """Why ``host`` (of a HOST:PORT) is neither an IP address nor a host name, if it is not."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address"
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address"
        return None
    if not _HOSTNAME.fullmatch(host):
        return f"{host!r} is not a host name"
    return None


def _hostport_problem(value: str) -> str | None:
    hp = _parse_hostport(value)
    if hp is None:
        return f"expected HOST:PORT (IPv6 as [ADDR]:PORT), got {value!r}"
    if problem := _host_problem(hp[0]):
        return f"{problem} in {value!r}"
    return None


def split_hostport(value: str) -> tuple[str, int]:
    """``"127.0.0.1:5060"`` / ``"[::1]:5060"`` → ``(host, port)`` (value already validated)."""
    hp = _parse_hostport(value)
    if hp is None:
        raise ValueError(f"not HOST:PORT: {value!r}")
    return hp


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen_is_public(listen: str) -> bool:
    """Whether a valid ``listen`` address is not loopback (False if it is not valid)."""
    return _hostport_problem(listen) is None and not _is_loopback(split_hostport(listen)[0])


def _hostport(value: Any, at: Spot) -> Any:
    """A ``HOST:PORT``, or each of a list of them (then named ``key[i]``)."""
    listed = isinstance(at.table.get(at.key), list)
    for i, v in enumerate((value,) if isinstance(value, str) else value):
        if problem := _hostport_problem(v):
            at.error(problem, f"{at.key}[{i}]" if listed else at.key)
    return value


def _ws_url(value: str, at: Spot) -> str:
    if value and not value.startswith(("ws://", "wss://")):
        at.error(f"expected a ws:// or wss:// URL, got {value!r}")
    return value


def _cidrs(what: str) -> Any:
    def check(value: tuple[str, ...], at: Spot) -> tuple[str, ...]:
        for a in value:
            try:
                ipaddress.ip_network(a, strict=False)
            except ValueError:
                at.error(f"{what}: {a!r}")
        return value

    return check


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


def _at_least_16(value: str, at: Spot) -> str:
    if value and len(value) < 16:
        at.error("must be at least 16 characters")
    return value


def _path(value: str, at: Spot) -> str:
    """A relative path is relative to the config file's directory (``""`` stays ``""``)."""
    return str(at.reader.base_dir / value) if value else ""


def _cpus(value: str, at: Spot) -> str:
    try:
        cpus = parse_cpu_list(value)
    except ValueError as e:
        at.error(str(e))
        return ""
    count = os.cpu_count() or 1
    if cpus and max(cpus) >= count:
        at.error(f"no CPU {max(cpus)} here (CPUs: 0-{count - 1})")
        return ""
    return value


def _transfer_uri(value: str, at: Spot) -> str:
    if value and not value.startswith(("sip:", "sips:", "tel:")):
        at.error(f"expected a sip: or tel: URI, got {value!r}")
    return value


def _provider_url(value: str, at: Spot) -> str:
    if value != "embedded" and not value.startswith(("ws://", "wss://", "http://", "https://")):
        at.error(f'expected a ws(s):// URL or "embedded", got {value!r}')
    return value


# --------------------------------------------------------------- sections


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


def _auth_users(raw: object, at: Spot) -> tuple[SipAuthUser, ...]:
    if not isinstance(raw, dict):
        at.error(f"expected a table, got {tname(raw)}")
        return ()
    users = []
    for user, pw in raw.items():
        if isinstance(pw, dict):
            path = f"{at.join(at.key)}.{user}"
            users.append(read(SipAuthUser, pw, path, at.reader, preset={"user": user}))
        elif isinstance(pw, str):
            users.append(SipAuthUser(user, pw))
        else:
            at.error("expected a password string or a table", f"{at.key}.{user}")
    return tuple(users)


@dataclass(frozen=True, slots=True)
class SipAuthUser:
    """``[sip.auth.users]``: a user that may place calls to us (digest)."""

    user: str
    password: str = setting(doc="", kind="str", secret=True)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A listener's bounds on its TCP connections (``max_connections`` ... in its section).

    ``header_timeout_s``: a connection must complete its request (HTTP head and
    body) or its SIP message within this time of opening or of the message's
    first byte. ``idle_timeout_s`` (SIP over TCP only; 0 = never): a
    connection that carried no complete message for this long is closed.
    """

    max_connections: int = setting(
        4096, "open TCP connections; one more is closed as it is accepted, before anything is read",
        lo=1, hi=1_000_000,
    )  # fmt: skip
    max_connections_per_source: int = setting(
        1024,
        "open connections from one address (at most `max_connections`); behind a proxy "
        "(HAProxy, Kamailio) every connection has the proxy's address: raise it there",
        lo=1, hi=1_000_000,
    )  # fmt: skip
    header_timeout_s: float = setting(
        10.0,
        "an HTTP request (head and body) or a SIP message must be complete within this time "
        "of its first byte (or of the connection's opening); else the connection is closed "
        "unanswered",
        lo=0.1, hi=3600,
    )  # fmt: skip
    idle_timeout_s: float = setting(
        0.0,
        "`[sip]` only: a SIP TCP connection that carried no message (nor keepalive) for this "
        "long is closed; `0`: never. Keep it above `session_expires_s`: a call's dialog uses "
        "its connection",
        lo=0, hi=86400, default_doc="`1800`",
    )  # fmt: skip


def _check_limits(values: dict[str, Any], at: Spot) -> None:
    most = values["max_connections"]
    key = "max_connections_per_source"
    if at.table.get(key) != values[key]:  # not given, or not an integer (reported)
        values[key] = min(values[key], most)
    elif values[key] > most:
        at.error(f"{values[key]} exceeds max_connections ({most})", key)


register_check(ConnectionLimits, _check_limits)


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: the SIP/RTP leg."""

    enabled: bool = setting(True, "")
    listen: tuple[str, ...] = setting(
        ("127.0.0.1:5060",),
        "IPv6 as `[::1]:5060`; HOST is an IP address or a host name; PORT 0 binds one free "
        "port for every transport, logged as `bound` in `sip.listening` and named in Via and "
        "Contact",
        type_doc="string or list of `HOST:PORT`", check=_hostport,
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
        type_doc="list of CIDRs", check=_cidrs("not a CIDR"),
    )  # fmt: skip
    trusted_proxies: tuple[str, ...] = setting(
        (),
        "SIP proxies (Kamailio) whose `X-Callbridge-Source` header names the caller: `allow` "
        "and `invite_rate_per_source` then apply to that caller (answered 403, or 503 + "
        "Retry-After, not dropped), and the proxy itself always passes and is never "
        "rate-limited. The header is ignored from any other source. `docs/deployment.md`",
        type_doc="list of addresses or CIDRs", check=_cidrs("not an address or CIDR"),
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
    auth_users: tuple[SipAuthUser, ...] = setting(
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


@dataclass(frozen=True, slots=True)
class MediaStreamsConfig:
    """``[media_streams]``: Twilio-style media-stream WebSockets."""

    enabled: bool = setting(True, "")
    listen: str = setting(
        "127.0.0.1:8080",
        "Twilio (`/twilio`), Telnyx, Plivo, Exotel, Vonage paths and `POST /twiml`. Not "
        "loopback: the daemon refuses to start without a credential (`stream_token`, "
        "`twilio_auth_token`, `plivo_auth_token` or `single_use_tokens`) and without "
        "`public_url`, and a dialect with no credential of its own is refused (403)",
        type_doc="`HOST:PORT`", check=_hostport,
    )  # fmt: skip
    public_url: str = setting(
        "",
        "the URL carriers reach (`wss://host`, or its `/twilio` URL: the same), for TwiML and "
        "signature checks behind a proxy; `POST /twiml` is checked against its `https://` "
        "spelling",
        type_doc="`ws(s)://` URL", check=_ws_url,
    )  # fmt: skip
    twilio_auth_token: str = setting(
        "",
        "when set, Twilio upgrades must carry a valid `X-Twilio-Signature` (else 403), and so "
        "must `POST /twiml` (Twilio's webhook signature over the URL and the sorted POST "
        "parameters). Without it, a public listener refuses `POST /twiml`",
        secret=True,
    )  # fmt: skip
    plivo_auth_token: str = setting(
        "",
        "when set, Plivo upgrades must carry a valid `X-Plivo-Signature-V3` (with its nonce, "
        "each nonce once), else 403",
        secret=True,
    )  # fmt: skip
    single_use_tokens: bool = setting(
        False,
        "every stream's `start` must carry a per-call token (custom parameter `token`), bound "
        "to the carrier's call id, used once, valid `token_ttl_s`. `POST /twiml` mints "
        "Twilio's (one per `CallSid`: a replayed webhook gets 409); `POST /v1/stream-tokens` "
        "mints the other carriers' (docs/http-api.md)",
    )  # fmt: skip
    token_secret: str = setting(
        "",
        "HMAC key of those tokens; give every node behind a load balancer the same one",
        secret=True, check=_at_least_16, type_doc="secret, ≥ 16 characters",
        default_doc="random per process",
    )  # fmt: skip
    stream_token: str = setting(
        "",
        "when set, every dialect's upgrade must present it (`Authorization: Bearer`, Basic "
        "password, or `?token=`), else 403; Twilio and Plivo, which cannot add a header, may "
        "send it as the `start` custom parameter `stream_token` instead (else closed 1008). A "
        "signed `POST /twiml` puts it there",
        secret=True,
    )  # fmt: skip
    max_message_bytes: int = setting(
        64 * 1024, "largest inbound WebSocket message", lo=1024, hi=16 * 1024 * 1024
    )
    lead_ms: int = setting(
        60,
        "how far ahead of real time outbound audio is sent to a buffering carrier",
        lo=20, hi=1000,
    )  # fmt: skip
    limits: ConnectionLimits = setting(
        ConnectionLimits(), "", kind="flat", item=ConnectionLimits, exclude=("idle_timeout_s",)
    )
    token_ttl_s: float = setting(30.0, "lifetime of a single-use token", lo=1, hi=3600)
    max_streams: int = setting(
        1000,
        "media-stream WebSockets open at once; beyond it an upgrade gets 503 + Retry-After "
        "(SIP's `max_calls` is separate)",
        lo=1, hi=1_000_000,
    )  # fmt: skip


def _check_media_streams(values: dict[str, Any], at: Spot) -> None:
    listen = values["listen"]
    if not (values["enabled"] and _listen_is_public(listen)):
        return
    # a public listener fails closed: no credential, no listener
    credentials = ("twilio_auth_token", "plivo_auth_token", "stream_token", "single_use_tokens")
    if not any(values[k] for k in credentials):
        at.error(
            f"a credential is required when media_streams.listen is not loopback ({listen}):"
            " set stream_token, twilio_auth_token, plivo_auth_token or single_use_tokens",
            "stream_token",
        )
    if not values["public_url"]:
        at.error(
            f"required when media_streams.listen is not loopback ({listen}): signatures"
            " are checked against it, never against the request's Host header",
            "public_url",
        )


register_check(MediaStreamsConfig, _check_media_streams)


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """``[api]``: HTTP API, health, metrics."""

    enabled: bool = setting(True, "")
    listen: str = setting(
        "127.0.0.1:8081", "HTTP API, `/healthz`, `/readyz`, `/metrics`",
        type_doc="`HOST:PORT`", check=_hostport,
    )  # fmt: skip
    token: str = setting(
        "", "bearer token for `/v1/*`; **required** when `listen` is not loopback", secret=True
    )
    limits: ConnectionLimits = setting(
        ConnectionLimits(), "", kind="flat", item=ConnectionLimits, exclude=("idle_timeout_s",)
    )
    metrics_auth: bool = setting(
        True,
        "with a `token` set, `/metrics` needs it too (401 otherwise); `false` leaves "
        "`/metrics` open for a scraper without the token",
    )  # fmt: skip


def _check_api(values: dict[str, Any], at: Spot) -> None:
    listen = values["listen"]
    if not values["token"] and _listen_is_public(listen):
        at.error(f"required when api.listen is not loopback ({listen})", "token")


register_check(ApiConfig, _check_api)


def _speaks_whole_text(protocol: object, t: Mapping[str, Any]) -> bool:
    """Whether the provider speaks a turn only once all its text is in (no pacing then)."""
    return protocol == "kletso" or (protocol == "coda" and t.get("input_mode") == "complete")


def _protocol_options(protocol: str) -> dict[str, OptionType] | None:
    """The options ``protocol`` declares (``OPTIONS`` of its client engine module, the one
    place they are written); ``None`` for an unknown protocol (already an error)."""
    if protocol not in PROTOCOLS:
        return None
    options: dict[str, OptionType] = importlib.import_module(f"bridge.tts.{protocol}").OPTIONS
    return options


def _option_problem(kind: OptionType, v: object) -> str | None:
    """What is wrong with the value ``v`` of an option of type ``kind``, if anything."""
    if isinstance(kind, tuple):
        if v in kind:
            return None
        return f"unknown value {v!r} (expected one of {', '.join(kind)})"
    if kind is bool:
        ok = isinstance(v, bool)
    elif kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind is float:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
    else:
        ok = isinstance(v, kind)
    if ok:
        return None
    want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return f"expected {want.get(kind, kind.__name__)}, got {tname(v)}"


def _options(extras: dict[str, Any], at: Spot) -> tuple[tuple[str, Any], ...]:
    """The keys no other field of a provider claims: its protocol's options."""
    protocol = at.values.get("protocol", "")
    declared = _protocol_options(protocol)
    if declared is None:
        return ()
    options: list[tuple[str, Any]] = []
    for k, v in extras.items():
        kind = declared.get(k)
        if kind is None:
            known = keys_of(ProviderConfig) | set(declared)
            at.error(f"{unknown_key(k, known)}; {protocol} options: {', '.join(declared)}", k)
        elif problem := _option_problem(kind, v):
            at.error(problem, k)
        else:
            options.append((k, v))
    return tuple(options)


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """``[providers.NAME]``: one TTS / voice provider."""

    name: str
    protocol: str = setting(
        doc="which seed protocol the provider speaks", kind="str", choices=PROTOCOLS,
        noun="protocol", required="expected one of " + ", ".join(PROTOCOLS),
        type_doc=", ".join(f"`{p}`" for p in PROTOCOLS),
    )  # fmt: skip
    url: str = setting(
        doc='`embedded` starts `callbridge tts-server` as a supervised child on a free '
        "loopback port",
        kind="str", required='a ws:// or wss:// URL, or "embedded"', check=_provider_url,
        type_doc='`ws(s)://...`, `http(s)://...` (zwst session route) or `"embedded"`',
    )  # fmt: skip
    api_key: str = setting("", "sent the way the protocol says (query, header, token)", secret=True)
    voice: str = setting("", "default voice")
    model: str = setting("", "model id where the protocol has one")
    engine: str = setting(
        "piper", "for `embedded` providers: the synthesis engine", choices=("piper", "tone")
    )
    options: tuple[tuple[str, str | int | float | bool], ...] = setting(
        (),
        "passed to the engine; each protocol declares its own (`OPTIONS` in "
        "`bridge/tts/<protocol>.py`, below) and any other key is an error "
        "(`providers.main.apikey: unknown key (did you mean api_key?)`)",
        kind="custom", extra=_options, type_doc="as below", default_doc="",
    )  # fmt: skip
    turns_per_connection: int = setting(
        0,
        "open another connection once every one carries this many turns; 0: the protocol's "
        "own limit (Kova 64, Coda 16, one where the protocol multiplexes nothing). 1 suits a "
        "busy node: a turn that shares a connection waits for the audio the provider queued "
        "before it for the other turns there (a connection per call in progress costs memory, "
        "bench_memory). Connections left idle are closed after `close_idle_after_s` "
        "(docs/providers.md)",
        lo=0, hi=1024,
    )  # fmt: skip
    flow_control_ahead_s: float = setting(
        0.0,
        "stop reading a connection while every turn on it has more than this much audio ahead "
        "of playout (it reads again when one is down to half, when a turn opens on it, when "
        "its last turn is dropped, and after at most 5 s), so the provider's excess waits in "
        "its own buffers; 0: off. Pausing holds back every turn on the connection: with "
        "several turns per connection it keeps the other turns' audio in front of a restarted "
        "turn; with `turns_per_connection = 1` and a provider faster than real time, 4 is "
        "recommended on a busy node (docs/providers.md). Never applied to zwst",
        lo=0.0, hi=600.0,
    )  # fmt: skip
    text_ahead_s: float = setting(
        3.0,
        "text pacing: a turn's text goes to the provider a sentence at a time, while its audio "
        "reaches less than this far past what has played (counting text sent and not yet "
        "answered at 30 characters a second), so a call holds a few seconds of a long turn "
        "rather than all of it, and text a barge-in, cancel or hang-up cuts is never sent "
        "(never synthesized or billed). 0 sends the text as it comes. A provider that answers "
        "nothing for 1 s gets the rest at once. A paced turn stays open at the provider about "
        "as long as it plays (a connection per talking call on KugelAudio): where a provider "
        "caps concurrent connections or contexts, set 0. Cacheable turns (greetings, flow "
        "prompts) are spoken whole to be cached, unless `[daemon] prompt_cache_bytes = 0` "
        "(docs/providers.md)",
        lo=0.0, hi=600.0,
        default_from=lambda t: 0.0 if _speaks_whole_text(t.get("protocol"), t) else 3.0,
        default_doc='`3`; `0` for `kletso` and for `coda` with `input_mode = "complete"`',
    )  # fmt: skip
    close_idle_after_s: float = setting(
        60.0,
        "close a connection that has held no turn this long (0: never). The newest idle "
        "connection of each kind (the spare the next turn takes) stays open, and the pool "
        "never goes below one open connection",
        lo=0.0, hi=86400.0,
    )  # fmt: skip
    first_audio_timeout_s: float | None = setting(
        None,
        "this provider's first-audio deadline (`[daemon] first_audio_timeout_s`); 0: off for "
        "this provider. Raise it for a provider known to start slowly rather than lose its "
        "turns to the next one",
        kind="float", lo=0.0, hi=600.0, default_doc="`[daemon]`'s",
    )  # fmt: skip

    @property
    def embedded(self) -> bool:
        return self.url == "embedded"


def _branch(raw: object, at: Spot) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        at.error(f"expected a table, got {tname(raw)}")
        return ()
    branch = []
    for k, v in raw.items():
        if not (k in ("timeout", "default") or re.fullmatch(r"[0-9*#A-D]+", k)):
            at.error("expected digits (0-9 * # A-D), 'timeout' or 'default'", f"{at.key}.{k}")
        if not isinstance(v, str):
            at.error("expected a step name", f"{at.key}.{k}")
            continue
        branch.append((k, v))
    return tuple(branch)


@dataclass(frozen=True, slots=True)
class FlowStep:
    """One step of an IVR flow: an action, then where to go."""

    name: str
    say: str = setting("", "text spoken")
    interruptible: bool = setting(
        True, "`false`: caller speech and keys do not cut it (legal notices)"
    )
    gather_max_digits: int = setting(
        0, "collect up to this many digits after (and during) the prompt",
        key="gather.max_digits", lo=0, hi=64,
        default_from=lambda gather: 1 if gather else 0,
        default_doc="`1` with a `gather` table, else `0`",
    )  # fmt: skip
    gather_timeout_s: float = setting(
        5.0, "how long to wait for the digits", key="gather.timeout_s", lo=0.5, hi=600
    )
    gather_terminator: str = setting(
        "#", "the key that ends the digits early", key="gather.terminator"
    )
    branch: tuple[tuple[str, str], ...] = setting(
        (), "digits → step, plus `timeout` and `default`; needs `gather`",
        parse=_branch, type_doc="table", default_doc="",
    )  # fmt: skip
    next: str = setting("", "where to go after `say`", type_doc="step name")
    transfer: str = setting("", "blind transfer", type_doc="`sip:`/`tel:` URI", check=_transfer_uri)
    hangup: bool = setting(False, "hang up after `say`")
    app: str = setting(
        "", "hand the call to an application", type_doc="`ws(s)://` URL", check=_ws_url
    )
    voice_agent: str = setting(
        "", "hand the call to a Kletso voice agent", type_doc="provider name"
    )

    @property
    def gathers(self) -> bool:
        return self.gather_max_digits > 0


def _check_step(values: dict[str, Any], at: Spot) -> None:
    step = FlowStep(**values)
    if step.branch and not step.gathers:
        at.error("a branch needs a gather in the same step", "branch")
    ends = step.hangup or step.transfer or step.app or step.voice_agent
    if not (ends or step.next or step.branch):
        at.reader.err(
            at.path, "step leads nowhere: give next, branch, hangup, transfer, app or voice_agent"
        )
    if not (step.say or ends or step.gathers):
        at.reader.err(
            at.path, "step does nothing: give say, gather, hangup, transfer, app or voice_agent"
        )


register_check(FlowStep, _check_step)


def _first_step(t: Mapping[str, Any]) -> str:
    steps = t.get("steps")
    return next(iter(steps), "") if isinstance(steps, dict) else ""


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """``[flows.NAME]``: an IVR flow written in the config."""

    name: str
    start: str = setting(
        doc="first step", kind="str", default_from=_first_step, type_doc="step name",
        default_doc="the first step written",
    )  # fmt: skip
    steps: tuple[FlowStep, ...] = setting(
        doc="one step (`[flows.NAME.steps.STEP]`, keys below)", kind="tables", item=FlowStep,
        fallback=lambda name: FlowStep(name=name, hangup=True),
    )  # fmt: skip

    def step(self, name: str) -> FlowStep:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


def _check_flow(values: dict[str, Any], at: Spot) -> None:
    steps: tuple[FlowStep, ...] = values["steps"]
    if not steps:
        at.error("a flow needs at least one step", "steps")
        return
    names = {s.name for s in steps}
    if values["start"] not in names:
        at.error(f"unknown step {values['start']!r}", "start")
    for s in steps:
        sp = f"steps.{s.name}"
        if s.next and s.next not in names:
            at.error(f"unknown step {s.next!r}", f"{sp}.next")
        for digit, target in s.branch:
            if target not in names:
                at.error(f"unknown step {target!r}", f"{sp}.branch.{digit}")


register_check(FlowConfig, _check_flow)


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """``[[routes]]``: which provider, greeting, flow and application a call gets."""

    match: str = setting(
        doc="the key it fits (`*` and `?` as in a shell); two routes with the same `match` are an "
        "error (the second could never be reached)",
        kind="str", default_from=lambda t: "*", type_doc="glob (`*`, `?`)", default_doc="`\"*\"`",
    )  # fmt: skip
    provider: tuple[str, ...] = setting(
        doc="a list is a failover chain: a turn that fails before its first audio is retried "
        "on the next. A route with neither `flow` nor `app` whose first provider is a `kletso` "
        "voice agent hands the call to the agent (greeting included): the caller talks with it "
        "(docs/providers.md)",
        kind="strs", required="a provider name or a failover list",
        type_doc="name or list of names",
    )  # fmt: skip
    greeting: str = setting("", "spoken on answer")
    flow: str = setting("", "IVR flow run after the greeting", type_doc="flow name")
    app: str = setting(
        "", "application WebSocket opened per call", type_doc="`ws(s)://` URL", check=_ws_url
    )
    voice: str = setting("", "overrides the provider's voice")
    fallback_flow: str = setting(
        "", "run when the application cannot be reached", type_doc="flow name"
    )
    fallback_prompt: str = setting(
        "",
        "heard in place of a turn no provider could render (`\"\"`: `[daemon] "
        "fallback_prompt`); rendered and cached at start-up. The app or flow still gets "
        "`provider.error` and the turn ends `provider_error`",
    )  # fmt: skip

    def matches(self, key: str) -> bool:
        if self.match == "*":
            return True
        return re.fullmatch(_glob_to_regex(self.match), key) is not None


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """``[daemon]``: process-wide settings."""

    drain_timeout_s: float = setting(
        30.0,
        "on SIGTERM, how long calls in progress may continue before they are ended",
        lo=0, hi=3600,
    )  # fmt: skip
    log_level: str = setting("info", "", choices=("debug", "info", "warning", "error"))
    log_format: str = setting(
        "auto",
        "`auto`: console on a terminal, JSON otherwise (journald)",
        choices=("auto", "json", "console"),
    )  # fmt: skip
    event_loop: str = setting(
        "uvloop", "falls back to asyncio if uvloop is missing", choices=("uvloop", "asyncio")
    )
    cache_dir: str = setting(
        "",
        "where rendered prompts are kept across restarts (`\"\"`: in memory only; relative: to "
        "the config file's directory). The installed config sets `/var/cache/callbridge`, the "
        "unit's `CacheDirectory`; `make run` uses `config/.cache`. An unusable directory is "
        'logged and the cache stays in memory (docs/operations.md, "Prompt cache")',
        type_doc="path", check=_path,
    )  # fmt: skip
    prompt_cache_bytes: int = setting(
        32 * 1024 * 1024,
        "bound of the cache of rendered prompts, in bytes of audio, in memory and on disk "
        "(least recently used out); `0`: no cache, prompts are rendered for every call",
        lo=0, hi=1 << 34,
    )  # fmt: skip
    max_loop_lag_ms: float = setting(
        20.0,
        "when outbound frames leave this late on average (the core is saturated), new calls "
        "get 503 + Retry-After so the calls in progress keep their pacing; `0` switches it off",
        lo=0, hi=1000,
    )  # fmt: skip
    gc_freeze_s: float = setting(
        0.1,
        "while calls are up, what has lived this long is frozen out of the cyclic garbage "
        "collector's sight, so a full collection (which stops every call's frames) walks only "
        "newer objects; `0` leaves the collector as plain CPython has it. See "
        'docs/operations.md, "Garbage collection"',
        lo=0, hi=3600,
    )  # fmt: skip
    gc_thaw_s: float = setting(
        600.0,
        "with calls up and evidence of reference cycles (an ended call not freed 30 s after "
        "its end, the collector's own passes finding 1 000 or more unreachable objects since "
        "the last thaw, or the last thaw finding that many), how often frozen objects are "
        "thawed and fully collected anyway (one long pass, 20-40 ms at 100 calls); with no "
        "evidence that happens once a day, and with no call up at once (docs/operations.md, "
        '"Garbage collection")',
        lo=1, hi=86400,
    )  # fmt: skip
    prerender_wait_s: float = setting(
        60.0,
        "at start-up and on reload every static prompt (greetings, flow `say`s, fallback "
        "prompts) is rendered before `READY=1` / before the new config takes calls, waiting at "
        "most this long (past it the daemon serves and rendering goes on); `0`: do not wait "
        "(rendering still starts at once). Keep it under systemd's `TimeoutStartSec` (90 s)",
        lo=0, hi=3600,
    )  # fmt: skip
    fallback_prompt: str = setting(
        "",
        "heard in place of a turn no provider could render (refused, failed, timed out, "
        "failover chain exhausted), for routes without their own; `\"\"`: none (the turn "
        "fails as before and the flow goes on to its next step)",
    )  # fmt: skip
    first_audio_timeout_s: float = setting(
        1.0,
        "a turn with somewhere else to go (a next provider in its route's chain, or the "
        "fallback prompt already cached) that has no audio this long after its provider got "
        "its whole text is cancelled on that provider and fails over, or plays the fallback "
        "prompt (the app or flow gets `provider.error`, kind `first_audio_timeout`); a prompt "
        "render shared with other calls goes on to fill the cache. A provider's own "
        "`first_audio_timeout_s` overrides it. `0`: off (a silent provider is waited for "
        "until its own timeout, 10 s or more). Trade-off: a provider that is slow to start "
        'but works loses that one turn (docs/providers.md, "First-audio deadline")',
        lo=0.0, hi=600.0,
    )  # fmt: skip
    embedded_tts_workers: int = setting(
        0,
        'synthesis workers of the embedded TTS server (`url = "embedded"`, Piper): renderings '
        "at once, each on its own thread and core; `0`: the cores the daemon may run on, less "
        "one (at least one), or one per CPU of `embedded_tts_cpus`",
        lo=0, hi=256,
    )  # fmt: skip
    embedded_tts_queue: int = setting(
        1,
        "renderings in progress beyond one per worker (they take turns a clause at a time, so "
        "each goes slower); one more is refused at once with the protocol's own error, so the "
        "turn fails over (or falls back) in milliseconds. Size it from docs/deployment.md, "
        '"The embedded voice"',
        lo=0, hi=10000,
    )  # fmt: skip
    embedded_tts_max_wait_s: float = setting(
        1.0,
        "a rendering whose first audio no worker has begun this long after it was asked for "
        "is refused the same way",
        lo=0.001, hi=60,
    )  # fmt: skip
    embedded_tts_nice: int = setting(
        10,
        "the embedded TTS server runs this much lower in CPU priority than the daemon "
        "(`nice`), so synthesis never delays a frame (docs/deployment.md)",
        lo=0, hi=19,
    )  # fmt: skip
    embedded_tts_cpus: str = setting(
        "",
        "the CPUs the embedded TTS server runs on (as `taskset -c`; each must exist on this "
        "host); `\"\"`: the daemon's. With CPUs of its own, `embedded_tts_workers = 0` means "
        "one worker per CPU listed",
        type_doc='CPU list (`"1"`, `"2-3,6"`)', check=_cpus,
    )  # fmt: skip
    log_caller_data: bool = setting(
        False,
        "log caller numbers (`from_`, `to`, transfer `target`), DTMF digits and what the "
        "caller heard (`heard_text`) as they are; by default they are logged as `***` (text "
        "as its length): logs are read by more people than calls are",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    path: str
    daemon: DaemonConfig = setting(doc="", kind="table", item=DaemonConfig)
    sip: SipConfig = setting(doc="", kind="table", item=SipConfig)
    media_streams: MediaStreamsConfig = setting(doc="", kind="table", item=MediaStreamsConfig)
    api: ApiConfig = setting(doc="", kind="table", item=ApiConfig)
    bargein: BargeInPolicy = setting(doc="", kind="table", item=BargeInPolicy)
    """``[bargein]``: the detector's thresholds; their defaults are the policy's."""
    providers: tuple[ProviderConfig, ...] = setting(doc="", kind="tables", item=ProviderConfig)
    routes: tuple[RouteConfig, ...] = setting(doc="", kind="array", item=RouteConfig)
    flows: tuple[FlowConfig, ...] = setting(doc="", kind="tables", item=FlowConfig)

    def provider(self, name: str) -> ProviderConfig:
        for p in self.providers:
            if p.name == name:
                return p
        raise KeyError(name)

    def flow(self, name: str) -> FlowConfig:
        for f in self.flows:
            if f.name == name:
                return f
        raise KeyError(name)

    def route_for(self, key: str) -> RouteConfig | None:
        """The first route whose ``match`` fits ``key`` (``*`` matches anything)."""
        for r in self.routes:
            if r.matches(key):
                return r
        return None

    def summary(self) -> str:
        legs = [
            n
            for n, on in (
                ("sip", self.sip.enabled),
                ("media_streams", self.media_streams.enabled),
                ("api", self.api.enabled),
            )
            if on
        ]
        return (
            f"{self.path}: ok: {len(self.providers)} provider(s), {len(self.routes)} route(s), "
            f"{len(self.flows)} flow(s); listeners: {', '.join(legs) or 'none'}"
        )


def _check_config(values: dict[str, Any], at: Spot) -> None:
    """What one section says of another: names of providers and flows, routes."""
    providers = {p.name for p in values["providers"]}
    flows = {f.name for f in values["flows"]}
    for f in values["flows"]:
        for s in f.steps:
            if s.voice_agent and s.voice_agent not in providers:
                at.error(f"unknown provider {s.voice_agent!r}",
                         f"flows.{f.name}.steps.{s.name}.voice_agent")  # fmt: skip
    seen: dict[str, int] = {}  # each match and the first route giving it
    for i, r in enumerate(values["routes"]):
        p = f"routes[{i}]"
        if r.match in seen:
            at.error(
                f"{r.match!r} is routes[{seen[r.match]}]'s match too: this route is never reached",
                f"{p}.match",
            )
        seen.setdefault(r.match, i)
        for name in r.provider:
            if name not in providers:
                at.error(f"unknown provider {name!r}", f"{p}.provider")
        for key in ("flow", "fallback_flow"):
            if getattr(r, key) and getattr(r, key) not in flows:
                at.error(f"unknown flow {getattr(r, key)!r}", f"{p}.{key}")
    if not values["routes"]:
        at.error("at least one [[routes]] entry is needed", "routes")


register_check(Config, _check_config)


def _glob_to_regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


def parse_cpu_list(text: str) -> frozenset[int]:
    """A ``taskset -c`` CPU list ("1", "0,2-3") as a set; "" is the empty set."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, dash, high = part.partition("-")
        if (
            not low.isascii()
            or not low.isdigit()
            or (dash and not (high.isascii() and high.isdigit()))
        ):
            raise ValueError(
                f'expected CPU numbers and ranges such as "1" or "0,2-3", got {text!r}'
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


# ------------------------------------------------------------------ entry


def parse_config(
    text: str,
    path: str = "<string>",
    env: Mapping[str, str] | None = None,
) -> Config:
    """Validate TOML ``text``; raise ``ConfigError`` listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    errors: list[str] = []
    reader = Reader(errors, os.environ if env is None else env, Path(path).parent)
    cfg: Config = read(Config, data, "", reader, preset={"path": path})
    if errors:
        raise ConfigError(errors)
    return cfg


# -------------------------------------------------------------- reference


REFERENCE: dict[str, tuple[type, Any]] = {
    "daemon": (DaemonConfig, None),
    "sip": (SipConfig, None),
    "sip.registrations": (SipRegistration, None),
    "media_streams": (MediaStreamsConfig, None),
    "api": (ApiConfig, None),
    "limits": (ConnectionLimits, None),
    "bargein": (BargeInPolicy, None),
    "providers": (ProviderConfig, None),
    "routes": (RouteConfig, None),
    "flows": (FlowConfig, None),
    "flows.steps": (FlowStep, None),
}
"""The generated tables of ``config/README.md``: region name -> the dataclass of its keys."""

_BEGIN = "<!-- generated by `make config-reference` from the code: {name} -->"
_END = "<!-- end of generated table: {name} -->"


def _table(rows: list[Row]) -> str:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for r in rows:
        cells = (r.key, r.type, r.default, r.doc)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _options_table() -> str:
    """Each protocol's options (``OPTIONS`` of its engine module) and their types."""
    names = {bool: "bool", int: "integer", float: "number", str: "string"}
    lines = ["| protocol | options (type) |", "| --- | --- |"]
    for protocol in PROTOCOLS:
        declared = _protocol_options(protocol) or {}
        cells = [
            f"`{k}` ("
            + (" / ".join(f"`{c}`" for c in kind) if isinstance(kind, tuple) else names[kind])
            + ")"
            for k, kind in declared.items()
        ]
        lines.append(f"| `{protocol}` | {', '.join(cells)} |")
    return "\n".join(lines)


def reference_tables() -> dict[str, str]:
    """Every generated table of ``config/README.md``, by region name."""
    tables = {name: _table(reference_rows(cls, d)) for name, (cls, d) in REFERENCE.items()}
    tables["providers.options"] = _options_table()
    return tables


def render_reference(text: str) -> str:
    """``text`` (``config/README.md``) with every generated region rewritten from the code."""
    for name, table in reference_tables().items():
        begin, end = _BEGIN.format(name=name), _END.format(name=name)
        a, b = text.find(begin), text.find(end)
        if a < 0 or b < a:
            raise ValueError(f"no generated region {name!r} (from {begin!r} to {end!r})")
        text = text[: a + len(begin)] + "\n" + table + "\n" + text[b:]
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m bridge.config --reference [--write README]``: the reference's tables."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bridge.config")
    ap.add_argument("--reference", action="store_true", help="print the generated tables")
    ap.add_argument("--write", metavar="README", help="rewrite the generated regions of README")
    args = ap.parse_args(argv)
    if args.write:
        path = Path(args.write)
        path.write_text(render_reference(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if args.reference:
        for name, table in reference_tables().items():
            print(f"{_BEGIN.format(name=name)}\n{table}\n{_END.format(name=name)}\n")
        return 0
    ap.print_usage()
    return 2


def secret_values(value: object) -> tuple[str, ...]:
    """Every secret in ``value`` (a ``Config`` or any part): the fields kept out of ``repr``.

    The log sink masks these wherever they appear (``bridge.logs.configure``).
    """
    found: list[str] = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if not f.repr and isinstance(item, str) and item:
                found.append(item)
            else:
                found.extend(secret_values(item))
    elif isinstance(value, tuple | list):
        for item in value:
            found.extend(secret_values(item))
    return tuple(found)


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the TOML file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{p}: cannot read: {e.strerror}"]) from None
    except UnicodeDecodeError as e:
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError([f"{p}: not UTF-8 (line {line}, byte {e.start})"]) from None
    return parse_config(text, str(p), env)


if __name__ == "__main__":
    from bridge.config import main as _main  # the module others import, not this __main__ copy

    raise SystemExit(_main())

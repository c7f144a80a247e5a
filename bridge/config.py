"""The daemon's configuration: one TOML file, loaded once into frozen dataclasses.

Theory of operation
-------------------
``load_config(path)`` reads the file, validates *every* key, and either
returns a ``Config`` or raises ``ConfigError`` carrying every problem found,
each naming its key (``providers.main.protocol: unknown protocol 'kovaa'
(expected one of kova, kugelaudio, kletso, coda, zwst)``). Nothing is
half-loaded: a config either validates completely or is rejected whole (which
is what makes SIGHUP reload safe).

Secrets (``api_key``, ``token``, ``twilio_auth_token``, SIP passwords) may be
given inline, or as ``<key>_file`` (a path; ``$CREDENTIALS_DIRECTORY`` and
other environment variables are expanded, so systemd ``LoadCredential=``
works), or as ``<key>_env`` (the name of an environment variable). Secret
fields are excluded from ``repr`` so they never reach a log line.

The keys documented in ``config/README.md`` are the public interface.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.media.bargein import BargeInPolicy
from bridge.providers import registry
from bridge.providers.base import OptionType
from bridge.sip.uri import outbound_target

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


# --------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class SipRegistration:
    """``[sip.registrations.NAME]``: keep a REGISTER binding at a PBX or trunk."""

    name: str
    registrar: str
    user: str
    password: str = field(repr=False)
    expires_s: int = 600


@dataclass(frozen=True, slots=True)
class SipAuthUser:
    """``[sip.auth.users]``: a user that may place calls to us (digest)."""

    user: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A listener's bounds on its TCP connections (``max_connections`` ... in its section).

    ``header_timeout_s``: a connection must complete its request (HTTP head and
    body) or its SIP message within this time of opening or of the message's
    first byte. ``idle_timeout_s`` (SIP over TCP only; 0 = never): a
    connection that carried no complete message for this long is closed.
    """

    max_connections: int = 4096
    max_connections_per_source: int = 1024
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: the SIP/RTP leg."""

    enabled: bool = True
    listen: tuple[str, ...] = ("127.0.0.1:5060",)
    transports: tuple[str, ...] = ("udp", "tcp")
    rtp_ports: tuple[int, int] = (20000, 20999)
    external_address: str = ""
    """Address put in SDP and Contact (behind NAT: the public one); empty: the listen host."""
    latching: str = "strict"
    """``strict`` or ``learn``: symmetric RTP for callers behind NAT (bridge.rtp.session)."""
    outbound_proxy: str = ""
    """``sip:`` URI every outbound call goes through (and tel: numbers are called at)."""
    codecs: tuple[str, ...] = CODECS
    allow: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    trusted_proxies: tuple[str, ...] = ()
    max_calls: int = 500
    invite_rate_per_source: float = 20.0
    rtp_timeout_s: float = 30.0
    session_expires_s: int = 1800
    auth_realm: str = "callbridge"
    auth_users: tuple[SipAuthUser, ...] = ()
    registrations: tuple[SipRegistration, ...] = ()
    limits: ConnectionLimits = ConnectionLimits(idle_timeout_s=1800.0)


@dataclass(frozen=True, slots=True)
class MediaStreamsConfig:
    """``[media_streams]``: Twilio-style media-stream WebSockets."""

    enabled: bool = True
    listen: str = "127.0.0.1:8080"
    public_url: str = ""
    twilio_auth_token: str = field(default="", repr=False)
    plivo_auth_token: str = field(default="", repr=False)
    single_use_tokens: bool = False
    token_secret: str = field(default="", repr=False)
    stream_token: str = field(default="", repr=False)
    max_message_bytes: int = 64 * 1024
    lead_ms: int = 60
    limits: ConnectionLimits = ConnectionLimits()
    token_ttl_s: float = 30.0
    max_streams: int = 1000


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """``[api]``: HTTP API, health, metrics."""

    enabled: bool = True
    listen: str = "127.0.0.1:8081"
    token: str = field(default="", repr=False)
    limits: ConnectionLimits = ConnectionLimits()
    metrics_auth: bool = True


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """``[providers.NAME]``: one TTS / voice provider."""

    name: str
    protocol: str
    url: str
    api_key: str = field(default="", repr=False)
    voice: str = ""
    model: str = ""
    engine: str = "piper"
    options: tuple[tuple[str, str | int | float | bool], ...] = ()
    turns_per_connection: int = 0
    """Open another connection once every one carries this many turns (0: the protocol's limit).

    1 suits a busy node: a connection is first in, first out, so a turn sharing one waits
    for the audio the provider queued before it for the others (docs/providers.md). It is
    not the default: a connection per call in progress costs memory (bench_memory)."""
    flow_control_ahead_s: float = 0.0
    """Stop reading a connection while every turn on it is this far ahead of playout (0: off)."""
    text_ahead_s: float = 3.0
    """Send a turn's text a sentence at a time, this far ahead of playout (0: all at once).

    0 by default for Kletso and for Coda with ``input_mode = "complete"``, which speak
    nothing until a turn's text is complete."""
    close_idle_after_s: float = 60.0
    """Close a connection that has held no turn this long, keeping a spare (0: never)."""
    first_audio_timeout_s: float | None = None
    """A turn with a way out (next provider, cached fallback prompt) with no audio this long
    after the provider has its text fails over or falls back (None: ``[daemon]``'s; 0: off)."""

    @property
    def embedded(self) -> bool:
        return self.url == "embedded"


@dataclass(frozen=True, slots=True)
class FlowStep:
    """One step of an IVR flow: an action, then where to go."""

    name: str
    say: str = ""
    interruptible: bool = True
    gather_max_digits: int = 0
    gather_timeout_s: float = 5.0
    gather_terminator: str = "#"
    branch: tuple[tuple[str, str], ...] = ()
    next: str = ""
    transfer: str = ""
    hangup: bool = False
    app: str = ""
    voice_agent: str = ""

    @property
    def gathers(self) -> bool:
        return self.gather_max_digits > 0


@dataclass(frozen=True, slots=True)
class FlowConfig:
    """``[flows.NAME]``: an IVR flow written in the config."""

    name: str
    start: str
    steps: tuple[FlowStep, ...]

    def step(self, name: str) -> FlowStep:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """``[[routes]]``: which provider, greeting, flow and application a call gets."""

    match: str
    provider: tuple[str, ...]
    greeting: str = ""
    flow: str = ""
    app: str = ""
    voice: str = ""
    fallback_flow: str = ""
    fallback_prompt: str = ""
    """Heard in place of a turn no provider could render (``""``: ``[daemon]``'s)."""

    def matches(self, key: str) -> bool:
        if self.match == "*":
            return True
        return re.fullmatch(_glob_to_regex(self.match), key) is not None


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """``[daemon]``: process-wide settings."""

    drain_timeout_s: float = 30.0
    log_level: str = "info"
    log_format: str = "auto"
    event_loop: str = "uvloop"
    cache_dir: str = ""
    prompt_cache_bytes: int = 32 * 1024 * 1024
    max_loop_lag_ms: float = 20.0
    gc_freeze_s: float = 0.1
    gc_thaw_s: float = 600.0
    prerender_wait_s: float = 60.0
    fallback_prompt: str = ""
    first_audio_timeout_s: float = 1.0
    embedded_tts_workers: int = 0
    """Synthesis workers of the embedded TTS child (0: its cores less one, at least one)."""
    embedded_tts_queue: int = 1
    embedded_tts_max_wait_s: float = 1.0
    embedded_tts_nice: int = 10
    """How much lower the embedded TTS child's CPU priority is than the daemon's."""
    embedded_tts_cpus: str = ""
    """CPUs the embedded TTS child runs on (``taskset`` list: "1", "2-3,6"); "": the daemon's."""
    log_caller_data: bool = False


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    path: str
    daemon: DaemonConfig
    sip: SipConfig
    media_streams: MediaStreamsConfig
    api: ApiConfig
    bargein: BargeInPolicy
    """``[bargein]``: the detector's thresholds; their defaults are the policy's."""
    providers: tuple[ProviderConfig, ...]
    routes: tuple[RouteConfig, ...]
    flows: tuple[FlowConfig, ...]

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


def _glob_to_regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


# ------------------------------------------------------------- the checker


class _Reader:
    """Reads typed values out of a TOML table, recording errors by key path."""

    def __init__(self, errors: list[str], env: Mapping[str, str], base_dir: Path) -> None:
        self.errors = errors
        self.env = env
        self.base_dir = base_dir

    def err(self, key: str, msg: str) -> None:
        self.errors.append(f"{key}: {msg}")

    def table(self, data: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
        v = data.get(key, {})
        if not isinstance(v, dict):
            self.err(_join(path, key), f"expected a table, got {_tname(v)}")
            return {}
        return v

    def unknown(self, data: Mapping[str, Any], known: set[str], path: str) -> None:
        known = known | _LIMIT_KEYS.get(path, set())  # read by _read_limits
        for k in data:
            base = k.removesuffix("_file").removesuffix("_env")
            if k not in known and base not in known:
                self.err(_join(path, k), "unknown key")

    def str_(self, data: Mapping[str, Any], key: str, path: str, default: str) -> str:
        v = data.get(key, default)
        if not isinstance(v, str):
            self.err(_join(path, key), f"expected a string, got {_tname(v)}")
            return default
        return v

    def bool_(self, data: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        v = data.get(key, default)
        if not isinstance(v, bool):
            self.err(_join(path, key), f"expected true or false, got {_tname(v)}")
            return default
        return v

    def num(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        default: float,
        lo: float | None = None,
        hi: float | None = None,
        integer: bool = False,
    ) -> float:
        raw = data.get(key, default)
        if (
            isinstance(raw, bool)
            or not isinstance(raw, int | float)
            or (integer and not isinstance(raw, int))
        ):
            want = "an integer" if integer else "a number"
            self.err(_join(path, key), f"expected {want}, got {_tname(raw)}")
            return default
        v = float(raw)
        if v != v or v in (math.inf, -math.inf):  # TOML has nan and inf: no setting means them
            self.err(_join(path, key), f"{raw} is not a finite number")
            return default
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.err(_join(path, key), f"{raw} is out of range [{lo}, {hi}]")
            return default
        return v

    def int_(
        self, data: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int
    ) -> int:
        return int(self.num(data, key, path, default, lo, hi, integer=True))

    def str_list(
        self, data: Mapping[str, Any], key: str, path: str, default: tuple[str, ...]
    ) -> tuple[str, ...]:
        v = data.get(key, list(default))
        if isinstance(v, str):
            return (v,)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self.err(_join(path, key), "expected a string or a list of strings")
            return default
        return tuple(v)

    def choice(
        self, data: Mapping[str, Any], key: str, path: str, default: str, choices: tuple[str, ...]
    ) -> str:
        v = self.str_(data, key, path, default)
        if v not in choices:
            self.err(
                _join(path, key), f"unknown value {v!r} (expected one of {', '.join(choices)})"
            )
            return default
        return v

    def secret(self, data: Mapping[str, Any], key: str, path: str) -> str:
        """A secret from ``key``, ``key_file`` or ``key_env`` (at most one of them)."""
        given = [k for k in (key, f"{key}_file", f"{key}_env") if k in data]
        if len(given) > 1:
            self.err(_join(path, key), f"give only one of {', '.join(given)}")
            return ""
        if f"{key}_file" in data:
            raw = self.str_(data, f"{key}_file", path, "")
            file = Path(os.path.expandvars(raw))
            if not file.is_absolute():
                file = self.base_dir / file
            try:
                value = file.read_text(encoding="utf-8").strip()
            except OSError as e:
                self.err(_join(path, f"{key}_file"), f"cannot read {raw!r}: {e.strerror}")
                return ""
            except UnicodeDecodeError as e:  # the bytes are the secret's: never shown
                self.err(_join(path, f"{key}_file"), f"{raw!r} is not UTF-8 (byte {e.start})")
                return ""
            if not value:  # the installer's placeholder: never a silent "check off"
                self.err(_join(path, f"{key}_file"), f"{raw!r} is empty")
            return value
        if f"{key}_env" in data:
            name = self.str_(data, f"{key}_env", path, "")
            if not self.env.get(name):
                why = "is empty" if name in self.env else "is not set"
                self.err(_join(path, f"{key}_env"), f"environment variable {name!r} {why}")
                return ""
            return self.env[name]
        return self.str_(data, key, path, "")

    def hostport(self, value: str, key: str) -> tuple[str, int] | None:
        """``value`` as (host, port), or None (and an error naming ``key``) if it is not one."""
        hp = _parse_hostport(value)
        if hp is None:
            self.err(key, f"expected HOST:PORT (IPv6 as [ADDR]:PORT), got {value!r}")
        elif problem := _host_problem(hp[0]):
            self.err(key, f"{problem} in {value!r}")
            return None
        return hp


_LIMIT_KEYS = {
    "sip": {"max_connections", "max_connections_per_source", "header_timeout_s", "idle_timeout_s"},
    "media_streams": {"max_connections", "max_connections_per_source", "header_timeout_s"},
    "api": {"max_connections", "max_connections_per_source", "header_timeout_s"},
}


def _read_limits(r: _Reader, d: dict[str, Any], p: str) -> ConnectionLimits:
    """``max_connections``, ``max_connections_per_source``, ``header_timeout_s`` (and
    ``idle_timeout_s`` for SIP over TCP) of the listener section ``p``."""
    b = ConnectionLimits(idle_timeout_s=1800.0) if p == "sip" else ConnectionLimits()
    most = r.int_(d, "max_connections", p, b.max_connections, 1, 1_000_000)
    per_source = r.int_(
        d, "max_connections_per_source", p, min(b.max_connections_per_source, most), 1, 1_000_000
    )
    if per_source > most:
        r.err(f"{p}.max_connections_per_source", f"{per_source} exceeds max_connections ({most})")
    return ConnectionLimits(
        max_connections=most,
        max_connections_per_source=per_source,
        header_timeout_s=r.num(d, "header_timeout_s", p, b.header_timeout_s, 0.1, 3600),
        idle_timeout_s=(
            r.num(d, "idle_timeout_s", p, b.idle_timeout_s, 0, 86400) if p == "sip" else 0.0
        ),
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tname(v: object) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "a table",
    }.get(type(v), type(v).__name__)


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


def split_hostport(value: str) -> tuple[str, int]:
    """``"127.0.0.1:5060"`` / ``"[::1]:5060"`` → ``(host, port)`` (value already validated)."""
    hp = _parse_hostport(value)
    if hp is None:
        raise ValueError(f"not HOST:PORT: {value!r}")
    return hp


# ---------------------------------------------------------- section readers


def _read_sip(r: _Reader, d: dict[str, Any]) -> SipConfig:
    p = "sip"
    r.unknown(
        d,
        {
            "enabled", "listen", "transports", "rtp_ports", "external_address", "latching",
            "rtp_address",  # renamed: its own error below
            "outbound_proxy",
            "codecs", "allow",
            "max_calls", "invite_rate_per_source", "rtp_timeout_s", "session_expires_s",
            "auth", "registrations", "trusted_proxies",
        },
        p,
    )  # fmt: skip
    listen = r.str_list(d, "listen", p, ("127.0.0.1:5060",))
    for i, v in enumerate(listen):
        r.hostport(v, f"sip.listen[{i}]" if isinstance(d.get("listen"), list) else "sip.listen")
    transports = r.str_list(d, "transports", p, ("udp", "tcp"))
    for t in transports:
        if t not in ("udp", "tcp"):
            r.err("sip.transports", f"unknown transport {t!r} (expected udp, tcp)")
    ports = _read_port_range(r, d.get("rtp_ports", "20000-20999"))
    if "rtp_address" in d:
        r.err("sip.rtp_address", "renamed to sip.external_address")
    proxy = r.str_(d, "outbound_proxy", p, "")
    if proxy:
        try:
            outbound_target(proxy)
        except ValueError as exc:
            r.err("sip.outbound_proxy", str(exc))
    external = r.str_(d, "external_address", p, "")
    if external:
        try:
            ipaddress.ip_address(external)
        except ValueError:
            r.err("sip.external_address", f"expected an IP address, got {external!r}")
    codecs = r.str_list(d, "codecs", p, CODECS)
    for c in codecs:
        if c not in CODECS:
            r.err("sip.codecs", f"unknown codec {c!r} (expected PCMU, PCMA)")
    allow = r.str_list(d, "allow", p, ("127.0.0.0/8", "::1/128"))
    for a in allow:
        try:
            ipaddress.ip_network(a, strict=False)
        except ValueError:
            r.err("sip.allow", f"not a CIDR: {a!r}")
    trusted_proxies = r.str_list(d, "trusted_proxies", p, ())
    for a in trusted_proxies:
        try:
            ipaddress.ip_network(a, strict=False)
        except ValueError:
            r.err("sip.trusted_proxies", f"not an address or CIDR: {a!r}")
    auth = r.table(d, "auth", p)
    r.unknown(auth, {"realm", "users"}, "sip.auth")
    users_t = r.table(auth, "users", "sip.auth")
    users = []
    for user, pw in users_t.items():
        if isinstance(pw, dict):
            users.append(SipAuthUser(user, r.secret(pw, "password", f"sip.auth.users.{user}")))
        elif isinstance(pw, str):
            users.append(SipAuthUser(user, pw))
        else:
            r.err(f"sip.auth.users.{user}", "expected a password string or a table")
    regs = []
    for name, rt in r.table(d, "registrations", p).items():
        rp = f"sip.registrations.{name}"
        if not isinstance(rt, dict):
            r.err(rp, "expected a table")
            continue
        r.unknown(rt, {"registrar", "user", "password", "expires_s"}, rp)
        registrar = r.str_(rt, "registrar", rp, "")
        if not registrar.startswith(("sip:", "sips:")):
            r.err(f"{rp}.registrar", f"expected a sip: URI, got {registrar!r}")
        else:
            try:
                outbound_target(registrar)
            except ValueError as exc:
                r.err(f"{rp}.registrar", str(exc))
        regs.append(
            SipRegistration(
                name,
                registrar,
                r.str_(rt, "user", rp, ""),
                r.secret(rt, "password", rp),
                r.int_(rt, "expires_s", rp, 600, 60, 86400),
            )
        )
    return SipConfig(
        enabled=r.bool_(d, "enabled", p, True),
        listen=listen,
        transports=transports,
        rtp_ports=ports,
        external_address=external,
        latching=r.choice(d, "latching", p, "strict", ("strict", "learn")),
        outbound_proxy=proxy,
        codecs=codecs,
        allow=allow,
        trusted_proxies=trusted_proxies,
        max_calls=r.int_(d, "max_calls", p, 500, 1, 100000),
        invite_rate_per_source=r.num(d, "invite_rate_per_source", p, 20.0, 0.1, 100000),
        rtp_timeout_s=r.num(d, "rtp_timeout_s", p, 30.0, 1, 3600),
        session_expires_s=r.int_(d, "session_expires_s", p, 1800, 90, 86400),
        auth_realm=r.str_(auth, "realm", "sip.auth", "callbridge"),
        auth_users=tuple(users),
        registrations=tuple(regs),
        limits=_read_limits(r, d, p),
    )


def _read_port_range(r: _Reader, v: object) -> tuple[int, int]:
    key = "sip.rtp_ports"
    m = re.fullmatch(r"(\d+)-(\d+)", v) if isinstance(v, str) else None
    if m is None:
        r.err(key, f'expected "LOW-HIGH", got {v!r}')
        return DEFAULT_RTP_PORTS
    lo, hi = int(m.group(1)), int(m.group(2))
    if not (1024 <= lo < hi <= 65535):
        r.err(key, f"range {lo}-{hi} must satisfy 1024 <= LOW < HIGH <= 65535")
        return DEFAULT_RTP_PORTS
    if lo % 2:
        r.err(key, f"LOW must be even (RTP on even ports, RTCP on odd), got {lo}")
    return lo, hi


def _read_media_streams(r: _Reader, d: dict[str, Any]) -> MediaStreamsConfig:
    p = "media_streams"
    r.unknown(
        d,
        {"enabled", "listen", "public_url", "twilio_auth_token", "plivo_auth_token",
         "single_use_tokens",
         "token_secret", "stream_token", "max_message_bytes", "lead_ms", "token_ttl_s",
         "max_streams"},
        p,
    )  # fmt: skip
    listen = r.str_(d, "listen", p, "127.0.0.1:8080")
    hp = r.hostport(listen, "media_streams.listen")  # None: not an address, nothing more to say
    public_url = r.str_(d, "public_url", p, "")
    if public_url and not public_url.startswith(("ws://", "wss://")):
        r.err("media_streams.public_url", f"expected a ws:// or wss:// URL, got {public_url!r}")
    enabled = r.bool_(d, "enabled", p, True)
    twilio_auth_token = r.secret(d, "twilio_auth_token", p)
    plivo_auth_token = r.secret(d, "plivo_auth_token", p)
    stream_token = r.secret(d, "stream_token", p)
    single_use_tokens = r.bool_(d, "single_use_tokens", p, False)
    if enabled and hp and not _is_loopback(hp[0]):
        # a public listener fails closed: no credential, no listener
        if not (twilio_auth_token or plivo_auth_token or stream_token or single_use_tokens):
            r.err(
                "media_streams.stream_token",
                f"a credential is required when media_streams.listen is not loopback ({listen}):"
                " set stream_token, twilio_auth_token, plivo_auth_token or single_use_tokens",
            )
        if not public_url:
            r.err(
                "media_streams.public_url",
                f"required when media_streams.listen is not loopback ({listen}): signatures"
                " are checked against it, never against the request's Host header",
            )
    return MediaStreamsConfig(
        enabled=enabled,
        listen=listen,
        public_url=public_url,
        twilio_auth_token=twilio_auth_token,
        plivo_auth_token=plivo_auth_token,
        single_use_tokens=single_use_tokens,
        token_secret=_min_len(r, r.secret(d, "token_secret", p), 16, "media_streams.token_secret"),
        stream_token=stream_token,
        max_message_bytes=r.int_(d, "max_message_bytes", p, 64 * 1024, 1024, 16 * 1024 * 1024),
        lead_ms=r.int_(d, "lead_ms", p, 60, 20, 1000),
        limits=_read_limits(r, d, p),
        token_ttl_s=r.num(d, "token_ttl_s", p, 30.0, 1, 3600),
        max_streams=r.int_(d, "max_streams", p, 1000, 1, 1_000_000),
    )


def _min_len(r: _Reader, value: str, n: int, key: str) -> str:
    if value and len(value) < n:
        r.err(key, f"must be at least {n} characters")
    return value


def _read_api(r: _Reader, d: dict[str, Any]) -> ApiConfig:
    p = "api"
    r.unknown(d, {"enabled", "listen", "token", "metrics_auth"}, p)
    listen = r.str_(d, "listen", p, "127.0.0.1:8081")
    hp = r.hostport(listen, "api.listen")
    token = r.secret(d, "token", p)
    if hp and not token and not _is_loopback(hp[0]):
        r.err("api.token", f"required when api.listen is not loopback ({listen})")
    return ApiConfig(
        enabled=r.bool_(d, "enabled", p, True),
        listen=listen,
        token=token,
        limits=_read_limits(r, d, p),
        metrics_auth=r.bool_(d, "metrics_auth", p, True),
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _speaks_whole_text(protocol: str, t: dict[str, Any]) -> bool:
    """Whether the provider speaks a turn only once all its text is in (no pacing then)."""
    return protocol == "kletso" or (protocol == "coda" and t.get("input_mode") == "complete")


def _protocol_options(protocol: str) -> dict[str, OptionType] | None:
    """The options ``protocol`` declares (``OPTIONS`` of its client engine module, the one
    place they are written); ``None`` for an unknown protocol (already an error)."""
    if protocol not in PROTOCOLS:
        return None
    return registry.protocol_options(protocol)


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
    return f"expected {want.get(kind, kind.__name__)}, got {_tname(v)}"


def _read_providers(r: _Reader, d: dict[str, Any]) -> tuple[ProviderConfig, ...]:
    out = []
    for name, t in d.items():
        p = f"providers.{name}"
        if not isinstance(t, dict):
            r.err(p, "expected a table")
            continue
        protocol = r.str_(t, "protocol", p, "")
        if "protocol" not in t:
            r.err(f"{p}.protocol", "missing (expected one of " + ", ".join(PROTOCOLS) + ")")
        elif protocol not in PROTOCOLS:
            r.err(
                f"{p}.protocol",
                f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})",
            )
        url = r.str_(t, "url", p, "")
        if not url:
            r.err(f"{p}.url", 'missing (a ws:// or wss:// URL, or "embedded")')
        elif url != "embedded" and not url.startswith(("ws://", "wss://", "http://", "https://")):
            r.err(f"{p}.url", f'expected a ws(s):// URL or "embedded", got {url!r}')
        engine = r.choice(t, "engine", p, "piper", ("piper", "tone"))
        known = {
            *("protocol", "url", "api_key", "voice", "model", "engine"),
            *("turns_per_connection", "flow_control_ahead_s", "close_idle_after_s"),
            "text_ahead_s",
            "first_audio_timeout_s",
        }
        declared = _protocol_options(protocol)
        options: list[tuple[str, str | int | float | bool]] = []
        for k, v in t.items():
            base = k.removesuffix("_file").removesuffix("_env")
            if k in known or base in known or declared is None:
                continue
            kind = declared.get(k)
            if kind is None:
                names = [*known, "api_key_file", "api_key_env", *declared]
                close = difflib.get_close_matches(k, names, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                r.err(f"{p}.{k}", f"unknown key{hint}; {protocol} options: {', '.join(declared)}")
            elif problem := _option_problem(kind, v):
                r.err(f"{p}.{k}", problem)
            else:
                options.append((k, v))
        out.append(
            ProviderConfig(
                name=name,
                protocol=protocol,
                url=url,
                api_key=r.secret(t, "api_key", p),
                voice=r.str_(t, "voice", p, ""),
                model=r.str_(t, "model", p, ""),
                engine=engine,
                options=tuple(options),
                turns_per_connection=r.int_(t, "turns_per_connection", p, 0, 0, 1024),
                flow_control_ahead_s=r.num(t, "flow_control_ahead_s", p, 0.0, 0.0, 600.0),
                close_idle_after_s=r.num(t, "close_idle_after_s", p, 60.0, 0.0, 86400.0),
                first_audio_timeout_s=(
                    r.num(t, "first_audio_timeout_s", p, 1.0, 0.0, 600.0)
                    if "first_audio_timeout_s" in t
                    else None
                ),
                text_ahead_s=r.num(
                    t,
                    "text_ahead_s",
                    p,
                    0.0 if _speaks_whole_text(protocol, t) else 3.0,
                    0.0,
                    600.0,
                ),
            )
        )
    return tuple(out)


def _read_routes(
    r: _Reader, v: object, providers: set[str], flows: set[str]
) -> tuple[RouteConfig, ...]:
    if not isinstance(v, list):
        r.err("routes", "expected an array of tables ([[routes]])")
        return ()
    out = []
    # Each match and the first route giving it: a later route with the same match is
    # never reached (the first route that fits a call takes it).
    seen: dict[str, int] = {}
    for i, t in enumerate(v):
        p = f"routes[{i}]"
        if not isinstance(t, dict):
            r.err(p, "expected a table")
            continue
        r.unknown(
            t,
            {"match", "provider", "greeting", "flow", "app", "voice", "fallback_flow",
             "fallback_prompt"},
            p,
        )  # fmt: skip
        match = r.str_(t, "match", p, "*")
        if match in seen:
            r.err(
                f"{p}.match",
                f"{match!r} is routes[{seen[match]}]'s match too: this route is never reached",
            )
        seen.setdefault(match, i)
        chain = r.str_list(t, "provider", p, ())
        if not chain:
            r.err(f"{p}.provider", "missing (a provider name or a failover list)")
        for name in chain:
            if name not in providers:
                r.err(f"{p}.provider", f"unknown provider {name!r}")
        flow = r.str_(t, "flow", p, "")
        fallback = r.str_(t, "fallback_flow", p, "")
        for key, fname in (("flow", flow), ("fallback_flow", fallback)):
            if fname and fname not in flows:
                r.err(f"{p}.{key}", f"unknown flow {fname!r}")
        app = r.str_(t, "app", p, "")
        if app and not app.startswith(("ws://", "wss://")):
            r.err(f"{p}.app", f"expected a ws:// or wss:// URL, got {app!r}")
        out.append(
            RouteConfig(
                match=match,
                provider=chain,
                greeting=r.str_(t, "greeting", p, ""),
                flow=flow,
                app=app,
                voice=r.str_(t, "voice", p, ""),
                fallback_flow=fallback,
                fallback_prompt=r.str_(t, "fallback_prompt", p, ""),
            )
        )
    return tuple(out)


def _read_flows(r: _Reader, d: dict[str, Any], providers: set[str]) -> tuple[FlowConfig, ...]:
    out = []
    for name, t in d.items():
        p = f"flows.{name}"
        if not isinstance(t, dict):
            r.err(p, "expected a table")
            continue
        r.unknown(t, {"start", "steps"}, p)
        steps_t = r.table(t, "steps", p)
        if not steps_t:
            r.err(f"{p}.steps", "a flow needs at least one step")
        steps = [_read_step(r, f"{p}.steps.{sn}", sn, st, providers) for sn, st in steps_t.items()]
        names = {s.name for s in steps}
        start = r.str_(t, "start", p, next(iter(steps_t), ""))
        if steps_t and start not in names:
            r.err(f"{p}.start", f"unknown step {start!r}")
        for s in steps:
            sp = f"{p}.steps.{s.name}"
            if s.next and s.next not in names:
                r.err(f"{sp}.next", f"unknown step {s.next!r}")
            for digit, target in s.branch:
                if target not in names:
                    r.err(f"{sp}.branch.{digit}", f"unknown step {target!r}")
        out.append(FlowConfig(name=name, start=start, steps=tuple(steps)))
    return tuple(out)


def _read_step(r: _Reader, p: str, name: str, t: object, providers: set[str]) -> FlowStep:
    if not isinstance(t, dict):
        r.err(p, "expected a table")
        return FlowStep(name=name, hangup=True)
    r.unknown(t, {*STEP_ACTIONS, "interruptible", "gather", "branch", "next"}, p)
    gather = r.table(t, "gather", p)
    r.unknown(gather, {"max_digits", "timeout_s", "terminator"}, f"{p}.gather")
    branch_t = r.table(t, "branch", p)
    branch = []
    for k, v in branch_t.items():
        if not (k in ("timeout", "default") or re.fullmatch(r"[0-9*#A-D]+", k)):
            r.err(f"{p}.branch.{k}", "expected digits (0-9 * # A-D), 'timeout' or 'default'")
        if not isinstance(v, str):
            r.err(f"{p}.branch.{k}", "expected a step name")
            continue
        branch.append((k, v))
    step = FlowStep(
        name=name,
        say=r.str_(t, "say", p, ""),
        interruptible=r.bool_(t, "interruptible", p, True),
        gather_max_digits=r.int_(gather, "max_digits", f"{p}.gather", 1 if gather else 0, 0, 64),
        gather_timeout_s=r.num(gather, "timeout_s", f"{p}.gather", 5.0, 0.5, 600),
        gather_terminator=r.str_(gather, "terminator", f"{p}.gather", "#"),
        branch=tuple(branch),
        next=r.str_(t, "next", p, ""),
        transfer=r.str_(t, "transfer", p, ""),
        hangup=r.bool_(t, "hangup", p, False),
        app=r.str_(t, "app", p, ""),
        voice_agent=r.str_(t, "voice_agent", p, ""),
    )
    if step.transfer and not step.transfer.startswith(("sip:", "sips:", "tel:")):
        r.err(f"{p}.transfer", f"expected a sip: or tel: URI, got {step.transfer!r}")
    if step.app and not step.app.startswith(("ws://", "wss://")):
        r.err(f"{p}.app", f"expected a ws:// or wss:// URL, got {step.app!r}")
    if step.voice_agent and step.voice_agent not in providers:
        r.err(f"{p}.voice_agent", f"unknown provider {step.voice_agent!r}")
    if branch and not step.gathers:
        r.err(f"{p}.branch", "a branch needs a gather in the same step")
    ends = step.hangup or step.transfer or step.app or step.voice_agent
    if not (ends or step.next or step.branch):
        r.err(p, "step leads nowhere: give next, branch, hangup, transfer, app or voice_agent")
    if not (step.say or ends or step.gathers):
        r.err(p, "step does nothing: give say, gather, hangup, transfer, app or voice_agent")
    return step


def _read_bargein(r: _Reader, d: dict[str, Any]) -> BargeInPolicy:
    p = "bargein"
    b = BargeInPolicy()  # the defaults: written once, in the policy
    r.unknown(
        d,
        {"enabled", "min_speech_ms", "energy_floor_dbfs", "echo_return_loss_db",
         "vad_aggressiveness", "dtmf", "echo_correlation", "hangover_ms", "speech_end_ms",
         "echo_window_ms", "noise_rise_db", "babble_spread", "noise_floor_up_ms",
         "noise_floor_down_ms", "noise_warmup_ms", "noise_warmup_floor_ms",
         "noise_warmup_rise_db", "noise_spread_prior_db"},
        p,
    )  # fmt: skip

    def frames(key: str, default: int, lo: int, hi: int) -> int:
        """A duration the detector counts in 20 ms frames."""
        ms = r.int_(d, key, p, default, lo, hi)
        if ms % 20:
            r.err(f"{p}.{key}", f"must be a multiple of 20 (one frame), got {ms}")
        return ms

    return BargeInPolicy(
        enabled=r.bool_(d, "enabled", p, b.enabled),
        min_speech_ms=frames("min_speech_ms", b.min_speech_ms, 20, 5000),
        energy_floor_dbfs=r.num(d, "energy_floor_dbfs", p, b.energy_floor_dbfs, -96, 0),
        echo_return_loss_db=r.num(d, "echo_return_loss_db", p, b.echo_return_loss_db, 0, 60),
        vad_aggressiveness=r.int_(d, "vad_aggressiveness", p, b.vad_aggressiveness, 0, 3),
        dtmf_triggers=r.bool_(d, "dtmf", p, b.dtmf_triggers),
        echo_correlation=r.num(d, "echo_correlation", p, b.echo_correlation, 0.0, 1.0),
        hangover_ms=frames("hangover_ms", b.hangover_ms, 0, 2000),
        speech_end_ms=frames("speech_end_ms", b.speech_end_ms, 20, 10000),
        echo_window_ms=r.int_(d, "echo_window_ms", p, b.echo_window_ms, 0, 2000),
        noise_rise_db=r.num(d, "noise_rise_db", p, b.noise_rise_db, 0, 60),
        babble_spread=r.num(d, "babble_spread", p, b.babble_spread, 0, 10),
        noise_floor_up_ms=r.int_(d, "noise_floor_up_ms", p, b.noise_floor_up_ms, 20, 60000),
        noise_floor_down_ms=r.int_(d, "noise_floor_down_ms", p, b.noise_floor_down_ms, 20, 60000),
        noise_warmup_ms=frames("noise_warmup_ms", b.noise_warmup_ms, 0, 10000),
        noise_warmup_floor_ms=r.int_(
            d, "noise_warmup_floor_ms", p, b.noise_warmup_floor_ms, 20, 60000
        ),
        noise_warmup_rise_db=r.num(d, "noise_warmup_rise_db", p, b.noise_warmup_rise_db, 0, 60),
        noise_spread_prior_db=r.num(d, "noise_spread_prior_db", p, b.noise_spread_prior_db, 0, 20),
    )


def _path_from(r: _Reader, raw: str) -> str:
    """A relative path is relative to the config file's directory (``""`` stays ``""``)."""
    return str(r.base_dir / raw) if raw else ""


def _read_daemon(r: _Reader, d: dict[str, Any]) -> DaemonConfig:
    p = "daemon"
    r.unknown(
        d,
        {"drain_timeout_s", "log_level", "log_format", "event_loop", "cache_dir",
         "prompt_cache_bytes", "max_loop_lag_ms", "gc_freeze_s", "gc_thaw_s",
         "prerender_wait_s", "fallback_prompt", "first_audio_timeout_s",
         "embedded_tts_workers", "embedded_tts_queue", "embedded_tts_max_wait_s",
         "embedded_tts_nice", "embedded_tts_cpus",
         "log_caller_data"},
        p,
    )  # fmt: skip
    return DaemonConfig(
        drain_timeout_s=r.num(d, "drain_timeout_s", p, 30.0, 0, 3600),
        log_level=r.choice(d, "log_level", p, "info", ("debug", "info", "warning", "error")),
        log_format=r.choice(d, "log_format", p, "auto", ("auto", "json", "console")),
        event_loop=r.choice(d, "event_loop", p, "uvloop", ("uvloop", "asyncio")),
        cache_dir=_path_from(r, r.str_(d, "cache_dir", p, "")),
        prompt_cache_bytes=r.int_(d, "prompt_cache_bytes", p, 32 * 1024 * 1024, 0, 1 << 34),
        max_loop_lag_ms=r.num(d, "max_loop_lag_ms", p, 20.0, 0, 1000),
        gc_freeze_s=r.num(d, "gc_freeze_s", p, 0.1, 0, 3600),
        gc_thaw_s=r.num(d, "gc_thaw_s", p, 600.0, 1, 86400),
        prerender_wait_s=r.num(d, "prerender_wait_s", p, 60.0, 0, 3600),
        fallback_prompt=r.str_(d, "fallback_prompt", p, ""),
        first_audio_timeout_s=r.num(d, "first_audio_timeout_s", p, 1.0, 0.0, 600.0),
        embedded_tts_workers=r.int_(d, "embedded_tts_workers", p, 0, 0, 256),
        embedded_tts_queue=r.int_(d, "embedded_tts_queue", p, 1, 0, 10000),
        embedded_tts_max_wait_s=r.num(d, "embedded_tts_max_wait_s", p, 1.0, 0.001, 60),
        embedded_tts_nice=r.int_(d, "embedded_tts_nice", p, 10, 0, 19),
        embedded_tts_cpus=_cpu_list(r, d, p),
        log_caller_data=r.bool_(d, "log_caller_data", p, False),
    )


def _cpu_list(r: _Reader, d: dict[str, Any], p: str) -> str:
    value = r.str_(d, "embedded_tts_cpus", p, "")
    try:
        cpus = parse_cpu_list(value)
    except ValueError as e:
        r.err(f"{p}.embedded_tts_cpus", str(e))
        return ""
    count = os.cpu_count() or 1
    if cpus and max(cpus) >= count:
        r.err(f"{p}.embedded_tts_cpus", f"no CPU {max(cpus)} here (CPUs: 0-{count - 1})")
        return ""
    return value


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
    r = _Reader(errors, os.environ if env is None else env, Path(path).parent)
    r.unknown(
        data,
        {"daemon", "sip", "media_streams", "api", "bargein", "providers", "routes", "flows"},
        "",
    )
    providers = _read_providers(r, r.table(data, "providers", ""))
    pnames = {p.name for p in providers}
    flows = _read_flows(r, r.table(data, "flows", ""), pnames)
    routes = _read_routes(r, data.get("routes", []), pnames, {f.name for f in flows})
    cfg = Config(
        path=path,
        daemon=_read_daemon(r, r.table(data, "daemon", "")),
        sip=_read_sip(r, r.table(data, "sip", "")),
        media_streams=_read_media_streams(r, r.table(data, "media_streams", "")),
        api=_read_api(r, r.table(data, "api", "")),
        bargein=_read_bargein(r, r.table(data, "bargein", "")),
        providers=providers,
        routes=routes,
        flows=flows,
    )
    if not routes:
        errors.append("routes: at least one [[routes]] entry is needed")
    if errors:
        raise ConfigError(errors)
    return cfg


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

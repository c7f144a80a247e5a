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
the one reader (``bridge.settings.read``) walks those fields, and
``config/README.md``'s key tables are generated from them
(``python -m bridge.config --reference``, ``make config-reference``). Each section's
dataclass lives with what it configures:

========================  ==================================================
``[sip]``                 ``SipConfig``, ``bridge/sip/settings.py``
``[bargein]``             ``BargeInPolicy``, ``bridge/media/bargein.py``
``[providers.NAME]``      ``ProviderConfig``, ``bridge/providers/settings.py``
``[[routes]]``, flows     ``RouteConfig``, ``FlowConfig``, ``bridge/control/settings.py``
connection limits         ``ConnectionLimits``, ``bridge/settings.py``
``[daemon]``, ``[api]``,  here: the shell's own settings
``[media_streams]``
========================  ==================================================

Checks of one key are functions on its field (``check``, ``parse``); checks of
several keys together are registered per class (``register_check``); what one
section says of another (provider and flow names) is checked on ``Config``.

Secrets (``api_key``, ``token``, ``twilio_auth_token``, SIP passwords) may be
given inline, or as ``<key>_file`` (a path; ``$CREDENTIALS_DIRECTORY`` and
other environment variables are expanded, so systemd ``LoadCredential=``
works), or as ``<key>_env`` (the name of an environment variable). Secret
fields are excluded from ``repr`` so they never reach a log line.

The keys documented in ``config/README.md`` are the public interface.

Adding a key: one ``setting(default, "what it does", ...)`` field in its section's
dataclass (a range with ``lo``/``hi``, ``choices``, ``secret=True``, a ``check``
function for anything else), then ``make config-reference``
(``tests/config/test_config_reference.py`` fails until the reference is rewritten).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.control.settings import STEP_ACTIONS, FlowConfig, FlowStep, RouteConfig
from bridge.media.bargein import BargeInPolicy
from bridge.providers.settings import PROTOCOLS, ProviderConfig, protocol_options
from bridge.settings import (
    ConnectionLimits,
    Reader,
    Row,
    Spot,
    check_hostport,
    check_ws_url,
    listen_is_public,
    read,
    reference_rows,
    register_check,
    setting,
    split_hostport,
)
from bridge.sip.settings import (
    CODECS,
    DEFAULT_RTP_PORTS,
    SipConfig,
    SipRegistration,
    TrunkConfig,
    check_trunks,
)
from bridge.sip.settings import SipUserConfig as SipAuthUser

__all__ = [
    "CODECS",
    "DEFAULT_RTP_PORTS",
    "PROTOCOLS",
    "STEP_ACTIONS",
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
    "parse_cpu_list",
    "secret_values",
    "split_hostport",
]


class ConfigError(Exception):
    """The configuration is invalid; ``errors`` lists every problem, one per key."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ------------------------------------------------------------- validators
# Each takes the value read and where it is (``Spot``), reports what is wrong
# through it, and returns the value to keep.


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


# --------------------------------------------------------------- sections


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
        type_doc="`HOST:PORT`", check=check_hostport,
    )  # fmt: skip
    public_url: str = setting(
        "",
        "the URL carriers reach (`wss://host`, or its `/twilio` URL: the same), for TwiML and "
        "signature checks behind a proxy; `POST /twiml` is checked against its `https://` "
        "spelling",
        type_doc="`ws(s)://` URL", check=check_ws_url,
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
    if not (values["enabled"] and listen_is_public(listen)):
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
        type_doc="`HOST:PORT`", check=check_hostport,
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
    if not values["token"] and listen_is_public(listen):
        at.error(f"required when api.listen is not loopback ({listen})", "token")


register_check(ApiConfig, _check_api)


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
        "fallback prompt already cached) that has no audio this long after its first provider "
        "got its whole text (one budget for the turn across its providers) is cancelled on the "
        "provider it is on and plays the fallback prompt, or, with none cached, fails over (the "
        "next provider gets a deadline of its own) (the app or flow gets `provider.error`, "
        "kind `first_audio_timeout`); a prompt "
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
    trunks: tuple[TrunkConfig, ...] = setting(doc="", kind="tables", item=TrunkConfig)
    """``[trunks.NAME]``: SIP trunks (``bridge/sip/settings.py``, docs/sip.md)."""

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
    trunks = {t.name for t in values["trunks"]}
    for f in values["flows"]:
        for s in f.steps:
            if s.voice_agent and s.voice_agent not in providers:
                at.error(f"unknown provider {s.voice_agent!r}",
                         f"flows.{f.name}.steps.{s.name}.voice_agent")  # fmt: skip
            if s.trunk and s.trunk not in trunks:
                at.error(f"unknown trunk {s.trunk!r}", f"flows.{f.name}.steps.{s.name}.trunk")
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
    check_trunks(values["trunks"], values["sip"], at)


register_check(Config, _check_config)


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
    "trunks": (TrunkConfig, None),
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
        declared = protocol_options(protocol) or {}
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

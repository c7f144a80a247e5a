"""``[providers.NAME]``: one TTS / voice provider as the config file gives it.

Each key is a ``bridge.settings.setting`` field (what the reader checks and the
reference says); the protocol options are declared by each protocol's client engine
module (``OPTIONS``) and read into ``options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bridge.providers import registry
from bridge.providers.base import OptionType
from bridge.settings import Spot, keys_of, setting, tname, unknown_key

__all__ = ["PROTOCOLS", "ProviderConfig", "protocol_options"]


PROTOCOLS = registry.PROTOCOLS


def _provider_url(value: str, at: Spot) -> str:
    if value != "embedded" and not value.startswith(("ws://", "wss://", "http://", "https://")):
        at.error(f'expected a ws(s):// URL or "embedded", got {value!r}')
    return value


def _speaks_whole_text(protocol: object, t: Mapping[str, Any]) -> bool:
    """Whether the provider speaks a turn only once all its text is in (no pacing then)."""
    return protocol == "kletso" or (protocol == "coda" and t.get("input_mode") == "complete")


def protocol_options(protocol: str) -> dict[str, OptionType] | None:
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
    return f"expected {want.get(kind, kind.__name__)}, got {tname(v)}"


def _options(extras: dict[str, Any], at: Spot) -> tuple[tuple[str, Any], ...]:
    """The keys no other field of a provider claims: its protocol's options."""
    protocol = at.values.get("protocol", "")
    declared = protocol_options(protocol)
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
        doc="`embedded` starts `callbridge tts-server` as a supervised child on a Unix socket "
        "in a private directory (`$RUNTIME_DIRECTORY` under systemd, else a 0700 temp "
        "directory)",
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
        "`bridge/providers/<protocol>/client.py`, below) and any other key is an error "
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

"""Settings: every config key described once, on its dataclass field, and the reader it drives.

Theory of operation
-------------------
Each engine owns a frozen dataclass of its settings (``BargeInPolicy`` in
``bridge.media.bargein``, ``SipConfig`` in ``bridge.sip.settings``, ...), in the
style of aioquic's ``QuicConfiguration``. A field that is a config key is declared
with ``setting(default, doc, ...)``; its metadata (a ``Setting``) is all the config
reader and the reference need: the type (from the default, or ``kind``), the range,
the choices, whether it is a secret (then ``<key>_file`` and ``<key>_env`` are
accepted too), the TOML key if it is not the field's name (``"dtmf"``; dotted for a
key of a sub-table: ``"gather.max_digits"``), a validator, and the description.

``read(cls, table, path, reader)`` walks the fields of ``cls``: a key no field
claims is an error naming it (with a "did you mean"), each value is checked, every
problem is collected on the ``Reader`` (the config is then rejected whole), and a
field whose value is wrong takes its default so that the rest can still be checked.
Special cases are small functions attached to a field (``parse``: the raw TOML
value to the field's value; ``check``: a look at the value read) or to a class
(``register_check``: several fields together, after they are read).

``reference_rows(cls)`` gives the rows of ``config/README.md``'s tables from the
same metadata (``python -m bridge.config --reference``).

Adding a key is one ``setting(...)`` field in its dataclass (and
``make config-reference``).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ConnectionLimits",
    "Reader",
    "Row",
    "Setting",
    "Spot",
    "check_cidrs",
    "check_hostport",
    "check_ws_url",
    "hostport_problem",
    "is_loopback",
    "keys_of",
    "listen_is_public",
    "read",
    "reference_rows",
    "register_check",
    "setting",
    "setting_of",
    "split_hostport",
    "tname",
    "unknown_key",
]

_MISSING: Any = dataclasses.MISSING


@dataclass(frozen=True, slots=True)
class Setting:
    """What the reader checks and the reference says about one key (``field.metadata``)."""

    doc: str
    """The reference's description of the key."""
    kind: str = ""
    """``bool``, ``int``, ``float``, ``str``, ``strs`` (a string or a list of them),
    ``table`` (a sub-table read as ``item``), ``tables`` (named sub-tables, each an
    ``item``), ``array`` (an array of tables), ``flat`` (``item``'s keys in this
    table), ``custom`` (read by ``parse``). Inferred from the default if not given."""
    key: str = ""
    """The TOML key, if not the field's name; ``a.b``: key ``b`` of sub-table ``a``."""
    lo: float | None = None
    hi: float | None = None
    """Range of a number (both given, as they are to be printed: ``0`` or ``0.0``)."""
    multiple_of: int = 0
    why_multiple: str = ""
    choices: tuple[str, ...] = ()
    noun: str = "value"
    """What a value is called in "unknown <noun> 'x'" (``protocol``, ``codec``)."""
    secret: bool = False
    required: str = ""
    """If not empty, the key must be given and not empty: "missing (<required>)"."""
    formerly: str = ""
    """An old name of the key: giving it is an error naming the new one."""
    parse: Callable[[Any, Spot], Any] | None = None
    """The raw TOML value to the field's value (reporting through the ``Spot``)."""
    check: Callable[[Any, Spot], Any] | None = None
    """A look at the value read (given keys only): returns the value to keep."""
    default_from: Callable[[Mapping[str, Any]], Any] | None = None
    """The default, from the table the key is in (when it depends on other keys)."""
    extra: Callable[[dict[str, Any], Spot], Any] | None = None
    """This field takes every key no other field claims (``dict`` in table order) and
    reports the unknown ones itself (a provider's protocol options)."""
    item: Any = None
    """The dataclass of a ``table``, ``tables``, ``array`` or ``flat`` field."""
    exclude: tuple[str, ...] = ()
    """``flat``: keys of ``item`` that are not keys here."""
    fallback: Callable[[str], Any] | None = None
    """``tables``: what stands in for an entry that is not a table (given its name)."""
    unit: str = ""
    type_doc: str = ""
    default_doc: str | None = None
    """The reference's type and default columns, where the generic text would not do."""


def setting(default: Any = _MISSING, doc: str = "", **kw: Any) -> Any:
    """A dataclass field that is a config key (``kw``: the ``Setting``'s other fields)."""
    s = Setting(doc, **kw)
    if not s.kind:
        s = dataclasses.replace(s, kind=_kind_of(default, s))
    return field(default=default, repr=not s.secret, metadata={"setting": s})


def _kind_of(default: object, s: Setting) -> str:
    if s.parse is not None:
        return "custom"
    for t, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if isinstance(default, t):
            return kind
    if isinstance(default, tuple) and all(isinstance(x, str) for x in default):
        return "strs"
    raise TypeError(f"give the kind of a setting whose default is {default!r}")


def setting_of(f: dataclasses.Field[Any]) -> Setting | None:
    s = f.metadata.get("setting")
    return s if isinstance(s, Setting) else None


def _settings(cls: type) -> list[tuple[dataclasses.Field[Any], Setting]]:
    return [(f, s) for f in dataclasses.fields(cls) if (s := setting_of(f)) is not None]


def _key(f: dataclasses.Field[Any], s: Setting) -> str:
    return s.key or f.name


_CHECKS: dict[type, Callable[[dict[str, Any], Spot], None]] = {}


def register_check(cls: type, check: Callable[[dict[str, Any], Spot], None]) -> None:
    """Run ``check(values, spot)`` once ``cls``'s fields are read, before it is built:
    it may report problems and change ``values`` (field name -> value)."""
    _CHECKS[cls] = check


# ------------------------------------------------------------------ reading


class Reader:
    """Where a reading collects its problems, and what secrets and paths are read with."""

    def __init__(
        self, errors: list[str], env: Mapping[str, str], base_dir: Path, **context: Any
    ) -> None:
        self.errors = errors
        self.env = env
        self.base_dir = base_dir
        self.context = context
        """What checks of one part need from the others (``read`` leaves it alone)."""

    def err(self, key: str, msg: str) -> None:
        self.errors.append(f"{key}: {msg}")


class Spot:
    """Where a check is: the reader, the table and its path, the key, the values read."""

    def __init__(
        self,
        reader: Reader,
        path: str,
        table: Mapping[str, Any],
        key: str = "",
        values: dict[str, Any] | None = None,
    ) -> None:
        self.reader = reader
        self.path = path
        self.table = table
        self.key = key
        self.values = values if values is not None else {}

    def join(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, msg: str, key: str | None = None) -> None:
        """Report ``msg`` on ``key`` of this table (default: the key checked)."""
        self.reader.err(self.join(self.key if key is None else key), msg)


def tname(v: object) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "a table",
    }.get(type(v), type(v).__name__)


def read(
    cls: type,
    data: Mapping[str, Any],
    path: str,
    reader: Reader,
    *,
    defaults: Any = None,
    preset: Mapping[str, Any] | None = None,
    exclude: tuple[str, ...] = (),
    unknown: bool = True,
) -> Any:
    """An instance of the dataclass ``cls`` from the TOML table ``data`` at ``path``.

    ``defaults``: an instance whose values are the defaults (else the fields' own);
    ``preset``: field values that are not keys (a named table's ``name``).
    """
    spot = Spot(reader, path, data)
    fields = [(f, s) for f, s in _settings(cls) if f.name not in exclude]
    top, sub = _known(fields)
    if unknown:
        _unknown(fields, top, sub, data, spot)
    values: dict[str, Any] = dict(preset or {})
    spot.values = values
    for f, s in fields:
        default = getattr(defaults, f.name) if defaults is not None else f.default
        if default is _MISSING:
            default = _EMPTY.get(s.kind)
        if s.extra is not None:
            extras = {k: v for k, v in data.items() if k not in top and k not in sub}
            values[f.name] = s.extra(extras, Spot(reader, path, data, f.name, values))
            continue
        if s.formerly and s.formerly in data:
            spot.error(f"renamed to {spot.join(_key(f, s))}", s.formerly)
        before = len(reader.errors)
        value = _read_field(f, s, data, spot, default)
        if s.check is not None and len(reader.errors) == before and _given(f, s, data):
            value = s.check(value, _spot_for(f, s, data, spot))
        values[f.name] = value
    check = _CHECKS.get(cls)
    if check is not None:
        check(values, spot)
    return cls(**values)


_EMPTY: dict[str, Any] = {"str": "", "strs": (), "tables": (), "array": (), "custom": None}
"""What a field with no default reads as when its key is missing (then it is required)."""


def keys_of(cls: type) -> set[str]:
    """Every key of a table read as ``cls`` (sub-tables by their own name)."""
    top, sub = _known(_settings(cls))
    return top | set(sub)


def _given(f: dataclasses.Field[Any], s: Setting, data: Mapping[str, Any]) -> bool:
    table, name = _sub_table(data, _key(f, s))
    return name in table


def _spot_for(f: dataclasses.Field[Any], s: Setting, data: Mapping[str, Any], spot: Spot) -> Spot:
    """Where the key of ``f`` is: its table (a sub-table for a dotted key) and name."""
    head, dot, _ = _key(f, s).partition(".")
    table, name = _sub_table(data, _key(f, s))
    path = spot.join(head) if dot else spot.path
    return Spot(spot.reader, path, table, name, spot.values)


def _known(
    fields: list[tuple[dataclasses.Field[Any], Setting]],
) -> tuple[set[str], dict[str, set[str]]]:
    """The keys of a table, and of its sub-tables (for dotted keys)."""
    top: set[str] = set()
    sub: dict[str, set[str]] = {}
    for f, s in fields:
        if s.kind == "flat":
            inner = [(g, t) for g, t in _settings(s.item) if g.name not in s.exclude]
            more, _ = _known(inner)
            top |= more
            continue
        key = _key(f, s)
        head, dot, tail = key.partition(".")
        names = {tail, f"{tail}_file", f"{tail}_env"} if s.secret else {tail}
        if dot:
            sub.setdefault(head, set()).update(names)
        else:
            top |= {key, f"{key}_file", f"{key}_env"} if s.secret else {key}
        if s.formerly:
            top.add(s.formerly)
    return top, sub


def _unknown(
    fields: list[tuple[dataclasses.Field[Any], Setting]],
    top: set[str],
    sub: dict[str, set[str]],
    data: Mapping[str, Any],
    spot: Spot,
) -> None:
    extra = any(s.extra is not None for _, s in fields)  # that field reports the others
    for k, v in data.items():
        if k in sub:
            if not isinstance(v, dict):
                spot.error(f"expected a table, got {tname(v)}", k)
                continue
            inner = Spot(spot.reader, spot.join(k), v)
            for kk in v:
                if kk not in sub[k]:
                    inner.error(unknown_key(kk, sub[k]), kk)
        elif k not in top and not extra:
            spot.error(unknown_key(k, top), k)


def unknown_key(key: str, known: set[str] | list[str]) -> str:
    """``unknown key``, with the known key it is closest to if one is close."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"unknown key (did you mean {close[0]}?)" if close else "unknown key"


def _sub_table(data: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], str]:
    """The table a (possibly dotted) key is in, and the key within it."""
    head, dot, tail = key.partition(".")
    if not dot:
        return data, key
    v = data.get(head, {})
    return (v if isinstance(v, dict) else {}), tail  # not a table: reported as unknown keys are


def _read_field(
    f: dataclasses.Field[Any],
    s: Setting,
    data: Mapping[str, Any],
    spot: Spot,
    default: Any,
) -> Any:
    here = _spot_for(f, s, data, spot)
    table, name = here.table, here.key
    if s.default_from is not None:
        default = s.default_from(table)
    if s.kind == "flat":
        return read(s.item, data, spot.path, spot.reader, defaults=default,
                    exclude=s.exclude, unknown=False)  # fmt: skip
    if s.kind == "table":
        raw = table.get(name, {})
        if not isinstance(raw, dict):
            here.error(f"expected a table, got {tname(raw)}")
            raw = {}
        return read(s.item, raw, here.join(name), spot.reader)
    if s.kind in ("tables", "array"):
        return _read_many(s, here, default)
    before = len(spot.reader.errors)
    if s.secret:
        value = _secret(table, name, here)
    elif name not in table:
        value = default
    elif s.kind == "custom":
        assert s.parse is not None
        value = s.parse(table[name], here)
    else:
        value = _value(s, table[name], here, default)
    if s.required and not value and len(spot.reader.errors) == before:
        here.error(f"missing ({s.required})")
    return value


def _value(s: Setting, raw: object, spot: Spot, default: Any) -> Any:
    kind = s.kind
    if kind == "bool":
        if not isinstance(raw, bool):
            spot.error(f"expected true or false, got {tname(raw)}")
            return default
        return raw
    if kind == "str":
        if not isinstance(raw, str):
            spot.error(f"expected a string, got {tname(raw)}")
            return default
        if s.choices and raw not in s.choices and (raw or not s.required):
            spot.error(f"unknown {s.noun} {raw!r} (expected one of {', '.join(s.choices)})")
            return default
        return raw
    if kind == "strs":
        if isinstance(raw, str):
            items: tuple[str, ...] = (raw,)
        elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            items = tuple(raw)
        else:
            spot.error("expected a string or a list of strings")
            return default
        for item in items:
            if s.choices and item not in s.choices:
                spot.error(f"unknown {s.noun} {item!r} (expected {', '.join(s.choices)})")
        return items
    if kind in ("int", "float"):
        return _number(s, raw, spot, default)
    raise TypeError(f"{spot.join(spot.key)}: no reader for kind {kind!r}")


def _number(s: Setting, raw: object, spot: Spot, default: Any) -> Any:
    integer = s.kind == "int"
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or (integer and not isinstance(raw, int))
    ):
        spot.error(f"expected {'an integer' if integer else 'a number'}, got {tname(raw)}")
        return default
    v = float(raw)
    if v != v or v in (math.inf, -math.inf):  # TOML has nan and inf: no setting means them
        spot.error(f"{raw} is not a finite number")
        return default
    if (s.lo is not None and v < s.lo) or (s.hi is not None and v > s.hi):
        spot.error(f"{raw} is out of range [{s.lo}, {s.hi}]")
        return default
    if integer:
        n = int(raw)
        if s.multiple_of and n % s.multiple_of:
            why = f" ({s.why_multiple})" if s.why_multiple else ""
            spot.error(f"must be a multiple of {s.multiple_of}{why}, got {n}")
        return n
    return v


def _secret(data: Mapping[str, Any], key: str, spot: Spot) -> str:
    """A secret from ``key``, ``key_file`` or ``key_env`` (at most one of them)."""
    given = [k for k in (key, f"{key}_file", f"{key}_env") if k in data]
    if len(given) > 1:
        spot.error(f"give only one of {', '.join(given)}")
        return ""
    text = Setting("", kind="str")
    if f"{key}_file" in data:
        at = Spot(spot.reader, spot.path, data, f"{key}_file")
        raw = _value(text, data[f"{key}_file"], at, "")
        file = Path(os.path.expandvars(raw))
        if not file.is_absolute():
            file = spot.reader.base_dir / file
        try:
            value = file.read_text(encoding="utf-8").strip()
        except OSError as e:
            at.error(f"cannot read {raw!r}: {e.strerror}")
            return ""
        except UnicodeDecodeError as e:  # the bytes are the secret's: never shown
            at.error(f"{raw!r} is not UTF-8 (byte {e.start})")
            return ""
        if not value:  # the installer's placeholder: never a silent "check off"
            at.error(f"{raw!r} is empty")
        return value
    if f"{key}_env" in data:
        at = Spot(spot.reader, spot.path, data, f"{key}_env")
        name = _value(text, data[f"{key}_env"], at, "")
        env = spot.reader.env
        if not env.get(name):
            at.error(f"environment variable {name!r} {'is empty' if name in env else 'is not set'}")
            return ""
        return env[name]
    if key not in data:
        return ""
    inline: str = _value(text, data[key], spot, "")
    return inline


def _read_many(s: Setting, spot: Spot, default: Any) -> Any:
    """Named sub-tables (``[x.NAME]``) or an array of tables (``[[x]]``), as a tuple."""
    if spot.key not in spot.table:
        return default
    raw = spot.table[spot.key]
    path = spot.join(spot.key)
    out = []
    if s.kind == "array":
        if not isinstance(raw, list):
            spot.error(f"expected an array of tables ([[{spot.key}]])")
            return ()
        for i, t in enumerate(raw):
            if not isinstance(t, dict):
                spot.reader.err(f"{path}[{i}]", "expected a table")
                continue
            out.append(read(s.item, t, f"{path}[{i}]", spot.reader))
        return tuple(out)
    if not isinstance(raw, dict):
        spot.error(f"expected a table, got {tname(raw)}")
        return ()
    for name, t in raw.items():
        if not isinstance(t, dict):
            spot.reader.err(f"{path}.{name}", "expected a table")
            if s.fallback is not None:
                out.append(s.fallback(name))
            continue
        out.append(read(s.item, t, f"{path}.{name}", spot.reader, preset={"name": name}))
    return tuple(out)


# ----------------------------------------------------- shared by several sections
# Validators and settings more than one listener uses ([sip], [media_streams], [api]).


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


def hostport_problem(value: str) -> str | None:
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_is_public(listen: str) -> bool:
    """Whether a valid ``listen`` address is not loopback (False if it is not valid)."""
    return hostport_problem(listen) is None and not is_loopback(split_hostport(listen)[0])


def check_hostport(value: Any, at: Spot) -> Any:
    """A ``HOST:PORT``, or each of a list of them (then named ``key[i]``)."""
    listed = isinstance(at.table.get(at.key), list)
    for i, v in enumerate((value,) if isinstance(value, str) else value):
        if problem := hostport_problem(v):
            at.error(problem, f"{at.key}[{i}]" if listed else at.key)
    return value


def check_ws_url(value: str, at: Spot) -> str:
    if value and not value.startswith(("ws://", "wss://")):
        at.error(f"expected a ws:// or wss:// URL, got {value!r}")
    return value


def check_cidrs(what: str) -> Any:
    def check(value: tuple[str, ...], at: Spot) -> tuple[str, ...]:
        for a in value:
            try:
                ipaddress.ip_network(a, strict=False)
            except ValueError:
                at.error(f"{what}: {a!r}")
        return value

    return check


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


# ---------------------------------------------------------------- reference


@dataclass(frozen=True, slots=True)
class Row:
    """One key of the reference: key, type, default, meaning."""

    key: str
    type: str
    default: str
    doc: str


_UNITS = {"_s": "s", "_ms": "ms", "_db": "dB", "_dbfs": "dBFS", "_bytes": "bytes"}


def reference_rows(cls: type, defaults: Any = None, exclude: tuple[str, ...] = ()) -> list[Row]:
    """The reference's rows for the keys of ``cls`` (sub-tables' keys dotted)."""
    rows = []
    for f, s in _settings(cls):
        if f.name in exclude:
            continue
        default = getattr(defaults, f.name) if defaults is not None else f.default
        if s.kind == "flat":  # the connection limits have a table of their own
            if s.item is not ConnectionLimits:
                rows.extend(reference_rows(s.item, default, s.exclude))
            continue
        key = f"`{_key(f, s)}.NAME`" if s.kind == "tables" else f"`{_key(f, s)}`"
        if s.extra is not None:
            key = "protocol options"
        rows.append(Row(key, _type_text(f, s), _default_text(s, default), s.doc))
    return rows


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _type_text(f: dataclasses.Field[Any], s: Setting) -> str:
    if s.type_doc:
        return s.type_doc
    if s.secret:
        return "secret"
    if s.kind == "bool":
        return "bool"
    if s.kind == "str":
        return " / ".join(f"`{c}`" for c in s.choices) if s.choices else "string"
    if s.kind == "strs":
        if s.choices:
            return "list of " + ", ".join(f"`{c}`" for c in s.choices)
        return "string or list of strings"
    if s.kind in ("int", "float"):
        unit = s.unit or next((u for sfx, u in _UNITS.items() if f.name.endswith(sfx)), "")
        parts = ["integer" if s.kind == "int" else "number"]
        if unit:
            parts[0] += f" ({unit})"
        if s.multiple_of:
            parts.append(f"multiple of {s.multiple_of}")
        if s.lo is not None and s.hi is not None:
            parts.append(f"{_num(s.lo)}–{_num(s.hi)}")
        return ", ".join(parts)
    if s.kind == "tables":
        return "tables (below)"
    if s.kind == "array":
        return "array of tables"
    return s.kind


def _default_text(s: Setting, default: Any) -> str:
    if s.default_doc is not None:
        return s.default_doc
    if s.required:
        return "required"
    if default is _MISSING or default is None or s.kind in ("tables", "array"):
        return ""
    return f"`{toml_literal(default)}`"


def toml_literal(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return _num(v)
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple | list):
        return "[" + ", ".join(toml_literal(x) for x in v) + "]"
    return str(v)

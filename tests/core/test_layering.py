"""The sans-I/O rule, enforced: only bridge/io/ and bridge/cli.py touch asyncio,
sockets, clocks and websockets; telcodec never imports bridge; a provider protocol's
modules are reached from outside ``bridge/providers/`` only through its registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bridge.providers.registry import PROTOCOLS

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "socket", "time", "websockets", "uvloop"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def test_engines_do_not_import_io() -> None:
    offenders = {}
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("bridge/io/") or rel == "bridge/cli.py":
            continue
        bad = _top(_imports(path)) & FORBIDDEN
        if bad:
            offenders[rel] = sorted(bad)
    for path in sorted((ROOT / "codecs").rglob("*.py")):
        bad = _top(_imports(path)) & FORBIDDEN
        if bad:
            offenders[path.relative_to(ROOT).as_posix()] = sorted(bad)
    assert offenders == {}


def test_telcodec_never_imports_bridge() -> None:
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "codecs").rglob("*.py")
        if "bridge" in _top(_imports(p))
    ]
    assert offenders == []


def test_daemon_never_imports_piper() -> None:
    """piper-tts is GPL: only the TTS server's synthesis engine may import it."""
    allowed = {"bridge/ttsd/piper_engine.py"}
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "bridge").rglob("*.py")
        if "piper" in _top(_imports(p)) and p.relative_to(ROOT).as_posix() not in allowed
    ]
    assert offenders == []


def _provider_references(path: Path) -> set[str]:
    """Every name of a protocol package ``path`` imports or spells as a module string.

    Imports anywhere in the file count (inside functions, under ``TYPE_CHECKING``),
    and so does a string such as ``"bridge.providers.kova.client"`` or an f-string
    starting ``"bridge.providers."`` (an ``importlib`` call around the registry).
    """
    protocol = re.compile(rf"^bridge\.providers\.({'|'.join(PROTOCOLS)})(\.|$)")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith("bridge.providers."):
                found.add(str(head.value) + "{...}")
        found.update(n for n in names if protocol.match(n))
    return found


def test_only_the_registry_reaches_a_provider_protocol() -> None:
    """No module outside ``bridge/providers/`` names a protocol's package: the daemon,
    the config reader and the tts-server go through ``bridge.providers.registry``."""
    offenders = {}
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("bridge/providers/"):
            continue
        found = _provider_references(path)
        if found:
            offenders[rel] = sorted(found)
    assert offenders == {}


def test_the_registry_lists_every_protocol_package() -> None:
    packages = sorted(
        p.name for p in (ROOT / "bridge/providers").iterdir() if (p / "__init__.py").exists()
    )
    assert packages == sorted(PROTOCOLS)
    for name in packages:
        assert {"wire.py", "client.py", "server.py"} <= {
            f.name for f in (ROOT / "bridge/providers" / name).iterdir()
        }


def _wire_problems(directory: Path, name: str) -> list[str]:
    """What breaks "written once" in the protocol package at ``directory``: a side that
    does not import its ``wire.py``, or one that imports the other side."""
    package = f"bridge.providers.{name}"
    problems = []
    for side, other in (("client", "server"), ("server", "client")):
        found = _provider_references(directory / f"{side}.py")
        if not any(n == f"{package}.wire" or n.startswith(f"{package}.wire.") for n in found):
            problems.append(f"{name}/{side}.py does not import {package}.wire")
        if any(n == f"{package}.{other}" or n.startswith(f"{package}.{other}.") for n in found):
            problems.append(f"{name}/{side}.py imports {package}.{other}")
    return problems


def test_each_protocol_writes_its_wire_vocabulary_once() -> None:
    """``providers/<p>/wire.py`` is imported by both that protocol's client engine and its
    tts-server session, and neither side imports the other: what both write is in
    ``wire.py``, nowhere else."""
    problems = [
        problem
        for name in PROTOCOLS
        for problem in _wire_problems(ROOT / "bridge/providers" / name, name)
    ]
    assert problems == []


def test_the_wire_guard_catches_a_violation(tmp_path: Path) -> None:
    (tmp_path / "client.py").write_text("from bridge.providers.kova import wire\n")
    (tmp_path / "server.py").write_text("from bridge.providers.kova.client import DEFAULT_FORMAT\n")
    assert _wire_problems(tmp_path, "kova") == [
        "kova/server.py does not import bridge.providers.kova.wire",
        "kova/server.py imports bridge.providers.kova.client",
    ]


def test_the_provider_guard_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "leg.py"
    bad.write_text(
        "import importlib\n"
        "from bridge.providers.kova.client import ENGINE\n"
        "from bridge.providers import zwst\n"
        "def f(p):\n"
        "    import bridge.providers.coda.wire\n"
        "    return importlib.import_module(f'bridge.providers.{p}.client')\n"
        "X = 'bridge.providers.kletso.server'\n"
        "OK = 'bridge.providers.registry'\n"
    )
    assert _provider_references(bad) == {
        "bridge.providers.kova.client",
        "bridge.providers.kova.client.ENGINE",
        "bridge.providers.zwst",
        "bridge.providers.coda.wire",
        "bridge.providers.{...}",
        "bridge.providers.kletso.server",
    }


def test_the_guard_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "engine.py"
    bad.write_text("import asyncio\nfrom time import monotonic\nimport socket as s\n")
    assert _top(_imports(bad)) & FORBIDDEN == {"asyncio", "time", "socket"}


# ------------------------------------------------------------ the shell's seams


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _bridge_imports(path: Path, module: str) -> set[str]:
    """Every ``bridge`` module that ``path`` (module ``module``) imports, wherever the import
    is: at the top, inside a function, under ``TYPE_CHECKING``. ``from bridge.io import
    ticker`` names ``bridge.io.ticker`` when that is a module; relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = module.split(".")
    if path.name != "__init__.py":
        package.pop()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] == "bridge" and _exists(m)}


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph(package: str = "bridge") -> dict[str, set[str]]:
    """Module → the modules it imports, for every module of ``package``."""
    paths = sorted(ROOT.joinpath(*package.split(".")).rglob("*.py"))
    return {_module(p): _bridge_imports(p, _module(p)) for p in paths}


def _cycles(graph: dict[str, set[str]], within: str) -> list[list[str]]:
    """One import cycle per strongly connected set of modules under ``within`` (Tarjan)."""
    nodes = sorted(m for m in graph if m == within or m.startswith(within + "."))
    edges = {m: sorted(n for n in graph[m] if n in graph and n in nodes) for m in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges[v]:
                found.append(sorted(group))

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _is_provider(module: str) -> bool:
    parts = module.split(".")
    return parts[:2] == ["bridge", "ttsd"] or any(p in PROTOCOLS for p in parts)


def test_the_shell_has_no_import_cycle() -> None:
    """No circle among ``bridge/io``'s modules, counting imports inside functions and
    under ``TYPE_CHECKING``: the daemon composes the legs, nothing imports it back."""
    assert _cycles(_graph(), "bridge.io") == []


def test_no_leg_reaches_the_daemon() -> None:
    """A leg gets ``bridge.io.services``, never ``bridge.io.daemon`` (not even through
    another module)."""
    graph = _graph()
    legs = [m for m in graph if m.startswith("bridge.io.legs.")]
    assert legs  # the legs are where this test looks for them
    offenders = {m: "bridge.io.daemon" for m in legs if "bridge.io.daemon" in _reachable(graph, m)}
    assert offenders == {}


def test_the_cycle_finder_finds_one() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "q.x": {"q.x"}}
    assert _cycles(graph, "p") == [["p.a", "p.b", "p.c"]]
    assert _cycles(graph, "q") == [["q.x"]]


def test_the_import_reader_sees_hidden_imports(tmp_path: Path) -> None:
    """Imports inside functions and under ``TYPE_CHECKING`` count (the shell's circle hid
    behind both)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bridge.io.daemon import Daemon\n"
        "def f() -> None:\n    from bridge.io import ticker\n    from . import callrun\n"
    )
    found = _bridge_imports(probe, "bridge.io.probe")
    assert {"bridge.io.daemon", "bridge.io.ticker", "bridge.io.callrun"} <= found


def _imports_of(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    return {m: sorted(graph[m]) for m in graph if m == package or m.startswith(package + ".")}


def test_media_imports_neither_control_nor_a_provider() -> None:
    """The call engine speaks the shared vocabulary (``bridge.commands``, ``bridge.engine``,
    the provider interface), never a turn source's module nor a provider protocol's."""
    offenders = {
        m: bad
        for m, names in _imports_of(_graph(), "bridge.media").items()
        if (bad := [n for n in names if n.startswith("bridge.control") or _is_provider(n)])
    }
    assert offenders == {}


def test_control_does_not_import_media() -> None:
    offenders = {
        m: bad
        for m, names in _imports_of(_graph(), "bridge.control").items()
        if (bad := [n for n in names if n.startswith("bridge.media")])
    }
    assert offenders == {}


def test_provider_modules_are_told_apart() -> None:
    assert _is_provider("bridge.tts.kletso") and _is_provider("bridge.providers.kova.wire")
    assert _is_provider("bridge.ttsd.piper_engine")
    assert not _is_provider("bridge.tts.base") and not _is_provider("bridge.providers.prompts")

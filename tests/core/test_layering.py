"""The sans-I/O rule, enforced: only bridge/io/ and bridge/cli.py touch asyncio,
sockets, clocks and websockets; telcodec never imports bridge."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_the_guard_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "engine.py"
    bad.write_text("import asyncio\nfrom time import monotonic\nimport socket as s\n")
    assert _top(_imports(bad)) & FORBIDDEN == {"asyncio", "time", "socket"}


# ------------------------------------------------------------ the shell's seams

PROTOCOLS = {"kova", "kugelaudio", "kletso", "coda", "zwst"}
"""The provider protocols: a module named after one (``bridge.tts.kletso``,
``bridge.providers.kletso.wire``) or under ``bridge.ttsd`` is a provider's."""


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

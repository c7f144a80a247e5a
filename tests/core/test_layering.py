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

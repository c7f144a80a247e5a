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

"""``bench`` is a package: its scripts run as ``python -m bench.NAME`` from the repository
root and import each other as ``bench.*``, with no ``sys.path`` edits (issue 32)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SOURCES = sorted(
    p
    for p in BENCH.rglob("*.py")
    if "results" not in p.parts and "pipecat_peer" not in p.parts  # its own venv, standalone
)
# the top-level names a script could only import with bench/ (or a subdirectory) on sys.path
LOCAL = {p.stem for p in BENCH.glob("*.py")} | {"loadgen", "fuzz"}
LOCAL |= {p.stem for d in ("loadgen", "fuzz") for p in (BENCH / d).glob("*.py")}
LOCAL -= {"__init__"}


def test_the_scripts_are_found() -> None:
    names = {p.relative_to(BENCH).as_posix() for p in SOURCES}
    assert {"__init__.py", "common.py", "bench_capacity.py", "loadgen/procs.py"} <= names
    assert {"fuzz/__init__.py", "fuzz/fuzz_common.py", "loadgen/__init__.py"} <= names


def test_no_script_edits_sys_path() -> None:
    edits = [
        f"{p.relative_to(ROOT)}:{node.lineno}"
        for p in SOURCES
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert edits == []


def test_bench_modules_are_imported_through_the_package() -> None:
    bare = []
    for p in SOURCES:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bare += [
                f"{p.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in LOCAL
            ]
    assert bare == [], "import these as bench.<module>"


def test_every_benchmark_takes_quick() -> None:
    """``make bench-quick`` (``run_all --quick``) passes ``--quick`` to every
    ``bench_*.py``: one without the option ended the run's figures with a usage error
    (``bench_chain`` and ``bench_soak`` did)."""
    without = []
    for p in sorted(BENCH.glob("bench_*.py")):
        tree = ast.parse(p.read_text(), str(p))
        options = {
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
        if "--quick" not in options:
            without.append(p.name)
    assert without == []

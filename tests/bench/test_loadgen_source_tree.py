"""The benchmarks' processes can run another source tree's code (bench/loadgen/procs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.loadgen.procs import SOURCE_TREE_ENV, source_tree_env


def _tree(root: Path) -> Path:
    (root / "bridge").mkdir(parents=True)
    (root / "bridge" / "__init__.py").write_text("WHERE = 'other tree'\n")
    (root / "codecs").mkdir()
    return root


def test_no_tree_named_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOURCE_TREE_ENV, raising=False)
    assert source_tree_env() == {}


def test_a_tree_comes_first_on_the_childs_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _tree(tmp_path / "wt")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = source_tree_env(tree)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tree), str(tree / "codecs"), "/elsewhere"]
    out = subprocess.run(
        [sys.executable, "-c", "import bridge; print(bridge.WHERE)"],
        env={**os.environ, **env},
        cwd=tmp_path,  # not this checkout (``-c`` puts the working directory first)
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "other tree"  # ahead of this checkout's editable install


def test_the_environment_variable_names_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _tree(tmp_path / "wt")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv(SOURCE_TREE_ENV, str(tree))
    assert source_tree_env()["PYTHONPATH"] == os.pathsep.join([str(tree), str(tree / "codecs")])


def test_a_directory_without_the_package_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a callbridge source tree"):
        source_tree_env(tmp_path)

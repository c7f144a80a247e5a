"""``bridge.native.stale``: which compiled modules no longer match their source.

A tree of empty sources and fake extension modules in a temporary directory;
modification times are set explicitly, nothing sleeps.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

from bridge import native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def make_tree(root: Path) -> list[str]:
    """Every native source, written, with an extension module beside it built later."""
    sources = native.native_sources(native.ROOT)
    for source in sources:
        path = root / source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {source}\n")
        os.utime(path, (1_000, 1_000))
        ext = path.with_name(path.stem + SUFFIX)
        ext.write_bytes(b"")
        os.utime(ext, (2_000, 2_000))
    return sources


def test_a_tree_built_after_its_sources_is_current(tmp_path: Path) -> None:
    make_tree(tmp_path)
    assert native.stale(tmp_path) == []
    native.write_manifest(tmp_path)
    assert native.stale(tmp_path) == []


def test_a_source_edited_after_the_build_is_stale(tmp_path: Path) -> None:
    sources = make_tree(tmp_path)
    edited = tmp_path / sources[0]
    os.utime(edited, (3_000, 3_000))
    assert native.stale(tmp_path) == [sources[0]]


def test_a_source_edited_while_the_build_ran_is_stale_though_older(tmp_path: Path) -> None:
    sources = make_tree(tmp_path)
    native.write_manifest(tmp_path)  # the build reads the sources...
    edited = tmp_path / sources[-2]
    edited.write_text("# changed while mypyc compiled the rest\n")
    os.utime(edited, (1_500, 1_500))  # ...then the edit, then the modules are written
    assert native.stale(tmp_path) == [sources[-2]]


def test_no_manifest_falls_back_to_times_and_a_missing_module_is_stale(tmp_path: Path) -> None:
    sources = make_tree(tmp_path)
    (tmp_path / native.MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / native.MANIFEST).write_text("not json")
    assert native.stale(tmp_path) == []
    source = tmp_path / sources[1]
    source.with_name(source.stem + SUFFIX).unlink()
    assert native.stale(tmp_path) == [sources[1]]

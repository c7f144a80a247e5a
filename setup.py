"""Build hook: compiles the media hot path with mypyc (see docs/native.md).

Everything else about the package is in pyproject.toml. The modules below are
the per-frame path of every call (the engines the media ticker drives 50 times
a second per call); mypyc turns their type-annotated Python into C extension
modules, which the interpreter imports instead of the ``.py`` files beside
them. ``CALLBRIDGE_PURE_PYTHON=1`` builds without them: the same package in pure Python,
slower, and what to use on a machine without a C compiler.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _native() -> Any:
    """``bridge/native.py``, read without importing the package."""
    spec = importlib.util.spec_from_file_location(
        "_callbridge_native", HERE / "bridge" / "native.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_sources() -> list[str]:
    """The modules mypyc compiles (the list in ``bridge/native.py``)."""
    return list(_native().native_sources(HERE))


def ext_modules() -> list[object]:
    if os.environ.get("CALLBRIDGE_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    os.chdir(HERE)  # mypyc names the modules by their paths from here
    _native().write_manifest(HERE)  # what is compiled below, as it is read now
    return list(
        mypycify(
            [
                # the build environment has only the build requirements: the runtime
                # dependencies are typed as Any here (mypy --strict checks them apart)
                "--ignore-missing-imports",
                "--follow-imports=silent",
                "--no-warn-unused-configs",
                # its own cache: `make typecheck`'s (.mypy_cache) was made with the runtime
                # dependencies installed, and read here it hid what a fresh build sees
                "--cache-dir=build/mypyc_cache",
                *native_sources(),
            ],
            opt_level="3",
            multi_file=True,  # one C file per module: smaller units, rebuilt apart
            group_name="callbridge_native",  # the shared library: callbridge_native__mypyc
        )
    )


setup(ext_modules=ext_modules())

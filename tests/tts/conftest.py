"""Makes ``tests/tts/replay.py`` importable as ``tts_replay`` for every test below.

The suite runs with ``--import-mode=importlib``: test directories are not on
``sys.path`` and not packages, so the shared helpers are loaded by path once,
here, before pytest imports the conftests and test modules of the protocol
directories.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import ``path`` as module ``name`` (once; later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


load_by_path("tts_replay", Path(__file__).parent / "replay.py")

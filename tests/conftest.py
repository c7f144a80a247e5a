"""Session-wide: the suite runs on the code as built (compiled or pure Python), never stale."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest

from bridge import native
from bridge.io.gcpolicy import collect_named


def pytest_report_header() -> str:
    built = native.compiled()
    if not built:
        return "callbridge: pure Python (no module compiled with mypyc)"
    return f"callbridge: {len(built)} modules compiled with mypyc (bridge/native.py)"


def pytest_sessionstart(session: pytest.Session) -> None:
    old = native.stale()
    if old:
        pytest.exit(
            "compiled modules older than their source (rebuild: `make venv` or "
            "`pip install -e .`; or go back to pure Python: `python -m bridge.native --clean`): "
            + ", ".join(old),
            returncode=4,
        )


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off for the test: what it would free is left for it to find."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()  # the daemon freezes what it has at start-up
        if was_enabled:
            gc.enable()
        gc.collect()


def _collect_garbage() -> list[str]:
    return sorted(collect_named())


@pytest.fixture
def cyclic_garbage() -> Callable[[], list[str]]:
    """A full collection's unreachable objects, by type (``module.qualname``), sorted.

    With ``no_cyclic_gc`` on, that is everything left in reference cycles since
    the last call: what reference counting alone could not free.
    """
    return _collect_garbage

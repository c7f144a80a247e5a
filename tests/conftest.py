"""Session-wide: the suite runs on the code as built (compiled or pure Python), never stale."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from bridge import native
from bridge.io.gcpolicy import collect_named

# Property tests: the same examples on every run, for CI and developers alike
# (each test's own ``max_examples`` is kept). No deadline and no timing health
# check: a loaded 2-core machine must not turn a slow example into a failure.
# ``CALLBRIDGE_HYPOTHESIS=explore`` draws new examples each run (local use).
_TIMING_FREE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("callbridge", _TIMING_FREE, derandomize=True, database=None)
settings.register_profile("explore", _TIMING_FREE, derandomize=False)
_PROFILE = os.environ.get("CALLBRIDGE_HYPOTHESIS", "callbridge")
if _PROFILE not in ("callbridge", "explore"):
    raise pytest.UsageError(
        f"CALLBRIDGE_HYPOTHESIS={_PROFILE!r}: expected 'callbridge' or 'explore'"
    )
settings.load_profile(_PROFILE)


def _time_factor() -> float:
    """``CALLBRIDGE_TEST_TIME_FACTOR``: how much longer than at home the shell tests wait."""
    raw = os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor >= 1.0:
        raise pytest.UsageError(f"CALLBRIDGE_TEST_TIME_FACTOR={raw!r}: expected a number >= 1")
    return factor


def pytest_report_header() -> list[str]:
    built = native.compiled()
    if not built:
        build = "callbridge: pure Python (no module compiled with mypyc)"
    else:
        build = f"callbridge: {len(built)} modules compiled with mypyc (bridge/native.py)"
    return [build, f"callbridge: CALLBRIDGE_TEST_TIME_FACTOR={_time_factor()}"]


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

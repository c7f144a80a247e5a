"""Session-wide: the suite runs on the code as built (compiled or pure Python), never stale."""

from __future__ import annotations

import pytest

from bridge import native


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

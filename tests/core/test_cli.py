from __future__ import annotations

import subprocess
import sys

from bridge import __version__


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"callbridge {__version__}"

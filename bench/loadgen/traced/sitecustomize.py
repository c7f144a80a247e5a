"""Imported by every Python process started with this directory first on ``PYTHONPATH``
(``bench/diag_heap_per_call.py`` does, for the daemon it starts): with ``TM_DIR`` set,
``tracemalloc`` traces from the start (``TM_FRAMES`` frames, default 1) and each
``SIGUSR1`` writes a snapshot, ``TM_DIR/snapN.tm``, then ``TM_DIR/doneN``."""

from __future__ import annotations

import gc
import os
import signal
import tracemalloc
from types import FrameType

if os.environ.get("TM_DIR"):
    tracemalloc.start(int(os.environ.get("TM_FRAMES", "1")))
    _taken = [0]

    def _dump(signum: int, frame: FrameType | None) -> None:
        _taken[0] += 1
        gc.collect()
        out = os.environ["TM_DIR"]
        tracemalloc.take_snapshot().dump(os.path.join(out, f"snap{_taken[0]}.tm"))
        open(os.path.join(out, f"done{_taken[0]}"), "w").close()

    signal.signal(signal.SIGUSR1, _dump)

"""The descriptor table grown at start-up (``bridge.io.fdtable``): the size the kernel
reports (``FDSize`` in ``/proc/self/status``), in a fresh interpreter with a thread
running (the case in which growing it mid-call waits for RCU), nothing open replaced."""

from __future__ import annotations

import subprocess
import sys

from bridge.io.fdtable import BASE_DESCRIPTORS, descriptors_needed

CHECK = """
import os, resource, sys, threading
from bridge.io.fdtable import reserve_slots

def fd_size():
    for line in open("/proc/self/status"):
        if line.startswith("FDSize:"):
            return int(line.split()[1])

stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()
soft = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
before, open_before = fd_size(), sorted(os.listdir("/proc/self/fd"))
got = reserve_slots(int(sys.argv[2]))
after, open_after = fd_size(), sorted(os.listdir("/proc/self/fd"))
print(before, got, after, open_before == open_after)
stop.set()
"""


def _run(soft: int, asked: int) -> list[int | bool]:
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(soft), str(asked)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return [int(x) if x.isdigit() else x == "True" for x in out]


def test_the_table_is_grown_to_what_is_asked_and_nothing_open_changes() -> None:
    before, got, after, same = _run(soft=4096, asked=2256)
    assert before < 2256  # a fresh interpreter's table is small
    assert got == 2256
    assert after >= 2256
    assert same is True  # the descriptor used to grow it is closed again


def test_the_soft_limit_caps_it() -> None:
    _, got, after, same = _run(soft=300, asked=5000)
    assert got == 300
    assert 300 <= after < 5000
    assert same is True


def test_what_a_daemon_at_its_limits_holds() -> None:
    assert descriptors_needed(500, 1000) == 2 * 500 + 1000 + BASE_DESCRIPTORS

"""The process's file descriptor table, grown once at start-up rather than during calls.

Linux grows a process's descriptor table (64, 256, 512, 1024... slots) when a
new descriptor needs a slot past its end. In a process with more than one thread,
it then waits for an RCU grace period (``expand_fdtable``: ``synchronize_rcu``)
before the ``socket()`` or ``accept()`` returns. Measured here: 8 ms for the
``socket()`` that took descriptor 256, during which the loop stopped. Every call
whose frame was due then left up to 17 ms late: ``bench_ivr.py`` at 25 calls/s,
at the 118th call (descriptor 256) and the 246th (512), each a burst of late
packets on a third of the calls, with no host stall and no long callback.

The table never shrinks, so one descriptor opened at the highest number the
calls will need, then closed, pays that wait once, before ``READY=1``.
``F_DUPFD`` takes the lowest free number at or above the one asked for: nothing
open is replaced.
"""

from __future__ import annotations

import fcntl
import os
import resource

__all__ = ["descriptors_needed", "reserve_slots"]

BASE_DESCRIPTORS = 256
"""Listeners, the embedded child's pipes, provider connections, logs, the API's clients."""


def descriptors_needed(max_calls: int, max_streams: int) -> int:
    """What a daemon at its limits holds: two per SIP call (RTP and RTCP), one per
    media stream, and ``BASE_DESCRIPTORS``."""
    return 2 * max_calls + max_streams + BASE_DESCRIPTORS


def reserve_slots(count: int) -> int:
    """Grow the table to hold ``count`` descriptors (at most the soft ``RLIMIT_NOFILE``:
    beyond it nothing can be opened anyway). Returns the number reserved."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        count = min(count, soft)
    if count <= 3:
        return 0
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, count - 1)
        os.close(high)
    except OSError:  # EMFILE / EINVAL: every slot up to the limit is already in use
        return 0
    finally:
        os.close(fd)
    return count

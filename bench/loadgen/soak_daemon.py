"""``callbridge serve`` for the soak, with its inner state written to a file every second.

    python -m bench.loadgen.soak_daemon CONFIG STATE_JSON     (from the repository's root)

Runs the daemon exactly as ``callbridge serve`` does (``Daemon.run``: signals,
drain, status), and beside it a task that writes what the soak compares with
its baseline and cannot read from outside the process: SIP transactions and
dialogs held by the user agents, RTP port pairs allocated, calls per leg,
asyncio tasks, and the ports it bound (listeners on port 0). The file
appears once the daemon is ready. RSS and descriptors are read from
``/proc`` by the soak.

While no call is up it also writes the heap as the process sees it (``heap``):
Python's allocated blocks (``sys.getallocatedblocks``), the objects the idle
thaw froze (``gc.get_freeze_count``: the collector's view of what lives on)
and glibc's ``mallinfo2`` (bytes the C heap holds in use and free, over all
its arenas), so RSS left over at idle can be told apart: live objects, or free
C heap that ``malloc_trim`` did not give back. Not read with calls up (walks
the allocator's free lists).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

from bridge.config import Config, load_config
from bridge.io.daemon import Daemon
from bridge.logs import configure


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _mallinfo2() -> Any:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):
        return None  # not glibc, or glibc before 2.33
    if fn is not None:
        fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap() -> dict[str, Any]:
    """The heap from inside: Python's blocks and frozen objects, glibc's in-use and free
    bytes (``None`` without ``mallinfo2``)."""
    out: dict[str, Any] = {
        "py_allocated_blocks": sys.getallocatedblocks(),
        "gc_frozen_objects": gc.get_freeze_count(),
        "gc_tracked_objects": len(gc.get_objects()),
        "malloc": None,
    }
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        out["malloc"] = {
            "in_use_bytes": int(mi.uordblks) + int(mi.hblkhd),  # brk/arena heaps + mmapped
            "free_bytes": int(mi.fordblks),  # free inside the heaps, not given back
            "heap_bytes": int(mi.arena),  # the heaps' size (sbrk and thread arenas)
            "mmapped_bytes": int(mi.hblkhd),
            "top_releasable_bytes": int(mi.keepcost),
        }
    return out


def state(daemon: Daemon) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": len(asyncio.all_tasks()), "calls": {}, "ports": {}}
    for leg in daemon.legs:
        out["calls"][leg.name] = leg.active_calls()
        if leg.name == "media_streams":
            out["ports"]["media_streams"] = leg.port  # type: ignore[attr-defined]
        if leg.name == "sip":
            runners = getattr(leg, "runners", [])
            out["sip_transactions"] = sum(r.ua._holder_count() for r in runners)
            out["rtp_ports_allocated"] = leg.ports.allocated_count  # type: ignore[attr-defined]
    if not sum(out["calls"].values()):
        out["heap"] = heap()
    return out


async def dump_every_second(daemon: Daemon, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    while True:
        await asyncio.sleep(1.0)
        if not daemon.ready:
            continue
        try:
            tmp.write_text(json.dumps(state(daemon)))
        except Exception as exc:
            print(f"soak_daemon: state not written: {exc!r}", file=sys.stderr)
            raise
        os.replace(tmp, path)


async def serve(cfg: Config, state_path: Path) -> int:
    daemon = Daemon(cfg)
    dumper = asyncio.ensure_future(dump_every_second(daemon, state_path))
    try:
        return await daemon.run()
    finally:
        dumper.cancel()


def main(config: Path, state_path: Path) -> int:
    cfg = load_config(str(config))
    configure(cfg.daemon.log_level, cfg.daemon.log_format)
    if cfg.daemon.event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return int(uvloop.run(serve(cfg, state_path)))
    return asyncio.run(serve(cfg, state_path))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))

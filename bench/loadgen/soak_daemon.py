"""``callbridge serve`` for the soak, with its inner state written to a file every second.

    python -m bench.loadgen.soak_daemon CONFIG STATE_JSON     (from the repository's root)

Runs the daemon exactly as ``callbridge serve`` does (``Daemon.run``: signals,
drain, status), and beside it a task that writes what the soak compares with
its baseline and cannot read from outside the process: SIP transactions and
dialogs held by the user agents, RTP port pairs allocated, calls per leg,
asyncio tasks, and the ports it bound (listeners on port 0). The file
appears once the daemon is ready. RSS and descriptors are read from
``/proc`` by the soak.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from bridge.config import Config, load_config
from bridge.io.daemon import Daemon
from bridge.logs import configure


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

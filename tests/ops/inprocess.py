"""A daemon in the test's own process, with a tone-engine ttsd of its own, and a stand-in
for its ticker that reports a lagging media clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server


async def with_daemon(
    config: Callable[[int], str], name: str, steps: Callable[[Daemon], Awaitable[None]]
) -> None:
    """Start the ttsd and a daemon on ``config(ttsd_port)``, run ``steps`` against the
    daemon, then drain and close both, whatever ``steps`` did."""
    tts = await start_tts_server(engine="tone")
    daemon = Daemon(parse_config(config(tts.port), name))
    await daemon.start()
    try:
        await steps(daemon)
    finally:
        await daemon.drain_and_stop()
        await daemon.close()
        await tts.close()


class Overloaded:
    """The daemon's ticker, reporting a lagging media clock."""

    def __init__(self, ticker: Any) -> None:
        self._ticker = ticker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ticker, name)

    def overloaded(self, max_lag_s: float) -> bool:
        return True

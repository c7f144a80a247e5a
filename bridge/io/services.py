"""The seam between the daemon and its legs: what a leg and its calls may use of the process.

``bridge.io.daemon`` is the composition root: it builds one ``Services`` at start-up
and hands it to every leg (``bridge.io.legs``), which hands it to each call's
``CallRunner`` (``bridge.io.callrun``). Neither ever sees the ``Daemon``: the legs
import this module, the daemon imports the legs, and nothing imports the daemon back.
A test or a benchmark builds a ``Services`` of its own (``Services.standalone``).

A reload replaces ``config`` and ``runtime`` here (the daemon does, at the moment it
swaps its own); a call started before keeps the ``Runtime`` it started with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bridge.config import Config
from bridge.io.gcpolicy import ReleaseWatch
from bridge.io.provider_pool import ProviderPool
from bridge.io.ticker import MediaTicker
from bridge.metrics import Metrics
from bridge.providers.prompts import PromptCache

__all__ = ["Runtime", "Services"]


@dataclass
class Runtime:
    """What one config generation provides to the calls that start under it."""

    config: Config
    pools: dict[str, ProviderPool]
    cache: PromptCache
    calls: int = 0
    """Calls started under this generation and not finished yet."""

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)


def _nothing() -> None:
    return None


@dataclass(eq=False)
class Services:
    """What the legs and the calls get from the daemon, and all they get."""

    config: Config
    """The config in force (a reload replaces it): the legs' listeners, limits and auth."""
    ticker: MediaTicker
    """The process-wide media ticker: every call's frames, its lag (overload) and the
    preemption point (``run_if_due``) of a callback working through a backlog."""
    metrics: Metrics
    spawn: Callable[[Awaitable[None]], None]
    """Run a coroutine as a task whose failure is logged (the daemon keeps it alive)."""
    runtime: Runtime | None = None
    """The generation new calls start under: its config, provider pools and prompt cache
    (``None`` until the first is built)."""
    release_watch: ReleaseWatch = field(default_factory=ReleaseWatch)
    """Ended calls, checked to be freed by reference counting (``bridge.io.gcpolicy``)."""
    generation_idle: Callable[[], None] = _nothing
    """Called when a call of a replaced generation ends: the daemon closes a generation
    once its last call has ended."""

    def call_config(self) -> Config:
        """The config a new call is routed by: its generation's, once there is one."""
        return self.runtime.config if self.runtime is not None else self.config

    @classmethod
    def standalone(
        cls, config: Config, ticker: MediaTicker, runtime: Runtime | None = None
    ) -> Services:
        """Services outside a daemon (tests, benchmarks): fresh metrics, and tasks spawned
        on the running loop and kept until they end."""
        tasks: set[asyncio.Future[None]] = set()

        def spawn(coro: Awaitable[None]) -> None:
            task = asyncio.ensure_future(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        return cls(config, ticker, Metrics(), spawn, runtime)

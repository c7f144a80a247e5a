"""Static prompts rendered before the first call, at reload, and kept on disk across restarts.

The daemon runs in this process (no listeners: its calls are not the subject) against a
real ttsd whose ``tone`` engine counts what it synthesises; ``cache_dir`` is a temporary
directory. Waits are bounded by ``TIMEOUT_S`` (scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from test_prompt_single_flight import CountingTone

from bridge.config import load_config
from bridge.io.daemon import Daemon
from bridge.io.httpws import HttpRequest
from bridge.io.notify import Notifier
from bridge.io.prompt_store import SUFFIX, PromptStore
from bridge.io.ttsd_server import TtsServer, start_tts_server
from bridge.providers.prompts import PromptCache

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 30.0 * FACTOR
PROMPTS = ["Hello and welcome.", "Press one for sales.", "Goodbye now."]
FALLBACK = "Sorry, that did not work."


class RecordingNotifier(Notifier):
    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[tuple[str, ...]] = []

    def send(self, *fields: str) -> None:
        self.sent.append(fields)

    def statuses_before_ready(self) -> list[str]:
        out: list[str] = []
        for fields in self.sent:
            if "READY=1" in fields:
                return out
            out += [f.removeprefix("STATUS=") for f in fields if f.startswith("STATUS=")]
        raise AssertionError(f"no READY=1 in {self.sent}")


def _config(tmp: Path, server: TtsServer, greeting: str = PROMPTS[0]) -> Path:
    path = tmp / "callbridge.toml"
    path.write_text(f"""
[daemon]
event_loop = "asyncio"
cache_dir = "{tmp / "cache"}"
fallback_prompt = "{FALLBACK}"

[sip]
enabled = false

[media_streams]
enabled = false

[api]
enabled = false

[providers.local]
protocol = "kova"
url = "{server.url("kova")}"
api_key = "not-a-real-key"
voice = "tone"

[flows.menu]
start = "menu"

[flows.menu.steps.menu]
say = "{PROMPTS[1]}"
next = "bye"

[flows.menu.steps.bye]
say = "{PROMPTS[2]}"
hangup = true

[[routes]]
match = "*"
provider = "local"
greeting = "{greeting}"
flow = "menu"
""")
    return path


def _run(body: Callable[[Path, TtsServer, CountingTone], Awaitable[None]], tmp: Path) -> None:
    async def main() -> None:
        engine = CountingTone()
        server = await start_tts_server(engine=engine)
        try:
            await asyncio.wait_for(body(tmp, server, engine), TIMEOUT_S)
        finally:
            await server.close()

    asyncio.run(main())


async def _daemon(path: Path) -> Daemon:
    daemon = Daemon(load_config(str(path)), notifier=RecordingNotifier())
    await daemon.start()
    return daemon


async def _readyz(daemon: Daemon) -> tuple[int, dict[str, object]]:
    resp = await daemon._api(HttpRequest("GET", "/readyz", {}))
    return resp.status, json.loads(resp.body)


async def _prompt_metrics(daemon: Daemon) -> dict[tuple[str, str], float]:
    """The prompt cache's samples on the metrics page: (name, its one label's value) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = await daemon._api(HttpRequest("GET", "/metrics", {}))
    assert resp.status == 200
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(resp.body.decode()):
        for sample in family.samples:
            if sample.name.startswith("callbridge_prompt_cache_") and not sample.name.endswith(
                "_created"
            ):
                assert len(sample.labels) == 1  # provider, or where: bounded
                out[sample.name, next(iter(sample.labels.values()))] = sample.value
    return out


def test_prompts_are_rendered_before_ready_and_again_only_when_changed(tmp_path: Path) -> None:
    async def body(tmp: Path, server: TtsServer, engine: CountingTone) -> None:
        daemon = await _daemon(_config(tmp, server))
        try:
            assert sorted(engine.texts) == sorted([*PROMPTS, FALLBACK])  # before READY=1
            notifier = daemon.notifier
            assert isinstance(notifier, RecordingNotifier)
            progress = notifier.statuses_before_ready()
            assert (
                progress[0] == "rendering prompts 0/4" and progress[-1] == "rendering prompts 4/4"
            )
            status, ready = await _readyz(daemon)
            assert status == 200 and ready["ready"] is True
            assert ready["prompts"] == {
                "warm": True, "total": 4, "done": 4, "rendered": 4, "failed": 0
            }  # fmt: skip
            # a reload changing the greeting renders that one prompt only
            _config(tmp, server, greeting="Hello again, and welcome.")
            await daemon.reload()
            assert sorted(engine.texts) == sorted([*PROMPTS, FALLBACK, "Hello again, and welcome."])
            _, ready = await _readyz(daemon)
            assert ready["prompts"] == {
                "warm": True, "total": 4, "done": 4, "rendered": 1, "failed": 0
            }  # fmt: skip
        finally:
            await daemon.drain_and_stop()
            await daemon.close()
        # what was rendered is on disk, named by digest, and holds no secret
        files = sorted((tmp / "cache").glob(f"*{SUFFIX}"))
        assert len(files) == 5
        assert not any(b"not-a-real-key" in f.read_bytes() for f in files)
        assert not list((tmp / "cache").glob(".*tmp*"))

    _run(body, tmp_path)


def test_a_restart_loads_the_rendered_prompts_from_disk(tmp_path: Path) -> None:
    async def body(tmp: Path, server: TtsServer, engine: CountingTone) -> None:
        path = _config(tmp, server)
        first = await _daemon(path)
        await first.drain_and_stop()
        await first.close()
        assert len(engine.texts) == 4
        # a truncated file (a torn write by something else) and a corrupted one
        files = sorted((tmp / "cache").glob(f"*{SUFFIX}"))
        truncated, corrupted = files[0], files[1]
        truncated.write_bytes(truncated.read_bytes()[:40])
        data = bytearray(corrupted.read_bytes())
        data[-10] ^= 0xFF
        corrupted.write_bytes(bytes(data))
        engine.texts.clear()
        second = await _daemon(path)
        try:
            assert second.prompt_store is not None and second.prompt_store.bad == 2
            assert len(engine.texts) == 2  # the two bad files rendered again, the rest loaded
            _, ready = await _readyz(second)
            assert ready["prompts"] == {
                "warm": True, "total": 4, "done": 4, "rendered": 2, "failed": 0
            }  # fmt: skip
            await second._store_prompts()  # (the daemon writes renders every few seconds)
            on_disk = sum(f.stat().st_size for f in (tmp / "cache").glob(f"*{SUFFIX}"))
            assert second.runtime is not None and on_disk > 0
            assert await _prompt_metrics(second) == {
                ("callbridge_prompt_cache_hits_total", "local"): 2,  # the two loaded
                ("callbridge_prompt_cache_misses_total", "local"): 2,  # the two bad files
                ("callbridge_prompt_cache_coalesced_total", "local"): 0,
                ("callbridge_prompt_cache_render_failures_total", "local"): 0,
                ("callbridge_prompt_cache_bytes", "memory"): second.runtime.cache.size_bytes,
                ("callbridge_prompt_cache_bytes", "disk"): on_disk,
            }
            assert second.runtime.cache.size_bytes > 0
        finally:
            await second.drain_and_stop()
            await second.close()
        assert len(list((tmp / "cache").glob(f"*{SUFFIX}"))) == 4  # rewritten whole

    _run(body, tmp_path)


def test_the_store_keeps_the_cache_bound_on_disk(tmp_path: Path) -> None:
    from bridge.providers.base import MULAW_8K, AudioReceived
    from bridge.providers.prompts import PromptKey

    cache = PromptCache(max_bytes=250, persist=True)
    store = PromptStore(tmp_path)
    for n, text in enumerate(("a", "b", "c")):
        key = PromptKey("p", "i", "v", MULAW_8K, None, text)
        cache.put(key, [AudioReceived("", b"x" * 100, MULAW_8K)])
        store.apply(store.take(cache))
        if cache.holds(key):
            os.utime(store.path(key.digest()), (1000.0 + n, 1000.0 + n))  # written in order
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 2  # "a" evicted, on disk too
    assert store.disk_bytes == sum(f.stat().st_size for f in tmp_path.glob(f"*{SUFFIX}"))
    fresh = PromptCache(max_bytes=150)  # a smaller bound at the next start: the oldest go
    again = PromptStore(tmp_path)
    assert again.load_into(fresh) == 2 and len(fresh) == 1
    assert fresh.holds(PromptKey("p", "i", "v", MULAW_8K, None, "c"))
    files = list(tmp_path.glob(f"*{SUFFIX}"))
    assert len(files) == 1 and again.disk_bytes == files[0].stat().st_size > 100


def test_a_provider_that_cannot_render_delays_ready_by_the_wait_only(tmp_path: Path) -> None:
    async def body(tmp: Path, server: TtsServer, engine: CountingTone) -> None:
        path = _config(tmp, server)
        text = path.read_text().replace(server.url("kova"), "ws://127.0.0.1:1/v1/ws/kova")
        path.write_text(text.replace("[daemon]\n", "[daemon]\nprerender_wait_s = 0.5\n", 1))
        daemon = await _daemon(path)  # returns once the wait is over: READY=1 went out
        try:
            notifier = daemon.notifier
            assert isinstance(notifier, RecordingNotifier)
            assert notifier.statuses_before_ready()[0] == "rendering prompts 0/4"
            status, ready = await _readyz(daemon)
            assert status == 200 and ready["ready"] is True  # cold prompts do not fail it
            prompts = ready["prompts"]
            assert isinstance(prompts, dict) and prompts["warm"] is False
            assert prompts["total"] == 4 and prompts["done"] < 4
        finally:
            await daemon.drain_and_stop()
            await daemon.close()
        assert engine.texts == []

    _run(body, tmp_path)


def test_an_embedded_providers_prompts_outlive_its_childs_port() -> None:
    from bridge.config import parse_config
    from bridge.io.daemon import prompt_identity
    from bridge.providers.base import ProviderSettings

    cfg = parse_config(
        '[providers.local]\nprotocol = "kova"\nurl = "embedded"\nengine = "tone"\nvoice = "tone"\n'
        '[[routes]]\nmatch = "*"\nprovider = "local"\n',
        "c.toml",
    )
    (p,) = cfg.providers

    def on(port: int, engine: str = "tone") -> str:
        settings = ProviderSettings("local", "kova", f"ws://127.0.0.1:{port}/v1/ws/kova", "")
        return prompt_identity(p if engine == "tone" else replace(p, engine=engine), settings)

    assert on(40001) == on(40002)  # the child's port changes at every start
    assert on(40001) != on(40001, "piper")  # its engine changes the voice

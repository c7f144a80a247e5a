"""Protocol engines are freed by reference counting: none forms a reference cycle.

An engine that keeps its own bound methods (a handler table built in
``__init__``) is a cycle: once dropped it waits for a full collection, which
the daemon's GC policy runs only at a thaw (up to ``gc_thaw_s`` while calls
are up). One media-stream engine lives per call and one provider engine per
connection, so each left ~a dozen objects per call in ``bench/bench_memory.py``'s
busy churn. The call as a whole: ``tests/e2e/test_call_release.py``.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable, Iterator

import pytest

from bridge.streams import DIALECTS
from bridge.tts.base import ProviderSettings
from bridge.ttsd.base import ServerOptions

PROVIDERS = ["coda", "kletso", "kova", "kugelaudio", "zwst"]


@pytest.fixture
def collector_off() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def unreachable_after(make: Callable[[], object]) -> list[str]:
    """Types of what a full collection finds unreachable once ``make()``'s result is dropped.

    The second of two: a first use may build and drop things of its own (an
    import, a typing cache).
    """
    make()
    gc.collect()
    obj = make()
    del obj
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sorted(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


def _client(protocol: str) -> object:
    engine = importlib.import_module(f"bridge.tts.{protocol}").ENGINE(
        ProviderSettings(
            name="p", protocol=protocol, url="wss://provider.example/v1", api_key="k", voice="v"
        )
    )
    if engine.session_request() is not None:
        engine.session_response(200, b'{"url": "wss://provider.example/v1?t=1"}', 0.0)
    engine.connection_made("rime.v1.json" if protocol == "coda" else None, 0.0)
    engine.receive_text('{"type": "unknown"}', 1.0)  # through the dispatch
    engine.events_received()
    engine.actions_to_send()
    return engine


def _server(protocol: str) -> object:
    module = importlib.import_module(f"bridge.ttsd.{protocol}")
    session = module.SESSION(ServerOptions())
    session.receive_text('{"type": "unknown"}', 0.0)
    return session


@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("protocol", PROVIDERS)
def test_provider_client_engine_leaves_no_cycle(protocol: str) -> None:
    assert unreachable_after(lambda: _client(protocol)) == []


@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("protocol", PROVIDERS)
def test_reference_server_session_leaves_no_cycle(protocol: str) -> None:
    assert unreachable_after(lambda: _server(protocol)) == []


@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("path", sorted(DIALECTS))
def test_media_stream_engine_leaves_no_cycle(path: str) -> None:
    def make() -> object:
        engine = DIALECTS[path]()
        engine.connection_made(0.0)
        engine.receive_text('{"event": "unknown"}', 0.1)
        engine.events_received()
        return engine

    assert unreachable_after(make) == []

"""Protocol engines are freed by reference counting: none forms a reference cycle.

An engine that keeps its own bound methods (a handler table built in
``__init__``) is a cycle: once dropped it waits for a full collection, which
the daemon's GC policy runs only at a thaw (with calls up, only on evidence of
cycles, and then every ``gc_thaw_s``). One media-stream engine lives per call
and one provider engine per connection, so each left ~a dozen objects per call
in ``bench/bench_memory.py``'s busy churn. The call as a whole: ``tests/e2e/test_call_release.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest

from bridge.providers.base import ProviderSettings
from bridge.providers.server_base import ServerOptions
from bridge.streams import DIALECTS

PROVIDERS = ["coda", "kletso", "kova", "kugelaudio", "zwst"]


def unreachable_after(make: Callable[[], object], garbage: Callable[[], list[str]]) -> list[str]:
    """Types of what a full collection finds unreachable once ``make()``'s result is dropped.

    The second of two: a first use may build and drop things of its own (an
    import, a typing cache).
    """
    make()
    garbage()
    obj = make()
    del obj
    return garbage()


def _client(protocol: str) -> object:
    engine = importlib.import_module(f"bridge.providers.{protocol}.client").ENGINE(
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
    module = importlib.import_module(f"bridge.providers.{protocol}.server")
    session = module.SESSION(ServerOptions())
    session.receive_text('{"type": "unknown"}', 0.0)
    return session


@pytest.mark.usefixtures("no_cyclic_gc")
@pytest.mark.parametrize("protocol", PROVIDERS)
def test_provider_client_engine_leaves_no_cycle(
    protocol: str, cyclic_garbage: Callable[[], list[str]]
) -> None:
    assert unreachable_after(lambda: _client(protocol), cyclic_garbage) == []


@pytest.mark.usefixtures("no_cyclic_gc")
@pytest.mark.parametrize("protocol", PROVIDERS)
def test_reference_server_session_leaves_no_cycle(
    protocol: str, cyclic_garbage: Callable[[], list[str]]
) -> None:
    assert unreachable_after(lambda: _server(protocol), cyclic_garbage) == []


@pytest.mark.usefixtures("no_cyclic_gc")
@pytest.mark.parametrize("path", sorted(DIALECTS))
def test_media_stream_engine_leaves_no_cycle(
    path: str, cyclic_garbage: Callable[[], list[str]]
) -> None:
    def make() -> object:
        engine = DIALECTS[path]()
        engine.connection_made(0.0)
        engine.receive_text('{"event": "unknown"}', 0.1)
        engine.events_received()
        return engine

    assert unreachable_after(make, cyclic_garbage) == []

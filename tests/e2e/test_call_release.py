"""An ended call is freed by reference counting, not left to the cyclic GC.

A call's objects (the leg adapter, its ``CallRunner``, the ``CallBridge`` with
its playout queue, jitter buffer, echo arrays, VAD ...) are tens of KB. If
they form a reference cycle, every ended call waits for a full (generation 2)
collection: with the daemon's GC policy (``bridge/io/gcpolicy.py``) that is
the next thaw, up to ``gc_thaw_s`` (600 s) while calls are up, and without it
a pass that at a few hundred thousand live objects runs rarely. Either way
ended calls pile up (live heap growing ~200 B per completed call between
passes in ``bench/bench_memory.py``) and pymalloc keeps the arenas they
filled. So the test runs with the collector and the policy off and checks
that the call is gone once it has ended.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from collections.abc import Callable

import pytest

from bridge.io.caller import CallerOptions, place_call

from .harness import FACTOR, TwilioCall, free_port, stack

GREETING_ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello from the bridge."
"""


async def _until(cond: object, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if cond():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.02)
    return bool(cond())  # type: ignore[operator]


class _Watch:
    """Which of some objects are still alive, without keeping them alive.

    A weak reference where the type takes one. A class compiled with mypyc
    (``bridge/native.py``: the call's ``CallBridge`` and ``CallRunner``) takes
    none: it is remembered by type and address, and is alive while the
    collector still tracks an object of that type there (every compiled
    instance is tracked). Holding those strongly instead would keep alive
    whatever they hold (the runner its bridge and leg), and the test could no
    longer tell what reference counting alone frees.
    """

    def __init__(self) -> None:
        self._weak: dict[str, weakref.ref[object]] = {}
        self._tracked: dict[str, tuple[type, int]] = {}

    def add(self, name: str, obj: object) -> None:
        try:
            self._weak[name] = weakref.ref(obj)
        except TypeError:
            assert gc.is_tracked(obj), f"{name}: {type(obj).__name__} is not tracked"
            self._tracked[name] = (type(obj), id(obj))

    def alive(self) -> list[str]:
        alive = [name for name, ref in self._weak.items() if ref() is not None]
        if self._tracked:
            live = {(type(o), id(o)) for o in gc.get_objects()}
            alive += [name for name, key in self._tracked.items() if key in live]
        return alive


def _ours(found: list[str]) -> list[str]:
    """callbridge's own types among a collection's garbage (``cyclic_garbage``).

    A call's objects can be freed while some of them still form a cycle of
    their own (two parts holding each other's bound methods): that cycle and
    what hangs off it then wait for a full collection, as above.
    """
    return [name for name in found if name.startswith(("bridge.", "telcodec."))]


@pytest.mark.usefixtures("no_cyclic_gc")
def test_ended_sip_call_is_freed_without_the_cyclic_gc(
    cyclic_garbage: Callable[[], list[str]],
) -> None:
    async def body() -> None:
        sip = free_port(socket.SOCK_DGRAM)
        async with stack(GREETING_ROUTE, sip=str(sip)) as s:
            s.daemon.gc_policy.freeze_every_s = 0  # no thaw (a full collection) mid-test
            leg = next(leg for leg in s.daemon.legs if leg.name == "sip")
            calls: dict[str, object] = leg.calls  # type: ignore[attr-defined]
            opts = CallerOptions(target=f"sip:demo@127.0.0.1:{sip}", duration_s=1.0)
            cyclic_garbage()  # what start-up left
            caller = asyncio.ensure_future(place_call(opts))
            assert await _until(lambda: bool(calls), 10 * FACTOR)
            (call,) = calls.values()
            runner = call.runner  # type: ignore[attr-defined]
            assert runner is not None
            watch = _Watch()
            watch.add("leg call", call)
            watch.add("runner", runner)
            watch.add("bridge", runner.bridge)
            del call, runner
            result = await caller
            assert result.recording is not None
            assert await _until(lambda: not calls, 5 * FACTOR)
            freed = await _until(lambda: not watch.alive(), 2 * FACTOR)
            alive = watch.alive()
            assert freed, f"still alive after the call ended, with the cyclic GC off: {alive}"
            garbage = _ours(cyclic_garbage())
            assert not garbage, f"left in reference cycles: {garbage}"

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


@pytest.mark.usefixtures("no_cyclic_gc")
def test_ended_media_stream_call_is_freed_without_the_cyclic_gc(
    cyclic_garbage: Callable[[], list[str]],
) -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as s:
            s.daemon.gc_policy.freeze_every_s = 0  # no thaw (a full collection) mid-test
            leg = next(leg for leg in s.daemon.legs if leg.name == "media_streams")
            calls: dict[str, object] = leg.calls  # type: ignore[attr-defined]
            cyclic_garbage()  # what start-up left
            async with TwilioCall(s.ms_port):
                assert await _until(lambda: bool(calls), 10 * FACTOR)
                (runner,) = calls.values()
                watch = _Watch()
                watch.add("runner", runner)
                watch.add("leg adapter", runner.leg)  # type: ignore[attr-defined]
                watch.add("bridge", runner.bridge)  # type: ignore[attr-defined]
                del runner
                await asyncio.sleep(0.3)
            assert await _until(lambda: not calls, 5 * FACTOR)
            freed = await _until(lambda: not watch.alive(), 2 * FACTOR)
            alive = watch.alive()
            assert freed, f"still alive after the call ended, with the cyclic GC off: {alive}"
            garbage = _ours(cyclic_garbage())
            assert not garbage, f"left in reference cycles: {garbage}"

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

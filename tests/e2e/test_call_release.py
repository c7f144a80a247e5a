"""An ended call is freed by reference counting, not left to the cyclic GC.

A call's objects (the leg adapter, its ``CallRunner``, the ``CallBridge`` with
its playout queue, jitter buffer, echo arrays, VAD ...) are tens of KB. If
they form a reference cycle, every ended call waits for a full (generation 2)
collection: with the daemon's GC policy (``bridge/io/gcpolicy.py``) that is
the next thaw (with calls up, only once the daemon's own check below has found
such a call, and then up to ``gc_thaw_s``, 600 s, later), and without it
a pass that at a few hundred thousand live objects runs rarely. Either way
ended calls pile up (live heap growing ~200 B per completed call between
passes in ``bench/bench_memory.py``) and pymalloc keeps the arenas they
filled. So the first two tests run with the collector and the policy off and
check that the call is gone once it has ended. The last two check the
daemon's own check at run time (``ReleaseWatch``): a call caught in a cycle is
found, and is the evidence that brings a thaw with calls up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Callable

import pytest
import structlog.testing

from bridge.io.caller import CallerOptions, place_call
from bridge.io.callrun import CallRunner
from bridge.io.gcpolicy import SMALL_FIND, Canary

from .harness import FACTOR, Stack, TwilioCall, stack

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
        async with stack(GREETING_ROUTE) as s:
            sip = s.sip_port
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


@contextlib.asynccontextmanager
async def _one_of_two_calls_leaked(
    s: Stack, hold: list[object] | None = None
) -> AsyncIterator[tuple[str, weakref.ref[Canary]]]:
    """Two media-stream calls; the second's runner is caught in a reference cycle when it
    ends (and, with ``hold``, also held there). The first stays up for the block: calls
    are up all along, so only evidence brings a thaw. Yields the leaked call's id and a
    weak reference to its canary."""
    leg = next(leg for leg in s.daemon.legs if leg.name == "media_streams")
    calls: dict[str, CallRunner] = leg.calls  # type: ignore[attr-defined]
    async with TwilioCall(s.ms_port):
        assert await _until(lambda: len(calls) == 1, 10 * FACTOR)
        (first,) = calls
        async with TwilioCall(s.ms_port):
            assert await _until(lambda: len(calls) == 2, 10 * FACTOR)
            (runner,) = [r for call_id, r in calls.items() if call_id != first]
            trap: list[object] = [runner]
            trap.append(trap)  # garbage once dropped, but a cycle: only a collection frees it
            if hold is not None:
                hold.append(runner)
            leaked = (runner.call_id, weakref.ref(runner.canary))
            del trap, runner
            await asyncio.sleep(0.3)
        assert await _until(lambda: len(calls) == 1, 5 * FACTOR)
        yield leaked


@pytest.mark.usefixtures("no_cyclic_gc")
def test_an_ended_call_left_in_a_cycle_is_found_and_a_busy_thaw_frees_it() -> None:
    """The daemon's own check (``ReleaseWatch``): a call still alive after the grace is
    logged and counted, and is evidence for a thaw with calls up; the thaw frees it."""

    async def body() -> None:
        async with stack(GREETING_ROUTE) as s:
            s.daemon.release_watch.grace_s = 0.5
            s.daemon.gc_policy.thaw_every_s = 1.0
            with structlog.testing.capture_logs() as logs:
                async with _one_of_two_calls_leaked(s) as (call_id, canary):
                    assert await _until(lambda: canary() is None, 10 * FACTOR)
            not_released = [e for e in logs if e["event"] == "call.not_released"]
            assert [e["call_id"] for e in not_released] == [call_id]
            assert s.daemon.metrics.calls_unreleased_total._value.get() == 1
            (thaw,) = [e for e in logs if e["event"] == "gc.thaw" and e.get("calls_freed")]
            assert thaw["calls_freed"] == [call_id]
            assert thaw["calls"] == 1 and thaw["evidence"] is True
            assert not [e for e in logs if e["event"] == "call.held"]

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


@pytest.mark.usefixtures("no_cyclic_gc")
def test_an_ended_call_still_held_is_named_after_the_thaw_that_could_not_free_it() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as s:
            s.daemon.release_watch.grace_s = 0.5
            s.daemon.gc_policy.thaw_every_s = 1.0
            hold: list[object] = []
            with structlog.testing.capture_logs() as logs:
                async with _one_of_two_calls_leaked(s, hold) as (call_id, canary):
                    held = lambda: [e for e in logs if e["event"] == "call.held"]  # noqa: E731
                    assert await _until(lambda: bool(held()), 10 * FACTOR)
            assert canary() is not None  # held: no collection frees it
            assert [e["call_id"] for e in held()] == [call_id]
            thaws = [e for e in logs if e["event"] == "gc.thaw" and e["calls"] == 1]
            assert thaws and all(not e.get("calls_freed") for e in thaws)
            hold.clear()

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


@pytest.mark.usefixtures("no_cyclic_gc")
def test_with_calls_up_and_no_evidence_the_daemon_makes_no_full_collection() -> None:
    """The other side of the evidence: calls that leave no cycles bring no busy thaw, even
    with ``gc_thaw_s`` short, and what start-up's own collection found (here thousands of
    objects in cycles left before the daemon started) is not taken for the calls'."""

    async def body() -> None:
        for _ in range(SMALL_FIND):
            node: list[object] = []
            node.append(node)
        del node
        async with stack(GREETING_ROUTE) as s:
            assert s.daemon.young_finds.found < SMALL_FIND
            s.daemon.gc_policy.thaw_every_s = 0.5
            with structlog.testing.capture_logs() as logs:
                async with TwilioCall(s.ms_port):
                    await asyncio.sleep(2.0 * FACTOR)  # long enough for several busy thaws
            busy = [e for e in logs if e["event"] == "gc.thaw" and e["calls"] > 0]
            assert busy == []
            assert not [e for e in logs if e["event"] == "call.not_released"]

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))

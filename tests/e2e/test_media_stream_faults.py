"""Network faults on the Twilio media-stream leg, through a seeded TCP fault relay.

The carrier (the emulator over a real WebSocket) reaches the in-process daemon
through ``bench/loadgen/tcp_faultrelay.py``, which delivers its bytes in
small, delayed pieces, stops reading what the daemon sends (a stalled
carrier), or resets the connection mid-turn. Beside it a second call goes
straight to the daemon. What must hold is an outcome, never a timing: the
faulty call either goes on as normal (fragmented, delayed bytes) or ends
cleanly (cut, stalled: one ``call.ended`` with the reason, its turn reported
once), the other call is untouched, and nothing of the faulty call is left
(no call, stream, provider turn, task or call object). Waits are for events,
bounded by timeouts scaled by CALLBRIDGE_TEST_TIME_FACTOR.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable
from typing import Any

import pytest
import websockets

import bridge.io.legs.streams as streams_leg
from bench.loadgen.tcp_faultrelay import TcpFaultRelay, TcpFaults

from .harness import FACTOR, AppServer, Stack, TwilioCall, app_route, speech_mulaw, stack
from .test_call_release import _Watch

LONG = " ".join(f"word{i}" for i in range(120)) + "."
SHORT = "One two three four five six seven eight."


class Calls(AppServer):
    """The application: each call's events apart (by the ``who`` custom parameter of its
    start); says ``LONG`` when a call starts and after every key press (``SHORT`` on the
    call named ``other``, so that turn plays to its end)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_call: dict[str, list[dict[str, Any]]] = {}

    async def _handler(self, ws: websockets.ServerConnection) -> None:
        self.conns.append(ws)
        who = "?"
        turns = 0
        async for msg in ws:
            event: dict[str, Any] = json.loads(msg)
            if event.get("type") == "call.started":
                who = str(event.get("custom_parameters", {}).get("who", "?"))
            self.by_call.setdefault(who, []).append(event)
            self.events.append(event)
            self.changed.set()
            if event.get("type") in ("call.started", "dtmf"):
                turns += 1
                text = SHORT if who == "other" and turns > 1 else LONG
                say = {"type": "say", "turn_id": f"{who}-t{turns}", "text": text, "final": True}
                await ws.send(json.dumps(say))

    def of_call(self, who: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.by_call.get(who, []) if e.get("type") == kind]


async def until(pred: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    async def loop() -> None:
        while not pred():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(loop(), timeout_s * FACTOR)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def frames(call: TwilioCall) -> int:
    return len(call.carrier.received_media())


def turns_reported(app: Calls, who: str) -> dict[str, int]:
    """How many reports (finished or interrupted) each of the call's turns got."""
    out: dict[str, int] = {}
    for kind in ("turn.finished", "turn.interrupted"):
        for e in app.of_call(who, kind):
            out[str(e["turn_id"])] = out.get(str(e["turn_id"]), 0) + 1
    return out


def watch_calls(st: Stack, count: int) -> _Watch:
    """The leg's ``count`` live calls, watched without being kept alive."""
    leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
    calls: dict[str, object] = leg.calls  # type: ignore[attr-defined]
    assert len(calls) == count, calls
    watch = _Watch()
    for call_id, runner in calls.items():
        watch.add(call_id, runner)
    return watch


def left_alive(watch: _Watch) -> list[str]:
    """What is still held by something (a table of calls, a timer...) after a full
    collection: a cycle alone would not keep it."""
    gc.collect()
    return watch.alive()


def new_tasks(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks now running that were not ``before`` (but the one asking)."""
    return asyncio.all_tasks() - before - {asyncio.current_task()}  # type: ignore[operator]


async def nothing_left(st: Stack, tasks_before: set[asyncio.Task[Any]], watch: _Watch) -> None:
    """No call, stream, provider turn, task or call object of the ended calls is left."""
    leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
    calls: dict[str, object] = leg.calls  # type: ignore[attr-defined]
    await until(lambda: not calls and leg.streams_open == 0, "the calls and streams to go")  # type: ignore[attr-defined]
    assert st.daemon.runtime is not None
    pool = st.daemon.runtime.pools["main"]
    await until(lambda: all(not c.sinks for c in pool.connections), "the provider turns to go")
    await until(lambda: not new_tasks(tasks_before), "the tasks to end")
    await until(lambda: not left_alive(watch), "the call objects to be freed")


@pytest.mark.parametrize("seed", [1, 33])
def test_fragmented_and_delayed_bytes_keep_the_call_its_digits_and_barge_in(seed: int) -> None:
    """Every byte both ways arrives in pieces of 1-7 bytes, up to 30 ms late (in order):
    WebSocket frames split anywhere and glued together. The call goes on as normal."""

    async def body() -> None:
        async with Calls() as app, stack(app_route(app.url), sip="0") as st:
            st.daemon.gc_policy.freeze_every_s = 0  # frozen objects are out of _Watch's sight
            tasks_before = asyncio.all_tasks()
            faults = TcpFaults(fragment_max_bytes=7, jitter_s=0.030)
            relay = TcpFaultRelay(("127.0.0.1", st.ms_port), faults, seed)
            await relay.start()
            try:
                async with TwilioCall(relay.front[1], {"who": "faulty"}) as call:
                    await until(lambda: app.of_call("faulty", "call.started"), "the call")
                    watch = watch_calls(st, 1)
                    call.press_at(call.now() - call.t0 + 1.0, "1")
                    await until(lambda: app.of_call("faulty", "dtmf"), "the first digit")
                    call.press_at(call.now() - call.t0 + 1.0, "2")
                    await until(lambda: len(app.of_call("faulty", "dtmf")) == 2, "the second")
                    call.speak_at(call.now() - call.t0 + 0.5, speech_mulaw(1.5))
                    await until(
                        lambda: any(
                            e["reason"] == "speech"
                            for e in app.of_call("faulty", "turn.interrupted")
                        ),
                        "the speech barge-in",
                    )
                await until(lambda: app.of_call("faulty", "call.ended"), "the call's end")
                await nothing_left(st, tasks_before, watch)
            finally:
                relay.close()
            assert [e["digit"] for e in app.of_call("faulty", "dtmf")] == ["1", "2"]
            reasons = [e["reason"] for e in app.of_call("faulty", "turn.interrupted")]
            assert reasons == ["dtmf", "dtmf", "speech"], reasons
            assert set(turns_reported(app, "faulty").values()) == {1}
            assert [e["reason"] for e in app.of_call("faulty", "call.ended")] == ["stop"]
            assert call.carrier.errors() == []
            assert set(call.carrier.media_sizes()) == {160}
            assert call.carrier.marks_echoed()
            # the relay did split the bytes, both ways
            up, down = relay.up_counters(), relay.down_counters()
            assert up.pieces > 2 * up.chunks and down.pieces > 2 * down.chunks, (up, down)

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))


@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_a_carrier_cut_or_stalled_mid_turn_ends_its_call_alone(
    fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-turn, the faulty call's connection is reset (``cut``), or its carrier stops
    reading what the daemon sends while still sending its audio (``stall``). The call
    ends once, with the reason; the call beside it plays its turn to the end."""
    # A stall shows once the kernel's buffers are full: small ones here, so the test
    # does not wait for 64 KiB of media; the stall bound scaled like every wait
    monkeypatch.setattr(streams_leg, "CARRIER_SNDBUF_BYTES", 8192)
    monkeypatch.setattr(streams_leg, "CARRIER_STALL_S", 2.0 * FACTOR)
    reason = {"cut": "connection_lost", "stall": "carrier_stalled"}[fault]

    async def body() -> None:
        async with Calls() as app, stack(app_route(app.url), sip="0") as st:
            st.daemon.gc_policy.freeze_every_s = 0  # frozen objects are out of _Watch's sight
            tasks_before = asyncio.all_tasks()
            relay = TcpFaultRelay(("127.0.0.1", st.ms_port), TcpFaults(server_rcvbuf=4096))
            await relay.start()
            try:
                async with (
                    TwilioCall(relay.front[1], {"who": "faulty"}) as faulty,
                    TwilioCall(st.ms_port, {"who": "other"}) as other,
                ):
                    await until(lambda: frames(faulty) >= 25, "the faulty call's turn")
                    await until(lambda: app.of_call("other", "call.started"), "the other call")
                    watch = watch_calls(st, 2)
                    if fault == "cut":
                        relay.cut()
                    else:
                        relay.stall_downstream()
                    await until(lambda: app.of_call("faulty", "call.ended"), "the faulty end")
                    # the other call: its turn went on, and its second one plays to the end
                    other.press_at(other.now() - other.t0 + 0.2, "5")
                    await until(
                        lambda: app.of_call("other", "turn.finished"), "the other call's turn"
                    )
                    assert not app.of_call("other", "call.ended")
                await until(lambda: app.of_call("other", "call.ended"), "the other call's end")
                await nothing_left(st, tasks_before, watch)
            finally:
                relay.close()
            assert [e["reason"] for e in app.of_call("faulty", "call.ended")] == [reason]
            assert turns_reported(app, "faulty") == {"faulty-t1": 1}
            (cut,) = app.of_call("faulty", "turn.interrupted")
            assert cut["reason"] == "call_ended"
            assert [e["reason"] for e in app.of_call("other", "call.ended")] == ["stop"]
            assert [e["turn_id"] for e in app.of_call("other", "turn.finished")] == ["other-t2"]
            assert other.carrier.errors() == []
            assert set(other.carrier.media_sizes()) == {160}
            if fault == "stall":
                assert faulty.closed.is_set()  # the daemon let go of the stalled carrier
                total = st.daemon.metrics.calls_total
                assert total.labels("twilio", "*", "carrier_stalled")._value.get() == 1

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))

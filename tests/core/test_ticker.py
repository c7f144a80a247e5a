"""The process-wide ticker: paces every stream from one timer, and knows when it runs late."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable

import pytest

from bridge.io.ticker import ARM_BEFORE_S, MAX_PASSES, MediaTicker
from bridge.media.clock import ClockConfig, Ticker, TickerConfig

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def test_frames_are_ticked_in_order_and_a_stalled_loop_reads_as_overloaded() -> None:
    async def main() -> None:
        ticker = MediaTicker(asyncio.get_running_loop())
        frames: dict[str, list[int]] = {"a": [], "b": []}
        clocks = {
            key: ticker.add(key, lambda n, now, k=key: frames[k].append(n), lambda e: None)
            for key in frames
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * FACTOR
        while len(frames["b"]) < 10 and loop.time() < deadline:  # both ticking: 200 ms
            await asyncio.sleep(0.02)
        # in order from frame 0, each once (a late wake-up may skip ahead, never repeat:
        # a first wake-up a period late on a loaded host skips frame 0 itself)
        assert frames["a"][0] == 0 or clocks["a"].stats().late_wakeups > 0
        assert frames["a"] == sorted(set(frames["a"]))
        assert len(frames["b"]) >= 10 and frames["b"] == sorted(set(frames["b"]))
        # healthy: late by what a busy host costs, far from the 1 s stall below (the lag
        # of an idle host is what bench_pacing measures)
        assert not ticker.overloaded(0.5)
        for _ in range(30):  # a saturated core: every wake-up at least 25 ms late
            time.sleep(0.025)
            await asyncio.sleep(0)
        assert ticker.lag_s > 0.008 and ticker.overloaded(0.008)
        assert not ticker.overloaded(0.0)  # 0 switches the check off
        ticker.remove("a")
        ticker.remove("b")
        assert not ticker.overloaded(0.008)  # no calls: nothing to protect
        ticker.close()

    asyncio.run(main())


class _Handle:
    def __init__(self, loop: _FakeLoop, when: float, callback: Callable[[], None]) -> None:
        self.loop, self.when, self.callback = loop, when, callback

    def cancel(self) -> None:
        self.loop.handles.remove(self)


class _FakeLoop:
    """Records what the ticker arms; the test fires it at the time it chooses."""

    def __init__(self) -> None:
        self.handles: list[_Handle] = []

    def time(self) -> float:
        raise AssertionError("the ticker keeps time on its own clock, not loop.time()")

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(self, when, callback)
        self.handles.append(handle)
        return handle

    def call_soon(self, callback: Callable[[], None]) -> _Handle:
        return self.call_at(-math.inf, callback)

    def fire(self) -> float:
        """Run the one armed handle; returns the time it was armed for."""
        (handle,) = self.handles
        self.handles.clear()
        handle.callback()
        return handle.when


def _ticker(now: list[float]) -> tuple[MediaTicker, _FakeLoop]:
    loop = _FakeLoop()
    return MediaTicker(loop, clock=lambda: now[0]), loop  # type: ignore[arg-type]


def test_the_timer_is_armed_half_a_millisecond_before_the_frame_deadline() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: list[tuple[int, float]] = []
    clock = ticker.add("a", lambda n, t: sent.append((n, t)), lambda e: None)
    # slot phases sit mid-millisecond, so a 1 ms timer window [T, T + 1) centres on them
    assert clock.deadline(0) == pytest.approx(100.0005)
    for n in range(3):
        armed = loop.handles[0].when
        assert armed == pytest.approx(clock.deadline(n) - ARM_BEFORE_S)
        now[0] = clock.deadline(n) - 0.0009  # a 1 ms timer may fire up to 1 ms early
        loop.fire()
        assert sent[-1] == (n, now[0])
    assert clock.stats().late_wakeups == 0


def test_a_talkspurt_is_rephased_when_its_first_frame_leaves() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: list[tuple[int, float]] = []
    clock = ticker.add("a", lambda n, t: sent.append((n, t)), lambda e: None)
    now[0] = clock.deadline(0)
    loop.fire()
    now[0] = 100.0063  # the turn's first audio is ready between two slots
    ticker.start_talkspurt("a")
    ticker.start_talkspurt("a")  # twice in one pass: still one wake-up
    assert [h.when for h in loop.handles] == [-math.inf]  # the loop's next pass
    now[0] = 100.0081  # that pass comes 1.8 ms later (other callbacks ran first)
    loop.fire()
    assert sent[-1] == (1, 100.0081)
    # the grid is anchored on the packet that left, not on the request
    assert clock.deadline(2) == pytest.approx(100.0281)
    assert loop.handles[0].when == pytest.approx(100.0281 - ARM_BEFORE_S)


def test_a_talkspurt_in_a_busy_millisecond_leaves_with_the_next_one_on_its_phase() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: dict[str, list[tuple[int, float]]] = {}
    for i in range(33):  # slots 0-12 hold 2 streams, 13-19 hold 1
        sent[f"s{i}"] = []
        ticker.add(f"s{i}", lambda n, t, k=f"s{i}": sent[k].append((n, t)), lambda e: None)
    clock = ticker.streams["s16"].clock  # slot 16: frame 0 due at 100.0165
    now[0] = 100.0122  # a frame due now joins slot 12's millisecond (2 streams), 13's holds 1
    ticker.start_talkspurt("s16")
    loop.fire()  # the loop's next pass: the other frames due by now leave, s16's is held
    assert sent["s16"] == [] and sent["s11"] == [(0, 100.0122)]
    assert clock.deadline(0) == pytest.approx(100.0135)  # on the slot phase of the next ms
    timer = [h.when for h in loop.handles]
    now[0] = 100.0124  # more of the turn's audio while the first frame is held: no new pass
    ticker.start_talkspurt("s16")
    assert [h.when for h in loop.handles] == timer
    while not sent["s16"]:
        now[0] = loop.handles[0].when + 0.0003
        loop.fire()
    assert sent["s16"] == [(0, pytest.approx(100.0133))]  # with slot 13's timer
    assert clock.deadline(1) == pytest.approx(100.0335)  # the grid: anchored there
    now[0] = 100.0251  # a later turn asks again: the loop's next pass, as before
    ticker.start_talkspurt("s16")
    assert -math.inf in [h.when for h in loop.handles]


def test_a_preemption_point_runs_the_wake_up_only_once_its_timer_would_have_fired() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: list[tuple[int, float]] = []
    clock = ticker.add("a", lambda n, t: sent.append((n, t)), lambda e: None)
    armed = loop.handles[0].when
    now[0] = armed - 0.0001  # a reader between two messages, just before the timer
    ticker.run_if_due()
    assert sent == [] and [h.when for h in loop.handles] == [armed]
    now[0] = armed + 0.0002  # its timer is due, but the loop is busy with that reader
    ticker.run_if_due()
    assert sent == [(0, now[0])]
    # the timer that would have run it is gone; the next frame's is armed
    assert [h.when for h in loop.handles] == [pytest.approx(clock.deadline(1) - ARM_BEFORE_S)]
    ticker.run_if_due()  # again at once: nothing due, nothing sent twice
    assert sent == [(0, now[0])]
    now[0] = loop.handles[0].when + 0.0003
    loop.fire()  # the next wake-up comes from the loop's timer as before
    assert sent[-1] == (1, now[0]) and clock.stats().late_wakeups == 0


def test_a_preemption_point_sends_a_talkspurt_start_at_once() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: list[tuple[int, float]] = []
    ticker.add("a", lambda n, t: sent.append((n, t)), lambda e: None)
    now[0] = loop.handles[0].when + 0.0003
    loop.fire()
    now[0] = 100.0063
    ticker.start_talkspurt("a")  # asks for the loop's next pass
    ticker.run_if_due()  # a preemption point comes first: the frame leaves there
    assert sent[-1] == (1, 100.0063) and loop.handles[0].when > 100.02


def test_streams_in_the_same_millisecond_share_one_wake_up() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    sent: list[str] = []
    for i in range(60):  # 3 streams per slot of 1 ms
        ticker.add(f"s{i}", lambda n, t, k=f"s{i}": sent.append(k), lambda e: None)
    wakeups = 0
    while len(sent) < 60 * 5:
        now[0] = loop.handles[0].when + 0.0003
        loop.fire()
        wakeups += 1
    assert wakeups == 20 * 5 and len(sent) == 300


def test_a_failing_stream_ends_alone() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    errors: list[BaseException] = []
    good: list[int] = []

    def bad(n: int, t: float) -> None:
        raise RuntimeError("boom")

    ticker.add("bad", bad, errors.append)
    ticker.add("good", lambda n, t: good.append(n), errors.append)
    for _ in range(6):
        now[0] = loop.handles[0].when + 0.0003
        loop.fire()
    assert len(errors) == 1 and "bad" not in ticker.streams
    assert good == [0, 1, 2, 3, 4]


class _Sock:
    """Stands in for a UDP socket on the ticker's outbox."""

    def __init__(self, log: list[str], name: str, refuse: bool = False) -> None:
        self.log, self.name, self.refuse = log, name, refuse

    def sendto(self, data: bytes, addr: object) -> int:
        if self.refuse:
            raise BlockingIOError("send buffer full")
        self.log.append(f"send {self.name} {data.decode()}")
        return len(data)


def _two_phase_stream(
    ticker: MediaTicker, log: list[str], key: str, sock: _Sock, fail_inbound: bool = False
) -> Callable[[int, float], Callable[[float], Callable[[float], None]]]:
    def process(now: float) -> None:
        if fail_inbound:
            raise RuntimeError("inbound bug")
        log.append(f"inbound {key}")

    def inbound(now: float) -> Callable[[float], None]:
        log.append(f"read {key}")
        return process

    def on_frame(n: int, now: float) -> Callable[[float], Callable[[float], None]]:
        log.append(f"build {key}")
        ticker.outbox.append((sock, f"{key}{n}".encode(), ("127.0.0.1", 9)))  # type: ignore[arg-type]
        return inbound

    return on_frame


def test_a_wake_up_sends_every_frame_then_reads_every_socket_then_does_the_inbound_work() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    log: list[str] = []
    ticker.ticker = Ticker(TickerConfig(ClockConfig(), slots=1, epoch_s=0.0005))  # one phase
    for key in ("a", "b"):  # both in the first millisecond's bucket
        ticker.add(key, _two_phase_stream(ticker, log, key, _Sock(log, key)), lambda e: None)
    now[0] = loop.handles[0].when + 0.0003
    loop.fire()
    order = [log[0][-1], log[1][-1]]  # the bucket's order
    assert sorted(order) == ["a", "b"]
    assert log == [f"build {k}" for k in order] + [f"send {k} {k}0" for k in order] + [
        f"read {k}" for k in order
    ] + [f"inbound {k}" for k in order]
    assert ticker.outbox == []


def test_work_a_frame_callback_queues_runs_after_every_frame_of_the_wake_up_has_left() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    log: list[str] = []
    ticker.ticker = Ticker(TickerConfig(ClockConfig(), slots=1, epoch_s=0.0005))  # one phase

    def feeding(key: str) -> Callable[[int, float], None]:
        sock = _Sock(log, key)

        def on_frame(n: int, t: float) -> None:
            log.append(f"build {key}")
            ticker.outbox.append((sock, f"{key}{n}".encode(), ("127.0.0.1", 9)))  # type: ignore[arg-type]
            ticker.after_send(key, lambda t: log.append(f"feed {key}"))
            ticker.after_send("gone", lambda t: log.append("never"))  # no such stream

        return on_frame

    for key in ("a", "b"):
        ticker.add(key, feeding(key), lambda e: None)
    now[0] = loop.handles[0].when + 0.0003
    loop.fire()
    order = [log[0][-1], log[1][-1]]
    assert log == [f"build {k}" for k in order] + [f"send {k} {k}0" for k in order] + [
        f"feed {k}" for k in order
    ]


def test_a_failing_inbound_phase_ends_its_stream_only_and_a_refused_send_is_counted() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    log: list[str] = []
    errors: list[BaseException] = []
    bad = _two_phase_stream(ticker, log, "bad", _Sock(log, "bad"), fail_inbound=True)
    full = _two_phase_stream(ticker, log, "full", _Sock(log, "full", refuse=True))
    ticker.add("bad", bad, errors.append)
    ticker.add("full", full, errors.append)
    while log.count("inbound full") < 3:  # its frames were refused; it keeps its pace
        now[0] = loop.handles[0].when + 0.0003
        loop.fire()
    assert [str(e) for e in errors] == ["inbound bug"] and "bad" not in ticker.streams
    assert log.count("send bad bad0") == 1 and "build bad" not in log[1:]  # ended after tick 0
    assert ticker.send_errors == 3 and not any(e.startswith("send full") for e in log)


def _slow_stream(
    ticker: MediaTicker, log: list[str], key: str, now: list[float], work_s: float
) -> Callable[[int, float], Callable[[float], Callable[[float], None]]]:
    """A stream whose third phase takes ``work_s`` of the (simulated) clock."""

    def process(t: float) -> None:
        log.append(f"inbound {key}")
        now[0] += work_s
        ticker.run_if_due()  # a preemption point reached from inside a wake-up: no effect

    def inbound(t: float) -> Callable[[float], None]:
        log.append(f"read {key}")
        return process

    def on_frame(n: int, t: float) -> Callable[[float], Callable[[float], None]]:
        log.append(f"build {key}{n} at {round((t - 100.0) * 1e4)}")
        return inbound

    return on_frame


def test_the_next_wake_up_s_frames_leave_before_the_rest_of_this_one_s_inbound_work() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    log: list[str] = []
    for key in ("a", "b", "c"):  # slots 0, 1 and 2: frames due at 0.5, 1.5 and 2.5 ms
        ticker.add(key, _slow_stream(ticker, log, key, now, 0.0012), lambda e: None)
    a = ticker.streams["a"].clock
    now[0] = a.deadline(0) - ARM_BEFORE_S + 0.0002
    loop.fire()
    # a's inbound work ran past b's timer: b's frame left there, then b's inbound work,
    # which ran past c's: c's frame, and its inbound work last
    assert log == [
        "build a0 at 2", "read a", "inbound a",
        "build b0 at 14", "read b", "inbound b",
        "build c0 at 26", "read c", "inbound c",
    ]  # fmt: skip
    assert ticker.preempted == 2
    assert ticker.streams["b"].clock.stats().late_wakeups == 0
    # one return to the loop: the next timer is a's next frame
    assert [h.when for h in loop.handles] == [pytest.approx(a.deadline(1) - ARM_BEFORE_S)]


def test_a_core_that_cannot_keep_up_returns_to_the_loop_after_a_few_wake_ups() -> None:
    now = [100.0]
    ticker, loop = _ticker(now)
    log: list[str] = []
    for i in range(20):  # one stream per slot, each one's inbound work longer than 1 ms
        ticker.add(f"s{i}", _slow_stream(ticker, log, f"s{i}", now, 0.0015), lambda e: None)
    now[0] = loop.handles[0].when + 0.0002
    loop.fire()
    built = [e for e in log if e.startswith("build")]
    assert len({e.split()[-1] for e in built}) == MAX_PASSES  # wake-up instants
    assert ticker.preempted == MAX_PASSES - 1
    # every read it queued was worked on before it returned
    assert log.count(f"inbound {built[-1].split()[1][:-1]}") == 1 and log[-1].startswith("inbound")
    assert len(loop.handles) == 1 and loop.handles[0].when < now[0]  # overdue: the loop runs it
    loop.fire()
    assert len([e for e in log if e.startswith("build")]) > len(built)

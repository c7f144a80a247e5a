"""The provider connection's one timer: re-armed when the deadline comes earlier, not per message.

A flushed turn's reply timeout moves later with every provider message; the
shell used to cancel and re-create its timer after each one. Now the timer
stays armed while the deadline only moves later; when it fires early it finds
nothing due, calls no ``handle_timer`` and re-arms for the real deadline.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from bridge.engine import Action, Event
from bridge.io.provider_ws import Connection
from bridge.providers.pool import Placement


class DeadlineEngine:
    """The engine contract with nothing but a deadline the test moves."""

    max_turns = 1

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.timer_calls: list[float] = []
        self.fired = asyncio.Event()

    def actions_to_send(self) -> list[Action]:
        return []

    def open_turns(self) -> int:
        return 0

    def events_received(self) -> list[Event]:
        return []

    def next_deadline(self) -> float | None:
        return self.deadline

    def handle_timer(self, now: float) -> None:
        assert self.deadline is not None and now >= self.deadline, "called before its deadline"
        self.timer_calls.append(now)
        self.deadline = None
        self.fired.set()


def test_a_deadline_moving_later_keeps_one_timer_and_fires_once_when_due() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        arms: list[float] = []
        real_call_at = loop.call_at

        def counting_call_at(
            when: float, callback: Any, *args: Any, **kwargs: Any
        ) -> asyncio.TimerHandle:
            if callback == conn._on_timer:
                arms.append(when)
            return real_call_at(when, callback, *args, **kwargs)

        loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
        engine = DeadlineEngine()
        conn = Connection(
            SimpleNamespace(placement=Placement(None, 1), arm_idle_close=lambda: None), engine
        )  # type: ignore[arg-type]
        t0 = loop.time()
        for i in range(20):  # a reply timeout pushed later by every message
            engine.deadline = t0 + 0.05 + i * 0.001
            conn.pump()
        assert arms == [t0 + 0.05]
        engine.deadline = t0 + 0.04  # earlier: re-armed at once
        conn.pump()
        assert arms == [t0 + 0.05, t0 + 0.04]
        engine.deadline = t0 + 0.08  # later again: the armed timer fires early, re-arms
        conn.pump()
        await asyncio.wait_for(engine.fired.wait(), 5)
        assert arms == [t0 + 0.05, t0 + 0.04, t0 + 0.08]
        assert len(engine.timer_calls) == 1
        engine.deadline = None  # no deadline: no timer
        conn.pump()
        assert conn.timer is None

    asyncio.run(main())

"""A provider engine that refuses a turn fails that turn (and fails over), not the call."""

from __future__ import annotations

from typing import Any

from bridge.engine import Event, LocalProtocolError
from bridge.providers.base import MULAW_8K, ProviderSettings, TurnFailed, TurnSettings
from bridge.providers.failover import Speaker


def _clock() -> float:
    return 0.0


def _no_timer(at: float, fn: Any) -> Any:
    raise AssertionError("no first-audio deadline is set: no timer")


class _Handle:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send_text(self, text: str) -> None:
        self.log.append(f"text:{text}")

    def end(self) -> None:
        self.log.append("end")

    def cancel(self) -> None:
        self.log.append("cancel")


class _Pool:
    def __init__(self, name: str, refuse: bool) -> None:
        self.name = name
        self.settings = ProviderSettings(name, "kova", "ws://127.0.0.1:9/", voice="v")
        self.refuse = refuse
        self.log: list[str] = []

    def open_turn(
        self, turn_id: str, settings: TurnSettings, sink: Any, *direct_sinks: Any
    ) -> _Handle:
        self.log.append(f"open:{turn_id}")
        if self.refuse:
            raise LocalProtocolError("kova connection has no free context")
        return _Handle(self.log)


def test_a_refused_turn_goes_to_the_next_provider() -> None:
    bad, good = _Pool("bad", refuse=True), _Pool("good", refuse=False)
    events: list[Event] = []
    speaker = Speaker([bad, good], clock=_clock, call_at=_no_timer)  # type: ignore[list-item]
    speaker.speak("greeting", "hello", TurnSettings("v", MULAW_8K), events.append)
    assert bad.log == ["open:greeting"]
    assert good.log == ["open:greeting", "text:hello", "end"]
    assert speaker.failovers == 1
    assert events == []


def test_a_refused_turn_with_no_other_provider_is_a_failed_turn() -> None:
    only = _Pool("only", refuse=True)
    events: list[Event] = []
    speaker = Speaker([only], clock=_clock, call_at=_no_timer)  # type: ignore[list-item]
    speaker.speak("greeting", "hello", TurnSettings("v", MULAW_8K), events.append)
    assert len(events) == 1
    failed = events[0]
    assert isinstance(failed, TurnFailed)
    assert failed.turn_id == "greeting" and failed.kind == "open_refused"

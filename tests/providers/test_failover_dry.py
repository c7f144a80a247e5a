"""``Speaker.watch_dry``: a turn that ran dry is asked of its own connection's handle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.engine import Event
from bridge.providers.base import MULAW_8K, ProviderSettings, TurnSettings
from bridge.providers.failover import Speaker


class _Handle:
    def __init__(self, unread: bool) -> None:
        self.unread = unread
        self.asked: list[Callable[[], None]] = []

    def send_text(self, text: str) -> None:
        pass

    def end(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def watch_dry(self, on_provider: Callable[[], None]) -> bool:
        self.asked.append(on_provider)
        return self.unread


class _Pool:
    prompt_identity: str | None = None

    def __init__(self, unread: bool) -> None:
        self.name = "p"
        self.settings = ProviderSettings("p", "kova", "ws://127.0.0.1:9/", voice="v")
        self.handle = _Handle(unread)

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Any, *direct: Any) -> _Handle:
        return self.handle


def _timer(at: float, fn: Callable[[], None]) -> Any:
    raise AssertionError("no deadline is armed without first-audio timeouts")


def test_a_dry_turn_is_asked_of_its_connection_and_unknown_turns_are_not() -> None:
    events: list[Event] = []
    for unread in (True, False):
        pool = _Pool(unread)
        speaker = Speaker([pool], clock=lambda: 0.0, call_at=_timer)  # type: ignore[list-item]
        speaker.speak("t", "Hello.", TurnSettings("v", MULAW_8K), events.append)
        called: list[str] = []
        assert speaker.watch_dry("t", lambda called=called: called.append("provider")) is unread
        [on_provider] = pool.handle.asked
        on_provider()  # the connection's later verdict reaches the caller's callback
        assert called == ["provider"]
        assert speaker.watch_dry("other", lambda: None) is None
        speaker.cancel("t")
        assert speaker.watch_dry("t", lambda: None) is None
    assert events == []

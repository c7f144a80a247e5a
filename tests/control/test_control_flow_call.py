"""The demo flow driving the real per-call bridge (CallBridge), with a fake provider.

Time is tick ``n`` at ``n * 0.020``; nothing sleeps. The fake provider answers
every opened turn with ``FRAMES_PER_TURN`` frames of mu-law audio and
``TurnDone``; the call's events go back to the flow, the flow's commands to
the call, as the shell does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.commands import (
    CallEvent,
    DtmfHeard,
    Say,
    TurnFinished,
    TurnInterrupted,
)
from bridge.config import load_config
from bridge.control.flow import FlowRunner
from bridge.engine import Action
from bridge.media.call import CallBridge
from bridge.media.call_types import EndTurn, HangupLeg, LegProfile, OpenTurn, StartAgent
from bridge.providers.base import MULAW_8K, AudioReceived, TurnDone

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_config(ROOT / "config" / "callbridge.toml")
SIP = LegProfile(kind="sip", codec="mulaw", sample_rate_hz=8000, heard_from="frames")
FRAMES_PER_TURN = 10
BOT_FRAME = bytes(range(0x20, 0x20 + 160))  # not silence


class Loop:
    """Flow + call + fake provider, pumped like the shell pumps them."""

    def __init__(self) -> None:
        self.call = CallBridge("call-1", SIP, None, 0.0)
        self.flow = FlowRunner(DEMO.flow("demo"), DEMO.routes[0].greeting, 0.0)
        self.n = 0
        self.texts: dict[str, str] = {}
        self.actions: list[Action] = []
        self.events: list[CallEvent] = []
        self.said_at: list[tuple[float, str]] = []
        self.finished_at: list[tuple[float, str]] = []
        self.flow.start(0.0)
        self.pump()

    @property
    def now(self) -> float:
        return round(self.n * 0.020, 9)

    def pump(self) -> None:
        for _ in range(20):
            commands = self.flow.commands_to_send()
            for command in commands:
                if isinstance(command, Say):
                    self.texts[command.turn_id] = command.text
                    self.said_at.append((self.now, command.text))
                self.call.execute(command, self.now)
            actions = self.call.actions_to_send()
            events = self.call.events_received()
            self.actions += actions
            self.events += events
            for action in actions:
                if isinstance(action, EndTurn):
                    audio = BOT_FRAME * FRAMES_PER_TURN
                    self.call.provider_event(
                        AudioReceived(action.turn_id, audio, MULAW_8K), self.now
                    )
                    self.call.provider_event(TurnDone(action.turn_id), self.now)
            for event in events:
                if isinstance(event, TurnFinished):
                    self.finished_at.append((self.now, self.texts[event.turn_id]))
                self.flow.handle_event(event, self.now)
            if not (commands or actions or events):
                return
        raise AssertionError("the loop did not settle")

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.n += 1
            self.call.tick(self.now)
            deadline = self.flow.next_deadline()
            if deadline is not None and self.now >= deadline:
                self.flow.handle_timer(self.now)
            self.pump()

    def dtmf(self, digit: str) -> None:
        self.call.caller_dtmf(digit, self.now)
        self.pump()

    def spoken(self) -> list[str]:
        """Texts of the turns the call reported finished, in order."""
        return [self.texts[e.turn_id] for e in self.events if isinstance(e, TurnFinished)]


def test_greeting_menu_1_about_menu_9_goodbye_hangup_through_the_call() -> None:
    loop = Loop()
    loop.run(2 * FRAMES_PER_TURN + 2)  # greeting and menu played
    assert loop.spoken() == [DEMO.routes[0].greeting, DEMO.flow("demo").step("menu").say]
    loop.run(10)
    loop.dtmf("1")
    loop.run(FRAMES_PER_TURN + 2)  # about played, menu queued and played
    loop.run(FRAMES_PER_TURN + 2)
    loop.dtmf("9")
    loop.run(FRAMES_PER_TURN + 2)
    assert loop.spoken()[2:] == [
        DEMO.flow("demo").step("about").say,
        DEMO.flow("demo").step("menu").say,
        "Thank you for calling. Goodbye.",
    ]
    assert HangupLeg("flow_hangup") in loop.actions
    assert loop.flow.done


def test_dtmf_barges_in_on_the_menu_and_counts() -> None:
    loop = Loop()
    loop.run(FRAMES_PER_TURN + 3)  # greeting done, menu sounding
    loop.dtmf("2")
    cut = [e for e in loop.events if isinstance(e, TurnInterrupted)]
    assert [loop.texts[e.turn_id] for e in cut] == [DEMO.flow("demo").step("menu").say]
    assert cut[0].reason == "dtmf" and 0 < cut[0].heard_ms < FRAMES_PER_TURN * 20
    assert DtmfHeard("2") in loop.events
    loop.run(FRAMES_PER_TURN + 2)
    assert loop.spoken()[-1] == "Connecting you to the voice agent."
    assert StartAgent("agent") in loop.actions
    opened = [a.turn_id for a in loop.actions if isinstance(a, OpenTurn)]
    assert len(opened) == len(set(opened)) == 3


def test_gather_timeout_replays_the_menu_through_the_call() -> None:
    loop = Loop()
    loop.run(2 * FRAMES_PER_TURN + 2)
    loop.run(int(6.0 / 0.020) + 2)  # the 6 s gather timeout
    loop.run(FRAMES_PER_TURN + 2)
    menu = DEMO.flow("demo").step("menu").say
    assert loop.spoken()[1:] == [menu, menu]
    (first_end_s, _), (second_end_s, _) = [f for f in loop.finished_at if f[1] == menu]
    (_, _), (again_s, _) = [s for s in loop.said_at if s[1] == menu]
    assert again_s - first_end_s == pytest.approx(6.0, abs=0.021)
    assert second_end_s > again_s

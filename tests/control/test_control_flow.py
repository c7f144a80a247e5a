"""FlowRunner: the demo flow of config/callbridge.toml walked through with literal times."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.commands import (
    CallEnded,
    Command,
    DtmfHeard,
    HandOver,
    Hangup,
    Say,
    SpeechStarted,
    Transfer,
    TurnBegan,
    TurnFinished,
    TurnInterrupted,
)
from bridge.config import FlowConfig, FlowStep, load_config, parse_config
from bridge.control.flow import (
    DigitsGathered,
    FlowEnded,
    FlowRunner,
    StepEntered,
    fallback_runner,
)
from bridge.engine import LocalProtocolError

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_config(ROOT / "config" / "callbridge.toml")
ROUTE = DEMO.routes[0]
FLOW = DEMO.flow("demo")
GREETING = "Welcome to callbridge, the open source telephony bridge."
MENU = FLOW.step("menu").say


def says(commands: list[Command]) -> list[Say]:
    return [c for c in commands if isinstance(c, Say)]


def finished(say: Say) -> TurnFinished:
    return TurnFinished(say.turn_id, heard_ms=1000, heard_text=say.text)


def interrupted(say: Say, reason: str = "dtmf") -> TurnInterrupted:
    return TurnInterrupted(say.turn_id, heard_ms=300, heard_text="", reason=reason)


def started() -> tuple[FlowRunner, Say, Say]:
    """A demo runner started at t=0: the greeting and the menu prompt are queued."""
    runner = FlowRunner(FLOW, ROUTE.greeting, 0.0)
    runner.start(0.0)
    greeting, menu = says(runner.commands_to_send())
    return runner, greeting, menu


def test_demo_route_is_what_these_tests_walk() -> None:
    assert ROUTE.flow == "demo"
    assert ROUTE.greeting == GREETING
    assert FLOW.start == "menu"


def test_start_says_greeting_then_start_step() -> None:
    runner, greeting, menu = started()
    assert greeting.text == GREETING and menu.text == MENU
    assert greeting.turn_id != menu.turn_id
    assert menu.interruptible and menu.final and menu.cacheable and not menu.replace
    assert runner.next_deadline() is None  # the gather waits for the prompt
    assert runner.events_received() == [StepEntered("menu", 0.0)]
    with pytest.raises(LocalProtocolError):
        runner.start(0.0)


def test_menu_1_about_menu_9_goodbye_hangup() -> None:
    runner, greeting, menu = started()
    runner.handle_event(TurnBegan(greeting.turn_id), 0.1)
    runner.handle_event(finished(greeting), 3.0)
    assert runner.commands_to_send() == []
    runner.handle_event(finished(menu), 9.0)
    assert runner.next_deadline() == 15.0  # timeout_s = 6 from the end of the prompt
    runner.handle_event(DtmfHeard("1"), 10.0)
    (about,) = says(runner.commands_to_send())
    assert about.text == FLOW.step("about").say
    assert runner.next_deadline() is None
    assert runner.step == "about"
    runner.handle_event(finished(about), 17.0)
    (menu2,) = says(runner.commands_to_send())
    assert menu2.text == MENU
    runner.handle_event(finished(menu2), 25.0)
    runner.handle_event(DtmfHeard("9"), 26.0)
    (goodbye,) = says(runner.commands_to_send())
    assert goodbye.text == "Thank you for calling. Goodbye."
    assert not goodbye.interruptible
    assert runner.commands_to_send() == []  # no hangup before the goodbye is heard
    runner.handle_event(finished(goodbye), 28.5)
    assert runner.commands_to_send() == [Hangup("flow_hangup")]
    assert runner.done
    ids = [s.turn_id for s in (greeting, menu, about, menu2, goodbye)]
    assert len(set(ids)) == len(ids)
    events = runner.events_received()
    assert [e.step for e in events if isinstance(e, StepEntered)] == [
        "menu",
        "about",
        "menu",
        "goodbye",
    ]
    assert DigitsGathered("menu", "1", "max_digits", "about") in events
    assert DigitsGathered("menu", "9", "max_digits", "goodbye") in events
    assert events[-1] == FlowEnded("hangup", "goodbye", 28.5)
    # A finished flow ignores everything.
    runner.handle_event(DtmfHeard("1"), 29.0)
    runner.handle_timer(100.0)
    assert runner.commands_to_send() == [] and runner.next_deadline() is None


def test_timeout_repeats_the_menu() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(finished(menu), 9.0)
    runner.handle_timer(14.999)
    assert runner.commands_to_send() == []
    runner.handle_timer(15.0)
    (menu2,) = says(runner.commands_to_send())
    assert menu2.text == MENU and menu2.turn_id != menu.turn_id
    assert DigitsGathered("menu", "", "timeout", "menu") in runner.events_received()
    assert runner.next_deadline() is None
    runner.handle_event(finished(menu2), 22.0)
    assert runner.next_deadline() == 28.0


def test_invalid_digit_says_sorry_then_menu() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(finished(menu), 9.0)
    runner.handle_event(DtmfHeard("7"), 11.0)
    (sorry,) = says(runner.commands_to_send())
    assert sorry.text == "Sorry, that is not an option."
    assert DigitsGathered("menu", "7", "max_digits", "sorry") in runner.events_received()
    runner.handle_event(finished(sorry), 13.0)
    (menu2,) = says(runner.commands_to_send())
    assert menu2.text == MENU


def test_2_hands_over_to_the_voice_agent_after_the_prompt() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(finished(menu), 9.0)
    runner.handle_event(DtmfHeard("2"), 10.0)
    (connecting,) = says(runner.commands_to_send())
    assert connecting.text == "Connecting you to the voice agent."
    runner.handle_event(finished(connecting), 12.0)
    assert runner.commands_to_send() == [HandOver(voice_agent="agent")]
    assert runner.done
    assert runner.events_received()[-1] == FlowEnded("handed_over", "agent", 12.0)


def test_3_transfers_after_a_non_interruptible_prompt() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(finished(menu), 9.0)
    runner.handle_event(DtmfHeard("3"), 10.0)
    (transferring,) = says(runner.commands_to_send())
    assert transferring.text == "Transferring you now." and not transferring.interruptible
    runner.handle_event(finished(transferring), 11.0)
    assert runner.commands_to_send() == [Transfer("sip:operator@127.0.0.1:5070")]
    assert runner.done


def test_a_transfer_step_names_its_trunk() -> None:
    """A step's ``trunk`` goes with its Transfer (the leg puts a tel: target at that
    trunk's host; the config checks the name, ``tests/config``)."""
    step = FlowStep(name="out", transfer="tel:+15551234567", trunk="carrier")
    runner = FlowRunner(FlowConfig("f", "out", (step,)), "", 0.0)
    runner.start(0.0)
    assert runner.commands_to_send() == [Transfer("tel:+15551234567", "carrier")]
    assert runner.done


def test_dtmf_during_the_menu_prompt_is_the_first_digit() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(TurnBegan(menu.turn_id), 3.1)
    # The call reports the key first, then the barge-in it caused.
    runner.handle_event(DtmfHeard("1"), 4.0)
    assert runner.commands_to_send() == []  # resolved when the prompt is reported
    runner.handle_event(interrupted(menu), 4.0)
    (about,) = says(runner.commands_to_send())
    assert about.text == FLOW.step("about").say


def test_dtmf_during_the_greeting_counts_for_the_menu() -> None:
    runner, greeting, menu = started()
    runner.handle_event(DtmfHeard("9"), 1.0)
    # DTMF barge-in cuts the greeting and the queued (interruptible) menu prompt.
    runner.handle_event(interrupted(greeting), 1.0)
    runner.handle_event(TurnInterrupted(menu.turn_id, 0, "", "dtmf"), 1.0)
    (goodbye,) = says(runner.commands_to_send())
    assert goodbye.text == "Thank you for calling. Goodbye."


def test_speech_barge_in_on_the_prompt_starts_the_timeout() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(SpeechStarted(3.5), 3.6)
    runner.handle_event(interrupted(menu, "speech"), 3.6)
    assert runner.next_deadline() == pytest.approx(9.6)
    assert runner.commands_to_send() == []


def test_foreign_turn_reports_are_ignored() -> None:
    runner, greeting, _menu = started()
    runner.handle_event(TurnFinished("someone-else", 0, ""), 1.0)
    runner.handle_event(finished(greeting), 3.0)
    assert runner.next_deadline() is None and runner.commands_to_send() == []


def test_call_ended_stops_the_flow() -> None:
    runner, greeting, menu = started()
    runner.handle_event(finished(greeting), 3.0)
    runner.handle_event(finished(menu), 9.0)
    runner.handle_event(CallEnded("remote_bye"), 10.0)
    assert runner.done and runner.next_deadline() is None
    runner.handle_timer(20.0)
    assert runner.commands_to_send() == []
    assert runner.events_received()[-1] == FlowEnded("call_ended", "menu", 10.0)


# ------------------------------------------------------ a multi-digit gather

PIN_TOML = """
[providers.p]
protocol = "kova"
url = "embedded"

[[routes]]
provider = "p"
flow = "pin"

[flows.pin]
start = "ask"

[flows.pin.steps.ask]
say = "Enter your four digit PIN, then press hash."
gather = { max_digits = 4, timeout_s = 3, terminator = "#" }
branch = { "1234" = "ok", "#" = "help", timeout = "ask", default = "wrong" }

[flows.pin.steps.ok]
say = "Thank you."
hangup = true

[flows.pin.steps.wrong]
say = "That PIN is wrong."
hangup = true

[flows.pin.steps.help]
say = "Help."
next = "ask"

[flows.pin.steps.legal]
say = "This call is recorded."
interruptible = false
gather = { max_digits = 1, timeout_s = 2 }
branch = { "1" = "ok", default = "wrong" }
"""
PIN = parse_config(PIN_TOML).flow("pin")


def pin_runner(start: str = "ask") -> tuple[FlowRunner, Say]:
    flow = FlowConfig(PIN.name, start, PIN.steps)
    runner = FlowRunner(flow, "", 100.0)
    runner.start(100.0)
    (prompt,) = says(runner.commands_to_send())
    return runner, prompt


def test_multi_digit_gather_with_terminator() -> None:
    runner, prompt = pin_runner()
    runner.handle_event(finished(prompt), 104.0)
    assert runner.next_deadline() == 107.0
    for i, digit in enumerate("12"):
        runner.handle_event(DtmfHeard(digit), 105.0 + i)
    assert runner.next_deadline() == 109.0  # re-armed by every digit
    runner.handle_event(DtmfHeard("#"), 106.5)
    (wrong,) = says(runner.commands_to_send())
    assert wrong.text == "That PIN is wrong."
    assert DigitsGathered("ask", "12", "terminator", "wrong") in runner.events_received()


def test_multi_digit_gather_completes_at_max_digits() -> None:
    runner, prompt = pin_runner()
    runner.handle_event(finished(prompt), 104.0)
    for i, digit in enumerate("1234"):
        runner.handle_event(DtmfHeard(digit), 104.5 + i * 0.5)
    (ok,) = says(runner.commands_to_send())
    assert ok.text == "Thank you."
    runner.handle_event(finished(ok), 108.0)
    assert runner.commands_to_send() == [Hangup("flow_hangup")]


def test_digits_during_prompt_then_rest_after() -> None:
    runner, prompt = pin_runner()
    runner.handle_event(DtmfHeard("1"), 101.0)
    runner.handle_event(interrupted(prompt), 101.0)
    assert runner.next_deadline() == 104.0
    for digit in "234":
        runner.handle_event(DtmfHeard(digit), 102.0)
    (ok,) = says(runner.commands_to_send())
    assert ok.text == "Thank you."


def test_timeout_with_partial_digits_resolves_them() -> None:
    runner, prompt = pin_runner()
    runner.handle_event(finished(prompt), 104.0)
    runner.handle_event(DtmfHeard("5"), 105.0)
    runner.handle_timer(108.0)
    (wrong,) = says(runner.commands_to_send())
    assert wrong.text == "That PIN is wrong."
    assert DigitsGathered("ask", "5", "timeout", "wrong") in runner.events_received()


def test_terminator_alone_looks_up_its_own_key() -> None:
    runner, prompt = pin_runner()
    runner.handle_event(finished(prompt), 104.0)
    runner.handle_event(DtmfHeard("#"), 104.2)
    (help_,) = says(runner.commands_to_send())
    assert help_.text == "Help."


def test_keys_during_a_non_interruptible_prompt_do_not_count() -> None:
    runner, prompt = pin_runner("legal")
    assert not prompt.interruptible
    runner.handle_event(DtmfHeard("1"), 101.0)  # no barge-in: the prompt plays on
    runner.handle_event(finished(prompt), 103.0)
    assert runner.commands_to_send() == []
    assert runner.next_deadline() == 105.0
    runner.handle_event(DtmfHeard("1"), 104.0)
    (ok,) = says(runner.commands_to_send())
    assert ok.text == "Thank you."


# ------------------------------------------------------ fallback and bad flows


def test_fallback_without_flow_says_greeting_then_hangs_up() -> None:
    runner = fallback_runner(None, "Sorry, we cannot take your call.", 5.0, replace=True)
    runner.start(5.0)
    (say,) = says(runner.commands_to_send())
    assert say.replace and say.turn_id.startswith("fallback-")
    runner.handle_event(finished(say), 8.0)
    assert runner.commands_to_send() == [Hangup("flow_hangup")]


def test_fallback_without_flow_or_greeting_hangs_up_at_once() -> None:
    runner = fallback_runner(None, "", 5.0, replace=False)
    runner.start(5.0)
    assert runner.commands_to_send() == [Hangup("flow_hangup")]
    assert runner.done


def test_fallback_flow_replaces_what_the_app_left() -> None:
    runner = fallback_runner(FLOW, "", 5.0, replace=True)
    runner.start(5.0)
    (menu,) = says(runner.commands_to_send())
    assert menu.text == MENU and menu.replace


def test_missing_step_and_silent_loops_hang_up_with_flow_error() -> None:
    missing = FlowConfig("x", "nowhere", (FlowStep(name="a", hangup=True),))
    runner = FlowRunner(missing, "", 0.0)
    runner.start(0.0)
    assert runner.commands_to_send() == [Hangup("flow_error")]
    loop = FlowConfig("y", "a", (FlowStep(name="a", next="b"), FlowStep(name="b", next="a")))
    runner = FlowRunner(loop, "", 0.0)
    runner.start(0.0)
    assert runner.commands_to_send() == [Hangup("flow_error")]
    assert runner.events_received()[-1] == FlowEnded("flow_error", "a", 0.0)

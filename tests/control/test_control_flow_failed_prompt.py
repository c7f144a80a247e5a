"""A flow whose prompt could not be rendered goes on: the call reports the turn ended
``provider_error`` (after the fallback prompt, or at once with none), and the flow takes
its next step as after a prompt that played."""

from __future__ import annotations

from pathlib import Path

from bridge.commands import ProviderErrored, Say, TurnInterrupted
from bridge.config import load_config
from bridge.control.flow import FlowRunner

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_config(ROOT / "config" / "callbridge.toml")
FLOW = DEMO.flow("demo")


def test_a_prompt_that_failed_to_render_moves_the_flow_on() -> None:
    runner = FlowRunner(FLOW, "", 0.0)
    runner.start(0.0)
    (menu,) = [c for c in runner.commands_to_send() if isinstance(c, Say)]
    runner.handle_event(ProviderErrored(menu.turn_id, "local", "refused", "queue full"), 0.01)
    assert runner.commands_to_send() == []  # the error alone reports no prompt
    runner.handle_event(TurnInterrupted(menu.turn_id, 2400, "", "provider_error"), 2.5)
    assert runner.step == "menu"
    assert runner.next_deadline() == 2.5 + 6  # the gather runs as after a heard prompt
    runner.handle_timer(8.5)
    (again,) = [c for c in runner.commands_to_send() if isinstance(c, Say)]
    assert again.text == menu.text and again.turn_id != menu.turn_id

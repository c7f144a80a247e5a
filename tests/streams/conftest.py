"""Shared helpers for the media-stream tests: fixture replay and the Twilio emulator.

Fixture files (``fixtures/*.jsonl``) hold one JSON object per line,
``{"t": seconds, "dir": "in"|"out", "msg": ...}``, written from the carrier
documents (protocols.md §1-2):

* ``in``: what the carrier sends at ``t``. An object is sent as JSON text,
  ``{"b64": "..."}`` as a binary message, a bare string as raw text (to
  record malformed input), ``{"close": {}}`` as the socket going away
  (``connection_lost``).
* ``out``: what the engine must send at ``t``: the parsed JSON of a
  ``SendText``, ``{"b64": ...}`` for a ``SendBytes``, ``{"close": {"code":
  ..., "reason": ...}}`` for a ``CloseConnection``.

The replay calls ``connection_made(0.0)`` first. Commands (``send_frame``,
``mark``, ``clear``...) come from the test as ``(t, fn)`` pairs; at each time
the replay fires a due timer, then the commands, then the ``in`` lines, and
compares everything the engine sent with the ``out`` lines of that time.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bridge.engine import Action, CloseConnection, Event, SendBytes, SendText
from bridge.streams.base import MediaStreamProtocol

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"

Command = Callable[[Any, float], object]


def action_to_msg(action: Action) -> object:
    if isinstance(action, SendText):
        return json.loads(action.text)
    if isinstance(action, SendBytes):
        return {"b64": base64.b64encode(action.data).decode()}
    if isinstance(action, CloseConnection):
        return {"close": {"code": action.code, "reason": action.reason}}
    raise AssertionError(f"unexpected action {action!r}")


def load_fixture(name: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / name).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def feed(engine: MediaStreamProtocol, msg: object, now: float) -> None:
    if isinstance(msg, str):
        engine.receive_text(msg, now)
    elif isinstance(msg, dict) and set(msg) == {"b64"}:
        engine.receive_bytes(base64.b64decode(msg["b64"]), now)
    elif isinstance(msg, dict) and set(msg) == {"close"}:
        engine.connection_lost(now)
    else:
        engine.receive_text(json.dumps(msg), now)


def replay(
    engine: MediaStreamProtocol,
    name: str,
    commands: list[tuple[float, Command]] | None = None,
    until: float | None = None,
) -> list[tuple[float, Event]]:
    """Drive ``engine`` through fixture ``name``; return the events with their times."""
    lines = load_fixture(name)
    commands = commands or []
    times = {float(line["t"]) for line in lines} | {t for t, _ in commands}
    if until is not None:
        times.add(until)
    engine.connection_made(0.0)
    events: list[tuple[float, Event]] = []
    for now in sorted(times | {0.0}):
        deadline = engine.next_deadline()
        if deadline is not None and deadline <= now:
            engine.handle_timer(now)
        for t, command in commands:
            if t == now:
                command(engine, now)
        here = [line for line in lines if float(line["t"]) == now]
        for line in here:
            if line["dir"] == "in":
                feed(engine, line["msg"], now)
        sent = [action_to_msg(a) for a in engine.actions_to_send()]
        expected = [line["msg"] for line in here if line["dir"] == "out"]
        assert sent == expected, f"{name} at t={now}"
        events.extend((now, e) for e in engine.events_received())
    return events


def of_type(events: list[tuple[float, Event]], cls: type[Any]) -> list[Any]:
    return [e for _, e in events if isinstance(e, cls)]


def load_emulator() -> ModuleType:
    """Import ``emulator.py`` by path (tests are not a package)."""
    name = "callbridge_tests_twilio_emulator"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "emulator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class StreamsKit:
    """What the tests get from the ``kit`` fixture."""

    replay: Callable[..., list[tuple[float, Event]]]
    of_type: Callable[[list[tuple[float, Event]], type[Any]], list[Any]]
    load_fixture: Callable[[str], list[dict[str, Any]]]
    emulator: ModuleType


@pytest.fixture
def kit() -> StreamsKit:
    return StreamsKit(replay, of_type, load_fixture, load_emulator())

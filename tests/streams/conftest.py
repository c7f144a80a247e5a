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
compares everything the engine sent with the ``out`` lines of that time
(``replay_by_time`` of ``tests/tts/replay.py``, loaded here by path).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bridge.engine import Event
from bridge.streams.base import MediaStreamProtocol

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"

Command = Callable[[Any, float], object]


def load_fixture(name: str) -> list[dict[str, Any]]:
    return tts_replay.load_jsonl(FIXTURES / name)


def _socket_gone(engine: MediaStreamProtocol, close: object, now: float) -> None:
    engine.connection_lost(now)


def replay(
    engine: MediaStreamProtocol,
    name: str,
    commands: list[tuple[float, Command]] | None = None,
    until: float | None = None,
) -> list[tuple[float, Event]]:
    """Drive ``engine`` through fixture ``name``; return the events with their times."""
    engine.connection_made(0.0)
    return tts_replay.replay_by_time(
        engine,
        load_fixture(name),
        commands or [],
        name=name,
        also_at=[0.0] if until is None else [0.0, until],
        feed_line=partial(tts_replay.feed, lost=_socket_gone),
    )


def speak(frame: bytes, *names: str) -> Command:
    """A command: for each name, one frame then a mark of that name."""

    def command(engine: MediaStreamProtocol, now: float) -> None:
        for name in names:
            engine.send_frame(frame, now)
            engine.mark(name, now)

    return command


def of_type(events: list[tuple[float, Event]], cls: type[Any]) -> list[Any]:
    return [e for _, e in events if isinstance(e, cls)]


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import ``path`` as module ``name``, once (tests are not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_emulator() -> ModuleType:
    return load_by_path("callbridge_tests_twilio_emulator", HERE / "emulator.py")


#: The replay loop shared with the provider tests (see tests/tts/replay.py).
tts_replay = load_by_path("tts_replay", HERE.parent / "tts" / "replay.py")


@dataclass(frozen=True)
class StreamsKit:
    """What the tests get from the ``kit`` fixture."""

    replay: Callable[..., list[tuple[float, Event]]]
    of_type: Callable[[list[tuple[float, Event]], type[Any]], list[Any]]
    load_fixture: Callable[[str], list[dict[str, Any]]]
    emulator: ModuleType
    speak: Callable[..., Command]


@pytest.fixture
def kit() -> StreamsKit:
    return StreamsKit(replay, of_type, load_fixture, load_emulator(), speak)

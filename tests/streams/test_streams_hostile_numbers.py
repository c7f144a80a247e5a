"""Carrier messages with hostile numbers and Unicode never raise out of a dialect (issue 33).

Every inbound message of every recorded session, with each of its numbers
and digit strings replaced (an integer too large for a double, ``"²"`` which
passes ``str.isdigit`` but not ``int``, Arabic-Indic digits, negatives,
2**63, text with line separators), replayed in order through a fresh
engine: nothing raises, at most one close, at most one ``StreamStopped``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.engine import CloseConnection
from bridge.streams import DIALECTS
from bridge.streams.base import StreamStopped

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE: list[object] = [10**400, -(10**400), 2**63, -1, 1e308, "²", "1²", "٣٣", "\u2028", ""]
FILES = sorted(FIXTURES.glob("*.jsonl"))


def replaced(obj: object, value: object, target: int, seen: list[int]) -> object:
    """``obj`` with its ``target``-th number or digit string replaced by ``value``."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int | float) or (isinstance(obj, str) and obj.isascii() and obj.isdigit()):
        seen[0] += 1
        return value if seen[0] - 1 == target else obj
    if isinstance(obj, dict):
        return {k: replaced(v, value, target, seen) for k, v in obj.items()}
    if isinstance(obj, list):
        return [replaced(v, value, target, seen) for v in obj]
    return obj


def path_of(fixture: Path) -> str:
    return "/" + fixture.stem.split("_", 1)[0]


def replay(path: str, messages: list[Any]) -> None:
    engine = DIALECTS[path]()
    engine.connection_made(0.0)
    for i, msg in enumerate(messages):
        now = 0.02 * i
        if isinstance(msg, dict) and "b64" in msg:
            engine.receive_bytes(base64.b64decode(msg["b64"]), now)
        elif isinstance(msg, str):
            engine.receive_text(msg, now)
        else:
            engine.receive_text(json.dumps(msg), now)
        engine.handle_timer(now)
    actions = engine.actions_to_send()
    events = engine.events_received()
    assert sum(isinstance(a, CloseConnection) for a in actions) <= 1
    assert sum(isinstance(e, StreamStopped) for e in events) <= 1


@pytest.mark.parametrize("fixture", FILES, ids=[f.stem for f in FILES])
def test_hostile_numbers_anywhere_in_a_recorded_session_never_raise(fixture: Path) -> None:
    lines = [json.loads(line) for line in fixture.read_text().splitlines()]
    inbound = [line["msg"] for line in lines if line.get("dir") == "in"]
    head = inbound[:8]  # connected, start and the first media, marks, DTMF
    counted = [0]
    replaced(head, 0, -1, counted)  # how many numbers they hold
    assert counted[0] > 0
    for target in range(counted[0]):
        for value in HOSTILE:
            hostile = replaced(head, value, target, [0])
            assert isinstance(hostile, list)
            replay(path_of(fixture), hostile)

"""Fuzz the application protocol's command parser (issue 33).

One input goes to ``decode_command`` as bytes (what a client may send that is
not UTF-8) and, as a sequence of WebSocket frames (``fuzz_common.frames_of``),
to an open ``AppSession``. ``decode_command`` must return a ``Command`` or an
``AppError``, never raise; the session must answer each frame with exactly
one command or one ``error`` message, and that message must be JSON. Seeds:
every command example of ``bridge/control/app_schema.json`` (the schema the
tests check the parser against).

    python -m bench.fuzz.fuzz_app -atheris_runs=100000
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.fuzz.fuzz_common import ROOT, frames_of, frames_to_input, main
from bridge.commands import CallStarted, Command
from bridge.control.app import AppError, AppSession, decode_command
from bridge.engine import SendText

SCHEMA = ROOT / "bridge" / "control" / "app_schema.json"
STARTED = CallStarted("c-1", "sip", "sip:alice@127.0.0.1", "sip:bot@127.0.0.1", {"x": "1"})


def seeds(schema: Path = SCHEMA) -> list[bytes]:
    defs = json.loads(schema.read_text())["$defs"]
    examples = [
        json.dumps(example, ensure_ascii=False)
        for ref in defs["command"]["oneOf"]
        for example in defs[ref["$ref"].split("/")[-1]].get("examples", [])
    ]
    out: list[bytes] = [e.encode() for e in examples]
    out.append(frames_to_input(list(examples)))
    return out


def test_one_input(data: bytes) -> None:
    result = decode_command(data)
    assert isinstance(result, Command | AppError), result
    session = AppSession(STARTED, "ws://127.0.0.1:1/app", 0.0)
    session.connected(0.0)
    session.actions_to_send()
    session.events_received()
    frames = frames_of(data)
    for frame in frames:
        if isinstance(frame, bytes):
            session.receive_bytes(frame, 0.5)
        else:
            session.receive_text(frame, 0.5)
    errors = [a for a in session.actions_to_send() if isinstance(a, SendText)]
    commands = session.commands_to_send()
    assert len(errors) + len(commands) == len(frames), (errors, commands)
    for error in errors:
        assert json.loads(error.text)["type"] == "error", error.text


if __name__ == "__main__":
    main("app", test_one_input, seeds())

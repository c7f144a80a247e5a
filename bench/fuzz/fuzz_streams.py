"""Fuzz every media-stream dialect's receive path (issue 33).

The first byte of an input picks the dialect (Twilio, Telnyx, Plivo, Exotel,
Vonage); the rest is a sequence of WebSocket frames (``fuzz_common.frames_of``)
fed in order to a fresh engine, with its timers run after each. Nothing may
raise; the engine closes the connection at most once and reports at most one
``StreamStopped``. Seeds: the inbound messages of ``tests/streams/fixtures``.

    python -m bench.fuzz.fuzz_streams -atheris_runs=100000
"""

from __future__ import annotations

import base64
import json

from bench.fuzz.fuzz_common import FIXTURES, frames_of, frames_to_input, main
from bridge.engine import CloseConnection
from bridge.streams import DIALECTS
from bridge.streams.base import StreamStopped

PATHS = sorted(DIALECTS)


def seeds() -> list[bytes]:
    out = []
    for path in sorted((FIXTURES / "streams" / "fixtures").glob("*.jsonl")):
        dialect = "/" + path.stem.split("_", 1)[0]
        frames: list[str | bytes] = []
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("dir") != "in":
                continue
            msg = entry["msg"]
            if isinstance(msg, dict) and "b64" in msg:
                frames.append(base64.b64decode(msg["b64"]).replace(b"\n", b"\x0b"))
            else:
                frames.append(msg if isinstance(msg, str) else json.dumps(msg))
            if len(frames) == 8:
                break
        out.append(bytes([PATHS.index(dialect)]) + frames_to_input(frames))
    return out


def test_one_input(data: bytes) -> None:
    if not data:
        return
    engine = DIALECTS[PATHS[data[0] % len(PATHS)]]()
    engine.connection_made(0.0)
    for i, frame in enumerate(frames_of(data[1:])):
        now = 0.02 * i
        if isinstance(frame, bytes):
            engine.receive_bytes(frame, now)
        else:
            engine.receive_text(frame, now)
        engine.handle_timer(now)
    engine.handle_timer(60.0)
    actions = engine.actions_to_send()
    events = engine.events_received()
    assert sum(isinstance(a, CloseConnection) for a in actions) <= 1, actions
    assert sum(isinstance(e, StreamStopped) for e in events) <= 1, events


if __name__ == "__main__":
    main("streams", test_one_input, seeds())

"""Fuzz every TTS provider client's receive path (issue 33).

The first byte of an input picks the protocol (Coda, Kletso, Kova,
KugelAudio, zwst) or zwst's session POST reply. For a protocol the rest is a
sequence of WebSocket frames (``fuzz_common.frames_of``) fed to a client with
a live turn, then its timers run out; for the session reply the rest is the
reply body (status 200). Nothing may raise, and the turn ends (done or
failed) at most once. Seeds: the inbound frames of ``tests/tts/*/fixtures``.

    python -m bench.fuzz.fuzz_providers -atheris_runs=100000
"""

from __future__ import annotations

import base64
import importlib
import json
from typing import Any

from bench.fuzz.fuzz_common import FIXTURES, frames_of, frames_to_input, main
from bridge.providers.base import AudioFormat, ProviderSettings, TurnDone, TurnFailed, TurnSettings

PROTOCOLS = ["coda", "kletso", "kova", "kugelaudio", "zwst"]
SESSION_REPLY = len(PROTOCOLS)
"""Selector of the zwst session POST reply."""
CODA_READY = {"ready": {"protocol": 1, "languages": ["en"], "defaultLanguage": "en"}}
ENGINES = {p: importlib.import_module(f"bridge.providers.{p}.client").ENGINE for p in PROTOCOLS}


def seeds() -> list[bytes]:
    out = []
    for index, protocol in enumerate(PROTOCOLS):
        for path in sorted((FIXTURES / "tts" / protocol / "fixtures").glob("*.jsonl")):
            frames: list[str | bytes] = []
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                msg = entry.get("msg")
                if entry.get("dir") != "in" or (isinstance(msg, dict) and "close" in msg):
                    continue
                if isinstance(msg, dict) and "b64" in msg:
                    frames.append(base64.b64decode(msg["b64"]).replace(b"\n", b"\x0b")[:512])
                elif isinstance(msg, dict) and "raw" in msg:
                    frames.append(str(msg["raw"]))
                else:
                    frames.append(msg if isinstance(msg, str) else json.dumps(msg))
            if frames:
                out.append(bytes([index]) + frames_to_input(frames[:16]))
    out.append(bytes([SESSION_REPLY]) + b'{"url": "wss://p.example/v1/stream?t=1"}')
    return out


def client(protocol: str, session_body: bytes = b'{"url": "wss://p.example/v1/stream?t=1"}') -> Any:
    engine = ENGINES[protocol](
        ProviderSettings(
            name="p", protocol=protocol, url="wss://p.example/v1/stream", api_key="k", voice="v"
        )
    )
    if engine.session_request() is not None:
        engine.session_response(200, session_body, 0.0)
    engine.connection_made("rime.v1.json" if protocol == "coda" else None, 0.0)
    if protocol == "coda":
        engine.receive_text(json.dumps(CODA_READY), 0.0)
    fmt = AudioFormat("pcm_s16le", 16000)
    engine.open_turn("t1", TurnSettings(voice="v", audio_format=fmt, model="m"), 0.0)
    engine.send_text("t1", "Hello there. ", 0.0)
    engine.end_turn("t1", 0.0)
    return engine


def test_one_input(data: bytes) -> None:
    if not data:
        return
    selector = data[0] % (len(PROTOCOLS) + 1)
    if selector == SESSION_REPLY:
        engine = ENGINES["zwst"](
            ProviderSettings(
                name="p", protocol="zwst", url="wss://p.example/v1/stream", api_key="k", voice="v"
            )
        )
        engine.session_request()
        engine.session_response(200, data[1:], 0.0)
        engine.handle_timer(100.0)
        engine.actions_to_send()
        engine.events_received()
        return
    engine = client(PROTOCOLS[selector])
    events = engine.events_received()
    for i, frame in enumerate(frames_of(data[1:])):
        now = 0.05 * (i + 1)
        if isinstance(frame, bytes):
            engine.receive_bytes(frame, now)
        else:
            engine.receive_text(frame, now)
        engine.handle_timer(now)
    engine.handle_timer(100.0)
    engine.actions_to_send()
    events += engine.events_received()
    ends = [e for e in events if isinstance(e, TurnDone | TurnFailed) and e.turn_id == "t1"]
    assert len(ends) <= 1, ends


if __name__ == "__main__":
    main("providers", test_one_input, seeds())

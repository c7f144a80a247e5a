"""What a provider client engine costs per received message, through the one
receive contract and (where an engine still has them) through its shortcuts.

Each protocol's client engine is paired in process with its own server
session and the ``tone`` engine: the client opens one turn, sends the
capacity benchmark's ~15 s text, and every message the server answers with is
recorded (the exact frames the reference server writes). Then a fresh client
with the same turn open is fed those messages, timed, in up to three ways:

* ``contract``: ``receive_text``/``receive_bytes``, then what the shell's
  ``pump()`` does after every message: drain ``actions_to_send()`` and
  ``events_received()``, hand each event to a sink, read ``next_deadline()``;
* ``fast``: ``receive_text_fast``/``receive_bytes_fast`` (an audio or timings
  message returned as a tuple, handed to the sink without a drain; anything
  else pumped as above), where the engine has them;
* ``full_parse`` (Kova only): the contract, but every frame through the JSON
  parser (Kova's ``receive_text`` matches the compact ``audio_chunk`` shape
  its own server writes and takes it apart without ``json.loads``).

Figures: CPU µs per message (``time.process_time``, the median of
``--reps``), messages per second of turn audio, and what the difference
would be at ``--calls`` calls each receiving audio continuously in real time
(an upper bound: a call's bot does not talk all the time), as a share of one
core. Pure Python unless the engines are compiled in the running install.

    python -m bench.bench_receive_contract [--quick] [--calls 500] [--reps 7] [--format pcm/24000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import write
from bridge.engine import Action, SendBytes, SendText
from bridge.providers import registry
from bridge.providers.base import AudioFormat, AudioReceived, ProviderSettings, TurnSettings
from bridge.providers.server_base import ServerOptions, Synthesize
from bridge.ttsd.synth import ToneEngine, render

TEXT = (
    "Thank you for calling. Your order has shipped and should arrive on Thursday. "
    "If you would like to change the delivery address, press one. To speak with "
    "someone about a return, press two. For anything else, stay on the line and "
    "we will be right with you."
)
FORMATS = {"mulaw/8000": AudioFormat("mulaw", 8000), "pcm/24000": AudioFormat("pcm_s16le", 24000)}
FORMAT = FORMATS["mulaw/8000"]
Msg = str | bytes


def _settings(protocol: str) -> ProviderSettings:
    return ProviderSettings(
        name="p", protocol=protocol, url="ws://127.0.0.1:1/v1/stream", api_key="k", voice="v"
    )


def _connect(protocol: str, server_mod: Any) -> tuple[Any, Any, list[Msg]]:
    """A connected client/server pair; the server's opening messages."""
    client = registry.engine_class(protocol)(_settings(protocol))
    options = ServerOptions(voices=frozenset({"v"}), default_voice="v")
    request = client.session_request()
    query: dict[str, str] = {}
    if request is not None:  # zwst: its session route answers the stream URL
        status, body = server_mod.handle_session_request(
            request.body, options, "ws://127.0.0.1:1", headers={"authorization": "Bearer k"}
        )
        client.session_response(status, body, 0.0)
        url = client.connect_params().url
        query = dict(p.split("=", 1) for p in url.partition("?")[2].split("&") if "=" in p)
    server = server_mod.SESSION(options)
    params = client.connect_params()
    subprotocol = None
    if getattr(params, "subprotocols", ()) and hasattr(server_mod, "select_subprotocol"):
        subprotocol = server_mod.select_subprotocol(params.subprotocols)
    path = server_mod.PATHS[0]
    server.connection_made(path, query, {"authorization": "Bearer k"}, 0.0)
    client.connection_made(subprotocol, 0.0)
    opening = _serve(server, [])
    return client, server, opening


def _serve(server: Any, into: list[Msg]) -> list[Msg]:
    """Move the server's actions: messages recorded, synthesis jobs run on ``tone``."""
    tone = ToneEngine()
    actions = server.actions_to_send()
    while actions:
        for action in actions:
            if isinstance(action, SendText):
                into.append(action.text)
            elif isinstance(action, SendBytes):
                into.append(action.data)
            elif isinstance(action, Synthesize):
                for chunk in render(tone, action):
                    server.synthesis_audio(action.job_id, chunk.pcm, chunk.words, 0.0)
                server.synthesis_done(action.job_id, 0.0)
        actions = server.actions_to_send()
    return into


def _feed(engine: Any, msgs: list[Msg]) -> None:
    for msg in msgs:
        if isinstance(msg, str):
            engine.receive_text(msg, 0.0)
        else:
            engine.receive_bytes(msg, 0.0)


def _to_server(server: Any, actions: list[Action]) -> None:
    for action in actions:
        if isinstance(action, SendText):
            server.receive_text(action.text, 0.0)
        elif isinstance(action, SendBytes):
            server.receive_bytes(action.data, 0.0)


def transcript(protocol: str) -> tuple[Callable[[], Any], list[Msg], float]:
    """``(fresh client with the turn open, the turn's messages, audio seconds)``."""
    server_mod = registry.server_module(protocol)
    turn = TurnSettings(voice="v", audio_format=FORMAT, model="m")

    def opened() -> tuple[Any, list[Msg]]:
        """A client whose turn is open, its text sent and ended; what the server answered."""
        client, server, opening = _connect(protocol, server_mod)
        _feed(client, opening)
        _to_server(server, client.actions_to_send())
        client.open_turn("t1", turn, 0.0)
        _to_server(server, client.actions_to_send())
        started = _serve(server, [])  # e.g. context_started
        _feed(client, started)
        client.send_text("t1", TEXT, 0.0)
        client.end_turn("t1", 0.0)
        _to_server(server, client.actions_to_send())
        client.events_received()
        return client, _serve(server, [])

    msgs = opened()[1]
    probe = opened()[0]
    _feed(probe, msgs)
    audio_s = sum(
        len(e.audio) / (e.audio_format.sample_rate_hz * e.audio_format.bytes_per_sample)
        for e in probe.events_received()
        if isinstance(e, AudioReceived)
    )
    return (lambda: opened()[0]), msgs, audio_s


def _pump(engine: Any, sink: list[Any]) -> None:
    engine.actions_to_send()
    for event in engine.events_received():
        sink.append(event)
    engine.next_deadline()


def run_contract(engine: Any, msgs: list[Msg], sink: list[Any]) -> None:
    for msg in msgs:
        if isinstance(msg, str):
            engine.receive_text(msg, 0.0)
        else:
            engine.receive_bytes(msg, 0.0)
        _pump(engine, sink)


def run_fast(engine: Any, msgs: list[Msg], sink: list[Any]) -> None:
    for msg in msgs:
        if isinstance(msg, str):
            piece = engine.receive_text_fast(msg, 0.0)
        else:
            piece = engine.receive_bytes_fast(msg, 0.0)
        if piece is None:
            _pump(engine, sink)
        else:
            sink.append(piece)


def run_full_parse(engine: Any, msgs: list[Msg], sink: list[Any]) -> None:
    for msg in msgs:
        engine._parse(msg, 0.0)  # Kova: what receive_text does when the shape does not match
        _pump(engine, sink)


def measure(
    fresh: Callable[[], Any], msgs: list[Msg], run: Callable[..., None], reps: int, loops: int
) -> float:
    """CPU µs per message, the median of ``reps`` (each ``loops`` fresh turns)."""
    per_msg: list[float] = []
    for _ in range(reps):
        engines = [fresh() for _ in range(loops)]
        sink: list[Any] = []
        t0 = time.process_time()
        for engine in engines:
            run(engine, msgs, sink)
        per_msg.append((time.process_time() - t0) / (loops * len(msgs)) * 1e6)
    return statistics.median(per_msg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--loops", type=int, default=20, help="turns fed per repetition")
    ap.add_argument("--protocols", default=",".join(registry.PROTOCOLS))
    ap.add_argument("--format", choices=sorted(FORMATS), default="mulaw/8000")
    ap.add_argument("--out", default="receive_contract")
    args = ap.parse_args()
    global FORMAT
    FORMAT = FORMATS[args.format]
    reps, loops = (3, 5) if args.quick else (args.reps, args.loops)
    figures: dict[str, Any] = {}
    for protocol in args.protocols.split(","):
        try:
            fresh, msgs, audio_s = transcript(protocol)
        except Exception as exc:  # a pairing this bench cannot drive: said, not hidden
            print(f"{protocol:11s} skipped: {type(exc).__name__}: {exc}")
            figures[protocol] = {"skipped": f"{type(exc).__name__}: {exc}"}
            continue
        if not audio_s:
            print(f"{protocol:11s} skipped: no audio reached the client in {args.format}")
            figures[protocol] = {"skipped": f"no audio in {args.format}"}
            continue
        rate = len(msgs) / audio_s
        row: dict[str, Any] = {
            "messages": len(msgs),
            "audio_s": round(audio_s, 3),
            "messages_per_audio_s": round(rate, 2),
            "contract_us": round(measure(fresh, msgs, run_contract, reps, loops), 3),
        }
        if hasattr(fresh(), "receive_text_fast"):
            row["fast_us"] = round(measure(fresh, msgs, run_fast, reps, loops), 3)
        if protocol == "kova" and hasattr(fresh(), "_parse"):
            row["full_parse_us"] = round(measure(fresh, msgs, run_full_parse, reps, loops), 3)
        per_s = rate * args.calls
        line = f"{protocol:11s} {len(msgs):4d} msgs / {audio_s:5.1f} s audio ({rate:5.1f}/s)"
        line += f"  contract {row['contract_us']:6.2f} us"
        for key in ("fast_us", "full_parse_us"):
            if key in row:
                saved_us = (row["contract_us"] - row[key]) if key == "fast_us" else 0.0
                if key == "full_parse_us":
                    saved_us = row[key] - row["contract_us"]
                share = saved_us * per_s / 1e6
                row[key.replace("_us", "_core_share_at_calls")] = round(share, 4)
                line += f"  {key[:-3]} {row[key]:6.2f} us (core share at {args.calls} calls:"
                line += f" {100 * share:+.2f} %)"
        figures[protocol] = row
        print(line)
    path = write(
        args.out,
        figures,
        {"calls": args.calls, "reps": reps, "loops": loops, "format": args.format},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

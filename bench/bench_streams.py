"""Media streams (issue 5): per-frame CPU of the stream engines, and pacing at the carrier.

(a) **Engine CPU per frame**, in-process, ``time.process_time_ns`` (CPU
time of this process: neighbours on a shared machine do not inflate it as
they do a wall clock) around a
loop of many frames, the median of several repetitions (each a fresh engine
brought to STREAMING with its dialect's recorded ``start`` from
``tests/streams/fixtures``):

* inbound: ``receive_text`` of a ``media`` message (JSON parse, field checks,
  base64 decode) → ``AudioReceived``, then draining the engine; Vonage's
  audio is a binary message (``receive_bytes``, no JSON, no base64). The
  messages are built before the clock starts (sequence numbers counting up,
  a 20 ms payload of the dialect's codec), so only the engine is timed;
* outbound: ``send_frame`` of one 20 ms frame → the ``SendText`` (Vonage:
  ``SendBytes``; Exotel buffers ten frames per 3200 B chunk, so its figure is
  the average over frames);
* the call's full path on the Twilio dialect: ``receive_text`` →
  ``CallBridge.caller_audio`` (VAD, barge-in detector), then
  ``CallBridge.tick`` → ``send_frame`` (marks forwarded), with a long turn
  queued and quiet caller noise (no barge-in).

Every repetition checks that each frame produced exactly one
``AudioReceived`` / one message, so a figure never times an engine that
silently refused the input.

(b) **Pacing at the carrier** over a real WebSocket: ``callbridge serve``
(uvloop) in its own process pinned to core 0, the reference TTS server (tone
engine) and the lean multi-call carrier (``bench/loadgen/twilio.py``) on
core 1, route ``talk`` (continuous audio). 1, 20 and 100 concurrent Twilio
calls. Each outbound ``media`` message is timed twice:

* **wire** (the daemon's pacing): ``dumpcap`` captures the daemon's TCP
  segments on loopback (``tcp src port <media-stream port>``, started before
  the calls connect, so every handshake is seen); the capture timestamp is
  the kernel's, taken as the segment leaves the daemon's ``write``. Each
  connection's byte stream is reassembled from the segments (by sequence
  number), the WebSocket frames are parsed, and a ``media`` message's time
  is that of the segment carrying its last byte. The receiver's scheduling
  does not enter these figures;
* **carrier** (user space): ``time.monotonic_ns()`` in the carrier's
  receiving coroutine, as before (daemon + loopback + the carrier's own
  loop, which shares core 1 with the TTS server).

Per talkspurt (a gap > 50 ms starts one) the lead burst (the first
``lead_frames + 1`` messages) is left out; the figures are the deviation of
each inter-arrival time from 20 ms and, as in ``bench_pacing``, the
deviation from the talkspurt's fitted 20 ms grid. Needs ``dumpcap`` and
the right to capture on ``lo`` (root); without them only the
carrier figures are printed.

    python -m bench.bench_streams [--quick] [--no-pacing]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from websockets.frames import apply_mask as ws_apply_mask
from websockets.server import ServerProtocol

from bench.common import write
from bench.loadgen.analysis import ws_deviations_ns
from bench.loadgen.hostspeed import drain
from bench.loadgen.procs import (
    DAEMON_CORE,
    DaemonUnderTest,
    TtsProcess,
    pin_self,
)
from bench.loadgen.steps import _cdr_figures, core_busy_s
from bench.loadgen.twilio import TwilioLoad
from bench.loadgen.wire import WireCapture
from bridge.commands import Say
from bridge.engine import SendBytes, SendText
from bridge.io.httpws import HttpRequest, WsConnection
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import LegProfile, SendMark
from bridge.providers.base import MULAW_8K
from bridge.providers.base import AudioReceived as ProviderAudio
from bridge.streams import DIALECTS
from bridge.streams.base import (
    AudioReceived,
    MediaStreamProtocol,
    SendEncodedText,
    StreamState,
)
from bridge.streams.twilio import TwilioStreamProtocol
from telcodec import g711

HERE = Path(__file__).resolve().parent

FIXTURES = HERE.parent / "tests" / "streams" / "fixtures"
FIXTURE_OF = {
    "twilio": "twilio_call.jsonl",
    "telnyx": "telnyx_call.jsonl",
    "plivo": "plivo_call.jsonl",
    "exotel": "exotel_call.jsonl",
    "vonage": "vonage_call.jsonl",
}
FRAME_S = 0.02
CALL_PATH_FRAMES = 5_000
LEAD_FRAMES = 2  # lead_ms 60: up to three messages leave together


# ------------------------------------------------------------------ (a) engine CPU


def _fixture(dialect: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / FIXTURE_OF[dialect]).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _feed(engine: MediaStreamProtocol, msg: Any, now: float) -> None:
    if isinstance(msg, dict) and set(msg) == {"b64"}:
        engine.receive_bytes(base64.b64decode(msg["b64"]), now)
    else:
        engine.receive_text(msg if isinstance(msg, str) else json.dumps(msg), now)


def streaming_engine(cls: type[MediaStreamProtocol]) -> tuple[MediaStreamProtocol, Any]:
    """A fresh engine fed its fixture's messages up to ``start``; and the first media message."""
    engine = cls()
    engine.connection_made(0.0)
    media: Any = None
    for line in _fixture(cls.DIALECT):
        if line["dir"] != "in":
            continue
        msg = line["msg"]
        if engine.state is StreamState.STREAMING:
            is_media = (isinstance(msg, dict) and set(msg) == {"b64"}) or (
                isinstance(msg, dict) and msg.get(cls.EVENT_KEY) == "media"
            )
            if is_media:
                media = msg
                break
            continue
        _feed(engine, msg, 0.0)
    if engine.state is not StreamState.STREAMING or media is None:
        raise RuntimeError(f"{cls.DIALECT}: fixture did not start the stream")
    engine.actions_to_send()
    engine.events_received()
    return engine, media


def inbound_messages(
    engine: MediaStreamProtocol, media: Any, n: int
) -> tuple[list[str] | list[bytes], int]:
    """``n`` media messages with counting sequence numbers and a 20 ms payload."""
    rng = np.random.default_rng(1)
    payload = rng.integers(0, 256, engine.frame_bytes, dtype=np.uint8).tobytes()
    if isinstance(media, dict) and set(media) == {"b64"}:
        return [payload] * n, len(payload)
    seq_key = type(engine).SEQUENCE_KEY
    base_seq = int(media[seq_key]) if seq_key and seq_key in media else 0
    b64 = base64.b64encode(payload).decode()
    out: list[str] = []
    for i in range(n):
        msg = copy.deepcopy(media)
        msg["media"]["payload"] = b64
        if seq_key and seq_key in msg:
            value = base_seq + i
            msg[seq_key] = str(value) if isinstance(media[seq_key], str) else value
        chunk = msg["media"].get("chunk")
        if chunk is not None:
            msg["media"]["chunk"] = str(i + 1) if isinstance(chunk, str) else i + 1
        if "timestamp" in msg["media"]:
            msg["media"]["timestamp"] = str(20 * (i + 1))
        out.append(json.dumps(msg))
    return out, len(payload)


def time_inbound(cls: type[MediaStreamProtocol], frames: int) -> float:
    """ns per inbound media message, one repetition."""
    engine, media = streaming_engine(cls)
    msgs, _ = inbound_messages(engine, media, frames)
    receive: Callable[[Any, float], None] = (
        engine.receive_bytes if isinstance(msgs[0], bytes) else engine.receive_text
    )
    got = 0
    t0 = time.process_time_ns()
    for i, m in enumerate(msgs):
        receive(m, i * FRAME_S)
        engine.actions_to_send()
        for e in engine.events_received():
            got += isinstance(e, AudioReceived)
    elapsed = time.process_time_ns() - t0
    if got != frames:
        raise RuntimeError(f"{cls.DIALECT}: {got} AudioReceived for {frames} messages")
    return elapsed / frames


def time_outbound(cls: type[MediaStreamProtocol], frames: int) -> float:
    """ns per outbound 20 ms frame (``send_frame`` and draining the message), one repetition."""
    engine, _ = streaming_engine(cls)
    frame = bytes(range(256)) * (engine.frame_bytes // 256) + bytes(engine.frame_bytes % 256)
    sent_bytes = 0
    t0 = time.process_time_ns()
    for i in range(frames):
        engine.send_frame(frame, i * FRAME_S)
        for a in engine.actions_to_send():
            if isinstance(a, SendText | SendBytes):
                sent_bytes += 1
        engine.events_received()
    elapsed = time.process_time_ns() - t0
    engine.flush(frames * FRAME_S)
    sent_bytes += sum(isinstance(a, SendText | SendBytes) for a in engine.actions_to_send())
    if sent_bytes == 0:
        raise RuntimeError(f"{cls.DIALECT}: send_frame produced no message")
    return elapsed / frames


def _talking_call(frames: int) -> CallBridge:
    """A Twilio call with a turn of ``frames`` 20 ms frames queued (default barge-in)."""
    policy = BargeInPolicy()
    leg = LegProfile(kind="twilio", codec="mulaw", heard_from="marks", can_clear=True)
    call = CallBridge("bench", leg, policy, 0.0)
    bot = g711.ulaw_encode(
        (8000 * np.sin(2 * np.pi * 440 * np.arange(160 * frames) / 8000)).astype("<i2").tobytes()
    )
    call.execute(Say("t1", "bot"), 0.0)
    call.provider_event(ProviderAudio("t1", bot, MULAW_8K), 0.0)
    call.actions_to_send()
    call.events_received()
    return call


def time_call_path(frames: int) -> float:
    """ns per 20 ms of a Twilio call: inbound media through the call, tick, outbound media."""
    engine, media = streaming_engine(TwilioStreamProtocol)
    rng = np.random.default_rng(2)
    noise = (rng.normal(0, 30, 160 * frames)).astype("<i2").tobytes()
    caller_ulaw = g711.ulaw_encode(noise)
    msgs = []
    for i in range(frames):
        msg = copy.deepcopy(media)
        msg["sequenceNumber"] = str(int(media["sequenceNumber"]) + i)
        msg["media"].update(
            chunk=str(i + 1),
            timestamp=str(20 * (i + 1)),
            payload=base64.b64encode(caller_ulaw[i * 160 : (i + 1) * 160]).decode(),
        )
        msgs.append(json.dumps(msg))
    call = _talking_call(frames + 10)
    sent = 0
    t0 = time.process_time_ns()
    for i, m in enumerate(msgs):
        now = (i + 1) * FRAME_S
        engine.receive_text(m, now)
        engine.actions_to_send()
        for e in engine.events_received():
            if isinstance(e, AudioReceived):
                call.caller_audio(e.payload, now)
        payload = call.tick(now)
        if payload is not None:
            engine.send_frame(payload, now)
        for a in call.actions_to_send():
            if isinstance(a, SendMark):
                engine.mark(a.name, now)
        call.events_received()
        sent += sum(isinstance(a, SendText) for a in engine.actions_to_send())
    elapsed = time.process_time_ns() - t0
    if sent < frames:
        raise RuntimeError(f"call path: {sent} messages for {frames} ticks (a barge-in?)")
    return elapsed / frames


def median_us(fn: Callable[[], float], reps: int) -> dict[str, float]:
    runs = [fn() / 1000 for _ in range(reps)]
    return {
        "median_us": round(statistics.median(runs), 3),
        "min_us": round(min(runs), 3),
        "max_us": round(max(runs), 3),
    }


def engine_cpu(frames: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print(f"{'dialect':<8} {'inbound µs':>11} {'outbound µs':>12}  (median of {reps} x {frames})")
    for cls in DIALECTS.values():
        inbound = median_us(partial(time_inbound, cls, frames), reps)
        outbound = median_us(partial(time_outbound, cls, frames), reps)
        out[cls.DIALECT] = {"inbound": inbound, "outbound": outbound}
        print(f"{cls.DIALECT:<8} {inbound['median_us']:>11} {outbound['median_us']:>12}")
    # 100 s per call: a much longer run without mark echoes sent fewer frames
    # than ticks at 20 000 (not investigated yet; see docs/benchmarks.md)
    path = median_us(partial(time_call_path, min(frames, CALL_PATH_FRAMES)), reps)
    out["twilio_call_path"] = path
    print(f"twilio call path (receive + caller_audio + tick + send_frame): {path['median_us']} µs")
    return out


# ------------------------------------------------------------------ (c) shell CPU

SHELL_HANDSHAKE = (
    b"GET /twilio HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


class _ShellWriter:
    """What ``WsConnection`` uses of a ``StreamWriter``, over a transport."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.transport.close()


class _NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def _open_ws(transport: Any) -> WsConnection:
    proto = ServerProtocol(max_size=64 * 1024)
    proto.receive_data(SHELL_HANDSHAKE)
    (request,) = proto.events_received()
    proto.send_response(proto.accept(request))  # type: ignore[arg-type]
    proto.data_to_send()
    return WsConnection(
        HttpRequest("GET", "/twilio", {}),
        proto,
        None,  # type: ignore[arg-type]
        _ShellWriter(transport),  # type: ignore[arg-type]
    )


def _client_frame(text: str, key: bytes) -> bytes:
    data = text.encode()
    n = len(data)
    head = bytes((0x81, 0x80 | n)) if n < 126 else bytes((0x81, 0xFE)) + n.to_bytes(2, "big")
    return head + key + ws_apply_mask(data, key)


def time_shell_inbound(frames: int) -> float:
    """ns per inbound Twilio ``media`` frame through ``WsConnection`` (bytes in, text out).

    One masked frame per ``data_received``, as a carrier's 20 ms messages
    arrive, through websockets' sans-I/O parser (the connection's only one
    since issue 32; before it, the shell cut whole data frames itself, the
    ``inbound_fast_read`` of older results).
    """
    engine, media = streaming_engine(TwilioStreamProtocol)
    msgs, _ = inbound_messages(engine, media, frames)
    chunks = [_client_frame(m, i.to_bytes(4, "big")) for i, m in enumerate(msgs)]  # type: ignore[arg-type]
    conn = _open_ws(_NullTransport())
    got: list[str | bytes] = []

    class _Pending:
        def done(self) -> bool:
            return False

    conn._serving = (got.append, _Pending())  # type: ignore[assignment]
    t0 = time.process_time_ns()
    for chunk in chunks:
        conn._serve_data(chunk)
    elapsed = time.process_time_ns() - t0
    if got != msgs:
        raise RuntimeError("shell inbound: messages lost or changed")
    return elapsed / frames


def time_shell_outbound(conns: int, ticks: int) -> float:
    """ns of this process's CPU per outbound frame: every call's tick, frame and write.

    ``conns`` real loopback TCP connections (a child process reads them)
    under uvloop, each with a talking ``CallBridge``, a Twilio engine and a
    ``WsConnection``. A tick runs, for every connection in turn, what the
    media ticker runs for it: ``CallBridge.tick`` → the engine's
    ``frame_message`` (else ``send_frame``) → the frame's ``write``. Ticks
    are 5 ms apart (the child keeps up).
    """
    import multiprocessing

    import uvloop

    async def run() -> float:
        loop = asyncio.get_running_loop()
        transports: list[asyncio.Transport] = []

        class _Accept(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                transports.append(transport)  # type: ignore[arg-type]

        server = await loop.create_server(_Accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        child = multiprocessing.get_context("fork").Process(target=drain, args=(port, conns))
        child.start()
        while len(transports) < conns:
            await asyncio.sleep(0.01)
        streams = []
        for transport in transports:
            engine, _ = streaming_engine(TwilioStreamProtocol)
            streams.append((_talking_call(ticks + 10), engine, _open_ws(transport)))
        sent = 0
        t0 = time.process_time_ns()
        for i in range(ticks):
            now = (i + 1) * FRAME_S
            for call, engine, conn in streams:
                payload = call.tick(now)
                if payload is not None:  # as StreamLeg.send_frame: the message, else queued
                    data = engine.frame_message(payload)
                    if data is not None:
                        conn.send_encoded_text_nowait(data)
                        sent += 1
                    else:
                        engine.send_frame(payload, now)
                for a in call.actions_to_send():
                    if isinstance(a, SendMark):
                        engine.mark(a.name, now)
                call.events_received()
                for action in engine.actions_to_send():
                    if isinstance(action, SendEncodedText):
                        conn.send_encoded_text_nowait(action.data)
                        sent += 1
                    elif isinstance(action, SendText):
                        conn.send_text_nowait(action.text)
            await asyncio.sleep(0.005)
        elapsed = time.process_time_ns() - t0
        for transport in transports:
            transport.close()
        server.close()
        child.join(10)
        if sent < conns * ticks:
            raise RuntimeError(f"shell outbound: {sent} frames for {conns * ticks}")
        return elapsed / sent

    return uvloop.run(run())


def _no_start(stream: Any, event: Any) -> None:
    raise RuntimeError("the benchmark's stream has started already")


def time_leg_inbound(frames: int) -> float:
    """ns per Twilio ``media`` message through the leg: ``StreamCall._on_message`` to the call.

    The text message → the engine (``take_media_text``; else ``receive_text``
    and the leg's events) → ``caller_audio`` of a call that only records the
    frame (the call's own work is not timed).
    """
    from bridge.io.legs.stream_call import StreamCall
    from telcodec.framing import FrameCutter

    class _Call:
        finished = False

        def __init__(self) -> None:
            self.frames = 0

        def caller_audio(self, frame: bytes) -> None:
            self.frames += 1

    class _Loop:
        def time(self) -> float:
            return 1.0

    engine, media = streaming_engine(TwilioStreamProtocol)
    msgs, _ = inbound_messages(engine, media, frames)
    stream = StreamCall(None, engine, _Loop(), lambda: None, _no_start)  # type: ignore[arg-type]
    call = _Call()
    stream.call, stream.cutter = call, FrameCutter(engine.frame_bytes)  # type: ignore[assignment]
    t0 = time.process_time_ns()
    for m in msgs:
        stream._on_message(m)
    elapsed = time.process_time_ns() - t0
    if call.frames != frames:
        raise RuntimeError(f"leg inbound: {call.frames} frames for {frames} messages")
    return elapsed / frames


def time_leg_outbound(frames: int) -> float:
    """ns per outbound frame through the leg: ``StreamLeg.send_frame`` to the transport's write.

    What the media ticker calls for a Twilio call with a frame due: the
    engine renders the ``media`` message, the shell frames it and hands it
    to a transport that only counts the writes (no syscall: the Python work
    of the leg, not the kernel's, is timed).
    """
    from bridge.io.legs.stream_call import StreamCall, StreamLeg

    class _CountingTransport:
        def __init__(self) -> None:
            self.writes = 0

        def write(self, data: bytes) -> None:
            self.writes += 1

    class _Loop:
        def time(self) -> float:
            return 1.0

    engine, _ = streaming_engine(TwilioStreamProtocol)
    transport = _CountingTransport()
    stream = StreamCall(_open_ws(transport), engine, _Loop(), lambda: None, _no_start)  # type: ignore[arg-type]
    leg = StreamLeg(stream)
    frame = bytes(range(160))
    t0 = time.process_time_ns()
    for i in range(frames):
        leg.send_frame(frame, i, i * FRAME_S)
    elapsed = time.process_time_ns() - t0
    if transport.writes != frames:
        raise RuntimeError(f"leg outbound: {transport.writes} writes for {frames} frames")
    return elapsed / frames


def shell_cpu(frames: int, reps: int, conns: int = 200, ticks: int = 100) -> dict[str, Any]:
    out: dict[str, Any] = {}
    key = "inbound_websockets_parser"
    out[key] = median_us(partial(time_shell_inbound, frames), reps)
    print(f"shell inbound ({key}): {out[key]['median_us']} µs per message")
    out["leg_inbound"] = median_us(partial(time_leg_inbound, frames), reps)
    print(f"leg inbound (message to caller_audio): {out['leg_inbound']['median_us']} µs")
    out["leg_outbound"] = median_us(partial(time_leg_outbound, frames), reps)
    print(f"leg outbound (send_frame to the write): {out['leg_outbound']['median_us']} µs")
    out["outbound"] = median_us(partial(time_shell_outbound, conns, ticks), reps)
    print(f"shell outbound, {conns} calls: {out['outbound']['median_us']} µs per frame")
    return out


# ------------------------------------------------------------------ (b) pacing


def interarrival_dev_ns(arrival_ns: np.ndarray, gap_ns: int = 50_000_000) -> np.ndarray:
    """|inter-arrival - 20 ms| within each talkspurt, after its lead burst."""
    a = np.asarray(arrival_ns, dtype=np.int64)
    if a.size < 2:
        return np.zeros(0, dtype=np.int64)
    start = np.ones(a.size, dtype=bool)
    start[1:] = np.diff(a) > gap_ns
    seg = np.cumsum(start) - 1
    idx = np.arange(a.size) - np.flatnonzero(start)[seg]
    d = np.diff(a)
    keep = (~start[1:]) & (idx[1:] > LEAD_FRAMES)
    return np.asarray(np.abs(d[keep] - 20_000_000))


def _ms(values_ns: np.ndarray) -> dict[str, float]:
    v = np.abs(values_ns) / 1e6
    if v.size == 0:
        return {"n": 0}
    return {
        "n": int(v.size),
        "p50_ms": round(float(np.percentile(v, 50)), 3),
        "p99_ms": round(float(np.percentile(v, 99)), 3),
        "max_ms": round(float(v.max()), 3),
    }


def pacing_step(
    d: DaemonUnderTest, n: int, measure_s: float, warm_s: float, workdir: Path | None = None
) -> dict[str, Any]:
    capture = WireCapture(d.ms_port, workdir) if workdir is not None else None
    window: list[int] = []

    async def run() -> dict[str, Any]:
        load = TwilioLoad(d.ms_port, route="talk")
        await load.place(n, rate_per_s=150)
        await asyncio.sleep(warm_s)
        k0 = core_busy_s(DAEMON_CORE)
        c0, t0 = d.cpu_s(), time.monotonic()
        window.append(time.time_ns())
        load.recording = True
        await asyncio.sleep(measure_s)
        load.recording = False
        window.append(time.time_ns())
        c1, t1 = d.cpu_s(), time.monotonic()
        k1 = core_busy_s(DAEMON_CORE)
        arrivals = [np.asarray(c.arrival_ns, dtype=np.int64) for c in load.calls]
        active = load.active()
        await load.hangup_all(settle_s=1.0)
        await load.close()
        return {
            "calls": n,
            "active_at_end": active,
            "calls_with_media": sum(1 for a in arrivals if a.size),
            "messages": int(sum(a.size for a in arrivals)),
            "messages_per_call_s": round(sum(a.size for a in arrivals) / n / measure_s, 1),
            **_pacing_figures(arrivals),
            "daemon_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 1),
            # CPU that other processes used on the daemon's core (a shared machine)
            "core0_other_pct": round(100 * max(0.0, k1[0] - k0[0] - (c1 - c0)) / (t1 - t0), 1),
        }

    before = {c["call_id"] for c in d.cdr_lines()}
    try:
        out = asyncio.run(run())
    finally:
        if capture is not None:
            capture.stop()
    if capture is not None and len(window) == 2:
        wire = list(capture.media_departures(window[0], window[1]).values())
        out["wire"] = {
            "calls_with_media": sum(1 for a in wire if a.size),
            "messages": int(sum(a.size for a in wire)),
            "capture_packets": capture.received,
            "capture_dropped_packets": capture.dropped,
            **_pacing_figures(wire),
        }
        capture.path.unlink(missing_ok=True)
    time.sleep(0.5)
    out.update(_cdr_figures(d, {c["call_id"] for c in d.cdr_lines()} - before))
    return out


def _pacing_figures(arrivals: list[np.ndarray]) -> dict[str, Any]:
    inter = [interarrival_dev_ns(a) for a in arrivals]
    grid = [ws_deviations_ns(a, LEAD_FRAMES)[1] for a in arrivals]
    worst = [float(np.percentile(np.abs(g), 99)) / 1e6 for g in grid if g.size]
    cat = np.concatenate
    return {
        "interarrival_dev": _ms(cat(inter) if inter else np.zeros(0)),
        "grid_dev": _ms(cat(grid) if grid else np.zeros(0)),
        "worst_call_grid_p99_ms": round(max(worst), 3) if worst else None,
    }


def pacing(counts: list[int], measure_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pin_self()
    print(
        f"{'calls':>5} {'seen at':<7} {'msgs':>6} {'ia p50':>7} {'ia p99':>7} {'ia max':>7}"
        f" {'grid p50':>8} {'grid p99':>8} {'grid max':>8} {'worst99':>8} {'cpu %':>6}"
        f" {'core0+%':>7} {'undr':>5}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        tts = TtsProcess.start(wd)
        d = DaemonUnderTest.start(wd, tts.port)
        capture_dir = wd if WireCapture.available() else None
        if capture_dir is None:
            print("(no dumpcap or not root: carrier figures only)")
        try:
            for n in counts:
                r = pacing_step(d, n, measure_s, warm_s=2.0, workdir=capture_dir)
                out[f"twilio_{n}"] = r
                for where, fig in (("carrier", r), ("wire", r.get("wire"))):
                    if fig is None:
                        continue
                    ia, g = fig["interarrival_dev"], fig["grid_dev"]
                    print(
                        f"{n:>5} {where:<7} {fig['messages']:>6} {ia.get('p50_ms')!s:>7}"
                        f" {ia.get('p99_ms')!s:>7} {ia.get('max_ms')!s:>7}"
                        f" {g.get('p50_ms')!s:>8} {g.get('p99_ms')!s:>8} {g.get('max_ms')!s:>8}"
                        f" {fig['worst_call_grid_p99_ms']!s:>8} {r['daemon_cpu_pct']!s:>6}"
                        f" {r['core0_other_pct']!s:>7} {r.get('underruns')!s:>5}",
                        flush=True,
                    )
        finally:
            d.stop()
            tts.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-pacing", action="store_true")
    args = ap.parse_args()
    frames, reps = (5_000, 5) if args.quick else (20_000, 9)
    measure_s = 5.0 if args.quick else 20.0
    counts = [1, 20, 100]
    figures: dict[str, Any] = {"engine_cpu": engine_cpu(frames, reps)}
    figures["shell_cpu"] = shell_cpu(frames, reps)
    if not args.no_pacing:
        figures["pacing"] = pacing(counts, measure_s)
    path = write(
        "streams",
        figures,
        {
            "engine_frames_per_rep": frames,
            "engine_reps": reps,
            "call_path_frames_per_rep": min(frames, CALL_PATH_FRAMES),
            "pacing_counts": counts if not args.no_pacing else [],
            "pacing_measure_s": measure_s,
            "lead_frames": LEAD_FRAMES,
            "pacing_setup": "callbridge serve (uvloop) core 0; ttsd + lean carrier core 1; "
            "route talk (kova mulaw/8000, continuous)",
            "cpus": os.cpu_count(),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Time to first audio through the local TTS server, per provider protocol,
and the CPU the daemon spends per second of provider audio.

``speak()`` → first ``AudioReceived`` at the Call's sink, over loopback with
a warm connection: the client's own overhead (tone engine: synthesis is
instant). Then Piper's time to first audio for a one-sentence greeting.

The provider path (``--path-only`` runs just this): the reference server
(Kova, ``tone`` engine, as the capacity benchmark runs it) in its own
process; here ``N`` turns of the capacity benchmark's ~15 s text spoken at
once through the real ``ProviderPool``/``Speaker`` (warm connections, up to
64 turns on one). The figure is this process's CPU (``time.process_time()``:
the websockets client reading frames, the engine's JSON and base64, the
dispatch to the sink) from the turns opened to the last ``TurnDone``,
divided by the seconds of audio received: CPU µs per second of turn audio,
the median of ``--reps`` repetitions. The server's CPU is not counted. A
digest of every event the sinks saw (types, turn ids, audio bytes, formats,
word timings) shows whether a change altered what reaches the call.

    python -m bench.bench_tts [--quick] [--path-only] [--turns N] [--reps R] [--profile]

The same path without the network, repeatable enough for callgrind
(``--record FILE`` keeps the bytes the server sent in one repetition,
``--replay FILE`` feeds them again, in their original reads, to a fresh pool
whose sockets write nowhere): this process's CPU from the first byte fed to
the last, per provider message, and the event digest, which must equal the
recorded run's. The replayed pool's ``preempt`` is a stand-in for
``MediaTicker.run_if_due`` when nothing is due (one clock read and a
compare), so the figure includes the preemption point the daemon pays.
``--replay-reps 0`` stops before feeding and ``-1`` feeds once without the
digest: under callgrind, the difference of the two runs' instructions is the
feed's.

    python -m bench.bench_tts --record FILE [--turns N] [--format F]
    python -m bench.bench_tts --replay FILE [--replay-reps R]

A prompt cache hit (``--cache-hit``): the greeting rendered once through the
reference server (in this process, ``tone`` engine) into the ``PromptCache``,
then ``--turns`` calls each open it as ``CallRunner`` does (a fresh
``CallBridge``, ``Say(cacheable=True)``, its ``OpenTurn``/``EndTurn`` to a
``Speaker`` on the same cache). The figure is the wall time from the turn's
``Say`` to the bridge's first frame ready (``frame_ready()``), p50/p99 (goal:
p99 <= 5 ms); written to ``bench/results/tts_cache_hit.json``.

    python -m bench.bench_tts --cache-hit [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import math
import pickle
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from bench.common import summary_ms, write
from bench.loadgen.procs import TALK_TEXT, TtsProcess
from bridge.commands import Say
from bridge.engine import Event
from bridge.io.embedded import PROTOCOL_PATHS
from bridge.io.provider_pool import PromptCache, ProviderPool, Speaker, engine_class
from bridge.io.provider_ws import Connection, _ProviderWebSocket
from bridge.io.ttsd_server import start_tts_server
from bridge.media.call import CallBridge
from bridge.media.call_types import CallOptions, EndTurn, LegProfile, OpenTurn
from bridge.providers.base import (
    MULAW_8K,
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnSettings,
    WordsTimed,
)

GREETING = "Welcome to callbridge, the open source telephony bridge."


async def ttfa(protocol: str, engine: str, turns: int, voice: str) -> list[float]:
    server = await start_tts_server(engine=engine)
    url = f"ws://127.0.0.1:{server.port}{PROTOCOL_PATHS[protocol]}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{server.port}"
    pool = ProviderPool(ProviderSettings("b", protocol, url, api_key="k", voice=voice))
    if not await pool.start():
        raise RuntimeError(f"{protocol}: warm connection failed")
    speaker = Speaker([pool])
    loop = asyncio.get_running_loop()
    out: list[float] = []
    for i in range(turns):
        first = loop.create_future()
        done = asyncio.Event()
        t0 = loop.time()

        def sink(
            e: Event, first: asyncio.Future[float] = first, done: asyncio.Event = done
        ) -> None:
            if isinstance(e, AudioReceived) and not first.done():
                first.set_result(loop.time())
            if isinstance(e, TurnDone | TurnFailed | ProviderFailed):
                done.set()

        speaker.speak(f"t{i}", GREETING, TurnSettings(voice, MULAW_8K), sink)
        out.append(await asyncio.wait_for(first, 30) - t0)
        await asyncio.wait_for(done.wait(), 60)
    await pool.close()
    await server.close()
    return out


PATH_FORMATS: dict[str, AudioFormat] = {
    "mulaw8k": MULAW_8K,  # pass-through: what a G.711 call asks for
    "pcm24k": AudioFormat("pcm_s16le", 24000),  # the capacity benchmark's PCM profile
}
TURNS_PER_CONNECTION = 64  # KovaProtocol.max_turns


_END_TYPES = (TurnDone, TurnFailed, ProviderFailed)


class _TurnRecord:
    """One turn's sink: keeps its events (cheap, inside the measured window); digest later."""

    def __init__(self, done: asyncio.Event) -> None:
        self.events: list[Event] = []
        self.done = done

    def __call__(self, e: Event) -> None:
        self.events.append(e)
        if type(e) in _END_TYPES:
            self.done.set()

    def audio_s(self) -> float:
        return sum(
            len(e.audio) / (e.audio_format.sample_rate_hz * e.audio_format.bytes_per_sample)
            for e in self.events
            if isinstance(e, AudioReceived)
        )

    def digest(self) -> bytes:
        """Types, turn ids, audio bytes and formats, word timings and end events, in order."""
        d = hashlib.sha256()
        for e in self.events:
            d.update(type(e).__name__.encode())
            d.update(str(getattr(e, "turn_id", "")).encode())
            if isinstance(e, AudioReceived):
                fmt = e.audio_format
                d.update(f"{fmt.encoding}/{fmt.sample_rate_hz}".encode())
                d.update(e.audio)
            elif isinstance(e, WordsTimed):
                d.update(repr(e.words).encode())
            else:
                d.update(repr(e).encode())
        return d.digest()


async def path_rep(
    port: int,
    fmt: AudioFormat,
    turns: int,
    prof: cProfile.Profile | None,
    record: list[tuple[int, bytes]] | None = None,
    protocol: str = "kova",
) -> dict[str, object]:
    """One repetition: ``turns`` turns at once through a fresh warm pool; daemon-side CPU."""
    url = f"ws://127.0.0.1:{port}{PROTOCOL_PATHS[protocol]}"
    if protocol == "zwst":
        url = f"http://127.0.0.1:{port}"
    settings = ProviderSettings("b", protocol, url, api_key="k", voice="tone")
    index: dict[int, int] = {}  # a recorded socket's connection index, once turns open
    if record is not None:  # patched before the sockets exist (the loop binds the method)
        original = _ProviderWebSocket.data_received

        def recording(ws: _ProviderWebSocket, data: bytes) -> None:
            i = index.get(id(ws))
            if i is not None:
                record.append((i, bytes(data)))
            original(ws, data)

        _ProviderWebSocket.data_received = recording  # type: ignore[method-assign]
    per_connection = min(TURNS_PER_CONNECTION, engine_class(protocol).max_turns)
    pool = ProviderPool(settings, warm=math.ceil(turns / per_connection))
    if not await pool.start():
        raise RuntimeError(f"{protocol}: warm connection failed")
    while not all(c.engine.ready for c in pool.connections):
        await asyncio.sleep(0.01)
    speaker = Speaker([pool])
    records = [_TurnRecord(asyncio.Event()) for _ in range(turns)]
    index.update({id(c.ws): i for i, c in enumerate(pool.connections)})  # record from here on
    if prof is not None:
        prof.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i, rec in enumerate(records):
        speaker.speak(f"t{i}", TALK_TEXT, TurnSettings("tone", fmt), rec)
    await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in records)), 120)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    if prof is not None:
        prof.disable()
    if record is not None:
        _ProviderWebSocket.data_received = original  # type: ignore[method-assign]
    await pool.close()
    audio_s = sum(r.audio_s() for r in records)
    digest = hashlib.sha256(b"".join(r.digest() for r in records)).hexdigest()
    ends = {type(r.events[-1]).__name__ for r in records}
    if ends != {"TurnDone"}:
        raise RuntimeError(f"turns ended with {ends}")
    return {
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "audio_s": audio_s,
        "cpu_us_per_audio_s": 1e6 * cpu_s / audio_s,
        "digest": digest,
    }


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # the daemon's loop (event_loop = "uvloop")

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def provider_path(
    turns: int, reps: int, profile: bool, formats: list[str] | None = None, protocol: str = "kova"
) -> dict[str, object]:
    """CPU µs per second of turn audio, per format, medians over ``reps``."""
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ttsd = TtsProcess.start(Path(tmp))
        try:
            print(f"\nprovider path: {protocol}, {turns} turns at once, {reps} reps, daemon CPU")
            print(f"{'format':<9} {'cpu µs/audio s':>15} {'spread':>17} {'audio s':>9} digest")
            for name, fmt in PATH_FORMATS.items():
                if formats and name not in formats:
                    continue
                runs = []
                for _ in range(reps):
                    loop = _new_loop()
                    try:
                        rep = path_rep(ttsd.port, fmt, turns, None, protocol=protocol)
                        runs.append(loop.run_until_complete(rep))
                    finally:
                        loop.close()
                per_s = [float(r["cpu_us_per_audio_s"]) for r in runs]  # type: ignore[arg-type]
                digests = {str(r["digest"]) for r in runs}
                fig = {
                    "cpu_us_per_audio_s_median": round(statistics.median(per_s), 1),
                    "cpu_us_per_audio_s_min": round(min(per_s), 1),
                    "cpu_us_per_audio_s_max": round(max(per_s), 1),
                    "cpu_us_per_audio_s_all": [round(v, 1) for v in per_s],
                    "audio_s_per_rep": round(float(runs[0]["audio_s"]), 3),  # type: ignore[arg-type]
                    "cpu_s_median": round(statistics.median(float(r["cpu_s"]) for r in runs), 4),  # type: ignore[arg-type]
                    "digest": sorted(digests)[0] if len(digests) == 1 else sorted(digests),
                }
                out[name] = fig
                spread = f"{fig['cpu_us_per_audio_s_min']}-{fig['cpu_us_per_audio_s_max']}"
                print(
                    f"{name:<9} {fig['cpu_us_per_audio_s_median']:>15} {spread:>17} "
                    f"{fig['audio_s_per_rep']:>9} {str(fig['digest'])[:16]}"
                )
                if profile:
                    prof = cProfile.Profile()
                    loop = _new_loop()
                    try:
                        loop.run_until_complete(
                            path_rep(ttsd.port, fmt, turns, prof, protocol=protocol)
                        )
                    finally:
                        loop.close()
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                    print(text.getvalue())
        finally:
            ttsd.stop()
    return out


# ------------------------------------------------------ record and replay


def record_path(file: Path, turns: int, fmt_name: str) -> None:
    """One repetition against the real server, its reads kept in ``file``."""
    with tempfile.TemporaryDirectory() as tmp:
        ttsd = TtsProcess.start(Path(tmp))
        try:
            chunks: list[tuple[int, bytes]] = []
            loop = _new_loop()
            try:
                fig = loop.run_until_complete(
                    path_rep(ttsd.port, PATH_FORMATS[fmt_name], turns, None, chunks)
                )
            finally:
                loop.close()
        finally:
            ttsd.stop()
    recording = {
        "format": fmt_name,
        "turns": turns,
        "connections": math.ceil(turns / TURNS_PER_CONNECTION),
        "chunks": chunks,
        "digest": fig["digest"],
    }
    file.write_bytes(pickle.dumps(recording))
    print(f"recorded {len(chunks)} reads, {_messages(chunks)} messages, digest {fig['digest']}")


def _messages(chunks: list[tuple[int, bytes]]) -> int:
    """How many data frames (text or binary) the reads carry."""
    streams: dict[int, bytearray] = {}
    for i, data in chunks:
        streams.setdefault(i, bytearray()).extend(data)
    n = 0
    for buf in streams.values():
        pos = 0
        while pos + 2 <= len(buf):
            length, head = buf[pos + 1] & 0x7F, pos + 2
            if length >= 126:
                extra = 2 if length == 126 else 8
                length, head = int.from_bytes(buf[head : head + extra], "big"), head + extra
            n += (buf[pos] & 0x0F) in (1, 2)
            pos = head + length
    return n


class _NullTransport:
    """A transport that takes every write and has nothing buffered."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, data: object) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _NotDue:
    """``MediaTicker.run_if_due`` when nothing is due: its attribute reads, a clock read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time
        self._armed_at: float | None = 1e18
        self._arm_offset_s = 0.0005

    def run_if_due(self) -> None:
        armed_at = self._armed_at
        if armed_at is None or self.now() < armed_at + self._arm_offset_s:
            return
        raise AssertionError("never due")


async def replay_rep(recording: dict[str, object], feed: bool, check: bool) -> dict[str, object]:
    """The recorded reads fed to a fresh pool (sockets writing nowhere); CPU of the feed.

    ``check``: compute the digest of what the sinks saw (after the measured feed).
    """
    loop = asyncio.get_running_loop()
    fmt = PATH_FORMATS[str(recording["format"])]
    turns = int(recording["turns"])  # type: ignore[call-overload]
    url = f"ws://127.0.0.1:9{PROTOCOL_PATHS['kova']}"
    settings = ProviderSettings("b", "kova", url, api_key="k", voice="tone")
    n_conns = int(recording["connections"])  # type: ignore[call-overload]
    pool = ProviderPool(settings, warm=n_conns, preempt=_NotDue(loop).run_if_due)
    sockets = []
    for _ in range(n_conns):
        conn = Connection(pool, pool.engine_cls(settings))
        pool.connections.append(conn)
        protocol = ClientProtocol(parse_uri(url))
        request = protocol.connect()
        protocol.send_request(request)
        ws = _ProviderWebSocket(protocol, on_message=conn._on_message)
        ws.connection_made(_NullTransport())  # type: ignore[arg-type]
        accept = accept_key(request.headers["Sec-WebSocket-Key"])
        ws.data_received(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
        )
        if protocol.state is not State.OPEN:
            raise RuntimeError("the replayed socket's handshake did not complete")
        conn.ws = ws
        conn.early = None
        conn.engine.connection_made(None, loop.time())
        conn.pump()
        sockets.append(ws)
    speaker = Speaker([pool])
    records = [_TurnRecord(asyncio.Event()) for _ in range(turns)]
    for i, rec in enumerate(records):
        speaker.speak(f"t{i}", TALK_TEXT, TurnSettings("tone", fmt), rec)
    chunks: list[tuple[int, bytes]] = recording["chunks"]  # type: ignore[assignment]
    if not feed:
        return {}
    cpu0 = time.process_time()
    for i, data in chunks:
        sockets[i].data_received(data)
    cpu_s = time.process_time() - cpu0
    if not check:
        return {"cpu_s": cpu_s}
    digest = hashlib.sha256(b"".join(r.digest() for r in records)).hexdigest()
    return {"cpu_s": cpu_s, "digest": digest}


def replay_path(file: Path, reps: int) -> None:
    recording = pickle.loads(file.read_bytes())
    chunks = recording["chunks"]
    n = _messages(chunks)
    what = f"{recording['format']}, {recording['turns']} turns"
    print(f"replay: {what}, {len(chunks)} reads, {n} messages")
    per_msg = []
    for _ in range(max(reps, 1)):
        loop = _new_loop()
        try:
            fig = loop.run_until_complete(replay_rep(recording, feed=reps != 0, check=reps > 0))
        finally:
            loop.close()
        if reps <= 0:  # for callgrind: the setup alone (0), or one feed, unchecked (-1)
            print("setup only" if reps == 0 else "one feed, unchecked")
            return
        if fig["digest"] != recording["digest"]:
            raise RuntimeError(f"digest {fig['digest']} != recorded {recording['digest']}")
        per_msg.append(1e6 * float(fig["cpu_s"]) / n)  # type: ignore[arg-type]
    print(
        f"cpu µs per message: median {statistics.median(per_msg):.3f} "
        f"(min {min(per_msg):.3f}, max {max(per_msg):.3f}, {len(per_msg)} reps); digest ok"
    )


async def _render_greeting(cache: PromptCache) -> ProviderSettings:
    server = await start_tts_server(engine="tone")
    try:
        pool = ProviderPool(ProviderSettings("local", "kova", server.url("kova"), voice="tone"))
        await pool.start()
        done = asyncio.Event()

        def sink(event: Event) -> None:
            if isinstance(event, TurnDone | TurnFailed):
                done.set()

        Speaker([pool], cache).speak(
            "greeting", GREETING, TurnSettings("tone", MULAW_8K), sink, cacheable=True
        )
        await asyncio.wait_for(done.wait(), 30)
        await pool.close()
        return pool.settings
    finally:
        await server.close()


def cache_hit_first_frame(turns: int) -> list[float]:
    """Seconds from a cached greeting's ``Say`` to its first frame ready, per call."""
    cache = PromptCache()
    provider = asyncio.run(_render_greeting(cache))
    assert len(cache) == 1, "the greeting did not render"
    leg = LegProfile(kind="sip", codec="mulaw", sample_rate_hz=8000, heard_from="frames")

    class _Pool:  # a cache hit never reaches the provider: the pool is only its key
        name = "local"
        settings = provider
        prompt_identity: str | None = None

    pool = _Pool()
    out: list[float] = []
    for n in range(turns):
        bridge = CallBridge(f"call-{n}", leg, None, 0.0, options=CallOptions(default_voice="tone"))
        speaker = Speaker([pool], cache)  # type: ignore[list-item]
        first: list[float] = []

        def sink(event: Event, bridge: CallBridge = bridge, first: list[float] = first) -> None:
            bridge.provider_event(event, 0.001)
            if not first and bridge.frame_ready():
                first.append(time.perf_counter())

        started = time.perf_counter()
        bridge.execute(Say("greeting", GREETING, cacheable=True), 0.001)
        opened: OpenTurn | None = None
        for action in bridge.actions_to_send():
            if isinstance(action, OpenTurn):
                opened = action
            elif isinstance(action, EndTurn) and opened is not None:
                speaker.speak(action.turn_id, GREETING, opened.settings, sink, cacheable=True)
        if not first:
            raise SystemExit("a cache hit queued no frame")
        out.append(first[0] - started)
    assert cache.renders == 1 and cache.hits == turns
    return out


def _row(protocol: str, engine: str, s: dict[str, float]) -> None:
    print(
        f"{protocol:<12} {engine:<6} {s['n']:>5} {s['p50_ms']:>8} {s['p95_ms']:>8} {s['p99_ms']:>8}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--path-only", action="store_true", help="only the provider path figure")
    ap.add_argument("--turns", type=int, default=50, help="provider path: turns at once")
    ap.add_argument("--reps", type=int, default=0, help="provider path: repetitions")
    ap.add_argument("--profile", action="store_true", help="provider path: cProfile one rep")
    ap.add_argument(
        "--format", action="append", choices=sorted(PATH_FORMATS), help="provider path: only these"
    )
    ap.add_argument("--record", type=Path, help="keep one provider path run's reads in FILE")
    ap.add_argument("--replay", type=Path, help="feed a recorded run again, no network")
    ap.add_argument(
        "--replay-reps", type=int, default=9, help="replay: repetitions (0: setup, -1: one feed)"
    )
    ap.add_argument(
        "--protocol",
        default="kova",
        choices=["kova", "kugelaudio", "coda", "zwst"],
        help="provider path: the protocol (results are written for kova only)",
    )
    ap.add_argument("--cache-hit", action="store_true", help="only the prompt cache hit figure")
    args = ap.parse_args()
    if args.cache_hit:
        s = summary_ms(cache_hit_first_frame(args.turns))
        print(f"cache hit, Say to first frame ready: {s} (goal: p99 <= 5 ms)")
        settings = {"turns": args.turns, "text": GREETING, "format": "mulaw/8000"}
        print(f"wrote {write('tts_cache_hit', {'cache_hit_first_frame': s}, settings)}")
        return
    if args.protocol != "kova":
        provider_path(args.turns, args.reps or 5, args.profile, args.format, args.protocol)
        return
    if args.record is not None:
        record_path(args.record, args.turns, (args.format or ["mulaw8k"])[0])
        return
    if args.replay is not None:
        replay_path(args.replay, args.replay_reps)
        return
    reps = args.reps or (5 if args.quick else 9)
    path_figures = provider_path(args.turns, reps, args.profile, args.format)
    path = write(
        "tts_provider_path",
        path_figures,
        {
            "turns_at_once": args.turns,
            "reps": reps,
            "provider": "reference server, kova, tone engine, own process",
            "text": TALK_TEXT,
            "measure": "daemon-side time.process_time() per second of audio received",
        },
    )
    print(f"wrote {path}")
    if args.path_only:
        return
    turns = 20 if args.quick else 200
    figures: dict[str, object] = {}
    print(f"{'protocol':<12} {'engine':<6} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for protocol in ["kova", "kugelaudio", "coda", "zwst"]:
        s = summary_ms(asyncio.run(ttfa(protocol, "tone", turns, "tone")))
        figures[f"{protocol}_tone"] = s
        _row(protocol, "tone", s)
    try:
        s = summary_ms(asyncio.run(ttfa("kova", "piper", 3 if args.quick else 10, "joe")))
        figures["kova_piper_greeting"] = s
        _row("kova", "piper", s)
    except ImportError as e:
        print(f"piper not installed ({e}); install the local-tts extra")
    path = write("tts", figures, {"turns": turns, "text": GREETING, "format": "mulaw/8000"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

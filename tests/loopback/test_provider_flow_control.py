"""Flow control and turn placement on provider connections (``Connection``, ``ProviderPool``).

A connection is one FIFO: a turn's audio waits behind whatever the provider
queued before it for the other turns on it. So a new turn goes to the
connection with the fewest turns open; and with flow control on (off by
default), a connection stops reading while every turn on it is well ahead of
its playout (what the provider sends beyond that stays in its socket
buffers) and reads again as soon as one needs audio.

These drive real Kova engines over fake provider sockets whose transport
delivers bytes only while it is reading, on a fake clock (the event loop's
``time``): deterministic, no sleeps, no network.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from provider_socket import FakeTransport, open_provider_socket

from bridge.engine import Event
from bridge.io.provider_pool import FLOW_HIGH_S, FLOW_PAUSE_MAX_S, ProviderPool
from bridge.io.provider_ws import Connection
from bridge.providers.base import MULAW_8K, AudioReceived, ProviderSettings, TurnSettings

URL = "ws://127.0.0.1:9/v1/kova"
SETTINGS = ProviderSettings("p", "kova", URL, api_key="k", voice="v")
TURN = TurnSettings("v", MULAW_8K)
BYTES_PER_S = 8000  # mu-law 8 kHz


class ReadingTransport(FakeTransport):
    """Bytes the provider sent, handed to the socket in reads only while it is reading."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.pauses = 0
        self.resumes = 0
        self.kernel: deque[bytes] = deque()

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.pauses += 1

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self.resumes += 1


def ws_frame(text: str) -> bytes:
    """One unmasked server-to-client text frame."""
    data = text.encode()
    n = len(data)
    if n < 126:
        return bytes((0x81, n)) + data
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + data
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + data


def kova(body: dict[str, object], ctx: str) -> bytes:
    return ws_frame(json.dumps({**body, "context_id": ctx}, separators=(",", ":")))


def chunk(audio: bytes, ctx: str) -> bytes:
    return kova({"audio_chunk": base64.b64encode(audio).decode()}, ctx)


class Rig:
    """A pool whose connections are fake sockets, on a fake clock."""

    def __init__(self, pool: ProviderPool, clock: list[float]) -> None:
        self.pool = pool
        self.clock = clock
        self.events: dict[str, list[Event]] = {}
        self.handles: dict[str, Any] = {}

    def connect(self) -> tuple[Connection, ReadingTransport]:
        pool = self.pool
        conn = Connection(pool, pool.engine_cls(pool.settings))
        pool.connections.append(conn)
        ws = open_provider_socket(conn._on_message, URL)
        transport = ReadingTransport()
        ws.transport = transport  # type: ignore[assignment]
        ws.after_read = conn._after_read
        conn.ws = ws
        conn.early = None
        conn.ready_event.set()
        conn.engine.connection_made(None, conn.now())
        conn.pump()  # (lists it as idle, as the pool's own connections are)
        return conn, transport

    def open(self, turn_id: str) -> Connection:
        """Open a turn on the pool; returns the connection it went to."""
        events = self.events.setdefault(turn_id, [])
        handle = self.pool.open_turn(turn_id, TURN, events.append)
        handle.send_text("hello")
        self.handles[turn_id] = handle
        return handle.conn

    @staticmethod
    def read(conn: Connection, transport: ReadingTransport, max_bytes: int = 1 << 18) -> bool:
        """One read of what the provider sent, if the socket is reading; True if one happened."""
        if not transport.reading or not transport.kernel:
            return False
        data = b""
        while transport.kernel and len(data) + len(transport.kernel[0]) <= max_bytes:
            data += transport.kernel.popleft()
        if not data:
            data = transport.kernel.popleft()
        assert conn.ws is not None
        conn.ws.data_received(data)
        return True

    async def advance(self, seconds: float) -> None:
        """Move the clock and let the loop run what fell due."""
        self.clock[0] += seconds
        for _ in range(3):
            await asyncio.sleep(0)

    def audio(self, turn_id: str) -> bytes:
        return b"".join(e.audio for e in self.events[turn_id] if isinstance(e, AudioReceived))


def run(body: Callable[[Rig], Awaitable[None]], **pool_kwargs: Any) -> None:
    pool_kwargs.setdefault("flow_high_s", FLOW_HIGH_S)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = [1000.0]
        loop.time = lambda: clock[0]  # type: ignore[method-assign]
        await body(Rig(ProviderPool(SETTINGS, **pool_kwargs), clock))

    asyncio.run(main())


def start(conn: Connection, transport: ReadingTransport, ctx: str) -> None:
    transport.kernel.append(kova({"context_started": {}}, ctx))
    Rig.read(conn, transport)


# ------------------------------------------------------------------ placement


def test_a_new_turn_goes_to_the_connection_with_the_fewest_turns_open() -> None:
    async def body(rig: Rig) -> None:
        a, _ = rig.connect()
        b, b_transport = rig.connect()
        c, _ = rig.connect()
        assert rig.open("t1") is a  # all empty: the first
        assert rig.open("t2") is b
        assert rig.open("t3") is c
        assert rig.open("t4") is a
        assert rig.open("t5") is b
        assert rig.open("t6") is c  # a 2, b 2, c 1
        rig.handles["t2"].end()  # b's first turn ends: b 1, a 2, c 2
        start(b, b_transport, "c1")
        b_transport.kernel.append(kova({"flush_completed": True, "flush_id": "f1"}, "c1"))
        b_transport.kernel.append(kova({"context_closed": True}, "c1"))  # the server let go
        rig.read(b, b_transport)
        assert b.engine.open_turns() == 1
        assert type(rig.events["t2"][-1]).__name__ == "TurnDone"
        assert rig.open("t7") is b

    run(body)


def test_a_ready_connection_is_preferred_to_one_still_handshaking() -> None:
    async def body(rig: Rig) -> None:
        ready, _ = rig.connect()
        handshaking = Connection(rig.pool, rig.pool.engine_cls(SETTINGS))
        rig.pool.connections.insert(0, handshaking)  # first in the list, no turn on it
        assert rig.open("t1") is ready
        assert rig.open("t2") is ready  # one turn on it still beats waiting for a handshake
        assert handshaking.sinks == {}

    run(body)


def test_turns_per_connection_opens_another_connection_when_every_one_holds_that_many() -> None:
    async def body(rig: Rig) -> None:
        a, _ = rig.connect()
        b, _ = rig.connect()
        for i in range(4):
            rig.open(f"t{i}")
        assert len(a.sinks) == len(b.sinks) == 2
        conn = rig.open("t4")
        assert conn not in (a, b) and len(rig.pool.connections) == 3
        assert conn.task is not None
        conn.task.cancel()

    run(body, turns_per_connection=2)


def _cancel_opened(rig: Rig, before: list[Connection]) -> list[Connection]:
    """The connections the pool opened itself since ``before`` (their handshakes stopped)."""
    opened = [c for c in rig.pool.connections if c not in before]
    for conn in opened:
        assert conn.task is not None
        conn.task.cancel()
    return opened


def test_a_spare_connection_opens_once_no_connection_has_room_for_another_turn() -> None:
    async def body(rig: Rig) -> None:
        a, _ = rig.connect()
        b, _ = rig.connect()
        assert rig.open("t1") is a
        assert rig.pool.connections == [a, b]  # b has room: nothing to open
        assert rig.open("t2") is b
        # every connection holds as many turns as it may: the next turn would wait for a
        # whole handshake, so one starts now, in the background
        (spare,) = _cancel_opened(rig, [a, b])
        assert spare.sinks == {} and not spare.ready_event.is_set()
        assert rig.open("t3") is spare  # its handshake began a turn earlier
        assert len(_cancel_opened(rig, [a, b, spare])) == 1  # and one for the turn after

    run(body, turns_per_connection=1)


def _end_turn(rig: Rig, turn_id: str, transport: ReadingTransport, ctx: str) -> None:
    """``turn_id`` ends and the server lets go of its context ``ctx``."""
    conn = rig.handles[turn_id].conn
    rig.handles[turn_id].end()
    start(conn, transport, ctx)
    transport.kernel.append(kova({"flush_completed": True, "flush_id": "f1"}, ctx))
    transport.kernel.append(kova({"context_closed": True}, ctx))
    rig.read(conn, transport)


def test_a_turn_takes_a_connection_without_one_without_looking_at_the_others(
    monkeypatch: Any,
) -> None:
    async def body(rig: Rig) -> None:
        links = [rig.connect() for _ in range(50)]
        for i in range(50):
            assert rig.open(f"t{i}") is links[i][0]
        _cancel_opened(rig, [c for c, _ in links])  # (the spare)
        _end_turn(rig, "t17", links[17][1], "c1")
        looked: list[Connection] = []
        real = Connection.has_room
        monkeypatch.setattr(Connection, "has_room", lambda c: looked.append(c) or real(c))
        assert rig.open("next") is links[17][0]
        assert looked == []  # placed from the idle list: no scan of 50 connections

    run(body, turns_per_connection=1)


def test_a_connection_whose_cancelled_turn_the_server_still_holds_waits_for_its_release() -> None:
    async def body(rig: Rig) -> None:
        a, a_transport = rig.connect()
        b, _ = rig.connect()
        rig.open("t1")  # on a
        start(a, a_transport, "c1")
        rig.handles["t1"].cancel()  # the call hung up: close_context sent, not yet answered
        assert a.sinks == {} and a.engine.open_turns() == 1
        assert rig.open("t2") is b  # a still holds t1's context
        a_transport.kernel.append(kova({"context_closed": True}, "c1"))
        rig.read(a, a_transport)  # the server lets go: a is free again
        assert rig.open("t3") is a
        _cancel_opened(rig, [a, b])

    run(body, turns_per_connection=1)


def test_without_turns_per_connection_a_spare_opens_only_at_the_protocol_limit() -> None:
    async def body(rig: Rig) -> None:
        a, _ = rig.connect()
        limit = a.engine.max_turns
        for i in range(limit - 1):
            rig.open(f"t{i}")
        assert rig.pool.connections == [a]
        rig.open("last")
        assert len(_cancel_opened(rig, [a])) == 1

    run(body)


def test_without_turns_per_connection_a_connection_fills_to_the_protocol_limit() -> None:
    async def body(rig: Rig) -> None:
        a, _ = rig.connect()
        for i in range(10):
            assert rig.open(f"t{i}") is a
        assert len(rig.pool.connections) == 1

    run(body)


# --------------------------------------------------------------- flow control


async def _two_turns_ahead(rig: Rig, seconds: tuple[float, float]) -> tuple[Connection, Any]:
    conn, transport = rig.connect()
    rig.open("a")
    rig.open("b")
    start(conn, transport, "c1")
    start(conn, transport, "c2")
    for ctx, s in zip(("c1", "c2"), seconds, strict=True):
        transport.kernel.append(chunk(b"\x55" * int(s * BYTES_PER_S), ctx))
    assert rig.read(conn, transport)
    return conn, transport


def test_a_connection_stops_reading_when_every_turn_is_well_ahead() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 9.0))
        assert transport.pauses == 1 and conn.paused
        assert conn.flow_timer is not None
        assert conn.flow_timer.when() == 1000.0 + FLOW_PAUSE_MAX_S  # at the latest

    run(body)


def test_no_pause_while_one_turn_is_not_well_ahead() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 3.0))
        assert transport.pauses == 0 and not conn.paused

    run(body)


def test_no_pause_while_a_turn_has_no_audio_yet() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = rig.connect()
        rig.open("a")
        rig.open("b")
        start(conn, transport, "c1")
        transport.kernel.append(chunk(b"\x55" * 10 * BYTES_PER_S, "c1"))
        rig.read(conn, transport)
        assert transport.pauses == 0

    run(body)


def test_no_pause_while_a_keepalive_ping_awaits_its_pong() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = rig.connect()
        assert conn.ws is not None
        conn.ws.ping_data = b"ping"  # a keepalive ping awaits its pong
        rig.open("a")
        start(conn, transport, "c1")
        transport.kernel.append(chunk(b"\x55" * 10 * BYTES_PER_S, "c1"))
        rig.read(conn, transport)
        assert transport.pauses == 0

    run(body)


def test_flow_control_off() -> None:
    async def body(rig: Rig) -> None:
        _conn, transport = await _two_turns_ahead(rig, (10.0, 10.0))
        assert transport.pauses == 0

    run(body, flow_high_s=None)


def test_reading_resumes_when_the_neediest_turn_runs_low() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 4.25))
        assert conn.paused and conn.flow_timer is not None
        assert conn.flow_timer.when() == 1000.75  # b is down to 3.5 s ahead then
        await rig.advance(0.5)
        assert conn.paused
        await rig.advance(0.25)
        assert not conn.paused and transport.reading and transport.resumes == 1

    run(body, flow_low_s=3.5)


def test_a_pause_ends_after_the_longest_pause_even_if_every_turn_is_still_ahead() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 10.0))
        await rig.advance(FLOW_PAUSE_MAX_S)
        assert transport.reading and transport.resumes == 1
        # the next read is judged afresh: still well ahead, so it pauses again
        transport.kernel.append(chunk(b"\x55" * 80, "c1"))
        rig.read(conn, transport)
        assert transport.pauses == 2

    run(body)


def test_a_pause_outlasts_a_read_of_a_fast_provider() -> None:
    """One read can take 256 KB (uvloop's buffer): about 4 s of 24 kHz PCM in base64.
    A pause shorter than that let a paused turn be read faster than it plays, with no
    bound on its read-ahead."""
    assert FLOW_PAUSE_MAX_S >= 256 * 1024 * 3 / 4 / 48000
    assert FLOW_PAUSE_MAX_S < 20.0  # the keepalive's ping_timeout: a pong waits behind a pause


def test_cancelling_the_last_turn_of_a_paused_connection_resumes_it_at_once() -> None:
    """What is left of the cancelled turn (and the server's release of it) is read now,
    not when the pause would have ended: until then the connection takes no turn."""

    async def body(rig: Rig) -> None:
        conn, transport = rig.connect()
        rig.open("a")
        start(conn, transport, "c1")
        transport.kernel.append(chunk(b"\x55" * 10 * BYTES_PER_S, "c1"))
        assert rig.read(conn, transport)
        assert conn.paused and transport.pauses == 1
        rig.handles["a"].cancel()
        assert transport.reading and not conn.paused and conn.flow_timer is None

    run(body)


def test_ending_one_of_two_turns_leaves_a_paused_connection_paused() -> None:
    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 10.0))
        assert conn.paused
        rig.handles["a"].cancel()
        assert conn.paused and not transport.reading

    run(body)


def test_a_new_turn_on_a_paused_connection_resumes_it_at_once() -> None:
    """A restarting turn does not wait for the pause to end: its first audio comes next read."""

    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 10.0))
        assert conn.paused
        assert rig.open("c") is conn
        assert transport.reading and not conn.paused and conn.flow_timer is None
        start(conn, transport, "c3")
        transport.kernel.append(chunk(b"\x01\x02", "c3"))
        assert rig.read(conn, transport)
        assert rig.audio("c") == b"\x01\x02"
        assert transport.pauses == 1  # c has 2 bytes ahead: the connection keeps reading

    run(body)


def test_a_restarting_turn_goes_to_the_connection_without_a_backlog() -> None:
    """Connection a is paused with its turns' audio queued behind it; the new turn goes to b
    (fewer turns) and gets its first audio in b's next read, a's queue untouched."""

    async def body(rig: Rig) -> None:
        a, a_t = rig.connect()
        b, b_t = rig.connect()
        assert rig.open("a1") is a and rig.open("b1") is b and rig.open("a2") is a
        start(a, a_t, "c1")
        start(a, a_t, "c2")
        a_t.kernel.extend(chunk(b"\x55" * 8000 * 8, ctx) for ctx in ("c1", "c2"))
        rig.read(a, a_t)
        a_t.kernel.extend(chunk(b"\x55" * 8000, ctx) for ctx in ("c1", "c2") for _ in range(50))
        assert a.paused and len(a_t.kernel) == 100
        rig.handles["b1"].cancel()
        b_t.kernel.append(kova({"context_closed": True}, "c1"))
        rig.read(b, b_t)
        assert rig.open("restart") is b
        start(b, b_t, "c2")
        b_t.kernel.append(chunk(b"\x01", "c2"))
        assert rig.read(b, b_t)
        assert rig.audio("restart") == b"\x01"
        assert a.paused and len(a_t.kernel) == 100

    run(body)


def test_a_new_turn_goes_to_a_reading_connection_before_a_paused_one() -> None:
    """A paused connection's turns have audio queued in front of a new turn's first audio."""

    async def body(rig: Rig) -> None:
        conn, transport = await _two_turns_ahead(rig, (10.0, 10.0))
        assert conn.paused
        other, _ = rig.connect()
        for i in range(3):
            rig.open(f"x{i}")
        assert len(other.sinks) == 3 and len(conn.sinks) == 2  # more turns, but reading
        other.paused = True
        assert rig.open("y") is conn  # both paused: the fewest turns
        assert not conn.paused and transport.resumes == 1

    run(body)


def test_every_byte_reaches_its_turn_in_order_through_pauses() -> None:
    """Three turns, 30 s of audio each sent at once in small chunks, read 4 KB at a time
    while the connection reads; the clock moves 20 ms a step."""

    async def body(rig: Rig) -> None:
        conn, transport = rig.connect()
        sent: dict[str, bytes] = {}
        for i, name in enumerate(("a", "b", "c")):
            rig.open(name)
            start(conn, transport, f"c{i + 1}")
        pieces = []
        for n in range(300):  # 0.1 s per chunk, interleaved as a provider sends them
            for i, name in enumerate(("a", "b", "c")):
                audio = bytes([(n + i) % 256]) * 800
                sent[name] = sent.get(name, b"") + audio
                pieces.append(chunk(audio, f"c{i + 1}"))
        transport.kernel.extend(pieces)
        paused_steps = 0
        for _ in range(3000):  # 60 s of clock
            rig.read(conn, transport, max_bytes=4096)
            paused_steps += not transport.reading
            await rig.advance(0.02)
            if not transport.kernel:
                break
        assert not transport.kernel
        assert transport.pauses > 0 and paused_steps > 0
        for name in ("a", "b", "c"):
            assert rig.audio(name) == sent[name]

    run(body)


def test_a_zwst_pool_never_pauses() -> None:
    """zwst servers drop audio over ~2 s of send backlog and close a slow reader."""
    zwst = ProviderSettings("z", "zwst", "http://127.0.0.1:9/v1/sessions", api_key="k")
    assert ProviderPool(zwst, flow_high_s=FLOW_HIGH_S).flow_high_s is None
    assert ProviderPool(SETTINGS, flow_high_s=FLOW_HIGH_S).flow_high_s == FLOW_HIGH_S


def test_flow_control_is_off_by_default() -> None:
    assert ProviderPool(SETTINGS).flow_high_s is None

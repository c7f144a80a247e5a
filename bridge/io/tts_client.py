"""Provider connections: the asyncio shell around the ``bridge/tts/<protocol>.py`` engines.

``ProviderPool`` (one per configured provider) owns the WebSocket connections
to that provider. It keeps a warm connection open before the first call (time
to first audio must not include a handshake), multiplexes turns onto one
connection where the protocol allows it (``max_turns``), opens more
connections where it does not (KugelAudio: one turn per session), and
reconnects with capped, jittered exponential backoff. Each connection is
pumped the engine-contract way: messages in with ``loop.time()``, actions
out, events dispatched to the turn's sink, one timer re-armed from
``next_deadline()``.

``Speaker`` sits above the pools for one route: a failover chain of
providers (a turn that fails before its first audio is replayed on the next
provider with the text it had so far), the prompt cache, the fallback prompt
and the first-audio deadline (``bridge.providers.first_audio``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import importlib
import random
import socket
import termios
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import State

from bridge.engine import CloseConnection, Event, LocalProtocolError, SendBytes, SendText
from bridge.logs import get_logger
from bridge.providers.first_audio import FIRST_AUDIO_TIMEOUT_KIND, FirstAudioDeadlines
from bridge.providers.prompts import (
    Flight,
    PromptCache,
    PromptKey,
    TurnFellBack,
    Waiter,
    provider_identity,
)
from bridge.tts.base import (
    MULAW_8K,
    AudioFormat,
    AudioPiece,
    AudioReceived,
    ConnectionReady,
    HttpRequest,
    ProviderFailed,
    ProviderSettings,
    TtsProtocol,
    TurnDone,
    TurnFailed,
    TurnSettings,
    UsageReported,
    WordsPiece,
    WordsTimed,
    WordTiming,
)

__all__ = [
    "Backoff",
    "PromptCache",
    "ProviderPool",
    "Speaker",
    "TurnFellBack",
    "engine_class",
    "prompt_key",
    "render_prompt",
]

log = get_logger("callbridge.tts")
_INQ = array("i", [0])
"""``FIONREAD``'s answer (``_Connection.unread_bytes``)."""

Sink = Callable[[Event], None]
AudioSink = Callable[[bytes, AudioFormat], None]
"""A turn's audio, straight from the engine (``receive_*_fast``): no event object, no drain."""
WordsSink = Callable[[tuple[WordTiming, ...]], None]
"""A turn's word timings, straight from the engine, likewise."""

SEND_BUFFER_LIMIT_BYTES = 65_536
"""Above this much unsent data on a provider socket, messages wait for it to drain."""

FLOW_HIGH_S = 4.0
"""A connection stops reading while every turn on it has more than this many seconds of
audio received and not yet due to play, when flow control is on (``ProviderPool(flow_high_s=
FLOW_HIGH_S)``). It is off by default. Pausing holds back every turn on the connection:
with several turns on one, the others' audio then waits in the provider's and the kernel's
buffers in front of a restarted turn's first audio, where reading it at once would have
moved it into the calls' queues. With one turn per connection (``turns_per_connection =
1``) it holds back only its own turn. There, with a provider that sends faster than real
time, it keeps a restarted turn's first audio from waiting behind the other calls' bulk:
at 400 SIP calls of 24 kHz PCM, restarted turns' first audio took 38-143 ms (p50) with 4 s
ahead and 0.7-0.9 s without (``bench/bench_capacity.py``)."""
FLOW_LOW_S = 2.0
"""It reads again once one of its turns is down to this many seconds ahead."""
FLOW_PAUSE_MAX_S = 5.0
"""And at the latest after this long (a server close, a ping or a control message waits
behind the paused bytes; each resumed read is judged afresh). Under the keepalive's
``ping_timeout`` (20 s), so a pong behind paused bytes is read in time. Not much
shorter: one read takes up to 256 KB (uvloop's buffer), about 4 s of 24 kHz audio in
base64, so at 1 s (the value before) a paused turn was still read about 4 times
faster than it played, and its read-ahead was not bounded at all."""
PAUSED_LOAD = 1 << 20
"""Placement: what a paused connection adds to its count of turns (more than any has)."""
CLOSE_IDLE_AFTER_S = 60.0
"""A pool closes a connection that has held no turn for this long (``ProviderPool(
close_idle_after_s=...)``; provider key ``close_idle_after_s``), keeping the newest idle
one of each kind as the spare and never going below ``warm``. With one turn per
connection a pool opens one per call in progress; this hands them back after a peak."""
SESSION_TIMEOUT_S = 10.0
"""A session route's answer (zwst's POST) must be whole within this time."""
SESSION_REPLY_MAX_BYTES = 64 * 1024
"""And no larger than this (its JSON holds one URL)."""
BACKOFF_STABLE_S = 30.0
"""A connection that stayed up this long resets the pool's reconnect backoff, as does one
that carried a turn to its end; merely opening does not (a provider that accepts and then
closes, 1008 for a bad key, would otherwise be reconnected to at the base delay forever)."""
TURN_STALL_S = 10.0
"""A turn fails (``TurnFailed(kind="timeout")``) when the provider owes it a reply (text
sent since its last audio, or the turn ended and not done) and nothing came for this long."""
TURN_BASE_S = 15.0
TURN_S_PER_CHAR = 0.25
"""And when it is not done ``TURN_BASE_S`` + this much per character of its text + the
duration of the audio it sent, after its last text: about 4 characters a second, a quarter
of speech's rate, so a provider that trickles a frame every few seconds cannot hold a call
silent for ever, while one that sent a turn's audio has the time it takes to play."""
TURN_CHECK_S = 1.0
"""How often a connection with turns in progress looks at their deadlines."""
NO_FLOW_CONTROL = frozenset({"zwst"})
"""Protocols whose servers punish a client that lets their send queue grow (zwst drops
audio over ~2 s of backlog and closes a slow reader with 1008): never paused."""


def engine_class(protocol: str) -> type[TtsProtocol]:
    mod = importlib.import_module(f"bridge.tts.{protocol}")
    cls: type[TtsProtocol] = mod.ENGINE
    return cls


PoolKey = tuple[Any, ...] | None


def _pooling(protocol: str) -> tuple[Any, Any] | None:
    """``(pool_key, settings_for)`` for protocols whose session properties are per connection.

    zwst fixes voice and format per socket (session route): such a protocol
    module exposes ``pool_key(settings, turn)`` and ``settings_for(settings,
    voice, format)``, and the pool keeps separate connections per key.
    """
    mod = importlib.import_module(f"bridge.tts.{protocol}")
    if hasattr(mod, "pool_key") and hasattr(mod, "settings_for"):
        return mod.pool_key, mod.settings_for
    return None


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter (``random`` is injectable for tests)."""

    base_s: float = 0.25
    cap_s: float = 30.0
    attempt: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay_s(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class SessionRouteError(Exception):
    """A session route's answer that is no HTTP response, or too large."""


async def _http_request(req: HttpRequest) -> tuple[int, bytes]:
    """A minimal HTTP/1.1 client for session routes (no dependency for one POST).

    Bounded: the whole exchange within ``SESSION_TIMEOUT_S`` (else
    ``TimeoutError``), the answer at most ``SESSION_REPLY_MAX_BYTES``; an
    answer that is not an HTTP status line raises ``SessionRouteError``.
    """
    u = urlsplit(req.url)
    secure = u.scheme in ("https", "wss")
    port = u.port or (443 if secure else 80)
    async with asyncio.timeout(SESSION_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(u.hostname, port, ssl=secure or None)
        try:
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            head = [f"{req.method} {path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close"]
            head += [f"{k}: {v}" for k, v in req.headers]
            head.append(f"Content-Length: {len(req.body)}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + req.body)
            await writer.drain()
            raw = bytearray()
            while chunk := await reader.read(65536):
                raw += chunk
                if len(raw) > SESSION_REPLY_MAX_BYTES:
                    raise SessionRouteError(f"answer over {SESSION_REPLY_MAX_BYTES} bytes")
        finally:
            writer.close()
    status_line, _, rest = bytes(raw).partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise SessionRouteError(f"not an HTTP response: {status_line[:40]!r}")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(parts[1]), body


def _ignore_message(msg: str | bytes) -> None:
    """``on_message`` of a connection whose ``_Connection`` has finished."""


class _ProviderWebSocket(ClientConnection):
    """websockets' asyncio client connection handing each data message to ``on_message``.

    Frames are parsed by the connection's sans-I/O protocol as usual (control
    frames, pings, the closing handshake, size limits: all websockets'), but a
    complete text or binary message goes to ``on_message`` in ``data_received``
    as it is parsed, instead of through the assembler's queue to a ``recv()``
    per message: no future, queue or coroutine step per message. A text
    message is decoded as UTF-8 once; invalid UTF-8 fails the connection with
    1007, as ``recv()`` does.

    The common frame, a whole unmasked text or binary message within the size
    limit, is also cut from the bytes here (``data_received``) rather than by
    the protocol's generator-based parser (about 2.8 us a frame against 0.4).
    Every other frame (ping, pong, close, fragments, anything odd) is handed
    whole to the protocol, which then sits at a frame boundary as it expects;
    a frame not yet complete waits in ``_pending``. The protocol's parser
    takes over for good when it might not be at a boundary (frames came with
    the handshake response) or when a header is one it should judge (masked,
    RSV bits, reserved opcode, over the size limit), and for everything after
    the connection stops being OPEN.
    """

    def __init__(
        self, protocol: Any, *, on_message: Callable[[str | bytes], None], **kwargs: Any
    ) -> None:
        super().__init__(protocol, **kwargs)
        self.on_message = on_message
        self._fragments: list[bytes] = []
        self._fragmented_text = False
        self._pending = b""  # the start of a frame not yet complete (own parsing only)
        self._own_parsing: bool | None = None  # None until the handshake response is in
        self.after_read: Callable[[], None] | None = None
        """Called once a read's messages are all handed over (``_Connection._after_read``)."""
        # Offsets in the byte stream read from the socket (``_Connection.watch_dry``):
        self.received = 0
        """Bytes read so far."""
        self.consumed = 0
        """Every message before this offset has been handed over."""
        self.msg_start = 0
        """Where the message being handed over begins (or an earlier offset)."""

    def data_received(self, data: bytes) -> None:
        start = self.received
        self.received = start + len(data)
        self._data_received(data, start)
        self.consumed = self.received - len(self._pending) - self._parser_holds()
        after_read = self.after_read
        if after_read is not None:
            after_read()

    def _parser_holds(self) -> int:
        """Bytes websockets' own parser holds, not yet a message (only once it parses)."""
        if self._own_parsing:
            return 0
        reader = getattr(self.protocol, "reader", None)
        buffer = getattr(reader, "buffer", None)
        return len(buffer) if buffer is not None else 0

    def _to_protocol(self, data: bytes) -> None:
        """Bytes for websockets' parser: a message it hands over starts no earlier than
        the first byte not yet handed over (``msg_start``)."""
        self.msg_start = self.consumed
        super().data_received(data)

    def _data_received(self, data: bytes, start: int) -> None:
        if self._own_parsing is None:
            self._to_protocol(data)
            if self.response is not None and self._own_parsing is None:
                # no frame came with the response and the read ended with it: the
                # protocol's parser holds nothing and waits for a frame header
                self._own_parsing = data.endswith(b"\r\n\r\n") and not self.protocol.reader.buffer
            return
        if not self._own_parsing:
            self._to_protocol(data)
            return
        base = start - len(self._pending)  # the offset of buf[0]
        buf = self._pending + data if self._pending else data
        self._pending = b""
        protocol = self.protocol
        max_size = protocol.max_message_size
        size, pos = len(buf), 0
        while size - pos >= 2:
            if protocol.state is not State.OPEN:
                break
            b0, b1 = buf[pos], buf[pos + 1]
            length, head = b1 & 0x7F, pos + 2
            if length >= 126:
                extra = 2 if length == 126 else 8
                if size - head < extra:
                    self._pending = buf[pos:]  # the rest of the header comes later
                    return
                length, head = int.from_bytes(buf[head : head + extra], "big"), head + extra
            if b1 & 0x80 or b0 & 0x70 or (max_size is not None and length > max_size):
                break  # masked, RSV bits, too big: the protocol's parser judges it
            end = head + length
            if end > size:
                self._pending = buf[pos:]  # the rest of this frame comes later
                return
            if (b0 == 0x81 or b0 == 0x82) and not self._fragments:
                self.msg_start, self.consumed = base + pos, base + end
                pos = end
                self._deliver(b0 == 0x81, buf[head:end])
            else:  # control frames, fragments, reserved opcodes: whole, to the protocol
                frame, pos = buf[pos:end], end
                self._to_protocol(frame)
                if not self._fragments:  # (a fragmented message began before it)
                    self.consumed = base + end
        else:
            if pos < size:
                self._pending = buf[pos:]  # less than a header
            return
        # not OPEN any more, or a header for the protocol to judge: it takes over
        self._own_parsing = False
        if pos < size:
            self._to_protocol(buf[pos:])

    def process_event(self, event: Any) -> None:
        if self.response is None or not isinstance(event, Frame):
            super().process_event(event)  # the handshake response
            return
        if self._own_parsing is None:
            self._own_parsing = False  # frames came with the response: the protocol parses
        opcode = event.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if not event.fin:  # the first fragment; the protocol checks their order
                self._fragmented_text = opcode is Opcode.TEXT
                self._fragments = [bytes(event.data)]
                return
            self._deliver(opcode is Opcode.TEXT, event.data)
        elif opcode is Opcode.CONT:
            self._fragments.append(bytes(event.data))
            if event.fin:
                data, self._fragments = b"".join(self._fragments), []
                self._deliver(self._fragmented_text, data)
        else:
            super().process_event(event)  # ping, pong, close

    def _deliver(self, text: bool, data: Any) -> None:
        if not text:
            self.on_message(bytes(data))
            return
        try:
            decoded = str(data, "utf-8")
        except UnicodeDecodeError as exc:
            self.set_connection_exc(exc)
            self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
            self.send_data()
            return
        self.on_message(decoded)


class _TurnClock:
    """How far ahead of its playout one turn's audio is, by the clock.

    ``due_at`` is when the audio received so far runs out if it plays from
    its arrival on without a break: each piece of audio starts at the later of
    ``due_at`` and its arrival and adds its duration. The true queue can only
    be longer (playout starts at a tick, after a previous turn, or is held),
    never shorter, so a turn this counts as needing audio may not, but one it
    counts as well ahead is.
    """

    __slots__ = ("due_at", "fmt", "s_per_byte")

    def __init__(self) -> None:
        self.due_at = 0.0
        self.fmt: AudioFormat | None = None
        self.s_per_byte = 0.0

    def set_format(self, audio_format: AudioFormat) -> None:
        self.fmt = audio_format
        self.s_per_byte = 1.0 / (audio_format.sample_rate_hz * audio_format.bytes_per_sample)

    def add(self, n_bytes: int, audio_format: AudioFormat, now: float) -> None:
        if audio_format is not self.fmt:
            self.set_format(audio_format)
        due_at = self.due_at
        self.due_at = (due_at if due_at > now else now) + n_bytes * self.s_per_byte


@dataclass(slots=True)
class _DryWatch:
    """An underrun counted as the daemon's while bytes read later may show otherwise."""

    wire_id: str
    mark: int
    """The stream offset where the bytes waiting unread at the dry tick end."""
    on_provider: Callable[[], None]


class _TurnWatch:
    """A turn's progress, for its deadlines (``TURN_STALL_S``, ``TURN_S_PER_CHAR``)."""

    __slots__ = ("audio_s", "chars", "ended", "owed_since", "progress_at", "text_at")

    def __init__(self, now: float) -> None:
        self.chars = 0
        self.text_at = now
        """When it was opened or last given text (or ended)."""
        self.progress_at = now
        """When the provider last sent anything for it."""
        self.owed_since: float | None = None
        """Since when the provider owes a reply (None: it has answered all it was sent)."""
        self.ended = False
        self.audio_s = 0.0
        """Seconds of audio received: the caller listens to that much anyway."""

    def progress(self, now: float, audio: bytes | None, audio_format: AudioFormat | None) -> None:
        self.progress_at = now
        if not self.ended:
            self.owed_since = None
        if audio is not None and audio_format is not None:
            self.audio_s += len(audio) / (
                audio_format.sample_rate_hz * audio_format.bytes_per_sample
            )


class _Connection:
    """One WebSocket to the provider and the engine that speaks its protocol.

    Flow control (off unless the pool sets ``flow_high_s``: see ``FLOW_HIGH_S``):
    a read that leaves every turn on the connection more than
    ``pool.flow_high_s`` of audio ahead of its playout (``_TurnClock``) stops
    the reading (``transport.pause_reading``), so what the provider sends
    beyond that waits in its socket buffers, not in ours, and a connection
    whose turns need audio gets the loop. Reading resumes when a turn is
    opened on it, when its neediest turn is down to ``pool.flow_low_s`` ahead,
    and in any case after ``FLOW_PAUSE_MAX_S``; it never pauses while a turn
    has no audio yet, while a keepalive ping awaits its pong, or once the
    connection is not open.
    """

    def __init__(self, pool: ProviderPool, engine: TtsProtocol, key: PoolKey = None) -> None:
        self.pool = pool
        self.engine = engine
        self.key = key
        self.catch_all: Sink | None = None  # a dedicated (voice agent) connection's sink
        self.loop = asyncio.get_running_loop()
        self.ws: ClientConnection | None = None
        self.sinks: dict[str, Sink] = {}
        self.audio_sinks: dict[str, AudioSink] = {}
        """Where a turn's audio goes when the engine returns it (``_on_message``); a
        turn without one (a voice agent's) gets ``AudioReceived`` through ``_dispatch``."""
        self.words_sinks: dict[str, WordsSink] = {}
        """Where a turn's word timings go when the engine returns them, likewise."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0  # when ``timer`` fires (it may be before the engine's deadline)
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.ready_event = asyncio.Event()
        self.changed = asyncio.Event()
        self.outbox: deque[str | bytes] = deque()
        self.writer: asyncio.Task[None] | None = None
        self.early: list[str | bytes] | None = []
        """Messages that came with the handshake, before the engine heard of the connection."""
        self.clocks: dict[str, _TurnClock] = {}
        """Each turn's audio ahead of its playout (only with flow control on)."""
        self.paused = False
        self.flow_timer: asyncio.TimerHandle | None = None
        self.dry_watches: list[_DryWatch] = []
        """Underruns waiting for their verdict (``watch_dry``)."""
        self.listed_idle = False
        """On the pool's ``idle`` list (``ProviderPool._connection_for_turn``)."""
        self.idle_since = 0.0
        """When it last became idle (``note_idle``): what the pool's idle closing reads."""
        self.retiring = False
        """Closed by the pool for being idle (``ProviderPool._close_idle``): takes no turn."""
        self.watches: dict[str, _TurnWatch] = {}
        """Turns in progress and their deadlines (``_check_turns``)."""
        self.watch_timer: asyncio.TimerHandle | None = None
        self.ready_at: float | None = None
        """When the engine said ready (``BACKOFF_STABLE_S``)."""
        self.engine_failed = False
        """The engine reported ``ProviderFailed``: this connection is done."""

    def now(self) -> float:
        return self.loop.time()

    def watch_dry(self, wire_id: str, on_provider: Callable[[], None]) -> bool:
        """A turn on this connection ran dry: did the daemon hold its next audio unread?

        False: nothing waits unread, in the kernel or read and not yet handed
        over; the provider had not sent it. True: bytes wait, and the underrun
        is the daemon's unless they turn out not to hold the turn's audio:
        the connection then remembers where those bytes end and, once it has
        handed over everything before that point without the turn's audio,
        calls ``on_provider`` (they were other turns' audio; the provider sent
        this turn's later). It stays the daemon's without a verdict when so
        much waits in the kernel that the provider may have been held back by
        the receive window, on TLS (the kernel counts encrypted bytes) and
        if the connection closes first.
        """
        ws = self.ws
        if not isinstance(ws, _ProviderWebSocket):
            return self.unread_bytes() > 0
        kernel = self.unread_bytes()
        if not kernel and ws.received == ws.consumed:
            return False
        transport = ws.transport
        if transport.get_extra_info("sslcontext") is not None:
            return True
        sock = transport.get_extra_info("socket")
        try:
            window = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        except (OSError, AttributeError):
            return True
        if kernel >= window:
            return True
        self.dry_watches.append(_DryWatch(wire_id, ws.received + kernel, on_provider))
        return True

    def _dry_audio(self, wire_id: str) -> None:
        """Audio of ``wire_id`` is being handed over: it was waiting unread at its
        watches' dry ticks, which stay the daemon's. (A watch whose mark an earlier
        message passed was settled after that message; only where websockets' own
        parser cuts the frames can a watch outlive its mark until the read ends,
        and then the verdict errs to the daemon.)"""
        self.dry_watches = [w for w in self.dry_watches if w.wire_id != wire_id]

    def _dry_settle(self) -> None:
        """Watches whose unread bytes are all handed over without their turn's audio."""
        ws = self.ws
        consumed = ws.consumed if isinstance(ws, _ProviderWebSocket) else 0
        keep: list[_DryWatch] = []
        for w in self.dry_watches:
            if w.mark <= consumed:
                w.on_provider()
            else:
                keep.append(w)
        self.dry_watches = keep

    def unread_bytes(self) -> int:
        """Bytes the kernel holds for this connection that the daemon has not read."""
        ws = self.ws
        transport = None if ws is None else ws.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, _INQ, True)
        except (OSError, ValueError):
            return 0
        return int(_INQ[0])

    def has_room(self) -> bool:
        """Whether one more turn fits: by our sinks (turns handed out, some perhaps not yet
        sent) and by the engine's own count, which still holds a cancelled turn until the
        server releases it (a Kova context is held until its ``context_closed``)."""
        limit = self.engine.max_turns
        return (
            self.catch_all is None
            and not self.closed
            and not self.retiring
            and len(self.sinks) < limit
            and self.engine.open_turns() < limit
        )

    def load(self) -> int:
        """Turns open on it (a cancelled one counts until the server releases it): what a
        new turn's first audio may wait behind on this one FIFO connection."""
        n = len(self.sinks)
        held = self.engine.open_turns()
        return held if held > n else n

    def _after_read(self) -> None:
        """A read's messages are handed over: stop reading while every turn is well ahead."""
        if self.dry_watches:
            self._dry_settle()
        high = self.pool.flow_high_s
        clocks = self.clocks
        if high is None or self.paused or self.closed or not clocks:
            return
        if len(clocks) < len(self.sinks):
            return  # a turn without a clock (an agent's): counted as needing audio
        ws = self.ws
        if ws is None or ws.protocol.state is not State.OPEN or ws.pending_pings:
            return
        neediest = min(c.due_at for c in clocks.values())
        now = self.loop.time()
        if neediest - now <= high:
            return
        self.paused = True
        ws.transport.pause_reading()
        resume_at = min(neediest - self.pool.flow_low_s, now + FLOW_PAUSE_MAX_S)
        self.flow_timer = self.loop.call_at(resume_at, self.resume)

    def resume(self) -> None:
        """Read again (a turn needs audio, or the pause has lasted long enough)."""
        if self.flow_timer is not None:
            self.flow_timer.cancel()
            self.flow_timer = None
        if self.paused:
            self.paused = False
            if self.ws is not None:
                self.ws.transport.resume_reading()

    async def run(self) -> None:
        try:
            await self._connect()
            assert self.ws is not None
            early, self.early = self.early or [], None
            for msg in early:
                self._on_message(msg)
            await self.ws.wait_closed()  # messages arrive through _on_message meanwhile
            exc = self.ws.protocol.close_exc
            if isinstance(exc, websockets.ConnectionClosedOK):
                code, reason = self.ws.close_code, self.ws.close_reason or ""
            else:
                code, reason = None, f"{type(exc).__name__}: {exc}"
        except (TimeoutError, OSError, websockets.WebSocketException) as e:
            code, reason = None, f"{type(e).__name__}: {e}"
        except Exception as e:  # a malformed session answer, an engine's refusal: this
            # connection ends like any other (its turns fail, the pool reconnects)
            log.warning("tts.connect_failed", provider=self.pool.name, error=repr(e)[:200])
            code, reason = None, f"{type(e).__name__}: {e}"
        finally:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            if self.watch_timer is not None:
                self.watch_timer.cancel()
                self.watch_timer = None
            self.resume()
        if self.ready_at is not None and self.now() - self.ready_at >= BACKOFF_STABLE_S:
            self.pool.backoff.reset()  # it stayed up: the next drop is not a storm
        with contextlib.suppress(LocalProtocolError):  # an engine that failed itself already
            self.engine.connection_lost(code, reason, self.now())
        self.pump()
        self.ready_event.set()
        self.pool._connection_ended(self)
        ws = self.ws
        if isinstance(ws, _ProviderWebSocket):
            # it holds our bound methods and we hold it: let a closed one go by
            # reference counting, not at the next full collection
            ws.on_message = _ignore_message
            ws.after_read = None

    def _on_message(self, msg: str | bytes) -> None:
        """One provider message, as websockets parsed it (``_ProviderWebSocket``).

        The bulk of a turn, a plain audio message, comes back from the engine
        as ``(turn_id, audio, format)`` and goes straight to the turn's audio
        sink: no event object, no drain, no timer (its reply deadline only
        moved later: the timer fires early and re-arms). Anything else is
        pumped the engine-contract way.
        """
        if self.early is not None:
            self.early.append(msg)
            return
        if self.closed:
            return
        now = self.loop.time()
        if isinstance(msg, str):
            piece = self.engine.receive_text_fast(msg, now)
        else:
            piece = self.engine.receive_bytes_fast(msg, now)
        if piece is None:
            self.pump()
            self._after_message()
            return
        watch = self.watches.get(piece[0]) if self.watches else None
        if watch is not None:
            if len(piece) == 3:
                watch.progress(now, piece[1], piece[2])
            else:
                watch.progress(now, None, None)
        if len(piece) == 3:
            self._audio(piece)
        else:
            self._words(piece)
        self._after_message()

    def _after_message(self) -> None:
        if self.dry_watches:
            self._dry_settle()
        # a burst (many turns' audio at once) is read in one data_received, without
        # a return to the loop: let frames due meanwhile leave on time
        self.pool.preempt()

    # ------------------------------------------------------------ turn deadlines

    def _watch(self, wire_id: str) -> _TurnWatch | None:
        if wire_id not in self.sinks or self.closed:
            return None
        watch = self.watches.get(wire_id)
        if watch is None:
            watch = self.watches[wire_id] = _TurnWatch(self.now())
            if self.watch_timer is None:
                self.watch_timer = self.loop.call_later(TURN_CHECK_S, self._check_turns)
        return watch

    def note_text(self, wire_id: str, chars: int) -> None:
        """The turn was given ``chars`` characters of text: the provider owes audio."""
        watch = self._watch(wire_id)
        if watch is not None:
            now = self.now()
            watch.chars += chars
            watch.text_at = now
            if watch.owed_since is None:
                watch.owed_since = now

    def note_end(self, wire_id: str) -> None:
        """The turn's text is complete: the provider owes the rest and its end."""
        watch = self._watch(wire_id)
        if watch is not None:
            watch.ended = True
            watch.text_at = self.now()
            if watch.owed_since is None:
                watch.owed_since = watch.text_at

    def _check_turns(self) -> None:
        self.watch_timer = None
        if self.closed:
            return
        now = self.now()
        pool = self.pool
        late: list[tuple[str, str]] = []
        for wire_id, w in self.watches.items():
            if w.owed_since is not None and now - max(w.owed_since, w.progress_at) >= (
                pool.turn_stall_s
            ):
                late.append((wire_id, f"no audio from the provider for {pool.turn_stall_s:g} s"))
            elif w.chars and now - w.text_at >= (
                pool.turn_base_s + w.chars * pool.turn_s_per_char + w.audio_s
            ):
                late.append((wire_id, f"not done {now - w.text_at:.0f} s after its last text"))
        for wire_id, message in late:
            self._fail_turn(wire_id, message)
        if self.watches and not self.closed:
            self.watch_timer = self.loop.call_later(TURN_CHECK_S, self._check_turns)

    def _fail_turn(self, wire_id: str, message: str) -> None:
        """End a turn the provider does not deliver: its cancel goes out, it fails."""
        sink = self.drop_turn(wire_id)
        with contextlib.suppress(LocalProtocolError):
            self.engine.cancel(wire_id, self.now())
        self.pump()
        self.pool.note_error("timeout")
        log.warning("tts.turn_timeout", provider=self.pool.name, detail=message)
        if sink is not None:
            sink(TurnFailed(wire_id, "timeout", message, retryable=True))

    def _audio(self, piece: AudioPiece) -> None:
        turn_id, audio, audio_format = piece
        if self.dry_watches:
            self._dry_audio(turn_id)
        audio_sink = self.audio_sinks.get(turn_id)
        if audio_sink is not None:
            clocks = self.clocks
            if clocks:  # turns have clocks only with flow control on
                clock = clocks.get(turn_id)
                if clock is not None:
                    clock.add(len(audio), audio_format, self.loop.time())
            audio_sink(audio, audio_format)
        else:  # counted by _dispatch
            self._dispatch(AudioReceived(turn_id, audio, audio_format))

    def _words(self, piece: WordsPiece) -> None:
        turn_id, words = piece
        words_sink = self.words_sinks.get(turn_id)
        if words_sink is not None:
            words_sink(words)
        else:
            self._dispatch(WordsTimed(turn_id, words))

    def drop_turn(self, wire_id: str) -> Sink | None:
        """Forget a turn's sinks (it ended, failed or was cancelled); its event sink."""
        self.audio_sinks.pop(wire_id, None)
        self.words_sinks.pop(wire_id, None)
        self.clocks.pop(wire_id, None)
        self.watches.pop(wire_id, None)
        sink = self.sinks.pop(wire_id, None)
        if self.paused and not self.clocks:
            # no turn left to hold back: read what is left of the dropped one (a
            # cancelled turn's audio, the server's release of it) now, not at the timer
            self.resume()
        if not self.sinks:
            self.note_idle()
        return sink

    def is_idle(self) -> bool:
        """Open, the pool's to place turns on, and holding no turn (a cancelled turn the
        engine still holds counts until the server lets go: ``pump``)."""
        return (
            not self.closed
            and not self.retiring
            and self.catch_all is None
            and not self.sinks
            and self.engine.open_turns() == 0
        )

    def note_idle(self) -> None:
        """Put this connection on the pool's ``idle`` list if it ``is_idle()``, and note
        since when it is."""
        if self.is_idle():
            self.idle_since = self.loop.time()
            if not self.listed_idle:
                self.listed_idle = True
                self.pool.idle.append(self)
                self.pool.arm_idle_close()

    async def _connect(self) -> None:
        req = self.engine.session_request()
        if req is not None:
            status, body = await _http_request(req)
            self.engine.session_response(status, body, self.now())
            self.pump()
            if self.engine_failed:  # refused, or an answer with no usable URL: no connect
                raise SessionRouteError(f"session route answer not usable (HTTP {status})")
        params = self.engine.connect_params()
        self.ws = await websockets.connect(
            params.url,
            additional_headers=list(params.headers),
            subprotocols=[websockets.Subprotocol(s) for s in params.subprotocols] or None,
            max_size=params.max_message_bytes,
            open_timeout=10,
            ping_interval=20,
            ping_timeout=20,
            compression=None,
            create_connection=functools.partial(  # type: ignore[arg-type]
                _ProviderWebSocket, on_message=self._on_message
            ),
        )
        assert isinstance(self.ws, _ProviderWebSocket)
        self.ws.after_read = self._after_read
        self.engine.connection_made(self.ws.subprotocol, self.now())
        self.pump()

    def pump(self) -> None:
        for action in self.engine.actions_to_send():
            if self.ws is None:
                break
            if isinstance(action, SendText):
                self._queue_send(action.text)
            elif isinstance(action, SendBytes):
                self._queue_send(action.data)
            elif isinstance(action, CloseConnection):
                self.loop.create_task(self.ws.close(action.code, action.reason))
        for event in self.engine.events_received():
            self._dispatch(event)
        if not self.sinks and not self.listed_idle:
            self.note_idle()  # e.g. the server let go of a cancelled turn
        self.changed.set()
        # One timer, re-armed only when the deadline comes earlier: a deadline that
        # moves later with every message (a reply timeout) costs no timer churn; the
        # timer then fires early, finds nothing due and re-arms (``_on_timer``).
        deadline = self.engine.next_deadline()
        timer = self.timer
        if deadline is None or self.closed:
            if timer is not None:
                timer.cancel()
                self.timer = None
        elif timer is None or deadline < self.timer_at:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(deadline, self._on_timer)
            self.timer_at = deadline

    def _queue_send(self, data: str | bytes) -> None:
        """Send one message now, straight through the connection's sans-I/O protocol.

        The frame is built by ``ws.protocol`` and written to the transport at
        once: no task, no loop iteration per message. Only when the transport
        is above its write-buffer limit (the provider is not reading) or an
        earlier message still waits there do messages queue behind one
        writer task that awaits the connection's flow control, so the order
        is kept either way. A connection that is not open sends nothing (as
        ``ws.send`` raised ``ConnectionClosed``, which was ignored).
        """
        ws = self.ws
        if ws is None:
            return
        if self.outbox or ws.transport.get_write_buffer_size() > SEND_BUFFER_LIMIT_BYTES:
            self.outbox.append(data)
            if self.writer is None or self.writer.done():
                self.writer = self.loop.create_task(self._write())
            return
        if ws.protocol.state is not State.OPEN:
            return
        if isinstance(data, str):
            ws.protocol.send_text(data.encode())
        else:
            ws.protocol.send_binary(data)
        try:
            ws.send_data()
        except Exception as exc:  # as ws.send: a failed write fails the connection
            log.warning("tts.send_failed", provider=self.pool.name, error=str(exc))
            ws.transport.abort()

    async def _write(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while self.outbox and self.ws is not None:
                await self.ws.send(self.outbox.popleft())
        self.outbox.clear()

    def _on_timer(self) -> None:
        self.timer = None
        deadline = self.engine.next_deadline()
        if deadline is None or self.closed:
            return
        now = self.now()
        if now < deadline:  # armed for an earlier deadline that has since moved later
            self.timer = self.loop.call_at(deadline, self._on_timer)
            self.timer_at = deadline
            return
        self.engine.handle_timer(now)
        self.pump()

    def _dispatch(self, event: Event) -> None:
        cls = type(event)
        if cls is AudioReceived and self.dry_watches:
            self._dry_audio(event.turn_id)  # type: ignore[attr-defined]
        if cls is AudioReceived or cls is WordsTimed:  # the bulk of a turn: straight to its sink
            watch = self.watches.get(event.turn_id) if self.watches else None  # type: ignore[attr-defined]
            if watch is not None:
                if cls is AudioReceived:
                    got: AudioReceived = event  # type: ignore[assignment]
                    watch.progress(self.loop.time(), got.audio, got.audio_format)
                else:
                    watch.progress(self.loop.time(), None, None)
            if cls is AudioReceived and self.clocks:  # flow control on
                clock = self.clocks.get(event.turn_id)  # type: ignore[attr-defined]
                if clock is not None:
                    audio: AudioReceived = event  # type: ignore[assignment]
                    clock.add(len(audio.audio), audio.audio_format, self.loop.time())
            sink = self.sinks.get(event.turn_id)  # type: ignore[attr-defined]
            if sink is not None:
                sink(event)
                return
        if isinstance(event, ConnectionReady):
            self.ready_event.set()
            self.ready_at = self.loop.time()  # the backoff resets only once it proves stable
            return
        if isinstance(event, ProviderFailed):
            self.engine_failed = True
            self.pool.note_error(event.kind)
            if self.catch_all is not None:
                self.catch_all(event)
            for failed_id in event.turn_ids or tuple(self.sinks):
                failed_sink = self.drop_turn(failed_id)
                if failed_sink is not None:
                    failed_sink(replace(event, turn_ids=(failed_id,)))
            return
        turn_id = getattr(event, "turn_id", None)
        sink = self.sinks.get(turn_id) if isinstance(turn_id, str) else None
        if sink is None:
            if self.catch_all is not None:
                self.catch_all(event)
            return
        if isinstance(event, TurnFailed):
            self.pool.note_error(event.kind)
        if isinstance(event, TurnDone | TurnFailed):
            if isinstance(event, TurnDone) and not event.cancelled:
                self.pool.backoff.reset()  # it carried a turn to its end
            self.drop_turn(event.turn_id)
        else:
            watch = self.watches.get(event.turn_id) if self.watches else None  # type: ignore[attr-defined]
            if watch is not None:
                watch.progress(self.loop.time(), None, None)
        sink(event)


class ProviderPool:
    """Every connection to one provider."""

    def __init__(
        self,
        settings: ProviderSettings,
        warm: int = 1,
        preempt: Callable[[], None] = lambda: None,
        turns_per_connection: int | None = None,
        flow_high_s: float | None = None,
        flow_low_s: float = FLOW_LOW_S,
        close_idle_after_s: float | None = CLOSE_IDLE_AFTER_S,
    ) -> None:
        self.settings = settings
        self.preempt = preempt
        """Called between two provider messages (``MediaTicker.run_if_due``)."""
        self.turns_per_connection = turns_per_connection
        """Above this many turns on every connection a new turn opens another connection
        (None: only when every one is at the protocol's ``max_turns``)."""
        self.flow_high_s = None if settings.protocol in NO_FLOW_CONTROL else flow_high_s
        self.flow_low_s = flow_low_s
        """Flow control (``_Connection``): off while ``flow_high_s`` is None (the default)."""
        self.close_idle_after_s = close_idle_after_s
        """Close a connection idle this long (``CLOSE_IDLE_AFTER_S``; None: never)."""
        self.idle_closed = 0
        """Connections closed for being idle, ever."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self.engine_cls = engine_class(settings.protocol)
        self.pooling = _pooling(settings.protocol)
        self.warm = warm
        self.connections: list[_Connection] = []
        self.idle: list[_Connection] = []
        """Connections that held no turn when last seen (oldest first; some may since
        have closed or taken a turn): where a new turn is placed without a scan of every
        connection, which at one turn per connection means every call's."""
        self.backoff = Backoff()
        self.turn_stall_s = TURN_STALL_S
        self.turn_base_s = TURN_BASE_S
        self.turn_s_per_char = TURN_S_PER_CHAR
        """A turn's deadlines (``_Connection._check_turns``)."""
        self.errors: dict[str, int] = {}
        self.reconnects = 0
        self._closing = False
        self._reconnect_task: asyncio.Task[None] | None = None
        self._turn_serial = 0

    prompt_identity: str | None = None
    """The provider's part of its prompts' cache key: ``provider_identity`` of its
    settings unless set (the daemon sets it: an embedded provider's names its engine)."""

    @property
    def name(self) -> str:
        return self.settings.name

    def unread_bytes(self) -> int:
        """Bytes waiting unread on the pool's connections (an underrun's cause)."""
        return sum(conn.unread_bytes() for conn in self.connections)

    def note_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _key(self, turn: TurnSettings | None) -> PoolKey:
        if self.pooling is None:
            return None
        pool_key, _ = self.pooling
        default = TurnSettings(self.settings.voice, MULAW_8K)
        return tuple(pool_key(self.settings, turn or default))

    def _open(self, key: PoolKey = None) -> _Connection:
        settings = self.settings
        if self.pooling is not None:
            key = key if key is not None else self._key(None)
            settings = self.pooling[1](self.settings, *(key or ()))
        conn = _Connection(self, self.engine_cls(settings), key)
        self.connections.append(conn)
        conn.note_idle()
        conn.task = asyncio.get_running_loop().create_task(conn.run())
        return conn

    def _idle_connection(self, key: PoolKey) -> _Connection | None:
        """A connection of ``key`` holding no turn, ready and reading if one is listed, else
        one still handshaking; None if the list has none (the caller then scans).

        The list is pruned as it is read: a connection that closed or holds a turn
        leaves it (``note_idle`` lists it again once it holds none).
        """
        idle = self.idle
        handshaking: _Connection | None = None
        i = 0
        while i < len(idle):
            conn = idle[i]
            if not conn.is_idle():
                conn.listed_idle = False
                del idle[i]
                continue
            if conn.key == key:
                if conn.engine.ready and not conn.paused:
                    return conn
                if handshaking is None and not conn.ready_event.is_set():
                    handshaking = conn
            i += 1
        return handshaking

    def arm_idle_close(self, at: float | None = None) -> None:
        """Look for connections idle too long at ``at`` (default: one timeout from now)."""
        after = self.close_idle_after_s
        if after is None or self._closing or self._idle_timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_at(loop.time() + after if at is None else at, self._close_idle)

    def _close_idle(self) -> None:
        """Close the connections idle for ``close_idle_after_s`` or more.

        Kept: the newest idle connection of each kind (the spare the next
        turn takes: ``_keep_spare`` would only open another), one still
        handshaking, and as many as it takes to stay at ``warm`` open
        connections. The engine says goodbye as at shutdown (``close``); a
        turn placed meanwhile cannot land on it (``has_room``).
        """
        self._idle_timer = None
        after = self.close_idle_after_s
        if after is None or self._closing:
            return
        now = asyncio.get_running_loop().time()
        listed: list[_Connection] = []
        for conn in self.idle:
            if not conn.is_idle():
                conn.listed_idle = False  # pruned as ``_idle_connection`` would
            else:
                listed.append(conn)
        spares: dict[PoolKey, _Connection] = {}
        for conn in listed:
            spare = spares.get(conn.key)
            if spare is None or conn.idle_since > spare.idle_since:
                spares[conn.key] = conn
        open_now = sum(
            1 for c in self.connections if not c.closed and not c.retiring and c.catch_all is None
        )
        kept: list[_Connection] = []
        closed = 0
        for conn in listed:
            if (
                conn is spares[conn.key]
                or now - conn.idle_since < after
                or not conn.engine.ready
                or open_now <= self.warm
            ):
                kept.append(conn)
                continue
            conn.listed_idle = False
            conn.retiring = True
            open_now -= 1
            closed += 1
            conn.engine.close(now)
            conn.pump()
        self.idle[:] = kept
        if closed:
            self.idle_closed += closed
            log.info("tts.idle_closed", provider=self.name, connections=closed, open=open_now)
        # the next look: when the first of the others is due (one kept past its time,
        # handshaking or for ``warm``, is looked at again one timeout from now)
        due = [
            c.idle_since + after if now - c.idle_since < after else now + after
            for c in kept
            if c is not spares[c.key]
        ]
        if due:
            self.arm_idle_close(min(due))

    async def start(self, timeout_s: float = 10.0) -> bool:
        """Open the warm connection(s); True once one is ready."""
        conns = [self._open() for _ in range(self.warm)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.wait([asyncio.ensure_future(c.ready_event.wait()) for c in conns]),
                timeout_s,
            )
        return any(c.engine.ready for c in self.connections)

    def _connection_ended(self, conn: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self.connections.remove(conn)
        if conn.catch_all is not None:
            return  # a voice agent connection belongs to its call, not to the pool
        live = sum(1 for c in self.connections if not c.closed and c.catch_all is None)
        if not self._closing and live < self.warm and self._reconnect_task is None:
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = self.backoff.next_delay_s()
        log.info("tts.reconnect", provider=self.name, delay_s=round(delay, 3))
        await asyncio.sleep(delay)
        self._reconnect_task = None
        if not self._closing:
            self.reconnects += 1
            self._open()

    def _connection_for_turn(self, turn: TurnSettings) -> _Connection:
        """The connection a new turn's first audio waits least on.

        A connection is one FIFO: a turn's first audio comes after whatever
        the provider has queued on it for the turns already open there. So the
        turn goes to the ready connection with the fewest turns open (one that
        flow control paused only if every one is paused), else to
        one still handshaking, else to one busy finishing a cancelled turn
        (one-turn protocols); another connection is opened when every one is
        full, or holds ``turns_per_connection`` turns or more.

        A connection with no turn, from the ``idle`` list, is taken without
        looking at the others: none can be better when it is ready, nor when
        it is still handshaking and a connection carries one turn at most.
        Only without one are all connections scanned.
        """
        key = self._key(turn)
        soft = self.turns_per_connection
        conn = self._idle_connection(key)
        if conn is not None and (conn.engine.ready or soft == 1 or self.engine_cls.max_turns == 1):
            return conn
        best: _Connection | None = None
        best_load = 0
        connecting: _Connection | None = None
        busy: _Connection | None = None
        for conn in self.connections:
            if conn.key != key or not conn.has_room():
                continue
            if conn.engine.ready:
                # a paused connection (flow control) holds its turns' audio in front of a
                # new turn's: it goes after every reading one
                load = conn.load() + (PAUSED_LOAD if conn.paused else 0)
                if best is None or load < best_load:
                    best, best_load = conn, load
            elif not conn.ready_event.is_set():
                if connecting is None or conn.load() < connecting.load():
                    connecting = conn
            elif busy is None:
                busy = conn
        if soft is not None:
            if best is not None and best_load % PAUSED_LOAD >= soft:
                best = None
            if connecting is not None and connecting.load() >= soft:
                connecting = None
            if best is None and connecting is None:
                return self._open(key)
        return best or connecting or busy or self._open(key)

    def open_turn(
        self,
        turn_id: str,
        settings: TurnSettings,
        sink: Sink,
        audio_sink: AudioSink | None = None,
        words_sink: WordsSink | None = None,
    ) -> _TurnHandle:
        """Open ``turn_id`` on a connection with room; its events go to ``sink``.

        Calls share connections and every call numbers its own turns
        (``greeting``, ``flow-talk-1``...), so on the wire the turn gets an id
        unique in this pool; events come back to ``sink`` under ``turn_id``.
        Its audio goes to ``audio_sink`` when one is given (as ``(audio,
        format)``, the bulk of a turn without an event object), else to
        ``sink`` as ``AudioReceived`` like every other event; its word
        timings to ``words_sink`` (as the tuple of words) likewise.
        """
        conn = self._connection_for_turn(settings)
        self._turn_serial += 1
        wire_id = f"{turn_id}~{self._turn_serial}"
        conn.sinks[wire_id] = lambda e: sink(_retag(e, turn_id))
        if audio_sink is None:

            def audio_sink(audio: bytes, audio_format: AudioFormat) -> None:
                sink(AudioReceived(turn_id, audio, audio_format))

        conn.audio_sinks[wire_id] = audio_sink
        if words_sink is None:

            def words_sink(words: tuple[WordTiming, ...]) -> None:
                sink(WordsTimed(turn_id, words))

        conn.words_sinks[wire_id] = words_sink
        if self.flow_high_s is not None:
            conn.clocks[wire_id] = _TurnClock()
            conn.resume()  # the new turn needs its first audio
        handle = _TurnHandle(conn, wire_id)
        try:
            handle.call(lambda e, now: e.open_turn(wire_id, settings, now))
        except LocalProtocolError:
            conn.drop_turn(wire_id)  # refused: the turn holds no room
            raise
        self._keep_spare(conn.key)
        return handle

    def _keep_spare(self, key: PoolKey) -> None:
        """Open a connection in the background if no connection of ``key`` has room for
        another turn (under ``turns_per_connection`` and the protocol's ``max_turns``),
        so the next turn goes to one already open instead of waiting for a handshake."""
        if self._closing or self._idle_connection(key) is not None:
            return
        soft = self.turns_per_connection
        for conn in self.connections:
            if conn.key == key and conn.has_room() and (soft is None or conn.load() < soft):
                return
        self._open(key)

    async def open_agent(self, sink: Sink, timeout_s: float = 10.0) -> AgentSession:
        """A dedicated connection for one call's voice-agent session (Kletso)."""
        conn = _Connection(self, self.engine_cls(self.settings))
        conn.catch_all = sink
        self.connections.append(conn)
        conn.task = asyncio.get_running_loop().create_task(conn.run())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(conn.ready_event.wait(), timeout_s)
        return AgentSession(conn)

    async def close(self) -> None:
        self._closing = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for conn in list(self.connections):
            if conn.ws is not None:
                with contextlib.suppress(Exception):
                    conn.engine.close(conn.now())
                    conn.pump()
                    await conn.ws.close()
            if conn.task is not None:
                conn.task.cancel()
        await asyncio.gather(
            *(c.task for c in self.connections if c.task is not None), return_exceptions=True
        )


def _retag(event: Event, turn_id: str) -> Event:
    """``event`` as seen by the turn's owner (its own turn id, not the wire id)."""
    cls = type(event)
    if cls is AudioReceived:  # the bulk of a turn: built directly, not by ``replace``
        audio: AudioReceived = event  # type: ignore[assignment]
        return AudioReceived(turn_id, audio.audio, audio.audio_format)
    if cls is WordsTimed:
        timed: WordsTimed = event  # type: ignore[assignment]
        return WordsTimed(turn_id, timed.words)
    if isinstance(event, ProviderFailed):
        return replace(event, turn_ids=(turn_id,))
    if isinstance(getattr(event, "turn_id", None), str):
        return replace(event, turn_id=turn_id)  # type: ignore[type-var]
    return event


class _TurnHandle:
    """Commands for one turn on one connection.

    Until the turn is open on its connection (the connection may still be
    handshaking, or busy with the previous turn of a one-turn protocol),
    commands are buffered; after that they go straight to the engine.
    """

    def __init__(self, conn: _Connection, turn_id: str) -> None:
        self.conn = conn
        self.turn_id = turn_id
        self.live = False
        self._queued: list[Callable[[TtsProtocol, float], None]] = []
        self._flushing: asyncio.Task[None] | None = None

    def call(self, fn: Callable[[TtsProtocol, float], None]) -> None:
        if self.live:
            if not self.conn.closed:
                fn(self.conn.engine, self.conn.now())
                self.conn.pump()
            return
        self._queued.append(fn)
        if self.conn.engine.ready and self._flushing is None:
            self._flush()
        elif self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_when_ready())

    def _flush(self) -> None:
        self.live = True
        for fn in self._queued:
            fn(self.conn.engine, self.conn.now())
        self._queued.clear()
        self.conn.pump()

    async def _flush_when_ready(self) -> None:
        await self.conn.ready_event.wait()
        while not self.conn.engine.ready and not self.conn.closed:
            self.conn.changed.clear()
            await self.conn.changed.wait()  # e.g. a one-turn protocol finishing its last turn
        if not self.conn.engine.ready:
            sink = self.conn.drop_turn(self.turn_id)
            if sink is not None:
                sink(ProviderFailed("connect_failed", "provider unreachable", (self.turn_id,)))
            return
        self._flush()

    def send_text(self, text: str) -> None:
        self.conn.note_text(self.turn_id, len(text))
        self.call(lambda e, now: e.send_text(self.turn_id, text, now))

    def end(self) -> None:
        self.conn.note_end(self.turn_id)
        self.call(lambda e, now: e.end_turn(self.turn_id, now))

    def cancel(self) -> None:
        self.conn.drop_turn(self.turn_id)
        self.call(lambda e, now: e.cancel(self.turn_id, now))


class AgentSession:
    """One call's voice-agent session on its own connection.

    Every event of the connection goes to the sink given to ``open_agent``:
    ``AudioReceived`` for the agent's replies, the protocol's voice events
    (``VoiceStarted``, ``VoiceInterrupted``, ``VoiceEnded``...), and
    ``ProviderFailed`` if the connection drops.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.started = False
        self.failed_turns: set[str] = set()

    @property
    def ready(self) -> bool:
        return self.conn.engine.ready and not self.conn.closed

    def _do(self, method: str, *args: Any) -> None:
        if self.conn.closed:
            return
        getattr(self.conn.engine, method)(*args, self.conn.now())
        self.conn.pump()

    def start(self, mode: str = "vad", client_id: str = "callbridge") -> None:
        self._do("start_voice", mode, client_id)
        self.started = True

    def send_audio(self, pcm_s16le_24k: bytes) -> None:
        self._do("send_audio", pcm_s16le_24k)

    def commit(self) -> None:
        self._do("commit")

    def stop(self, reason: str = "user") -> None:
        """End the voice session; the agent answers with its end-of-session event."""
        if self.started:
            self.started = False
            self._do("stop_voice", reason)

    def played(self, item_id: str, ms: int) -> None:
        self._do("played", item_id, ms)

    def set_played_position(self, item_id: str, ms: int) -> None:
        self.conn.engine.set_played_position(item_id, ms)  # type: ignore[attr-defined]

    def say(self, turn_id: str, text: str, settings: TurnSettings, sink: Sink) -> None:
        """Typed text the agent answers aloud (``voice.text``)."""
        self.open_turn(turn_id, settings, sink)
        self.send_text(turn_id, text)
        self.end_turn(turn_id)

    # A call's text turns while its agent is on: the agent answers each aloud, in the
    # session the caller talks to (Kletso: one ``voice.text`` at ``end_turn``). A turn the
    # engine cannot take (one at a time) fails to its sink instead of raising.

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Sink) -> None:
        self.conn.sinks[turn_id] = sink
        self._turn_do(turn_id, "open_turn", settings)

    def send_text(self, turn_id: str, text: str) -> None:
        self._turn_do(turn_id, "send_text", text)

    def end_turn(self, turn_id: str) -> None:
        self._turn_do(turn_id, "end_turn")

    def cancel(self, turn_id: str) -> None:
        """Barge-in or cancel: the engine reports the played position (Kletso
        ``voice.played``) and drops the rest; an unknown turn is a no-op."""
        self._turn_do(turn_id, "cancel")

    def _turn_do(self, turn_id: str, method: str, *args: Any) -> None:
        if turn_id in self.failed_turns:
            return
        try:
            self._do(method, turn_id, *args)
        except LocalProtocolError as e:
            if method == "cancel":
                return
            self.failed_turns.add(turn_id)
            sink = self.conn.sinks.pop(turn_id, None) or self.conn.catch_all
            if sink is not None:
                sink(TurnFailed(turn_id, "agent_busy", str(e), True))

    async def close(self) -> None:
        if self.conn.ws is not None and not self.conn.closed:
            if self.started:
                with contextlib.suppress(LocalProtocolError):  # the agent already ended it
                    self._do("stop_voice", "user")
            with contextlib.suppress(Exception):
                await self.conn.ws.close()
        if self.conn.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.conn.task, 2)


# ------------------------------------------------------------ prompt cache
# The cache itself is the pure engine ``bridge.providers.prompts.PromptCache``; this
# shell starts its renders on a pool and feeds their events back to it.


def pool_identity(pool: ProviderPool) -> str:
    """``provider_identity`` of the pool's provider (computed once per pool)."""
    ident = pool.prompt_identity
    if ident is None:
        ident = pool.prompt_identity = provider_identity(pool.settings)
    return ident


def prompt_key(pool: ProviderPool, settings: TurnSettings, text: str) -> PromptKey:
    """What names a prompt's audio, for ``text`` spoken by ``pool`` with ``settings``."""
    voice = settings.voice or pool.settings.voice
    return PromptKey(pool.name, pool_identity(pool), voice, settings.audio_format,
                     settings.speed, text)  # fmt: skip


def _turn_settings(pool: ProviderPool, settings: TurnSettings) -> TurnSettings:
    if not settings.voice and pool.settings.voice:
        return replace(settings, voice=pool.settings.voice)
    return settings


def render_prompt(
    cache: PromptCache,
    pool: ProviderPool,
    settings: TurnSettings,
    text: str,
    turn_id: str,
    sink: Sink,
    *,
    lead: bool = True,
) -> tuple[str | None, Waiter | None]:
    """``text`` as a prompt for turn ``turn_id``: from the cache, by joining the render in
    flight, or by starting one on ``pool`` (``PromptCache.request``'s answer)."""
    outcome, waiter = cache.request(prompt_key(pool, settings, text), turn_id, sink, lead=lead)
    if outcome == "lead" and waiter is not None:
        _start_flight(cache, pool, waiter.flight, _turn_settings(pool, settings), text)
    return outcome, waiter


def _start_flight(
    cache: PromptCache, pool: ProviderPool, flight: Flight, settings: TurnSettings, text: str
) -> None:
    """One attempt at a render; a failure before audio is retried once (the engine says)."""

    def on_event(event: Event) -> None:
        if isinstance(event, TurnFailed | ProviderFailed):
            kind, message, retryable = event.kind, event.message, event.retryable
            if cache.flight_failed(flight, kind, message, retryable):
                log.warning("tts.prompt_retry", provider=pool.name, kind=kind)
                _start_flight(cache, pool, flight, settings, text)
            elif flight.done:
                log.warning("tts.prompt_failed", provider=pool.name, kind=kind)
            return
        if isinstance(event, UsageReported):  # a render shared by many calls: logged once
            log.info("provider.usage", provider=pool.name, prompt=flight.wire_id, usage=event.usage)
            return
        cache.flight_event(flight, event)

    try:
        handle = flight.handle = pool.open_turn(flight.wire_id, settings, on_event)
        handle.send_text(text)
        handle.end()
    except LocalProtocolError as e:
        on_event(TurnFailed(flight.wire_id, "open_refused", str(e), retryable=True))


# ----------------------------------------------------------------- speaker


class _SpokenTurn:
    def __init__(self, turn_id: str, settings: TurnSettings, sink: Sink, cacheable: bool) -> None:
        self.turn_id = turn_id
        self.settings = settings
        self.sink = sink
        self.text: list[str] = []
        self.ended = False
        self.got_audio = False
        self.chain_index = 0
        self.handle: _TurnHandle | None = None
        self.cacheable = cacheable
        self.waiter: Waiter | None = None
        """The render this turn waits on (a prompt, or the fallback prompt)."""
        self.fell_back = False
        self.attempt = 0
        """Bumped at each start on a provider and when one is given up: events of an
        earlier attempt (a provider cancelled at its first-audio deadline) are dropped."""


class Speaker:
    """One route's providers: a failover chain, the prompt cache and the fallback prompt.

    A turn that fails (``TurnFailed`` or ``ProviderFailed``) before its first
    audio is replayed on the next provider of the chain with all the text it
    had; one that fails after audio started ends with the failure event (a
    caller cannot un-hear half a sentence). A cacheable turn (a prompt) is
    served by the cache: a hit, a render in flight, or a new render shared
    with every identical request (``bridge.providers.prompts``). A turn that
    fails on every provider before its first audio plays ``fallback_prompt``
    when the cache holds it (or is rendering it): ``TurnFellBack`` first, so
    the call reports the error, then the fallback's audio as the turn's own.

    First-audio deadline (``first_audio_timeouts``, one per pool, 0 or none:
    off): a turn that has somewhere else to go (a next provider in the chain, or
    the fallback prompt in the cache) and still has no audio that long after its
    first provider got its whole text (one budget for the turn, whatever provider
    it is on: ``bridge.providers.first_audio``) is cancelled on that provider
    (late audio is dropped) and fails there with kind ``first_audio_timeout``: it
    falls back at once, or, with no fallback cached, fails over to the next
    provider, which gets a deadline of its own. A prompt render shared with other
    calls is left to go on and fill the cache (``PromptCache.leave``). ``clock`` and
    ``call_at`` are the loop's unless given (tests pass a fake clock and fire
    ``check_deadlines``).
    """

    def __init__(
        self,
        pools: list[ProviderPool],
        cache: PromptCache | None = None,
        fallback_prompt: str = "",
        fallback_voice: str = "",
        first_audio_timeouts: Sequence[float] = (),
        clock: Callable[[], float] | None = None,
        call_at: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        if not pools:
            raise ValueError("a Speaker needs at least one provider")
        self.pools = pools
        self.cache = cache
        self.fallback_prompt = fallback_prompt
        self.fallback_voice = fallback_voice
        """The voice the fallback prompt was rendered in (the route's: ``static_prompts``)."""
        self.turns: dict[str, _SpokenTurn] = {}
        self.failovers = 0
        self.fallbacks = 0
        self.first_audio_timeouts = tuple(first_audio_timeouts)
        self.first_audio_expired = 0
        """Turns given up on a provider at their first-audio deadline, ever."""
        self._deadlines = FirstAudioDeadlines()
        self._clock = clock
        self._call_at = call_at
        self._timer: Any = None
        self._timer_at: float | None = None

    def speak(
        self, turn_id: str, text: str, settings: TurnSettings, sink: Sink, cacheable: bool = False
    ) -> None:
        """A complete-text turn (greetings, menus); served from the cache when it can be."""
        turn = _SpokenTurn(turn_id, settings, sink, cacheable and self.cache is not None)
        turn.text.append(text)
        turn.ended = True
        self.turns[turn_id] = turn
        self._start(turn)

    def open_turn(self, turn_id: str, settings: TurnSettings, sink: Sink) -> None:
        turn = _SpokenTurn(turn_id, settings, sink, cacheable=False)
        self.turns[turn_id] = turn
        self._start(turn)

    def watch_dry(self, turn_id: str, on_provider: Callable[[], None]) -> bool | None:
        """The turn ran dry: whether its connection holds bytes unread (``_Connection.
        watch_dry``, which may call ``on_provider`` later); ``None``: not a turn here."""
        turn = self.turns.get(turn_id)
        if turn is None:
            return None
        handle = turn.handle
        if handle is None and turn.waiter is not None:  # a prompt: its render's turn
            flight_handle = turn.waiter.flight.handle
            handle = flight_handle if isinstance(flight_handle, _TurnHandle) else None
        if handle is None:
            return None
        return handle.conn.watch_dry(handle.turn_id, on_provider)

    def send_text(self, turn_id: str, text: str) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None and turn.handle is not None:
            turn.text.append(text)
            turn.handle.send_text(text)

    def end_turn(self, turn_id: str) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None and turn.handle is not None:
            turn.ended = True
            turn.handle.end()
            self._arm(turn, turn.attempt)

    def cancel(self, turn_id: str) -> None:
        turn = self.turns.pop(turn_id, None)
        if turn is None:
            return
        if turn_id in self._deadlines:
            self._deadlines.disarm(turn_id)
            self._set_timer()
        if turn.handle is not None:
            turn.handle.cancel()
        if turn.waiter is not None and self.cache is not None:
            self.cache.leave(turn.waiter)  # the render goes on for the others and the cache
            turn.waiter = None

    def _start(self, turn: _SpokenTurn) -> None:
        pool = self.pools[turn.chain_index]
        turn.attempt += 1
        attempt = turn.attempt
        if turn.cacheable and self.cache is not None:
            sink = functools.partial(self._on_event, turn)
            _, turn.waiter = render_prompt(
                self.cache, pool, turn.settings, "".join(turn.text), turn.turn_id, sink
            )
            self._arm(turn, attempt)  # a hit has played (and ended) already: nothing armed
            return
        settings = _turn_settings(pool, turn.settings)
        try:
            direct = self._direct_sinks(turn, attempt)
            turn.handle = pool.open_turn(
                turn.turn_id, settings, lambda e: self._on_event(turn, e, attempt), *direct
            )
            text = "".join(turn.text)
            if text:
                turn.handle.send_text(text)
            if turn.ended:
                turn.handle.end()
        except LocalProtocolError as e:
            # the engine refused the turn (no free context, connection closing): a
            # failed turn on this provider, so the next one in the chain gets it and
            # the call hears about it as a provider error rather than ending
            log.warning("tts.open_refused", provider=pool.name, turn_id=turn.turn_id, error=str(e))
            if turn.handle is not None:
                turn.handle.cancel()
                turn.handle = None
            self._on_event(turn, TurnFailed(turn.turn_id, "open_refused", str(e), retryable=True))
            return
        self._arm(turn, attempt)

    def _direct_sinks(
        self, turn: _SpokenTurn, attempt: int
    ) -> tuple[AudioSink | None, WordsSink | None]:
        """The turn's audio and word timings straight to its sink (what ``_on_event``
        does with them)."""
        turns, turn_id, sink = self.turns, turn.turn_id, turn.sink

        def audio_sink(audio: bytes, audio_format: AudioFormat) -> None:
            # else cancelled, or given up at its first-audio deadline: late audio is dropped
            if turns.get(turn_id) is turn and turn.attempt == attempt:
                if not turn.got_audio:
                    self._first_audio(turn)
                sink(AudioReceived(turn_id, audio, audio_format))

        def words_sink(words: tuple[WordTiming, ...]) -> None:
            if turns.get(turn_id) is turn and turn.attempt == attempt:
                sink(WordsTimed(turn_id, words))

        return audio_sink, words_sink

    def _on_event(self, turn: _SpokenTurn, event: Event, attempt: int | None = None) -> None:
        if self.turns.get(turn.turn_id) is not turn:
            return  # cancelled: late events are dropped here too
        if attempt is not None and attempt != turn.attempt:
            return  # a provider given up at its first-audio deadline
        cls = type(event)
        if cls is AudioReceived:  # the bulk of a turn: straight on
            if not turn.got_audio:
                self._first_audio(turn)
            turn.sink(event)
            return
        if cls is WordsTimed:
            turn.sink(event)
            return
        failed = isinstance(event, TurnFailed | ProviderFailed)
        if failed and not turn.got_audio and turn.chain_index + 1 < len(self.pools):
            log.warning(
                "tts.failover",
                turn_id=turn.turn_id,
                provider=self.pools[turn.chain_index].name,
                next=self.pools[turn.chain_index + 1].name,
                kind=getattr(event, "kind", ""),
            )
            self.failovers += 1
            turn.chain_index += 1
            turn.waiter = None
            self._start(turn)
            return
        if failed and not turn.got_audio and self._fall_back(turn, event):
            return
        if isinstance(event, TurnDone | TurnFailed | ProviderFailed):
            self.turns.pop(turn.turn_id, None)
            turn.waiter = None  # its sink holds the turn: no cycle left behind
            if turn.turn_id in self._deadlines:
                self._deadlines.disarm(turn.turn_id)
                self._set_timer()
        turn.sink(event)

    def _fall_back(self, turn: _SpokenTurn, event: Event) -> bool:
        """Play the fallback prompt as the failed turn's audio, if the cache holds it or is
        rendering it (``TurnFellBack`` first); ``False``: nothing to play, fail as before."""
        pool = self._fallback_pool(turn, cached_only=False)
        if pool is not None and self.cache is not None:
            settings = TurnSettings(self.fallback_voice, turn.settings.audio_format)
            turn.fell_back = True
            self.fallbacks += 1
            if turn.handle is not None:
                turn.handle = None  # failed: the text still to come has nowhere to go
            kind, message = getattr(event, "kind", ""), getattr(event, "message", "")
            log.warning("tts.fallback_prompt", turn_id=turn.turn_id, provider=pool.name, kind=kind)
            turn.sink(TurnFellBack(turn.turn_id, kind, message))
            if self.turns.get(turn.turn_id) is not turn:
                return True  # the call let go of the turn meanwhile
            sink = functools.partial(self._on_event, turn)
            _, turn.waiter = render_prompt(
                self.cache, pool, settings, self.fallback_prompt, turn.turn_id, sink, lead=False
            )
            return True
        return False

    def _fallback_pool(self, turn: _SpokenTurn, cached_only: bool) -> ProviderPool | None:
        """The pool whose rendering of the fallback prompt the cache holds (or, unless
        ``cached_only``, is rendering) for this turn's format; ``None``: none."""
        if turn.fell_back or not self.fallback_prompt or self.cache is None:
            return None
        settings = TurnSettings(self.fallback_voice, turn.settings.audio_format)
        for pool in self.pools:
            key = prompt_key(pool, settings, self.fallback_prompt)
            if self.cache.holds(key) or (not cached_only and self.cache.in_flight(key)):
                return pool
        return None

    # ------------------------------------------------- first-audio deadline

    def _first_audio(self, turn: _SpokenTurn) -> None:
        turn.got_audio = True
        if turn.turn_id in self._deadlines:
            self._deadlines.disarm(turn.turn_id)
            self._set_timer()

    def _has_way_out(self, turn: _SpokenTurn) -> bool:
        """Whether a turn given up on its provider now would be heard anyway: a next
        provider to fail over to, or the fallback prompt in the cache."""
        if turn.chain_index + 1 < len(self.pools):
            return True
        return self._fallback_pool(turn, cached_only=True) is not None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _arm(self, turn: _SpokenTurn, attempt: int) -> None:
        """Start the turn's first-audio deadline on its current provider, if it has one
        (a timeout set, its whole text given, no audio yet, a way out)."""
        index, timeouts = turn.chain_index, self.first_audio_timeouts
        timeout_s = timeouts[index] if index < len(timeouts) else 0.0
        if (
            timeout_s <= 0
            or not turn.ended
            or turn.got_audio
            or turn.fell_back
            or turn.attempt != attempt
            or self.turns.get(turn.turn_id) is not turn
            or not self._has_way_out(turn)
        ):
            return
        self._deadlines.arm(turn.turn_id, self._now(), timeout_s)
        self._set_timer()

    def _set_timer(self) -> None:
        """One timer, at the earliest deadline armed (none with none)."""
        at = self._deadlines.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is None:
            return
        if self._call_at is not None:
            self._timer = self._call_at(at, self._on_timer)
        else:
            self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self.check_deadlines(self._now())

    def check_deadlines(self, now: float) -> None:
        """Give up every turn whose first-audio deadline has passed at ``now`` (the
        timer's callback; tests call it with a fake clock)."""
        for turn_id in self._deadlines.expired(now):
            turn = self.turns.get(turn_id)
            if turn is not None and not turn.got_audio and self._has_way_out(turn):
                self._give_up(turn)
        self._set_timer()

    def _give_up(self, turn: _SpokenTurn) -> None:
        """The turn's provider sent no audio in time: cancel the turn there (a shared
        prompt render is only left: it goes on to fill the cache) and fail it over or
        fall back, as for a failure before audio."""
        index = turn.chain_index
        pool = self.pools[index]
        timeout_s = self.first_audio_timeouts[index]
        turn.attempt += 1  # whatever that provider still sends for the turn is dropped
        if turn.handle is not None:
            turn.handle.cancel()
            turn.handle = None
        if turn.waiter is not None and self.cache is not None:
            self.cache.leave(turn.waiter)
            turn.waiter = None
        if self._fallback_pool(turn, cached_only=True) is not None:
            turn.chain_index = len(self.pools) - 1  # the turn's budget is spent: fall back now
        else:
            self._deadlines.restart(turn.turn_id)  # nothing to play: the next provider's own
        self.first_audio_expired += 1
        log.warning(
            "tts.first_audio_timeout", turn_id=turn.turn_id, provider=pool.name, timeout_s=timeout_s
        )
        message = f"no audio from provider {pool.name} within {timeout_s:g} s"
        self._on_event(turn, TurnFailed(turn.turn_id, FIRST_AUDIO_TIMEOUT_KIND, message, True))

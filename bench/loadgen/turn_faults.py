"""A Kova provider that fails mid-turn: a fault proxy in front of a real tts-server.

The daemon connects to the proxy as to any Kova provider; every connection is
relayed, message by message, to the reference TTS server behind it. For a
seeded fraction of the turns that carry a token (``k<digits>`` in their text:
the soak's dynamic turns), the proxy injects a fault at the moment the turn's
first ``audio_chunk`` comes back: the provider has accepted the turn (its
context started, its text sent), and its audio is what fails:

``drop``
    both connections are reset (no close frame): every turn open on that
    connection fails with it.
``garbage``
    a frame that is not JSON goes to the daemon instead of the audio (Kova:
    the connection fails, every turn on it) and the upstream connection is
    closed.
``stall``
    nothing more of that turn is forwarded (its audio, its flush); the other
    turns on the connection go on.

Before the first audio nothing has been heard, so each such turn must fail
over to the next provider of its route, or play the fallback prompt; the soak
checks that from the application's side. ``faulted`` lists every turn a fault
hit, by kind and token (collateral turns of a ``drop`` or ``garbage`` on the
same connection included; turns without a token, such as prompt renders, are
counted in ``collateral_untokened``). Faults start when ``armed`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from dataclasses import dataclass, field

import websockets

__all__ = ["FAULT_KINDS", "TurnFaultProxy"]

FAULT_KINDS = ("drop", "garbage", "stall")
TOKEN = re.compile(r"\bk\d+\b")
GARBAGE = '}{"audio_chunk": not json'


@dataclass
class _Conn:
    """One relayed connection: what the proxy knows of its turns."""

    tokens: dict[str, str] = field(default_factory=dict)
    """context id -> the turn's token (from its text)."""
    open: set[str] = field(default_factory=set)
    """Contexts started and not finished."""
    decided: set[str] = field(default_factory=set)
    """Contexts whose first audio has been seen (faulted or not)."""
    stalled: set[str] = field(default_factory=set)


class TurnFaultProxy:
    """Listens on loopback; relays Kova connections to ``upstream`` (a ws:// URL)."""

    def __init__(
        self, upstream: str, fraction: float, kinds: tuple[str, ...] = FAULT_KINDS, seed: int = 0
    ) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"--turn-faults: expected a fraction in [0, 1], got {fraction}")
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(f"--turn-fault-kinds: expected some of {FAULT_KINDS}, got {kinds}")
        self.upstream = upstream
        self.fraction = fraction
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.armed = False
        self.faulted: list[tuple[str, str]] = []
        """(kind, token) of every turn a fault hit."""
        self.injected: dict[str, int] = {k: 0 for k in kinds}
        """Faults injected, by kind (one ``drop`` can hit several turns)."""
        self.collateral_untokened = 0
        self.connections = 0
        self.upstream_failures = 0
        self._server: websockets.Server | None = None

    async def start(self) -> None:
        self._server = await websockets.serve(
            self._handler, "127.0.0.1", 0, max_size=None, compression=None
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(next(iter(self._server.sockets)).getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handler(self, client: websockets.ServerConnection) -> None:
        self.connections += 1
        assert client.request is not None  # the handler runs after the handshake
        headers = [
            (k, v) for k, v in client.request.headers.raw_items() if k.lower() == "authorization"
        ]
        try:
            upstream = await websockets.connect(
                self.upstream, additional_headers=headers, max_size=None, compression=None
            )
        except (OSError, websockets.WebSocketException):
            self.upstream_failures += 1  # the server behind is down (the soak kills it)
            await client.close(1011, "upstream down")
            return
        conn = _Conn()
        down = asyncio.ensure_future(self._down(conn, upstream, client))
        try:
            async for msg in client:
                if isinstance(msg, str):
                    self._note_up(conn, msg)
                await upstream.send(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            down.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await down
            await upstream.close()

    def _note_up(self, conn: _Conn, msg: str) -> None:
        try:
            frame = json.loads(msg)
        except ValueError:
            return
        if not isinstance(frame, dict):
            return
        ctx = frame.get("context_id")
        if not isinstance(ctx, str):
            return
        if "start_context" in frame:
            conn.open.add(ctx)
        text = frame.get("send_text")
        if isinstance(text, str) and ctx not in conn.tokens:
            found = TOKEN.search(text)
            if found:
                conn.tokens[ctx] = found.group(0)

    async def _down(
        self,
        conn: _Conn,
        upstream: websockets.ClientConnection,
        client: websockets.ServerConnection,
    ) -> None:
        try:
            async for msg in upstream:
                if isinstance(msg, str) and not await self._pass_down(conn, msg, upstream, client):
                    continue
                await client.send(msg)
        except websockets.ConnectionClosed:
            pass
        await client.close()

    async def _pass_down(
        self,
        conn: _Conn,
        msg: str,
        upstream: websockets.ClientConnection,
        client: websockets.ServerConnection,
    ) -> bool:
        """Whether to forward ``msg``; injects the turn's fault at its first audio."""
        try:
            frame = json.loads(msg)
        except ValueError:
            return True
        ctx = frame.get("context_id") if isinstance(frame, dict) else None
        if not isinstance(ctx, str):
            return True
        if ctx in conn.stalled:
            if "context_closed" in frame:  # the daemon gave up on it: let it be forgotten
                conn.stalled.discard(ctx)
                conn.open.discard(ctx)
                return True
            return False
        if "flush_completed" in frame or "context_closed" in frame or "error" in frame:
            conn.open.discard(ctx)
        if "audio_chunk" not in frame or ctx in conn.decided:
            return True
        conn.decided.add(ctx)
        if not self.armed or ctx not in conn.tokens or self.rng.random() >= self.fraction:
            return True
        kind = self.rng.choice(self.kinds)
        self.injected[kind] += 1
        if kind == "stall":
            conn.stalled.add(ctx)
            self.faulted.append((kind, conn.tokens[ctx]))
            return False
        for other in sorted(conn.open):
            token = conn.tokens.get(other)
            if token is None:
                self.collateral_untokened += 1
            else:
                self.faulted.append((kind, token))
        conn.open.clear()
        if kind == "drop":
            client.transport.abort()
            upstream.transport.abort()
        else:
            await client.send(GARBAGE)
            upstream.transport.abort()
        return False

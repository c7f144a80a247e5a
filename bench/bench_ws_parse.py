"""Receiving provider audio: websockets' own frame parser against the shell's hand-written one.

The provider shell (``bridge/io/provider_ws.py``) cuts the common frame (a
whole unmasked text or binary message) from the bytes itself and hands every
other frame to websockets' sans-I/O parser. Issue 32 asks for one parser,
websockets' own, unless the hand-written one is worth more than 10 % of the
daemon's CPU at 500 calls. This measures both on the same bytes, with no
network: a stream of server frames as a provider sends them, fed in reads of
``--read-bytes``, to

* ``hand``: the hand-written cutter the shell had before (its common path,
  kept here as the reference: ``_Cutter``);
* ``websockets``: websockets' ``ClientProtocol.receive_data`` +
  ``events_received``, each text frame decoded as UTF-8 (what a shell on
  websockets' sans-I/O protocol alone would do per read);
* ``provider_ws``: the shell's ``_ProviderWebSocket.data_received`` as it is
  (websockets' parser under its asyncio connection, the stream offsets kept).

Each message kind is a provider's real shape: Kova's ``audio_chunk`` JSON with
16 000 bytes of PCM (24 kHz: 1/3 s) or of mu-law (8 kHz: 2 s) base64-encoded,
a 20 ms mu-law chunk in JSON (the smallest audio message any protocol here
sends: the worst case per frame), and zwst's 40 ms binary frame of 24 kHz PCM.
The figure is this process's CPU (``time.process_time()``) per message, the
least of ``--reps``; per second of a call's audio it is that times the
messages per audio second. At 500 calls all receiving audio in real time (a
worst case: calls listen part of the time) the difference between two parsers
is ``500 x`` that, as a share of the daemon's CPU at 500 calls
(``--daemon-busy``, the core's busy fraction in the capacity benchmark:
74-96 %, ``docs/benchmarks.md``).

    python -m bench.bench_ws_parse [--messages N] [--reps R] [--read-bytes B]

Writes ``bench/results/ws_parse.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from bench.common import write
from bridge.io.provider_ws import _ProviderWebSocket

CALLS = 500
MAX_SIZE = 16 * 1024 * 1024


def _frame(payload: bytes, opcode: int) -> bytes:
    """One unmasked, final server frame."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def _kova(audio_bytes: int) -> bytes:
    b64 = base64.b64encode(bytes(range(256)) * (audio_bytes // 256) + b"\0" * (audio_bytes % 256))
    return b'{"audio_chunk":"' + b64 + b'","context_id":"greeting~17"}'


_WORD_TIMES = (
    b'{"timestamps":{"words":["The"],"start_seconds":[0.0],"end_seconds":[0.09]},"context_id":"c1"}'
)

KINDS: dict[str, tuple[list[tuple[bytes, int]], float]] = {
    # name: (the frames of one group: payload, opcode; seconds of audio per group)
    # the capacity benchmark's traffic (Kova, reference server, ``tone`` engine): one
    # audio_chunk (a word, 190 ms median) and its timestamps message, ~10.5 messages a second
    "capacity_kova_mulaw8k": ([(_kova(1520), 0x1), (_WORD_TIMES, 0x1)], 0.19),
    "capacity_kova_pcm24k": ([(_kova(9120), 0x1), (_WORD_TIMES, 0x1)], 0.19),
    # the reference server's largest chunk (16 000 bytes: 1/3 s of 24 kHz PCM)
    "kova_pcm24k_16000B": ([(_kova(16_000), 0x1)], 16_000 / 48_000),
    # the smallest audio message any protocol here sends: a 20 ms chunk in JSON (worst case)
    "json_mulaw8k_20ms": ([(_kova(160), 0x1)], 0.020),
    # zwst: a 40 ms binary frame of 24 kHz PCM behind its 16-byte header
    "zwst_pcm24k_40ms": ([(b"\0" * 16 + b"\1" * 1920, 0x2)], 0.040),
}
DECIDING = ("capacity_kova_mulaw8k", "capacity_kova_pcm24k")
"""The kinds the 10 % rule is judged on: what the daemon receives at 500 calls in the
capacity benchmark."""


class _FakeTransport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _handshake() -> tuple[ClientProtocol, bytes]:
    """A client protocol that sent its request, and the server's 101 answer to it."""
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1:9/v1/ws"), max_size=MAX_SIZE)
    request = protocol.connect()
    protocol.send_request(request)
    protocol.data_to_send()
    accept = accept_key(request.headers["Sec-WebSocket-Key"])
    response = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
    )
    return protocol, response


class _Cutter:
    """The hand-written cutter the shell had (until issue 32), its common path: whole,
    unmasked text and binary frames cut from the bytes, a frame not yet complete kept
    for the next read, text decoded as UTF-8 (the handover to websockets' parser of
    anything else, and the stream offsets, left out: they cost nothing here)."""

    def __init__(self, on_message: Callable[[str | bytes], None]) -> None:
        self.on_message = on_message
        self.pending = b""
        self.received = self.consumed = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        buf = self.pending + data if self.pending else data
        self.pending = b""
        size, pos = len(buf), 0
        on_message = self.on_message
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, head = b1 & 0x7F, pos + 2
            if length >= 126:
                extra = 2 if length == 126 else 8
                if size - head < extra:
                    break
                length, head = int.from_bytes(buf[head : head + extra], "big"), head + extra
            if b1 & 0x80 or b0 & 0x70 or length > MAX_SIZE:
                raise RuntimeError("a frame for websockets' parser: not in this benchmark")
            end = head + length
            if end > size:
                break
            pos = end
            self.consumed = self.received - size + end
            if b0 == 0x81:
                on_message(str(buf[head:end], "utf-8"))
            else:
                on_message(buf[head:end])
        if pos < size:
            self.pending = buf[pos:]


def _hand(on_message: Callable[[str | bytes], None]) -> Callable[[bytes], None]:
    return _Cutter(on_message).data_received


def _provider_ws(on_message: Callable[[str | bytes], None]) -> Callable[[bytes], None]:
    protocol, response = _handshake()
    ws = _ProviderWebSocket(protocol, on_message=on_message)
    ws.connection_made(_FakeTransport())  # type: ignore[arg-type]
    ws.data_received(response)
    if protocol.state is not State.OPEN:
        raise RuntimeError("the handshake did not complete")
    return ws.data_received


def _websockets(on_message: Callable[[str | bytes], None]) -> Callable[[bytes], None]:
    protocol, response = _handshake()
    protocol.receive_data(response)
    protocol.events_received()
    if protocol.state is not State.OPEN:
        raise RuntimeError("the handshake did not complete")
    receive, events = protocol.receive_data, protocol.events_received
    text, binary = Opcode.TEXT, Opcode.BINARY

    def feed(data: bytes) -> None:
        receive(data)
        for frame in events():
            opcode = frame.opcode
            if opcode is text:
                on_message(str(frame.data, "utf-8"))
            elif opcode is binary:
                on_message(bytes(frame.data))

    return feed


def measure(kind: str, parser: str, groups: int, read_bytes: int, reps: int) -> float:
    """CPU seconds per group of messages, the least of ``reps`` feeds of ``groups`` (the
    least: on a shared host the other processes only ever add to a feed's time)."""
    frames, _ = KINDS[kind]
    stream = b"".join(_frame(payload, opcode) for payload, opcode in frames) * groups
    messages = groups * len(frames)
    reads = [stream[i : i + read_bytes] for i in range(0, len(stream), read_bytes)]
    samples = []
    for _ in range(reps):
        got = 0

        def on_message(msg: str | bytes) -> None:
            nonlocal got
            got += 1

        feed = {"hand": _hand, "websockets": _websockets, "provider_ws": _provider_ws}[parser](
            on_message
        )
        t0 = time.process_time()
        for data in reads:
            feed(data)
        samples.append(time.process_time() - t0)
        if got != messages:
            raise RuntimeError(f"{parser}/{kind}: {got} messages of {messages}")
    return min(samples) / groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--read-bytes", type=int, default=65_536)
    ap.add_argument("--daemon-busy", type=float, default=0.74, help="core fraction at 500 calls")
    ap.add_argument("--out", default="ws_parse")
    ap.add_argument(
        "--quick", action="store_true", help="make bench-quick: 3 reps, to ws_parse_quick"
    )
    args = ap.parse_args()
    if args.quick:
        args.reps = min(args.reps, 3)
        args.out = "ws_parse_quick" if args.out == "ws_parse" else args.out
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    """The measurements (websockets' asyncio connection wants a running loop)."""
    figures: dict[str, dict[str, float | bool]] = {}
    print(f"{'kind':22} {'parser':16} {'us/msg':>8} {'us/audio s':>11} {'500 calls':>10}")
    for kind, (frames, audio_s) in KINDS.items():
        row: dict[str, float | bool] = {"messages_per_audio_s": round(len(frames) / audio_s, 2)}
        # big messages: fewer of them, the same order of magnitude of bytes
        n = args.messages if audio_s < 0.1 else max(args.messages // 10, 50)
        for parser in ("hand", "websockets", "provider_ws"):
            per_group_s = measure(kind, parser, n, args.read_bytes, args.reps)
            per_audio_s = per_group_s / audio_s
            share = CALLS * per_audio_s  # core seconds per second, every call listening
            per_msg_us = per_group_s * 1e6 / len(frames)
            row[f"{parser}_us_per_msg"] = round(per_msg_us, 3)
            row[f"{parser}_us_per_audio_s"] = round(per_audio_s * 1e6, 2)
            row[f"{parser}_core_pct_500_calls"] = round(100 * share, 3)
            print(
                f"{kind:22} {parser:16} {per_msg_us:8.2f} {per_audio_s * 1e6:11.1f} "
                f"{100 * share:9.2f}%"
            )
        extra = row["provider_ws_core_pct_500_calls"] - row["hand_core_pct_500_calls"]
        row["provider_ws_extra_pct_of_daemon_cpu"] = round(extra / args.daemon_busy, 2)
        print(f"{'':22} websockets' parser: {extra / args.daemon_busy:+.2f} % of the daemon's CPU")
        figures[kind] = row
    worst = max(float(figures[k]["provider_ws_extra_pct_of_daemon_cpu"]) for k in DECIDING)
    verdict = "websockets' parser" if worst <= 10.0 else "keep the hand-written cutter"
    print(f"at 500 calls of the capacity benchmark's traffic: {worst:+.2f} % -> {verdict}")
    figures["verdict"] = {"worst_extra_pct_of_daemon_cpu": worst, "over_10_pct": worst > 10.0}
    settings = {
        "messages": args.messages,
        "reps": args.reps,
        "read_bytes": args.read_bytes,
        "daemon_busy": args.daemon_busy,
        "calls": CALLS,
    }
    print(write(args.out, figures, settings))


if __name__ == "__main__":
    main()

"""The capture reader that replaced tshark in the media-stream pacing measurement.

Three checks: hand-built pcapng files (both byte orders, nanosecond and default
microsecond resolution, IPv6, a truncated last block); the same segments as
tshark reads them from a file text2pcap wrote (an independent implementation
of both ends); and a real ``dumpcap`` capture of a WebSocket server's media
messages on loopback, read back by ``WireCapture``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import struct
import subprocess
import time
from pathlib import Path

import pytest

from bench.loadgen.pcap import PcapError, TcpSegment, tcp_segments
from bench.loadgen.wire import WireCapture

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def _block(endian: str, block_type: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    n = len(body) + 12
    return struct.pack(endian + "II", block_type, n) + body + struct.pack(endian + "I", n)


def _shb(endian: str) -> bytes:
    return _block(endian, 0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))


def _idb(endian: str, link_type: int = 1, tsresol: int | None = None) -> bytes:
    body = struct.pack(endian + "HHI", link_type, 0, 0)
    if tsresol is not None:
        body += struct.pack(endian + "HH", 9, 1) + bytes([tsresol, 0, 0, 0])
        body += struct.pack(endian + "HH", 0, 0)
    return _block(endian, 1, body)


def _tcp(src: int, dst: int, seq: int, payload: bytes, v6: bool = False) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", src, dst, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    if v6:
        ip = (
            struct.pack("!IHBB", 6 << 28, len(tcp), 6, 64) + b"\0" * 15 + b"\1" + b"\0" * 15 + b"\1"
        )
        return b"\0" * 12 + b"\x86\xdd" + ip + tcp
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0,
                     b"\x7f\0\0\1", b"\x7f\0\0\1")  # fmt: skip
    return b"\0" * 12 + b"\x08\x00" + ip + tcp


def _epb(endian: str, ts: int, packet: bytes, iface: int = 0) -> bytes:
    head = struct.pack(endian + "IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(packet), len(packet))
    return _block(endian, 6, head + packet)


@pytest.mark.parametrize("endian", ["<", ">"])
def test_segments_from_a_hand_built_capture(tmp_path: Path, endian: str) -> None:
    t = 1_764_633_600_123_456_789  # ns since the epoch
    data = _shb(endian) + _idb(endian, tsresol=9) + _idb(endian)  # ns, then the default (µs)
    data += _epb(endian, t, _tcp(8080, 50001, 7, b"hello"))
    data += _epb(endian, t + 1, _tcp(50001, 8080, 9, b""))  # no payload: not a segment here
    data += _epb(endian, t // 1000, _tcp(8080, 50002, 0xFFFFFFFF, b"x" * 3), iface=1)
    data += _epb(endian, t + 5, _tcp(8080, 50003, 1, b"six", v6=True))
    path = tmp_path / "c.pcapng"
    path.write_bytes(data + _epb(endian, t, _tcp(1, 2, 3, b"cut"))[:-9])  # dumpcap killed
    assert list(tcp_segments(path)) == [
        TcpSegment(t, 8080, 50001, 7, b"hello"),
        TcpSegment(t // 1000 * 1000, 8080, 50002, 0xFFFFFFFF, b"xxx"),
        TcpSegment(t + 5, 8080, 50003, 1, b"six"),
    ]


def test_a_file_that_is_not_pcapng_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"\0" * 32)
    with pytest.raises(PcapError):
        list(tcp_segments(path))
    empty = tmp_path / "empty.pcapng"
    empty.write_bytes(b"")
    assert list(tcp_segments(empty)) == []


@pytest.mark.needs("text2pcap", "tshark")
def test_the_same_segments_as_tshark_reads(tmp_path: Path) -> None:
    # text2pcap wraps each hex dump in Ethernet/IPv4/TCP headers of its own making
    lines = []
    for k, size in enumerate([1, 300, 1448, 17, 65]):
        payload = bytes((k * 37 + i) % 256 for i in range(size))
        lines.append(f"2026-12-02 01:02:{k:02d}.{123457 + k * 1000:06d}")
        for off in range(0, size, 16):
            lines.append(f"{off:06x} " + " ".join(f"{b:02x}" for b in payload[off : off + 16]))
    dump = tmp_path / "in.txt"
    dump.write_text("\n".join(lines) + "\n")
    path = tmp_path / "t.pcapng"
    subprocess.run(
        ["text2pcap", "-q", "-n", "-t", "%Y-%m-%d %H:%M:%S.", "-4", "127.0.0.1,127.0.0.1",
         "-T", "8080,50001", str(dump), str(path)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    out = subprocess.run(
        ["tshark", "-n", "-r", str(path), "-o", "tcp.desegment_tcp_streams:FALSE",
         "-Y", "tcp.len > 0", "-T", "fields", "-E", "separator=/t",
         "-e", "frame.time_epoch", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "tcp.seq_raw",
         "-e", "tcp.payload"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    theirs = []
    for line in out.splitlines():
        epoch, src, dst, seq, hexdata = line.split("\t")
        sec, _, frac = epoch.partition(".")
        t_ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        theirs.append(
            TcpSegment(t_ns, int(src), int(dst), int(seq), bytes.fromhex(hexdata.replace(":", "")))
        )
    ours = list(tcp_segments(path))
    assert len(ours) == 5
    assert ours == theirs


@pytest.mark.needs("dumpcap")
@pytest.mark.needs("root", why="capturing on lo with dumpcap")
def test_a_real_capture_of_media_messages(tmp_path: Path) -> None:
    import websockets

    sizes = [160, 160, 320, 1100, 160]

    async def server(ws: websockets.ServerConnection) -> None:
        for n in sizes:
            payload = base64.b64encode(bytes(n)).decode()
            media = {"event": "media", "streamSid": "MZ1", "media": {"payload": payload}}
            await ws.send(json.dumps(media, separators=(",", ":")))
            await ws.send('{"event":"mark","streamSid":"MZ1","mark":{"name":"m"}}')
            await asyncio.sleep(0.02)
        await ws.close()

    async def client(port: int) -> int:
        got = 0
        async with websockets.connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
            async for _ in ws:
                got += 1
        return got

    async def attached(capture: WireCapture, port: int) -> None:
        """Until the file holds a captured packet: dumpcap attaches its filter a moment
        after the file opens, and hands packets over a block at a time. Each probe is a
        connection the server accepts (its SYN-ACK matches the filter) and we drop."""
        loop = asyncio.get_running_loop()
        empty = capture.path.stat().st_size
        deadline = loop.time() + 10 * FACTOR
        while capture.path.stat().st_size == empty:
            assert loop.time() < deadline, "dumpcap captured nothing"
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await asyncio.sleep(0.05)

    async def run(capture_for: list[WireCapture], window: list[int]) -> int:
        async with websockets.serve(server, "127.0.0.1", 0, compression=None) as srv:
            port = srv.sockets[0].getsockname()[1]
            capture_for.append(await asyncio.to_thread(WireCapture, port, tmp_path))
            await attached(capture_for[0], port)
            window.append(time.time_ns())
            got = await client(port)
            window.append(time.time_ns())
            return got

    captures: list[WireCapture] = []
    window: list[int] = []
    assert asyncio.run(run(captures, window)) == 2 * len(sizes)
    t0, t1 = window
    [capture] = captures
    capture.stop()
    assert capture.dropped == 0 and capture.received
    found = capture.media_messages(t0, t1).values()
    [(times, payload_bytes)] = [f for f in found if len(f[0])]  # not the probes
    assert list(payload_bytes) == sizes
    assert len(times) == len(sizes) and all(t0 <= t < t1 for t in times)
    assert all(b - a >= 15_000_000 for a, b in itertools.pairwise(times))  # the 20 ms sleeps

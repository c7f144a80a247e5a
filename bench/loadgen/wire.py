"""Kernel timestamps of a media-stream leg's outbound ``media`` messages.

``dumpcap`` captures what the daemon writes on its media-stream port (TCP on
loopback); the capture is read back by ``loadgen.pcap`` (not ``tshark``: see
there why), each server-to-client stream is reassembled and its WebSocket
frames parsed, and every ``media`` message is timed by the segment carrying
its last byte. So the pacing of the WebSocket leg is the daemon's, not the
user-space receiver's. Needs root and ``dumpcap`` (the Debian ``tshark``
package brings it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from .pcap import tcp_segments
from .procs import LOADGEN_CORE

__all__ = ["WireCapture"]

FLUSH_S = 1.0
"""How long ``WireCapture.stop`` lets dumpcap read before interrupting it."""


class WireCapture:
    """``dumpcap`` on loopback: what the daemon writes on its media-stream port."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.path = workdir / f"ws_{port}_{time.monotonic_ns()}.pcapng"
        self.received: int | None = None
        self.dropped: int | None = None
        self.proc = subprocess.Popen(
            ["dumpcap", "-q", "-i", "lo", "-f", f"tcp src port {port}", "-B", "64",
             "-w", str(self.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: os.sched_setaffinity(0, {LOADGEN_CORE}),
        )  # fmt: skip
        deadline = time.monotonic() + 5.0
        while not self.path.exists() and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"dumpcap exited: {self.proc.stderr.read() if self.proc.stderr else ''!r}"
                )
            time.sleep(0.05)
        time.sleep(0.3)  # the filter is attached once the file is open

    @staticmethod
    def available() -> bool:
        return bool(shutil.which("dumpcap")) and os.geteuid() == 0

    def stop(self) -> None:
        """Stop ``dumpcap``, first letting it read what was sent up to now.

        libpcap hands captured packets over a ring block at a time (or at the
        block's timeout): packets sent just before the interrupt would still
        sit in an unfinished block and never reach the file (seen: a
        WebSocket exchange 3 ms before the stop was not captured at all).
        """
        if self.proc.poll() is None:
            time.sleep(FLUSH_S)
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        # "Packets received/dropped on interface 'lo': 1000/0 (pcap:0/dumpcap:0/...)"
        got = re.search(r"received/dropped on interface .*?: (\d+)/(\d+)", (err or b"").decode())
        if got:
            self.received, self.dropped = int(got[1]), int(got[2])

    def media_departures(self, t0_ns: int, t1_ns: int) -> dict[int, np.ndarray]:
        """Kernel time (ns, CLOCK_REALTIME) of each outbound ``media`` per connection.

        Keyed by the carrier's port; only messages whose last byte left
        within ``[t0_ns, t1_ns)``.
        """
        return {port: t for port, (t, _) in self.media_messages(t0_ns, t1_ns).items()}

    def media_messages(self, t0_ns: int, t1_ns: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """(kernel time in ns, payload bytes) of each outbound ``media`` per connection,
        as ``media_departures`` (the sizes time a peer whose messages are not 20 ms)."""
        streams: dict[int, _WsStream] = {}
        for seg in tcp_segments(self.path):
            if seg.src_port != self.port:
                continue
            stream = streams.get(seg.dst_port)
            if stream is None:
                stream = streams[seg.dst_port] = _WsStream()
            stream.segment(seg.seq, seg.payload, seg.t_ns)
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for port, s in streams.items():
            t = np.asarray(s.media_ns, dtype=np.int64)
            n = np.asarray(s.media_bytes, dtype=np.int64)
            keep = (t >= t0_ns) & (t < t1_ns)
            found[port] = (t[keep], n[keep])
        return found


class _WsStream:
    """One server-to-client TCP stream: HTTP 101 head, then unmasked WebSocket frames."""

    def __init__(self) -> None:
        self.next_seq: int | None = None
        self.buf = bytearray()
        self.in_head = True
        self.synced = True
        self.media_ns: list[int] = []
        self.media_bytes: list[int] = []
        self.lost_bytes = 0

    def segment(self, seq: int, data: bytes, t_ns: int) -> None:
        if self.next_seq is not None:
            skip = (self.next_seq - seq) % (1 << 32)
            if 0 < skip < (1 << 31):  # a retransmission: only the new tail counts
                if skip >= len(data):
                    return
                data = data[skip:]
                seq = self.next_seq
            elif seq != self.next_seq:  # a gap (dropped by the capture): resync impossible
                self.lost_bytes += (seq - self.next_seq) % (1 << 32)
                self.synced = False
        self.next_seq = (seq + len(data)) % (1 << 32)
        if not self.synced:
            return
        self.buf += data
        if self.in_head:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buf[: end + 4]
            self.in_head = False
        self._frames(t_ns)

    def _frames(self, t_ns: int) -> None:
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if len(buf) - pos < 4:
                    break
                n, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif n == 127:
                if len(buf) - pos < 10:
                    break
                n, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if b1 & 0x80:  # a masked frame from the server: not a stream we understand
                self.synced = False
                return
            if len(buf) - pos < head + n:
                break
            if b0 & 0x0F == 1 and (
                buf.startswith(_MEDIA, pos + head) or buf.startswith(_MEDIA_SPACED, pos + head)
            ):
                self.media_ns.append(t_ns)
                self.media_bytes.append(_payload_bytes(buf, pos + head, pos + head + n))
            pos += head + n
        del buf[:pos]


_MEDIA = b'{"event":"media"'
_MEDIA_SPACED = b'{"event": "media"'  # json.dumps' default separators (Pipecat)
_PAYLOAD = b'"payload":'


def _payload_bytes(buf: bytearray, start: int, end: int) -> int:
    """Decoded size of the base64 payload of the ``media`` message in ``buf[start:end]``."""
    i = buf.find(_PAYLOAD, start, end)
    if i < 0:
        return 0
    i = buf.find(b'"', i + len(_PAYLOAD), end) + 1
    j = buf.find(b'"', i, end)
    if i <= 0 or j < 0:
        return 0
    return (j - i) * 3 // 4 - buf[max(i, j - 2) : j].count(b"=")

"""A SIP caller behind NAT, for tests/e2e/test_sip_nat_netns.py (standard library only).

Run inside a network namespace (``ip netns exec``): it binds its SIP and RTP sockets to
``--local`` (the phone's private address), calls ``--target`` with an SDP naming that
address, then sends 20 ms PCMU packets (one SSRC) to the daemon's RTP address and reads
the daemon's stream. The namespace's SNAT rewrites every packet's source, so the daemon
sees another address and port than the SDP's.

Lines on stdin drive it; JSON lines on stdout report:

* ``{"event": "answered", "daemon_rtp": [host, port]}`` once the 200 is ACKed;
* ``mark N``: forget what was heard; ``{"event": "heard", ...}`` once N audible packets
  (the bot's speech, not silence) came after the mark, with the sources they came from;
* ``bye``: BYE, then ``{"event": "bye", "status": 200}`` and exit.

Every wait ends at ``--deadline`` seconds after the start (then it exits with status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

AUDIBLE = 1000
"""A packet is audible when one of its samples is louder than this (16-bit linear)."""


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def ulaw_sample(byte: int) -> int:
    """One G.711 mu-law byte to a 16-bit linear sample."""
    b = ~byte & 0xFF
    magnitude = (((b & 0x0F) << 3) + 0x84) << ((b >> 4) & 0x07)
    return -(magnitude - 0x84) if b & 0x80 else magnitude - 0x84


LOUD = frozenset(b for b in range(256) if abs(ulaw_sample(b)) > AUDIBLE)


class Caller:
    def __init__(self, local: str, target: tuple[str, int], call_id: str, deadline: float):
        self.local = local
        self.target = target
        self.call_id = call_id
        self.deadline = deadline
        self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sip.bind((local, 0))
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind((local, 0))
        self.sip_port = self.sip.getsockname()[1]
        self.rtp_port = self.rtp.getsockname()[1]
        self.tag = os.urandom(4).hex()
        self.to_tag = ""
        self.remote_uri = f"sip:greet@{target[0]}:{target[1]}"
        self.daemon_rtp: tuple[str, int] | None = None
        self.lock = threading.Lock()
        self.want = 0
        self.audible = 0
        self.sources: set[tuple[str, int]] = set()
        self.stop = threading.Event()

    def left_s(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            emit(event="deadline")
            os._exit(2)
        return left

    # ------------------------------------------------------------------ SIP

    def request(self, method: str, cseq: int, uri: str, body: str = "") -> bytes:
        to = f"<{self.remote_uri}>" + (f";tag={self.to_tag}" if self.to_tag else "")
        head = [
            f"{method} {uri} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.local}:{self.sip_port};branch=z9hG4bK{os.urandom(6).hex()}"
            ";rport",
            "Max-Forwards: 70",
            f"From: <sip:phone@{self.local}>;tag={self.tag}",
            f"To: {to}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {cseq} {method}",
            f"Contact: <sip:phone@{self.local}:{self.sip_port}>",
        ]
        if body:
            head.append("Content-Type: application/sdp")
        head.append(f"Content-Length: {len(body.encode())}")
        return ("\r\n".join(head) + "\r\n\r\n" + body).encode()

    def transaction(self, data: bytes, method: str, cseq: int) -> tuple[int, dict[str, str], str]:
        """Send (again every 0.5 s) until a final response to ``cseq method``."""
        self.sip.sendto(data, self.target)
        resend = time.monotonic() + 0.5
        provisional = False
        while True:
            self.sip.settimeout(max(0.01, min(self.left_s(), resend - time.monotonic())))
            try:
                packet, _ = self.sip.recvfrom(65535)
            except TimeoutError:
                if not provisional:
                    self.sip.sendto(data, self.target)
                resend = time.monotonic() + 0.5
                continue
            text = packet.decode(errors="replace")
            head, _, body = text.partition("\r\n\r\n")
            lines = head.split("\r\n")
            if not lines[0].startswith("SIP/2.0 "):
                continue  # a request from the daemon: not expected in this call
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers.setdefault(name.strip().lower(), value.strip())
            if headers.get("cseq") != f"{cseq} {method}":
                continue  # a retransmission of an earlier answer
            status = int(lines[0].split()[1])
            if status < 200:
                provisional = True
                continue
            return status, headers, body

    def call(self) -> None:
        sdp = (
            f"v=0\r\no=phone 1 1 IN IP4 {self.local}\r\ns=-\r\nc=IN IP4 {self.local}\r\n"
            f"t=0 0\r\nm=audio {self.rtp_port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=ptime:20\r\n"
            "a=sendrecv\r\n"
        )
        invite = self.request("INVITE", 1, self.remote_uri, sdp)
        status, headers, body = self.transaction(invite, "INVITE", 1)
        if status != 200:
            emit(event="failed", status=status)
            sys.exit(1)
        self.to_tag = headers["to"].split("tag=", 1)[1].split(";")[0]
        contact = headers.get("contact", "") or headers.get("m", "")
        if "<" in contact:
            self.remote_uri = contact.split("<", 1)[1].split(">", 1)[0]
        host = next(x[9:] for x in body.split("\r\n") if x.startswith("c=IN IP4 "))
        port = int(next(x for x in body.split("\r\n") if x.startswith("m=audio ")).split()[1])
        self.daemon_rtp = (host.strip(), port)
        self.sip.sendto(self.request("ACK", 1, self.remote_uri), self.target)

    def bye(self) -> int:
        status, _, _ = self.transaction(self.request("BYE", 2, self.remote_uri), "BYE", 2)
        return status

    # ------------------------------------------------------------------ RTP

    def send_rtp(self) -> None:
        assert self.daemon_rtp is not None
        seq, at = 0, time.monotonic()
        while not self.stop.is_set():
            header = struct.pack("!BBHII", 0x80, (0x80 if seq == 0 else 0), seq, seq * 160, 0xCA11)
            self.rtp.sendto(header + b"\xff" * 160, self.daemon_rtp)
            seq = (seq + 1) & 0xFFFF
            at += 0.02  # the phone's packet clock
            self.stop.wait(max(0.0, at - time.monotonic()))

    def read_rtp(self) -> None:
        self.rtp.settimeout(0.2)
        while not self.stop.is_set():
            try:
                data, source = self.rtp.recvfrom(2048)
            except TimeoutError:
                continue
            if len(data) < 12 or data[1] & 0x7F != 0:
                continue
            start = 12 + 4 * (data[0] & 0x0F)
            if not any(b in LOUD for b in data[start:]):
                continue
            with self.lock:
                self.audible += 1
                self.sources.add(source)
                if self.want and self.audible >= self.want:
                    self.want = 0
                    emit(event="heard", audible=self.audible, sources=sorted(self.sources))

    def mark(self, want: int) -> None:
        with self.lock:
            self.audible = 0
            self.sources = set()
            self.want = want


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local", required=True)
    parser.add_argument("--target", required=True, help="HOST:PORT of the daemon's SIP")
    parser.add_argument("--call-id", required=True)
    parser.add_argument("--deadline", type=float, default=120.0)
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    caller = Caller(args.local, (host, int(port)), args.call_id, time.monotonic() + args.deadline)
    caller.call()
    threads = [threading.Thread(target=f, daemon=True) for f in (caller.send_rtp, caller.read_rtp)]
    for t in threads:
        t.start()
    emit(event="answered", daemon_rtp=list(caller.daemon_rtp or ()), sdp_port=caller.rtp_port)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["mark"]:
            caller.mark(int(command[1]))
        elif command[:1] == ["bye"]:
            caller.stop.set()
            emit(event="bye", status=caller.bye())
            return


if __name__ == "__main__":
    main()

"""RFC 5626 §4.4.1 CRLF keep-alive through real local TCP connections.

The registrar is a small Python SIP end on a listener of this test: it answers
REGISTER with 200 and each double-CRLF ping with a single-CRLF pong while it is told
to. The daemon pings every ``keepalive_s`` (a fraction of a second here); the pong
timeout is shortened through the engine's constant. Each wait is for an event, bounded
by a timeout scaled by the suite's time factor; no duration is asserted.
"""

from __future__ import annotations

import asyncio

import pytest

from bridge.sip import ua_core
from bridge.sip.framer import SipStreamFramer
from bridge.sip.message import SipRequest, parse_message

from .harness import FACTOR, stack
from .test_sip_connections import ROUTES, leg_and_runner, run, wait_for


class Registrar:
    """Answers REGISTER (a long expiry: no refresh in the test) and, while ``answering``,
    every ping with a pong; notes per connection its pings and whether it ended."""

    def __init__(self) -> None:
        self.answering = True
        self.pings: list[int] = []
        """Pings read, per connection (index: connection number - 1)."""
        self.registers: list[int] = []
        """The connection number each REGISTER came on."""
        self.closed: list[int] = []
        """Connections the daemon closed."""
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Registrar:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pings.append(0)
        number = len(self.pings)
        framer = SipStreamFramer()
        try:
            while data := await reader.read(65536):
                messages = framer.feed(data)
                pings, _ = framer.take_keepalives()
                self.pings[number - 1] += pings
                if pings and self.answering:
                    writer.write(b"\r\n")
                for raw in messages:
                    request = parse_message(raw)
                    if isinstance(request, SipRequest) and request.method == "REGISTER":
                        self.registers.append(number)
                        writer.write(_ok(request))
        except ConnectionError:
            pass
        self.closed.append(number)
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _ok(request: SipRequest) -> bytes:
    headers = "".join(f"{n}: {request.get(n)}\r\n" for n in ("via", "from", "call-id", "cseq"))
    return (
        f"SIP/2.0 200 OK\r\n{headers}To: {request.get('to')};tag=reg\r\n"
        "Expires: 3600\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def test_pings_on_our_registrar_connection_and_a_missing_pong_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ua_core, "PONG_TIMEOUT_S", 1.0 * FACTOR)

    async def body() -> None:
        registrar = await Registrar().start()
        try:
            routes = ROUTES + (
                "[sip.registrations.pbx]\n"
                f'registrar = "sip:127.0.0.1:{registrar.port};transport=tcp"\n'
                'user = "bot"\npassword = "secret"\n'
            )
            extra = 'transports = ["udp", "tcp"]\nkeepalive_s = 0.2'
            async with stack(routes, sip_extra=extra) as s:
                _, runner = leg_and_runner(s, "TCP")
                # answered pings keep the one connection
                assert await wait_for(lambda: registrar.pings[:1] >= [3]), registrar.pings
                assert registrar.registers == [1] and registrar.closed == []
                assert runner.connections_opened == 1
                # a registrar that stops answering: the daemon gives the flow up, opens it
                # again and registers again on the new one, which is pinged in turn
                registrar.answering = False
                assert await wait_for(lambda: registrar.registers == [1, 2]), registrar.registers
                assert registrar.closed == [1]
                registrar.answering = True
                assert await wait_for(lambda: len(registrar.pings) == 2 and registrar.pings[1] >= 2)
                assert runner.connections_opened == 2 and registrar.closed == [1]
        finally:
            registrar.close()

    run(body())


def test_the_daemon_answers_a_ping_on_a_connection_opened_to_it() -> None:
    async def body() -> None:
        async with stack(ROUTES, sip_extra='transports = ["udp", "tcp"]') as s:
            reader, writer = await asyncio.open_connection("127.0.0.1", s.sip_port)
            try:
                writer.write(b"\r\n\r\n")
                pong = await asyncio.wait_for(reader.read(65536), 10 * FACTOR)
                assert pong == b"\r\n"
            finally:
                writer.close()

    run(body())

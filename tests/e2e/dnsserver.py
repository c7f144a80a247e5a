"""A tiny authoritative DNS server on loopback UDP for the tests (dnspython's messages).

``records`` maps ``(name, type)`` (name without the final dot, any case; type ``"SRV"``,
``"A"``...) to the rdata texts answered, with ``ttl``. A name with no record of any type
answers NXDOMAIN with an SOA (negative TTL ``negative_ttl``); a name that has records of
other types answers NOERROR and no answer. Every question is counted in ``asked``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsServer(asyncio.DatagramProtocol):
    def __init__(self, records: dict[tuple[str, str], list[str]], ttl: int = 300) -> None:
        self.records = {(n.lower().rstrip("."), t.upper()): v for (n, t), v in records.items()}
        self.ttl = ttl
        self.negative_ttl = 30
        self.asked: list[tuple[str, str]] = []
        self.silent = False
        """Answer nothing (a server that does not respond)."""
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        query = dns.message.from_wire(data)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.asked.append((name, rdtype))
        if self.silent or self.transport is None:
            return
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        values = self.records.get((name, rdtype))
        if values:
            response.answer.append(
                dns.rrset.from_text_list(
                    question.name, self.ttl, dns.rdataclass.IN, question.rdtype, values
                )
            )
        else:
            if not any(n == name for n, _ in self.records):
                response.set_rcode(dns.rcode.NXDOMAIN)
            response.authority.append(
                dns.rrset.from_text(
                    dns.name.from_text("test."),
                    self.negative_ttl,
                    dns.rdataclass.IN,
                    dns.rdatatype.SOA,
                    f"ns.test. admin.test. 1 3600 600 86400 {self.negative_ttl}",
                )
            )
        self.transport.sendto(response.to_wire(), addr)


@contextlib.asynccontextmanager
async def dns_server(
    records: dict[tuple[str, str], list[str]], ttl: int = 300
) -> AsyncIterator[tuple[DnsServer, int]]:
    """The server on 127.0.0.1 and the UDP port it got."""
    loop = asyncio.get_running_loop()
    server = DnsServer(records, ttl)
    transport, _ = await loop.create_datagram_endpoint(lambda: server, local_addr=("127.0.0.1", 0))
    try:
        yield server, int(transport.get_extra_info("sockname")[1])
    finally:
        transport.close()

"""A session route's HTTP client: the one POST before a provider's WebSocket.

zwst fixes a session's voice and format with a POST that answers the URL to
connect to (``TtsProtocol.session_request``, then ``session_response``). The
provider connection (``bridge.io.provider_ws.Connection._connect``) makes that
request here, bounded in time and size, with no HTTP library for one POST.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from bridge.providers.base import HttpRequest

__all__ = ["SESSION_REPLY_MAX_BYTES", "SESSION_TIMEOUT_S", "SessionRouteError", "http_request"]

SESSION_TIMEOUT_S = 10.0
"""A session route's answer (zwst's POST) must be whole within this time."""
SESSION_REPLY_MAX_BYTES = 64 * 1024
"""And no larger than this (its JSON holds one URL)."""


class SessionRouteError(Exception):
    """A session route's answer that is no HTTP response, or too large."""


async def http_request(req: HttpRequest, unix_socket: str = "") -> tuple[int, bytes]:
    """A minimal HTTP/1.1 client for session routes (no dependency for one POST).

    Bounded: the whole exchange within ``SESSION_TIMEOUT_S`` (else
    ``TimeoutError``), the answer at most ``SESSION_REPLY_MAX_BYTES``; an
    answer that is not an HTTP status line raises ``SessionRouteError``.
    """
    u = urlsplit(req.url)
    secure = u.scheme in ("https", "wss")
    port = u.port or (443 if secure else 80)
    async with asyncio.timeout(SESSION_TIMEOUT_S):
        if unix_socket:  # the embedded server's (``ProviderSettings.unix_socket``)
            reader, writer = await asyncio.open_unix_connection(unix_socket)
        else:
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

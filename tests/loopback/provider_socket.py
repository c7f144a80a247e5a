"""A provider WebSocket over a transport that writes into a list: no network."""

from __future__ import annotations

from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from bridge.io.provider_ws import _ProviderWebSocket


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

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


def open_provider_socket(
    on_message: Callable[[str | bytes], None], url: str = "ws://127.0.0.1:9/v1/ws"
) -> _ProviderWebSocket:
    """An open ``_ProviderWebSocket``, past a real 101 response, handing messages to
    ``on_message``."""
    protocol = ClientProtocol(parse_uri(url))
    request = protocol.connect()
    protocol.send_request(request)
    ws = _ProviderWebSocket(protocol, on_message=on_message)
    transport = FakeTransport()
    ws.connection_made(transport)  # type: ignore[arg-type]
    accept = accept_key(request.headers["Sec-WebSocket-Key"])
    ws.data_received(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n"
    )
    assert protocol.state is State.OPEN
    transport.written.clear()
    return ws

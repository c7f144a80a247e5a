"""A provider WebSocket over a transport that writes into a list: no network."""

from __future__ import annotations

from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

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
    """An open ``_ProviderWebSocket``, its handshake done, handing messages to ``on_message``."""
    protocol = ClientProtocol(parse_uri(url))
    protocol.state = State.OPEN
    ws = _ProviderWebSocket(protocol, on_message=on_message)
    ws.connection_made(FakeTransport())  # type: ignore[arg-type]
    ws.response = object()  # type: ignore[assignment]  # the handshake is done
    return ws

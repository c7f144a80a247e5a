"""The HTTP request reader (``bridge.io.httpws``) and the API shell, fed bad requests.

A raw socket client sends what a broken or hostile client could; each request
gets one clean answer (or a clean close) and never a logged traceback. The
API shell (``bridge.io.api_shell``) is driven with a stand-in daemon that has
no calls, over the same listener.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from bridge.io.api_shell import api_handler
from bridge.io.httpws import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    HttpRequest,
    HttpResponse,
    serve_http_ws,
)

FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))
TIMEOUT_S = 10 * FACTOR

Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _Listener:
    """``serve_http_ws`` on port 0 with a handler that records each request."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.requests: list[HttpRequest] = []
        self.handler = handler

    async def http(self, request: HttpRequest) -> HttpResponse:
        self.requests.append(request)
        if self.handler is not None:
            return await self.handler(request)
        return HttpResponse.text(200, f"got {len(request.body)} bytes")

    async def ws(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.text(404, "no")


async def _exchange(
    data: bytes, handler: Handler | None = None, *, half_close: bool = True
) -> tuple[bytes, list[HttpRequest], list[dict[str, Any]]]:
    """Send ``data`` on a fresh connection; the whole answer, the requests seen, the logs.

    ``half_close`` ends our side after ``data`` (the server reads EOF and can still
    answer); otherwise we close at once without reading. Returns once the server
    has finished with the connection.
    """
    listener = _Listener(handler)
    with capture_logs() as logs:
        server = await serve_http_ws("127.0.0.1", 0, http=listener.http, ws=listener.ws)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(data)
            await writer.drain()
            answer = b""
            if half_close:
                writer.write_eof()
                answer = await asyncio.wait_for(reader.read(), TIMEOUT_S)
            writer.close()
            # the connection's task ends after anything it would log
            async with asyncio.timeout(TIMEOUT_S):
                while server.connections:
                    await asyncio.sleep(0.01)
        finally:
            await server.close()
    return answer, listener.requests, logs


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer[9:12])


def _no_traceback(logs: list[dict[str, Any]]) -> None:
    failed = [e for e in logs if e.get("log_level") in ("error", "critical") or "exc_info" in e]
    assert failed == []


def test_a_well_formed_request_reaches_the_handler_with_its_body() -> None:
    answer, requests, logs = asyncio.run(
        _exchange(
            b"POST /x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello"
        )
    )
    assert _status(answer) == 200 and answer.endswith(b"\r\n\r\ngot 5 bytes\n")
    (req,) = requests
    assert (req.method, req.path, req.query, req.body) == ("POST", "/x", {"a": "1"}, b"hello")
    assert req.headers["x-a"] == "1, 2"
    _no_traceback(logs)


@pytest.mark.parametrize("half_close", [True, False], ids=["half-close", "close"])
def test_a_body_shorter_than_its_content_length_is_a_400_or_a_clean_close(half_close: bool) -> None:
    answer, requests, logs = asyncio.run(
        _exchange(
            b"POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly this", half_close=half_close
        )
    )
    if half_close:
        assert _status(answer) == 400 and b"shorter than its Content-Length" in answer
    assert requests == []  # never handed on as a request
    _no_traceback(logs)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /\r\n\r\n",  # no version
        b"GET / FTP/1.0\r\n\r\n",  # not HTTP
        b"\r\n\r\n",  # no request line at all
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\nx",
        b"POST / HTTP/1.1\r\nContent-Length: 1_0\r\n\r\n0123456789",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
        "POST / HTTP/1.1\r\nContent-Length: \u0661\r\n\r\nx".encode(),  # an Arabic-Indic 1
    ],
    ids=[
        "no-version",
        "not-http",
        "empty",
        "header-without-colon",
        "length-not-a-number",
        "length-negative",
        "length-signed",
        "length-underscore",
        "length-twice",
        "length-non-ascii-digit",
    ],
)
def test_a_malformed_request_is_a_400(head: bytes) -> None:
    answer, requests, logs = asyncio.run(_exchange(head))
    assert _status(answer) == 400 and answer.endswith(b"\r\n\r\nmalformed HTTP request\n")
    assert requests == []
    _no_traceback(logs)


def test_a_head_over_the_limit_is_a_413() -> None:
    big = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1000)
    answer, requests, logs = asyncio.run(_exchange(big))
    assert _status(answer) == 413 and answer.endswith(b"\r\n\r\nrequest head too large\n")
    assert requests == []
    _no_traceback(logs)


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    head = f"POST / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode()
    answer, requests, logs = asyncio.run(_exchange(head))
    assert _status(answer) == 413 and requests == []
    _no_traceback(logs)


def test_non_ascii_in_the_head_is_carried_not_fatal() -> None:
    raw = "GET /caf\u00e9 HTTP/1.1\r\nX-Name: Bj\u00f6rk \u2603\r\n\r\n".encode()
    answer, requests, logs = asyncio.run(_exchange(raw))
    assert _status(answer) == 200
    (req,) = requests
    # the head is read as latin-1 (RFC 9110 §5.5: octets, not text): nothing is lost
    assert req.headers["x-name"].encode("latin-1") == "Bj\u00f6rk \u2603".encode()
    assert req.target.encode("latin-1") == "/caf\u00e9".encode()
    _no_traceback(logs)


def test_a_handler_that_raises_is_logged_once_and_the_listener_stays_up() -> None:
    async def boom(request: HttpRequest) -> HttpResponse:
        raise RuntimeError("handler bug")

    answer, requests, logs = asyncio.run(_exchange(b"GET / HTTP/1.1\r\n\r\n", boom))
    assert answer == b"" and len(requests) == 1  # the connection is closed, no answer
    assert [e["event"] for e in logs if e.get("log_level") == "error"] == ["http.connection_failed"]


# ---------------------------------------------------------------- the API shell


def _daemon(token: str = "tok") -> Any:
    """What ``api_handler`` reads of the daemon: its legs (none), drain state, API token."""
    return SimpleNamespace(
        legs=[], draining=False, config=SimpleNamespace(api=SimpleNamespace(token=token))
    )


def _api(daemon: Any) -> Handler:
    async def handler(request: HttpRequest) -> HttpResponse:
        response = await api_handler(daemon, request)
        return response if response is not None else HttpResponse.text(404, "not the API")

    return handler


def _request(method: str, path: str, body: bytes = b"", token: str | None = "tok") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: h\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _json_body(answer: bytes) -> Any:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_api_shell_leaves_other_paths_to_the_daemon() -> None:
    got = asyncio.run(api_handler(_daemon(), HttpRequest("GET", "/healthz", {})))
    assert got is None


def test_api_shell_lists_no_calls_and_refuses_without_the_token() -> None:
    daemon = _daemon()
    answer, _, logs = asyncio.run(_exchange(_request("GET", "/v1/calls"), _api(daemon)))
    assert _status(answer) == 200 and _json_body(answer) == {"calls": []}
    answer, _, _ = asyncio.run(_exchange(_request("GET", "/v1/calls", token="wrong"), _api(daemon)))
    assert _status(answer) == 401 and b'error="invalid_token"' in answer
    answer, _, _ = asyncio.run(_exchange(_request("GET", "/v1/calls", token=None), _api(daemon)))
    assert _status(answer) == 401
    _no_traceback(logs)


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe not utf-8", b"{not json", b"[1, 2]", b'{"to": 5}'],
    ids=["not-utf8", "not-json", "not-an-object", "wrong-type"],
)
def test_api_shell_answers_a_bad_body_with_a_json_error(body: bytes) -> None:
    answer, _, logs = asyncio.run(_exchange(_request("POST", "/v1/calls", body), _api(_daemon())))
    assert _status(answer) in (400, 422)
    assert "error" in _json_body(answer)
    _no_traceback(logs)


def test_api_shell_originate_without_a_sip_leg_is_503() -> None:
    body = json.dumps({"to": "sip:bob@127.0.0.1", "route": "demo"}).encode()
    answer, _, logs = asyncio.run(_exchange(_request("POST", "/v1/calls", body), _api(_daemon())))
    assert _status(answer) == 503 and _json_body(answer)["error"]["code"] == "unavailable"
    _no_traceback(logs)


def test_api_shell_say_and_hangup_on_an_unknown_call_are_404() -> None:
    say = json.dumps({"text": "hi"}).encode()
    for path, body in (("/v1/calls/c-404/say", say), ("/v1/calls/c-404/hangup", b"{}")):
        answer, _, _ = asyncio.run(_exchange(_request("POST", path, body), _api(_daemon())))
        assert _status(answer) == 404, (path, answer)


def test_api_shell_short_body_is_a_400_before_the_api_sees_it() -> None:
    raw = _request("POST", "/v1/calls", b'{"to": "sip:bob@127.0.0.1"}')[:-5]
    answer, requests, logs = asyncio.run(_exchange(raw, _api(_daemon())))
    assert _status(answer) == 400 and requests == []
    _no_traceback(logs)

"""A full call with every secret configured: none reaches a log line, /metrics or an error.

Issue 33. The daemon runs with the API token, the Twilio auth token, the
shared stream token, the single-use token secret and a provider API key set
to distinctive values; a call goes through every edge that checks one
(signed webhook, signed upgrade, stream token, API with and without the
bearer, a refused say, a bad signature), with logging configured as the
daemon configures it (JSON, secrets registered). Then every log line, the
``/metrics`` text, the application's error frames and every HTTP error body
are searched for each secret.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
import structlog
import websockets
from twilio.request_validator import RequestValidator

from bridge.config import parse_config, secret_values
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server
from bridge.logs import configure
from bridge.streams.auth import twilio_signature

from .harness import FACTOR, AppServer, TwilioCall, app_route, config_text

SECRETS = {
    "api_token": "api-SECRET-7d1f0c",
    "twilio": "tw-SECRET-93ab1e",
    "stream": "st-SECRET-55c2aa",
    "token_secret": "ts-SECRET-0123456789",
    "provider": "pk-SECRET-abcdef12",
}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    req = urllib.request.Request(url, body, headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def until(pred: object, timeout_s: float = 10.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


class SignedCall(TwilioCall):
    def __init__(self, port: int, custom: dict[str, str], headers: dict[str, str]) -> None:
        super().__init__(port, custom)
        self.headers = headers

    async def __aenter__(self) -> SignedCall:
        self.ws = await websockets.connect(
            f"ws://127.0.0.1:{self.port}/twilio", additional_headers=self.headers
        )
        self.t0 = self.loop.time()
        self.carrier.connect(self.t0)
        self._tasks = [
            self.loop.create_task(self._sender()),
            self.loop.create_task(self._receiver()),
        ]
        return self


def test_no_secret_reaches_a_log_line_metrics_or_an_error_frame() -> None:
    outputs: list[str] = []

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "bad", "text": "x", "provider": "nope"},
                {"type": "say", "turn_id": "t1", "text": "Hello there.", "final": True},
            ]
            tts = await start_tts_server(engine="tone")
            ms_extra = (
                f'twilio_auth_token = "{SECRETS["twilio"]}"\n'
                f'stream_token = "{SECRETS["stream"]}"\n'
                "single_use_tokens = true\n"
                f'token_secret = "{SECRETS["token_secret"]}"'
            )
            text = config_text(tts.port, app_route(app.url), ms_extra=ms_extra)
            text = text.replace('api_key = "k"', f'api_key = "{SECRETS["provider"]}"')
            text = text.replace(
                '[api]\nlisten = "127.0.0.1:0"',
                f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{SECRETS["api_token"]}"',
            )
            cfg = parse_config(text, "test.toml")
            assert set(SECRETS.values()) <= set(secret_values(cfg))
            buf = io.StringIO()
            configure("debug", "json", stream=buf, secrets=secret_values(cfg))
            daemon = Daemon(cfg)
            await daemon.start()
            try:
                assert daemon.api is not None
                ms = next(leg for leg in daemon.legs if leg.name == "media_streams")
                port = ms.port  # type: ignore[attr-defined]
                api = f"http://127.0.0.1:{daemon.api.port}"
                bearer = {"Authorization": f"Bearer {SECRETS['api_token']}"}
                # a signed webhook mints the call's token (and carries the stream token)
                twiml = f"http://127.0.0.1:{port}/twiml"
                form = {"CallSid": "CA00000000000000000000000000000001", "From": "+15550001"}
                sig = RequestValidator(SECRETS["twilio"]).compute_signature(twiml, form)
                body_bytes = urllib.parse.urlencode(form).encode()
                status, xml = await asyncio.to_thread(
                    http, "POST", twiml, body_bytes, {"X-Twilio-Signature": sig}
                )
                assert status == 200
                token = xml.split('name="token" value="', 1)[1].split('"', 1)[0]
                # attempts that fail: their answers are outputs too
                for attempt in (
                    ("POST", twiml, body_bytes, {"X-Twilio-Signature": "forged"}),
                    ("GET", api + "/v1/calls", None, {"Authorization": "Bearer wrong"}),
                    ("GET", api + "/metrics", None, {}),
                ):
                    outputs.append(str(await asyncio.to_thread(http, *attempt)))
                upgrade = {
                    "X-Twilio-Signature": twilio_signature(
                        SECRETS["twilio"], f"ws://127.0.0.1:{port}/twilio"
                    )
                }
                custom = {"token": token, "stream_token": SECRETS["stream"]}
                async with SignedCall(port, custom, upgrade) as call:
                    await app.wait_for("turn.finished")
                    await until(lambda: len(call.carrier.arrival_times()) > 5)
                    calls = json.loads(
                        (await asyncio.to_thread(http, "GET", api + "/v1/calls", None, bearer))[1]
                    )
                    (info,) = calls["calls"]
                    say = json.dumps({"text": "More.", "provider": "nope"}).encode()
                    headers = {**bearer, "Content-Type": "application/json"}
                    outputs.append(
                        str(
                            await asyncio.to_thread(
                                http, "POST", f"{api}/v1/calls/{info['call_id']}/say", say, headers
                            )
                        )
                    )
                assert app.of("error")  # the refused say came back as an error frame
                status, metrics = await asyncio.to_thread(
                    http, "GET", api + "/metrics", None, bearer
                )
                assert status == 200 and "callbridge_calls_active" in metrics
                outputs.append(metrics)
                status, spec = await asyncio.to_thread(http, "GET", api + "/openapi.json")
                outputs.append(spec)
            finally:
                await daemon.drain_and_stop()
                await daemon.close()
                await tts.close()
            outputs.append(json.dumps(app.events))
            outputs.append(buf.getvalue())
            assert "call.started" in buf.getvalue() and "call.ended" in buf.getvalue()

    asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))
    everything = "\n".join(outputs)
    for name, secret in SECRETS.items():
        assert secret not in everything, name

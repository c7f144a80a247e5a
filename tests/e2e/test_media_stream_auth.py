"""The media-stream listener fails closed (issue 33): signatures, tokens, the stream cap.

Against the real daemon: ``POST /twiml`` is checked as Twilio signs webhooks,
a replayed webhook and a used token are refused, ``/twilio`` honours
``stream_token``, every dialect carries a per-call token when
``single_use_tokens`` is on, a public listener refuses a dialect with no
credential, and ``max_streams`` refuses the stream beyond it. Waits are
bounded by timeouts scaled with CALLBRIDGE_TEST_TIME_FACTOR.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import websockets
from twilio.request_validator import RequestValidator

from bridge.config import parse_config
from bridge.io.daemon import Daemon
from bridge.io.ttsd_server import start_tts_server
from bridge.streams.auth import TokenBook, twilio_signature
from bridge.streams.carrier import TwilioCarrier

from .harness import FACTOR, Stack, TwilioCall, config_text, stack

ROUTE = """
[[routes]]
match = "*"
provider = "main"
greeting = "Hello."
"""
AUTH_TOKEN = "twilio-auth-token-for-tests"
SECRET = "0123456789abcdef0123"
CALL_SID = "CA00000000000000000000000000000001"  # what TwilioCall's carrier sends


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def until(pred: object, timeout_s: float = 10.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


def leg_of(st: Stack) -> object:
    return next(leg for leg in st.daemon.legs if leg.name == "media_streams")


class SignedTwilioCall(TwilioCall):
    """``TwilioCall`` whose upgrade carries headers (a signature, a bearer token)."""

    def __init__(
        self, port: int, custom: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(port, custom)
        self.headers = headers or {}

    async def __aenter__(self) -> SignedTwilioCall:
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


def post_form(url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, str]:
    body = urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, body, headers)
    try:
        with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def refused_status(url: str, headers: dict[str, str] | None = None) -> int:
    with pytest.raises(websockets.InvalidStatus) as info:
        await websockets.connect(url, additional_headers=headers or {})
    return info.value.response.status_code


async def closed_with(call: TwilioCall) -> int | None:
    async with call:
        await asyncio.wait_for(call.closed.wait(), 10 * FACTOR)
    assert call.carrier.arrival_times() == []  # nothing was played to it
    return call.ws.close_code if call.ws is not None else None


def test_twiml_is_signature_checked_and_a_replayed_webhook_and_a_used_token_are_refused() -> None:
    extra = (
        f'twilio_auth_token = "{AUTH_TOKEN}"\nsingle_use_tokens = true\ntoken_secret = "{SECRET}"'
    )

    async def body() -> None:
        async with stack(ROUTE, ms_extra=extra) as st:
            url = f"http://127.0.0.1:{st.ms_port}/twiml"
            form = {"CallSid": CALL_SID, "From": "+15550001", "To": "+15550002"}
            signature = RequestValidator(AUTH_TOKEN).compute_signature(url, form)
            signed = {"X-Twilio-Signature": signature}
            # unsigned, wrongly signed, or a tampered parameter: 403, no token minted
            assert (await asyncio.to_thread(post_form, url, form, {}))[0] == 403
            bad = {"X-Twilio-Signature": "bm90IGEgc2lnbmF0dXJl"}
            assert (await asyncio.to_thread(post_form, url, form, bad))[0] == 403
            tampered = {**form, "CallSid": "CA00000000000000000000000000000002"}
            status, text = await asyncio.to_thread(post_form, url, tampered, signed)
            assert status == 403 and 'name="token"' not in text
            # the genuine webhook: a token, once
            status, xml = await asyncio.to_thread(post_form, url, form, signed)
            assert status == 200 and 'name="token"' in xml
            token = xml.split('name="token" value="', 1)[1].split('"', 1)[0]
            # the captured webhook replayed: refused, no second token for the call
            status, text = await asyncio.to_thread(post_form, url, form, signed)
            assert status == 409 and "<Stream" not in text
            ws_url = f"ws://127.0.0.1:{st.ms_port}/twilio"
            upgrade = {"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, ws_url)}
            async with SignedTwilioCall(st.ms_port, {"token": token}, upgrade) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 5)
            # the used token again (a captured stream replayed): closed with 1008
            replay = SignedTwilioCall(st.ms_port, {"token": token}, upgrade)
            assert await closed_with(replay) == 1008
            # a token minted for another call does not open this one
            other = TokenBook(SECRET.encode()).mint("CA00000000000000000000000000000009", 0)
            forged = SignedTwilioCall(st.ms_port, {"token": other}, upgrade)
            assert await closed_with(forged) == 1008
            await until(lambda: leg_of(st).active_calls() == 0)  # type: ignore[attr-defined]

    run(body())


def test_twilio_honours_the_stream_token_at_the_upgrade_or_in_start() -> None:
    async def body() -> None:
        async with stack(ROUTE, ms_extra='stream_token = "s3cret-stream-token"') as st:
            url = f"ws://127.0.0.1:{st.ms_port}/twilio"
            assert await refused_status(url, {"Authorization": "Bearer wrong"}) == 403
            assert await refused_status(url + "?token=wrong") == 403
            # no token at the upgrade (Twilio cannot add one) and none in start: 1008
            assert await closed_with(TwilioCall(st.ms_port)) == 1008
            wrong = TwilioCall(st.ms_port, {"stream_token": "nope"})
            assert await closed_with(wrong) == 1008
            # the token as a <Parameter>, or as a bearer at the upgrade: the call runs
            async with TwilioCall(st.ms_port, {"stream_token": "s3cret-stream-token"}) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 5)
            bearer = {"Authorization": "Bearer s3cret-stream-token"}
            async with SignedTwilioCall(st.ms_port, headers=bearer) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 5)

    run(body())


def telnyx_start(call_control_id: str, token: str | None) -> str:
    params = [{"name": "token", "value": token}] if token is not None else []
    return json.dumps(
        {
            "event": "start",
            "sequence_number": "1",
            "start": {
                "call_control_id": call_control_id,
                "from": "+15550001",
                "to": "+15550002",
                "custom_parameters": params,
                "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
            },
            "stream_id": "32de0dea-53cb-4b21-89a4-9e1819c043bc",
        }
    )


def mint_over_api(api_port: int, call_id: str) -> str:
    """``POST /v1/stream-tokens``: what an application does before the carrier streams."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{api_port}/v1/stream-tokens",
        json.dumps({"call_id": call_id}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
        assert r.status == 201
        answer = json.loads(r.read())
    assert answer["expires_in_s"] == 30.0
    return str(answer["token"])


def test_every_dialect_needs_its_per_call_token_when_single_use_tokens_is_on() -> None:
    extra = f'single_use_tokens = true\ntoken_secret = "{SECRET}"'

    async def body() -> None:
        async with stack(ROUTE, ms_extra=extra) as st:
            leg = leg_of(st)
            url = f"ws://127.0.0.1:{st.ms_port}/telnyx"
            book = TokenBook(SECRET.encode())
            cases: list[tuple[str | None, bool]] = [
                (None, False),
                ("v1.1.AAAA.BBBB", False),
                (book.mint("v3:another-call", time.time()), False),
                (book.mint("v3:the-call", time.time()), True),
                (await asyncio.to_thread(mint_over_api, st.api_port, "v3:the-call"), True),
            ]
            for token, admitted in cases:
                ws = await websockets.connect(url)
                await ws.send(json.dumps({"event": "connected", "version": "1.0.0"}))
                await ws.send(telnyx_start("v3:the-call", token))
                if admitted:
                    await until(lambda: leg.active_calls() == 1)  # type: ignore[attr-defined]
                    await ws.close()
                    await until(lambda: leg.active_calls() == 0)  # type: ignore[attr-defined]
                else:
                    with pytest.raises(websockets.ConnectionClosed) as info:
                        await asyncio.wait_for(ws.recv(), 10 * FACTOR)
                    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
                    assert leg.active_calls() == 0  # type: ignore[attr-defined]

    run(body())


def test_streams_beyond_max_streams_are_refused_with_503() -> None:
    async def body() -> None:
        async with stack(ROUTE, ms_extra="max_streams = 1") as st:
            url = f"ws://127.0.0.1:{st.ms_port}/twilio"
            async with TwilioCall(st.ms_port) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 3)
                assert await refused_status(url) == 503
                assert await refused_status(url.replace("twilio", "telnyx")) == 503
            leg = leg_of(st)
            await until(lambda: leg.streams_open == 0)  # type: ignore[attr-defined]
            async with TwilioCall(st.ms_port) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 3)

    run(body())


@asynccontextmanager
async def stack_with(ms_extra: str, *replacements: tuple[str, str]) -> AsyncIterator[Stack]:
    """``stack`` with its config text edited (``old, new`` pairs, each must match)."""
    tts = await start_tts_server(engine="tone")
    text = config_text(tts.port, ROUTE, ms_extra=ms_extra)
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new)
    cfg = parse_config(text, "test.toml")
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        yield Stack(tts, daemon, cfg)
    finally:
        await daemon.drain_and_stop()
        await daemon.close()
        await tts.close()


def public_stack(ms_extra: str) -> AbstractAsyncContextManager[Stack]:
    """The daemon with its media-stream listener on every address (not loopback)."""
    old = '[media_streams]\nlisten = "127.0.0.1:0"'
    return stack_with(ms_extra, (old, '[media_streams]\nlisten = "0.0.0.0:0"'))


@pytest.mark.parametrize(
    "configured", ["wss://bridge.example.com", "wss://bridge.example.com/twilio"]
)
def test_public_listener_refuses_every_dialect_and_twiml_without_a_credential(
    configured: str,
) -> None:
    public = "wss://bridge.example.com"
    extra = f'twilio_auth_token = "{AUTH_TOKEN}"\npublic_url = "{configured}"'

    async def body() -> None:
        async with public_stack(extra) as st:
            base = f"ws://127.0.0.1:{st.ms_port}"
            for dialect in ("telnyx", "plivo", "exotel", "vonage"):
                assert await refused_status(f"{base}/{dialect}") == 403, dialect
            assert await refused_status(f"{base}/twilio") == 403
            good = twilio_signature(AUTH_TOKEN, f"{public}/twilio")
            ws = await websockets.connect(
                f"{base}/twilio", additional_headers={"X-Twilio-Signature": good}
            )
            await ws.close()
            twiml = f"http://127.0.0.1:{st.ms_port}/twiml"
            form = {"CallSid": CALL_SID}
            assert (await asyncio.to_thread(post_form, twiml, form, {}))[0] == 403
            signature = RequestValidator(AUTH_TOKEN).compute_signature(
                "https://bridge.example.com/twiml", form
            )
            status, xml = await asyncio.to_thread(
                post_form, twiml, form, {"X-Twilio-Signature": signature}
            )
            assert status == 200 and "<Stream" in xml

    run(body())


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("metrics_auth", [True, False])
def test_metrics_need_the_api_token_when_one_is_set_unless_configured_open(
    metrics_auth: bool,
) -> None:
    api = '[api]\nlisten = "127.0.0.1:0"'
    keys = f'{api}\ntoken = "api-token-for-tests"\nmetrics_auth = {str(metrics_auth).lower()}'

    async def body() -> None:
        async with stack_with("", (api, keys)) as st:
            base = f"http://127.0.0.1:{st.api_port}"
            status, text = await asyncio.to_thread(http_get, base + "/metrics")
            if metrics_auth:
                assert status == 401 and "callbridge_" not in text
            else:
                assert status == 200 and "callbridge_" in text
            bearer = {"Authorization": "Bearer api-token-for-tests"}
            status, text = await asyncio.to_thread(http_get, base + "/metrics", bearer)
            assert status == 200 and "callbridge_" in text
            wrong = {"Authorization": "Bearer wrong"}
            status, _ = await asyncio.to_thread(http_get, base + "/metrics", wrong)
            assert status == (401 if metrics_auth else 200)
            assert (await asyncio.to_thread(http_get, base + "/healthz"))[0] == 200

    run(body())


def test_streams_with_colliding_or_odd_call_ids_stay_reachable_by_the_api() -> None:
    odd = "CA/../odd id?"

    async def body() -> None:
        async with stack(ROUTE) as st:
            leg = leg_of(st)
            calls = [TwilioCall(st.ms_port) for _ in range(3)]
            for call in calls[1:]:
                call.carrier = TwilioCarrier(call_sid=odd)
            async with calls[0], calls[1], calls[2]:
                await until(lambda: leg.active_calls() == 3)  # type: ignore[attr-defined]
                ids = sorted(leg.calls)  # type: ignore[attr-defined]
                assert ids == [CALL_SID, "CA_.._odd_id_", "CA_.._odd_id_-2"]
                base = f"http://127.0.0.1:{st.api_port}/v1/calls/"
                for call_id in ids:
                    status, text = await asyncio.to_thread(http_get, base + call_id)
                    assert status == 200 and call_id in text, (call_id, status, text)

    run(body())

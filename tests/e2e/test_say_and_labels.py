"""A ``say`` naming an unknown provider is refused, the call goes on; labels stay bounded.

Issue 33: the ``say`` used to end the live call as ``internal_error``; a free
hangup reason and a provider's error kind became metric label values.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

from bridge.io.caller import CallerOptions, place_call
from bridge.io.callrun import CALL_OUTCOMES, PROVIDER_ERROR_KINDS, bounded_label

from .harness import FACTOR, AppServer, TwilioCall, app_route, stack


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def until(pred: object, timeout_s: float = 10.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


def request(method: str, url: str, body: object | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bounded_label_keeps_known_values_and_folds_everything_else() -> None:
    assert bounded_label("remote-bye", CALL_OUTCOMES) == "remote-bye"
    assert bounded_label("rejected: stream token replayed", CALL_OUTCOMES) == "rejected"
    assert bounded_label("timeout", PROVIDER_ERROR_KINDS) == "timeout"
    for free in ("card 4111 1111 1111 1111", "x" * 10_000, "", "stop\n", "é", "api_hangup "):
        assert bounded_label(free, CALL_OUTCOMES) == "other"
        assert bounded_label(free, PROVIDER_ERROR_KINDS) == "other"


def test_app_say_with_an_unknown_provider_is_refused_and_the_call_goes_on() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "bad", "text": "Nope.", "provider": "nope"},
                {"type": "say", "turn_id": "good", "text": "Still here.", "final": True},
            ]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port) as call:
                error = await app.wait_for("error")
                assert error["field"] == "provider" and error["command"] == "say"
                assert "unknown_provider" in str(error["message"])
                finished = await app.wait_for("turn.finished")
                assert finished["turn_id"] == "good"
                assert call.carrier.arrival_times()
                assert not app.of("call.ended")
                leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
                assert leg.active_calls() == 1  # type: ignore[attr-defined]

    run(body())


GREETING = '[[routes]]\nmatch = "*"\nprovider = "main"\ngreeting = "Hello."\n'


def test_api_say_with_an_unknown_provider_is_422_and_the_call_goes_on() -> None:
    async def body() -> None:
        async with stack(GREETING) as st:
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            async with TwilioCall(st.ms_port):
                await until(lambda: leg.active_calls() == 1)  # type: ignore[attr-defined]
                (call_id,) = leg.calls  # type: ignore[attr-defined]
                base = f"http://127.0.0.1:{st.api_port}/v1/calls/{call_id}"
                say = {"text": "Hi.", "provider": "nope"}
                status, text = await asyncio.to_thread(request, "POST", base + "/say", say)
                assert status == 422 and json.loads(text)["error"]["field"] == "provider"
                assert leg.active_calls() == 1  # type: ignore[attr-defined]
                status, _ = await asyncio.to_thread(request, "POST", base + "/say", {"text": "Hi."})
                assert status == 202
                assert leg.active_calls() == 1  # type: ignore[attr-defined]

    run(body())


def series_and_help(metrics: str) -> str:
    """The exposition without its sample values: a float such as 60769992484711 may
    contain any short digit run by chance, but no label or text may hold the reason."""
    kept = []
    for line in metrics.splitlines():
        kept.append(line if line.startswith("#") else line.rpartition(" ")[0])
    return "\n".join(kept)


def outcomes(metrics: str) -> set[str]:
    return set(re.findall(r'callbridge_calls_total\{[^}]*outcome="([^"]*)"', metrics))


def test_a_free_hangup_reason_is_counted_as_other_never_as_a_label() -> None:
    reason = "customer said PIN 4711 then hung up"

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "hangup", "reason": reason}]
            async with stack(app_route(app.url)) as st:
                opts = CallerOptions(target=f"sip:demo@127.0.0.1:{st.sip_port}", duration_s=3.0)
                await place_call(opts)
                await app.wait_for("call.ended")
                status, metrics = await asyncio.to_thread(
                    request, "GET", f"http://127.0.0.1:{st.api_port}/metrics"
                )
        assert status == 200
        assert outcomes(metrics) <= CALL_OUTCOMES | {"other"}
        assert "PIN" not in series_and_help(metrics)
        assert "4711" not in series_and_help(metrics)
        # a call whose runner ends with the free text itself (no leg reason first)
        async with stack(GREETING) as st, TwilioCall(st.ms_port):
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            await until(lambda: leg.active_calls() == 1)  # type: ignore[attr-defined]
            (runner,) = leg.calls.values()  # type: ignore[attr-defined]
            runner.finish(reason)
            status, metrics = await asyncio.to_thread(
                request, "GET", f"http://127.0.0.1:{st.api_port}/metrics"
            )
        assert 'callbridge_calls_total{leg="twilio",outcome="other",route="*"} 1.0' in metrics
        assert "PIN" not in series_and_help(metrics)
        assert "4711" not in series_and_help(metrics)

    run(body())

"""Calls over the Twilio media-stream leg, end to end, against the real daemon and ttsd.

The carrier side is the emulator (``bridge.streams.carrier``) over a real
WebSocket; the application side is a real WebSocket server the daemon dials.
Timings are bounded by timeouts scaled with CALLBRIDGE_TEST_TIME_FACTOR, never
slept on for correctness.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest
import websockets

from bridge.streams.auth import twilio_signature

from .harness import (
    FACTOR,
    AppServer,
    TwilioCall,
    api_post,
    app_route,
    speech_mulaw,
    stack,
    tone_turn_ms,
)

GREETING = "Hello and welcome to the bridge test."
GREETING_ROUTE = f"""
[[routes]]
match = "*"
provider = "main"
greeting = "{GREETING}"
"""


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def until(pred: object, timeout_s: float = 10.0) -> None:
    async def loop() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout_s * FACTOR)


def test_greeting_is_paced_160_byte_mulaw_and_marks_are_echoed() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as st, TwilioCall(st.ms_port) as call:
            c = call.carrier
            expected_frames = tone_turn_ms(GREETING) // 20
            await until(lambda: len(c.arrival_times()) >= expected_frames)
            await until(lambda: any(not m.cleared for m in c.marks_echoed()))
            await asyncio.sleep(0.3)
            assert c.errors() == []
            assert set(c.media_sizes()) == {160}
            assert abs(len(c.arrival_times()) - expected_frames) <= 3
            # paced, not dumped: after the lead, the turn arrives over about its own length
            # (how evenly is bench_streams' pacing figure)
            times = c.arrival_times()
            assert times[-1] - times[3] >= (len(times) - 4) * 0.020 * 0.5
            assert c.marks_echoed() and not any(m.cleared for m in c.marks_echoed())

    run(body())


def test_app_turn_reports_heard_ms_and_text_from_echoed_marks() -> None:
    text = "One two three four five six."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "t1", "text": text, "final": True}]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port):
                started = await app.wait_for("call.started")
                assert started["leg"] == "twilio"
                await app.wait_for("turn.started")
                finished = await app.wait_for("turn.finished")
                assert finished["turn_id"] == "t1"
                assert abs(int(finished["heard_ms"]) - tone_turn_ms(text)) <= 60  # type: ignore[call-overload]
                assert finished["heard_text"] == text

    run(body())


def test_caller_speech_barges_in_clears_the_carrier_and_reports_what_was_heard() -> None:
    text = " ".join(f"word{i}" for i in range(40)) + "."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "long", "text": text, "final": True}]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port) as call:
                await app.wait_for("turn.started")
                call.speak_at(call.now() - call.t0 + 0.6, speech_mulaw(1.5))
                cut = await app.wait_for("turn.interrupted")
                c = call.carrier
                await until(lambda: bool(c.clear_times()))
                n_at_clear = len(c.arrival_times())
                await asyncio.sleep(0.3)
                assert len(c.arrival_times()) <= n_at_clear + 1  # nothing more of the turn
                assert cut["turn_id"] == "long" and cut["reason"] == "speech"
                heard = int(cut["heard_ms"])  # type: ignore[call-overload]
                assert 200 <= heard <= 1500
                words = str(cut["heard_text"]).split()
                assert words == text.split()[: len(words)]
                assert app.of("speech.started")

    run(body())


def test_non_interruptible_turn_plays_through_caller_speech() -> None:
    text = "This legal notice plays to the end."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "legal", "text": text, "final": True,
                 "interruptible": False}
            ]  # fmt: skip
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port) as call:
                await app.wait_for("turn.started")
                call.speak_at(call.now() - call.t0 + 0.2, speech_mulaw(0.8))
                finished = await app.wait_for("turn.finished")
                assert finished["turn_id"] == "legal"
                assert not app.of("turn.interrupted")
                assert call.carrier.clear_times() == []

    run(body())


def test_dtmf_reaches_the_application_and_interrupts() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "menu", "text": "Press a key " * 10, "final": True}
            ]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port) as call:
                await app.wait_for("turn.started")
                call.press_at(call.now() - call.t0 + 0.3, "5")
                dtmf = await app.wait_for("dtmf")
                assert dtmf["digit"] == "5"
                cut = await app.wait_for("turn.interrupted")
                assert cut["reason"] == "dtmf"

    run(body())


def test_hangup_command_ends_the_stream_and_call_ended_reaches_the_app() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "hangup", "reason": "done"}]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port) as call:
                await asyncio.wait_for(call.closed.wait(), 10 * FACTOR)
                ended = await app.wait_for("call.ended")
                assert ended["reason"]

    run(body())


def test_malformed_command_gets_an_error_naming_the_field_and_the_call_goes_on() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "say", "turn_id": "x", "text": "Hi.", "final": "yes"},
                {"type": "say", "turn_id": "ok", "text": "Fine.", "final": True},
            ]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port):
                error = await app.wait_for("error")
                assert "final" in json.dumps(error)
                finished = await app.wait_for("turn.finished")
                assert finished["turn_id"] == "ok"

    run(body())


def test_transfer_and_dtmf_are_refused_on_a_twilio_stream_and_the_call_goes_on() -> None:
    """Twilio's media-stream protocol has no transfer and no DTMF message: the app is told
    (command_rejected, naming the reason), the API caller gets 409, and the call goes on."""

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "transfer", "target": "sip:desk@example.com", "id": "x1"},
                {"type": "dtmf", "digits": "12#", "id": "d1"},
                {"type": "say", "turn_id": "ok", "text": "Still here.", "final": True},
            ]
            async with stack(app_route(app.url)) as st, TwilioCall(st.ms_port):
                started = await app.wait_for("call.started")
                await app.wait_for("turn.finished")
                errors = app.of("error")
                assert [(e["code"], e["command"], e["id"]) for e in errors] == [
                    ("command_rejected", "transfer", "x1"),
                    ("command_rejected", "dtmf", "d1"),
                ]
                assert "transfer_unsupported" in str(errors[0]["message"])
                assert "dtmf_unsupported" in str(errors[1]["message"])
                path = f"/v1/calls/{started['call_id']}"
                status, err = await api_post(
                    st.api_port, f"{path}/transfer", {"target": "sip:desk@example.com"}
                )
                assert (status, err["error"]["code"]) == (409, "transfer_unsupported")  # type: ignore[index]
                status, err = await api_post(st.api_port, f"{path}/dtmf", {"digits": "5"})
                assert (status, err["error"]["code"]) == (409, "dtmf_unsupported")  # type: ignore[index]
                assert len(app.of("error")) == 2  # the API's refusals are not sent to the app

    run(body())


def test_unreachable_application_runs_the_fallback_greeting_and_hangs_up() -> None:
    route = app_route("ws://127.0.0.1:9/app", f'greeting = "{GREETING}"')

    async def body() -> None:
        async with stack(route) as st, TwilioCall(st.ms_port) as call:
            await asyncio.wait_for(call.closed.wait(), 20 * FACTOR)
            assert len(call.carrier.arrival_times()) >= tone_turn_ms(GREETING) // 20 - 3

    run(body())


def test_application_lost_mid_call_hands_over_to_the_fallback() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.close_after_start = True
            route = app_route(app.url, 'greeting = "Sorry, goodbye."')
            async with stack(route) as st, TwilioCall(st.ms_port) as call:
                await asyncio.wait_for(call.closed.wait(), 20 * FACTOR)
                assert call.carrier.arrival_times(), "the fallback greeting was spoken"

    run(body())


def test_provider_failover_speaks_through_the_next_provider() -> None:
    extra = """
[providers.dead]
protocol = "kova"
url = "ws://127.0.0.1:9/nothing"
voice = "tone"

[[routes]]
match = "*"
provider = ["dead", "main"]
greeting = "Failover works."
"""

    async def body() -> None:
        async with stack(extra) as st, TwilioCall(st.ms_port) as call:
            await until(lambda: len(call.carrier.arrival_times()) >= 10)
            assert call.carrier.errors() == []

    run(body())


def test_http_api_lists_the_call_and_speaks_into_it() -> None:
    async def body() -> None:
        async with (
            AppServer() as app,
            stack(app_route(app.url)) as st,
            TwilioCall(st.ms_port) as call,
        ):
            await app.wait_for("call.started")
            base = f"http://127.0.0.1:{st.api_port}"

            def get(path: str) -> object:
                with urllib.request.urlopen(base + path, timeout=5 * FACTOR) as r:
                    return json.loads(r.read())

            def post(path: str, body: dict[str, object]) -> int:
                req = urllib.request.Request(
                    base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
                    return int(r.status)

            listed = await asyncio.to_thread(get, "/v1/calls")
            calls = listed["calls"] if isinstance(listed, dict) else listed  # type: ignore[index]
            assert len(calls) == 1 and calls[0]["leg"] == "twilio"
            call_id = calls[0]["call_id"]
            status = await asyncio.to_thread(
                post, f"/v1/calls/{call_id}/say", {"turn_id": "api", "text": "From the API."}
            )
            assert status in (200, 202)
            finished = await app.wait_for("turn.finished")
            assert finished["turn_id"] == "api"
            assert call.carrier.arrival_times()
            spec = await asyncio.to_thread(get, "/openapi.json")
            assert "/v1/calls" in spec["paths"]  # type: ignore[index]

    run(body())


def test_bad_signature_is_refused_before_the_upgrade_and_a_good_one_passes() -> None:
    token = "twilio-auth-token-for-tests"

    async def body() -> None:
        kw = {"ms_extra": f'twilio_auth_token = "{token}"'}
        async with stack(GREETING_ROUTE, **kw) as st:
            url = f"ws://127.0.0.1:{st.ms_port}/twilio"
            with pytest.raises(websockets.InvalidStatus) as info:
                await websockets.connect(url, additional_headers={"X-Twilio-Signature": "bad"})
            assert info.value.response.status_code == 403
            good = twilio_signature(token, url)
            ws = await websockets.connect(url, additional_headers={"X-Twilio-Signature": good})
            await ws.close()

    run(body())


def test_malformed_stream_is_closed_cleanly_and_other_calls_go_on() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            url = f"ws://127.0.0.1:{st.ms_port}/twilio"
            bad = await websockets.connect(url)
            await bad.send(json.dumps({"event": "media", "media": {"payload": "AAAA"}}))
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(bad.recv(), 5 * FACTOR)
            assert info.value.rcvd is not None and info.value.rcvd.code >= 1002
            junk = await websockets.connect(url)
            await junk.send("this is not json")
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(junk.recv(), 5 * FACTOR)
            async with TwilioCall(st.ms_port) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 10)

    run(body())


def test_stream_that_never_stops_releases_the_call_on_socket_close() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            call = TwilioCall(st.ms_port)
            await call.__aenter__()
            await until(lambda: leg.active_calls() == 1)
            for t in call._tasks:
                t.cancel()
            assert call.ws is not None
            await call.ws.close()  # no "stop": the socket just goes away
            await until(lambda: leg.active_calls() == 0)
            assert len(st.daemon.ticker.streams) == 0

    run(body())


def test_single_use_stream_token_from_twiml_admits_once_and_a_replay_is_refused() -> None:
    async def body() -> None:
        kw = {"ms_extra": 'single_use_tokens = true\ntoken_secret = "0123456789abcdef0123"'}
        async with stack(GREETING_ROUTE, **kw) as st:
            base = f"http://127.0.0.1:{st.ms_port}"
            form = b"CallSid=CA00000000000000000000000000000001&From=%2B15550001&To=%2B15550002"

            def post() -> str:
                req = urllib.request.Request(base + "/twiml", form)
                with urllib.request.urlopen(req, timeout=5 * FACTOR) as r:
                    assert r.headers["Content-Type"].startswith("application/xml")
                    return str(r.read().decode())

            xml = await asyncio.to_thread(post)
            assert "<Connect><Stream" in xml and 'name="token"' in xml
            token = xml.split('name="token" value="', 1)[1].split('"', 1)[0]
            async with TwilioCall(st.ms_port, {"token": token}) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 5)
            # the same token again (a captured, replayed stream): refused, closed with 1008
            replay = TwilioCall(st.ms_port, {"token": token})
            async with replay:
                await asyncio.wait_for(replay.closed.wait(), 10 * FACTOR)
            assert replay.carrier.arrival_times() == []
            assert replay.ws is not None and replay.ws.close_code == 1008

    run(body())


def test_dialect_upgrades_need_the_shared_stream_token_when_one_is_set() -> None:
    async def body() -> None:
        kw = {"ms_extra": 'stream_token = "s3cret-stream-token"'}
        async with stack(GREETING_ROUTE, **kw) as st:
            url = f"ws://127.0.0.1:{st.ms_port}/telnyx"
            with pytest.raises(websockets.InvalidStatus) as info:
                await websockets.connect(url)
            assert info.value.response.status_code == 403
            ws = await websockets.connect(url + "?token=s3cret-stream-token")
            await ws.close()
            ws = await websockets.connect(
                url, additional_headers={"Authorization": "Bearer s3cret-stream-token"}
            )
            await ws.close()

    run(body())


def test_metrics_record_the_call() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            async with TwilioCall(st.ms_port) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 20)
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            await until(lambda: leg.active_calls() == 0)
            api = st.api_port

            def scrape() -> str:
                url = f"http://127.0.0.1:{api}/metrics"
                with urllib.request.urlopen(url, timeout=5 * FACTOR) as r:
                    return str(r.read().decode())

            text = await asyncio.to_thread(scrape)
            for needle in [
                'callbridge_calls_total{leg="twilio",outcome="stop",route="*"} 1.0',
                'callbridge_calls_active{leg="twilio",route="*"} 0.0',
                'callbridge_time_to_first_audio_seconds_count{provider="main"} 1.0',
                'callbridge_added_latency_seconds_count{leg="twilio"} 1.0',
                'callbridge_call_setup_seconds_count{leg="twilio"} 1.0',
            ]:
                assert needle in text, needle
            # the greeting is one turn, counted once (the call ends while it plays)
            turns = re.findall(r"callbridge_turns_total\{([^}]*)\} (\S+)", text)
            assert [n for labels, n in turns if 'provider="main"' in labels] == ["1.0"], turns
            # the departure deviation of sampled frames is really observed
            m = re.search(r'callbridge_pacing_deviation_seconds_count\{leg="twilio"\} (\S+)', text)
            assert m is not None and float(m.group(1)) > 0, m

    run(body())


@pytest.mark.parametrize("protocol", ["kova", "kugelaudio", "kletso", "coda", "zwst"])
def test_barge_in_works_with_every_provider_protocol(protocol: str) -> None:
    text = " ".join(f"word{i}" for i in range(40)) + "."

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "long", "text": text, "final": True}]
            async with (
                stack(app_route(app.url), protocol=protocol) as st,
                TwilioCall(st.ms_port) as call,
            ):
                await app.wait_for("turn.started")
                await until(lambda: len(call.carrier.arrival_times()) >= 10)
                call.speak_at(call.now() - call.t0 + 0.1, speech_mulaw(1.5))
                cut = await app.wait_for("turn.interrupted")
                assert cut["turn_id"] == "long" and cut["reason"] == "speech"
                await until(lambda: bool(call.carrier.clear_times()))
                n = len(call.carrier.arrival_times())
                await asyncio.sleep(0.3)
                assert len(call.carrier.arrival_times()) <= n + 1

    run(body())


def test_plivo_upgrades_need_a_valid_v3_signature_and_each_nonce_once() -> None:
    from bridge.streams.auth import plivo_signature_v3

    token = "plivo-auth-token-for-tests"

    async def body() -> None:
        async with stack(GREETING_ROUTE, ms_extra=f'plivo_auth_token = "{token}"') as st:
            url = f"ws://127.0.0.1:{st.ms_port}/plivo"
            with pytest.raises(websockets.InvalidStatus) as info:
                await websockets.connect(url)
            assert info.value.response.status_code == 403
            headers = {
                "X-Plivo-Signature-V3-Nonce": "n-1",
                "X-Plivo-Signature-V3": plivo_signature_v3(token, url, "n-1"),
            }
            ws = await websockets.connect(url, additional_headers=headers)
            await ws.close()
            with pytest.raises(websockets.InvalidStatus) as info:  # the same nonce again
                await websockets.connect(url, additional_headers=headers)
            assert info.value.response.status_code == 403

    run(body())


def test_cancel_speech_stopped_and_provider_error_reach_the_app() -> None:
    extra = """
[providers.dead]
protocol = "kova"
url = "ws://127.0.0.1:9/nothing"
voice = "tone"
"""

    async def body() -> None:
        async with AppServer() as app:
            long = " ".join(f"word{i}" for i in range(40)) + "."
            app.on_started = [
                {"type": "say", "turn_id": "doomed", "text": "Never.", "provider": "dead"},
                {"type": "say", "turn_id": "long", "text": long},
            ]
            async with (
                stack(app_route(app.url, extra.replace("[providers", "\n[providers"))) as st,
                TwilioCall(st.ms_port) as call,
            ):
                error = await app.wait_for("provider.error")
                assert error["turn_id"] == "doomed" and error["provider"] == "dead"
                await app.wait_for("turn.started")
                await app.send({"type": "cancel", "turn_id": "long"})
                cut = await app.wait_for("turn.interrupted", count=2)
                assert cut["turn_id"] == "long" and cut["reason"] == "cancelled"
                call.speak_at(call.now() - call.t0 + 0.1, speech_mulaw(0.6))
                await app.wait_for("speech.started")
                await app.wait_for("speech.stopped")

    run(body())


def test_oversized_message_closes_the_stream_with_1009() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE, ms_extra="max_message_bytes = 4096") as st:
            ws = await websockets.connect(f"ws://127.0.0.1:{st.ms_port}/twilio")
            await ws.send(json.dumps({"event": "connected", "pad": "x" * 10_000}))
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 5 * FACTOR)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1009

    run(body())


def test_two_streams_with_the_same_call_sid_are_two_calls() -> None:
    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            async with TwilioCall(st.ms_port) as a, TwilioCall(st.ms_port) as b:
                await until(lambda: leg.active_calls() == 2)
                await until(lambda: len(a.carrier.arrival_times()) >= 10)
                await until(lambda: len(b.carrier.arrival_times()) >= 10)
            await until(lambda: leg.active_calls() == 0)

    run(body())


def test_reload_keeps_calls_on_their_generation_and_retires_it_when_they_end(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from .harness import config_text

    async def body() -> None:
        async with stack(GREETING_ROUTE) as st:
            path = tmp_path / "callbridge.toml"
            lo, hi = st.config.sip.rtp_ports  # the listeners unchanged: a reload may not move them
            sip = st.config.sip.listen[0].rsplit(":", 1)[1]
            reloaded = GREETING_ROUTE.replace("Hello", "Reloaded")
            path.write_text(config_text(st.tts.port, reloaded, sip=sip, rtp=f"{lo}-{hi}"))
            st.daemon.config = replace(st.daemon.config, path=str(path))
            leg = next(leg for leg in st.daemon.legs if leg.name == "media_streams")
            old = st.daemon.runtime
            async with TwilioCall(st.ms_port) as call:
                await until(lambda: len(call.carrier.arrival_times()) >= 5)
                await st.daemon.reload()
                assert st.daemon.runtime is not old
                assert st.daemon.runtime is not None
                # the legs' seam follows: new calls start under the new generation
                assert st.daemon.services.runtime is st.daemon.runtime
                assert st.daemon.services.config is st.daemon.config
                assert st.daemon.runtime.config.routes[0].greeting.startswith("Reloaded")
                assert st.daemon._old_runtimes == [old]  # the call in progress keeps it
            await until(lambda: leg.active_calls() == 0)
            await until(lambda: not st.daemon._old_runtimes)
            assert old is not None
            await until(
                lambda: all(not c.ws or c.closed for p in old.pools.values() for c in p.connections)
            )

    run(body())


def test_flow_gather_timeout_runs_through_the_shell_timer() -> None:
    routes = """
[[routes]]
match = "*"
provider = "main"
flow = "f"

[flows.f]
start = "ask"

[flows.f.steps.ask]
say = "Press one."
gather = { max_digits = 1, timeout_s = 0.5 }
branch = { "1" = "bye", timeout = "bye" }

[flows.f.steps.bye]
say = "Bye."
hangup = true
"""

    async def body() -> None:
        async with stack(routes) as st, TwilioCall(st.ms_port) as call:
            # nobody presses anything: the gather times out, "Bye." plays, the call ends
            await asyncio.wait_for(call.closed.wait(), 15 * FACTOR)
            expected = (tone_turn_ms("Press one.") + tone_turn_ms("Bye.")) // 20
            assert len(call.carrier.arrival_times()) >= expected - 4

    run(body())

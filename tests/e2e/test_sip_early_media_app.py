"""The application decides a SIP call's early media (issue 34): ``answer`` and ``reject``.

A route with ``early_media = "greeting"`` and an application: the daemon sends 183
with SDP and plays the app's first turn before any answer. The app's ``answer`` sends
the 200 while the turn plays (the caller, `callbridge call`'s own UAC, hears the rest
of it after the 200); its ``reject`` ends the call with the status it chose and no 200;
either command on an answered call is refused with an ``error`` and changes nothing.

Order, not duration: the daemon, the app server and the caller share one event loop,
so the caller's answer time and the app's event arrivals are on one clock. Waits are
timeouts for events, scaled by ``CALLBRIDGE_TEST_TIME_FACTOR``.
"""

from __future__ import annotations

import asyncio

import structlog

from bridge.control.report import build_report
from bridge.io.caller import CallerOptions, CallResult, place_call

from .harness import FACTOR, AppServer, api_post, app_route, stack, tone_turn_ms

GREETING = " ".join(f"word{i}" for i in range(20)) + "."
"""About 4 s of tone audio: long enough to be playing when the app decides."""
EARLY_APP = 'early_media = "greeting"'


def run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 60 * FACTOR))  # type: ignore[arg-type]


async def _call(st_sip_port: int, duration_s: float) -> asyncio.Task[CallResult]:
    opts = CallerOptions(target=f"sip:demo@127.0.0.1:{st_sip_port}", duration_s=duration_s)
    return asyncio.ensure_future(place_call(opts))


def test_app_answer_sends_the_200_while_the_early_greeting_plays() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": GREETING}]
            async with stack(app_route(app.url, EARLY_APP)) as st:
                leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
                caller = await _call(st.sip_port, 8.0 * FACTOR)
                await app.wait_for("turn.started")
                assert leg.early  # 183 sent, no final response yet
                # a bad status is refused naming the field, and decides nothing
                await app.send({"type": "reject", "id": "r1", "status": 200})
                bad = await app.wait_for("error")
                assert (bad["code"], bad["field"], bad["id"]) == ("invalid_command", "status", "r1")
                await app.send({"type": "answer"})
                finished = await app.wait_for("turn.finished", 15.0)
                finished_at = loop.time()
                # decided once: a second answer is refused
                await app.send({"type": "answer", "id": "a2"})
                again = await app.wait_for("error", count=2)
                assert again["code"] == "command_rejected" and again["command"] == "answer"
                assert "not_early_media" in str(again["message"]) and again["field"] == "$"
                result = await caller
        rec = result.recording
        report = build_report(rec)
        assert report.answered, rec.failure
        assert rec.answered_at_s is not None and rec.answered_at_s < finished_at
        # the turn went on after the 200 and played to its end: the caller (who only
        # records from the 200 on) heard part of it, not all of it
        assert finished["turn_id"] == "g" and not app.of("turn.interrupted")
        heard_ms = report.speech_frames_received * 20
        assert 0 < heard_ms < tone_turn_ms(GREETING), heard_ms
        assert report.ended_by == "local-hangup"  # the caller's, at its duration: no 480

    run(body())


def test_app_reject_ends_the_early_call_with_its_status_and_no_200() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": GREETING}]
            async with stack(app_route(app.url, EARLY_APP)) as st:
                leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
                with structlog.testing.capture_logs() as logs:
                    caller = await _call(st.sip_port, 8.0 * FACTOR)
                    await app.wait_for("turn.started")
                    await app.send({"type": "reject", "status": 480, "reason": "Closed Today"})
                    ended = await app.wait_for("call.ended")
                    result = await caller
                    assert await _until(lambda: not leg.calls and leg.ports.allocated_count == 0)
        rec = result.recording
        assert rec.answered_at_s is None and rec.failure == "480 Closed Today", rec.failure
        assert ended["reason"] == "rejected"
        assert not app.of("turn.finished")  # cut by the call's end, not played out
        assert [e["reason"] for e in app.of("turn.interrupted")] == ["call_ended"]
        (cdr,) = [e for e in logs if e["event"] == "call.ended" and e.get("cdr")]
        assert (cdr["reason"], cdr["final_status"]) == ("rejected", 480)

    run(body())


def test_the_http_api_answers_an_early_call_and_refuses_a_second_answer() -> None:
    """``POST /v1/calls/{id}/answer`` decides the early media as the app's ``answer``
    would: the 200 goes while the greeting plays; a second answer is 409 not_early_media,
    and a transfer naming no configured trunk 422 unknown_trunk."""

    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [{"type": "say", "turn_id": "g", "text": GREETING}]
            async with stack(app_route(app.url, EARLY_APP)) as st:
                leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
                caller = await _call(st.sip_port, 6.0 * FACTOR)
                started = await app.wait_for("call.started")
                await app.wait_for("turn.started")
                assert leg.early
                path = f"/v1/calls/{started['call_id']}"
                assert await api_post(st.api_port, f"{path}/answer") == (
                    202,
                    {"call_id": started["call_id"]},
                )
                status, err = await api_post(st.api_port, f"{path}/answer")
                assert status == 409 and err["error"]["code"] == "not_early_media"  # type: ignore[index]
                status, err = await api_post(
                    st.api_port, f"{path}/transfer", {"target": "tel:+15551234567", "trunk": "x"}
                )
                assert status == 422 and err["error"]["field"] == "trunk"  # type: ignore[index]
                result = await caller
        assert not app.of("error")  # the API's refusals are the API caller's, not the app's
        report = build_report(result.recording)
        assert report.answered and report.speech_frames_received > 0
        assert report.ended_by == "local-hangup"

    run(body())


def test_answer_and_reject_on_an_answered_call_are_refused() -> None:
    async def body() -> None:
        async with AppServer() as app:
            app.on_started = [
                {"type": "answer", "id": "a1"},
                {"type": "reject", "id": "r1", "status": 603},
                {"type": "say", "turn_id": "g", "text": "Still here."},
            ]
            async with stack(app_route(app.url)) as st:  # no early media: answered at once
                caller = await _call(st.sip_port, 3.0 * FACTOR)
                errors = [await app.wait_for("error", count=n) for n in (1, 2)]
                await app.wait_for("turn.finished")
                result = await caller
        assert [(e["command"], e["code"], e["field"]) for e in errors] == [
            ("answer", "command_rejected", "$"),
            ("reject", "command_rejected", "$"),
        ]
        assert all("not_early_media" in str(e["message"]) for e in errors)
        report = build_report(result.recording)
        assert report.answered and report.ended_by == "local-hangup"  # nothing changed
        assert report.speech_frames_received > 0

    run(body())


async def _until(cond: object, timeout_s: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s * FACTOR
    while not cond():  # type: ignore[operator]
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True

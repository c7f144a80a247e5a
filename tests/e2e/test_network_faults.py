"""A SIP call through a seeded fault relay: 10 % loss, duplicates, reordering,
60 ms of jitter and a 2 s blackout on both SIP and RTP, both ways.

The caller is ``callbridge call``'s own UAC (``place_call``); the relay
(``bench/loadgen/faultrelay.py``) sits between it and the in-process daemon
and rewrites SIP/SDP so that signalling and media both cross it. The
application says a long turn at the start and after every key press (a press
barges in). What must hold is an outcome, never a timing: the call is
answered and ends cleanly when the caller hangs up, each key press reaches
the application exactly once, and the caller's speech after the blackout
still barges in.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from bench.loadgen.faultrelay import Faults, SipRtpRelay
from bridge.io import caller
from bridge.io.caller import CallerOptions, SpeakClip, place_call
from telcodec import g711

from .harness import FACTOR, AppServer, app_route, speech_mulaw, stack

LONG = " ".join(f"word{i}" for i in range(150)) + "."
# Times are seconds from the answer (the caller's) and from the relay's start
# (the blackout); the relay starts just before the INVITE, so the blackout
# falls between the second and third presses even if setup takes a second.
PRESSES = ((1.5, "1"), (3.0, "2"), (9.0, "3"))
SPEECH_AT_S = 10.5
DURATION_S = 13.5
FAULTS = Faults(
    loss=0.10,
    duplicate=0.05,
    reorder=0.05,
    jitter_s=0.060,
    blackouts=((5.0, 7.0),),
)


class TalkingApp(AppServer):
    """Says a long turn when the call starts and again after every key press."""

    async def _handler(self, ws: websockets.ServerConnection) -> None:
        self.conns.append(ws)
        turns = 0
        async for msg in ws:
            event: dict[str, Any] = json.loads(msg)
            self.events.append(event)
            self.changed.set()
            if event.get("type") in ("call.started", "dtmf"):
                turns += 1
                say = {"type": "say", "turn_id": f"t{turns}", "text": LONG, "final": True}
                await ws.send(json.dumps(say))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 33])
def test_a_call_through_loss_jitter_and_a_blackout_keeps_its_digits_and_barge_in(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller waits 1 s for its BYE's answer, then closes its sockets: on a
    # lossy path its BYE and the 200 can both be lost in that second (every
    # retransmission too) and the daemon keeps the call until its RTP timeout.
    # A real UA retransmits a BYE for up to 32 s (Timer F); give it 10.
    monkeypatch.setattr(caller, "HANGUP_GRACE_S", 10.0)
    speech = g711.ulaw_decode(speech_mulaw(1.5))

    async def body() -> None:
        async with TalkingApp() as app, stack(app_route(app.url), sip="0") as st:
            leg = next(leg for leg in st.daemon.legs if leg.name == "sip")
            daemon_sip = leg.runners[0].udp.get_extra_info("sockname")[:2]  # type: ignore[attr-defined]
            relay = SipRtpRelay(daemon_sip, FAULTS, seed)
            await relay.start()
            try:
                host, port = relay.sip_front
                opts = CallerOptions(
                    target=f"sip:demo@{host}:{port}",
                    dtmf=PRESSES,
                    speak=(SpeakClip("speech", SPEECH_AT_S, speech),),
                    duration_s=DURATION_S,
                )
                result = await place_call(opts)
                await app.wait_for("call.ended", timeout_s=5)
            finally:
                relay.close()
            rec = result.recording
            assert rec.answered_at_s is not None, rec.failure
            assert rec.failure is None and rec.ended_by == "local-hangup"
            assert [e["digit"] for e in app.of("dtmf")] == [d for _, d in PRESSES]
            reasons = [e["reason"] for e in app.of("turn.interrupted")]
            assert reasons.count("dtmf") == len(PRESSES), reasons
            assert "speech" in reasons, reasons
            assert len(app.of("call.ended")) == 1
            # the relay did what it was asked to: packets lost, duplicated,
            # reordered and blacked out on the media path, both ways
            for schedule in (relay.rtp.up, relay.rtp.down):
                assert schedule is not None
                c = schedule.counters
                assert c.lost and c.duplicated and c.reordered and c.blacked_out, c
            assert relay.sip.up is not None and relay.sip.up.counters.packets >= 3

    asyncio.run(asyncio.wait_for(body(), 90 * FACTOR))

"""An underrun's cause, end to end: the provider's, or audio the daemon had not read.

A turn's messages are held back for half a second after its first word, once in
the daemon's provider client after they were read (as a provider that sends late
looks to the call), once in the kernel by pausing the connection's reads (the daemon
not reading a provider socket in time). The call runs dry both times; only the
first is the provider's (``callbridge_underruns_provider_total``).

The daemon and the emulated carrier share one event loop: when that loop stalls (a
loaded host), the carrier can run dry with no underrun the daemon could count.
Each run measures its loop's stalls and allows exactly that much more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.io.provider_pool import PromptCache
from bridge.io.provider_ws import Connection, _ProviderWebSocket

from .harness import FACTOR, Stack, TwilioCall, stack

TEXT = " ".join(f"word{k}" for k in range(40))
ROUTE = f"""
[[routes]]
match = "*"
provider = "main"
greeting = "{TEXT}"
"""
HOLD_S = 0.5


def _hold_after_first_word(
    conn: Connection, in_kernel: bool, hold_s: float, released: asyncio.Event
) -> None:
    """From the turn's second audio message on, hold every message for ``hold_s``."""
    loop = asyncio.get_running_loop()
    ws = conn.ws
    assert isinstance(ws, _ProviderWebSocket)
    real: Callable[[str | bytes], None] = ws.on_message
    held: list[str | bytes] = []
    state = {"audio": 0, "holding": False}

    def release() -> None:
        state["holding"] = False
        if in_kernel:
            ws.transport.resume_reading()
        for msg in held:
            real(msg)
        held.clear()
        released.set()

    def on_message(msg: str | bytes) -> None:
        if "audio_chunk" in str(msg):
            state["audio"] += 1
            if state["audio"] == 2:
                state["holding"] = True
                loop.call_later(hold_s, release)
                if in_kernel:  # what follows waits in the kernel, unread
                    ws.transport.pause_reading()
        if state["holding"]:
            held.append(msg)
        else:
            real(msg)

    ws.on_message = on_message


async def _watch_stalls(stalls: list[float]) -> None:
    """Record how late each 5 ms sleep of the loop woke (over 2 ms of timer slack)."""
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(0.005)
        late_s = loop.time() - before - 0.005
        if late_s > 0.002:
            stalls.append(late_s)


def _underruns(
    in_kernel: bool, lead_ms: int = 60, hold_s: float = HOLD_S
) -> tuple[float, float, float, float]:
    """(underruns, the provider's, seconds the carrier's buffer ran dry mid-turn,
    seconds the loop was stalled meanwhile)."""

    async def body() -> tuple[float, float, float, float]:
        async with stack(ROUTE, ms_extra=f"lead_ms = {lead_ms}") as st:
            assert st.daemon.runtime is not None
            # the greeting was rendered at start-up: this call's must come from the provider
            st.daemon.runtime.cache = PromptCache()
            conn = st.daemon.runtime.pools["main"].connections[0]
            released = asyncio.Event()
            _hold_after_first_word(conn, in_kernel, hold_s, released)
            stalls: list[float] = []
            watch = asyncio.ensure_future(_watch_stalls(stalls))
            async with TwilioCall(st.ms_port) as call:
                # until the hold is over and half a second of the turn has played after it
                await asyncio.wait_for(released.wait(), 20 * FACTOR)
                arrived = len(call.carrier.arrival_times())
                async with asyncio.timeout(20 * FACTOR):
                    while len(call.carrier.arrival_times()) < arrived + 25:
                        await asyncio.sleep(0.01)
            watch.cancel()
            m = st.daemon.metrics

            async def ended() -> None:  # the call's counters land when it ends
                while not call_ended(st):
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(ended(), 10 * FACTOR)
            return (
                m.underruns_total._value.get(),
                m.underruns_provider_total._value.get(),
                sum(d for _, d in call.carrier.playout_gaps()),
                sum(stalls),
            )

    return asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


def call_ended(st: Stack) -> bool:
    return sum(leg.active_calls() for leg in st.daemon.legs) == 0


def test_audio_the_provider_sent_late_is_the_providers_underrun() -> None:
    total, provider, gap_s, stalled_s = _underruns(in_kernel=False)
    assert total >= 10  # about HOLD_S of silence, less what the first word covered
    assert provider == total
    # each underrun is a frame the caller did not hear: the carrier's buffer, once its
    # lead was spent, ran dry for as long (within a frame either side, and what the
    # shared loop's stalls could add or hide)
    assert abs(total * 0.02 - gap_s) <= 0.03 + stalled_s, (total, gap_s, stalled_s)


def test_audio_waiting_unread_in_the_kernel_is_the_daemons_underrun() -> None:
    total, provider, gap_s, stalled_s = _underruns(in_kernel=True)
    assert total >= 10
    assert provider == 0
    assert abs(total * 0.02 - gap_s) <= 0.03 + stalled_s, (total, gap_s, stalled_s)


def test_a_dry_spell_the_carriers_lead_covers_is_no_underrun() -> None:
    """The media stream's carrier holds the lead sent at the turn's start (here up to
    300 ms: the first word, ~190 ms, all goes at once): while it holds some, a tick
    with nothing to send leaves no gap, and counts as no underrun. Then a spell
    longer than the lead: only the ticks after the lead is spent count."""
    total, provider, gap_s, stalled_s = _underruns(in_kernel=False, lead_ms=300, hold_s=0.1)
    if stalled_s < 0.05:  # a stall this short cannot drain what the hold left of the lead
        assert gap_s == 0.0  # the caller heard the whole turn without a gap
    assert total == 0 and provider == 0
    total, provider, gap_s, stalled_s = _underruns(in_kernel=False, lead_ms=300, hold_s=0.6)
    assert gap_s > 0.2
    assert provider == total
    assert abs(total * 0.02 - gap_s) <= 0.03 + stalled_s, (total, gap_s, stalled_s)

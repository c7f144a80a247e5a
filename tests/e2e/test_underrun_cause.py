"""An underrun's cause, end to end: the provider's, or audio the daemon had not read.

A turn's messages are held back for half a second after its first word, once in
the daemon's provider client after they were read (as a provider that sends late
looks to the call), once in the kernel by pausing the connection's reads (the daemon
not reading a provider socket in time). The call runs dry both times; only the
first is the provider's (``callbridge_underruns_provider_total``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.io.tts_client import _Connection, _ProviderWebSocket

from .harness import FACTOR, TwilioCall, stack

TEXT = " ".join(f"word{k}" for k in range(40))
ROUTE = f"""
[[routes]]
match = "*"
provider = "main"
greeting = "{TEXT}"
"""
HOLD_S = 0.5


def _hold_after_first_word(conn: _Connection, in_kernel: bool) -> None:
    """From the turn's second audio message on, hold every message for ``HOLD_S``."""
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

    def on_message(msg: str | bytes) -> None:
        if "audio_chunk" in str(msg):
            state["audio"] += 1
            if state["audio"] == 2:
                state["holding"] = True
                loop.call_later(HOLD_S, release)
                if in_kernel:  # what follows waits in the kernel, unread
                    ws.transport.pause_reading()
        if state["holding"]:
            held.append(msg)
        else:
            real(msg)

    ws.on_message = on_message


def _underruns(in_kernel: bool) -> tuple[float, float]:
    async def body() -> tuple[float, float]:
        async with stack(ROUTE) as st:
            assert st.daemon.runtime is not None
            _hold_after_first_word(st.daemon.runtime.pools["main"].connections[0], in_kernel)
            async with TwilioCall(st.ms_port):
                await asyncio.sleep(HOLD_S + 1.0)
            m = st.daemon.metrics

            async def ended() -> None:  # the call's counters land when it ends
                while not m.underruns_total._value.get():
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(ended(), 10 * FACTOR)
            return (
                m.underruns_total._value.get(),
                m.underruns_provider_total._value.get(),
            )

    return asyncio.run(asyncio.wait_for(body(), 60 * FACTOR))


def test_audio_the_provider_sent_late_is_the_providers_underrun() -> None:
    total, provider = _underruns(in_kernel=False)
    assert total >= 10  # about HOLD_S of silence, less what the first word covered
    assert provider == total


def test_audio_waiting_unread_in_the_kernel_is_the_daemons_underrun() -> None:
    total, provider = _underruns(in_kernel=True)
    assert total >= 10
    assert provider == 0

"""A wideband SIP call end to end: the caller offers G.722 first, the daemon (``[sip]
codecs`` preferring it) answers G.722, and the caller hears the greeting decoded from
G.722 at 16 kHz (issue 34). The provider is ttsd's deterministic tone engine; the calls
are ``wideband``'s, shared with Opus."""

from __future__ import annotations

from .wideband import g711_caller_gets_pcmu, greeting_call, prerendered_greeting_is_heard, run


def test_a_g722_call_is_answered_in_g722_and_hears_the_greeting() -> None:
    async def body() -> None:
        result = await greeting_call("G722", "Hello in wideband.")
        assert len(result.heard_pcm_s16le) > 0  # the 8 kHz recording too

    run(body())


def test_a_g711_caller_still_gets_g711_where_g722_is_preferred() -> None:
    run(g711_caller_gets_pcmu("G722"))


def test_a_routes_prerendered_greeting_is_heard_on_a_g722_call() -> None:
    """The route's greeting is rendered at start-up at 16 kHz too (``[sip] codecs`` prefers
    G722), the format a G.722 call asks for."""
    run(prerendered_greeting_is_heard("G722"))

"""Opus on a SIP call end to end: the caller offers Opus first, the daemon (``[sip] codecs``
preferring it) answers Opus at the caller's payload type with telephone-event/48000, and
the caller hears the greeting decoded from Opus at 16 kHz; RFC 4733 DTMF on the 48 kHz
clock still reaches the app; a G.711-only caller still gets PCMU (issue 34). The provider
is ttsd's deterministic tone engine; the calls are ``wideband``'s, shared with G.722."""

from __future__ import annotations

from .wideband import g711_caller_gets_pcmu, greeting_call, prerendered_greeting_is_heard, run


def test_an_opus_call_is_answered_in_opus_and_hears_the_greeting() -> None:
    run(greeting_call("OPUS", "Hello over Opus."))


def test_a_g711_caller_still_gets_pcmu_where_opus_is_preferred() -> None:
    run(g711_caller_gets_pcmu("OPUS"))


def test_a_routes_prerendered_greeting_is_heard_on_an_opus_call() -> None:
    """The route's greeting is rendered at start-up at 16 kHz too (``[sip] codecs`` prefers
    OPUS), the format an Opus call asks for."""
    run(prerendered_greeting_is_heard("OPUS"))

"""Webhook signatures and replay memory (issue 33): pure functions, no clock."""

from __future__ import annotations

from twilio.request_validator import RequestValidator

from bridge.streams.auth import (
    ReplayGuard,
    plivo_signature_v3_valid,
    shared_token_valid,
    twilio_signature_valid,
    twilio_webhook_valid,
)

TOKEN = "twilio-auth-token"
URL = "https://bridge.example.com/twiml?route=sales"
FORM = {"CallSid": "CA1", "From": "+15550001", "To": "+15550002", "Caller": "+15550001"}


def test_webhook_signature_covers_the_url_and_every_sorted_post_parameter() -> None:
    signature = RequestValidator(TOKEN).compute_signature(URL, FORM)
    assert twilio_webhook_valid(TOKEN, URL, FORM, signature)
    assert twilio_webhook_valid(TOKEN, URL.replace(".com/", ".com:443/"), FORM, signature)
    assert not twilio_webhook_valid(TOKEN, URL, {**FORM, "CallSid": "CA2"}, signature)
    assert not twilio_webhook_valid(TOKEN, URL, {**FORM, "Extra": ""}, signature)
    assert not twilio_webhook_valid(TOKEN, URL.replace("sales", "support"), FORM, signature)
    assert not twilio_webhook_valid("other-token", URL, FORM, signature)
    assert not twilio_webhook_valid("", URL, FORM, signature)
    assert not twilio_webhook_valid(TOKEN, URL, FORM, None)


def test_non_ascii_signatures_and_tokens_are_refused_not_raised() -> None:
    for bad in ("é", "\udcff", "²", "a" * 10_000):
        assert not twilio_webhook_valid(TOKEN, URL, FORM, bad)
        assert not twilio_signature_valid(TOKEN, "wss://b.example/twilio", bad)
        assert not plivo_signature_v3_valid(TOKEN, "wss://b.example/plivo", "n", bad)
        assert not shared_token_valid("s3cret", bad)


def test_replay_guard_remembers_until_expiry_and_forgets_in_order() -> None:
    guard = ReplayGuard()
    assert guard.first_use("a", 10.0, 0.0)
    assert guard.first_use("b", 5.0, 0.0)
    assert not guard.first_use("a", 10.0, 1.0)
    assert not guard.first_use("b", 5.0, 4.9)
    assert guard.first_use("b", 20.0, 5.0)  # expired at 5: a new use
    assert len(guard) == 2
    guard.forget_expired(10.0)
    assert len(guard) == 1
    assert not guard.first_use("b", 30.0, 19.0)
    guard.forget_expired(20.0)
    assert len(guard) == 0

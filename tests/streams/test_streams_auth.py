"""Authentication helpers: Twilio/Plivo signatures, Telnyx Ed25519, single-use tokens, TwiML."""

from __future__ import annotations

import base64
import itertools
from xml.etree import ElementTree

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bridge.streams.auth import (
    ReplayGuard,
    TokenBook,
    basic_auth_password,
    plivo_signature_v3,
    plivo_signature_v3_valid,
    presented_token,
    shared_token_valid,
    telnyx_webhook_valid,
    twilio_signature,
    twilio_signature_valid,
)
from bridge.streams.twiml import twiml_for_route

TOKEN = "12345678901234567890123456789012"
URL = "wss://bridge.example.com/twilio"


# ------------------------------------------------------------------ Twilio


def test_twilio_signature_round_trip_and_tampering() -> None:
    signature = twilio_signature(TOKEN, URL)
    assert twilio_signature_valid(TOKEN, URL, signature)
    assert not twilio_signature_valid(TOKEN, URL + "x", signature)
    assert not twilio_signature_valid(TOKEN, "wss://evil.example.com/twilio", signature)
    assert not twilio_signature_valid("another-token-000000000000000000", URL, signature)
    assert not twilio_signature_valid(TOKEN, URL, signature[:-2] + "AA")
    assert not twilio_signature_valid(TOKEN, URL, None)
    assert not twilio_signature_valid("", URL, signature)


def test_twilio_signature_matches_the_documented_algorithm() -> None:
    import hashlib
    import hmac

    expected = base64.b64encode(hmac.new(TOKEN.encode(), URL.encode(), hashlib.sha1).digest())
    assert twilio_signature(TOKEN, URL) == expected.decode()


def test_twilio_https_spelling_of_the_url_is_accepted() -> None:
    signature = twilio_signature(TOKEN, "https://bridge.example.com/twilio")
    assert twilio_signature_valid(TOKEN, URL, signature)


# ------------------------------------------------------------------- Plivo


def test_plivo_v3_signature() -> None:
    url = "wss://bridge.example.com/plivo"
    signature = plivo_signature_v3(TOKEN, url, "n-1")
    assert plivo_signature_v3_valid(TOKEN, url, "n-1", signature)
    assert plivo_signature_v3_valid(TOKEN, url, "n-1", "other," + signature)  # rotated tokens
    assert not plivo_signature_v3_valid(TOKEN, url, "n-2", signature)
    assert not plivo_signature_v3_valid(TOKEN, url + "?a=1", "n-1", signature)
    assert not plivo_signature_v3_valid(TOKEN, url, None, signature)
    # query parameters are signed sorted by name
    assert plivo_signature_v3(TOKEN, url + "?b=2&a=1", "n") == plivo_signature_v3(
        TOKEN, url + "?a=1&b=2", "n"
    )


# ------------------------------------------------------------------ Telnyx


def test_telnyx_webhook_ed25519_with_replay_window() -> None:
    key = Ed25519PrivateKey.generate()
    public_b64 = base64.b64encode(
        key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    ).decode()
    body = b'{"data":{"event_type":"call.initiated"}}'
    timestamp = "1700000000"
    signature = base64.b64encode(key.sign(timestamp.encode() + b"|" + body)).decode()
    assert telnyx_webhook_valid(public_b64, signature, timestamp, body, now=1700000010.0)
    assert not telnyx_webhook_valid(public_b64, signature, timestamp, body + b" ", now=1700000010.0)
    assert not telnyx_webhook_valid(public_b64, signature, "1700000001", body, now=1700000010.0)
    assert not telnyx_webhook_valid(public_b64, signature, timestamp, body, now=1700000400.0)
    assert not telnyx_webhook_valid(public_b64, "not base64!", timestamp, body, now=1700000010.0)
    assert not telnyx_webhook_valid("AAAA", signature, timestamp, body, now=1700000010.0)


# ---------------------------------------------------------- shared secrets


def test_presented_token_from_bearer_basic_or_query() -> None:
    basic = "Basic " + base64.b64encode(b"key:s3cret").decode()
    assert presented_token({"Authorization": "Bearer abc"}, {}) == "abc"
    assert presented_token({"authorization": basic}, {}) == "s3cret"
    assert presented_token({}, {"token": "q"}) == "q"
    assert presented_token({}, {}) is None
    assert basic_auth_password("Basic !!!") is None
    assert basic_auth_password("Basic " + base64.b64encode(b"nocolon").decode()) is None
    assert shared_token_valid("s3cret", "s3cret")
    assert not shared_token_valid("s3cret", "s3cres")
    assert not shared_token_valid("", "")
    assert not shared_token_valid("s3cret", None)


# ------------------------------------------------------- single-use tokens


def book(ttl_s: float = 30.0) -> TokenBook:
    counter = itertools.count()
    return TokenBook(b"k" * 32, ttl_s, random_bytes=lambda n: next(counter).to_bytes(n, "big"))


def test_token_is_single_use() -> None:
    tokens = book()
    token = tokens.mint("CA1", now=100.0)
    assert tokens.check(token, "CA1", now=101.0) == "ok"
    assert tokens.check(token, "CA1", now=102.0) == "replayed"
    assert tokens.remembered == 1


def test_token_expires_and_memory_is_released() -> None:
    tokens = book(ttl_s=30.0)
    used = tokens.mint("CA1", now=100.0)
    assert tokens.verify(used, "CA1", now=129.9)
    late = tokens.mint("CA2", now=100.0)
    assert tokens.check(late, "CA2", now=130.0) == "expired"
    tokens.mint("CA3", now=200.0)
    assert tokens.check(used, "CA1", now=200.0) == "expired"  # not "replayed": it aged out
    assert tokens.remembered == 0


def test_token_is_bound_to_its_call_and_secret() -> None:
    tokens = book()
    token = tokens.mint("CA1", now=0.0)
    assert tokens.check(token, "CA2", now=1.0) == "bad_mac"
    version, expiry, nonce, mac = token.split(".")
    assert tokens.check(f"{version}.{int(expiry) + 60000}.{nonce}.{mac}", "CA1", 1.0) == "bad_mac"
    assert tokens.check(f"{version}.{expiry}.{nonce}X.{mac}", "CA1", 1.0) == "bad_mac"
    other = TokenBook(b"z" * 32)
    assert other.check(token, "CA1", now=1.0) == "bad_mac"
    assert tokens.check(token, "CA1", now=1.0) == "ok"  # failures did not burn it


@pytest.mark.parametrize(
    "token", [None, "", "v1", "v2.1.a.b", "v1.x.a.b", "v1.1..b", "v1.1.a b.c", "v1." + "a" * 300]
)
def test_malformed_tokens(token: str | None) -> None:
    assert book().check(token, "CA1", now=0.0) == "malformed"


def test_token_secret_must_be_long_enough() -> None:
    with pytest.raises(ValueError):
        TokenBook(b"short")


def test_replay_guard_forgets_after_expiry() -> None:
    guard = ReplayGuard()
    assert guard.first_use("n", expires_at=10.0, now=0.0)
    assert not guard.first_use("n", expires_at=10.0, now=5.0)
    assert guard.first_use("n", expires_at=20.0, now=10.0)
    assert len(guard) == 1


# ------------------------------------------------------------------- TwiML


def test_twiml_connects_a_bidirectional_stream_with_parameters() -> None:
    xml = twiml_for_route(URL, "sales", {"token": "a&b<c>"})
    root = ElementTree.fromstring(xml)
    assert root.tag == "Response"
    (connect,) = list(root)
    assert connect.tag == "Connect"
    (stream,) = list(connect)
    assert stream.tag == "Stream" and stream.get("url") == URL
    params = {p.get("name"): p.get("value") for p in stream}
    assert params == {"route": "sales", "token": "a&b<c>"}


def test_twiml_without_route() -> None:
    root = ElementTree.fromstring(twiml_for_route(URL, None))
    assert [p for p in root.iter("Parameter")] == []


@pytest.mark.parametrize(
    ("url", "route", "params"),
    [
        ("https://bridge.example.com/twilio", "r", {}),
        ("wss://bridge.example.com/twilio?route=r", "r", {}),
        ("wss://bridge.example.com/twilio", "r", {"route": "again"}),
        ("wss://bridge.example.com/twilio", "r", {"big": "x" * 497}),
        ("wss:///twilio", "r", {}),
    ],
)
def test_twiml_refuses_what_twilio_would_not_accept(
    url: str, route: str, params: dict[str, str]
) -> None:
    with pytest.raises(ValueError):
        twiml_for_route(url, route, params)

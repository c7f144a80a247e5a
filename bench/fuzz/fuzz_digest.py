"""Fuzz digest header parsing, answering and verification (issue 33).

One input is a header value (UTF-8 with replacement: SIP headers reach these
functions decoded so). As an ``Authorization`` answer it goes to a fresh
``DigestVerifier`` (anything but ``OK``/``STALE``/``FAILED`` is a finding; an
answer that verifies must not verify a second time: no replay). As a
``WWW-Authenticate`` challenge it goes to ``parse_challenge`` and a
``DigestClient``, whose answer must parse back. Seeds: genuine answers to the
verifier's own challenges (both algorithms, with and without qop) and the
challenges themselves, so mutations start from a valid nonce.

    python -m bench.fuzz.fuzz_digest -atheris_runs=100000
"""

from __future__ import annotations

import contextlib

from bench.fuzz.fuzz_common import main
from bridge.sip.digest import (
    AuthResult,
    DigestClient,
    DigestCredentials,
    DigestVerifier,
    authorization,
    parse_auth_params,
    parse_challenge,
)
from bridge.sip.errors import SipParseError

SECRET = b"k" * 32
USERS = {"carrier": "s3cret"}
BINDING = "udp:192.0.2.10"
URI = "sip:bot@127.0.0.1:5060"


def verifier() -> DigestVerifier:
    return DigestVerifier("callbridge", SECRET, USERS)


def seeds() -> list[bytes]:
    out = []
    for challenge_text in verifier().challenges(0.5, binding=BINDING):
        out.append(challenge_text.encode())
        challenge = parse_challenge(challenge_text)
        assert challenge is not None
        for user, password in (("carrier", "s3cret"), ("nobody", "x")):
            answer = authorization(
                challenge, username=user, password=password, method="INVITE", uri=URI, cnonce="cn"
            )
            out.append(answer.encode())
            out.append(answer.replace(", qop=auth", "").encode())
    return out


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    with contextlib.suppress(SipParseError):
        parse_auth_params(text)
    v = verifier()
    first = v.verify(text, "INVITE", 1.0, BINDING)
    assert isinstance(first, AuthResult)
    second = v.verify(text, "INVITE", 1.5, BINDING)
    assert not (first is AuthResult.OK and second is AuthResult.OK), "an answer verified twice"
    parse_challenge(text)
    client = DigestClient(DigestCredentials("carrier", "s3cret"))
    if client.on_challenge(401, [text]):
        for _name, value in client.headers("INVITE", URI, "cn"):
            scheme, params = parse_auth_params(value)
            assert scheme == "Digest" and "response" in params, value


if __name__ == "__main__":
    main("digest", test_one_input, seeds())

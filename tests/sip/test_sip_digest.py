"""Digest authentication: RFC test vectors, UAC answers, UAS verification."""

from __future__ import annotations

import pytest

from bridge.sip.digest import (
    AuthResult,
    Challenge,
    DigestVerifier,
    authorization,
    choose_challenge,
    compute_response,
    parse_auth_params,
    parse_challenge,
)


def test_rfc2617_section_3_5_example_md5() -> None:
    response = compute_response(
        algorithm="MD5",
        username="Mufasa",
        realm="testrealm@host.com",
        password="Circle Of Life",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        method="GET",
        uri="/dir/index.html",
        qop="auth",
        nc="00000001",
        cnonce="0a4f113b",
    )
    assert response == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc7616_section_3_9_1_example(algorithm: str, expected: str) -> None:
    response = compute_response(
        algorithm=algorithm,
        username="Mufasa",
        realm="http-auth@example.org",
        password="Circle of Life",
        nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
        method="GET",
        uri="/dir/index.html",
        qop="auth",
        nc="00000001",
        cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
    )
    assert response == expected


def test_uac_picks_first_supported_challenge_and_builds_header() -> None:
    values = [
        'Basic realm="x"',
        'Digest realm="sip.example.com", nonce="abc", algorithm=SHA-256, qop="auth,auth-int", '
        'opaque="op1"',
        'Digest realm="sip.example.com", nonce="abc", algorithm=MD5',
    ]
    challenge = choose_challenge(values)
    assert challenge == Challenge("sip.example.com", "abc", "SHA-256", ("auth", "auth-int"), "op1")
    value = authorization(
        challenge,
        username="bot",
        password="pw",
        method="REGISTER",
        uri="sip:sip.example.com",
        cnonce="c1",
        nc=1,
    )
    scheme, params = parse_auth_params(value)
    assert scheme == "Digest"
    assert params["nc"] == "00000001" and params["qop"] == "auth" and params["opaque"] == "op1"
    assert params["response"] == compute_response(
        algorithm="SHA-256",
        username="bot",
        realm="sip.example.com",
        password="pw",
        nonce="abc",
        method="REGISTER",
        uri="sip:sip.example.com",
        qop="auth",
        nc="00000001",
        cnonce="c1",
    )


def test_md5_sess_and_no_qop_variants_differ() -> None:
    common = {
        "username": "u",
        "realm": "r",
        "password": "p",
        "nonce": "n",
        "method": "INVITE",
        "uri": "sip:x@y",
    }
    plain = compute_response(algorithm="MD5", **common)
    sess = compute_response(algorithm="MD5-sess", qop="auth", nc="00000001", cnonce="c", **common)
    assert len(plain) == 32 and len(sess) == 32 and plain != sess


def test_unsupported_challenges_are_skipped() -> None:
    assert parse_challenge("Digest nonce=x") is None
    assert choose_challenge(['Digest realm="r", nonce="n", algorithm=SHA-1024']) is None


def answer(verifier: DigestVerifier, now: float, user: str, password: str, alg: int = 0) -> str:
    challenge = parse_challenge(verifier.challenges(now)[alg])
    assert challenge is not None
    return authorization(
        challenge,
        username=user,
        password=password,
        method="INVITE",
        uri="sip:bot@192.0.2.1",
        cnonce="cn",
    )


def test_uas_verifies_good_answers_with_each_algorithm() -> None:
    verifier = DigestVerifier("callbridge", b"k", {"carrier": "s3cret"})
    parsed = [parse_challenge(c) for c in verifier.challenges(0.0)]
    assert [c.algorithm for c in parsed if c is not None] == ["SHA-256", "MD5"]
    for alg in (0, 1):
        header = answer(verifier, 10.0 + alg, "carrier", "s3cret", alg)
        assert verifier.verify(header, "INVITE", 12.0) is AuthResult.OK


def test_uas_unknown_user_and_wrong_password_are_indistinguishable() -> None:
    verifier = DigestVerifier("callbridge", b"k", {"carrier": "s3cret"})
    wrong = verifier.verify(answer(verifier, 0.0, "carrier", "guess", 0), "INVITE", 1.0)
    unknown = verifier.verify(answer(verifier, 0.0, "nobody", "guess", 0), "INVITE", 1.0)
    assert wrong is unknown is AuthResult.FAILED
    assert verifier.verify(None, "INVITE", 1.0) is AuthResult.FAILED
    assert verifier.verify('Foo realm="x"', "INVITE", 1.0) is AuthResult.FAILED
    assert verifier.verify("Digest garbage", "INVITE", 1.0) is AuthResult.FAILED


def test_uas_rejects_forged_nonce_replay_wrong_method_and_stale() -> None:
    verifier = DigestVerifier("callbridge", b"k", {"carrier": "s3cret"}, nonce_lifetime_s=60.0)
    other = DigestVerifier("callbridge", b"other-key", {"carrier": "s3cret"})
    assert (
        verifier.verify(answer(other, 0.0, "carrier", "s3cret"), "INVITE", 1.0) is AuthResult.FAILED
    )
    wrong_method = answer(verifier, 0.0, "carrier", "s3cret")
    assert verifier.verify(wrong_method, "BYE", 1.0) is AuthResult.FAILED
    # a failed answer burns its nonce: the right answer on it fails too
    assert verifier.verify(wrong_method, "INVITE", 1.0) is AuthResult.FAILED
    good = answer(verifier, 0.5, "carrier", "s3cret")
    assert verifier.verify(good, "INVITE", 1.0) is AuthResult.OK
    assert verifier.verify(good, "INVITE", 2.0) is AuthResult.FAILED  # replay
    old = answer(verifier, 100.0, "carrier", "s3cret")
    assert verifier.verify(old, "INVITE", 200.0) is AuthResult.STALE
    assert "stale=true" in verifier.challenges(200.0, stale=True)[0]

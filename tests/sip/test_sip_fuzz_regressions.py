"""Crashes the coverage-guided fuzz targets found in the SIP engine (issue 33;
``bench/fuzz/``), each reduced to the smallest input that shows it. The raw
crash inputs replay too, in ``tests/bench/test_fuzz_targets.py``."""

from __future__ import annotations

import random

from bridge.sip.digest import DigestClient, DigestCredentials, parse_auth_params, parse_challenge
from bridge.sip.settings import SipSettings
from bridge.sip.ua import SipUserAgent

SOURCE = ("192.0.2.10", 5070)


def test_a_malformed_later_via_in_a_request_answered_400_is_dropped_not_raised() -> None:
    # fuzz_sip: the request fails to parse (its second Via has an unterminated
    # quote), the stateless 400 stamps ``received``/``rport`` into the top Via,
    # which re-reads every Via: the SipParseError escaped ``receive_datagram``
    ua = SipUserAgent(SipSettings(local_host="127.0.0.1", session_expires_s=0), random.Random(1))
    data = (
        b"OPTIONS sip:bot@127.0.0.1 SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP 192.0.2.10:5070;branch=z9hG4bKa;rport\r\n"
        b'Via: SIP/2.0/UDP "192.0.2.11\r\n'
        b"From: <sip:a@192.0.2.10>;tag=1\r\n"
        b"To: <sip:bot@127.0.0.1>\r\n"
        b"Call-ID: x\r\n"
        b"CSeq: 1 OPTIONS\r\n"
        b"Max-Forwards: 70\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    ua.receive_datagram(data, SOURCE, 0.0)
    assert ua.actions_to_send() == []
    assert ua.dropped_messages == 1 and ua._server_txs == {}


def test_a_challenge_whose_nonce_our_answer_could_not_quote_is_not_answered() -> None:
    # fuzz_digest: ``nonce="abc"junk"`` unquoted to a nonce holding a quote, and the
    # DigestClient sent it back inside its own quotes: an Authorization that does
    # not parse (a hostile server shaping our header). Such a challenge is unusable.
    for value in ('"abc"\ufffd junk<"cn"', '"a\\\\b"', '"a\\"b"', '"a\x01b"'):
        challenge = f'Digest realm="callbridge", nonce={value}, qop="auth"'
        assert parse_challenge(challenge) is None, value
        assert not DigestClient(DigestCredentials("carrier", "s3cret")).on_challenge(
            401, [challenge]
        )
        assert parse_challenge(challenge.replace("nonce=", 'nonce="n", opaque=')) is None
    good = DigestClient(DigestCredentials("carrier", "s3cret"))
    assert good.on_challenge(401, ['Digest realm="callbridge", nonce="n0", qop="auth"'])
    ((_, answer),) = good.headers("INVITE", "sip:bot@127.0.0.1", "cn")
    assert parse_auth_params(answer)[1]["nonce"] == "n0"

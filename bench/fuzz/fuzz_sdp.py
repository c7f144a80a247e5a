"""Fuzz the SDP parser and codec negotiation (issue 33).

One input is an SDP body (UTF-8 with replacement: SIP bodies reach the parser
decoded so). ``parse_sdp`` may only raise ``SdpError``; what it accepts must
negotiate (``negotiate``, ``choose_crypto``) and answer (``build_answer``)
without raising. Seeds: the bodies of ``tests/sip/fixtures`` and offers built
by ``build_offer``.

    python -m bench.fuzz.fuzz_sdp -atheris_runs=100000
"""

from __future__ import annotations

from bench.fuzz.fuzz_common import FIXTURES, main
from bridge.sip.sdp import (
    SdpError,
    answer_direction,
    build_answer,
    build_offer,
    choose_crypto,
    negotiate,
    parse_sdp,
)

CODECS = ("PCMU", "PCMA", "G722", "opus")


def seeds() -> list[bytes]:
    out = []
    for path in sorted((FIXTURES / "sip" / "fixtures").glob("*.txt")):
        body = path.read_bytes().replace(b"\r\n", b"\n").split(b"\n\n", 1)[1:]
        if body and body[0].startswith(b"v="):
            out.append(body[0].replace(b"\n", b"\r\n"))
    out.append(build_offer("192.0.2.10", 4000, 1, 1).encode())
    out.append(build_offer("192.0.2.10", 4000, 1, 1, direction="sendonly").encode())
    out.append(build_offer("2001:db8::1", 4000, 1, 1, codecs=("PCMA",)).encode())
    return out


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        sdp = parse_sdp(text)
    except SdpError:
        return
    for codecs in (CODECS, ("PCMU",), ("PCMA",)):
        audio = negotiate(sdp, codecs)
        if audio is None:
            continue
        media = sdp.media[audio.media_index]
        crypto = choose_crypto(media.crypto, lambda n: bytes(n))
        answer_direction(audio.remote_direction)
        answer = build_answer(sdp, audio, "127.0.0.1", 40000, 2, 1, crypto=crypto)
        parse_sdp(answer)  # our own answer must parse


if __name__ == "__main__":
    main("sdp", test_one_input, seeds())

"""A SIP call whose peer did not negotiate telephone-event gets the app's DTMF as tones
in the audio (in place of the bot's frames while they last); one that did gets RFC 4733
events. The frames the call queues are decoded and run through the DTMF detector."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bridge.config import parse_config
from bridge.io.legs.sip_call import _SipCall
from bridge.io.services import Services
from bridge.io.ticker import MediaTicker
from bridge.sip.sdp import NegotiatedAudio
from telcodec import g711
from telcodec.dtmf import DtmfDetector

CONFIG = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""
RTP_HEADER = 12


async def _call(codec: str, pt: int, te: int | None) -> tuple[_SipCall, list[bytes], list[bytes]]:
    """The call's audio packets (what it queued for the ticker) and the datagrams it sent
    at once (RFC 4733 events), over 40 ticks with "5#" asked for at the third."""
    ticker = MediaTicker(asyncio.get_running_loop())
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    services = Services.standalone(parse_config(CONFIG, "test.toml"), ticker)
    call = _SipCall(services, None, "call-1", 0)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    call.rtp_sock = sock
    call.start_media(NegotiatedAudio(0, codec, pt, te, peer.getsockname(), "sendrecv", 20))  # type: ignore[arg-type]
    sent: list[bytes] = []
    for n in range(40):  # 800 ms: two digits of 160 ms, then the bot's silence
        if n == 2:
            call.send_dtmf("5#")
        call.send_frame(None, n, n * 0.02)
        sent.extend(data for _, data, _ in call.outbox)
        call.outbox.clear()
    sock.close()
    direct: list[bytes] = []
    while True:
        try:
            direct.append(peer.recv(2048))
        except BlockingIOError:
            break
    peer.close()
    return call, sent, direct


@pytest.mark.parametrize(
    ("codec", "pt", "decode"), [("PCMU", 0, g711.ulaw_decode), ("PCMA", 8, g711.alaw_decode)]
)
def test_without_telephone_event_the_digits_are_tones_in_the_audio(
    codec: str, pt: int, decode: object
) -> None:
    call, sent, direct = asyncio.run(_call(codec, pt, None))
    assert direct == []  # no events
    assert len(sent) == 40  # one packet a tick, none skipped or doubled
    assert {p[1] & 0x7F for p in sent} == {pt}  # audio payloads only: no event packets
    detector = DtmfDetector(8000)
    heard = [d for p in sent for d in detector.process(decode(p[RTP_HEADER:]))]  # type: ignore[operator]
    assert heard == ["5", "#"]
    assert not call.inband_out  # played out; the frames after it are the bot's again
    assert sent[-1][RTP_HEADER:] == call.silence


def test_with_telephone_event_the_digits_are_rfc4733_events() -> None:
    call, sent, direct = asyncio.run(_call("PCMU", 0, 101))
    assert {p[1] & 0x7F for p in direct} == {101}
    events = [p[RTP_HEADER] for p in direct if p[1] & 0x80]  # each event's first packet
    assert events == [5, 11]  # RFC 4733: "#" is event 11
    detector = DtmfDetector(8000)
    heard = [d for p in sent for d in detector.process(g711.ulaw_decode(p[RTP_HEADER:]))]
    assert heard == []  # the audio carries no tones
    assert not call.inband_out


def test_on_a_g722_call_the_tones_are_wideband_audio() -> None:
    from telcodec.g722 import G722Decoder

    call, sent, direct = asyncio.run(_call("G722", 9, None))
    assert direct == [] and len(sent) == 40
    decoder, detector = G722Decoder(), DtmfDetector(16000)
    heard = [d for p in sent for d in detector.process(decoder.decode(p[RTP_HEADER:]))]
    assert heard == ["5", "#"]

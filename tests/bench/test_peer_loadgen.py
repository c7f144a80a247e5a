"""The peer comparison's additions to the media-stream load generator: messages of any
size timed against the audio clock (steps.ws_sized_deviations_ns), payload sizes at the
wire (wire._WsStream) and at the carrier, ``clear`` and mid-turn gaps (twilio.TwilioLoad)."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import numpy as np
import websockets

from bench.loadgen.analysis import ws_deviations_ns
from bench.loadgen.steps import ws_sized_deviations_ns
from bench.loadgen.twilio import TwilioLoad, WsCall, payload_bytes
from bench.loadgen.wire import _WsStream

MS = 1_000_000
FACTOR = float(os.environ.get("CALLBRIDGE_TEST_TIME_FACTOR", "1"))


def media_text(n: int, sid: str = "MZ1") -> str:
    payload = base64.b64encode(bytes([0xFF]) * n).decode()
    return f'{{"event":"media","streamSid":"{sid}","media":{{"payload":"{payload}"}}}}'


def pipecat_media(n: int) -> str:
    """A ``media`` message as Pipecat's Twilio serializer writes it (``json.dumps``)."""
    payload = base64.b64encode(bytes([0xFF]) * n).decode()
    return json.dumps({"event": "media", "streamSid": "MZ1", "media": {"payload": payload}})


def test_payload_bytes_decodes_the_base64_length() -> None:
    for n in (0, 1, 2, 3, 160, 1100):
        assert payload_bytes(media_text(n)) == n
        assert payload_bytes(pipecat_media(n)) == n
    assert payload_bytes('{"event":"media"}') == 0


def test_sized_deviations_of_20_ms_messages_are_the_20_ms_grids() -> None:
    rng = np.random.default_rng(3)
    arrival = 1_000 * MS + np.arange(400) * 20 * MS + rng.integers(-MS, MS, 400)
    arrival[200:] += 300 * MS  # a second talkspurt after a pause
    arrival[:3] = arrival[3] - np.array([3, 2, 1])  # the lead leaves at once
    a0, d0 = ws_deviations_ns(arrival, 2)
    a1, d1 = ws_sized_deviations_ns(arrival, [160] * 400, 2)
    assert np.array_equal(a0, a1)
    assert np.array_equal(d0, d1)


def test_137_ms_messages_are_timed_on_their_own_grid() -> None:
    dur = 137_500_000  # 1100 mu-law bytes
    arrival = 5_000 * MS + np.arange(50) * dur
    arrival[20] += 5 * MS  # one message 5 ms late
    a, dev = ws_sized_deviations_ns(arrival, [1100] * 50, 2)
    assert a.size == 49  # only the first message's slot is within the 40 ms lead
    assert dev[19] == 5 * MS
    assert np.count_nonzero(dev) == 1


def test_a_message_after_the_audio_ran_out_starts_a_talkspurt() -> None:
    dur = 137_500_000
    arrival = list(1_000 * MS + np.arange(10) * dur)
    arrival += [arrival[-1] + dur + 200 * MS + k * dur for k in range(10)]  # 200 ms pause
    a, dev = ws_sized_deviations_ns(arrival, [1100] * 20, 2)
    assert a.size == 18  # each talkspurt's first message is its lead
    assert not dev.any()


def _frame(text: str) -> bytes:
    data = text.encode()
    n = len(data)
    head = bytes([0x81, n]) if n < 126 else bytes([0x81, 126]) + n.to_bytes(2, "big")
    return head + data


def test_the_wire_reader_keeps_each_media_messages_payload_size() -> None:
    stream = b"HTTP/1.1 101 Switching Protocols\r\n\r\n"
    stream += _frame(media_text(1100)) + _frame('{"event":"mark","mark":{"name":"x"}}')
    stream += _frame(media_text(160)) + _frame(pipecat_media(3))
    ws = _WsStream()
    cut = len(stream) // 2  # the first message's last byte is in the second segment
    ws.segment(1000, stream[:cut], 1)
    ws.segment(1000 + cut, stream[cut:], 2)
    assert ws.media_ns == [2, 2, 2]
    assert ws.media_bytes == [1100, 160, 3]


def test_the_carrier_counts_mid_turn_gaps_and_clears_and_keeps_sizes() -> None:
    async def server(ws: websockets.ServerConnection) -> None:
        await ws.recv()  # connected
        await ws.recv()  # start
        await ws.send(media_text(160))
        await asyncio.sleep(0.08)  # 20 ms of audio, then 80 ms of nothing: a gap
        await ws.send(media_text(160))
        await ws.send('{"event":"mark","streamSid":"MZ1","mark":{"name":"end"}}')
        await asyncio.sleep(0.08)  # the turn ended with a mark: not a gap
        await ws.send(pipecat_media(1100))
        await ws.send(json.dumps({"event": "clear", "streamSid": "MZ1"}))  # as Pipecat writes it
        await ws.send(media_text(160))  # a new turn after a clear: not a gap
        async for message in ws:  # until the caller's stop (media meanwhile)
            if json.loads(message)["event"] == "stop":
                break

    async def run() -> list[WsCall]:
        async with websockets.serve(server, "127.0.0.1", 0) as srv:
            port = srv.sockets[0].getsockname()[1]
            load = TwilioLoad(port, sized_media=True)
            load.recording = True
            await load.place(1)
            [placed] = load.calls
            async with asyncio.timeout(10 * FACTOR):  # the four media messages arrived
                while len(placed.arrival_ns) < 4:
                    await asyncio.sleep(0.01)
            calls = list(load.calls)
            await load.hangup_all(settle_s=0.0)
            await load.close()
            return calls

    [call] = asyncio.run(run())
    assert list(call.sizes) == [160, 160, 1100, 160]
    assert len(call.arrival_ns) == 4
    assert call.gaps == 1
    assert call.dry_s > 0.05  # at least 80 ms of nothing after 20 ms of audio
    assert len(call.clears_ns) == 1


def test_the_first_inbound_media_follows_start_in_sequence() -> None:
    got: list[dict[str, str]] = []

    async def server(ws: websockets.ServerConnection) -> None:
        for _ in range(3):  # connected, start, the first media
            got.append(json.loads(await ws.recv()))
        await asyncio.sleep(0.1)

    async def run() -> None:
        async with websockets.serve(server, "127.0.0.1", 0) as srv:
            load = TwilioLoad(srv.sockets[0].getsockname()[1])
            await load.place(1)
            async with asyncio.timeout(10 * FACTOR):
                while len(got) < 3:
                    await asyncio.sleep(0.01)
            await load.close()

    asyncio.run(run())
    assert [m["event"] for m in got] == ["connected", "start", "media"]
    assert [m.get("sequenceNumber") for m in got] == [None, "1", "2"]


def test_a_call_that_cannot_be_placed_is_counted_and_the_rest_go_on() -> None:
    """A daemon too slow to finish a handshake (or a refused socket) leaves that call
    unanswered (the step fails the bar) instead of ending the whole bench."""

    async def main() -> tuple[list[str], int]:
        refuse = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = refuse.sockets[0].getsockname()[1]
        load = TwilioLoad(port)
        await load.place(3, rate_per_s=1000)
        refuse.close()
        await refuse.wait_closed()
        return load.failed, len(load.calls)

    failed, placed = asyncio.run(main())
    assert placed == 0
    assert len(failed) == 3
    assert all(f.startswith("InvalidMessage: did not receive a valid HTTP") for f in failed)

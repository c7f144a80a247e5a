"""Whose underrun was it, when bytes waited unread on the turn's connection?

A turn that runs dry while its provider connection holds bytes the daemon has
not read (in the kernel, or read and not yet handed over) counts as the
daemon's underrun. The connection carries other turns too, so it remembers
where those bytes end; once it has handed over everything before that point,
the verdict is in: the turn's audio among them keeps it the daemon's, none
makes it the provider's after all (``Connection.watch_dry``). These drive a
real ``ProviderPool``/``Speaker`` over a socket that reads what the test feeds
it; the kernel's unread count is the test's number.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
from test_tts_client_audio_route import chunk, frame, kova_pool
from websockets.frames import Frame, Opcode

from bridge.engine import Event
from bridge.io.provider_pool import Speaker
from bridge.io.provider_ws import _ProviderWebSocket
from bridge.providers.base import MULAW_8K, AudioFormat, AudioReceived, TurnSettings

RCVBUF = 1 << 20  # SO_RCVBUF as the kernel reports it


class _Sock:
    def getsockopt(self, level: int, name: int) -> int:
        assert (level, name) == (socket.SOL_SOCKET, socket.SO_RCVBUF)
        return RCVBUF


class _Transport:
    """Enough of a transport for ``watch_dry``: a socket, no TLS."""

    def __init__(self, tls: bool = False) -> None:
        self.tls = tls

    def get_extra_info(self, name: str) -> object:
        return {"socket": _Sock(), "sslcontext": object() if self.tls else None}[name]


def wire(*messages: str) -> bytes:
    """Server frames (unmasked text) as they come off the socket."""
    return b"".join(
        Frame(Opcode.TEXT, m.encode()).serialize(mask=False, extensions=[]) for m in messages
    )


class Rig:
    """Two turns (``a`` on context c1, ``b`` on c2) on one Kova connection."""

    def __init__(self, tls: bool = False) -> None:
        self.pool, self.conn = kova_pool()
        ws = self.conn.ws
        assert isinstance(ws, _ProviderWebSocket)
        self.ws = ws
        ws.transport.get_extra_info = _Transport(tls).get_extra_info  # type: ignore[method-assign]
        self.kernel = 0
        self.conn.unread_bytes = lambda: self.kernel  # type: ignore[method-assign]
        self.events: list[Event] = []
        self.speaker = Speaker([self.pool])
        for turn in ("a", "b"):
            self.speaker.speak(turn, "hello", TurnSettings("v", MULAW_8K), self.events.append)
        self.read(frame({"context_started": {}}, "c1"), frame({"context_started": {}}, "c2"))
        self.verdicts: list[str] = []

    def read(self, *messages: str) -> bytes:
        data = wire(*messages)
        self.ws.data_received(data)
        return data

    def dry(self, turn: str) -> bool | None:
        """Turn ``turn`` ran dry now; the provider's verdicts land in ``verdicts``."""
        return self.speaker.watch_dry(turn, lambda: self.verdicts.append(turn))


def run(body: Callable[[], None]) -> None:
    async def main() -> None:
        body()

    asyncio.run(main())


def test_nothing_unread_is_the_providers_at_once() -> None:
    def body() -> None:
        rig = Rig()
        rig.read(chunk(b"\x01", "c1"))
        assert rig.dry("a") is False
        assert rig.conn.dry_watches == []

    run(body)


def test_unread_bytes_of_other_turns_only_make_it_the_providers_once_read() -> None:
    def body() -> None:
        rig = Rig()
        later = wire(chunk(b"\x02" * 80, "c2"), chunk(b"\x03" * 80, "c2"))
        rig.kernel = len(later)  # b's audio waits in the kernel
        assert rig.dry("a") is True  # the daemon's, for now
        rig.ws.data_received(later[:30])  # part of the first message only
        assert rig.verdicts == []
        rig.ws.data_received(later[30:])
        assert rig.verdicts == ["a"]  # read through: none of it was a's
        assert rig.conn.dry_watches == []
        rig.read(chunk(b"\x04", "c1"))  # a's audio, sent after the dry tick
        assert rig.verdicts == ["a"]

    run(body)


def test_the_turns_own_audio_among_the_unread_bytes_keeps_it_the_daemons() -> None:
    def body() -> None:
        rig = Rig()
        later = wire(chunk(b"\x02" * 80, "c2"), chunk(b"\x03" * 80, "c1"))
        rig.kernel = len(later)
        assert rig.dry("a") is True
        rig.ws.data_received(later)
        rig.read(chunk(b"\x05", "c2"), chunk(b"\x06", "c1"))
        assert rig.verdicts == []  # a's audio was waiting: the daemon's
        assert rig.conn.dry_watches == []
        assert [e.audio[:1] for e in rig.events if isinstance(e, AudioReceived)] == [
            b"\x02",
            b"\x03",
            b"\x05",
            b"\x06",
        ]  # the verdicts took nothing from the turns

    run(body)


def test_a_turns_audio_starting_past_the_unread_bytes_is_the_providers() -> None:
    def body() -> None:
        rig = Rig()
        unread = wire(chunk(b"\x02" * 80, "c2"))
        rig.kernel = len(unread)
        assert rig.dry("a") is True
        rig.ws.data_received(unread + wire(chunk(b"\x03", "c1")))  # one read, past the mark
        assert rig.verdicts == ["a"]

    run(body)


@pytest.mark.parametrize(("rest_holds_b", "verdicts"), [(True, []), (False, ["b"])])
def test_a_dry_tick_in_the_middle_of_a_read_counts_what_the_read_still_holds(
    rest_holds_b: bool, verdicts: list[str]
) -> None:
    """The media tick runs between two messages of one read (the reader's
    preemption point): the rest of that read is unread too, though the kernel
    holds nothing."""

    def body() -> None:
        rig = Rig()
        wire_a = next(w for w in rig.conn.audio_sinks if w.startswith("a~"))
        sink = rig.conn.audio_sinks[wire_a]
        seen: list[bool | None] = []

        def tick_inside(audio: bytes, fmt: AudioFormat) -> None:
            sink(audio, fmt)
            if not seen:  # after the read's first message, b runs dry
                seen.append(rig.dry("b"))

        rig.conn.audio_sinks[wire_a] = tick_inside
        rig.read(chunk(b"\x02", "c1"), chunk(b"\x03", "c2" if rest_holds_b else "c1"))
        assert seen == [True]  # the rest of the read waited, unread
        assert rig.verdicts == verdicts

    run(body)


def test_a_full_receive_window_or_tls_keeps_it_the_daemons_without_a_verdict() -> None:
    def body() -> None:
        rig = Rig()
        rig.kernel = RCVBUF // 4  # the provider may have been held back by the window
        assert rig.dry("a") is True
        assert rig.conn.dry_watches == []
        tls = Rig(tls=True)
        tls.kernel = 100
        assert tls.dry("a") is True
        assert tls.conn.dry_watches == []

    run(body)


def test_a_turn_not_on_the_speaker_has_no_verdict_here() -> None:
    def body() -> None:
        rig = Rig()
        assert rig.dry("nobody") is None

    run(body)

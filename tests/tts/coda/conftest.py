"""Shared helpers for the Coda tests: fixture replay and an in-process client/server pair.

Fixture files (``fixtures/*.jsonl``) hold one JSON object per line,
``{"t": seconds, "dir": "in"|"out", "msg": ...}``, written from the seed
document's examples and rules (``shared/seeds/003_e1fb1d1bb580e7a1.txt``):

* ``in``: a server frame fed to the client engine at ``t``. An object is sent
  as JSON text, ``{"b64": "..."}`` as a binary message, a bare string as raw
  text (to record malformed input), ``{"close": {"code": c, "reason": r}}``
  as the socket closing (``connection_lost``).
* ``out``: what the engine must send at ``t``: the parsed JSON of a
  ``SendText``, or ``{"close": {"code": ..., "reason": ...}}`` for a
  ``CloseConnection``.

The replay calls ``connection_made("rime.v1.json", 0.0)`` first. Commands
(``open_turn``, ``cancel``...) come from the test as ``(t, fn)`` pairs; at
each time the replay fires a due timer, then the commands, then the ``in``
lines, and compares everything the engine sent with the ``out`` lines of
that time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tts_replay

from bridge.engine import Action, CloseConnection, Event, SendText
from bridge.providers.base import AudioFormat, ProviderSettings, TurnSettings
from bridge.providers.coda.client import CodaProtocol
from bridge.providers.coda.server import PATHS, CodaServerSession, select_subprotocol
from bridge.providers.coda.wire import SUBPROTOCOL
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

FIXTURES = Path(__file__).parent / "fixtures"
API_KEY = "rime-secret-key-42"

Command = Callable[[CodaProtocol, float], None]


def make_client(api_key: str = API_KEY, **options: str | int | float | bool) -> CodaProtocol:
    settings = ProviderSettings(
        name="coda-test",
        protocol="coda",
        url="wss://coda.example/ws",
        api_key=api_key,
        voice="lyra",
        options=tuple(options.items()),
    )
    return CodaProtocol(settings)


def load_fixture(name: str) -> list[dict[str, object]]:
    return tts_replay.load_jsonl(FIXTURES / name)


def replay(
    engine: CodaProtocol,
    name: str,
    commands: list[tuple[float, Command]],
    until: float | None = None,
) -> list[tuple[float, Event]]:
    """Drive ``engine`` through fixture ``name``; return the events with their times.

    ``until``: also visit this time (to let timers fire after the last line).
    """
    lines = load_fixture(name)
    engine.connection_made(SUBPROTOCOL, 0.0)
    also_at = [0.0] if until is None else [0.0, until]
    return tts_replay.replay_by_time(engine, lines, commands, name=name, also_at=also_at)


# --------------------------------------------------------------- the pair


@dataclass
class CodaPair:
    """Client and server engines wired back to back, with a fake synthesizer."""

    client: CodaProtocol
    server: CodaServerSession
    now: float = 0.0
    events: list[Event] = field(default_factory=list)
    jobs: dict[str, tts_replay.Job] = field(default_factory=dict)
    requests: list[Synthesize] = field(default_factory=list)
    cancelled_jobs: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    server_frames: list[dict[str, object]] = field(default_factory=list)
    client_frames: list[dict[str, object]] = field(default_factory=list)
    closed: bool = False

    def connect(self) -> None:
        params = self.client.connect_params()
        headers = {k.lower(): v for k, v in params.headers}
        subprotocol = select_subprotocol(params.subprotocols)
        self.server.connection_made(PATHS[0], {}, headers, self.now)
        self.client.connection_made(subprotocol, self.now)
        self.pump()

    def pump(self, deliver: bool = True) -> None:
        """Move frames both ways until quiet; ``deliver=False`` holds server frames."""
        moved = True
        while moved:
            moved = False
            for action in self.client.actions_to_send():
                moved = True
                if isinstance(action, SendText):
                    self.client_frames.append(json.loads(action.text))
                    self.server.receive_text(action.text, self.now)
                elif isinstance(action, CloseConnection):
                    self._close(action)
            for action in self.server.actions_to_send():
                moved = True
                self._server_action(action)
            if deliver and self.in_flight:
                moved = True
                for text in self.in_flight:
                    self.client.receive_text(text, self.now)
                self.in_flight.clear()
            self.events.extend(self.client.events_received())

    def _close(self, action: CloseConnection) -> None:
        for text in self.in_flight:  # frames sent before the close arrive first
            self.client.receive_text(text, self.now)
        self.in_flight.clear()
        if not self.closed:
            self.closed = True
            self.server.connection_lost(self.now)
            self.client.connection_lost(action.code, action.reason, self.now)

    def _server_action(self, action: Action) -> None:
        if isinstance(action, SendText):
            self.server_frames.append(json.loads(action.text))
            self.in_flight.append(action.text)
        elif isinstance(action, Synthesize):
            self.requests.append(action)
            self.jobs[action.job_id] = tts_replay.two_chunk_job(action)
        elif isinstance(action, CancelSynthesis):
            self.cancelled_jobs.append(action.job_id)
            self.jobs.pop(action.job_id, None)
        elif isinstance(action, CloseConnection):
            self._close(action)

    def step_job(self, job_id: str) -> None:
        """Hand the server the next chunk (or the end) of one job."""
        job = self.jobs[job_id]
        if job.chunks:
            pcm, words = job.chunks.pop(0)
            self.server.synthesis_audio(job_id, pcm, words, self.now)
        else:
            del self.jobs[job_id]
            self.server.synthesis_done(job_id, self.now)

    def step_synthesis(self, deliver: bool = True) -> bool:
        """Deliver one chunk (or the end) of the oldest job; False when idle."""
        if not self.jobs:
            return False
        self.step_job(next(iter(self.jobs)))
        self.pump(deliver)
        return True

    def run(self) -> None:
        while self.step_synthesis():
            self.now += 0.01


def make_pair(
    options: ServerOptions | None = None,
    client: CodaProtocol | None = None,
) -> CodaPair:
    server = CodaServerSession(options or ServerOptions(voices=frozenset({"lyra", "joe"})))
    pair = CodaPair(client or make_client(), server)
    pair.connect()
    return pair


def turn(
    fmt: AudioFormat, voice: str = "lyra", timestamps: bool = True, **extra: str
) -> TurnSettings:
    return TurnSettings(
        voice=voice, audio_format=fmt, word_timestamps=timestamps, extra=tuple(extra.items())
    )


class CodaKit:
    """The helpers above, handed to tests as the ``coda`` fixture."""

    API_KEY = API_KEY
    make_client = staticmethod(make_client)
    make_pair = staticmethod(make_pair)
    replay = staticmethod(replay)
    render = staticmethod(tts_replay.render)
    turn = staticmethod(turn)
    load_fixture = staticmethod(load_fixture)


@pytest.fixture
def coda() -> CodaKit:
    return CodaKit()

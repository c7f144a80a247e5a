"""Shared helpers for the Kova tests: fixture replay and an in-process client/server pair.

Fixture files (``fixtures/*.jsonl``) hold one JSON object per line,
``{"t": seconds, "dir": "in"|"out", "msg": ...}``:

* ``in``: a server frame fed to the client engine at ``t``. An object is sent
  as JSON text, ``{"b64": "..."}`` as a binary message, a bare string as raw
  text (to record malformed input).
* ``out``: what the engine must send at ``t``: the parsed JSON of a
  ``SendText``, or ``{"close": {"code": ..., "reason": ...}}`` for a
  ``CloseConnection``.

Commands (``open_turn``, ``cancel``...) come from the test as ``(t, fn)``
pairs; at each time the replay fires a due timer, then the commands, then the
``in`` lines, and compares everything the engine sent with the ``out`` lines
of that time.
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
from bridge.providers.kova.client import KovaProtocol
from bridge.providers.kova.server import PATHS, KovaServerSession
from bridge.providers.server_base import CancelSynthesis, ServerOptions, Synthesize

FIXTURES = Path(__file__).parent / "fixtures"
API_KEY = "sk-kova-secret-123"

Command = Callable[[KovaProtocol, float], None]


def make_client(**options: str | int | float | bool) -> KovaProtocol:
    settings = ProviderSettings(
        name="kova-test",
        protocol="kova",
        url="wss://kova.example/v1/ws",
        api_key=API_KEY,
        voice="cal",
        model="default",
        options=tuple(options.items()),
    )
    return KovaProtocol(settings)


def load_fixture(name: str) -> list[dict[str, object]]:
    return tts_replay.load_jsonl(FIXTURES / name)


def replay(
    engine: KovaProtocol, name: str, commands: list[tuple[float, Command]]
) -> list[tuple[float, Event]]:
    return tts_replay.replay_by_time(engine, load_fixture(name), commands, name=name)


# --------------------------------------------------------------- the pair


@dataclass
class KovaPair:
    """Client and server engines wired back to back, with a fake synthesizer."""

    client: KovaProtocol
    server: KovaServerSession
    now: float = 0.0
    events: list[Event] = field(default_factory=list)
    jobs: dict[str, tts_replay.Job] = field(default_factory=dict)
    cancelled_jobs: list[str] = field(default_factory=list)
    in_flight: list[str | CloseConnection] = field(default_factory=list)
    server_frames: list[dict[str, object]] = field(default_factory=list)

    def connect(self) -> None:
        params = self.client.connect_params()
        headers = {k.lower(): v for k, v in params.headers}
        self.server.connection_made(PATHS[0], {}, headers, self.now)
        self.client.connection_made(None, self.now)
        self.pump()

    def pump(self, deliver: bool = True) -> None:
        """Move frames both ways until quiet; ``deliver=False`` holds server frames."""
        moved = True
        while moved:
            moved = False
            for action in self.client.actions_to_send():
                moved = True
                if isinstance(action, SendText):
                    self.server.receive_text(action.text, self.now)
                elif isinstance(action, CloseConnection):
                    self.server.connection_lost(self.now)
                    self.client.connection_lost(action.code, action.reason, self.now)
            for action in self.server.actions_to_send():
                moved = True
                self._server_action(action)
            if deliver and self.in_flight:
                moved = True
                held, self.in_flight = self.in_flight, []
                for item in held:
                    if isinstance(item, str):
                        self.client.receive_text(item, self.now)
                    else:  # the server's close arrives after the frames before it
                        self.server.connection_lost(self.now)
                        self.client.connection_lost(item.code, item.reason, self.now)
            self.events.extend(self.client.events_received())

    def _server_action(self, action: Action) -> None:
        if isinstance(action, SendText):
            self.server_frames.append(json.loads(action.text))
            self.in_flight.append(action.text)
        elif isinstance(action, Synthesize):
            self.jobs[action.job_id] = tts_replay.two_chunk_job(action)
        elif isinstance(action, CancelSynthesis):
            self.cancelled_jobs.append(action.job_id)
            self.jobs.pop(action.job_id, None)
        elif isinstance(action, CloseConnection):
            self.in_flight.append(action)

    def step_synthesis(self, deliver: bool = True) -> bool:
        """Deliver one chunk (or the end) of the next job, round robin; False when idle."""
        if not self.jobs:
            return False
        job_id, job = next(iter(self.jobs.items()))
        del self.jobs[job_id]
        if job.chunks:
            pcm, words = job.chunks.pop(0)
            self.jobs[job_id] = job  # to the back: jobs of several contexts interleave
            self.server.synthesis_audio(job_id, pcm, words, self.now)
        else:
            self.server.synthesis_done(job_id, self.now)
        self.pump(deliver)
        return True

    def run(self) -> None:
        while self.step_synthesis():
            self.now += 0.01


def make_pair(options: ServerOptions | None = None, api_key: str = API_KEY) -> KovaPair:
    client = make_client()
    if api_key != API_KEY:
        settings = ProviderSettings(
            name="kova-test", protocol="kova", url="wss://kova.example", api_key=api_key
        )
        client = KovaProtocol(settings)
    server = KovaServerSession(options or ServerOptions(voices=frozenset({"cal", "joe"})))
    pair = KovaPair(client, server)
    pair.connect()
    return pair


def turn(fmt: AudioFormat, voice: str = "cal", timestamps: bool = True) -> TurnSettings:
    return TurnSettings(voice=voice, audio_format=fmt, model="default", word_timestamps=timestamps)


class KovaKit:
    """The helpers above, handed to tests as the ``kova`` fixture."""

    API_KEY = API_KEY
    make_client = staticmethod(make_client)
    make_pair = staticmethod(make_pair)
    replay = staticmethod(replay)
    render = staticmethod(tts_replay.render)
    turn = staticmethod(turn)
    load_fixture = staticmethod(load_fixture)


@pytest.fixture
def kova() -> KovaKit:
    return KovaKit()

"""The server side of the provider protocols: what ``callbridge tts-server`` speaks.

Theory of operation
-------------------
One ``ServerSession`` engine per accepted WebSocket, one class per protocol
(``bridge/providers/<protocol>/server.py``). It parses client frames and validates them
exactly as the seed document says (answering with the document's own error
frames), and asks the shell to synthesise text with ``Synthesize`` actions.
The shell runs the synthesis engine (``tone`` inline, ``piper`` in a worker
thread) and feeds results back:

* ``synthesis_audio(job_id, pcm, words, now)``: 16-bit little-endian mono
  PCM at the ``sample_rate_hz`` the job asked for, plus the word timings of
  that chunk (seconds from the start of the *job's* audio);
* ``synthesis_done(job_id, now)`` once the job has produced everything;
* ``synthesis_failed(job_id, message, now)`` when the engine failed.

* ``synthesis_refused(job_id, message, now)`` when the job could not start
  (every synthesis worker busy and the queue full, or the wait too long): the
  session answers with its protocol's own "at capacity" error frame, so the
  client fails the turn at once.

The session encodes the audio into the wire format the client asked for
(base64 JSON, binary frames with headers, mu-law, A-law...) and emits the
protocol's frames in the order the document prescribes. ``CancelSynthesis``
tells the shell to stop a job (the session already dropped its output).

A session never blocks and never reads a clock, so the same code is both our
embedded provider and the conformance peer the client engines are tested
against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from bridge.engine import Action
from bridge.providers.base import WordTiming

__all__ = [
    "CancelSynthesis",
    "ServerOptions",
    "ServerSession",
    "Synthesize",
]


@dataclass(frozen=True, slots=True)
class Synthesize(Action):
    """Render ``text`` with ``voice`` as PCM s16le mono at ``sample_rate_hz``."""

    job_id: str
    text: str
    voice: str
    sample_rate_hz: int
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class CancelSynthesis(Action):
    """Stop a synthesis job; its remaining output is not wanted."""

    job_id: str


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """What every protocol server session is configured with.

    ``voices``: the voice ids the server knows (others get the protocol's
    "unknown voice" error). ``api_keys``: accepted keys/tokens; empty means
    any key is accepted (the embedded server on loopback).
    """

    voices: frozenset[str] = frozenset({"joe", "tone"})
    default_voice: str = "joe"
    api_keys: frozenset[str] = field(default=frozenset(), repr=False)
    max_contexts: int = 64
    """Open contexts per connection where the protocol leaves the limit to the
    server (Kova, zwst); Coda's limit of 16 is the protocol's own."""


class ServerSession(Protocol):
    """One accepted client connection, as a sans-I/O engine.

    Each protocol module also exposes ``PATHS: tuple[str, ...]``, the URL
    paths it is served on.
    """

    protocol_name: ClassVar[str]

    def __init__(self, options: ServerOptions) -> None: ...

    def connection_made(
        self, path: str, query: dict[str, str], headers: dict[str, str], now: float
    ) -> None:
        """The upgrade completed. ``headers`` keys are lower-case."""
        ...

    def receive_text(self, text: str, now: float) -> None: ...

    def receive_bytes(self, data: bytes, now: float) -> None: ...

    def connection_lost(self, now: float) -> None: ...

    def synthesis_audio(
        self, job_id: str, pcm: bytes, words: tuple[WordTiming, ...], now: float
    ) -> None: ...

    def synthesis_done(self, job_id: str, now: float) -> None: ...

    def synthesis_failed(self, job_id: str, message: str, now: float) -> None: ...

    def synthesis_refused(self, job_id: str, message: str, now: float) -> None:
        """The job never started (the server is at capacity): the protocol's busy error."""
        ...

    def handle_timer(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def actions_to_send(self) -> list[Action]: ...

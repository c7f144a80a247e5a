"""The one interface every TTS / voice provider engine offers the ``Call``.

Theory of operation
-------------------
One engine instance is one WebSocket connection to one provider. The shell
(``bridge.io.provider_ws``) opens the socket the engine describes, then pumps:

1. ``session_request()``: an HTTP request to make *before* the WebSocket
   (zwst's session route), or ``None``. Its answer goes to
   ``session_response(status, body, now)``.
2. ``connect_params()``: URL, headers and subprotocols of the upgrade.
3. ``connection_made(subprotocol, now)`` once the upgrade completed (the
   engine checks the negotiated subprotocol and may queue a close).
4. ``receive_text`` / ``receive_bytes`` for every message, ``handle_timer``
   at ``next_deadline()``, ``connection_lost`` when the socket is gone.
5. After each call: ``actions_to_send()`` (``SendText``, ``SendBytes``,
   ``CloseConnection``, ``HttpRequest``) and ``events_received()``.

Turns are the unit the ``Call`` thinks in. A turn id is chosen by the caller
of ``open_turn``; the engine maps it onto the protocol's own context / session
ids. ``cancel`` is barge-in: the engine sends the protocol's own cancel, and
from then on drops every late frame of that turn at its boundary, so no
``AudioReceived`` for a cancelled turn ever reaches the ``Call``.

Word timings are normalised to seconds from the start of the turn's audio,
whatever the protocol sends (milliseconds, per-segment offsets, parallel
arrays).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

from bridge.engine import Action, Event

__all__ = [
    "AudioEncoding",
    "AudioFormat",
    "AudioReceived",
    "ConnectParams",
    "ConnectionReady",
    "HttpRequest",
    "OptionType",
    "ProviderFailed",
    "ProviderSettings",
    "QueueDepthChanged",
    "TtsProtocol",
    "TurnDone",
    "TurnFailed",
    "TurnSettings",
    "TurnStarted",
    "UsageReported",
    "VoiceEnded",
    "VoiceFailed",
    "VoiceInterrupted",
    "VoiceUsage",
    "WordTiming",
    "WordsTimed",
]

AudioEncoding = Literal["pcm_s16le", "mulaw", "alaw"]


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """An audio format on a provider's wire (always mono)."""

    encoding: AudioEncoding
    sample_rate_hz: int

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.encoding == "pcm_s16le" else 1


PCM_8K = AudioFormat("pcm_s16le", 8000)
MULAW_8K = AudioFormat("mulaw", 8000)
ALAW_8K = AudioFormat("alaw", 8000)


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """What one turn asks of the provider.

    ``audio_format`` is a request: the provider may not support it (the engine
    then asks for what it can and reports the real format on every
    ``AudioReceived``). Ask for ``mulaw``/``alaw`` at 8000 Hz on G.711 calls
    so a provider that can pass it through does.
    """

    voice: str
    audio_format: AudioFormat
    model: str | None = None
    language: str | None = None
    speed: float | None = None
    temperature: float | None = None
    word_timestamps: bool = True
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, init=False)
class WordTiming:
    """One word, in seconds from the start of its turn's audio."""

    word: str
    start_s: float
    end_s: float

    def __init__(self, word: str, start_s: float, end_s: float) -> None:
        _WORD_TIMING_SET[0](self, word)  # see _slot_setters
        _WORD_TIMING_SET[1](self, start_s)
        _WORD_TIMING_SET[2](self, end_s)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """One ``[providers.NAME]`` table, as an engine needs it.

    ``api_key`` is a secret: engines put it only where the protocol says
    (query string, header, first frame) and never into an event or an error
    message. ``options`` holds the protocol-specific keys of the table.
    """

    name: str
    protocol: str
    url: str
    api_key: str = field(default="", repr=False)
    voice: str = ""
    model: str = ""
    options: tuple[tuple[str, str | int | float | bool], ...] = ()
    unix_socket: str = ""
    """Connect over this Unix socket (the embedded server's) instead of to ``url``'s host."""

    def option(self, key: str, default: str | int | float | bool) -> str | int | float | bool:
        for k, v in self.options:
            if k == key:
                return v
        return default


OptionType = type | tuple[str, ...]
"""The type of one protocol option of ``[providers.NAME]``: ``str``, ``int``, ``float``
(an integer is accepted) or ``bool``, or a tuple of the strings allowed. Each client
engine module declares its options as ``OPTIONS: dict[str, OptionType]`` (the config
reader rejects any other key of the table)."""


# ----------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class ConnectParams:
    """How to open the provider's WebSocket."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    subprotocols: tuple[str, ...] = ()
    max_message_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest(Action):
    """An HTTP request the shell makes for the engine (e.g. a session route)."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class ConnectionReady(Event):
    """The connection can take turns (after any protocol handshake)."""


@dataclass(frozen=True, slots=True)
class TurnStarted(Event):
    """The provider accepted the turn (context_started, generation_started...)."""

    turn_id: str
    provider_ref: str = ""


@dataclass(frozen=True, slots=True, init=False)
class AudioReceived(Event):
    """Audio for a turn, in ``audio_format`` (the real one on the wire)."""

    turn_id: str
    audio: bytes
    audio_format: AudioFormat

    def __init__(self, turn_id: str, audio: bytes, audio_format: AudioFormat) -> None:
        _AUDIO_RECEIVED_SET[0](self, turn_id)  # see _slot_setters
        _AUDIO_RECEIVED_SET[1](self, audio)
        _AUDIO_RECEIVED_SET[2](self, audio_format)


@dataclass(frozen=True, slots=True, init=False)
class WordsTimed(Event):
    """Word timings for a turn, in seconds from the start of the turn's audio."""

    turn_id: str
    words: tuple[WordTiming, ...]

    def __init__(self, turn_id: str, words: tuple[WordTiming, ...]) -> None:
        _WORDS_TIMED_SET[0](self, turn_id)  # see _slot_setters
        _WORDS_TIMED_SET[1](self, words)


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slots' own setters, for the ``__init__`` of the events every message builds.

    A frozen dataclass's generated ``__init__`` sets each field through
    ``object.__setattr__`` (the class's own ``__setattr__`` refuses); the slot
    descriptor's ``__set__`` does the same store at about half the cost
    (CPython 3.11: an ``AudioReceived`` in 0.43 us against 0.80-0.90). The
    instances stay frozen: assignment still raises ``FrozenInstanceError``.
    """
    return tuple(getattr(cls, name).__set__ for name in names)


_WORD_TIMING_SET = _slot_setters(WordTiming, "word", "start_s", "end_s")
_AUDIO_RECEIVED_SET = _slot_setters(AudioReceived, "turn_id", "audio", "audio_format")
_WORDS_TIMED_SET = _slot_setters(WordsTimed, "turn_id", "words")


@dataclass(frozen=True, slots=True)
class QueueDepthChanged(Event):
    """Provider-side backlog for a turn (zwst ``segment_start.queue_depth``)."""

    turn_id: str
    queue_depth: int


@dataclass(frozen=True, slots=True)
class TurnDone(Event):
    """All audio of the turn has been delivered (or the cancel was confirmed)."""

    turn_id: str
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class TurnFailed(Event):
    """The provider reported an error for one turn; the connection stays usable.

    ``kind`` is the protocol's own error code or kind, ``retryable`` says
    whether another provider (or a retry) could succeed.
    """

    turn_id: str
    kind: str
    message: str
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class ProviderFailed(Event):
    """The connection is unusable (handshake refused, fatal error, closed).

    Every turn still open on it is listed in ``turn_ids``: they will get no
    more events from this engine.
    """

    kind: str
    message: str
    turn_ids: tuple[str, ...] = ()
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class UsageReported(Event):
    """Usage / billing figures the provider reported (logged per call)."""

    turn_id: str | None
    usage: dict[str, object] = field(default_factory=dict)


# The voice-agent events the call understands (Kletso's engine emits them; here so the
# call engine imports no provider module, issue 32).


@dataclass(frozen=True, slots=True)
class VoiceInterrupted(Event):
    """A voice agent's ``voice.interrupted`` (Kletso): drop playout of ``item_id`` beyond
    ``audio_end_ms``."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class VoiceUsage:
    """A voice agent's session usage (Kletso ``voice.ended.usage``)."""

    audio_in_s: float
    audio_out_s: float
    cost_micros: int


@dataclass(frozen=True, slots=True)
class VoiceEnded(Event):
    """A voice agent's session is over (Kletso ``voice.ended``: user, idle, limit, error,
    not_configured)."""

    reason: str
    usage: VoiceUsage


@dataclass(frozen=True, slots=True)
class VoiceFailed(Event):
    """A voice agent's ``error`` about its session (turns get ``TurnFailed`` too)."""

    code: str
    message: str
    retryable: bool


# --------------------------------------------------------------- interface


class TtsProtocol(Protocol):
    """One connection to one provider, as a sans-I/O engine."""

    def __init__(self, settings: ProviderSettings) -> None: ...

    protocol_name: ClassVar[str]
    """The name used in config (``kova``, ``kugelaudio``, ``kletso``, ``coda``, ``zwst``)."""

    max_turns: ClassVar[int]
    """How many turns one connection can carry at once (1 for KugelAudio)."""

    def session_request(self) -> HttpRequest | None: ...

    def session_response(self, status: int, body: bytes, now: float) -> None: ...

    def connect_params(self) -> ConnectParams: ...

    def connection_made(self, subprotocol: str | None, now: float) -> None: ...

    def connection_lost(self, code: int | None, reason: str, now: float) -> None: ...

    def receive_text(self, text: str, now: float) -> None: ...

    def receive_bytes(self, data: bytes, now: float) -> None: ...

    @property
    def ready(self) -> bool:
        """True once turns can be opened (handshake finished, not closed)."""
        ...

    def open_turns(self) -> int: ...

    def open_turn(self, turn_id: str, settings: TurnSettings, now: float) -> None: ...

    def send_text(self, turn_id: str, text: str, now: float) -> None: ...

    def end_turn(self, turn_id: str, now: float) -> None: ...

    def cancel(self, turn_id: str, now: float) -> None: ...

    def close(self, now: float) -> None: ...

    def handle_timer(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def actions_to_send(self) -> list[Action]: ...

    def events_received(self) -> list[Event]: ...

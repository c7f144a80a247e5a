"""The prompt cache: static prompts rendered once, shared while in flight, kept LRU-bounded.

Theory of operation
-------------------
A *prompt* is a complete, static text (a route's greeting, a flow step's
``say``, a fallback prompt) spoken by one provider in one voice and format.
``PromptKey`` names everything that changes its audio; ``PromptKey.digest()``
is the hex SHA-256 of that key (the disk store's file name).

``PromptCache`` is a pure engine (no clock, no I/O): the shell asks it for a
prompt and it answers in one of three ways (``request``):

* **hit**: the rendered audio is replayed into the caller's sink at once
  (``AudioReceived``/``WordsTimed`` then ``TurnDone``, tagged with the
  caller's turn id);
* **joined**: an identical render is in flight (a *flight*); the caller
  becomes one of its waiters and gets everything recorded so far at once,
  then the rest as it arrives (so a late joiner hears the prompt from its
  start, not from where the first caller is);
* **lead**: nothing is cached or in flight; a flight is created with the
  caller as its first waiter and the shell must start the render
  (``Flight.wire_id`` is the provider turn id to use).

The shell feeds the render's provider events back with ``flight_event``
(audio, words, done) and ``flight_failed`` (a ``TurnFailed`` or
``ProviderFailed``). A failure before any audio is retried once: the
engine answers ``True`` and bumps ``Flight.attempt`` (a fresh wire id); a
failure after audio, or a second one, fails every waiter together with one
``TurnFailed`` each. A waiter that leaves (barge-in, hang-up: ``leave``)
leaves the render alone: it goes on to fill the cache, whoever waits.

Completed renders are kept in memory, least recently used first out, bounded
in bytes of audio. The disk store (``bridge.io.prompt_store``) mirrors it:
``stored`` and ``evicted`` list what to write and delete, and ``load`` puts
back what a previous run wrote. ``encode_prompt``/``decode_prompt`` are the
file format: a header with a magic, a version, the lengths and a CRC-32 of
the rest, then the key material (JSON: no secret) and the audio records.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bridge.config import Config, RouteConfig
from bridge.engine import Event
from bridge.providers.base import (
    ALAW_8K,
    MULAW_8K,
    PCM_8K,
    AudioFormat,
    AudioReceived,
    ProviderSettings,
    TurnDone,
    TurnFailed,
    TurnStarted,
    WordsTimed,
    WordTiming,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "PCM_16K",
    "Flight",
    "PromptCache",
    "PromptCounts",
    "PromptFileError",
    "PromptKey",
    "Rendered",
    "StaticPrompt",
    "TurnFellBack",
    "Waiter",
    "decode_prompt",
    "encode_prompt",
    "prerender_formats",
    "provider_identity",
    "route_fallback_prompt",
    "static_prompts",
]

Sink = Callable[[Event], None]
Outcome = Literal["hit", "joined", "lead"]

_NOT_AUDIO_OPTIONS = frozenset(
    {"warm", "turns_per_connection", "close_idle_after_s", "flow_control_ahead_s",
     "text_ahead_s", "max_turns", "api_key"}
)  # fmt: skip
"""Provider options that change how the daemon talks to a provider, not what it says."""
_SECRET_QUERY = ("key", "token", "secret", "auth", "password", "signature", "sig")


def provider_identity(settings: ProviderSettings, engine: str = "") -> str:
    """A hash of what about a provider changes its audio: protocol, URL (without its
    credentials), model and audio options, and the engine (``engine``: e.g. the embedded
    server's synthesis engine and model, with a version where one is known).

    The API key is not part of it (rotating a key does not change a voice), and only
    this hash, never the material, reaches the disk."""
    parts = urlsplit(settings.url)
    query = [
        (k, v) for k, v in parse_qsl(parts.query) if not any(s in k.lower() for s in _SECRET_QUERY)
    ]
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    url = urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))
    options = sorted(
        (k, v)
        for k, v in settings.options
        if k not in _NOT_AUDIO_OPTIONS and not k.endswith("_timeout_s")
    )
    material = json.dumps(
        [settings.protocol, url, settings.model, options, engine], sort_keys=True, default=str
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TurnFellBack(Event):
    """A turn could not be rendered by any provider: its caller hears the fallback prompt
    instead (the turn's own audio and ``TurnDone`` follow, under its turn id); the call
    reports the provider error as for a failed turn."""

    turn_id: str
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class PromptKey:
    """Everything that changes a prompt's audio."""

    provider: str
    identity: str
    """``provider_identity`` of the provider's settings."""
    voice: str
    audio_format: AudioFormat
    speed: float | None
    text: str

    def material(self) -> dict[str, Any]:
        """The key as JSON-able data (what the disk store writes; no secret in it)."""
        return {
            "provider": self.provider,
            "identity": self.identity,
            "voice": self.voice,
            "encoding": self.audio_format.encoding,
            "sample_rate_hz": self.audio_format.sample_rate_hz,
            "speed": self.speed,
            "text": self.text,
        }

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.material(), sort_keys=True).encode()).hexdigest()


@dataclass(slots=True)
class Rendered:
    """A completed render: its audio and word timings in order (turn id ``""``)."""

    events: list[Event]
    size_bytes: int


def _size(events: list[Event]) -> int:
    return sum(len(e.audio) for e in events if isinstance(e, AudioReceived))


def _retag(event: Event, turn_id: str) -> Event:
    if isinstance(event, AudioReceived):
        return AudioReceived(turn_id, event.audio, event.audio_format)
    if isinstance(event, WordsTimed):
        return WordsTimed(turn_id, event.words)
    raise TypeError(f"not a recorded prompt event: {type(event).__name__}")


def _replay(events: list[Event], turn_id: str, sink: Sink) -> None:
    for ev in events:
        sink(_retag(ev, turn_id))


@dataclass(slots=True)
class PromptCounts:
    """What the cache did for one provider's prompts (``PromptCache.counts``), since start."""

    hits: int = 0
    """Requests served from the cache."""
    misses: int = 0
    """Requests that started a render (neither cached nor in flight)."""
    joins: int = 0
    """Requests that joined a render in flight (coalesced: no render of their own)."""
    renders: int = 0
    """Render attempts started (a retry counts)."""
    failures: int = 0
    """Renders failed for good (their waiters failed together)."""


@dataclass(eq=False, slots=True)
class Waiter:
    """One turn waiting on a flight (``PromptCache.leave`` takes it back)."""

    flight: Flight
    turn_id: str
    sink: Sink


@dataclass(eq=False, slots=True)
class Flight:
    """One render in progress, shared by every turn that asks for the same prompt."""

    key: PromptKey
    digest: str
    number: int
    attempt: int = 1
    events: list[Event] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    done: bool = False
    handle: object = None
    """The shell's provider turn of the current attempt (what an underrun's cause is
    looked up on); the engine never touches it."""

    @property
    def wire_id(self) -> str:
        """The provider turn id of the current attempt."""
        return f"prompt-{self.number}-{self.attempt}"


class PromptCache:
    """Rendered prompts, LRU-bounded in bytes, with single-flight rendering (module doc)."""

    def __init__(
        self, max_bytes: int = 32 * 1024 * 1024, retries: int = 1, *, persist: bool = False
    ) -> None:
        self.max_bytes = max_bytes
        self.retries = retries
        self.persist = persist
        """Whether ``stored`` and ``evicted`` are kept (for a disk store to drain)."""
        self._items: OrderedDict[str, Rendered] = OrderedDict()
        self._flights: dict[str, Flight] = {}
        self._flight_no = 0
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self.joins = 0
        self.renders = 0
        """Render attempts started (a retry counts)."""
        self.failures = 0
        """Flights failed for good (their waiters failed together)."""
        self.counts: dict[str, PromptCounts] = {}
        """The same figures per provider (``PromptKey.provider``: a name from the config)."""
        self.stored: list[tuple[str, PromptKey, Rendered]] = []
        """Completed renders not yet written to disk (the shell drains it)."""
        self.evicted: list[str] = []
        """Digests evicted since the shell last looked (to delete on disk too)."""

    # ------------------------------------------------------------- lookups

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, key: PromptKey) -> bool:
        """Whether the prompt is rendered (no counting, no recency)."""
        return key.digest() in self._items

    def in_flight(self, key: PromptKey) -> bool:
        return key.digest() in self._flights

    @property
    def flights(self) -> int:
        return len(self._flights)

    def get(self, key: PromptKey) -> list[Event] | None:
        """The rendered events (turn id ``""``), counting a hit or a miss."""
        item = self._items.get(key.digest())
        if item is None:
            self.misses += 1
            self._count(key).misses += 1
            return None
        self._items.move_to_end(key.digest())
        self.hits += 1
        self._count(key).hits += 1
        return item.events

    def _count(self, key: PromptKey) -> PromptCounts:
        counts = self.counts.get(key.provider)
        if counts is None:
            counts = self.counts[key.provider] = PromptCounts()
        return counts

    def put(self, key: PromptKey, events: list[Event], *, persist: bool = True) -> bool:
        """Keep a rendered prompt; ``False`` when it is larger than the whole cache."""
        digest = key.digest()
        size = _size(events)
        if size > self.max_bytes:
            return False
        old = self._items.pop(digest, None)
        if old is not None:
            self.size_bytes -= old.size_bytes
        item = Rendered([_retag(e, "") for e in events], size)
        self._items[digest] = item
        self.size_bytes += size
        if persist and self.persist:
            self.stored.append((digest, key, item))
        self.trim()
        return True

    def trim(self) -> None:
        """Evict the least recently used prompts until the cache is within ``max_bytes``."""
        while self.size_bytes > self.max_bytes:
            gone, evicted = self._items.popitem(last=False)
            self.size_bytes -= evicted.size_bytes
            if self.persist:
                self.evicted.append(gone)

    def load(self, key: PromptKey, events: list[Event]) -> bool:
        """A prompt a previous run rendered (the disk store's, oldest first)."""
        return self.put(key, events, persist=False)

    # --------------------------------------------------------- single flight

    def request(
        self, key: PromptKey, turn_id: str, sink: Sink, *, lead: bool = True
    ) -> tuple[Outcome | None, Waiter | None]:
        """Serve the prompt to ``sink`` as turn ``turn_id``: ``("hit", None)`` after replaying
        it, ``("joined", waiter)``, or ``("lead", waiter)`` (start ``waiter.flight``). With
        ``lead=False`` a prompt neither cached nor in flight is ``(None, None)``."""
        digest = key.digest()
        item = self._items.get(digest)
        if item is not None:
            self._items.move_to_end(digest)
            self.hits += 1
            self._count(key).hits += 1
            _replay(item.events, turn_id, sink)
            sink(TurnDone(turn_id))
            return "hit", None
        flight = self._flights.get(digest)
        if flight is not None:
            self.joins += 1
            self._count(key).joins += 1
            waiter = Waiter(flight, turn_id, sink)
            flight.waiters.append(waiter)
            _replay(list(flight.events), turn_id, sink)  # from the start of the audio
            return "joined", waiter
        if not lead:
            return None, None
        self.misses += 1
        self.renders += 1
        counts = self._count(key)
        counts.misses += 1
        counts.renders += 1
        self._flight_no += 1
        flight = Flight(key, digest, self._flight_no)
        self._flights[digest] = flight
        waiter = Waiter(flight, turn_id, sink)
        flight.waiters.append(waiter)
        return "lead", waiter

    def leave(self, waiter: Waiter) -> None:
        """The waiter's turn was cancelled: it gets nothing more; the render goes on."""
        if waiter in waiter.flight.waiters:
            waiter.flight.waiters.remove(waiter)

    def flight_event(self, flight: Flight, event: Event) -> None:
        """An event of the flight's render: audio and words are recorded and passed to every
        waiter; ``TurnDone`` keeps the prompt and ends every waiter's turn."""
        if flight.done:
            return
        if isinstance(event, AudioReceived | WordsTimed):
            flight.events.append(_retag(event, ""))
            for w in list(flight.waiters):
                w.sink(_retag(event, w.turn_id))
        elif isinstance(event, TurnStarted):  # (not recorded: a hit has no provider turn)
            for w in list(flight.waiters):
                w.sink(TurnStarted(w.turn_id, event.provider_ref))
        elif isinstance(event, TurnDone):
            self._land(flight)
            if not event.cancelled:
                self.put(flight.key, flight.events)
            waiters, flight.waiters = flight.waiters, []  # (no waiter <-> flight cycle left)
            for w in waiters:
                w.sink(TurnDone(w.turn_id, event.cancelled))

    def flight_failed(self, flight: Flight, kind: str, message: str, retryable: bool) -> bool:
        """The render failed: ``True`` when the shell should render again (``flight.attempt``
        is the next attempt), else every waiter got a ``TurnFailed`` and the flight is over."""
        if flight.done:
            return False
        if not flight.events and flight.attempt <= self.retries:
            flight.attempt += 1
            self.renders += 1
            self._count(flight.key).renders += 1
            return True
        self._land(flight)
        self.failures += 1
        self._count(flight.key).failures += 1
        waiters, flight.waiters = flight.waiters, []
        for w in waiters:
            w.sink(TurnFailed(w.turn_id, kind, message, retryable))
        return False

    def _land(self, flight: Flight) -> None:
        flight.done = True
        if self._flights.get(flight.digest) is flight:
            del self._flights[flight.digest]


# ------------------------------------------------------------ static prompts


@dataclass(frozen=True, slots=True)
class StaticPrompt:
    """A prompt the config names: rendered at start-up and reload (``static_prompts``)."""

    provider: str
    voice: str
    text: str


def route_fallback_prompt(config: Config, route: RouteConfig) -> str:
    """What a caller on ``route`` hears in place of a turn no provider could render."""
    return route.fallback_prompt or config.daemon.fallback_prompt


def static_prompts(config: Config) -> list[StaticPrompt]:
    """Every static prompt of the config, once: each route's greeting, every ``say`` of
    its flow and fallback flow, and its fallback prompt, on the route's first provider in
    the route's voice (what its calls ask for); none for a route whose first provider is a
    voice agent (``kletso``)."""
    out: dict[StaticPrompt, None] = {}
    flows = {f.name: f for f in config.flows}
    agents = {p.name for p in config.providers if p.protocol == "kletso"}
    for route in config.routes:
        if not route.provider or route.provider[0] in agents:
            continue  # (a voice agent answers a text; it does not read it out)
        texts = [route.greeting]
        for name in (route.flow, route.fallback_flow):
            if name in flows:
                texts.extend(step.say for step in flows[name].steps)
        texts.append(route_fallback_prompt(config, route))
        for text in texts:
            if text:
                out[StaticPrompt(route.provider[0], route.voice, text)] = None
    return list(out)


PCM_16K = AudioFormat("pcm_s16le", 16000)
"""A G.722 or Opus call's format (``bridge.io.legs.sip_call``)."""


def prerender_formats(config: Config) -> list[AudioFormat]:
    """The formats calls ask prompts in: 8 kHz mu-law (every carrier dialect's default and
    PCMU), A-law as well where SIP prefers PCMA, and 16 kHz PCM where SIP or a trunk
    prefers G.722 or Opus (a call in either is a 16 kHz linear leg)."""
    formats = [MULAW_8K]
    if config.sip.enabled and config.sip.codecs[:1] == ("PCMA",):
        formats.append(ALAW_8K)
    preferred = [config.sip.codecs[:1], *(t.codecs[:1] for t in config.trunks)]
    if config.sip.enabled and (("G722",) in preferred or ("OPUS",) in preferred):
        formats.append(PCM_16K)
    return formats


# ------------------------------------------------------------------ file format

MAGIC = b"CBPROMPT"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sHHIII")  # magic, version, reserved, material, payload, crc32
_AUDIO = b"A"
_FORMATS = {f: f for f in (MULAW_8K, ALAW_8K, PCM_8K, PCM_16K)}
"""The shared format objects (the call compares formats by identity first)."""
_WORDS = b"W"


class PromptFileError(ValueError):
    """A prompt file that cannot be trusted (truncated, corrupted, another version)."""


def encode_prompt(key: PromptKey, events: list[Event]) -> bytes:
    """One prompt file: header, key material (JSON), then the audio and word records."""
    material = json.dumps({**key.material(), "digest": key.digest()}, sort_keys=True).encode()
    out = bytearray()
    for ev in events:
        if isinstance(ev, AudioReceived):
            enc = ev.audio_format.encoding.encode()
            out += _AUDIO + struct.pack(">BI", len(enc), ev.audio_format.sample_rate_hz) + enc
            out += struct.pack(">I", len(ev.audio)) + ev.audio
        elif isinstance(ev, WordsTimed):
            words = json.dumps([[w.word, w.start_s, w.end_s] for w in ev.words]).encode()
            out += _WORDS + struct.pack(">I", len(words)) + words
    payload = bytes(out)
    crc = zlib.crc32(payload, zlib.crc32(material))
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(material), len(payload), crc)
    return header + material + payload


def decode_prompt(data: bytes) -> tuple[PromptKey, list[Event]]:
    """The key and events of a prompt file; ``PromptFileError`` saying what is wrong."""
    if len(data) < _HEADER.size:
        raise PromptFileError(f"truncated header ({len(data)} bytes)")
    magic, version, _, m_len, p_len, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PromptFileError("not a prompt file (bad magic)")
    if version != FORMAT_VERSION:
        raise PromptFileError(f"format version {version}, expected {FORMAT_VERSION}")
    if len(data) != _HEADER.size + m_len + p_len:
        raise PromptFileError(f"length {len(data)}, header says {_HEADER.size + m_len + p_len}")
    material = data[_HEADER.size : _HEADER.size + m_len]
    payload = data[_HEADER.size + m_len :]
    if zlib.crc32(payload, zlib.crc32(material)) != crc:
        raise PromptFileError("checksum mismatch")
    try:
        m = json.loads(material)
        speed = m["speed"]
        key = PromptKey(
            str(m["provider"]),
            str(m["identity"]),
            str(m["voice"]),
            AudioFormat(m["encoding"], int(m["sample_rate_hz"])),
            None if speed is None else float(speed),
            str(m["text"]),
        )
        if key.digest() != m["digest"]:
            raise PromptFileError("key digest mismatch")
        return key, _records(payload)
    except (ValueError, KeyError, TypeError, struct.error) as e:
        if isinstance(e, PromptFileError):
            raise
        raise PromptFileError(f"bad content: {e}") from e


def _records(payload: bytes) -> list[Event]:
    events: list[Event] = []
    at = 0
    while at < len(payload):
        tag = payload[at : at + 1]
        at += 1
        if tag == _AUDIO:
            enc_len, rate = struct.unpack_from(">BI", payload, at)
            at += 5
            enc = payload[at : at + enc_len].decode()
            at += enc_len
            (n,) = struct.unpack_from(">I", payload, at)
            at += 4
            if at + n > len(payload):
                raise PromptFileError("audio record past the end")
            fmt = AudioFormat(enc, rate)  # type: ignore[arg-type]
            fmt = _FORMATS.get(fmt, fmt)
            events.append(AudioReceived("", payload[at : at + n], fmt))
            at += n
        elif tag == _WORDS:
            (n,) = struct.unpack_from(">I", payload, at)
            at += 4
            words = json.loads(payload[at : at + n])
            at += n
            events.append(WordsTimed("", tuple(WordTiming(w, s, e) for w, s, e in words)))
        else:
            raise PromptFileError(f"unknown record {tag!r}")
    return events

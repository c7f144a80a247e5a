"""The shell around one call: its ``CallBridge``, leg, providers, turn source and clock.

A ``CallRunner`` is created by a leg (SIP, media stream) once a call is
answered. It feeds the bridge what the leg receives, ticks it from the
process-wide ``MediaTicker``, and carries out its actions:

* provider actions (``OpenTurn`` ...) go to the route's ``Speaker`` (failover
  chain and prompt cache), and provider events come back to the bridge;
* leg actions (``ClearLeg``, ``SendMark``, ``HangupLeg`` ...) go to the leg's
  ``LegAdapter``; a SIP call's early media ends with ``AnswerLeg`` or
  ``RejectLeg`` (the bridge decides which, once), which go to ``on_early_media``;
* voice-agent actions go to a dedicated ``AgentSession``;
* the bridge's call events go to the turn source (an IVR ``FlowRunner``, or
  the application WebSocket), whose commands go back to the bridge.

Failure isolation: every entry point is guarded; an exception ends *this*
call (leg hung up, provider turns cancelled, resources released, logged with
the call id) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import websockets

from bridge import commands as cmd
from bridge.config import Config, RouteConfig
from bridge.control.app import AppLost, AppSession
from bridge.control.flow import FlowRunner, fallback_runner
from bridge.engine import CloseConnection, Event, SendText
from bridge.io.gcpolicy import Canary
from bridge.io.provider_pool import ProviderPool, Speaker
from bridge.io.provider_turns import AgentSession
from bridge.io.services import Services
from bridge.io.ticker import InboundCallback
from bridge.logs import get_logger
from bridge.media.bargein import BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import (
    AgentPlayed,
    AnswerLeg,
    CallOptions,
    CancelTurn,
    ClearLeg,
    ConnectApp,
    EndTurn,
    HangupLeg,
    LegProfile,
    OpenTurn,
    RejectLeg,
    SendAgentAudio,
    SendLegDtmf,
    SendMark,
    SendTurnText,
    StartAgent,
    StopAgent,
    TransferLeg,
)
from bridge.providers.base import TurnSettings, UsageReported
from bridge.providers.prompts import route_fallback_prompt

__all__ = [
    "CALL_OUTCOMES",
    "PROVIDER_ERROR_KINDS",
    "CallRunner",
    "LegAdapter",
    "bargein_policy",
    "bounded_label",
]

log = get_logger("callbridge.call")

CALL_OUTCOMES = frozenset(
    {
        # the legs: SIP dialog ends, media-stream stops
        "remote-bye", "local-hangup", "ack-timeout", "session-expired", "transaction-timeout",
        "cancelled", "stop", "connection_lost", "hangup", "rejected", "protocol_violation",
        "carrier_stalled",
        # the call runner, the turn sources and the daemon
        "finished", "internal_error", "no_codec", "rtp_timeout", "transferred", "transfer",
        "flow_hangup", "flow_error", "handed_over", "call_ended", "app_hangup", "api_hangup",
        "shutdown",
    }
)  # fmt: skip
"""``callbridge_calls_total{outcome}`` values; any other reason (the free text of an
API or app hangup) is counted as ``other`` (the CDR line keeps the text)."""

PROVIDER_ERROR_KINDS = frozenset(
    {
        # the engines' own kinds
        "bad_audio_format", "cancelled", "closed", "connect_failed", "connection_closed",
        "error", "malformed", "malformed_frame", "open_refused", "protocol_error",
        "provider_error", "session_rejected", "text_too_long", "timeout", "unknown",
        "unsupported_encoding", "unsupported_settings", "voice_stopped", "voice_ended",
        # codes the protocols document (Coda error.kind, Kletso, KugelAudio error_code)
        "invalid_input", "unauthenticated", "permission_denied", "not_found",
        "resource_exhausted", "unavailable", "internal", "not_configured",
        "voice_unavailable", "voice_rate_limited", "voice_provider_error", "conflict",
        "connection", "session", "UNAUTHORIZED", "INSUFFICIENT_CREDITS", "VALIDATION_ERROR",
    }
)  # fmt: skip
"""``callbridge_provider_errors_total{kind}`` values; a provider's other codes are ``other``."""


def bounded_label(value: str, known: frozenset[str]) -> str:
    """``value`` if it is one of ``known`` (a ``rejected: ...`` reason counts as
    ``rejected``), else ``other``: a label value never comes from free text."""
    head = value.split(":", 1)[0]
    return head if head in known else "other"


HANGUP_TAIL_S = 0.3
"""On RTP legs, how long the line stays up after the last frame before BYE: the frame's
20 ms and a 280 ms allowance for the phone's jitter buffer (docs/sip.md). A media-stream
leg needs none: a turn there finishes when the carrier echoes its last mark."""

PACING_SAMPLE_EVERY = 10
"""One outbound frame in this many has its departure deviation recorded."""


class LegAdapter(Protocol):
    """What a call needs from its caller leg."""

    kind: str

    def send_frame(self, frame: bytes | None, n: int, now: float) -> InboundCallback | None:
        """One 20 ms frame at its deadline (``None``: silence for RTP, nothing for WS).

        May return the leg's inbound work for this tick, which the ticker runs
        once every due stream's frame has been sent (``bridge.io.ticker``).
        """
        ...

    def send_mark(self, name: str) -> None: ...

    def clear(self) -> None: ...

    def hangup(self, reason: str) -> None: ...

    def transfer(self, target: str, trunk: str = "") -> None: ...

    def send_dtmf(self, digits: str) -> None: ...


def bargein_policy(services: Services) -> BargeInPolicy:
    """The detector's policy as ``[bargein]`` gives it (read at the call's start, so a
    reload reaches new calls)."""
    return services.config.bargein


def text_pacing(config: Config, route: RouteConfig) -> dict[str, Any]:
    """``CallOptions`` text pacing from the providers' ``text_ahead_s``: the route's first
    provider for a ``Say`` naming none, each provider's own for one naming it; cacheable
    turns are paced too when the prompt cache holds nothing."""
    ahead = {p.name: p.text_ahead_s for p in config.providers}
    out: dict[str, Any] = {
        "provider_text_ahead_s": tuple(ahead.items()),
        "cache_prompts": config.daemon.prompt_cache_bytes > 0,
    }
    if route.provider and route.provider[0] in ahead:
        out["text_ahead_s"] = ahead[route.provider[0]]
    return out


@dataclass
class _PendingPrompt:
    """A cacheable turn: its text is collected until ``EndTurn``, then spoken whole."""

    settings: TurnSettings
    provider: str | None
    text: list[str] = field(default_factory=list)


class CallRunner:
    """One call, from answer to hang-up."""

    # Slots: 30 attributes fill CPython 3.11's shared-key instance dict to its
    # limit, and _on_frame and caller_audio read several on every tick. They serve
    # the pure-Python build: compiled, the class is a C struct and mypyc ignores
    # ``__slots__`` (``__weakref__`` included: no weak references then).
    __slots__ = (
        "__weakref__",
        "agent",
        "agent_held",
        "agent_task",
        "agent_turns",
        "app",
        "app_task",
        "app_timer",
        "app_ws",
        "armed",
        "bridge",
        "bridge_timer",
        "call_id",
        "canary",
        "clock",
        "config",
        "end_reason",
        "final_status",
        "finished",
        "idle",
        "lead_frames",
        "leg",
        "loop",
        "on_early_media",
        "on_finished",
        "pacing",
        "pending_prompts",
        "pump_unfinished",
        "route",
        "runtime",
        "services",
        "source",
        "source_timer",
        "speakers",
        "started_at",
        "started_info",
        "tail_pending",
        "ticker",
    )

    def __init__(
        self,
        services: Services,
        call_id: str,
        leg: LegAdapter,
        profile: LegProfile,
        route: RouteConfig,
        started: cmd.CallStarted,
        *,
        lead_frames: int = 0,
        on_finished: Callable[[CallRunner], None] | None = None,
    ) -> None:
        self.services = services
        self.loop = asyncio.get_running_loop()
        self.call_id = call_id
        self.canary = Canary()
        """Held by this runner alone: the daemon checks it is gone after the call
        (``ReleaseWatch``)."""
        self.leg = leg
        self.route = route
        self.started_info = started
        self.lead_frames = lead_frames
        self.on_finished = on_finished
        self.on_early_media: Callable[[AnswerLeg | RejectLeg], None] | None = None
        """A SIP leg in early media: sends the 200 or the final error the bridge decided
        on (the app's ``answer``/``reject``, or the first turn's end, or the cap)."""
        runtime = services.runtime
        assert runtime is not None
        self.runtime = runtime  # this call keeps the providers it started with
        self.runtime.calls += 1
        self.config = self.runtime.config
        self.speakers: dict[str | None, Speaker] = {}
        now = self.loop.time()
        self.started_at = now
        self.bridge = CallBridge(
            call_id,
            profile,
            bargein_policy(services),
            now,
            options=CallOptions(
                default_voice=route.voice,
                trunks=frozenset(t.name for t in self.config.trunks),
                **text_pacing(self.config, route),
            ),
        )
        self.source: FlowRunner | None = None
        self.source_timer: asyncio.TimerHandle | None = None
        self.bridge_timer: asyncio.TimerHandle | None = None
        """The bridge's own timer (``next_deadline``: held turn text, the agent's reports)."""
        self.app: AppSession | None = None
        self.app_ws: Any = None
        self.app_task: asyncio.Task[None] | None = None
        self.app_timer: asyncio.TimerHandle | None = None
        self.armed: dict[Callable[[], None], float] = {}
        self.agent: AgentSession | None = None
        self.agent_task: asyncio.Task[None] | None = None
        self.agent_turns: set[str] = set()
        """Text turns spoken through the voice agent (opened while it was on)."""
        self.agent_held: list[tuple[str, tuple[Any, ...]]] = []
        """Agent turn calls made while its session was still being opened."""
        self.pending_prompts: dict[str, _PendingPrompt] = {}
        self.idle = True
        self.pump_unfinished = False
        self.tail_pending = False
        self.finished = False
        self.end_reason = ""
        self.final_status: int | None = None
        """The final error response that ended an unanswered call (``RejectLeg``)."""
        self.ticker = services.ticker
        self.clock = services.ticker.add(
            call_id, self._on_frame, self._on_tick_error, ts0=random.getrandbits(32)
        )
        services.metrics.calls_active.labels(leg.kind, route.match).inc()
        self.pacing = services.metrics.pacing_deviation_seconds.labels(leg.kind)

    # ------------------------------------------------------------- start-up

    def start(self) -> None:
        """Run the route: greeting and flow, or the application."""
        log.info(
            "call.started",
            call_id=self.call_id,
            leg=self.leg.kind,
            route=self.route.match,
            from_=self.started_info.from_,
            to=self.started_info.to,
        )
        self._guard(self._start_source)

    @property
    def turn_source(self) -> str:
        if self.bridge.agent_active:
            return "voice_agent"
        if self.app is not None and self.app.is_connected:
            return "app"
        return "flow" if self.source is not None else ""

    def _start_source(self, now: float) -> None:
        if self.route.app:
            self._connect_app(self.route.app, now)
        elif self.route.flow:
            self.source = FlowRunner(self.config.flow(self.route.flow), self.route.greeting, now)
            self.source.start(now)
        elif agent := self._route_agent():
            # the route's provider is a voice agent: the call is its conversation (the
            # caller's audio goes up, its replies are played), greeting included
            self.bridge.execute(cmd.HandOver(voice_agent=agent), now)
            if self.route.greeting:
                self.bridge.execute(cmd.Say("greeting", self.route.greeting), now)
        elif self.route.greeting:
            self.bridge.execute(cmd.Say("greeting", self.route.greeting, cacheable=True), now)
        self.pump(now)

    def _route_agent(self) -> str:
        """The route's provider if it is a voice agent (a ``kletso`` provider), else ``""``."""
        name = self.route.provider[0] if self.route.provider else ""
        pool = self.runtime.pools.get(name)
        return name if pool is not None and pool.settings.protocol == "kletso" else ""

    # ------------------------------------------------------- leg → bridge

    def caller_audio(self, frame: bytes) -> None:
        """One inbound 20 ms frame (50 a second per call): pumps only when it changed something."""
        if self.finished:
            return
        now = self.loop.time()
        bridge = self.bridge
        try:
            bridge.caller_audio(frame, now)
            if bridge.has_output() or self.pump_unfinished:
                self.pump(now)
        except Exception:  # one call's bug must end that call only
            log.exception("call.failed", call_id=self.call_id)
            self._fail()

    def caller_speech(self, frame: bytes) -> None:
        """An inbound frame as it arrived, for barge-in only (a SIP call's, ahead of its
        jitter buffer): ``CallBridge.caller_speech``."""
        if self.finished:
            return
        now = self.loop.time()
        bridge = self.bridge
        try:
            bridge.caller_speech(frame, now)
            if bridge.has_output() or self.pump_unfinished:
                self.pump(now)
        except Exception:  # one call's bug must end that call only
            log.exception("call.failed", call_id=self.call_id)
            self._fail()

    def caller_playout(self, frame: bytes) -> None:
        """An inbound frame in playout order, for the voice agent only (a SIP call's,
        out of its jitter buffer): ``CallBridge.caller_playout``."""
        bridge = self.bridge
        if self.finished or not bridge.takes_playout:
            return
        now = self.loop.time()
        try:
            bridge.caller_playout(frame, now)
            if bridge.has_output() or self.pump_unfinished:
                self.pump(now)
        except Exception:  # one call's bug must end that call only
            log.exception("call.failed", call_id=self.call_id)
            self._fail()

    def caller_dtmf(self, digit: str) -> None:
        self._guard(self.bridge.caller_dtmf, digit)

    def mark_echoed(self, name: str, cleared: bool) -> None:
        self._guard(self.bridge.mark_echoed, name, cleared)

    def leg_ended(self, reason: str) -> None:
        """The caller hung up (BYE, stop, socket closed)."""
        if not self.finished:
            self.end_reason = reason
            self._guard(self.bridge.hangup_received, reason)
            self.finish(reason)

    def early_media(self, then: AnswerLeg | RejectLeg) -> None:
        """The leg sent 183 with SDP: ``then`` ends it at the first turn's end, unless the
        turn source answers or rejects first (``on_early_media`` carries it out)."""
        self._guard(lambda now: self.bridge.early_media(then, now))

    def early_media_expired(self) -> None:
        """The leg's early media reached its cap: the route's rule ends it now."""
        self._guard(self.bridge.early_media_expired)

    def hangup(self, reason: str) -> None:
        """End the call from our side (drain timeout, API, shutdown)."""
        if not self.finished:
            self._guard(self.bridge.execute, cmd.Hangup(reason))

    def say(self, command: cmd.Say) -> None:
        self._guard(self._execute, command)

    def api_command(self, command: cmd.Command) -> str:
        """A command from the HTTP API, carried out now: "" when the call took it, else
        the reason it refused it (its ``CommandRejected``, answered to the API's caller,
        not sent to the application as an error about a command it did not send)."""
        refused: list[str] = []

        def run(now: float) -> None:
            self.bridge.execute(command, now)
            for action in self.bridge.actions_to_send():
                self._do(action)
            name = type(command).__name__
            for event in self.bridge.events_received():
                if isinstance(event, cmd.CommandRejected) and event.command == name:
                    refused.append(event.reason)
                else:
                    self._on_event(event, now)

        self._guard(run)
        return refused[0] if refused else ""

    def knows_provider(self, name: str | None) -> bool:
        """Whether a ``Say`` may name ``name`` (``None``: the route's own providers)."""
        return not name or name in self.runtime.pools

    def _execute(self, command: cmd.Command, now: float) -> None:
        """``bridge.execute``, but a ``Say`` naming a provider this node does not have is
        refused (``CommandRejected``: an error to the app), never a failed call."""
        if isinstance(command, cmd.Say) and not self.knows_provider(command.provider):
            log.warning("call.say_refused", call_id=self.call_id, reason="unknown_provider")
            self._on_event(cmd.CommandRejected("Say", command.turn_id, "unknown_provider"), now)
            return
        self.bridge.execute(command, now)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        if self.finished:
            return
        now = self.loop.time()
        try:
            fn(*args, now)
            self.pump(now)
        except Exception:  # one call's bug must end that call only
            log.exception("call.failed", call_id=self.call_id)
            self._fail()

    def _fail(self) -> None:
        self.end_reason = self.end_reason or "internal_error"
        with contextlib.suppress(Exception):
            self.leg.hangup("internal_error")
        self.finish("internal_error")

    # ----------------------------------------------------------- clock

    def _on_frame(self, n: int, now: float) -> InboundCallback | None:
        if n % PACING_SAMPLE_EVERY == 0:  # a sample of departures is enough for the histogram
            self.pacing.observe(max(0.0, now - self.clock.deadline(n)))
        bridge = self.bridge
        frame = bridge.tick(now)
        second = self.leg.send_frame(frame, n, now)
        if frame is None:
            self.idle = True
            # whose underrun (bridge.media.underrun): the carrier's lead, then unread bytes
            dry = bridge.underruns.silent_tick()
            if dry is not None and self._provider_unread(dry):
                bridge.underruns.unread()
        elif self.idle:
            lead = self.lead_frames - bridge.underruns.carrier_ahead
            if lead > 0:
                # a buffering carrier gets a small lead at a turn's start (or back after
                # a dry tick), then one frame per tick
                sent = 0
                for _ in range(lead):
                    if not bridge.frame_ready():
                        break
                    extra = bridge.tick(now)
                    if extra is None:
                        break
                    self.leg.send_frame(extra, n, now)
                    sent += 1
                bridge.underruns.lead_sent(sent)
            self.idle = False
        if bridge.has_output() or self.pump_unfinished:
            # A tick reaches the turn source and the app only through the
            # bridge's actions and events; most ticks have none (no lists).
            self.pump(now)
        if bridge.feed_due():  # the next frames' transcoding, once this wake-up's have left
            self.ticker.after_send(self.call_id, bridge.feed)
        return second

    def _provider_unread(self, turn_id: str) -> bool:
        """Whether the turn's provider connection has bytes the daemon has not read yet
        (in the kernel, or read and not yet handed over).

        If so, the underrun is the daemon's unless those bytes turn out not to
        hold the turn's next audio (the connection carries other turns too):
        the connection then calls back once it has read past them, and the
        underrun is the provider's after all (``Underruns.provider_after_all``).
        A turn no speaker knows (a voice agent's) looks at every provider connection.
        """
        providers_after_all = self.bridge.underruns.provider_after_all
        for speaker in self.speakers.values():
            unread = speaker.watch_dry(turn_id, providers_after_all)
            if unread is not None:
                return unread
        return any(pool.unread_bytes() for pool in self.runtime.pools.values())

    def _on_tick_error(self, exc: BaseException) -> None:
        log.error("call.tick_failed", call_id=self.call_id, error=str(exc))
        self._fail()

    # ------------------------------------------------------- providers

    def _speaker(self, provider: str | None) -> Speaker:
        speaker = self.speakers.get(provider)
        if speaker is None:
            names = [provider] if provider else list(self.route.provider)
            pools = [self.runtime.pools[n] for n in names if n in self.runtime.pools]
            fallback = route_fallback_prompt(self.config, self.route)
            speaker = Speaker(
                pools, self.runtime.cache, fallback, self.route.voice, self._first_audio(pools)
            )
            self.speakers[provider] = speaker
        return speaker

    def _first_audio(self, pools: list[ProviderPool]) -> list[float]:
        """Each pool's ``first_audio_timeout_s`` (its provider's, else ``[daemon]``'s)."""
        by_name = {p.name: p for p in self.config.providers}
        out = []
        for pool in pools:
            own = by_name[pool.name].first_audio_timeout_s if pool.name in by_name else None
            out.append(self.config.daemon.first_audio_timeout_s if own is None else own)
        return out

    def _provider_sink(self, event: Event) -> None:
        if self.finished:
            return
        now = self.loop.time()
        if isinstance(event, UsageReported):
            log.info(
                "provider.usage", call_id=self.call_id, turn_id=event.turn_id, usage=event.usage
            )
        bridge = self.bridge
        try:
            bridge.provider_event(event, now)
            if self.idle and bridge.frame_ready():
                self.ticker.start_talkspurt(self.call_id)
            # most audio chunks only queue frames: pump (two drains, the app, the turn
            # source, the source timer) only when the bridge has something for them,
            # as caller_audio and _on_frame do
            if bridge.has_output() or self.pump_unfinished:
                self.pump(now)
        except Exception:  # see _guard
            log.exception("call.failed", call_id=self.call_id)
            self._fail()

    def _open_turn(self, a: OpenTurn) -> None:
        if self.bridge.agent_active:
            # while a voice agent is on, it speaks every turn, in the session the caller
            # talks to (a turn opened elsewhere would be a second, deaf conversation)
            self.agent_turns.add(a.turn_id)
            self._agent_call("open_turn", a.turn_id, a.settings, self._provider_sink)
            return
        if a.cacheable:
            self.pending_prompts[a.turn_id] = _PendingPrompt(a.settings, a.provider)
            return
        self._speaker(a.provider).open_turn(a.turn_id, a.settings, self._provider_sink)

    def _turn_text(self, a: SendTurnText) -> None:
        if a.turn_id in self.agent_turns:
            self._agent_call("send_text", a.turn_id, a.text)
            return
        pending = self.pending_prompts.get(a.turn_id)
        if pending is not None:
            pending.text.append(a.text)
            return
        for speaker in self.speakers.values():
            speaker.send_text(a.turn_id, a.text)

    def _end_turn(self, a: EndTurn) -> None:
        if a.turn_id in self.agent_turns:
            self._agent_call("end_turn", a.turn_id)
            return
        pending = self.pending_prompts.pop(a.turn_id, None)
        if pending is not None:
            self._speaker(pending.provider).speak(
                a.turn_id, "".join(pending.text), pending.settings, self._provider_sink, True
            )
            return
        for speaker in self.speakers.values():
            speaker.end_turn(a.turn_id)

    def _cancel_turn(self, a: CancelTurn) -> None:
        if self.agent is not None or a.turn_id in self.agent_turns:
            # an agent reply or a text turn it speaks: the engine tells the agent what was
            # played (Kletso ``voice.played``, position from the AgentPlayed just before)
            self._agent_call("cancel", a.turn_id)
            self.agent_turns.discard(a.turn_id)
        self.pending_prompts.pop(a.turn_id, None)
        for speaker in self.speakers.values():
            speaker.cancel(a.turn_id)

    def _agent_call(self, method: str, *args: Any) -> None:
        """An agent turn's call now, or once the agent's session is open (held in order)."""
        if self.agent is None:
            if self.bridge.agent_active:
                self.agent_held.append((method, args))
            return
        getattr(self.agent, method)(*args)

    # ---------------------------------------------------- application

    def _connect_app(self, url: str, now: float) -> None:
        """Dial the application WebSocket; the session buffers events until it is open."""
        self.app = AppSession(
            self.started_info,
            url,
            now,
            fallback_flow=self.route.fallback_flow,
            greeting=self.route.greeting,
        )
        self.app_task = self.loop.create_task(self._run_app(self.app))

    async def _run_app(self, session: AppSession) -> None:
        try:
            ws = await websockets.connect(session.url, open_timeout=5, max_size=1 << 16)
        except (TimeoutError, OSError, websockets.WebSocketException) as e:
            self._guard(session.connect_failed, f"{type(e).__name__}: {e}")
            return
        self.app_ws = ws
        self._guard(lambda now: session.connected(now))
        code, reason = 1006, "connection lost"
        try:
            async for msg in ws:
                if isinstance(msg, str):
                    self._guard(session.receive_text, msg)
                else:
                    self._guard(session.receive_bytes, msg)
            code, reason = ws.close_code or 1000, ws.close_reason or ""
        except websockets.ConnectionClosed as e:
            code, reason = e.code, e.reason
        if not self.finished:
            self._guard(lambda now: session.disconnected(code, reason, now))

    def _pump_app(self, now: float) -> list[cmd.Command]:
        session = self.app
        if session is None:
            return []
        for action in session.actions_to_send():
            if self.app_ws is None:
                continue
            if isinstance(action, SendText):
                self.loop.create_task(self._app_send(action.text))
            elif isinstance(action, CloseConnection):
                self.loop.create_task(self.app_ws.close(action.code, action.reason))
        for event in session.events_received():
            if isinstance(event, AppLost):
                log.warning("app.lost", call_id=self.call_id, reason=event.reason)
                flow = self.config.flow(event.fallback_flow) if event.fallback_flow else None
                self.source = fallback_runner(flow, event.greeting, now, replace=event.mid_call)
                self.source.start(now)
        self.app_timer = self._rearm(self.app_timer, session.next_deadline(), self._on_app_timer)
        return session.commands_to_send()

    async def _app_send(self, text: str) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await self.app_ws.send(text)

    def _on_app_timer(self) -> None:
        self.app_timer = None
        self.armed.pop(self._on_app_timer, None)
        if self.app is not None:
            self._guard(self.app.handle_timer)

    # ------------------------------------------------------- voice agent

    def _start_agent(self, provider: str) -> None:
        async def run() -> None:
            pool = self.runtime.pools.get(provider)
            if pool is None:
                log.error("call.agent_unknown", call_id=self.call_id, provider=provider)
                return
            self.agent = await pool.open_agent(self._provider_sink)
            if self.finished:
                await self.agent.close()
                return
            if self.agent.ready:  # (not: its turns fail to the call as they are made)
                self.agent.start("vad", self.call_id)
            held, self.agent_held = self.agent_held, []
            for method, args in held:
                getattr(self.agent, method)(*args)

        self.agent_task = self.loop.create_task(run())

    # ------------------------------------------------------------ pump

    def pump(self, now: float) -> None:
        """Carry out the bridge's actions, route its events, run the turn source."""
        self.pump_unfinished = True
        for _ in range(64):  # commands produce events produce commands: bounded
            actions = self.bridge.actions_to_send()
            events = self.bridge.events_received()
            for action in actions:
                self._do(action)
            for event in events:
                self._on_event(event, now)
            # the app first: losing it installs the fallback source, whose
            # first commands must run in this same pump
            commands = self._pump_app(now)
            if self.source is not None:
                commands += self.source.commands_to_send()
            for command in commands:
                self._execute(command, now)
            if not (actions or events or commands):
                self.pump_unfinished = False
                break
        self._arm_source_timer()
        self.bridge_timer = self._rearm(
            self.bridge_timer, self.bridge.next_deadline(), self._on_bridge_timer
        )

    def _do(self, a: object) -> None:
        if isinstance(a, OpenTurn):
            self._open_turn(a)
        elif isinstance(a, SendTurnText):
            self._turn_text(a)
        elif isinstance(a, EndTurn):
            self._end_turn(a)
        elif isinstance(a, CancelTurn):
            self._cancel_turn(a)
        elif isinstance(a, SendMark):
            self.leg.send_mark(a.name)
        elif isinstance(a, ClearLeg):
            self.leg.clear()
            self.bridge.underruns.carrier_cleared()  # the carrier drops what it holds
        elif isinstance(a, HangupLeg):
            if self.leg.kind == "sip" and a.reason not in ("internal_error", "shutdown"):
                # a frame sent is not yet a frame played: the phone's jitter buffer
                # still holds the last words ("Goodbye") when the last packet leaves
                self.tail_pending = True
                self.loop.call_later(HANGUP_TAIL_S, self._hangup_now, a.reason)
            else:
                self._hangup_now(a.reason)
        elif isinstance(a, AnswerLeg):
            if self.on_early_media is not None:
                self.on_early_media(a)
        elif isinstance(a, RejectLeg):
            if self.leg.kind == "sip":  # the phone plays what it holds, as for a hangup
                self.tail_pending = True
                self.loop.call_later(HANGUP_TAIL_S, self._reject_now, a)
            else:
                self._reject_now(a)
        elif isinstance(a, TransferLeg):
            self.leg.transfer(a.target, a.trunk)
        elif isinstance(a, SendLegDtmf):
            self.leg.send_dtmf(a.digits)
        elif isinstance(a, StartAgent):
            self._start_agent(a.provider)
        elif isinstance(a, StopAgent):
            if self.agent is not None:
                self.agent.stop("user")
        elif isinstance(a, SendAgentAudio):
            if self.agent is not None and self.agent.ready:
                self.agent.send_audio(a.pcm)
        elif isinstance(a, AgentPlayed):
            if self.agent is not None:
                # the agent engine sends voice.played on its own 500 ms timer and on cancel
                self.agent.set_played_position(a.item_id, a.ms)
        elif isinstance(a, ConnectApp):
            self.source = None  # the flow handed over; the application drives from here
            self._connect_app(a.url, self.loop.time())
        else:
            log.warning("call.unknown_action", call_id=self.call_id, action=type(a).__name__)

    def _hangup_now(self, reason: str) -> None:
        self.tail_pending = False
        if not self.finished:
            self.leg.hangup(reason)
            self.finish(reason)

    def _reject_now(self, a: RejectLeg) -> None:
        self.tail_pending = False
        if not self.finished:
            self.final_status = a.status
            if self.on_early_media is not None:
                self.on_early_media(a)
            self.leg_ended("rejected")  # call.ended (rejected) to the app, then finish

    def _on_event(self, event: cmd.CallEvent, now: float) -> None:
        m = self.services.metrics
        if self.source is not None:
            self.source.handle_event(event, now)
        if self.app is not None:
            self.app.handle_event(event, now)
        if isinstance(event, cmd.TurnInterrupted):
            if event.reason in ("speech", "dtmf"):
                m.bargeins_total.labels(event.reason).inc()
            outcome = "provider_error" if event.reason == "provider_error" else "interrupted"
            m.turns_total.labels(self._route_providers, outcome).inc()
            log.info(
                "turn.interrupted",
                call_id=self.call_id,
                turn_id=event.turn_id,
                heard_ms=event.heard_ms,
                heard_text=event.heard_text,
                reason=event.reason,
            )
        elif isinstance(event, cmd.TurnFinished):
            m.turns_total.labels(self._route_providers, "finished").inc()
            log.info("turn.finished", call_id=self.call_id, turn_id=event.turn_id)
        elif isinstance(event, cmd.DtmfHeard):
            log.info("call.dtmf", call_id=self.call_id, digit=event.digit)
        elif isinstance(event, cmd.ProviderErrored):
            kind = bounded_label(event.kind, PROVIDER_ERROR_KINDS)
            m.provider_errors_total.labels(self._provider_label(event.provider), kind).inc()
            log.warning(
                "provider.error", call_id=self.call_id, turn_id=event.turn_id, kind=event.kind
            )
        elif isinstance(event, cmd.CallEnded) and not self.tail_pending:
            self.finish(event.reason)  # (with a hangup tail pending, the tail finishes)

    def _arm_source_timer(self) -> None:
        deadline = self.source.next_deadline() if self.source else None
        self.source_timer = self._rearm(self.source_timer, deadline, self._on_source_timer)

    def _rearm(
        self,
        handle: asyncio.TimerHandle | None,
        deadline: float | None,
        callback: Callable[[], None],
    ) -> asyncio.TimerHandle | None:
        """One timer at ``deadline``; kept as it is when the deadline did not move.

        ``pump`` runs on every 20 ms tick, so re-creating an unchanged timer
        each time would be churn on the per-call hot path.
        """
        if deadline is not None and self.armed.get(callback) == deadline and handle is not None:
            return handle
        if handle is not None:
            handle.cancel()
        self.armed.pop(callback, None)
        if deadline is None or self.finished:
            return None
        self.armed[callback] = deadline
        return self.loop.call_at(deadline, callback)

    def _on_bridge_timer(self) -> None:
        self.bridge_timer = None
        self.armed.pop(self._on_bridge_timer, None)
        self._guard(self.bridge.handle_timer)

    def _on_source_timer(self) -> None:
        self.source_timer = None
        self.armed.pop(self._on_source_timer, None)
        if self.source is not None:
            self._guard(self.source.handle_timer)

    # ----------------------------------------------------------- finish

    def finish(self, reason: str) -> None:
        """Release everything this call holds; idempotent."""
        if self.finished:
            return
        self.finished = True
        self.end_reason = self.end_reason or reason
        if self.runtime is not None:
            self.runtime.calls -= 1
            if self.runtime is not self.services.runtime:
                self.services.generation_idle()
        self.ticker.remove(self.call_id)
        if self.source_timer is not None:
            self.source_timer.cancel()
        if self.bridge_timer is not None:
            self.bridge_timer.cancel()
        for speaker in self.speakers.values():
            for turn_id in list(speaker.turns):
                speaker.cancel(turn_id)
        if self.agent is not None:
            self.loop.create_task(self.agent.close())
        elif self.agent_task is not None:
            self.agent_task.cancel()
        if self.app_timer is not None:
            self.app_timer.cancel()
        if self.app is not None:
            self._pump_app(self.loop.time())  # call.ended goes out, then the close
            if self.app_ws is not None:
                self.loop.call_later(1.0, lambda: self.loop.create_task(self.app_ws.close()))
            elif self.app_task is not None:
                self.app_task.cancel()
        m = self.services.metrics
        m.calls_active.labels(self.leg.kind, self.route.match).dec()
        outcome = bounded_label(self.end_reason, CALL_OUTCOMES)
        m.calls_total.labels(self.leg.kind, self.route.match, outcome).inc()
        self._log_cdr()
        self.services.release_watch.ended(self.call_id, self.canary, self.loop.time())
        if self.on_finished is not None:
            self.on_finished(self)

    @property
    def _route_providers(self) -> str:
        """The route's provider chain, as the turn metrics label it (names from the config)."""
        return ",".join(self.route.provider)

    def _provider_label(self, provider: str) -> str:
        """A configured provider's name, or ``?`` (never a name from the wire)."""
        cfg = self.services.call_config()
        return provider if any(p.name == provider for p in cfg.providers) else "?"

    def _log_cdr(self) -> None:
        s = self.bridge.stats()
        m = self.services.metrics
        for v in s.time_to_first_audio_s:
            m.time_to_first_audio_seconds.labels(self._route_providers).observe(v)
        for v in s.added_latency_s:
            m.added_latency_seconds.labels(self.leg.kind).observe(v)
        for t in s.bargein_timings:
            if t.last_frame_s is not None:
                m.bargein_latency_seconds.observe(max(0.0, t.last_frame_s - t.decided_s))
        m.underruns_total.inc(s.underruns)
        m.underruns_provider_total.inc(s.underruns_provider)
        clock = self.clock.stats()
        log.info(
            "call.ended",
            call_id=self.call_id,
            reason=self.end_reason,
            duration_s=round(self.loop.time() - self.started_at, 3),
            turns=s.turns,
            turns_interrupted=s.turns_interrupted,
            barge_ins=s.barge_ins,
            time_to_first_audio_ms=[round(v * 1000, 1) for v in s.time_to_first_audio_s],
            added_latency_ms=[round(v * 1000, 2) for v in s.added_latency_s],
            underruns=s.underruns,
            underruns_provider=s.underruns_provider,
            underruns_provider_busy=self.bridge.underruns.provider_busy,
            dry_covered=self.bridge.underruns.covered,
            provider_errors=s.provider_errors,
            frames_sent=s.frames_sent,
            text_unsent_chars=s.text_chars_unsent,
            late_wakeups=clock.late_wakeups,
            **({} if self.final_status is None else {"final_status": self.final_status}),
            cdr=True,
        )

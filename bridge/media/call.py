"""The per-call bridge: one caller leg, its turns, playout and barge-in.

Theory of operation
-------------------
``CallBridge`` is the sans-I/O core of one call. It does not know which SIP
stack, carrier or TTS vendor it talks to: the shell feeds it caller frames,
provider events and turn-source commands, ticks it once per 20 ms frame, and
carries out the actions it queues.

Inputs (every ``now`` is the loop's monotonic time; nothing here reads a clock):

* ``caller_audio(frame, now)``: one 20 ms inbound frame in the leg codec
  (s16le little-endian for linear legs: L16 byte swapping is the leg's job).
  Decoded, analysed by webrtcvad and the level meter, fed to the
  ``BargeInDetector``; with a voice agent active it also goes up to the agent
  (``SendAgentAudio``, s16le at 24 kHz in 40-60 ms pieces). A leg with a
  jitter buffer splits the two: ``caller_speech(frame, now)`` (the detector
  only) with each frame as it arrives, ``caller_playout(frame, now)`` (the
  agent only) with the buffer's in-order, concealed stream, so barge-in does
  not wait for the buffer's playout delay.
* ``caller_dtmf(digit, now)``: ``DtmfHeard``; an immediate barge-in trigger
  when the policy says so.
* ``mark_echoed(name, cleared, now)``: a media-stream carrier echoed a mark
  (``cleared``: the stream engine knows the echo was caused by a ``clear``).
* ``tick(now) -> bytes | None``: once per 20 ms deadline of this call's media
  clock. Returns exactly one frame in the leg codec, or ``None`` (RTP legs
  send comfort silence keeping timestamps continuous; WS legs send nothing).
* ``provider_event(event, now)``: every event of ``bridge.providers.base`` (and
  Kletso's ``VoiceInterrupted``/``VoiceEnded``/``VoiceFailed``) for this call.
* ``execute(command, now)``: ``Say``, ``Cancel``, ``Hangup``, ``Transfer``,
  ``SendDtmf``, ``HandOver``, ``Answer``, ``Reject`` from the turn source.
* ``early_media(then, now)`` / ``early_media_expired(now)``: the leg is in
  early media; the turn source's ``Answer``/``Reject`` ends it (``AnswerLeg`` /
  ``RejectLeg``), else the first turn's end or the cap does (``then``), once.
* ``barge_in(reason, now)``: stop the bot now (also run internally).
* ``hangup_received(reason, now)`` / ``leg_ended(now)``: the call is over.
* ``handle_timer(now)`` at ``next_deadline()`` (the agent's played-position
  timer; ``tick`` runs due timers too, so a ticked call needs no other timer).

Calling contract: after *every* call above, send the frame ``tick`` returned
(if any) *first*, then drain ``actions_to_send()`` (a ``SendMark`` queued by
a tick belongs right after that tick's frame) and ``events_received()``.

Actions (``bridge.media.call_types``): ``OpenTurn``, ``SendTurnText``,
``EndTurn``, ``CancelTurn`` for the Speaker; ``ClearLeg``, ``SendMark``,
``HangupLeg``, ``TransferLeg``, ``SendLegDtmf``, ``AnswerLeg``, ``RejectLeg``
for the leg; ``StartAgent``, ``StopAgent``, ``SendAgentAudio``, ``AgentPlayed`` (send Kletso
``voice.played`` now with this position) for the voice agent; ``ConnectApp``.

Events (``bridge.commands``): ``DtmfHeard``, ``SpeechStarted``
(``at_s`` = onset of the caller's speech), ``SpeechStopped`` (``at_s`` = last
speech frame), ``TurnBegan``, ``TurnFinished``, ``TurnInterrupted``,
``ProviderErrored``, ``CallEnded``; plus ``CommandRejected`` and
``AgentEnded`` from ``call_types``.

Turns. A ``Say`` for a new turn id opens a turn: it is queued in the
``PlayoutQueue`` at once (behind the current turns, or replacing them) and
``OpenTurn`` + ``SendTurnText`` (+ ``EndTurn`` when ``final``) go to the
Speaker. The text goes a sentence at a time, ``text_ahead_s`` ahead of playout
(``bridge.media.text_pacing``; ``next_deadline``/``handle_timer`` release it),
so a long turn is not held whole as audio and text cut by a barge-in is never
sent; a cacheable turn, or ``text_ahead_s = 0``, sends it as it comes. The
settings ask for the leg's own format (mu-law/A-law at 8 kHz on G.711 legs) so
a provider that honours it is passed through untouched; audio in any other
format is transcoded. A turn's first chunk is transcoded and cut into 20 ms
frames at once (added latency); later chunks are kept as they came and
transcoded on demand (``_feed``): when audio arrives, and after each tick once
its frame has left (``feed``, when ``feed_due``: the shell calls it, so the
work does not delay other calls' frames), pieces of ``decode_piece_ms`` are
transcoded until ``decode_ahead_frames`` frames are ready along the playing
order; a tick or ``frame_ready`` finding the head turn with no frame at all
transcodes at once. A provider that sends a turn faster than real time
therefore costs no loop time at arrival, and the call holds its compact audio,
not frames; beyond ``max_undecoded_ms`` per turn the oldest is transcoded at
arrival. The output is the same however the work is split (streaming
resampler, frame cutter). ``TurnDone`` flushes the framer (last frame padded
with silence) once the pending audio is transcoded and ends the turn. A turn about to run
dry while its audio is inside the resampler (soxr releases output in
blocks) gets it at once (``_release_head``). ``TurnFailed`` (or a
``ProviderFailed`` naming the turn) emits ``ProviderErrored`` and ends the
turn with what it had. A voice agent's replies are turns too: they open on
``TurnStarted`` while the agent is active (Kletso sends it before any audio).

Per-turn phases::

    QUEUED --first frame popped (TurnBegan)--> SOUNDING --last frame popped--+
      |                                           |                          |
      |   frames leg: report now; marks leg: AWAITING_MARK --final mark echo-+--> DONE
      +------------- barge-in / cancel / replace / hangup / provider error ------> DONE

DONE means reported, exactly once: ``TurnFinished`` (played to its end) or
``TurnInterrupted`` (barge-in reasons ``speech``/``dtmf``/the caller's,
``cancelled``, ``replaced``, ``provider_error``, ``agent_interrupted``,
``call_ended``).

Heard position. ``frames`` legs (RTP): a frame popped is a frame heard.
``marks`` legs: marks go out at every ``mark_interval_ms`` inside a turn and
after its last frame, and only echoed marks move the heard position. A cut
that sends ``ClearLeg`` voids every mark in flight (``carrier_cleared``), so
the echoes ``clear`` provokes never count, and a turn whose final mark it
voided is reported as cut too (its tail may have been in the carrier's
buffer); a cut that cannot clear reports everything sent as heard (the
carrier will play it). ``heard_text`` is the
words whose ``end_s`` is at most the heard position.

Barge-in (``barge_in``) is one function: the playout queue drops every queued
frame of the interruptible turns (the next tick already sends none of them),
``ClearLeg`` goes out when the leg can clear and no non-interruptible turn is
sounding, ``CancelTurn`` goes out for every cut turn (the Speaker runs the
provider's own cancel; for a finished provider turn it is a no-op), agent
turns also get ``AgentPlayed`` with the heard position, and each cut turn is
reported. Late audio for a cut turn is dropped before it is transcoded. The
detector is armed only while an interruptible turn is sounding, so caller
speech over a non-interruptible prompt interrupts nothing (it re-arms when
the next turn starts).

Figures (``stats()``): turns, underruns, barge-ins by reason with their
timings (caller onset, decision, last frame of the cut audio), time to first
audio per turn (``OpenTurn`` to the first ``AudioReceived``), added latency
per turn (first ``AudioReceived`` to the first frame ``tick`` returned, for
turns at the head of the queue when their audio arrived) and dropped late
audio.

Rules that keep this module honest:

1. Bad remote input never raises: a bad command is ``CommandRejected``, a
   bad provider format is a provider error for that turn, unknown mark
   echoes and late audio are dropped and counted.
2. One frame per ``tick``; nothing is ever sent outside a tick.
3. Every turn is reported exactly once.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from bridge import commands as cmd
from bridge.engine import Action, Event, LocalProtocolError
from bridge.media import bargein
from bridge.media.bargein import BargeInDetector, BargeInPolicy
from bridge.media.call_audio import (
    AgentUplink,
    check_format,
    leg_decoder,
    leg_level,
    make_framer,
)
from bridge.media.call_turns import (
    AWAITING_MARK,
    DONE,
    QUEUED,
    SOUNDING,
    CallTurn,
    TurnBook,
    TurnStop,
    heard_text,
)
from bridge.media.call_types import (
    AgentEnded,
    AgentPlayed,
    AnswerLeg,
    BargeInTiming,
    CallOptions,
    CallStats,
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
from bridge.media.echo import EchoCorrelator
from bridge.media.playout import (
    MarkReached,
    PlayoutConfig,
    PlayoutQueue,
    TurnCut,
    TurnPlaybackStarted,
    TurnPlayed,
)
from bridge.media.text_pacing import TextPacer
from bridge.media.underrun import Underruns
from bridge.media.vad import Vad
from bridge.providers.base import (
    AudioFormat,
    AudioReceived,
    ProviderFailed,
    QueueDepthChanged,
    TurnDone,
    TurnFailed,
    TurnSettings,
    TurnStarted,
    VoiceEnded,
    VoiceFailed,
    VoiceInterrupted,
    WordsTimed,
)
from bridge.providers.prompts import TurnFellBack
from telcodec import g711

__all__ = ["CallBridge"]

DTMF_DIGITS = frozenset("0123456789*#ABCD")
MAX_WORDS_PER_TURN = 10_000
"""Security limit on word timings kept for one turn."""
MAX_MARKS_TRACKED = 256
"""Marks sent and not yet echoed that the call remembers (oldest forgotten first)."""


class CallBridge:
    """One call's media bridge (see the module docstring for the contract).

    Args:
        call_id: the call's id (for the shell's bookkeeping and logs).
        leg: what the caller leg is and can do.
        policy: barge-in thresholds (``None``: the defaults).
        now: loop time at which the call starts.
        options: other tunables (``None``: the defaults).

    Raises:
        ValueError: bad options (a config error, not remote input).
    """

    # Slots, the per-frame ones first (they share the object's first cache
    # lines: a call's tick and caller frame find it cold among many calls).
    __slots__ = (  # noqa: RUF023 (in the order of use, not sorted)
        "_ended",
        "_frame_bytes",
        "_decode_native",
        "_decode",
        "_vad",
        "_echo",
        "_detector",
        "_uplink",
        "_playout",
        "_backlog",
        "_decode_ahead",
        "_frames_sent",
        "underruns",
        "_sending",
        "_armed",
        "_agent_played_at",
        "_actions",
        "_events",
        # the rest
        "_added_s",
        "_agent",
        "_bad_inbound",
        "_barge_ins",
        "_early_end",
        "_echo_frames",
        "_finished",
        "_hangup_reason",
        "_interrupted",
        "_last_agent_turn",
        "_late_chunks",
        "_leg",
        "_mark_every_frames",
        "_mark_seq",
        "_marks",
        "_marks_leg",
        "_options",
        "_provider_errors",
        "_started_s",
        "_text_due_s",
        "_text_turns",
        "_text_unsent",
        "_timings",
        "_ttfa_s",
        "_turn_count",
        "_turns",
        "call_id",
        "__weakref__",  # a call is watched by weak reference (tests/e2e/test_call_release.py)
    )

    def __init__(
        self,
        call_id: str,
        leg: LegProfile,
        policy: BargeInPolicy | None,
        now: float,
        *,
        options: CallOptions | None = None,
    ) -> None:
        self.call_id = call_id
        self._leg = leg
        self._options = options or CallOptions()
        self._started_s = now
        self._actions: list[Action] = []
        self._events: list[cmd.CallEvent] = []
        self._playout = PlayoutQueue(
            PlayoutConfig(
                samples_per_frame=leg.samples_per_frame,
                sample_rate_hz=leg.sample_rate_hz,
                max_queued_frames=self._options.max_queued_frames,
                max_turn_history=max(1, self._options.max_turn_history // 2),
            )
        )
        # Outbound frames go to the detector and the correlator as sent: their
        # level is computed, and they are decoded, only when an inbound frame
        # needs them (caller speech), not on every tick. With the correlator,
        # its ring is the detector's echo-guard window too (one store per tick).
        threshold = (policy or BargeInPolicy()).echo_correlation
        self._echo = (
            EchoCorrelator(
                leg.sample_rate_hz,
                leg.samples_per_frame,
                threshold=threshold,
                outbound_codec=leg.codec,
            )
            if threshold > 0
            else None
        )
        self._detector = BargeInDetector(
            policy,
            frame_level=leg_level(leg.codec),
            bot_frames=None if self._echo is None else self._echo.bot_frames,
        )
        if self._echo is not None:
            self._echo.share_window(self._detector.echo_window_s, self._detector.spill_sink())
        self._echo_frames = 0
        self._vad = Vad(self._detector.policy.vad_aggressiveness, leg.sample_rate_hz, 20)
        self._decode = leg_decoder(leg.codec)
        self._decode_native = g711.native_decoder(leg.codec)  # the same, one call less
        self._frame_bytes = leg.frame_bytes
        self._marks_leg = leg.heard_from == "marks"
        self._mark_every_frames = leg.mark_interval_ms // 20
        self._turns = TurnBook(self._options.max_turn_history)
        self._marks: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._mark_seq = 0
        self._agent: str | None = None
        self._uplink: AgentUplink | None = None
        self._agent_played_at: float | None = None
        self._last_agent_turn: str | None = None
        self._ended = False
        self._hangup_reason: str | None = None
        self._early_end: AnswerLeg | RejectLeg | None = None
        """In early media: how it ends unless the turn source decides first."""
        keep = self._options.max_samples_kept
        self._ttfa_s: deque[float] = deque(maxlen=keep)
        self._added_s: deque[float] = deque(maxlen=keep)
        self._timings: deque[BargeInTiming] = deque(maxlen=keep)
        self._barge_ins: dict[str, int] = {}
        self._turn_count = 0
        self._finished = 0
        self._interrupted = 0
        self._late_chunks = 0
        self._provider_errors = 0
        self._frames_sent = 0
        self.underruns = Underruns()
        """Whose underruns (``bridge.media.underrun``): ``tick`` tells it of each dry
        tick; the shell tells it what the carrier held and what waited unread."""
        self._bad_inbound = 0
        self._backlog: dict[str, CallTurn] = {}
        """Turns holding provider audio not transcoded yet (see ``_feed``)."""
        self._sending: CallTurn | None = None
        """The turn of the last frame sent (``tick`` looks a turn up once, not per frame)."""
        self._decode_ahead = self._options.decode_ahead_frames
        self._armed = False
        """What the detector was last told by ``set_bot_speaking`` (told again on a change only)."""
        self._text_turns: dict[str, CallTurn] = {}
        """Turns holding text not sent to the provider yet (``TextPacer``)."""
        self._text_due_s: float | None = None
        """When the held text is next looked at (``_release_text``)."""
        self._text_unsent = 0
        aheads = [v for _, v in self._options.provider_text_ahead_s]
        if min([self._options.text_ahead_s, *aheads]) < 0:
            raise ValueError("text_ahead_s must be >= 0")

    # ------------------------------------------------------------ outbox

    def has_output(self) -> bool:
        """Whether ``actions_to_send`` or ``events_received`` has anything (allocates nothing)."""
        return bool(self._actions) or bool(self._events)

    def actions_to_send(self) -> list[Action]:
        """Drain the actions queued since the last call (after the tick's frame)."""
        actions, self._actions = self._actions, []
        return actions

    def events_received(self) -> list[cmd.CallEvent]:
        """Drain the call events queued since the last call."""
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------ queries

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def agent_active(self) -> bool:
        return self._agent is not None

    @property
    def undecoded_bytes(self) -> int:
        """Provider audio held as it arrived, not transcoded yet (all turns)."""
        return sum(turn.pending_bytes for turn in self._backlog.values())

    @property
    def queued_frames(self) -> int:
        """Leg frames transcoded and waiting for their tick (all turns)."""
        return self._playout.stats().queued_frames

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` is due (the agent's played-position report, held turn
        text to look at), if ever. ``tick`` runs the agent's timer too, not the text's:
        the shell arms a timer for this."""
        agent, text = self._agent_played_at, self._text_due_s
        if agent is None or (text is not None and text < agent):
            return text
        return agent

    def stats(self) -> CallStats:
        """A snapshot of the counters (metrics and the end-of-call summary)."""
        playout = self._playout.stats()
        return CallStats(
            turns=self._turn_count,
            turns_finished=self._finished,
            turns_interrupted=self._interrupted,
            underruns=self.underruns.heard,
            underruns_provider=self.underruns.provider,
            barge_ins=dict(self._barge_ins),
            bargein_timings=tuple(self._timings),
            time_to_first_audio_s=tuple(self._ttfa_s),
            added_latency_s=tuple(self._added_s),
            late_chunks_dropped=self._late_chunks,
            late_frames_dropped=playout.stale_frames_dropped,
            overflow_frames_dropped=playout.overflow_frames_dropped,
            provider_errors=self._provider_errors,
            frames_sent=self._frames_sent,
            bad_inbound_frames=self._bad_inbound,
            text_chars_unsent=self._text_unsent,
        )

    # ------------------------------------------------------------ leg input

    def caller_audio(self, frame: bytes, now: float) -> None:
        """One 20 ms inbound frame in the leg codec; a frame of the wrong size is ignored."""
        self.caller_speech(frame, now)
        if self._uplink is not None and not self._ended and len(frame) == self._frame_bytes:
            for piece in self._uplink.push(frame):
                self._actions.append(SendAgentAudio(piece))

    @property
    def takes_playout(self) -> bool:
        """Whether ``caller_playout`` has a taker now (a voice agent's uplink)."""
        return self._uplink is not None

    def caller_playout(self, frame: bytes, now: float) -> None:
        """One 20 ms inbound frame in playout order (after the leg's jitter buffer, lost
        frames concealed): only the voice agent's uplink takes it. See ``caller_speech``."""
        if self._uplink is None or self._ended or len(frame) != self._frame_bytes:
            return
        for piece in self._uplink.push(frame):
            self._actions.append(SendAgentAudio(piece))

    def caller_speech(self, frame: bytes, now: float) -> None:
        """One 20 ms inbound frame as it arrived, for the VAD, the echo check and the
        barge-in detector only (``caller_audio`` without the agent's uplink): a leg with
        a jitter buffer feeds it each frame on arrival and ``caller_playout`` later."""
        if self._ended:
            return
        if len(frame) != self._frame_bytes:
            self._bad_inbound += 1
            return
        native = self._decode_native
        if native is not None:
            pcm = native(frame, 2)  # decoded once, shared below
        else:
            decode = self._decode
            pcm = frame if decode is None else decode(frame)
        is_speech, level_dbfs = self._vad.speech_and_level(pcm)
        if is_speech and self._echo is not None and self._echo.is_echo(pcm):
            is_speech = False  # the bot's own voice coming back, not the caller
            self._echo_frames += 1
        detector = self._detector
        trigger = detector.observe(is_speech, level_dbfs, now)
        if detector.has_events():  # only when speech starts or stops
            self._drain_detector()
        if trigger is not None:
            self._barge_in(trigger.reason, now, trigger.onset_s)
        # Every public method leaves the playout queue drained (``_pump``): only
        # a barge-in can have queued playout events (its cuts) here.
        if trigger is not None and self._playout.has_events():
            self._pump(now)

    def caller_dtmf(self, digit: str, now: float) -> None:
        """A DTMF digit from the caller (RFC 4733 or the carrier's DTMF message)."""
        if self._ended or digit not in DTMF_DIGITS:
            return
        self._events.append(cmd.DtmfHeard(digit))
        trigger = self._detector.dtmf(digit, now)
        if trigger is not None:
            self._barge_in(trigger.reason, now, trigger.onset_s)
        self._pump(now)

    def mark_echoed(self, name: str, cleared: bool, now: float) -> None:
        """The carrier echoed a mark; echoes caused by a ``clear`` never count as heard."""
        if self._ended:
            return
        entry = self._marks.pop(name, None)
        if cleared or not self._playout.acknowledge_mark(name) or entry is None:
            return
        turn_id, final = entry
        turn = self._turns.get(turn_id)
        if turn is not None:
            turn.play_anchor = (now, self._positions(turn)[1])
        head = self._head_turn()
        if final and head is not None and head is not turn and head.play_anchor is None:
            head.play_anchor = (now, 0)  # the earlier turn ended at the carrier: this one starts
        if final and turn is not None and turn.phase is AWAITING_MARK:
            self._report(turn, self._heard_samples(turn))
        self._pump(now)

    def frame_ready(self) -> bool:
        """Whether the next ``tick`` has a frame to send.

        The shell asks after provider audio arrives: when the leg is idle
        (the last tick sent none) and a frame is now ready, it re-phases the
        call's media clock so the turn's first frame leaves at once instead of
        at the next grid slot (``MediaClock.start_talkspurt``).
        """
        if self._ended:
            return False
        playout = self._playout
        if self._backlog and not playout.head_frames():
            self._feed()  # audio waits untranscoded: ready once transcoded
        return playout.has_frame()

    def feed_due(self) -> bool:
        """Whether ``feed`` has work: the head turn has fewer than ``decode_ahead_frames``
        frames ready and provider audio waits untranscoded. Asked after each ``tick``."""
        return bool(self._backlog) and self._playout.head_frames() < self._decode_ahead

    def feed(self, now: float) -> None:
        """Transcode waiting provider audio until ``decode_ahead_frames`` frames are ready.

        The look-ahead half of on-demand transcoding. ``tick`` transcodes only
        when the head turn has no frame at all; the shell calls this once the
        tick's frame has left (``feed_due``), so a piece's transcoding (about
        0.1 ms with cold caches) does not hold up the frames of the other calls
        due in the same wake-up.
        """
        if self._backlog and not self._ended:
            self._feed()

    def tick(self, now: float) -> bytes | None:
        """The frame to send at this 20 ms deadline, or ``None`` (silence / nothing)."""
        if self._ended:
            return None
        playout = self._playout
        if self._backlog and not playout.head_frames():
            self._feed()  # a frame is due now; the look-ahead waits for ``feed`` (after the send)
        head_id = playout.current_turn_id
        dry = -1
        if head_id is not None and not playout.head_frames():
            self._release_head(head_id)
            if not playout.head_frames():
                dry = playout.underruns

        payload = playout.pop_payload(now)
        if dry >= 0 and playout.underruns != dry and head_id is not None:
            self._dry(head_id)
        if playout.has_events():
            self._pump(now)
        armed: bool | None = None
        if payload is not None:
            self._frames_sent += 1
            turn = self._sending
            turn_id = playout.popped_turn_id
            if turn is None or turn.turn_id != turn_id:  # a new turn: look it up once
                turn = self._sending = self._turns.get(turn_id or "")
            if turn is not None:
                turn.last_frame_s = now
                # A turn still SOUNDING once the tick's playout events are handled
                # is the head of the queue (leaving it, by its end or a cut, moves
                # it on at once): ``_interruptible_sounding`` without the lookups.
                if turn.interruptible and turn.phase is SOUNDING:
                    armed = True
            if self._echo is None:
                self._detector.record_bot_frame(payload, now)
        if self._echo is not None:
            self._echo.push_outbound(payload, now)  # the detector's window too
        if armed is None:
            armed = self._interruptible_sounding()
        if armed is not self._armed:  # telling it the same again changes nothing
            self._armed = armed
            self._detector.set_bot_speaking(armed)
        if self._agent_played_at is not None:
            self._run_timers(now)
        return payload

    def handle_timer(self, now: float) -> None:
        """Run the timers due at ``now`` (``tick`` runs the agent's too, not the text's)."""
        if not self._ended:
            self._run_timers(now)

    def hangup_received(self, reason: str, now: float) -> None:
        """The far end hung up (SIP BYE, stream ``stop``)."""
        self._end(reason, now)

    def leg_ended(self, now: float) -> None:
        """The leg is gone (after our ``HangupLeg``, or the transport closed)."""
        self._end(self._hangup_reason or "leg_ended", now)

    # ------------------------------------------------------------ early media

    def early_media(self, then: AnswerLeg | RejectLeg, now: float) -> None:
        """The leg is in early media (SIP 183 with SDP sent, no final response yet).

        It ends once, by whichever comes first: the turn source's ``Answer`` or
        ``Reject`` (``AnswerLeg``/``RejectLeg`` now), the end of the call's first turn
        or ``early_media_expired`` (``then``: the route's rule). ``Answer`` and
        ``Reject`` outside early media are rejected (``not_early_media``).
        """
        if not self._ended:
            self._early_end = then

    @property
    def in_early_media(self) -> bool:
        return self._early_end is not None

    def early_media_expired(self, now: float) -> None:
        """The leg's early media reached its cap: the route's rule ends it now."""
        self._end_early_media(None)

    def _end_early_media(self, decided: AnswerLeg | RejectLeg | None) -> None:
        """End early media with ``decided`` (the turn source's) or the route's rule."""
        action = decided or self._early_end
        self._early_end = None
        if action is None or self._ended:
            return
        if isinstance(action, RejectLeg):
            self._hangup_reason = "rejected"
        self._actions.append(action)

    # ------------------------------------------------------------ barge-in

    def barge_in(self, reason: str, now: float) -> list[str]:
        """Stop every interruptible turn now; return the ids of the turns reported.

        Non-interruptible turns keep playing. See the module docstring.
        """
        if self._ended:
            return []
        stopped = self._barge_in(reason, now, now)
        self._pump(now)
        return stopped

    def _barge_in(self, reason: str, now: float, onset_s: float) -> list[str]:
        cuts = self._playout.barge_in(now)
        stops = self._stops_from_cuts(cuts)
        stops += self._awaiting_stops(interruptible_only=True)
        if not stops:
            return []
        last_frames = [s.turn.last_frame_s for s in stops if s.turn.last_frame_s is not None]
        self._barge_ins[reason] = self._barge_ins.get(reason, 0) + 1
        self._timings.append(
            BargeInTiming(reason, onset_s, now, max(last_frames) if last_frames else None)
        )
        self._armed = False
        self._detector.set_bot_speaking(False)
        return self._stop(stops, reason, now)

    def _stops_from_cuts(self, cuts: list[TurnCut]) -> list[TurnStop]:
        stops = []
        for cut in cuts:
            turn = self._turns.get(cut.turn_id)
            if turn is not None:
                stops.append(TurnStop(turn, cut.played_samples, cut.heard_samples, True))
        return stops

    def _awaiting_stops(self, interruptible_only: bool) -> list[TurnStop]:
        return [
            TurnStop(turn, *self._positions(turn), cancel_provider=False)
            for turn in self._turns.take_awaiting(interruptible_only)
        ]

    def _stop(self, stops: list[TurnStop], reason: str, now: float) -> list[str]:
        """Clear the carrier if it helps, cancel providers, report each turn."""
        sounding = any(s.played_samples > s.heard_samples for s in stops)
        cleared = False
        if self._leg.can_clear and sounding and not self._protected_sounding():
            self._actions.append(ClearLeg())
            for name in self._playout.carrier_cleared():
                self._marks.pop(name, None)
            cleared = True
            # A turn whose final mark the clear voided can never finish: it was cut too.
            stops += self._awaiting_stops(interruptible_only=False)
        for stop in stops:
            turn = stop.turn
            turn.audio_open = turn.text_open = False
            self._drop_pending(turn)
            if turn.framer is not None:
                turn.framer.reset()
                turn.framer = None
            if not self._marks_leg or not cleared:
                heard = stop.played_samples
            else:
                heard = self._heard_at_clear(turn, stop, now)
            if turn.agent or self._agent is not None:  # (a text turn the agent speaks too)
                self._actions.append(AgentPlayed(turn.item_id, self._ms(heard)))
            if stop.cancel_provider:
                self._actions.append(CancelTurn(turn.turn_id))
            turn.end_reason = reason
            self._report(turn, heard)
        return [s.turn.turn_id for s in stops]

    def _protected_sounding(self) -> bool:
        """Whether a non-interruptible turn has audio at the carrier (a clear would cut it)."""
        head = self._head_turn()
        if head is not None and not head.interruptible and head.phase is SOUNDING:
            return True
        return self._turns.any_awaiting(interruptible=False)

    # ------------------------------------------------------------ commands

    def execute(self, command: cmd.Command, now: float) -> None:
        """Carry out a turn-source command; a command that cannot be done is rejected."""
        if self._ended:
            self._reject(command, "", "call_ended")
            return
        match command:
            case cmd.Say():
                self._say(command, now)
            case cmd.Cancel(turn_id=turn_id):
                self._cancel(turn_id, now)
            case cmd.Hangup(reason=reason):
                self._hangup_reason = reason
                self._early_end = None  # in early media the hangup decides (SIP: 480)
                self._actions.append(HangupLeg(reason))
            case cmd.Transfer(target=target, trunk=trunk):
                if not self._leg.can_transfer:
                    self._reject(command, "", "transfer_unsupported")
                elif not target:
                    self._reject(command, "", "empty_target")
                elif trunk and trunk not in self._options.trunks:
                    self._reject(command, "", "unknown_trunk")
                else:
                    self._actions.append(TransferLeg(target, trunk))
            case cmd.SendDtmf(digits=digits):
                if not digits or any(d not in DTMF_DIGITS for d in digits.upper()):
                    self._reject(command, "", "bad_digits")
                elif not self._leg.can_send_dtmf:
                    self._reject(command, "", "dtmf_unsupported")
                else:
                    self._actions.append(SendLegDtmf(digits.upper()))
            case cmd.HandOver():
                self._hand_over(command)
            case cmd.Answer():
                if self._early_end is None:
                    self._reject(command, "", "not_early_media")
                else:
                    self._end_early_media(AnswerLeg())
            case cmd.Reject(status=status, reason=reason):
                lo, hi = cmd.REJECT_STATUS_RANGE
                if not lo <= status <= hi:
                    self._reject(command, "", "bad_status")
                elif self._early_end is None:
                    self._reject(command, "", "not_early_media")
                else:
                    self._end_early_media(RejectLeg(status, reason))
            case _:
                self._reject(command, "", "unknown_command")
        self._pump(now)

    def _say(self, say: cmd.Say, now: float) -> None:
        turn = self._turns.get(say.turn_id)
        if turn is None:
            turn = self._open_turn(say, now)
            if turn is None:
                return
        elif not turn.text_open:
            self._reject(say, say.turn_id, "turn_closed")
            return
        if say.final:
            turn.text_open = False
        pacer = turn.pacer
        if pacer is not None:
            pacer.add(say.text, say.final)
            self._pace(turn, now)
            self._text_due_s = self._next_text_check(now)
            return
        if say.text:
            self._actions.append(SendTurnText(turn.turn_id, say.text))
        if say.final:
            self._actions.append(EndTurn(turn.turn_id))

    def _open_turn(self, say: cmd.Say, now: float) -> CallTurn | None:
        if not say.turn_id:
            self._reject(say, "", "empty_turn_id")
            return None
        try:
            self._playout.begin_turn(
                say.turn_id, now, interruptible=say.interruptible, replace=say.replace
            )
        except LocalProtocolError:
            # The playout queue still remembers a turn the call has forgotten.
            self._reject(say, say.turn_id, "duplicate_turn_id")
            return None
        cuts = self._drain_playout(now)
        stops = self._stops_from_cuts(cuts)
        if say.replace:
            stops += self._awaiting_stops(interruptible_only=False)
        if stops:
            self._stop(stops, "replaced", now)
        turn = CallTurn(say.turn_id, say.provider or "", say.interruptible, False, now)
        cacheable = say.cacheable and self._options.cache_prompts  # no cache: a turn as any
        ahead = self._text_ahead(say.provider)
        if ahead > 0 and not cacheable:
            turn.pacer = TextPacer(ahead)  # (a prompt to cache is spoken whole)
        self._register(turn)
        settings = TurnSettings(
            voice=say.voice or self._options.default_voice, audio_format=self._leg_format()
        )
        self._actions.append(OpenTurn(turn.turn_id, settings, say.provider, cacheable))
        return turn

    def _text_ahead(self, provider: str | None) -> float:
        if provider:
            for name, ahead in self._options.provider_text_ahead_s:
                if name == provider:
                    return ahead
        return self._options.text_ahead_s

    # ------------------------------------------------------------ text pacing

    def _pace(self, turn: CallTurn, now: float) -> None:
        """Send the turn's held text that is due (and its end once all has gone)."""
        pacer = turn.pacer
        if pacer is None:
            return
        for piece in pacer.release(now, turn.received_s, self._played_s(turn)):
            self._actions.append(SendTurnText(turn.turn_id, piece))
        if pacer.take_end():
            self._actions.append(EndTurn(turn.turn_id))
            self._drop_text(turn)
        elif pacer.held_chars:
            self._text_turns[turn.turn_id] = turn
        else:  # all sent so far; the pacer stays for the text still to come
            self._text_turns.pop(turn.turn_id, None)

    def _next_text_check(self, now: float) -> float | None:
        due: float | None = None
        for turn in self._text_turns.values():
            pacer = turn.pacer
            if pacer is None:
                continue
            playing = turn.phase is SOUNDING
            at = pacer.next_check(now, turn.received_s, self._played_s(turn), playing)
            if at is not None and (due is None or at < due):
                due = at
        return due

    def _played_s(self, turn: CallTurn) -> float:
        return self._positions(turn)[0] / self._leg.sample_rate_hz

    def _release_text(self, now: float) -> None:
        for turn in list(self._text_turns.values()):
            self._pace(turn, now)
        self._text_due_s = self._next_text_check(now)

    def _drop_text(self, turn: CallTurn) -> None:
        """The turn's held text will never be sent (the turn is over)."""
        if turn.pacer is not None:
            self._text_unsent += turn.pacer.held_chars
            turn.pacer = None
            self._text_turns.pop(turn.turn_id, None)
            if not self._text_turns:
                self._text_due_s = None

    def _cancel(self, turn_id: str, now: float) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.phase is DONE:
            self._reject(cmd.Cancel(turn_id), turn_id, "no_such_turn")
            return
        if turn.phase is AWAITING_MARK:
            self._turns.stop_awaiting(turn)
            self._stop(
                [TurnStop(turn, *self._positions(turn), cancel_provider=False)], "cancelled", now
            )
            return
        played, heard = self._positions(turn)
        self._playout.truncate(turn_id, self._ms(played))
        self._stop([TurnStop(turn, played, heard, cancel_provider=True)], "cancelled", now)

    def _hand_over(self, command: cmd.HandOver) -> None:
        if not command.app and not command.voice_agent:
            self._reject(command, "", "nothing_to_hand_over")
            return
        if command.voice_agent:
            if self._agent is not None:
                self._reject(command, "", "agent_already_active")
                return
            self._agent = command.voice_agent
            self._uplink = AgentUplink(
                self._leg,
                self._options.agent_rate_hz,
                self._options.agent_batch_ms,
                self._options.resample_quality,
            )
            self._actions.append(StartAgent(command.voice_agent))
        if command.app:
            self._actions.append(ConnectApp(command.app))

    def _reject(self, command: cmd.Command, turn_id: str, reason: str) -> None:
        self._events.append(
            cmd.CommandRejected(type(command).__name__, turn_id, reason, source=command)
        )

    # ------------------------------------------------------------ provider input

    def provider_event(self, event: Event, now: float) -> None:
        """One event from the turn's provider engine (or the voice agent)."""
        if self._ended:
            if isinstance(event, AudioReceived):
                self._late_chunks += 1
            return
        match event:
            case AudioReceived():
                self._on_audio(event, now)
            case WordsTimed(turn_id=turn_id, words=words):
                turn = self._turns.get(turn_id)
                if turn is not None and turn.phase is not DONE:
                    room = MAX_WORDS_PER_TURN - len(turn.words)
                    turn.words.extend(words[: max(0, room)])
            case TurnStarted(turn_id=turn_id, provider_ref=ref):
                self._on_turn_started(turn_id, ref, now)
            case TurnDone(turn_id=turn_id):
                turn = self._turns.get(turn_id)
                if turn is not None:
                    self._end_audio(turn)
            case TurnFailed(turn_id=turn_id, kind=kind, message=message):
                self._on_turn_failed(turn_id, kind, message)
            case TurnFellBack(turn_id=turn_id, kind=kind, message=message):
                self._on_turn_fell_back(turn_id, kind, message)
            case ProviderFailed(kind=kind, message=message, turn_ids=turn_ids):
                self._on_provider_failed(kind, message, turn_ids)
            case VoiceInterrupted(item_id=item_id, audio_end_ms=audio_end_ms):
                self._on_voice_interrupted(item_id, audio_end_ms)
            case VoiceEnded(reason=reason):
                self._stop_agent_uplink()
                self._events.append(AgentEnded(reason))
            case VoiceFailed(code=code, message=message):
                self._provider_errors += 1
                self._events.append(cmd.ProviderErrored("", self._agent or "", code, message))
            case QueueDepthChanged(turn_id=turn_id, queue_depth=depth):
                turn = self._turns.get(turn_id)
                if turn is not None and turn.phase is not DONE:
                    self._events.append(cmd.ProviderBacklog(turn_id, depth))
            case _:
                pass  # usage, readiness: the shell logs them
        if self._playout.has_events():  # ``_pump``'s own first test, without its call
            self._pump(now)

    def _on_audio(self, event: AudioReceived, now: float) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is None or not turn.audio_open:
            self._late_chunks += 1
            return
        if turn.first_audio_s is None:
            turn.first_audio_s = now
            turn.head_at_first_audio = self._playout.current_turn_id == turn.turn_id
            if not turn.agent:
                self._ttfa_s.append(now - turn.opened_s)
        audio, audio_format = event.audio, event.audio_format
        byte_rate = audio_format.sample_rate_hz * audio_format.bytes_per_sample
        if byte_rate > 0:  # (a bad format fails the turn below)
            turn.received_s += len(audio) / byte_rate
        if turn.framer is None and not turn.pending:
            # The first chunk (or the first after a drained backlog while the
            # framer is fresh) is transcoded at once: added latency.
            self._convert(turn, [audio], audio_format)
            if self._backlog:
                self._feed()
            return
        if audio_format is not turn.in_format:  # the framer's own format was checked
            try:
                check_format(audio_format)
            except ValueError as exc:
                self._drain_pending(turn)  # the audio before the bad chunk still plays
                self._fail_turn(turn, "bad_audio_format", str(exc))
                return
        if not audio:
            return
        # Later audio is kept as it came and transcoded on demand, a few
        # frames ahead of the clock (``_feed``), so a turn that arrives in a
        # burst costs no loop time at arrival and holds compact audio.
        turn.pending.append((audio, audio_format))
        turn.pending_bytes += len(audio)
        self._backlog[turn.turn_id] = turn
        limit = self._options.max_undecoded_ms * byte_rate // 1000
        while turn.pending_bytes > limit and turn.pending:
            self._convert_piece(turn, turn.pending_bytes - limit)
        self._feed()

    def _convert(
        self, turn: CallTurn, parts: list[bytes | memoryview], audio_format: AudioFormat
    ) -> bool:
        """Transcode provider audio of the turn (``parts``, in order) into frames for the
        queue; ``False`` on failure."""
        if turn.framer is None or audio_format != turn.in_format:
            tail = turn.framer.flush() if turn.framer is not None else []
            try:
                turn.framer = make_framer(audio_format, self._leg, self._options.resample_quality)
            except ValueError as exc:
                turn.framer = None
                self._push_frames(turn, tail)
                ending = turn.audio_ending
                self._drop_pending(turn)
                self._fail_turn(turn, "bad_audio_format", str(exc))
                if ending:  # the provider had already ended the turn: end it here
                    turn.end_reason = "provider_error"
                    self._close_audio(turn)
                return False
            turn.in_format = audio_format
            self._push_frames(turn, tail)
        audio = parts[0]
        if len(parts) == 1 and type(audio) is bytes:
            self._push_frames(turn, turn.framer.push(audio))
        else:
            self._push_frames(turn, turn.framer.push_parts(parts))
        return True

    def _convert_piece(self, turn: CallTurn, at_least_bytes: int) -> None:
        """Transcode the oldest pending audio of the turn: ``at_least_bytes`` or one piece.

        A piece is ``decode_piece_ms`` of audio, taken across chunks of one
        format (the resampler costs about 8 us per call on top of its
        per-sample work, so pieces much smaller than that cost more in all).
        """
        pending = turn.pending
        audio_format = pending[0][1]
        byte_rate = audio_format.sample_rate_hz * audio_format.bytes_per_sample
        size = max(at_least_bytes, self._options.decode_piece_ms * byte_rate // 1000, 1)
        parts: list[bytes | memoryview] = []  # slices are views: the framer copies once
        taken = 0
        while pending and taken < size and pending[0][1] == audio_format:
            audio = pending[0][0]
            start = turn.pending_offset
            end = start + size - taken
            if end >= len(audio):
                parts.append(memoryview(audio)[start:] if start else audio)
                pending.popleft()
                turn.pending_offset = 0
            else:
                parts.append(memoryview(audio)[start:end])
                turn.pending_offset = end
            taken += len(parts[-1])
        turn.pending_bytes -= taken
        if not self._convert(turn, parts, audio_format) or turn.pending:
            return
        self._backlog.pop(turn.turn_id, None)
        if turn.audio_ending:
            turn.audio_ending = False
            self._close_audio(turn)

    def _feed(self) -> None:
        """Transcode pending provider audio until ``decode_ahead_frames`` frames are ready.

        Frames are counted along the playout order: the head turn first, then
        the turns after it once the head has all its audio (a turn can only
        play after the ones before it).
        """
        need = self._options.decode_ahead_frames
        if self._playout.head_frames() >= need:
            return  # the common case: the head turn has its frames ready
        for turn_id in self._playout.queued_turn_ids():
            turn = self._turns.get(turn_id)
            if turn is None:
                continue
            have = self._playout.frames_queued(turn_id)
            while have < need and turn.pending:
                self._convert_piece(turn, 0)
                have = self._playout.frames_queued(turn_id)
            need -= have
            if need <= 0 or turn.pending or turn.audio_open:
                return

    def _release_head(self, turn_id: str) -> None:
        """The head turn would run dry now: the frames its resampler holds back, if any.

        soxr releases its output in blocks (up to ~70 ms of 24 kHz input held
        back), so a turn whose provider is only a little ahead of real time
        (every turn starting at once on a busy provider) would otherwise play
        silence while its audio sits in the filter: at a turn's start its
        first chunk gives about half its length. ``release`` hands that audio
        out and the filter goes on as if it had not (``telcodec.resample``).
        """
        turn = self._turns.get(turn_id)
        if turn is None or turn.framer is None or not turn.audio_open or turn.pending:
            return
        frames = turn.framer.release()
        if frames:
            self._push_frames(turn, frames)

    def _dry(self, turn_id: str) -> None:
        """The head turn played silence this tick (an underrun): whose doing was it
        (``Underruns.dry``, from what the provider handed over and what has played)?"""
        turn = self._turns.get(turn_id)
        if turn is None:
            self.underruns.dry(None, 0.0, 0, 0)
            return
        leg = self._leg
        self.underruns.dry(
            turn_id,
            turn.received_s * leg.sample_rate_hz,
            self._playout.played_samples(turn_id),
            leg.samples_per_frame,
        )

    def _drain_pending(self, turn: CallTurn) -> None:
        """Transcode all the turn's pending audio now (before a truncation by position)."""
        while turn.pending:
            self._convert_piece(turn, turn.pending_bytes)

    def _drop_pending(self, turn: CallTurn) -> None:
        turn.pending.clear()
        turn.pending_offset = turn.pending_bytes = 0
        turn.audio_ending = False
        self._backlog.pop(turn.turn_id, None)

    def _on_turn_started(self, turn_id: str, provider_ref: str, now: float) -> None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            if turn.agent and provider_ref:
                turn.item_id = provider_ref
        elif self._agent is not None:
            self._open_agent_turn(turn_id, provider_ref, now)

    def _on_turn_failed(self, turn_id: str, kind: str, message: str) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.phase is DONE:
            return
        self._fail_turn(turn, kind, message)

    def _on_turn_fell_back(self, turn_id: str, kind: str, message: str) -> None:
        """The turn failed on every provider and its caller hears the fallback prompt in
        its place: reported as a failed turn (``provider_error``) with what was heard."""
        turn = self._turns.get(turn_id)
        if turn is None or turn.phase is DONE or not turn.audio_open:
            return
        self._provider_errors += 1
        self._events.append(cmd.ProviderErrored(turn.turn_id, turn.provider, kind, message))
        turn.text_open = False
        self._drop_text(turn)
        turn.end_reason = "provider_error"

    def _on_provider_failed(self, kind: str, message: str, turn_ids: tuple[str, ...]) -> None:
        ours = [t for t in map(self._turns.get, turn_ids) if t and t.phase is not DONE]
        for turn in ours:
            self._fail_turn(turn, kind, message)
        if not ours:
            # Nothing of ours was named: the connection that failed is the
            # agent's when one is active (the shell routes pool failures by turn).
            self._provider_errors += 1
            self._events.append(cmd.ProviderErrored("", self._agent or "", kind, message))
            if self._agent is not None:
                self._stop_agent_uplink()
                self._events.append(AgentEnded(kind))

    def _fail_turn(self, turn: CallTurn, kind: str, message: str) -> None:
        """A provider error ends this turn only, with the audio it already has."""
        self._provider_errors += 1
        self._events.append(cmd.ProviderErrored(turn.turn_id, turn.provider, kind, message))
        turn.text_open = False
        if turn.audio_open:
            turn.end_reason = "provider_error"
            self._end_audio(turn)

    def _on_voice_interrupted(self, item_id: str, audio_end_ms: int) -> None:
        turn = next(
            (t for t in self._turns.unreported() if t.agent and item_id and t.item_id == item_id),
            None,
        )
        if turn is None and self._last_agent_turn is not None:
            turn = self._turns.get(self._last_agent_turn)
        if turn is None or turn.phase not in (QUEUED, SOUNDING):
            return
        self._drain_pending(turn)  # the cut is by position: what is pending may be before it
        turn.audio_open = False
        if turn.framer is not None:
            turn.framer.reset()
            turn.framer = None
        turn.end_reason = "agent_interrupted"
        self._playout.truncate(turn.turn_id, audio_end_ms)
        if self._marks_leg:
            self._place_mark(turn, final=True)

    def _open_agent_turn(self, turn_id: str, item_id: str, now: float) -> CallTurn | None:
        if not turn_id:
            return None
        try:
            self._playout.begin_turn(turn_id, now)
        except LocalProtocolError:
            # Reused id of a turn the queue still remembers: late audio, drop it.
            return None
        turn = CallTurn(turn_id, self._agent or "", True, True, now, item_id, text_open=False)
        self._register(turn)
        self._last_agent_turn = turn_id
        return turn

    def _stop_agent_uplink(self) -> None:
        self._agent = None
        if self._uplink is not None:
            self._uplink.reset()
        self._uplink = None

    # ------------------------------------------------------------ audio to playout

    def _push_frames(self, turn: CallTurn, frames: list[bytes]) -> None:
        """Queue the turn's frames, a mark after every ``mark_interval_ms`` on marks legs.

        Pushed in runs up to the next mark (one queue call per run, not per
        frame); a frame the queue drops is not counted, nor is any after it
        (the queue drops every later frame of the same push too).
        """
        if not frames:
            return
        if not self._marks_leg:
            self._playout.push_many(turn.turn_id, frames)
            return
        every = self._mark_every_frames
        start, count = 0, len(frames)
        while start < count:
            take = min(count - start, max(1, every - turn.frames_since_mark))
            run = frames if take == count else frames[start : start + take]
            kept = self._playout.push_many(turn.turn_id, run)
            turn.frames_since_mark += kept
            if kept and turn.frames_since_mark >= every:
                self._place_mark(turn, final=False)
            if kept < take:
                if start + take < count:  # counted as dropped, as one push each would
                    self._playout.push_many(turn.turn_id, frames[start + take :])
                return
            start += take

    def _place_mark(self, turn: CallTurn, final: bool) -> None:
        self._mark_seq += 1
        name = f"{turn.turn_id}/{self._mark_seq}"
        if not self._playout.mark(turn.turn_id, name):
            return
        turn.frames_since_mark = 0
        self._marks[name] = (turn.turn_id, final)
        while len(self._marks) > MAX_MARKS_TRACKED:
            self._marks.popitem(last=False)
        if final:
            turn.final_mark = name

    def _end_audio(self, turn: CallTurn) -> None:
        """The provider is done with the turn: flush, place the final mark, end it."""
        if not turn.audio_open:
            return
        turn.audio_open = turn.text_open = False
        self._drop_text(turn)
        if turn.pending:
            turn.audio_ending = True  # ended by ``_feed`` once the pending audio is transcoded
            return
        self._close_audio(turn)

    def _close_audio(self, turn: CallTurn) -> None:
        if turn.framer is not None:
            self._push_frames(turn, turn.framer.flush())
            turn.framer = None
        if self._marks_leg:
            self._place_mark(turn, final=True)
        self._playout.end_turn(turn.turn_id)

    # ------------------------------------------------------------ playout events

    def _pump(self, now: float) -> None:
        if not self._playout.has_events():
            return  # most ticks: nothing happened, nothing to allocate
        stops = self._stops_from_cuts(self._drain_playout(now))
        if stops:
            self._stop(stops, "replaced", now)

    def _drain_playout(self, now: float) -> list[TurnCut]:
        cuts: list[TurnCut] = []
        for event in self._playout.events_received():
            match event:
                case TurnPlaybackStarted(turn_id=turn_id):
                    self._on_playback_started(turn_id, now)
                case MarkReached(name=name):
                    if name in self._marks:
                        self._actions.append(SendMark(name))
                case TurnPlayed(turn_id=turn_id):
                    self._on_played(turn_id)
                case TurnCut():
                    cuts.append(event)
        return cuts

    def _on_playback_started(self, turn_id: str, now: float) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.phase is not QUEUED:
            return
        turn.phase = SOUNDING
        if next(iter(self._turns.awaiting()), None) is None:
            # the carrier's buffer held nothing of an earlier turn: this one plays now
            turn.play_anchor = (now, 0)
        self._events.append(cmd.TurnBegan(turn_id))
        if turn.first_audio_s is not None and turn.head_at_first_audio:
            self._added_s.append(now - turn.first_audio_s)
        if turn.agent and self._agent_played_at is None:
            self._agent_played_at = now + self._options.agent_played_interval_ms / 1000

    def _on_played(self, turn_id: str) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.phase is DONE:
            return
        if self._marks_leg and turn.final_mark is not None and turn.final_mark in self._marks:
            self._turns.await_mark(turn)
            return
        self._report(turn, self._heard_samples(turn))

    # ------------------------------------------------------------ reporting

    def _report(self, turn: CallTurn, heard_samples: int) -> None:
        self._drop_text(turn)
        heard_ms = self._ms(heard_samples)
        if turn.end_reason is None:
            text = " ".join(w.word for w in turn.words)
            self._events.append(cmd.TurnFinished(turn.turn_id, heard_ms, text))
            self._finished += 1
        else:
            text = heard_text(turn.words, heard_ms)
            self._events.append(cmd.TurnInterrupted(turn.turn_id, heard_ms, text, turn.end_reason))
            self._interrupted += 1
        self._turns.retire(turn)
        if turn.agent and self._sounding_agent_turn() is None:
            self._agent_played_at = None
        if self._early_end is not None:
            self._end_early_media(None)  # the first turn's end decides (the route's rule)

    def _register(self, turn: CallTurn) -> None:
        self._sending = None  # a reused turn id names this turn from now on
        self._turns.add(turn)
        self._turn_count += 1

    def _positions(self, turn: CallTurn) -> tuple[int, int]:
        """(played, acknowledged) samples of a turn, 0 if the queue forgot it."""
        try:
            return (
                self._playout.played_samples(turn.turn_id),
                self._playout.heard_samples(turn.turn_id),
            )
        except LocalProtocolError:
            return 0, 0

    def _heard_at_clear(self, turn: CallTurn, stop: TurnStop, now: float) -> int:
        """What a carrier played of a cleared turn: the last echoed mark, plus real time since.

        A carrier plays its buffer at real time from the moment audio
        reaches it, and we keep it fed (a small lead), so between two echoes
        the position grows with the clock. The anchor is the latest echoed
        mark of the turn, or the turn's first frame (position 0) before any
        echo; the estimate never exceeds what was sent. Its error is the
        one-way network delay, where marks alone are off by up to the mark
        interval.
        """
        heard = stop.heard_samples
        if turn.play_anchor is not None:
            at_s, position = turn.play_anchor
            estimate = position + int((now - at_s) * self._leg.sample_rate_hz)
            heard = max(heard, min(stop.played_samples, estimate))
        return heard

    def _heard_samples(self, turn: CallTurn) -> int:
        played, acknowledged = self._positions(turn)
        return acknowledged if self._marks_leg else played

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self._leg.sample_rate_hz

    def _leg_format(self) -> AudioFormat:
        return AudioFormat(self._leg.codec, self._leg.sample_rate_hz)

    def _head_turn(self) -> CallTurn | None:
        head = self._playout.current_turn_id
        return None if head is None else self._turns.get(head)

    def _interruptible_sounding(self) -> bool:
        """Whether the detector should be armed (``tick`` asks when its frame does not say)."""
        head_id = self._playout.current_turn_id
        if head_id is not None:
            head = self._sending  # mostly the head: no lookup (a forgotten turn is DONE)
            if head is None or head.turn_id != head_id:
                head = self._turns.get(head_id)
            if head is not None and head.interruptible and head.phase is SOUNDING:
                return True
        return self._turns.any_awaiting(interruptible=True)

    def _drain_detector(self) -> None:
        for event in self._detector.events_received():
            if isinstance(event, bargein.SpeechStarted):
                self._events.append(cmd.SpeechStarted(event.onset_s))
            elif isinstance(event, bargein.SpeechStopped):
                self._events.append(cmd.SpeechStopped(event.last_speech_s))

    # ------------------------------------------------------------ timers

    def _run_timers(self, now: float) -> None:
        text_due = self._text_due_s
        if text_due is not None and now >= text_due:
            self._release_text(now)
        due = self._agent_played_at
        if due is None or now < due:
            return
        turn = self._sounding_agent_turn()
        if turn is None:
            self._agent_played_at = None
            return
        self._actions.append(AgentPlayed(turn.item_id, self._ms(self._heard_samples(turn))))
        interval_s = self._options.agent_played_interval_ms / 1000
        self._agent_played_at = due + interval_s if due + interval_s > now else now + interval_s

    def _sounding_agent_turn(self) -> CallTurn | None:
        head = self._head_turn()
        if head is not None and head.agent and head.phase is SOUNDING:
            return head
        return next((turn for turn in self._turns.awaiting() if turn.agent), None)

    # ------------------------------------------------------------ the end

    def _end(self, reason: str, now: float) -> None:
        if self._ended:
            return
        self._ended = True
        self._turns.forget_awaiting()
        for turn in self._turns.unreported():
            played, acknowledged = self._positions(turn)
            if turn.audio_open or turn.text_open:
                self._actions.append(CancelTurn(turn.turn_id))
            turn.audio_open = turn.text_open = False
            turn.framer = None
            self._drop_pending(turn)
            turn.end_reason = "call_ended"
            self._report(turn, acknowledged if self._marks_leg else played)
        if self._agent is not None:
            self._actions.append(StopAgent("user"))
            self._stop_agent_uplink()
        self._agent_played_at = None
        self._events.append(cmd.CallEnded(reason))

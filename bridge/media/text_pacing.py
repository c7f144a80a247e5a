"""Text pacing: a turn's text goes to the provider a few seconds ahead of playout.

Theory of operation
-------------------
A ``Say`` may carry a whole paragraph (an IVR prompt, an application's
answer), and a TTS provider synthesizes faster than real time: sent at once,
the text comes back as the whole turn's audio within a second or two, and
the call holds it until it has played (8 KB a second at 8 kHz G.711, 48 KB
at 24 kHz PCM). A ``TextPacer`` holds the text back instead and releases it
a sentence at a time, as playout needs it, so a call holds a few seconds of
audio whatever the turn's length, and text the caller never hears (cut by a
barge-in, a cancel or a hang-up) is never sent, so never synthesized or
billed.

Release rule, checked when text arrives and whenever the caller asks
(``next_check``): while text is held and the turn's *lead* is under
``ahead_s``, the next sentence goes out. The lead is how far the turn's
audio reaches past what has played, counting text sent but not answered::

    lead = received_s - played_s + outstanding_s

``received_s`` is the provider's audio so far. ``outstanding_s`` is the
audio estimated for text released in the last ``ANSWER_S`` (at
``EST_CHARS_PER_S``, a fast speaking rate, so it errs towards sending early
rather than late), used up by the audio that arrives after it (audio is taken
to answer the oldest text first). Text released longer ago counts as
answered: an estimate can never pile up, even for a voice faster than the
estimate, whose audio would otherwise leave part of each estimate unused. A sentence is the unit
because providers synthesize whole sentences: a fragment is held by the
provider until the rest comes (the reference server, Coda's sentence
accumulation) or spoken on its own after an idle timeout (KugelAudio), so
cutting inside a sentence would stall or break its prosody. A sentence is
everything up to and including a sentence end (``.``, ``!``, ``?``, ``…``,
their CJK forms, a closing quote or bracket after them) and the whitespace
after it, or a newline; text without one is a single sentence (a streamed
``Say`` that stops mid-sentence sends what it has, as it did unpaced).
Segments join back to exactly the text given.

A provider that produces nothing for what it was sent is not waited on:
if the lead in real audio is under ``ahead_s`` and no audio has come since
the last release for ``STALL_S``, everything held goes out at once (some
providers, or provider modes, speak only once a turn's text is complete).

The turn's end (``EndTurn``) is due once its final text has all gone out.
Pure: time, positions and the audio received are numbers the caller passes.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Final

__all__ = [
    "ANSWER_S",
    "EST_CHARS_PER_S",
    "POLL_S",
    "STALL_S",
    "TextPacer",
    "sentence_end",
]

EST_CHARS_PER_S: Final = 30.0
"""Characters a second used to estimate the audio of text sent but not yet answered.

Voices speak about 12-18 characters a second; a higher figure estimates less
audio, so the next sentence goes out earlier, never later."""
ANSWER_S: Final = 2.0
"""How long released text's estimated audio counts towards the lead (a provider's
first audio comes well within it); after it, the audio received is the measure."""
STALL_S: Final = 1.0
"""A provider that answers no released text for this long gets all the rest at once."""
POLL_S: Final = 0.5
"""How often a turn that is not playing yet (queued behind another) is looked at."""
MIN_WAIT_S: Final = 0.02

_SENTENCE_END = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?:\s+|$)"  # Latin: a space (or the end) must follow
    r"|[\u3002\uff01\uff1f]+[\"'\u201d\u2019)\]\u300d\u300f]*\s*"  # CJK: none needed
    r"|\n\s*"
)


def sentence_end(text: str) -> int:
    """Length of the first sentence of ``text`` with the whitespace after it (all if none)."""
    match = _SENTENCE_END.search(text)
    return match.end() if match is not None else len(text)


class TextPacer:
    """One turn's text not sent to the provider yet (see the module docstring)."""

    __slots__ = (
        "_end_due",
        "_ended",
        "_held",
        "_outstanding",
        "_received_at_release",
        "_received_seen",
        "_released_s",
        "_sent_chars",
        "ahead_s",
    )

    def __init__(self, ahead_s: float) -> None:
        if ahead_s <= 0:
            raise ValueError(f"text pacing needs ahead_s > 0, got {ahead_s}")
        self.ahead_s = ahead_s
        self._held = ""
        self._end_due = False
        self._ended = False
        self._sent_chars = 0
        self._released_s = 0.0
        self._received_at_release = 0.0
        self._received_seen = 0.0
        self._outstanding: deque[list[float]] = deque()
        """[released at, estimated audio not yet answered] per release, oldest first."""

    @property
    def held_chars(self) -> int:
        """Characters given and not released yet."""
        return len(self._held)

    @property
    def sent_chars(self) -> int:
        """Characters released so far."""
        return self._sent_chars

    def add(self, text: str, final: bool) -> None:
        """More of the turn's text (``final``: the last of it)."""
        self._held += text
        if final:
            self._end_due = True

    def release(self, now: float, received_s: float, played_s: float) -> list[str]:
        """The text due now, in order (each piece one sentence, or all held on a stall)."""
        out: list[str] = []
        while self._held:
            if self._lead(now, received_s, played_s) >= self.ahead_s:
                if not self._stalled(now, received_s, played_s):
                    break
                cut = len(self._held)  # the provider waits for more: give it everything
            else:
                cut = sentence_end(self._held)
                while cut < len(self._held) and not self._held[:cut].strip():
                    cut += sentence_end(self._held[cut:])  # no piece of only whitespace
            out.append(self._held[:cut])
            self._held = self._held[cut:]
            self._sent_chars += cut
            self._outstanding.append([now, cut / EST_CHARS_PER_S])
            self._released_s = now
            self._received_at_release = received_s
        return out

    def take_end(self) -> bool:
        """Whether the turn's end is due now (its final text has all gone); once."""
        if self._end_due and not self._held:
            self._end_due = False
            self._ended = True
            return True
        return False

    @property
    def done(self) -> bool:
        """The turn's final text and its end have all gone (``take_end`` said so)."""
        return self._ended

    def next_check(
        self, now: float, received_s: float, played_s: float, playing: bool
    ) -> float | None:
        """When ``release`` may have something again (``None``: nothing is held).

        ``playing``: the turn's audio is playing, so ``played_s`` grows in real
        time; otherwise the turn is looked at every ``POLL_S``.
        """
        if not self._held:
            return None
        lead_s = self._lead(now, received_s, played_s)
        wait_s = lead_s - self.ahead_s if playing else POLL_S
        if self._outstanding:  # the lead drops when the oldest estimate lapses
            wait_s = min(wait_s, self._outstanding[0][0] + ANSWER_S - now)
        if self._unanswered(received_s, played_s):
            wait_s = min(wait_s, self._released_s + STALL_S - now)
        return now + max(wait_s, MIN_WAIT_S)

    def _lead(self, now: float, received_s: float, played_s: float) -> float:
        """The lead, after counting the audio received since the last look against the
        outstanding estimates and letting the lapsed ones go."""
        outstanding = self._outstanding
        arrived = received_s - self._received_seen
        if arrived > 0:
            self._received_seen = received_s
            while outstanding and arrived > 0:
                used = min(arrived, outstanding[0][1])
                outstanding[0][1] -= used
                arrived -= used
                if outstanding[0][1] <= 0:
                    outstanding.popleft()
        while outstanding and outstanding[0][0] + ANSWER_S <= now:
            outstanding.popleft()
        return received_s - played_s + sum(entry[1] for entry in outstanding)

    def _unanswered(self, received_s: float, played_s: float) -> bool:
        """Short of audio, and none has come since the last release."""
        return received_s - played_s < self.ahead_s and received_s <= self._received_at_release

    def _stalled(self, now: float, received_s: float, played_s: float) -> bool:
        return self._unanswered(received_s, played_s) and now - self._released_s >= STALL_S

"""``TextPacer``: a turn's text released a sentence at a time, ahead of playout.

Time, positions and audio received are numbers the test passes in.
"""

from __future__ import annotations

import pytest

from bridge.media.text_pacing import (
    ANSWER_S,
    EST_CHARS_PER_S,
    POLL_S,
    STALL_S,
    TextPacer,
    sentence_end,
)

S1 = "Thank you for calling the support line of the city library today. "  # 66 chars
S2 = "Your call matters to us, so please stay on the line for a moment. "
S3 = "A librarian will be with you as soon as one of them is free again. "
S4 = "Meanwhile, you can renew your loans at any time on our website."


def pieces_of(text: str) -> list[str]:
    out = []
    while text:
        cut = sentence_end(text)
        out.append(text[:cut])
        text = text[cut:]
    return out


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Hello. How are you? Fine!", ["Hello. ", "How are you? ", "Fine!"]),
        ("It costs 3.5 dollars. Yes.", ["It costs 3.5 dollars. ", "Yes."]),
        ('He said "stop." Then left.', ['He said "stop." ', "Then left."]),
        ("Wait... what?!  Really", ["Wait... ", "what?!  ", "Really"]),
        ("line one\nline two\n\nthree", ["line one\n", "line two\n\n", "three"]),
        ("\u4f60\u597d\u3002\u518d\u89c1\uff01", ["\u4f60\u597d\u3002", "\u518d\u89c1\uff01"]),
        ("no sentence end at all", ["no sentence end at all"]),
        ("(Yes.) No.", ["(Yes.) ", "No."]),
    ],
)
def test_sentences_join_back_to_the_text(text: str, pieces: list[str]) -> None:
    assert pieces_of(text) == pieces
    assert "".join(pieces) == text


def test_first_sentences_go_at_once_up_to_the_estimated_lead() -> None:
    pacer = TextPacer(3.0)
    pacer.add(S1 + S2 + S3 + S4, final=True)
    # nothing received or played: 66 chars are 2.2 s at the estimate, 132 are 4.4 s
    assert pacer.release(0.0, 0.0, 0.0) == [S1, S2]
    assert pacer.sent_chars == len(S1 + S2)
    assert pacer.held_chars == len(S3 + S4)
    assert not pacer.take_end() and not pacer.done
    assert pacer.release(0.1, 0.0, 0.0) == []  # nothing new: the lead is unchanged


def test_next_sentence_goes_when_the_lead_falls_under_ahead() -> None:
    pacer = TextPacer(3.0)
    pacer.add(S1 + S2 + S3 + S4, final=True)
    pacer.release(0.0, 0.0, 0.0)
    received = 8.8  # the provider's audio for S1 + S2 (15 chars a second)
    assert pacer.release(0.5, received, 0.0) == []
    # playing in real time from 0.5 s: the lead is 3 s at played 5.8 s
    check = pacer.next_check(0.5, received, 0.0, playing=True)
    assert check == pytest.approx(0.5 + received - 3.0)
    assert pacer.release(6.2, received, 5.7) == []
    assert pacer.release(6.3, received, 5.8 + 1e-9) == [S3]
    assert pacer.release(6.4, received, 5.9) == []  # S3's estimate carries the lead
    received += 4.5  # S3's audio: it uses the estimate up, the real audio counts
    assert pacer.release(7.0, received, 6.5) == []
    assert pacer.release(11.0, received, 10.3 - 1e-9) == []
    assert pacer.release(11.1, received, 10.3 + 1e-9) == [S4]
    assert pacer.take_end() is True
    assert pacer.take_end() is False  # once
    assert pacer.done
    assert pacer.next_check(9.0, received, 8.5, playing=True) is None


def test_streamed_text_goes_as_it_comes_while_the_lead_is_short() -> None:
    pacer = TextPacer(3.0)
    out = []
    for token in ["Hel", "lo the", "re, how", " are you"]:
        pacer.add(token, final=False)
        out += pacer.release(0.0, 0.0, 0.0)
    assert out == ["Hel", "lo the", "re, how", " are you"]
    assert not pacer.take_end()
    pacer.add("?", final=True)
    assert pacer.release(0.0, 0.0, 0.0) == ["?"]
    assert pacer.take_end()


def test_streamed_text_is_held_once_ahead_and_released_by_sentence() -> None:
    pacer = TextPacer(1.0)
    pacer.add(S1, final=False)
    assert pacer.release(0.0, 0.0, 0.0) == [S1]  # 2.2 s estimated: ahead
    pacer.add(S2 + "A librarian will", final=False)
    assert pacer.release(0.1, 0.0, 0.0) == []
    assert pacer.release(0.2, 4.4, 3.5) == [S2]
    assert pacer.release(3.0, 4.4, 6.0) == ["A librarian will"]


def test_a_provider_that_answers_nothing_gets_the_rest_after_the_stall_time() -> None:
    pacer = TextPacer(3.0)
    pacer.add(S1 + S2 + S3 + S4, final=True)
    assert pacer.release(0.0, 0.0, 0.0) == [S1, S2]
    check = pacer.next_check(0.0, 0.0, 0.0, playing=False)
    assert check == pytest.approx(min(POLL_S, STALL_S))
    assert pacer.release(STALL_S - 0.01, 0.0, 0.0) == []
    assert pacer.release(STALL_S, 0.0, 0.0) == [S3 + S4]
    assert pacer.take_end()


def test_audio_since_the_release_is_no_stall() -> None:
    pacer = TextPacer(3.0)
    pacer.add(S1 + S2 + S3 + S4, final=True)
    pacer.release(0.0, 0.0, 0.0)
    # the provider answers slowly: 0.5 s of audio, the lead (estimate) still over 3 s
    assert pacer.release(1.5, 0.5, 0.0) == []
    check = pacer.next_check(1.5, 0.5, 0.0, playing=False)
    assert check == pytest.approx(ANSWER_S)  # when the estimates lapse
    # after ANSWER_S the audio received is the measure: 0.5 s is under 3 s
    assert pacer.release(ANSWER_S, 0.5, 0.0) == [S3, S4]


@pytest.mark.parametrize("voice_chars_per_s", [12.0, 15.0, 34.0, 60.0])
def test_a_long_turn_never_runs_dry_whatever_the_voice_speed(voice_chars_per_s: float) -> None:
    """40 sentences, a provider answering each after 0.4 s at the voice's speed, playout
    in real time: the audio never runs out before the text does, and the lead when each
    sentence goes out stays near ``ahead_s`` (an estimate never piles up)."""
    sentence = "The quick brown fox jumps over the lazy dog, again and again. "
    pacer = TextPacer(3.0)
    pacer.add(sentence * 40, final=True)
    answers: list[tuple[float, float]] = []  # (when, seconds of audio)
    received = played = 0.0
    leads_at_release = []
    ended = False
    for step in range(1, 60_000):
        now = step * 0.02
        received += sum(s for t, s in answers if t <= now)
        answers = [(t, s) for t, s in answers if t > now]
        if received - played > 1e-9:
            played = min(received, played + 0.02)
        elif ended and not answers:
            break
        else:
            assert played < 0.1 or pacer.done, f"ran dry at {now:.2f} s"
        for piece in pacer.release(now, received, played):
            leads_at_release.append(received - played)
            answers.append((now + 0.4, len(piece) / voice_chars_per_s))
        ended = ended or pacer.take_end()
    assert ended and pacer.done
    assert played == pytest.approx(40 * len(sentence) / voice_chars_per_s)
    assert min(leads_at_release[2:]) >= 0.4 + 0.02  # the answer comes before the audio ends


def test_whitespace_only_pieces_ride_with_the_next_sentence() -> None:
    pacer = TextPacer(0.1)
    pacer.add("\n\nHello there. ", final=True)
    assert pacer.release(0.0, 0.0, 0.0) == ["\n\nHello there. "]


def test_the_estimate_is_the_fast_speaking_rate() -> None:
    assert EST_CHARS_PER_S >= 25  # real voices: 12-18 characters a second
    with pytest.raises(ValueError, match="ahead_s"):
        TextPacer(0.0)

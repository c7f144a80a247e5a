"""``[bargein]``: every key reaches the call's detector, bad values are named, defaults hold.

The daemon builds each call's ``BargeInPolicy`` from ``[bargein]`` with
``bridge.io.callrun.bargein_policy`` (at the call's start, from the config a
SIGHUP last loaded). The tests here go through that function, then through a
``BargeInDetector`` fed literal frames: a key the loader or the mapping
ignored leaves the detector's decisions as they are with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bridge.config import ConfigError, parse_config
from bridge.engine import Event
from bridge.io.callrun import bargein_policy
from bridge.media.bargein import BargeInDetector, BargeInPolicy
from bridge.media.call import CallBridge
from bridge.media.call_types import LegProfile

MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""

FRAME_S = 0.020

KEYS = {"dtmf" if f.name == "dtmf_triggers" else f.name for f in fields(BargeInPolicy)} - {
    "frame_ms"
}
"""Every ``[bargein]`` key: the policy's fields but ``frame_ms`` (``dtmf_triggers`` is ``dtmf``)."""


def policy_for(bargein_toml: str) -> BargeInPolicy:
    """The policy a call started under this ``[bargein]`` section gets."""
    cfg = parse_config(MINIMAL + "[bargein]\n" + bargein_toml)
    return bargein_policy(cast(Any, SimpleNamespace(config=cfg)))


def toml_value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


# ------------------------------------------------------------------ frames


@dataclass(frozen=True)
class F:
    """One inbound frame: the VAD's verdict, its level, and what else happens then."""

    speech: bool
    level_dbfs: float
    bot_dbfs: float | None = None
    """The level of the outbound frame sent at the same time (the echo guard's input)."""
    digit: str = ""


def quiet(n: int, level_dbfs: float = -57.0) -> list[F]:
    return [F(False, level_dbfs)] * n


def talk(n: int, level_dbfs: float) -> list[F]:
    return [F(True, level_dbfs)] * n


def trace(policy: BargeInPolicy, frames: list[F]) -> list[tuple[int, Event]]:
    """Feed ``frames`` to a detector while the bot speaks: (frame index, trigger or event)."""
    det = BargeInDetector(policy)
    det.set_bot_speaking(True)
    out: list[tuple[int, Event]] = []
    for i, f in enumerate(frames):
        now = round(i * FRAME_S, 6)
        if f.bot_dbfs is not None:
            det.record_bot_level(f.bot_dbfs, now)
        if f.digit:
            d = det.dtmf(f.digit, now)
            if d is not None:
                out.append((i, d))
        decision = det.observe(f.speech, f.level_dbfs, now)
        if decision is not None:
            out.append((i, decision))
        out.extend((i, e) for e in det.events_received())
    return out


# A caller 12 dB above a quiet line, after the warm-up: the defaults trigger.
CALLER = quiet(40) + talk(15, -45.0) + quiet(40)
# The same, starting in the call's first frames (the warm-up).
EARLY_CALLER = quiet(5) + talk(40, -45.0) + quiet(30)
# A caller over the line after it got louder (the floor must climb) ...
LINE_UP = quiet(40, -70.0) + quiet(10, -50.0) + talk(10, -42.0) + quiet(30, -50.0)
# ... and after it got quieter (the floor must come down).
LINE_DOWN = quiet(40, -45.0) + quiet(10, -70.0) + talk(10, -42.0) + quiet(30, -70.0)
# A caller whose first frames are under the echo guard of one loud bot frame.
UNDER_ECHO = [*quiet(40), F(False, -57.0, bot_dbfs=-10.0), *quiet(4), *talk(15, -45.0), *quiet(30)]
# A caller that pauses one frame after two.
PAUSE = quiet(40) + talk(2, -45.0) + quiet(1) + talk(2, -45.0) + quiet(30)
DIGIT = [*quiet(40), F(False, -57.0, digit="5"), *quiet(5)]

# key -> (a value that is not the default, frames on which it changes the decisions:
# with the defaults CALLER, PAUSE, DIGIT and LINE_UP trigger and the others do not)
CASES: dict[str, tuple[object, list[F]]] = {
    "enabled": (False, CALLER),
    "min_speech_ms": (100, CALLER),
    "energy_floor_dbfs": (-40.0, CALLER),
    "echo_return_loss_db": (60.0, UNDER_ECHO),
    "dtmf": (False, DIGIT),
    "hangover_ms": (0, PAUSE),
    "speech_end_ms": (200, CALLER),
    "echo_window_ms": (60, UNDER_ECHO),
    "noise_rise_db": (20.0, CALLER),
    "babble_spread": (5.0, CALLER),
    "noise_floor_up_ms": (20, LINE_UP),
    "noise_floor_down_ms": (20, LINE_DOWN),
    "noise_warmup_ms": (0, EARLY_CALLER),
    "noise_warmup_floor_ms": (10000, EARLY_CALLER),
    "noise_warmup_rise_db": (0.0, EARLY_CALLER),
    "noise_spread_prior_db": (5.0, CALLER),
}
"""Every detector key. Not here: ``echo_correlation`` (the call's echo check, see
``test_every_key_reaches_the_policy``) and ``vad_aggressiveness`` (the VAD's mode)."""


def test_the_cases_cover_every_detector_key() -> None:
    assert set(CASES) == KEYS - {"echo_correlation", "vad_aggressiveness"}


@pytest.mark.parametrize("key", sorted(CASES))
def test_each_key_changes_the_detectors_decisions(key: str) -> None:
    value, frames = CASES[key]
    default = trace(policy_for(""), frames)
    changed = trace(policy_for(f"{key} = {toml_value(value)}\n"), frames)
    assert changed != default


@pytest.mark.parametrize("key", sorted(KEYS))
def test_every_key_reaches_the_policy(key: str) -> None:
    value = CASES[key][0] if key in CASES else {"vad_aggressiveness": 1}.get(key, 0.5)
    policy = policy_for(f"{key} = {toml_value(value)}\n")
    assert getattr(policy, "dtmf_triggers" if key == "dtmf" else key) == value
    assert policy != BargeInPolicy()


def test_one_source_of_defaults_the_daemons_measured_figures() -> None:
    """An empty ``[bargein]``, no ``[bargein]`` at all and ``BargeInPolicy()`` are one
    policy, with the figures bench_bargein measured (issue 31)."""
    assert policy_for("") == parse_config(MINIMAL).bargein == BargeInPolicy()
    default = BargeInPolicy()
    assert (
        default.min_speech_ms,
        default.energy_floor_dbfs,
        default.echo_return_loss_db,
        default.vad_aggressiveness,
    ) == (60, -48.0, 30.0, 3)


def test_a_call_built_without_config_runs_what_the_daemon_runs() -> None:
    """``CallBridge(..., None, ...)`` (tests, bench/bench_call.py) gets the daemon's policy,
    VAD mode included."""
    leg = LegProfile(kind="sip", codec="mulaw", sample_rate_hz=8000, heard_from="frames")
    bare = CallBridge("c1", leg, None, 0.0)
    daemon = CallBridge("c2", leg, policy_for(""), 0.0)
    assert bare._detector.policy == daemon._detector.policy == parse_config(MINIMAL).bargein


def test_a_reload_reaches_new_calls_and_not_a_running_detector() -> None:
    """SIGHUP swaps ``daemon.config``: the next call's policy has the new values; a
    detector built before keeps its policy (as for every ``[bargein]`` key)."""
    daemon = SimpleNamespace(config=parse_config(MINIMAL))
    running = BargeInDetector(bargein_policy(cast(Any, daemon)))
    daemon.config = parse_config(MINIMAL + "[bargein]\nnoise_rise_db = 12\nhangover_ms = 100\n")
    new = bargein_policy(cast(Any, daemon))
    assert (new.noise_rise_db, new.hangover_ms) == (12.0, 100)
    assert (running.policy.noise_rise_db, running.policy.hangover_ms) == (7.0, 60)


# ------------------------------------------------------------------ validation

BAD: list[tuple[str, str, str]] = [
    ("hangover_ms", "30", "must be a multiple of 20 (one frame), got 30"),
    ("hangover_ms", "-20", "-20 is out of range"),
    ("hangover_ms", "2020", "2020 is out of range"),
    ("hangover_ms", "60.0", "expected an integer, got"),
    ("speech_end_ms", "0", "0 is out of range"),
    ("speech_end_ms", "410", "must be a multiple of 20 (one frame), got 410"),
    ("echo_window_ms", "-1", "-1 is out of range"),
    ("echo_window_ms", "2001", "2001 is out of range"),
    ("echo_window_ms", '"200ms"', "expected an integer, got"),
    ("noise_rise_db", "-1", "-1 is out of range"),
    ("noise_rise_db", "61", "61 is out of range"),
    ("noise_rise_db", "true", "expected a number, got"),
    ("babble_spread", "-0.5", "-0.5 is out of range"),
    ("babble_spread", "11", "11 is out of range"),
    ("noise_floor_up_ms", "0", "0 is out of range"),
    ("noise_floor_up_ms", "60001", "60001 is out of range"),
    ("noise_floor_down_ms", "10", "10 is out of range"),
    ("noise_floor_down_ms", "1e3", "expected an integer, got"),
    ("noise_warmup_ms", "510", "must be a multiple of 20 (one frame), got 510"),
    ("noise_warmup_ms", "-20", "-20 is out of range"),
    ("noise_warmup_ms", "10020", "10020 is out of range"),
    ("noise_warmup_floor_ms", "0", "0 is out of range"),
    ("noise_warmup_rise_db", "-3", "-3 is out of range"),
    ("noise_warmup_rise_db", "[10]", "expected a number, got"),
    ("noise_spread_prior_db", "-1", "-1 is out of range"),
    ("noise_spread_prior_db", "21", "21 is out of range"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD)
def test_bad_values_are_rejected_naming_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + f"[bargein]\n{key} = {value}\n")
    assert len(info.value.errors) == 1, info.value.errors
    assert info.value.errors[0].startswith(f"bargein.{key}: {message}"), info.value.errors


def test_every_bad_key_is_reported_at_once_and_typos_are_unknown() -> None:
    text = MINIMAL + "[bargein]\nhangover_ms = 30\nnoise_rise_db = -1\nnoise_rise = 7\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert sorted(e.split(":")[0] for e in info.value.errors) == [
        "bargein.hangover_ms",
        "bargein.noise_rise",
        "bargein.noise_rise_db",
    ]
    assert "bargein.noise_rise: unknown key (did you mean noise_rise_db?)" in info.value.errors


def test_zero_switches_documented_as_off_are_accepted() -> None:
    policy = policy_for(
        "noise_rise_db = 0\nbabble_spread = 0\nnoise_warmup_ms = 0\nhangover_ms = 0\n"
        "echo_window_ms = 0\nnoise_warmup_rise_db = 0\nnoise_spread_prior_db = 0\n"
    )
    assert policy.noise_rise_db == 0.0 and policy.babble_spread == 0.0
    assert policy.noise_warmup_ms == 0 and policy.hangover_ms == 0
    assert policy.echo_window_ms == 0 and policy.noise_spread_prior_db == 0.0
    BargeInDetector(policy)  # and the detector takes them


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_number_key_refuses_nan_and_infinities_by_name(value: str) -> None:
    # TOML has nan and inf; "noise_rise_db = nan" would pass a range check and
    # switch the rise test off without a word
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + f"[bargein]\nnoise_rise_db = {value}\n")
    assert "bargein.noise_rise_db" in str(info.value) and "finite" in str(info.value)

"""Config loading: every error is reported, naming its key; secrets stay out of repr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "fixtures" / "broken.toml"
DEMO = ROOT / "config" / "callbridge.toml"

MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
api_key = "sk-inline-secret"
[[routes]]
match = "*"
provider = "p"
"""


def test_demo_config_loads() -> None:
    cfg = load_config(DEMO)
    assert cfg.sip.listen == ("127.0.0.1:5060",)
    assert cfg.provider("local").embedded
    flow = cfg.flow(cfg.routes[0].flow)
    assert {s.name for s in flow.steps} >= {"menu", "about", "agent", "transfer", "goodbye"}
    kinds = {
        k
        for s in flow.steps
        for k, on in (
            ("say", s.say),
            ("gather", s.gathers),
            ("branch", s.branch),
            ("transfer", s.transfer),
            ("hangup", s.hangup),
            ("voice_agent", s.voice_agent),
        )
        if on
    }
    assert kinds == {"say", "gather", "branch", "transfer", "hangup", "voice_agent"}


EXPECTED_BROKEN = [
    "daemon.log_level: unknown value 'loud'",
    "daemon.drain_timeout_s: -1 is out of range",
    "sip.listen[0]: expected HOST:PORT",
    "sip.rtp_ports: range 30001-30000",
    "sip.codecs: unknown codec 'G729'",
    "sip.allow: not a CIDR: 'not-a-net'",
    "sip.max_calls: expected an integer, got a string",
    "sip.colour: unknown key",
    "media_streams.listen: expected HOST:PORT",
    "api.token: required when api.listen is not loopback",
    "bargein.min_speech_ms: must be a multiple of 20",
    "providers.main.protocol: unknown protocol 'kovaa' (expected one of kova, kugelaudio, "
    "kletso, coda, zwst)",
    "providers.main.url: expected a ws(s):// URL",
    "providers.nourl.url: missing",
    "routes[0].provider: unknown provider 'ghost'",
    "routes[0].flow: unknown flow 'nosuch'",
    "flows.bad.start: unknown step 'nowhere'",
    "flows.bad.steps.a.branch: a branch needs a gather",
    "flows.bad.steps.b.transfer: expected a sip: or tel: URI",
    "flows.bad.steps.c.trunk: unknown trunk 'nosuch'",
    "flows.bad.steps.d.trunk: a trunk needs a transfer in the same step",
]


def test_broken_config_reports_every_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BROKEN)
    errors = info.value.errors
    for expected in EXPECTED_BROKEN:
        assert any(e.startswith(expected) for e in errors), (expected, errors)


def test_check_config_cli_exit_codes() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "check-config", str(DEMO)],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 1 and "ok:" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "check-config", str(BROKEN)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    for expected in EXPECTED_BROKEN:
        assert expected in bad.stderr, expected


def test_secrets_from_file_and_env_and_not_in_repr(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-from-file\n")
    text = MINIMAL.replace('api_key = "sk-inline-secret"', 'api_key_file = "key"')
    text += '[api]\ntoken_env = "CB_TOKEN"\n'
    cfg = parse_config(text, str(tmp_path / "c.toml"), env={"CB_TOKEN": "tok-env"})
    assert cfg.provider("p").api_key == "sk-from-file"
    assert cfg.api.token == "tok-env"
    assert "sk-from-file" not in repr(cfg) and "tok-env" not in repr(cfg)


def test_secret_sources_are_exclusive_and_missing_env_named() -> None:
    text = MINIMAL.replace('api_key = "sk-inline-secret"', 'api_key = "a"\napi_key_env = "X"')
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert any(e.startswith("providers.p.api_key: give only one of") for e in info.value.errors)
    text = MINIMAL.replace('api_key = "sk-inline-secret"', 'api_key_env = "NOPE"')
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert info.value.errors == ["providers.p.api_key_env: environment variable 'NOPE' is not set"]


def test_invalid_toml_is_one_clear_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[sip\nlisten=", "x.toml")
    assert len(info.value.errors) == 1 and info.value.errors[0].startswith("x.toml: not valid TOML")


def test_route_matching_and_failover_chain() -> None:
    text = MINIMAL + '[[routes]]\nmatch = "sales*"\nprovider = ["p", "p"]\n'
    text = text.replace('match = "*"', 'match = "support"', 1)
    cfg = parse_config(text)
    assert cfg.route_for("support") is cfg.routes[0]
    assert cfg.route_for("sales-east") is cfg.routes[1]
    assert cfg.routes[1].provider == ("p", "p")
    assert cfg.route_for("other") is None


def test_defaults_bind_loopback() -> None:
    cfg = parse_config(MINIMAL)
    assert cfg.sip.listen == ("127.0.0.1:5060",)
    assert cfg.media_streams.listen.startswith("127.0.0.1:")
    assert cfg.api.listen.startswith("127.0.0.1:")


def test_provider_connection_settings_default_off_and_are_checked_by_name() -> None:
    p = parse_config(MINIMAL, env={}).provider("p")
    assert (p.turns_per_connection, p.flow_control_ahead_s) == (0, 0.0)
    assert p.close_idle_after_s == 60.0
    assert p.options == ()  # not passed to the engine as protocol options
    text = MINIMAL.replace(
        'api_key = "sk-inline-secret"',
        "turns_per_connection = 16\nflow_control_ahead_s = 4.5\nclose_idle_after_s = 0",
    )
    p = parse_config(text, env={}).provider("p")
    assert (p.turns_per_connection, p.flow_control_ahead_s, p.options) == (16, 4.5, ())
    assert p.close_idle_after_s == 0.0
    text = MINIMAL.replace(
        'api_key = "sk-inline-secret"',
        "turns_per_connection = 2.5\nflow_control_ahead_s = -1\nclose_idle_after_s = -5",
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert info.value.errors == [
        "providers.p.turns_per_connection: expected an integer, got a number",
        "providers.p.flow_control_ahead_s: -1 is out of range [0.0, 600.0]",
        "providers.p.close_idle_after_s: -5 is out of range [0.0, 86400.0]",
    ]


def test_text_pacing_is_on_by_default_but_for_providers_that_speak_whole_turns() -> None:
    assert parse_config(MINIMAL, env={}).provider("p").text_ahead_s == 3.0
    text = MINIMAL.replace('api_key = "sk-inline-secret"', "text_ahead_s = 1.5")
    assert parse_config(text, env={}).provider("p").text_ahead_s == 1.5
    kletso = MINIMAL.replace('protocol = "kova"', 'protocol = "kletso"')
    assert parse_config(kletso, env={}).provider("p").text_ahead_s == 0.0
    coda = MINIMAL.replace('protocol = "kova"', 'protocol = "coda"')
    assert parse_config(coda, env={}).provider("p").text_ahead_s == 3.0
    complete = coda.replace('api_key = "sk-inline-secret"', 'input_mode = "complete"')
    p = parse_config(complete, env={}).provider("p")
    assert p.text_ahead_s == 0.0 and p.options == (("input_mode", "complete"),)
    bad = MINIMAL.replace('api_key = "sk-inline-secret"', "text_ahead_s = -2")
    with pytest.raises(ConfigError) as info:
        parse_config(bad, env={})
    assert info.value.errors == ["providers.p.text_ahead_s: -2 is out of range [0.0, 600.0]"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_config_file_not_utf8_is_a_named_error_not_a_traceback(
    tmp_path: Path, command: str
) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(MINIMAL.encode() + "# caf\u00e9\n".encode("latin-1"))
    args = (
        ["check-config", str(path)]
        if command == "check-config"
        else ["serve", "--config", str(path)]
    )
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert f"error: {path}: not UTF-8 (line {MINIMAL.count(chr(10)) + 1}," in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_secret_file_not_utf8_is_named_by_key_and_its_bytes_never_shown(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "key").write_bytes(b"sk-\xff\xfe-Q7zWq\n")
    path = tmp_path / "c.toml"
    path.write_text(MINIMAL.replace('api_key = "sk-inline-secret"', 'api_key_file = "key"'))
    args = (
        ["check-config", str(path)]
        if command == "check-config"
        else ["serve", "--config", str(path)]
    )
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert "error: providers.p.api_key_file: 'key' is not UTF-8 (byte 3)" in out.stderr
    assert "Traceback" not in out.stderr
    assert "Q7zWq" not in out.stderr and "xff" not in out.stderr.lower()

"""``first_audio_timeout_s``: ``[daemon]`` (default 1 s), a provider's own overriding it, 0 off."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, parse_config

CONFIG = """
[daemon]
{daemon}

[providers.a]
protocol = "kova"
url = "wss://a.example/v1"
api_key = "k"
{provider}

[providers.b]
protocol = "kova"
url = "wss://b.example/v1"
api_key = "k"

[[routes]]
match = "*"
provider = ["a", "b"]
"""


def _parse(daemon: str = "", provider: str = "") -> object:
    return parse_config(CONFIG.format(daemon=daemon, provider=provider), "c.toml")


def test_default_one_second_and_no_provider_override() -> None:
    cfg = parse_config(CONFIG.format(daemon="", provider=""), "c.toml")
    assert cfg.daemon.first_audio_timeout_s == 1.0
    assert cfg.provider("a").first_audio_timeout_s is None


def test_a_provider_overrides_the_daemon_and_zero_is_off() -> None:
    cfg = parse_config(
        CONFIG.format(daemon="first_audio_timeout_s = 2.5", provider="first_audio_timeout_s = 0"),
        "c.toml",
    )
    assert cfg.daemon.first_audio_timeout_s == 2.5
    assert cfg.provider("a").first_audio_timeout_s == 0.0
    assert cfg.provider("b").first_audio_timeout_s is None


@pytest.mark.parametrize(
    ("daemon", "provider", "key"),
    [
        ("first_audio_timeout_s = -1", "", "daemon.first_audio_timeout_s"),
        ("", 'first_audio_timeout_s = "soon"', "providers.a.first_audio_timeout_s"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_key(daemon: str, provider: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse(daemon, provider)
    assert any(err.startswith(key) for err in e.value.errors)

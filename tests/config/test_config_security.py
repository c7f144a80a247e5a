"""What the daemon refuses to start with (issue 33): public edges fail closed, by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import ConfigError, parse_config

MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
api_key = "sk-inline-secret"
[[routes]]
match = "*"
provider = "p"
"""


def errors_of(text: str, path: str = "<string>", env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, path, env or {})
    return info.value.errors


def test_public_media_stream_listener_without_a_credential_refuses_to_start() -> None:
    text = MINIMAL + '[media_streams]\nlisten = "0.0.0.0:8080"\npublic_url = "wss://b.example"\n'
    (error,) = errors_of(text)
    assert error.startswith("media_streams.stream_token: a credential is required")
    assert "0.0.0.0:8080" in error


def test_public_media_stream_listener_needs_public_url_for_its_signatures() -> None:
    text = MINIMAL + '[media_streams]\nlisten = "[::]:8080"\nstream_token = "s3cret"\n'
    (error,) = errors_of(text)
    assert error.startswith("media_streams.public_url: required when media_streams.listen")


@pytest.mark.parametrize(
    "credential",
    [
        'stream_token = "s3cret"',
        'twilio_auth_token = "tw"',
        'plivo_auth_token = "pl"',
        "single_use_tokens = true",
    ],
)
def test_any_credential_opens_a_public_listener(credential: str) -> None:
    text = MINIMAL + (
        f'[media_streams]\nlisten = "0.0.0.0:8080"\npublic_url = "wss://b.example"\n{credential}\n'
    )
    assert parse_config(text, "<string>", {}).media_streams.listen == "0.0.0.0:8080"


def test_loopback_and_disabled_listeners_need_no_credential() -> None:
    assert parse_config(MINIMAL, "<string>", {}).media_streams.stream_token == ""
    text = MINIMAL + '[media_streams]\nenabled = false\nlisten = "0.0.0.0:8080"\n'
    assert not parse_config(text, "<string>", {}).media_streams.enabled


def test_an_empty_credential_file_is_an_error_not_a_check_turned_off(tmp_path: Path) -> None:
    (tmp_path / "twilio").write_text("\n")  # the installer's placeholder
    (tmp_path / "api").write_text("")
    text = MINIMAL + (
        '[media_streams]\ntwilio_auth_token_file = "twilio"\n[api]\ntoken_file = "api"\n'
    )
    errors = errors_of(text, str(tmp_path / "callbridge.toml"))
    assert errors == [
        "media_streams.twilio_auth_token_file: 'twilio' is empty",
        "api.token_file: 'api' is empty",
    ]


def test_an_empty_credential_variable_is_an_error() -> None:
    text = MINIMAL + '[media_streams]\nstream_token_env = "TOKEN"\n'
    assert errors_of(text, env={"TOKEN": ""}) == [
        "media_streams.stream_token_env: environment variable 'TOKEN' is empty"
    ]


def test_new_keys_have_safe_defaults_and_are_range_checked() -> None:
    cfg = parse_config(MINIMAL, "<string>", {})
    assert cfg.media_streams.max_streams == 1000
    assert cfg.media_streams.token_ttl_s == 30.0
    assert cfg.api.metrics_auth is True
    text = MINIMAL + "[media_streams]\nmax_streams = 0\ntoken_ttl_s = 0\n"
    errors = errors_of(text)
    assert [e.split(":")[0] for e in errors] == [
        "media_streams.token_ttl_s",
        "media_streams.max_streams",
    ]
    text = MINIMAL + "[api]\nmetrics_auth = false\n"
    assert parse_config(text, "<string>", {}).api.metrics_auth is False

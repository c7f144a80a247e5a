"""Keys a config must not accept silently (issue 31): provider options each protocol does not
declare, listen addresses that are not addresses, and a route no call can reach."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bridge.config import PROTOCOLS, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]

ROUTE = '[[routes]]\nmatch = "*"\nprovider = "main"\n'


def provider(protocol: str, extra: str) -> str:
    return f'[providers.main]\nprotocol = "{protocol}"\nurl = "ws://127.0.0.1:1/x"\n{extra}\n'


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml")
    return info.value.errors


def test_a_typo_of_api_key_is_an_error_naming_the_key_and_the_right_one() -> None:
    assert errors(provider("kova", 'apikey = "secret-1"') + ROUTE) == [
        "providers.main.apikey: unknown key (did you mean api_key?); kova options: "
        "start_timeout_s, reply_timeout_s, close_timeout_s, encoding, sample_rate"
    ]


def test_the_value_of_a_mistyped_secret_never_reaches_the_error() -> None:
    (error,) = errors(provider("kugelaudio", 'apikey = "ka-secret-xyz"') + ROUTE)
    assert "ka-secret-xyz" not in error


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_declared_option_is_accepted_with_a_value_of_its_type(protocol: str) -> None:
    declared = importlib.import_module(f"bridge.providers.{protocol}.client").OPTIONS
    assert declared, f"{protocol} declares no options"
    sample = {str: '"x"', int: "5", float: "2.5", bool: "true"}
    lines = [
        f'{k} = "{kind[0]}"' if isinstance(kind, tuple) else f"{k} = {sample[kind]}"
        for k, kind in declared.items()
    ]
    cfg = parse_config(provider(protocol, "\n".join(lines)) + ROUTE, "t.toml")
    assert dict(cfg.providers[0].options).keys() == declared.keys()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_option_of_another_protocol_is_unknown(protocol: str) -> None:
    """``idle_flush_s`` is KugelAudio's, ``input_mode`` Coda's: neither means anything
    elsewhere."""
    key = "input_mode" if protocol != "coda" else "idle_flush_s"
    (error,) = errors(provider(protocol, f'{key} = "x"') + ROUTE)
    assert error.startswith(f"providers.main.{key}: unknown key")


@pytest.mark.parametrize(
    ("protocol", "line", "message"),
    [
        ("kova", 'reply_timeout_s = "10"', "expected a number, got a string"),
        ("kova", "sample_rate = 8000.5", "expected an integer, got a number"),
        ("kova", 'encoding = "opus"', "unknown value 'opus' (expected one of pcm, linear16"),
        ("kugelaudio", 'normalize = "yes"', "expected true or false, got a string"),
        ("kletso", 'mode = "auto"', "unknown value 'auto' (expected one of vad, ptt)"),
        ("coda", "language = 1", "expected a string, got an integer"),
        ("zwst", "word_timestamps = 1", "expected true or false, got an integer"),
    ],
)
def test_an_option_of_the_wrong_type_is_an_error_naming_the_key(
    protocol: str, line: str, message: str
) -> None:
    key = line.split(" ")[0]
    (error,) = errors(provider(protocol, line) + ROUTE)
    assert error.startswith(f"providers.main.{key}: {message}"), error


def test_an_integer_is_a_number() -> None:
    cfg = parse_config(provider("kova", "reply_timeout_s = 10") + ROUTE, "t.toml")
    assert cfg.providers[0].options == (("reply_timeout_s", 10),)


@pytest.mark.parametrize(
    ("listen", "key", "message"),
    [
        ('"300.1.2.3:5070"', "sip.listen", "'300.1.2.3' is not an IPv4 address"),
        ('["127.0.0.1:5060", "1.2.3:5060"]', "sip.listen[1]", "'1.2.3' is not an IPv4"),
        ('"[::g]:5060"', "sip.listen", "expected HOST:PORT"),
        ('"bad_host!:5060"', "sip.listen", "'bad_host!' is not a host name"),
    ],
)
def test_a_listen_address_that_is_no_address_is_an_error_naming_the_key(
    listen: str, key: str, message: str
) -> None:
    (error,) = errors(f"[sip]\nlisten = {listen}\n" + provider("kova", "") + ROUTE)
    assert error.startswith(f"{key}: {message}"), error


@pytest.mark.parametrize(
    "listen", ['"0.0.0.0:5060"', '"[::1]:5070"', '"localhost:5060"', '"sip.example.com:5060"']
)
def test_addresses_and_host_names_are_accepted(listen: str) -> None:
    cfg = parse_config(f"[sip]\nlisten = {listen}\n" + provider("kova", "") + ROUTE, "t.toml")
    assert cfg.sip.listen == (listen.strip('"'),)


def test_other_listen_keys_check_the_host_too() -> None:
    text = '[media_streams]\nlisten = "10.0.0.256:8080"\n' + provider("kova", "") + ROUTE
    assert errors(text) == ["media_streams.listen: '10.0.0.256' is not an IPv4 address in "
                            "'10.0.0.256:8080'"]  # fmt: skip


def test_a_second_route_with_the_same_match_is_an_error_naming_it() -> None:
    routes = ROUTE.replace('"*"', '"sales"') + ROUTE + ROUTE.replace('"*"', '"sales"')
    assert errors(provider("kova", "") + routes) == [
        "routes[2].match: 'sales' is routes[0]'s match too: this route is never reached"
    ]


def test_routes_with_different_matches_load() -> None:
    routes = ROUTE.replace('"*"', '"sales"') + ROUTE
    cfg = parse_config(provider("kova", "") + routes, "t.toml")
    assert [r.match for r in cfg.routes] == ["sales", "*"]


def test_the_shipped_configs_still_load() -> None:
    shipped = sorted((ROOT / "config").glob("*.toml"))
    assert shipped
    for path in shipped:
        assert load_config(str(path)).routes, path

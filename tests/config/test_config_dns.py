"""``[sip] dns_servers``: the DNS servers RFC 3263 server location asks."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, parse_config

ROUTE = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"

[[routes]]
match = "*"
provider = "p"
greeting = "Hi."
"""


def test_default_is_the_systems_and_addresses_with_ports_are_kept() -> None:
    assert parse_config(ROUTE).sip.dns_servers == ()
    cfg = parse_config('[sip]\ndns_servers = ["127.0.0.1:5353", "::1"]\n' + ROUTE)
    assert cfg.sip.dns_servers == ("127.0.0.1:5353", "::1")


@pytest.mark.parametrize("value", ['["ns.example.com"]', '["127.0.0.1:0"]', '["1.2.3.4:x"]'])
def test_bad_values_are_errors_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(f"[sip]\ndns_servers = {value}\n" + ROUTE)
    assert any(err.startswith("sip.dns_servers") for err in e.value.errors), e.value.errors

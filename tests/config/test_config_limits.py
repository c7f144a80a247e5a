"""The listeners' connection limits: defaults, per section, errors naming the key."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, ConnectionLimits, parse_config
from bridge.io.connlimits import ConnectionGate

ROUTE = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:9/v1/ws/kova"

[[routes]]
match = "*"
provider = "p"
greeting = "Hi."
"""


def test_defaults_and_per_section_values() -> None:
    cfg = parse_config(
        "[sip]\nmax_connections = 10\nidle_timeout_s = 0\n"
        "[media_streams]\nmax_connections_per_source = 7\n"
        "[api]\nheader_timeout_s = 2.5\n" + ROUTE
    )
    assert cfg.sip.limits == ConnectionLimits(10, 10, 10.0, 0.0)  # per source <= the cap
    assert cfg.media_streams.limits == ConnectionLimits(4096, 7, 10.0, 0.0)
    assert cfg.api.limits == ConnectionLimits(4096, 1024, 2.5, 0.0)
    assert parse_config(ROUTE).sip.limits.idle_timeout_s == 1800.0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[sip]\nmax_connections = 0\n", "sip.max_connections"),
        ("[api]\nmax_connections = 5\nmax_connections_per_source = 6\n",
         "api.max_connections_per_source"),
        ("[media_streams]\nheader_timeout_s = 0\n", "media_streams.header_timeout_s"),
        ("[media_streams]\nheader_timeout_s = \"10\"\n", "media_streams.header_timeout_s"),
        ("[api]\nidle_timeout_s = 5\n", "api.idle_timeout_s"),  # SIP over TCP only
    ],
)  # fmt: skip
def test_bad_values_are_errors_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text + ROUTE)
    assert any(err.startswith(f"{key}:") for err in e.value.errors), e.value.errors


def test_gate_counts_in_all_and_by_source() -> None:
    gate = ConnectionGate(ConnectionLimits(max_connections=3, max_connections_per_source=2))
    assert gate.admit("a") is None and gate.admit("a") is None
    assert gate.admit("a") == "max_connections_per_source"
    assert gate.admit("b") is None
    assert gate.admit("c") == "max_connections"
    assert (gate.open, gate.refused_per_source, gate.refused_total) == (3, 1, 1)
    gate.release("a")
    gate.release("unknown")  # never admitted: nothing to give back
    assert gate.from_source("a") == 1 and gate.open == 2
    assert gate.admit("c") is None
    for source in ("a", "b", "c"):
        gate.release(source)
    assert gate.open == 0 and gate.from_source("a") == 0

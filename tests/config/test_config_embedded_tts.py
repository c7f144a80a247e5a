"""``[daemon] embedded_tts_*``: the embedded TTS server's workers, queue, wait and priority."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, parse_config, parse_cpu_list

ROUTE = """
[providers.p]
protocol = "kova"
url = "embedded"
[[routes]]
match = "*"
provider = "p"
"""


def test_defaults() -> None:
    d = parse_config(ROUTE).daemon
    assert (d.embedded_tts_workers, d.embedded_tts_queue) == (0, 1)
    assert (d.embedded_tts_max_wait_s, d.embedded_tts_nice) == (1.0, 10)


def test_values_are_read() -> None:
    text = (
        "[daemon]\nembedded_tts_workers = 3\nembedded_tts_queue = 0\n"
        "embedded_tts_max_wait_s = 0.25\nembedded_tts_nice = 19\n"
        'embedded_tts_cpus = "0"\n' + ROUTE
    )
    d = parse_config(text).daemon
    assert d.embedded_tts_cpus == "0"
    assert parse_cpu_list(" 1, 3-4") == {1, 3, 4}
    assert (d.embedded_tts_workers, d.embedded_tts_queue) == (3, 0)
    assert (d.embedded_tts_max_wait_s, d.embedded_tts_nice) == (0.25, 19)


@pytest.mark.parametrize(
    "line",
    [
        "embedded_tts_workers = -1",
        "embedded_tts_queue = 1.5",
        "embedded_tts_max_wait_s = 0",
        "embedded_tts_nice = 20",
        'embedded_tts_workers = "two"',
        'embedded_tts_cpus = "1-"',
        'embedded_tts_cpus = "3-1"',
        'embedded_tts_cpus = "²"',
        'embedded_tts_cpus = "4096"',
    ],
)
def test_bad_values_are_errors_naming_the_key(line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[daemon]\n{line}\n" + ROUTE)
    key = line.split(" = ")[0]
    assert any(e.startswith(f"daemon.{key}:") for e in info.value.errors), info.value.errors

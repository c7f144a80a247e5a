"""``[providers.NAME] encoding`` / ``sample_rate`` force the format every turn asks for."""

from __future__ import annotations

import json

from bridge.engine import SendText
from bridge.providers.base import MULAW_8K, ProviderSettings, TurnSettings
from bridge.providers.kova.client import KovaProtocol


def _start_format(**options: str | int | float | bool) -> object:
    settings = ProviderSettings(
        "k", "kova", "wss://kova.example/v1/ws", options=tuple(options.items())
    )
    client = KovaProtocol(settings)
    client.connection_made(None, 0.0)
    client.open_turn("t1", TurnSettings("cal", MULAW_8K), 0.0)
    sent = [a for a in client.actions_to_send() if isinstance(a, SendText)]
    return json.loads(sent[0].text)["start_context"]["response_format"]


def test_without_options_a_g711_leg_asks_for_pass_through() -> None:
    assert _start_format() == {"encoding": "mulaw", "sample_rate": 8000}


def test_options_force_24k_pcm_on_a_g711_leg() -> None:
    assert _start_format(encoding="pcm", sample_rate=24000) == {
        "encoding": "pcm",
        "sample_rate": 24000,
    }


def test_sample_rate_alone_means_pcm() -> None:
    assert _start_format(sample_rate=16000) == {"encoding": "pcm", "sample_rate": 16000}

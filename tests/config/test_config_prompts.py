"""The prompt keys: ``[daemon] cache_dir``, ``prerender_wait_s``, ``fallback_prompt`` and the
route's own, and which prompts the config makes static (rendered at start-up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import ConfigError, parse_config
from bridge.providers.base import ALAW_8K, MULAW_8K
from bridge.providers.prompts import PCM_16K, StaticPrompt, prerender_formats, static_prompts

CONFIG = """
[daemon]
cache_dir = "{cache_dir}"
prerender_wait_s = {wait}
fallback_prompt = "Sorry."

[sip]
codecs = ["PCMA", "PCMU"]

[providers.a]
protocol = "kova"
url = "wss://a.example/v1"
api_key = "k"

[providers.b]
protocol = "kova"
url = "wss://b.example/v1"
api_key = "k"

[providers.agent]
protocol = "kletso"
url = "wss://c.example/v1/realtime"
api_key = "k"

[flows.menu]
start = "menu"

[flows.menu.steps.menu]
say = "Press one."
next = "bye"

[flows.menu.steps.bye]
say = "Goodbye."
hangup = true

[[routes]]
match = "1*"
provider = ["b", "a"]
greeting = "Hello."
flow = "menu"
voice = "anna"
fallback_prompt = "We are having trouble."

[[routes]]
match = "2*"
provider = "agent"
greeting = "Agent here."

[[routes]]
match = "*"
provider = "a"
greeting = "Hello."
"""


def test_the_keys_and_a_relative_cache_dir(tmp_path: Path) -> None:
    cfg = parse_config(CONFIG.format(cache_dir="cache", wait=5), str(tmp_path / "c.toml"))
    assert cfg.daemon.cache_dir == str(tmp_path / "cache")
    assert cfg.daemon.prerender_wait_s == 5 and cfg.daemon.fallback_prompt == "Sorry."
    assert cfg.routes[0].fallback_prompt == "We are having trouble."
    assert cfg.routes[1].fallback_prompt == ""
    absolute = parse_config(CONFIG.format(cache_dir="/var/cache/cb", wait=0), "c.toml")
    assert absolute.daemon.cache_dir == "/var/cache/cb"
    assert parse_config(CONFIG.format(cache_dir="", wait=0), "c.toml").daemon.cache_dir == ""


def test_a_bad_prerender_wait_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(CONFIG.format(cache_dir="", wait=-1), str(tmp_path / "c.toml"))
    assert any(err.startswith("daemon.prerender_wait_s") for err in e.value.errors)


def test_static_prompts_are_every_greeting_flow_say_and_fallback_once() -> None:
    cfg = parse_config(CONFIG.format(cache_dir="", wait=0), "c.toml")
    assert static_prompts(cfg) == [
        StaticPrompt("b", "anna", "Hello."),
        StaticPrompt("b", "anna", "Press one."),
        StaticPrompt("b", "anna", "Goodbye."),
        StaticPrompt("b", "anna", "We are having trouble."),
        StaticPrompt("a", "", "Hello."),
        StaticPrompt("a", "", "Sorry."),
    ]
    assert prerender_formats(cfg) == [MULAW_8K, ALAW_8K]  # SIP prefers PCMA here


def test_prompts_are_prerendered_at_16khz_where_sip_or_a_trunk_prefers_g722() -> None:
    base = CONFIG.format(cache_dir="", wait=0)
    assert PCM_16K not in prerender_formats(parse_config(base, "c.toml"))
    wide = base.replace('codecs = ["PCMA", "PCMU"]', 'codecs = ["G722", "PCMA", "PCMU"]')
    assert wide != base
    assert PCM_16K in prerender_formats(parse_config(wide, "c.toml"))


def test_prompts_are_prerendered_at_16khz_where_sip_prefers_opus() -> None:
    base = CONFIG.format(cache_dir="", wait=0)
    opus = base.replace('codecs = ["PCMA", "PCMU"]', 'codecs = ["OPUS", "PCMA", "PCMU"]')
    assert opus != base
    assert PCM_16K in prerender_formats(parse_config(opus, "c.toml"))
    later = base.replace('codecs = ["PCMA", "PCMU"]', 'codecs = ["PCMA", "OPUS"]')
    assert PCM_16K not in prerender_formats(parse_config(later, "c.toml"))  # not preferred

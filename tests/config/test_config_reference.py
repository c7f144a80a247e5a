"""``config/README.md``'s key tables are generated from the settings' fields: they cannot
drift from the code, and what they say a default is, is what an empty section reads."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import (
    REFERENCE,
    ApiConfig,
    DaemonConfig,
    MediaStreamsConfig,
    SipConfig,
    parse_config,
    reference_tables,
    render_reference,
)
from bridge.media.bargein import BargeInPolicy
from bridge.settings import setting_of

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "config" / "README.md"

MINIMAL = """
[providers.p]
protocol = "kova"
url = "ws://127.0.0.1:1/v1/ws/kova"
[[routes]]
match = "*"
provider = "p"
"""


def test_the_readme_tables_are_the_ones_the_code_generates() -> None:
    text = README.read_text(encoding="utf-8")
    assert render_reference(text) == text, (
        "config/README.md's generated tables differ from the code: run `make config-reference`"
    )


def test_a_table_edited_by_hand_is_rewritten_from_the_code() -> None:
    """The check above can fail: a table edited by hand is rewritten from the code."""
    text = README.read_text(encoding="utf-8")
    edited = text.replace(
        "| `drain_timeout_s` | number (s), 0–3600 | `30` |",
        "| `drain_timeout_s` | number (s), 0–3600 | `31` |",
    )
    assert edited != text
    assert render_reference(edited) == text


def test_every_key_is_in_a_table() -> None:
    tables = "\n".join(reference_tables().values())
    for cls, _ in REFERENCE.values():
        for f in dataclasses.fields(cls):
            s = setting_of(f)
            if s is None or s.kind == "flat" or s.extra is not None:
                continue
            key = s.key or f.name
            assert f"`{key}`" in tables or f"`{key}.NAME`" in tables, (cls.__name__, key)


@pytest.mark.parametrize(
    ("section", "default"),
    [
        ("daemon", DaemonConfig()),
        ("sip", SipConfig()),
        ("media_streams", MediaStreamsConfig()),
        ("api", ApiConfig()),
        ("bargein", BargeInPolicy()),
    ],
)
def test_an_empty_section_reads_the_defaults_the_reference_shows(
    section: str, default: object
) -> None:
    cfg = parse_config(MINIMAL + f"[{section}]\n", env={})
    assert getattr(cfg, section) == default


def test_the_reference_command_prints_every_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bridge.config", "--reference"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for name, table in reference_tables().items():
        assert f"from the code: {name} -->\n{table}\n" in out.stdout, name


def test_a_readme_without_a_region_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="no generated region 'daemon'"):
        render_reference("# no tables here\n")

"""Where a bench writes its JSON: a bare name goes to bench/results, a path is a path."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import RESULTS, results_path, write


def test_bare_name_goes_to_results() -> None:
    assert results_path("sip_s19") == RESULTS / "sip_s19.json"


def test_path_with_suffix_is_taken_as_given() -> None:
    # `--out bench/results/sip.json` once became bench/results/bench/results/sip.json.json
    assert results_path("bench/results/sip.json") == Path("bench/results/sip.json")
    assert results_path("/tmp/x/run.json") == Path("/tmp/x/run.json")


def test_path_without_suffix_gets_one() -> None:
    assert results_path("/tmp/x/run") == Path("/tmp/x/run.json")


def test_write_creates_the_directory(tmp_path: Path) -> None:
    out = write(str(tmp_path / "deep" / "r.json"), {"a": 1}, {"s": 2})
    assert out == tmp_path / "deep" / "r.json"
    doc = json.loads(out.read_text())
    assert doc["figures"] == {"a": 1} and doc["settings"] == {"s": 2}
    assert "machine" in doc

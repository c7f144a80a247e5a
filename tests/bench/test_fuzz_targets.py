"""The coverage-guided fuzz targets of ``bench/fuzz/`` (issue 33), without atheris.

Every target's seeds (built from the test fixtures) replay through its
``test_one_input`` (so a target that rots, or a fixture that starts failing a
target's invariants, shows up here), and every crash input the fuzzers found
is kept under ``tests/fixtures/fuzz/<target>/`` and replayed the same way.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

TARGETS = ["sip", "sdp", "digest", "streams", "app", "providers"]
CRASHES = ROOT / "tests" / "fixtures" / "fuzz"


def target(name: str) -> ModuleType:
    return importlib.import_module(f"bench.fuzz.fuzz_{name}")


def test_every_fuzz_script_is_listed() -> None:
    scripts = sorted(
        p.stem.removeprefix("fuzz_") for p in (ROOT / "bench" / "fuzz").glob("fuzz_*.py")
    )
    assert sorted([*TARGETS, "common"]) == scripts


@pytest.mark.parametrize("name", TARGETS)
def test_every_seed_passes_its_target(name: str) -> None:
    module = target(name)
    seeds = module.seeds()
    assert len(seeds) >= 3, name  # the fixtures were found
    for seed in seeds:
        module.test_one_input(seed)


CRASH_FILES = sorted(CRASHES.glob("*/*")) if CRASHES.is_dir() else []


@pytest.mark.parametrize(
    "path", CRASH_FILES, ids=[f"{p.parent.name}/{p.name}" for p in CRASH_FILES]
)
def test_every_crash_found_stays_fixed(path: Path) -> None:
    target(path.parent.name).test_one_input(path.read_bytes())

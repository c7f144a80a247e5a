"""The generic reader (``bridge.settings``) on a dataclass of its own: a key is one field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.settings import Reader, Spot, read, reference_rows, register_check, setting


def _even(value: int, at: Spot) -> int:
    if value % 2:
        at.error(f"must be even, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Toy:
    """A section with one key of each kind the reader knows."""

    on: bool = setting(True, "switch")
    size: int = setting(4, "how many", lo=0, hi=10)
    ratio: float = setting(0.5, "a share", lo=0.0, hi=1.0)
    mode: str = setting("a", "which", choices=("a", "b"))
    names: tuple[str, ...] = setting(("x",), "some names")
    password: str = setting("", "a secret", secret=True)
    frame_ms: int = setting(20, "a duration", lo=0, hi=100, multiple_of=20, why_multiple="a frame")
    pairs: int = setting(2, "must be even", key="sub.pairs", lo=0, hi=100, check=_even)


@dataclass(frozen=True, slots=True)
class Bounds:
    low: int = setting(1, "", lo=0, hi=100)
    high: int = setting(10, "", lo=0, hi=100)


def _low_below_high(values: dict[str, Any], at: Spot) -> None:
    if values["low"] > values["high"]:
        at.error(f"{values['low']} exceeds high ({values['high']})", "low")


register_check(Bounds, _low_below_high)


def load(
    cls: type, table: dict[str, Any], env: dict[str, str] | None = None
) -> tuple[Any, list[str]]:
    errors: list[str] = []
    value = read(cls, table, "toy", Reader(errors, env or {}, Path(".")))
    return value, errors


def test_defaults_when_nothing_is_given() -> None:
    assert load(Toy, {}) == (Toy(), [])


def test_values_of_every_kind_are_read() -> None:
    toy, errors = load(
        Toy,
        {"on": False, "size": 7, "ratio": 1, "mode": "b", "names": "y", "frame_ms": 40,
         "sub": {"pairs": 6}, "password_env": "PW"},
        env={"PW": "s3"},
    )  # fmt: skip
    assert errors == []
    assert toy == Toy(False, 7, 1.0, "b", ("y",), "s3", 40, 6)
    assert isinstance(toy.ratio, float)
    assert "s3" not in repr(toy)


def test_every_problem_is_reported_naming_its_key() -> None:
    toy, errors = load(
        Toy,
        {"on": 1, "size": 11, "ratio": float("nan"), "mode": "c", "names": [1],
         "frame_ms": 30, "sub": {"pairs": 3, "pears": 1}, "sizes": 2, "password": "a",
         "password_env": "PW"},
    )  # fmt: skip
    assert errors == [
        "toy.sub.pears: unknown key (did you mean pairs?)",
        "toy.sizes: unknown key (did you mean size?)",
        "toy.on: expected true or false, got an integer",
        "toy.size: 11 is out of range [0, 10]",
        "toy.ratio: nan is not a finite number",
        "toy.mode: unknown value 'c' (expected one of a, b)",
        "toy.names: expected a string or a list of strings",
        "toy.password: give only one of password, password_env",
        "toy.frame_ms: must be a multiple of 20 (a frame), got 30",
        "toy.sub.pairs: must be even, got 3",
    ]
    assert toy.size == 4 and toy.mode == "a"  # a wrong value reads as its default


def test_file_and_env_forms_are_for_secrets_only() -> None:
    _, errors = load(Toy, {"mode_env": "X", "size_file": "f"})
    assert errors == [
        "toy.mode_env: unknown key (did you mean mode?)",
        "toy.size_file: unknown key (did you mean size?)",
    ]


def test_a_sub_table_that_is_no_table_is_named() -> None:
    _, errors = load(Toy, {"sub": 3})
    assert errors == ["toy.sub: expected a table, got an integer"]


def test_a_class_check_sees_the_values_read() -> None:
    assert load(Bounds, {"low": 5}) == (Bounds(5, 10), [])
    _, errors = load(Bounds, {"low": 50, "high": 20})
    assert errors == ["toy.low: 50 exceeds high (20)"]


def test_the_reference_rows_come_from_the_same_fields() -> None:
    rows = {r.key: r for r in reference_rows(Toy)}
    assert list(rows) == [
        "`on`", "`size`", "`ratio`", "`mode`", "`names`", "`password`", "`frame_ms`",
        "`sub.pairs`",
    ]  # fmt: skip
    assert (rows["`size`"].type, rows["`size`"].default, rows["`size`"].doc) == (
        "integer, 0–10",
        "`4`",
        "how many",
    )
    assert rows["`frame_ms`"].type == "integer (ms), multiple of 20, 0–100"
    assert rows["`mode`"].type == "`a` / `b`" and rows["`mode`"].default == '`"a"`'
    assert rows["`password`"].type == "secret"


def test_a_default_needs_a_kind_the_reader_knows() -> None:
    with pytest.raises(TypeError, match="give the kind"):
        setting(object(), "what")

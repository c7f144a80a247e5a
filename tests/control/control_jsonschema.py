"""A tiny JSON Schema (2020-12 subset) validator for the protocol and OpenAPI tests.

``jsonschema`` is not installed in the project venv, and the schemas here use
a small subset. Any keyword outside that subset makes ``validate`` raise
``UnsupportedKeyword``, so a schema can never rely on a rule this validator
silently skips.
"""

from __future__ import annotations

import re
from typing import Any

ANNOTATIONS = {
    "$schema", "$id", "title", "description", "examples", "default", "$comment",
    "format", "example", "readOnly", "writeOnly", "deprecated",
}  # fmt: skip
CHECKED = {
    "$ref", "$defs", "type", "const", "enum", "pattern", "minLength", "maxLength",
    "minimum", "maximum", "required", "properties", "additionalProperties", "oneOf",
    "anyOf", "allOf", "items", "minItems", "maxItems",
}  # fmt: skip


class UnsupportedKeyword(Exception):
    pass


def _type_ok(value: Any, name: str) -> bool:
    match name:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "null":
            return value is None
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
    raise UnsupportedKeyword(f"type {name!r}")


def _ecma(pattern: str) -> str:
    # ECMA-262 '$' (no multiline flag) matches only at the very end; Python's
    # also matches before a final newline.
    return pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern


def errors(
    value: Any, schema: dict[str, Any] | bool, root: dict[str, Any], at: str = "$"
) -> list[str]:
    """Every violation of ``schema`` by ``value`` (empty: valid)."""
    if schema is True:
        return []
    if schema is False:
        return [f"{at}: no value allowed"]
    unknown = set(schema) - ANNOTATIONS - CHECKED
    if unknown:
        raise UnsupportedKeyword(", ".join(sorted(unknown)))
    out: list[str] = []
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise UnsupportedKeyword(f"$ref {ref}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        out += errors(value, target, root, at)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_type_ok(value, n) for n in names):
            return [*out, f"{at}: expected {schema['type']}"]
    if "const" in schema and not _same(value, schema["const"]):
        out.append(f"{at}: expected {schema['const']!r}")
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        out.append(f"{at}: not one of {schema['enum']!r}")
    if isinstance(value, str):
        if "pattern" in schema and re.search(_ecma(schema["pattern"]), value) is None:
            out.append(f"{at}: does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{at}: too short")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{at}: too long")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{at}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{at}: above {schema['maximum']}")
    if isinstance(value, dict):
        out += _object(value, schema, root, at)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{at}: too few items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{at}: too many items")
        if "items" in schema:
            for i, item in enumerate(value):
                out += errors(item, schema["items"], root, f"{at}[{i}]")
    for sub in schema.get("allOf", []):
        out += errors(value, sub, root, at)
    if "anyOf" in schema and all(errors(value, s, root, at) for s in schema["anyOf"]):
        out.append(f"{at}: matches none of anyOf")
    if "oneOf" in schema:
        n = sum(not errors(value, s, root, at) for s in schema["oneOf"])
        if n != 1:
            out.append(f"{at}: matches {n} of oneOf (expected exactly 1)")
    return out


def _object(
    value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], at: str
) -> list[str]:
    out = [f"{at}.{k}: required" for k in schema.get("required", []) if k not in value]
    props = schema.get("properties", {})
    for key, item in value.items():
        if key in props:
            out += errors(item, props[key], root, f"{at}.{key}")
        elif "additionalProperties" in schema:
            out += errors(item, schema["additionalProperties"], root, f"{at}.{key}")
    return out


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def is_valid(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> bool:
    return not errors(value, schema, root if root is not None else schema)

"""Unicode and hostile numbers in application commands never raise (issue 33).

Every field of every command gets text a parser trips on (digits that pass
``str.isdigit``, line and paragraph separators, bidi overrides, NUL, lone
surrogates as JSON escapes) or a number too large for a double: the decoder
answers a ``Command`` or an ``AppError`` naming a field, never raises.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.commands import Command
from bridge.control.app import COMMAND_FIELDS, COMMAND_TYPES, AppError, decode_command

TRICKY = "²³٣०０\u2028\u2029\u202e\u200b\x00\x85\ufeff"
HOSTILE_TEXT = st.text(st.characters(codec=None) | st.sampled_from(TRICKY), max_size=24)
HOSTILE = st.one_of(
    HOSTILE_TEXT,
    st.sampled_from([10**400, -(10**400), 2**63, 1e308, True, None, [], {}]),
)
FIELDS = sorted({f.name for specs in COMMAND_FIELDS.values() for f in specs} | {"id", "type"})


def decoded(text: str) -> Command | AppError:
    result = decode_command(text)
    assert isinstance(result, Command | AppError), result
    return result


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.sampled_from(COMMAND_TYPES), st.dictionaries(st.sampled_from(FIELDS), HOSTILE, max_size=5)
)
def test_hostile_values_in_any_field_never_raise(ctype: str, fields: dict[str, object]) -> None:
    obj = {"type": ctype, **fields}
    decoded(json.dumps(obj))
    decoded(json.dumps(obj, ensure_ascii=False))
    decoded(json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def test_lone_surrogates_and_unicode_digits_are_refused_by_field() -> None:
    result = decoded('{"type": "say", "turn_id": "t\\udcff", "text": "hi"}')
    assert isinstance(result, AppError) and result.field == "turn_id"
    result = decoded('{"type": "dtmf", "digits": "1²3"}')
    assert isinstance(result, AppError) and result.field == "digits"
    result = decoded('{"type": "hangup", "reason": "bye\\u2028now"}')
    assert isinstance(result, AppError) and result.field == "reason"
    assert isinstance(decoded(b'{"type": "say", "text": "\xed\xb3\xbf"}'), AppError)

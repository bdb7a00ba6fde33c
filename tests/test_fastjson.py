"""common.fastjson reads and writes what the json module does, orjson or not."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.common import fastjson

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20
)


def same(a, b) -> bool:
    """Equal, with the types the json module gives (1 and 1.0 differ)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_values_are_the_json_modules(value):
    text = json.dumps(value)
    assert same(fastjson.loads(text), json.loads(text))
    assert same(fastjson.loads(text.encode()), json.loads(text))
    written = fastjson.dumps(value)
    assert same(json.loads(written), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "12345678901234567890123",  # past 64 bits: exact, not a float
        "-18446744073709551617",
        '{"id": 123456789012345678901234567890}',
        "[NaN, Infinity, -Infinity]",  # orjson refuses them
        "1e400",
        "[1.00000000000000000000000001]",
        '"\\ud800"',  # a lone surrogate escape
        '"19 digits: 1234567890123456789 in a string"',
    ],
)
def test_what_orjson_reads_differently_is_read_by_the_json_module(text):
    assert same(fastjson.loads(text), json.loads(text))


def test_hooks_decide_where_the_json_module_reads():
    def refuse(text):
        raise ValueError(f"refused {text}")

    with pytest.raises(ValueError, match="refused NaN"):
        fastjson.loads("[1, NaN]", parse_constant=refuse)
    assert fastjson.loads("[1.5, 2]", parse_float=refuse, parse_int=refuse) == [1.5, 2]  # orjson's: no hook needed
    with pytest.raises(json.JSONDecodeError):
        fastjson.loads('{"a": }')


def test_integers_past_64_bits_are_written_exactly():
    assert fastjson.dumps({"n": 2**70, "s": "é"}) == '{"n":1180591620717411303424,"s":"é"}'.encode()
    assert fastjson.dumps([1, 2.5, None]) == b"[1,2.5,null]"

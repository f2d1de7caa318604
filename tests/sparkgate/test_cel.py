"""Writing CEL for kube-apiserver (sparkgate/cel.py): literals that its checker accepts and that evaluate to
the JSON they stand for, glob translation equal to fnmatch, JSON Pointers escaped as RFC 6901 says."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.cel import evaluate
from sparkgate import cel

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_a_literal_evaluates_to_the_json_it_stands_for(value: Any) -> None:
    assert evaluate(cel.literal(value), {}) == value


def test_mixed_members_are_wrapped_in_dyn_so_the_literal_is_homogeneous() -> None:
    """HomogeneousAggregateLiterals (k8s.io/apiserver/pkg/cel/environment/base.go) refuses
    `{"name": "v", "configMap": {"name": "c"}}` at policy creation; all-dyn members are accepted."""
    assert cel.literal({"name": "v", "configMap": {"name": "c"}}) == (
        '{"name": dyn("v"), "configMap": dyn({"name": "c"})}'
    )
    assert cel.literal({"a": "x", "b": "y"}) == '{"a": "x", "b": "y"}'
    assert cel.literal([1, 2]) == "[1, 2]"
    assert cel.literal([1, 2.5]) == "[dyn(1), dyn(2.5)]"
    assert cel.literal([{"a": 1}, {"a": "x"}]) == '[dyn({"a": 1}), dyn({"a": "x"})]'
    assert cel.literal([[], ["x"]]) == '[dyn([]), dyn(["x"])]'


def test_strings_are_quoted_for_cel() -> None:
    assert cel.quote('a"b\\c\n') == '"a\\"b\\\\c\\u000a"'
    assert evaluate(cel.quote('a"b\\c\n\u00e9'), {}) == 'a"b\\c\n\u00e9'


NAMESPACE = st.text(alphabet="abz09-", max_size=8)
PATTERN = st.text(alphabet="abz09-*?[]!^", max_size=8)


@settings(max_examples=500, deadline=None)
@given(NAMESPACE, PATTERN)
def test_a_glob_matches_exactly_what_fnmatch_matches(namespace: str, pattern: str) -> None:
    expected = fnmatch.fnmatchcase(namespace, pattern)
    assert bool(re.search(cel.glob_regex(pattern), namespace)) == expected, cel.glob_regex(pattern)
    assert evaluate(cel.glob("ns", pattern).text, {"ns": namespace}) is expected


def test_pointers_escape_static_keys_and_concatenate_indexes() -> None:
    at = cel.Pointer(("metadata", "labels")).key("sparkgate.io/tier~x")
    assert evaluate(at.cel().text, {}) == "/metadata/labels/sparkgate.io~1tier~0x"
    at = cel.Pointer(("spec", "containers")).index(cel.Expr("i", 1)).key("env").append()
    assert evaluate(at.cel().text, {"i": 3}) == "/spec/containers/3/env/-"


def test_field_access_and_presence_use_brackets_where_a_key_is_not_an_identifier() -> None:
    assert cel.field("o", "name") == "o.name"
    assert cel.field("o", "namespace") == 'o["namespace"]'
    assert cel.has("o", "a.b/c") == '"a.b/c" in o'
    assert evaluate(cel.has("o", "a.b/c"), {"o": {"a.b/c": 1}}) is True
    assert evaluate(cel.has("o", "name"), {"o": {}}) is False


def test_a_conditional_costs_its_dearer_branch_and_a_concatenation_the_sum() -> None:
    a, b = cel.Expr("[x]", 10), cel.Expr("[y]", 3)
    assert cel.when(cel.Expr("c", 1), a, b).cost == 1 + 10 + 1
    assert cel.concat([a, b]).cost == 14
    assert cel.concat([cel.NO_OPS, a]).text == "[x]"

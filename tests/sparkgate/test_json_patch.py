"""sparkgate's own JSON Patch / merge patch, checked against the jsonpatch library as an oracle."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.json_patch import PatchError, apply_patch, merge_patch

DOC = {"metadata": {"labels": {"a/b": "1", "c~d": "2"}}, "spec": {"gates": [{"name": "x"}, {"name": "y"}]}}


def test_test_operation_guards_a_removal() -> None:
    ops = [
        {"op": "test", "path": "/spec/gates/1", "value": {"name": "y"}},
        {"op": "remove", "path": "/spec/gates/1"},
    ]
    assert apply_patch(DOC, ops)["spec"]["gates"] == [{"name": "x"}]
    stale = [
        {"op": "test", "path": "/spec/gates/0", "value": {"name": "y"}},
        {"op": "remove", "path": "/spec/gates/0"},
    ]
    with pytest.raises(PatchError) as e:
        apply_patch(DOC, stale)
    assert e.value.test_failed


def test_escaped_tokens_and_errors() -> None:
    out = apply_patch(
        DOC,
        [
            {"op": "replace", "path": "/metadata/labels/a~1b", "value": "9"},
            {"op": "remove", "path": "/metadata/labels/c~0d"},
        ],
    )
    assert out["metadata"]["labels"] == {"a/b": "9"}
    assert DOC["metadata"]["labels"] == {"a/b": "1", "c~d": "2"}, "input untouched"
    for bad in (
        [{"op": "add", "path": "/nope/x", "value": 1}],
        [{"op": "remove", "path": "/spec/gates/5"}],
        [{"op": "replace", "path": "/spec/missing", "value": 1}],
        [{"op": "frobnicate", "path": "/spec"}],
        [{"op": "add", "path": "/spec/gates/01", "value": 1}],
    ):
        with pytest.raises(PatchError):
            apply_patch(DOC, bad)


paths = st.sampled_from(
    [
        "/metadata/labels/a~1b",
        "/metadata/labels/new",
        "/spec/gates/0",
        "/spec/gates/-",
        "/spec/gates/1",
        "/spec/new",
        "/metadata",
    ]
)
ops = st.lists(
    st.one_of(
        st.builds(lambda p, v: {"op": "add", "path": p, "value": v}, paths, st.integers(0, 3)),
        st.builds(lambda p: {"op": "remove", "path": p}, paths),
        st.builds(lambda p, v: {"op": "replace", "path": p, "value": v}, paths, st.integers(0, 3)),
        st.builds(lambda p, v: {"op": "test", "path": p, "value": v}, paths, st.integers(0, 3)),
        st.builds(lambda f, p: {"op": "copy", "from": f, "path": p}, paths, paths),
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_agrees_with_the_jsonpatch_library(patch: list[dict[str, Any]]) -> None:
    try:
        expected: Any = jsonpatch.apply_patch(copy.deepcopy(DOC), patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        expected = PatchError
    try:
        actual: Any = apply_patch(DOC, patch)
    except PatchError:
        actual = PatchError
    assert actual == expected


def test_merge_patch_rfc7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None, "e": 3}, "d": [2]}) == {
        "a": {"c": 2, "e": 3},
        "d": [2],
    }


def test_the_patched_document_shares_nothing_with_the_input_and_keeps_its_types() -> None:
    """apply_patch copies the document (`clone`: orjson's round trip, copy.deepcopy for what JSON does not
    hold, such as the datetime YAML makes of an unquoted timestamp): the input stays as it was, and a value
    the patch adds is the patch's copy."""
    pod = yaml.safe_load(
        "metadata: {creationTimestamp: 2026-11-23T10:00:00Z, labels: {a: '1'}}\nspec: {n: 1.5}"
    )
    assert isinstance(pod["metadata"]["creationTimestamp"], dt.datetime)
    before = copy.deepcopy(pod)
    added = {"name": "g"}
    patched = apply_patch(pod, [{"op": "add", "path": "/spec/gates", "value": [added]}])
    assert pod == before and patched["metadata"] == pod["metadata"]
    assert isinstance(patched["metadata"]["creationTimestamp"], dt.datetime) and patched["spec"]["n"] == 1.5
    assert patched["metadata"] is not pod["metadata"] and patched["spec"]["gates"][0] is not added
    for json_only in ({"a": {"b": [1, 2.5, True, None, "x"]}}, [{"c": {}}]):
        copied = apply_patch(json_only, [])
        assert copied == json_only and copied is not json_only

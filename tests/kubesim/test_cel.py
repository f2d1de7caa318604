"""kubesim's CEL reads a JSON document's values only when an expression reaches them (kubesim/cel.py
`_LazyMap`): whatever way the expression reads the document, it sees the same values as a whole conversion."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.cel import Inputs, evaluate
from sparkgate import cel

OBJECTS: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    st.text(alphabet="abc", min_size=1, max_size=3),
    st.recursive(
        st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(OBJECTS)
def test_a_document_reads_the_same_whole_by_equality_and_by_member(doc: dict[str, Any]) -> None:
    assert evaluate("x", {"x": doc}) == doc
    assert evaluate(f"x == {cel.literal(doc)}", {"x": doc}) is True
    assert evaluate(f"{cel.literal(doc)} == x", {"x": doc}) is True
    assert evaluate("size(x)", {"x": doc}) == len(doc)
    for key, value in doc.items():
        assert evaluate(f"x[{cel.literal(key)}]", {"x": doc}) == value
        assert evaluate(f"{cel.literal(key)} in x", {"x": doc}) is True
    assert evaluate("x.all(k, k in x)", {"x": doc}) is True


def test_one_conversion_serves_every_expression_of_an_admission() -> None:
    """Inputs converts a document once; what one expression read stays read for the next."""
    pod = {"metadata": {"name": "p", "labels": {"spark-role": "executor"}}, "spec": {"containers": []}}
    inputs = Inputs({"object": pod, "request": {"dryRun": False}})
    condition = "!(has(request.dryRun) && request.dryRun && 'probe' in object.metadata.labels)"
    assert evaluate(condition, inputs) is True
    assert evaluate("object.metadata.labels['spark-role']", inputs) == "executor"
    assert evaluate("has(object.spec.containers) && size(object.spec.containers) == 0", inputs) is True
    assert evaluate("object", inputs) == pod

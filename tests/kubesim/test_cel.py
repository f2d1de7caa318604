"""kubesim's CEL (kubesim/cel.py, celplan.py, celeval.py): cel-go's values, errors and runtime cost.

Costs are cel-go's (github.com/google/cel-go interpreter/runtimecost.go `Observe` and `costCall`; parser/
macro.go for what a comprehension expands to; common/cost.go for the constants) with Kubernetes' estimator
(k8s.io/apiserver/pkg/cel/library/cost.go `CallCost`) and options (pkg/cel/environment/base.go: `OptOptimize`
folds constant literals and conversions, presence tests cost nothing). Each figure below is worked out from
those sources in its comment."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.cel import RUNTIME_BUDGET, Budget, CelError, Inputs, cost_of, evaluate
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


DOC = {"object": {"metadata": {"name": "n"}, "l": [1, 2, 3], "s": "abcdefghij", "i": 1, "n": 5}}


@pytest.mark.parametrize(
    ("expression", "cost"),
    [
        ("object.metadata.name", 3),  # an identifier 1, each field 1 (SelectAndIdentCost, ConstantQualifier)
        (
            "has(object.metadata.name)",
            2,
        ),  # the presence test free (PresenceTestHasCost(false)), its operand not
        ("object.metadata.name == 'n'", 4),  # == of two 1-character strings: ceil(0.1 * 1)
        ("[1, 2, 3]", 0),  # a list of constants is a constant (OptOptimize: maybeBuildListLiteral)
        ("{'a': 1}", 0),  # likewise a map (maybeBuildMapLiteral)
        ("dyn({'a': [1]})", 0),  # a conversion of a constant (maybeOptimizeConstUnary)
        ("[object.n]", 12),  # ListCreateBaseCost 10
        ("{'a': object.n}", 32),  # MapCreateBaseCost 30
        ("JSONPatch{op: 'add', path: '/x'}", 40),  # StructCreateBaseCost 40
        ("string(object.n)", 3),  # a conversion of a value: a call, 1
        ("object.l[1]", 3),  # a constant index: a qualifier, 1
        ("object.l[object.i]", 5),  # a computed index: its own cost, and 1
        ("[1, 2][object.i]", 4),  # of a value that is no attribute: a relative attribute, 1 more
        ("object.n in [1, 5]", 2),  # membership of a constant list: a set lookup (maybeOptimizeSetMembership)
        ("5 in object.l", 5),  # `in` a list: its size
        ("'ab' + object.s", 4),  # string concatenation: ceil(0.1 * (2 + 10))
        ("object.s.startsWith('ab')", 3),  # ceil(0.1 * 10)
        ("object.s.contains('cd')", 3),  # ceil(0.1 * 10) * ceil(0.1 * 2)
        ("object.s.matches('^[a-j]+$')", 6),  # ceil(0.1 * (1 + 10)) * ceil(0.25 * 8)
        ("['ab', 'cd'].join(',')", 1),  # Kubernetes' join: ceil(0.2 * 5)
        ("object.s.indexOf('j')", 3),  # Kubernetes' indexOf: floor(0.1 * 10)
        ("jsonpatch.escapeKey('a/b')", 1),  # ceil(0.1 * 3)
        ("true ? object.n : object.metadata.name", 2),  # one branch; the conditional costs nothing
        ("false && object.l.all(x, x > 0)", 0),  # the right operand of a decided && is not evaluated
        # exists: range 2; per element the condition `@not_strictly_false(!__result__)` 3 and the step
        # `__result__ || x == 2` 1 + 2; the third element's condition stops it; the result 1
        ("object.l.exists(x, x == 2)", 2 + 6 + 6 + 3 + 1),
        # all: condition `@not_strictly_false(__result__)` 2, step `__result__ && x > 0` 1 + 2
        ("object.l.all(x, x > 0)", 2 + 3 * 5 + 1),
        # map: step `__result__ + [x + 1]`: 1 + 10 + 2 + 1 (AddList)
        ("object.l.map(x, x + 1)", 2 + 3 * 14 + 1),
        # filter: step `x > 1 ? __result__ + [x] : __result__`: 2 + 1, or 2 + 1 + 10 + 1 + 1
        ("object.l.filter(x, x > 1)", 2 + 3 + 15 + 15 + 1),
        # exists_one: step `x == 2 ? __result__ + 1 : __result__`, result `__result__ == 1`
        ("object.l.exists_one(x, x == 2)", 2 + 3 + 4 + 3 + 2),
    ],
)
def test_the_cost_of_an_evaluation_is_cel_gos(expression: str, cost: int) -> None:
    assert cost_of(expression, DOC) == cost


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("object.metadata.name + 1", "no such overload"),  # what the real server answered (facts)
        ("object.nope", "no such key: nope"),  # interpreter/attributes.go resolutionError
        ("object.l[5]", "index out of bounds: 5"),
        ("object.n / 0", "division by zero"),  # common/types/err.go
        ("9223372036854775807 + object.i", "integer overflow"),
        ("object.l.exists(x, x)", "no such overload"),  # an int is no bool
        ("object.n.exists(x, true)", "got 'int', expected iterable type"),  # evalFold.Eval
        ("'a' || 'b'", "no such overload"),
        ("true && object.n / 0 == 1", "division by zero"),
    ],
)
def test_errors_are_cel_gos(expression: str, why: str) -> None:
    with pytest.raises(CelError) as e:
        evaluate(expression, DOC)
    assert str(e.value) == f"expression '{expression}' resulted in error: {why}"
    assert e.value.why == why


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("object.n / 0 == 1 && false", False),  # evalAnd: a deciding operand absorbs the other's error
        ("object.n / 0 == 1 || true", True),
        ("[0, 1].exists(x, 1 / x == 1)", True),  # a later true absorbs an element's error
        ("[1, 2] + [3] == object.l", True),
        ("1 == 1.0 && 1u == 1 && !(true == 1)", True),  # heterogeneous equality of numbers; bool is no number
        ("-7 / 2 == -3 && -7 % 2 == -1", True),  # Go's truncated division
        ("string(true) + string(1.5)", "true1.5"),
        ("'a/b~c'.split('/').join('-')", "a-b~c"),
        ("[3, 1, 2].indexOf(2)", 2),  # the Kubernetes lists library
        ("[JSONPatch{op: 'add'}] + [JSONPatch{op: 'remove'}]", [{"op": "add"}, {"op": "remove"}]),
    ],
)
def test_values_are_cel_gos(expression: str, value: Any) -> None:
    assert evaluate(expression, DOC) == value


def test_a_constructed_object_keeps_its_type_through_list_concatenation() -> None:
    """The JSONPatch mutation reads `JSONPatch` objects from a list however it was built (json_patch.go)."""
    out = evaluate("[JSONPatch{op: 'add'}] + [JSONPatch{op: 'remove'}]", {})
    assert [p.type_path for p in out] == [("JSONPatch",), ("JSONPatch",)]


def test_variables_are_computed_when_read_once_per_evaluation_and_charged() -> None:
    """composition.go: a new lazy map per evaluation; a variable is a program of its own, evaluated at most
    once by the expression that reads it (however often), its cost reported and charged with the
    expression's (activation.go Evaluate); a variable never read costs nothing."""
    inputs = Inputs(DOC)
    inputs.define(
        [
            {"name": "names", "expression": "object.l.map(x, x + 1)"},  # 45
            {"name": "unread", "expression": "object.l.map(x, x * 2)"},
            {"name": "broken", "expression": "object.nope"},
        ]
    )
    budget = Budget()
    assert evaluate("variables.names[0] + variables.names[2]", inputs, budget) == 6
    # the expression: `variables.names[0]` 3 twice, `+` 1; the variable once: 45
    assert RUNTIME_BUDGET - budget.remaining == 3 + 3 + 1 + 45
    assert cost_of("variables.names[0]", inputs) == 3 + 45  # evaluated again: a new evaluation
    with pytest.raises(CelError) as e:
        evaluate("variables.broken", inputs)
    assert e.value.why == 'composited variable "broken" fails to evaluate: no such key: nope'


def test_the_cost_limits_stop_an_evaluation() -> None:
    """PerCallLimit stops one evaluation with cel-go's message; the policy's budget (RuntimeCELCostBudget)
    refuses the evaluation that would spend past it (activation.go)."""
    items = {"object": {"items": list(range(50))}}
    expression = "object.items.map(a, object.items.map(b, a + b)).size()"
    assert evaluate(expression, items) == 50
    with pytest.raises(CelError, match="operation cancelled: actual cost limit exceeded"):
        evaluate(expression, items, Budget(per_call=1000))
    budget = Budget(remaining=cost_of(expression, items) - 1)
    with pytest.raises(CelError, match="running out of cost budget"):
        evaluate(expression, items, budget)

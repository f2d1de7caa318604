"""kubesim's CEL reads a JSON document's values only when an expression reaches them (kubesim/cel.py
`_LazyMap`): whatever way the expression reads the document, it sees the same values as a whole conversion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kubesim import cel as kubesim_cel
from kubesim.cel import RUNTIME_BUDGET, Budget, CelError, Inputs, evaluate
from sparkgate import cel
from sparkgate.policy import Policy
from sparkgate.probe import MATCH_CONDITION, PROBE_LABEL
from sparkgate.render import render

REPO = Path(__file__).resolve().parents[2]
DATA, MANIFESTS = REPO / "tests" / "data" / "spark-4.3", REPO / "manifests"

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


def _every_expression(node: Any) -> list[str]:
    """The CEL expressions of a manifest or a policy object (`expression` and `messageExpression` fields)."""
    if isinstance(node, dict):
        found = [
            v for k, v in node.items() if k in ("expression", "messageExpression") and isinstance(v, str)
        ]
        return found + [e for v in node.values() for e in _every_expression(v)]
    if isinstance(node, list):
        return [e for v in node for e in _every_expression(v)]
    return []


def _outcome(expression: str, variables: dict[str, Any] | Inputs) -> tuple[str, Any, int]:
    """What kubesim's evaluation gives: ("value", v) or ("error", message), and the cost it charged."""
    budget = Budget()
    try:
        inputs = variables if isinstance(variables, Inputs) else Inputs(variables)
        result: tuple[str, Any] = ("value", evaluate(expression, inputs, budget))
    except CelError as e:
        result = ("error", str(e))
    return (*result, RUNTIME_BUDGET - budget.remaining)


def test_the_collapsed_tree_evaluates_to_the_same_value_and_cost(
    example_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubesim walks each expression's tree without the one-child links of the operator chain (kubesim/cel.py
    `_collapsed`): every expression of the manifests and of the rendered example policy, and expressions of
    every operator, give the same value or error and the same cost as on the tree cel-python parsed, on a
    captured Spark executor pod."""
    review = json.loads((DATA / "etl-nightly-exec-1.admissionreview.json").read_text())
    request = review["request"]
    variables = {
        "object": request["object"],
        "oldObject": request["object"],
        "request": {**request, "dryRun": False},
        "params": None,
        "namespaceObject": {"metadata": {"name": "spark", "labels": {"team": "etl"}}},
        "variables": {},
    }
    manifests = [
        doc
        for path in sorted(MANIFESTS.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    expressions = _every_expression(manifests) + _every_expression(render(example_policy).objects)
    expressions += [
        "1 + 2 * 3 - 4 / 2 % 3 > 4 ? 'big' : 'small'",
        "-(1 + 2) < 0 && !false || 1 / 0 == 1",
        "object.metadata.name.startsWith('etl') && size(object.spec.containers) >= 1",
        "object.spec.containers.map(c, c.name).filter(n, n != '').exists_one(n, n.endsWith('executor'))",
        "object.spec.containers.all(c, has(c.env) && c.env.exists(e, e.name == 'SPARK_EXECUTOR_ID'))",
        "has(object.metadata.labels) && 'spark-role' in object.metadata.labels",
        "object.metadata.no.such.field",
        "[1, 2, 3][5]",
        "(object.metadata.name + '-x').split('-').join('/')",
        "{'a': 1, 'b': [1, (2 + 3)]}['b'][1] == 5 ? object.metadata : {}",
    ]
    assert len(expressions) >= 30  # the manifests' (gate policy, webhooks, ...), the policy's, these
    collapsed = [_outcome(e, variables) for e in expressions]
    monkeypatch.setattr(kubesim_cel, "_collapsed", lambda tree: tree)
    kubesim_cel._program.cache_clear()
    try:
        parsed = [_outcome(e, variables) for e in expressions]
    finally:
        monkeypatch.undo()
        kubesim_cel._program.cache_clear()
    for expression, a, b in zip(expressions, collapsed, parsed, strict=True):
        assert a == b, expression
    assert {kind for kind, _, _ in collapsed} == {"value", "error"}  # both outcomes were compared
    assert all(cost > 0 for _, _, cost in collapsed)


MEMO_EXPRESSIONS = [
    "has(object.a) && object.a.b == 1",
    "object.a.b",
    "size(object.a) > 1",
    "'b' in object.a",
    "object.a.exists(k, k == 'b')",
    "object.l.all(x, x > 0) || request.dryRun",
    "object.a.b.c.startsWith('x')",
]
# Pairs whose second document reads, through the paths above, the same as the first or not: a field the
# expressions never reach changed, a value they reach changed, a field missing at another depth, a value of
# another type where an object was, a request given or not.
MEMO_DOCUMENTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"object": {"a": {"b": 1}, "z": 1}}, {"object": {"a": {"b": 1}, "z": 2}}),
    ({"object": {"a": {"b": 1}}}, {"object": {"a": {"b": 2}}}),
    ({"object": {"a": {}}}, {"object": {}}),
    ({"object": {"a": {"b": {"c": "xy"}}}}, {"object": {"a": {"b": "xy"}}}),
    ({"object": {"a": [1]}}, {"object": {"a": {"b": 1, "c": 2}}}),
    ({"object": {"l": [1, 2]}, "request": {"dryRun": True}}, {"object": {"l": [1, 2]}}),
    (
        {"object": {"l": [0]}, "request": {"dryRun": False}},
        {"object": {"l": [0]}, "request": {"dryRun": True}},
    ),
]


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times kubesim walked a tree (kubesim/cel.py `_walk`) from here on, in its one item."""
    count = [0]
    walk = kubesim_cel._walk

    def counted(*args: Any) -> Any:
        count[0] += 1
        return walk(*args)

    monkeypatch.setattr(kubesim_cel, "_walk", counted)
    return count


def test_a_remembered_evaluation_answers_and_costs_what_walking_the_tree_gives(walks: list[int]) -> None:
    """kubesim remembers an evaluation by what its walk read (kubesim/cel.py `_Program.memo`): after any first document, the second one's value or error and cost are those of a
    walk of the tree on a fresh program, whether the second was remembered or not."""
    compared = 0
    for expression in MEMO_EXPRESSIONS:
        for first, second in MEMO_DOCUMENTS:
            kubesim_cel._program.cache_clear()
            _outcome(expression, first)
            remembered = _outcome(expression, second)
            kubesim_cel._program.cache_clear()
            assert remembered == _outcome(expression, second), (expression, first, second)
            compared += 1
    kubesim_cel._program.cache_clear()
    # 49 pairs, each walked for its first and for its fresh second: the rest were answered from memory
    assert compared == 49 and 98 < walks[0] < 147


def test_a_remembered_evaluation_is_charged_to_the_budget_as_its_walk_was() -> None:
    """The cost of a remembered evaluation counts against the policy's budget and the per-call limit
    exactly as the walk's did: within them, the same charge; past either, the same error and the same
    budget left as a walk stopped at the limit."""
    expression = "object.l.all(x, x > 0)"
    doc = {"object": {"l": list(range(1, 50))}}

    def charged(remembered: bool) -> tuple[list[Any], list[int]]:
        results, left = [], []
        for budget in (Budget(), Budget(remaining=10), Budget(per_call=10)):
            kubesim_cel._program.cache_clear()
            if remembered:
                evaluate(expression, doc)  # walked with the whole budget: remembered
            try:
                results.append(evaluate(expression, doc, budget))
            except CelError as e:
                results.append(str(e))
            left.append(budget.remaining)
        return results, left

    try:
        walked, remembered = charged(False), charged(True)
    finally:
        kubesim_cel._program.cache_clear()
    assert walked == remembered
    results, (plenty_left, short_left, _) = walked
    assert results[0] is True and plenty_left < RUNTIME_BUDGET
    # a walk stops at the 12th operation (past 10 left + 1) and leaves the budget spent: -1 - 12
    assert results[1].startswith("validation failed due to running out of cost budget") and short_left == -13
    assert "actual cost limit exceeded" in results[2]


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("false && object.l.all(x, x > 0)", False),
        ("true || object.l.all(x, x > 0)", True),
        ("false && 1 / 0 == 1", False),
        ("true || 1 / 0 == 1", True),
    ],
)
def test_a_deciding_left_operand_of_and_or_is_the_value_and_the_right_one_costs_nothing(
    expression: str, value: bool
) -> None:
    """cel-go's `&&` and `||` do not evaluate the right operand once the left one decides (interpreter
    evalAnd / evalOr), so its cost is not charged: kubesim charges the left operand and the operator alone."""
    doc = {"object": {"l": list(range(1, 1000))}}
    left = expression.split(" ")[0]
    assert _outcome(expression, doc) == ("value", value, _outcome(left, doc)[2] + 1)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 / 0 == 1 && false", ("value", False)),  # CEL's && is commutative over errors
        ("1 / 0 == 1 || true", ("value", True)),
        ("true && 1 / 0 == 1", ("error", "divide by zero")),
        ("'a' || 'b'", ("error", "found no matching overload for _||_")),
    ],
)
def test_a_left_operand_that_does_not_decide_is_combined_with_the_right_one(
    expression: str, value: tuple[str, str | bool]
) -> None:
    kind, got, cost = _outcome(expression, {})
    assert kind == value[0] and (got is value[1] if kind == "value" else value[1] in got)
    assert cost > _outcome(expression.split(" ")[0], {})[2] + 1


def test_an_expression_that_returns_other_than_a_bool_is_not_keyed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mutation's object or a message is never remembered, so once an expression returned one, kubesim no
    longer dumps what it read to make a key (a mutation reads most of the pod)."""
    keyed = []
    held = Inputs.held

    def counted(self: Inputs, trace: Any) -> Any:
        keyed.append(trace)
        return held(self, trace)

    monkeypatch.setattr(Inputs, "held", counted)
    kubesim_cel._program.cache_clear()
    try:
        assert [evaluate("object.a", {"object": {"a": i}}) for i in range(3)] == [0, 1, 2]
        assert [evaluate("object.a == 1", {"object": {"a": i}}) for i in range(3)] == [False, True, False]
    finally:
        kubesim_cel._program.cache_clear()
    # `object.a` walked three times, keyed never; `object.a == 1`: the first walk's key, then each later
    # evaluation's look-up by that trace (a miss: `a` differs), which is also its walk's key (same trace)
    assert keyed == [((("object",), False), (("object", "a"), True))] * 3


def test_a_value_that_is_more_than_json_makes_no_key() -> None:
    """A constructed object (`Typed`, which remembers its type path) or a failed policy variable where an
    expression read: no key, so the evaluation is walked and not remembered."""
    trace = ((("variables",), False), (("variables", "x"), True))
    assert Inputs({"variables": {"x": {"a": 1}}}).held(trace) == b'["variables"]\0k["x"]\0{"a":1}'
    assert Inputs({"variables": {"x": kubesim_cel.Typed(("Object",), {"a": 1})}}).held(trace) is None
    assert Inputs({"variables": {"x": kubesim_cel.Failed("x", "no")}}).held(trace) is None


def test_what_a_walk_did_not_read_does_not_split_what_is_remembered(walks: list[int]) -> None:
    """The webhook's matchCondition (manifests/base/webhooks.yaml) reads the request's dryRun and, on a dry
    run only, the pod's labels: kubesim walks it once for every executor pod of a real app however their
    names, labels and uids differ, and again for a dry run, whose answer depends on the label."""
    requests = [
        json.loads(path.read_text())["request"] for path in sorted(DATA.glob("*-exec-*.admissionreview.json"))
    ]
    assert len({json.dumps(r["object"]["metadata"]["labels"]) for r in requests}) == len(requests) > 3
    kubesim_cel._program.cache_clear()
    try:
        for request in requests:
            assert evaluate(MATCH_CONDITION["expression"], {"object": request["object"], "request": request})
        assert walks[0] == 1
        probe = requests[0]["object"]
        labelled = {**probe, "metadata": {**probe["metadata"], "labels": {PROBE_LABEL: "true"}}}
        dry = {**requests[0], "dryRun": True}
        assert evaluate(MATCH_CONDITION["expression"], {"object": probe, "request": dry}) is True
        assert evaluate(MATCH_CONDITION["expression"], {"object": labelled, "request": dry}) is False
        assert walks[0] == 3
    finally:
        kubesim_cel._program.cache_clear()


SMALL: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(0, 2) | st.sampled_from(["a", "b"]),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)
    ),
    max_leaves=6,
)
TRACED_EXPRESSIONS = [
    *MEMO_EXPRESSIONS,
    "object == request",
    "object.a == request.a",
    "size(object) == 2 || 'c' in object.b",
    "has(object.b) ? object.b.c == 1 : object.a.all(k, k == 'a')",
    "object.exists(k, object[k] == 1)",
    "object.a.map(x, x).size() > 1",
    "has(request.a.b) && request.a.b != object.b",
    "object.a.b.c == null || request == {}",
]


def test_a_macro_over_what_is_no_list_or_map_is_an_evaluation_error() -> None:
    """cel-python's walker raises TypeError for `null.exists(...)`; as cel-go does, kubesim answers an error
    of the expression, which the policy's failurePolicy then decides, never a crash of the admission."""
    kind, why, _ = _outcome("object.a.exists(x, x == 1)", {"object": {"a": None}})
    assert kind == "error" and "no such overload" in why


# Read first on the same inputs: the values it converted are read again from the maps' cache, not the
# documents, and must be in the trace all the same.
WARM_UP = "has(object.a) && has(object.b) && object.a.all(k, has(object.a.b)) && object.b.size() > 0"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"object": st.dictionaries(st.sampled_from(["a", "b", "c"]), SMALL, max_size=3)},
            optional={"request": st.dictionaries(st.sampled_from(["a", "b"]), SMALL, max_size=2)},
        ),
        min_size=2,
        max_size=4,
    ),
    st.booleans(),
)
@example([{"object": {"a": 1}, "request": {"a": 1}}, {"object": {"a": 2}, "request": {"a": 1}}], False)
@example(
    [
        {"object": {"a": [1], "b": [1]}, "request": {"a": [1], "b": [1]}},
        {"object": {"a": [2], "b": [1]}, "request": {"a": [1], "b": [1]}},
    ],
    True,
)
def test_a_traced_evaluation_answers_what_a_fresh_walk_gives(
    documents: list[dict[str, Any]], warm: bool
) -> None:
    """Whatever came before (the traces and answers of earlier documents, what an earlier expression on the
    same inputs read), each evaluation's value or error and cost are those of a fresh program walking its
    tree on fresh inputs: a remembered answer is given only where the inputs hold what its walk read."""
    for expression in TRACED_EXPRESSIONS:
        kubesim_cel._program.cache_clear()
        seen = []
        for doc in documents:
            inputs = Inputs(doc)
            if warm:
                _outcome(WARM_UP, inputs)
            seen.append(_outcome(expression, inputs))
        fresh = []
        for doc in documents:
            kubesim_cel._program.cache_clear()
            fresh.append(_outcome(expression, Inputs(doc)))
        assert seen == fresh, expression
    kubesim_cel._program.cache_clear()

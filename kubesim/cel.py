"""kubesim's one CEL evaluator: webhook matchConditions, ValidatingAdmissionPolicy and
MutatingAdmissionPolicy use it alike.

kube-apiserver evaluates these expressions with cel-go; kubesim uses cel-python (`celpy`), a real CEL
implementation with the standard macros (`has`, `exists`, `all`, `exists_one`, `map`, `filter`), `size`,
and the string functions `startsWith`, `endsWith`, `contains`, `matches`. Added here from Kubernetes' CEL
libraries (k8s.io/apiserver/pkg/cel/library and cel-go's ext.Strings, which the API server installs):
the strings extension `lowerAscii`, `upperAscii`, `trim`, `replace`, `split`, `indexOf`, `lastIndexOf`,
`substring`, `charAt`, and the list `join`; and for MutatingAdmissionPolicy
(k8s.io/apiserver/pkg/cel/mutation): `jsonpatch.escapeKey`, `JSONPatch{op, path, from, value}` and typed
object construction `Object{...}`, `Object.spec.containers{...}`: a constructed object evaluates to a
`Typed` dict that remembers its type path. Other Kubernetes libraries (`lists`, `quantity`, `url`,
`authorizer`, optional types `?.`) are not available: an expression using them fails to evaluate here, as it
would on a server without them. CEL's static type check is not done (cel-python has none): an expression
kube-apiserver refuses at policy creation with `compilation failed: ERROR: ... expected type ...` evaluates
here (only a syntax error is a compile error).

Variables are given as JSON documents (`object`, `oldObject`, `request`, `params`, `namespaceObject`,
`variables`); a missing object is CEL `null`. An evaluation error carries the message shape of
k8s.io/apiserver/pkg/admission/plugin/cel/filter.go: `expression '<expr>' resulted in error: <why>`
(the `<why>` is cel-python's wording, not cel-go's).

Cost: cel-go meters each evaluation; kube-apiserver stops one at `PerCallLimit` (1,000,000) and a policy's
evaluations at `RuntimeCELCostBudget` (10,000,000), both in k8s.io/apiserver/pkg/apis/cel/config.go.
kubesim counts one unit per evaluation step of cel-python's tree walker (an approximation of cel-go's cost
model, which charges per operation and by string and list size) against the same limits, with cel-go's
message `operation cancelled: actual cost limit exceeded`. As in cel-go, `&&` and `||` do not evaluate (or
charge) the right operand once the left one decides (`_Metered._logical`).

Programs are cached per expression and shared by threads; each evaluation has its own activation. A
program remembers its last evaluations that returned a bool or failed, by what each of them read (`_Trace`,
`_Program.memo`): inputs that hold the same wherever an earlier walk read get that walk's value and cost
without a walk of the tree.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import celpy.evaluation
import orjson
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator
from lark import Tree


# cel-python's tree walker names typing generics in its casts at run time (`cast(Tuple[Result, Result],
# ...)` in `conditionaland`, `relation`, ...): each subscription goes through typing's cache, which hashes its
# arguments, and the hash of `Result`, a Union of every CEL type, is computed afresh each time: 60 % of an
# evaluation of the webhook's matchCondition (591 -> 233 µs on a captured executor). `cast` returns its value
# whatever it names, so in that module these names stand for one object whose subscription is free. Not
# `Sequence` and `Mapping`: the module also tests values against them (`isinstance`).
class _Erased:
    def __getitem__(self, _: Any) -> _Erased:
        return self


for _name in ("Tuple", "List", "Union", "Dict", "Iterable"):
    setattr(celpy.evaluation, _name, _Erased())

PER_CALL_LIMIT = 1_000_000  # k8s.io/apiserver/pkg/apis/cel/config.go PerCallLimit
RUNTIME_BUDGET = 10_000_000  # RuntimeCELCostBudget: one policy's evaluations together
_LOCK = threading.Lock()


class Typed(dict[str, Any]):
    """A constructed object: `Object.spec{...}` has type path ("Object", "spec"); JSONPatch{...} ("JSONPatch",)."""

    def __init__(self, type_path: tuple[str, ...], fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self.type_path = type_path


class _TypeName(celtypes.MapType):
    """`Object`, `Object.spec`, ...: field selection extends the name, `{...}` constructs a value."""

    def __init__(self, path: tuple[str, ...]) -> None:
        super().__init__()
        self.path = path

    def __getitem__(self, key: Any) -> _TypeName:
        return _TypeName((*self.path, str(key)))

    def __call__(self, fields: Any) -> _TypedValue:
        return _TypedValue(self.path, fields or {})


class _TypedValue(celtypes.MapType):
    def __init__(self, path: tuple[str, ...], fields: Mapping[Any, Any]) -> None:
        super().__init__({celtypes.StringType(k): v for k, v in fields.items()})
        self.path = path


class _Namespace(celtypes.MapType):
    """The receiver of a namespaced function such as `jsonpatch.escapeKey`."""


def _escape_key(_: Any, key: celtypes.StringType) -> celtypes.StringType:
    """k8s.io/apiserver/pkg/cel/library/jsonpatch.go: RFC 6901 escaping, `~` then `/`."""
    return celtypes.StringType(str(key).replace("~", "~0").replace("/", "~1"))


def _split(text: Any, sep: Any, limit: Any = None) -> celtypes.ListType:
    parts = (
        str(text).split(str(sep))
        if limit is None or int(limit) < 0
        else str(text).split(str(sep), max(int(limit) - 1, 0))
    )
    if limit is not None and int(limit) == 0:
        parts = []
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    value = str(text)
    stop = len(value) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(value):
        raise ValueError(f"index out of range: {int(start)}, {stop}")
    return celtypes.StringType(value[int(start) : stop])


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(sep).join(str(i) for i in items))


def _index_of(text: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    return celtypes.IntType(str(text).find(str(sub), int(start)))


def _string(value: Any) -> celtypes.StringType:
    """CEL `string()`: cel-python writes a bool as Python does (`True`); CEL writes `true`."""
    if isinstance(value, celtypes.BoolType):
        return celtypes.StringType("true" if value else "false")
    return celtypes.StringType(value)


FUNCTIONS: dict[str, Any] = {
    "string": _string,
    "escapeKey": _escape_key,
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "replace": lambda s, old, new, n=-1: celtypes.StringType(str(s).replace(str(old), str(new), int(n))),
    "split": _split,
    "indexOf": _index_of,
    "lastIndexOf": lambda s, sub: celtypes.IntType(str(s).rfind(str(sub))),
    "substring": _substring,
    "charAt": lambda s, i: celtypes.StringType(str(s)[int(i) : int(i) + 1]),
    "join": _join,
}
_CONSTANTS = {
    "Object": _TypeName(("Object",)),
    "JSONPatch": _TypeName(("JSONPatch",)),
    "jsonpatch": _Namespace(),
}
_ENV = celpy.Environment()


class CelError(Exception):
    """An expression that does not compile or does not evaluate; the message is kube-apiserver's shape,
    `why` the evaluation error alone."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why or message


class Budget:
    """The cost one policy may still spend (RuntimeCELCostBudget); each evaluation also stops at
    `per_call`. Owned by the one admission call that made it (not shared between threads)."""

    def __init__(self, remaining: int = RUNTIME_BUDGET, per_call: int = PER_CALL_LIMIT) -> None:
        self.remaining = remaining
        self.per_call = per_call


class _CostExceeded(Exception):
    pass


# Grammar levels that only pass a value through (one child): no operation, no cost.
_PASS_THROUGH = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary"}
_PASS_THROUGH |= {"member", "primary", "exprlist", "paren_expr"}


class _Metered(Evaluator):
    """cel-python's tree walker, one cost unit per operation node visited (macro bodies included)."""

    def __init__(self, ast: Any, activation: Any, limit: int, cost: list[int]) -> None:
        super().__init__(ast, activation=activation)
        self.limit = limit
        self.cost = cost

    def _visit_tree(self, tree: Any) -> Any:
        if tree.data not in _PASS_THROUGH or len(tree.children) > 1:
            self.cost[0] += 1
            if self.cost[0] > self.limit:
                raise _CostExceeded
        return super()._visit_tree(tree)

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _Metered(ast, self.activation, self.limit, self.cost)

    def conditionaland(self, tree: Any) -> Any:
        return self._logical(tree, "_&&_", False)

    def conditionalor(self, tree: Any) -> Any:
        return self._logical(tree, "_||_", True)

    def _logical(self, tree: Any, name: str, decisive: bool) -> Any:
        """`a && b` and `a || b` as cel-go evaluates them (interpreter `evalAnd`, `evalOr`, without exhaustive
        evaluation, which kube-apiserver does not ask for): a left operand that decides (false for &&, true
        for ||) is the value, and the right one is neither evaluated nor charged. cel-python walks both and
        then combines them (`celtypes.logical_and` gives the same value whatever the right one is); otherwise
        its combination, errors included."""
        if len(tree.children) != 2:
            return self.visit(tree.children[0])
        left = self.visit(tree.children[0])
        if isinstance(left, celtypes.BoolType) and bool(left) is decisive:
            return left
        right = self.visit(tree.children[1])
        try:
            return self.activation.resolve_function(name)(left, right)
        except TypeError as ex:  # celpy/evaluation.py `conditionaland`'s error, word for word
            error = CELEvalError(
                f"found no matching overload for {name} applied to '({type(left)}, {type(right)})'",
                ex.__class__,
                ex.args,
                tree=tree,
            )
            error.__cause__ = ex
            return error

    def literal(self, tree: Any) -> Any:
        """A literal's value, made from its text once per program (a string literal's unescaping was a tenth
        of a simple matchCondition's evaluation) and kept on its node: CEL values are immutable."""
        value = getattr(tree, "sparkgate_value", _UNREAD)
        if value is _UNREAD:
            value = super().literal(tree)
            if not isinstance(value, CELEvalError):
                tree.sparkgate_value = value
        return value


# The levels of the operator grammar below `expr` whose evaluator, with one child, returns that child's value
# and looks at nothing else (celpy/evaluation.py `conditionalor`, ..., `unary`). Not `expr` itself: a
# constructor's fields and a map's entries are evaluated as `visit_children(expr_node)[0]`, which is the
# value only while the node is an `expr`; nor `member`, `primary`, `paren_expr` and `exprlist`, whose kind
# their parents or they themselves look at.
_CHAIN = {"conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary"}


def _collapsed(tree: Any) -> Any:
    """The AST without the one-child links of the operator chain: `a.b` parses as nine nested levels of
    which only `member` and `primary` do anything, and the tree walk paid a visit to each. They cost nothing
    in `_Metered` (one child, `_PASS_THROUGH`), so the value and the cost of every evaluation are the same
    (tests/kubesim/test_cel.py compares both on every expression of the manifests and the rendered policy)."""
    while isinstance(tree, Tree) and tree.data in _CHAIN and len(tree.children) == 1:
        tree = tree.children[0]
    if isinstance(tree, Tree):
        tree.children = [_collapsed(child) for child in tree.children]
    return tree


_MEMO_SIZE = 256  # evaluations remembered per program (`_Program.memo`), the oldest forgotten first


_SHAPES = 8  # distinct traces kept per program (`_Program.shapes`)

# What one walk read, in order: each entry a path below the variables (the variable's name first) and
# whether the whole value there was read (a value that is not an object, or an object read by `==`,
# `items()`, ...) or only its keys (an object whose fields, when read, are entries of their own).
_Trace = tuple[tuple[tuple[str, ...], bool], ...]


@dataclass(slots=True)
class _Program:
    ast: Any  # the collapsed tree
    # The activation of the environment's names and the functions, made once: each evaluation works on a
    # clone of it with its variables (celpy Evaluator.set_activation), never on it.
    base: Any
    # (trace, what the inputs held there: `Inputs.held`) -> (cost, outcome) of a walk that returned a bool
    # or failed. The walk is deterministic and sees the inputs only through what it read, so inputs that hold
    # the same wherever it read give the same value or error at the same cost.
    memo: dict[tuple[_Trace, bytes], tuple[int, bool | CelError]] = field(default_factory=dict)
    shapes: list[_Trace] = field(default_factory=list)  # the traces of memo's entries, the latest first
    # False once it returned anything else (a mutation's object, a message): no trace is kept for it again.
    remembered: bool = True


# Plain JSON only: a subclass of dict, list or str (a constructed object's `Typed`, which remembers its type
# path) raises TypeError, and such an evaluation is not remembered.
_PLAIN_JSON = orjson.OPT_PASSTHROUGH_SUBCLASS


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> _Program:
    try:
        with _LOCK:  # the lark parser is not thread-safe
            runner = _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)
            ast = _collapsed(runner.ast)
            return _Program(ast, runner.new_activation())
    except CELParseError as e:  # cel-go's shape: `ERROR: <input>:LINE:COLUMN: Syntax error: ...`
        raise CelError(
            f"compilation failed: ERROR: <input>:{e.line}:{e.column}: Syntax error: unexpected input"
        ) from None


def compile(expression: str) -> None:
    """CelError (`compilation failed: ...`) when the expression does not parse."""
    _program(expression)


class Failed:
    """A policy variable that failed to evaluate (a value of the `variables` document): reading it is an
    error, `composited variable "NAME" fails to evaluate: WHY` (admission/plugin/cel/composition.go)."""

    def __init__(self, name: str, why: str) -> None:
        self.message = f'composited variable "{name}" fails to evaluate: {why}'


_UNREAD = object()


class _Recorder:
    """The reads of the walk under way on one `Inputs` (None when none is recorded); shared by the maps of
    its documents, which append to it. Owned by the admission call that owns the Inputs."""

    __slots__ = ("reads",)

    def __init__(self) -> None:
        self.reads: list[tuple[tuple[str, ...], bool]] | None = None


class _LazyMap(celtypes.MapType):
    """A JSON object as a CEL map whose values are converted when first read. An admission request's
    documents are whole pods, and most expressions read a few fields of them (a webhook's matchCondition
    often none past `request.dryRun`): converting every value up front cost ~1 ms a pod, kubesim's own
    cost that cel-go, reading the object in place, does not have. Keys are all there, so `in`, `has()`,
    `size()` and iteration see the whole object; reading values through `items()`, `values()`, `get()` or
    `==` converts the rest first.

    A map of a document given to `Inputs` knows its path there and records each value read through it
    (`_Recorder`): its keys are in the trace already, as its parent's read of it (so `in`, `has()`, `size()`
    and iteration, which see only keys, need no entry), and a value read whole is an entry of its own."""

    def __init__(
        self, raw: Mapping[str, Any], path: tuple[str, ...] | None = None, recorder: _Recorder | None = None
    ) -> None:
        super().__init__()
        dict.update(self, {celtypes.StringType(k): _UNREAD for k in raw})
        self._raw = raw
        self._path = path
        self._recorder = recorder

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        if value is _UNREAD:
            value = _to_cel(
                self._raw[str(key)],
                None if self._path is None else (*self._path, str(key)),
                self._recorder,
            )
            dict.__setitem__(self, key, value)
        if self._path is not None and self._recorder is not None and self._recorder.reads is not None:
            self._recorder.reads.append(((*self._path, str(key)), not isinstance(value, _LazyMap)))
        return value

    def _read_all(self) -> _LazyMap:
        if self._path is not None and self._recorder is not None and self._recorder.reads is not None:
            self._recorder.reads.append((self._path, True))
        for key in [k for k, v in dict.items(self) if v is _UNREAD]:
            self[key]
        return self

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return default

    def items(self) -> Any:
        return dict.items(self._read_all())

    def values(self) -> Any:
        return dict.values(self._read_all())

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, _LazyMap):
            other._read_all()
        return super(_LazyMap, self._read_all()).__eq__(other)

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MapType({dict.__repr__(self._read_all())})"


def _to_cel(value: Any, path: tuple[str, ...] | None = None, recorder: _Recorder | None = None) -> Any:
    """A JSON document (with `Failed` policy variables) as CEL values; objects are `_LazyMap`s, which record
    their reads at `path` when given one (an object with a failed variable, or in a list, does not: its
    parent's read of it is whole)."""
    kind = type(value)
    if kind is dict:
        if any(isinstance(v, Failed) for v in value.values()):
            return celtypes.MapType(
                {
                    celtypes.StringType(k): CELEvalError(v.message) if isinstance(v, Failed) else _to_cel(v)
                    for k, v in value.items()
                }
            )
        return _LazyMap(value, path, recorder)
    if kind is list:
        return celtypes.ListType([_to_cel(v) for v in value])
    return json_to_cel(value)


class Inputs:
    """The variables of a set of expressions: each JSON document is converted to CEL once, and only when
    an expression names it (a Spark executor pod takes milliseconds to convert)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._converted: dict[str, Any] = {}
        self.recorder = _Recorder()

    def set(self, name: str, value: Any) -> None:
        if name in self._values and self._values[name] is value:
            return  # the same document (documents are not changed once given): its conversion stands
        self._values[name] = value
        self._converted.pop(name, None)

    def held(self, trace: _Trace) -> bytes | None:
        """What the inputs hold wherever `trace` read, and which variables are given; None when a value
        there is not plain JSON (a constructed object, a policy variable that failed: such an evaluation is
        not remembered)."""
        values = self._values
        parts = [orjson.dumps(list(values))]
        try:
            for path, whole in trace:
                value = values.get(path[0], _UNREAD)
                for name in path[1:]:
                    value = value[name] if type(value) is dict and name in value else _UNREAD
                if value is _UNREAD:
                    parts.append(b"-")
                elif not whole and type(value) is dict:
                    parts.append(b"k" + orjson.dumps(list(value)))
                else:
                    parts.append(orjson.dumps(value, option=_PLAIN_JSON))
        except TypeError:
            return None
        return b"\0".join(parts)  # JSON has no NUL byte

    def activation(self, expression: str) -> dict[str, Any]:
        out: dict[str, Any] = dict(_CONSTANTS)
        for name, value in self._values.items():
            if re.search(rf"\b{re.escape(name)}\b", expression):
                if name not in self._converted:
                    self._converted[name] = _to_cel(value, (name,), self.recorder)
                out[name] = converted = self._converted[name]
                if self.recorder.reads is not None:
                    self.recorder.reads.append(((name,), not isinstance(converted, _LazyMap)))
        return out


def evaluate(expression: str, variables: Inputs | Mapping[str, Any], budget: Budget | None = None) -> Any:
    """The expression's value as plain Python (bool, str, int, float, list, dict, None; a constructed
    object is a `Typed` dict). With a `budget`, its cost is charged to it (CelError past either limit).

    An expression that returns a bool or fails is remembered by what its walk read (`_Program.memo`):
    given inputs that hold the same there (a webhook's matchCondition at the reinvocation pass and for every
    executor pod, the gate policy's conditions on every release), it answers and charges the same without
    walking its tree. The tree walk costs kubesim ~0.2-0.5 ms an evaluation, where cel-go's compiled
    programs cost microseconds."""
    program = _program(expression)
    inputs = variables if isinstance(variables, Inputs) else Inputs(variables)
    meter = budget or Budget()
    limit = min(meter.per_call, meter.remaining + 1)
    known = None
    looked: dict[_Trace, bytes | None] = {}  # what the inputs hold at each trace looked up: not made twice
    if program.remembered:
        for shape in list(program.shapes):
            held = looked[shape] = inputs.held(shape)
            if held is not None and (known := program.memo.get((shape, held))) is not None:
                break
    if known is None:
        cost, outcome, trace = _walk(expression, program, inputs, limit)
        if program.remembered and cost <= limit:
            if not isinstance(outcome, bool | CelError):
                program.remembered = False
            elif (held := looked[trace] if trace in looked else inputs.held(trace)) is not None:
                _remember(program, trace, held, (cost, outcome))
    else:
        cost, outcome = known
    if cost > limit:  # the walk stops at the first operation past the limit
        meter.remaining -= limit + 1
        if limit + 1 > meter.per_call:
            why = "operation cancelled: actual cost limit exceeded"
            raise CelError(f"expression '{expression}' resulted in error: {why}", why)
        meter.remaining = -1 - (limit + 1)
        raise CelError(
            "validation failed due to running out of cost budget, no further validation rules will be run"
        )
    meter.remaining -= cost
    if isinstance(outcome, CelError):
        raise CelError(str(outcome), outcome.why)
    return outcome


def _remember(program: _Program, trace: _Trace, held: bytes, result: tuple[int, bool | CelError]) -> None:
    with _LOCK:
        if len(program.memo) >= _MEMO_SIZE:
            del program.memo[next(iter(program.memo))]
        program.memo[(trace, held)] = result
        if trace not in program.shapes:
            program.shapes.insert(0, trace)
            for dropped in program.shapes[_SHAPES:]:
                for key in [k for k in program.memo if k[0] == dropped]:
                    del program.memo[key]
            del program.shapes[_SHAPES:]


def _walk(expression: str, program: _Program, inputs: Inputs, limit: int) -> tuple[int, Any, _Trace]:
    """(cost, value or CelError, what it read) of one walk of the tree; the cost is limit + 1 when it
    stopped there (and the trace then only what it read so far)."""
    cost = [0]
    evaluator = _Metered(program.ast, program.base, limit, cost)
    reads: list[tuple[tuple[str, ...], bool]] = []
    inputs.recorder.reads = reads
    try:
        value = _plain(evaluator.evaluate(inputs.activation(expression)))
        return cost[0], value, tuple(dict.fromkeys(reads))
    except (CELEvalError, TypeError) as e:
        # An error of the walk, or one inside a list or map the value holds. cel-python's walker raises
        # TypeError where a macro meets what is not a list or map (`null.all(...)`); cel-go answers such an
        # evaluation with an error too ("expected iterable type").
        why = str(e.args[0]) if isinstance(e, CELEvalError) else f"no such overload: {e}"
        return (
            cost[0],
            CelError(f"expression '{expression}' resulted in error: {why}", why),
            tuple(dict.fromkeys(reads)),
        )
    except _CostExceeded:
        return cost[0], None, ()
    finally:
        inputs.recorder.reads = None


def _plain(value: Any) -> Any:
    if isinstance(value, CELEvalError):
        raise value
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, _TypedValue):
        return Typed(value.path, {str(k): _plain(v) for k, v in value.items()})
    if isinstance(value, celtypes.MapType):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, celtypes.ListType):
        return [_plain(v) for v in value]
    return value

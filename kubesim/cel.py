"""kubesim's one CEL evaluator: webhook matchConditions, ValidatingAdmissionPolicy and
MutatingAdmissionPolicy use it alike, with kube-apiserver's verdicts and cost.

- **Parsing.** cel-python's parser (lark) gives each expression's tree once; kubesim/celplan.py compiles it
  into closures over the JSON documents (kubesim/celeval.py: values, functions, errors and cost as cel-go
  has them). Programs are cached per expression and shared by threads.
- **Creation.** `compile` is the check kube-apiserver makes when a MutatingAdmissionPolicy is created
  (k8s.io/apiserver/pkg/admission/plugin/cel/compile.go `CompileCELExpression`): a syntax error is refused
  with the compiler's message, `compilation failed: ERROR: <input>:LINE:COL: Syntax error: mismatched input
  ...` and the expression with a caret line (docs/real-cluster-facts.md, "A bad expression"). The message
  comes from cel-expr-python (Google's CEL over cel-cpp), whose parser is the same ANTLR grammar as
  cel-go's and words its errors as cel-go does; cel-python's parser says only where. The type check is not
  made: `object`, `oldObject` and `params` are `dyn` in the API server too, so a type error on them
  (`object.metadata.name + 1`) is accepted there at creation and fails each evaluation with
  `no such overload`, as it does here.
- **Libraries** (k8s.io/apiserver/pkg/cel/environment/base.go): the standard functions and macros, cel-go's
  strings extension, Kubernetes' lists library (`indexOf`, `lastIndexOf`, `min`, `max`, `sum`,
  `isSorted`), and for MutatingAdmissionPolicy `jsonpatch.escapeKey`, `JSONPatch{op, path, from, value}`
  and typed objects `Object{...}`, `Object.spec.containers{...}` (a constructed object is a `Typed` dict
  that remembers its type path). Others (`quantity`, `url`, `ip`, `cidr`, `authorizer`, sets, optional
  types, regex `find`) fail to evaluate here, naming the function.
- **Variables** (admission/plugin/cel/composition.go): an admission policy's `variables` are evaluated
  lazily, at most once per expression evaluation that reads them (each evaluation has its own cache, as
  each cel-go activation gets a new lazy map), each as a program of its own with its own per-call limit;
  their cost is charged to the budget with the expression's. One that fails fails its readers with
  `composited variable "NAME" fails to evaluate: WHY`.
- **Errors** have the shape of activation.go: `expression '<expr>' resulted in error: <why>`, `why` in
  cel-go's words.
- **Cost** is cel-go's runtime cost with Kubernetes' estimator (kubesim/celeval.py), against
  `PerCallLimit` (1,000,000 per evaluation: `operation cancelled: actual cost limit exceeded`) and
  `RuntimeCELCostBudget` (10,000,000 per policy evaluation: `validation failed due to running out of cost
  budget, no further validation rules will be run`), k8s.io/apiserver/pkg/apis/cel/config.go.

State: the program cache (built under a lock); an `Inputs` and a `Budget` belong to the admission call that
made them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from celpy.celparser import CELParseError, CELParser

from . import celplan
from .celeval import CostExceeded, EvalError, Frame, Typed, Value

__all__ = ["PER_CALL_LIMIT", "RUNTIME_BUDGET", "Budget", "CelError", "Inputs", "Typed", "compile", "evaluate"]

PER_CALL_LIMIT = 1_000_000  # k8s.io/apiserver/pkg/apis/cel/config.go PerCallLimit
RUNTIME_BUDGET = 10_000_000  # RuntimeCELCostBudget: one policy's evaluations together
CANCELLED = "operation cancelled: actual cost limit exceeded"
OUT_OF_BUDGET = "validation failed due to running out of cost budget, no further validation rules will be run"
_LOCK = threading.Lock()
_PARSER: list[CELParser] = []


class CelError(Exception):
    """An expression that does not compile or does not evaluate; the message is kube-apiserver's shape,
    `why` the evaluation error alone."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why or message


class Budget:
    """The cost one policy evaluation may still spend (RuntimeCELCostBudget); each evaluation also stops
    at `per_call`. Owned by the one admission call that made it (not shared between threads)."""

    def __init__(self, remaining: int = RUNTIME_BUDGET, per_call: int = PER_CALL_LIMIT) -> None:
        self.remaining = remaining
        self.per_call = per_call


@functools.lru_cache(maxsize=2048)
def _program(expression: str) -> celplan.Node:
    try:
        with _LOCK:  # the lark parser is not thread-safe
            if not _PARSER:
                _PARSER.append(CELParser())
            tree = _PARSER[0].parse(expression)
    except CELParseError as e:
        raise CelError(
            _syntax_error(expression)
            or f"compilation failed: ERROR: <input>:{e.line}:{e.column}: Syntax error"
        ) from None
    try:
        return celplan.Planner().plan(tree)
    except (ValueError, EvalError) as e:  # a macro used wrongly, a constant that cannot be built
        raise CelError(f"compilation failed: ERROR: <input>: {e}") from None


def _syntax_error(expression: str) -> str | None:
    """cel-go's message for an expression that does not parse (the same ANTLR grammar, through cel-cpp),
    None when that parser accepts it."""
    try:
        _cpp_env().compile(expression, disable_check=True)
    except RuntimeError as e:
        text = str(e).removeprefix("INVALID_ARGUMENT: ").removesuffix(" [INVALID_ARGUMENT]")
        return f"compilation failed: {text}"
    return None


@functools.cache
def _cpp_env() -> Any:
    from cel_expr_python import cel as cel_cpp

    return cel_cpp.NewEnv()


def compile(expression: str) -> None:
    """CelError (`compilation failed: ...`, the compiler's message) when the expression does not parse."""
    message = _syntax_error(expression)
    if message is not None:
        raise CelError(message)
    _program(expression)


class _Variables(celplan.Lazy):
    """`variables` for one expression evaluation: each computed when first read (composition.go
    variableAccessor), its cost added to `cost`."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.values: dict[str, Value | EvalError] = {}
        self.costs: dict[str, int] = {}  # each variable's own cost, as computed
        self.cost = 0

    def read(self, name: str) -> Value:
        if name not in self.values:
            expression = self.inputs.definitions.get(name)
            if expression is None:
                raise EvalError(f"no such key: {name}")
            self.values[name] = self._compute(name, expression)
        value = self.values[name]
        if isinstance(value, EvalError):
            raise value
        return value

    def has(self, name: str) -> bool:
        return name in self.inputs.definitions

    def _compute(self, name: str, expression: str) -> Value | EvalError:
        try:
            program = _program(expression)
        except CelError as e:
            return EvalError(f'composited variable "{name}" fails to compile: {e}')
        frame = Frame(self._lookup, PER_CALL_LIMIT)
        try:
            return program.fn(frame)
        except EvalError as e:
            return EvalError(f'composited variable "{name}" fails to evaluate: {e}')
        except CostExceeded:
            return EvalError(f'composited variable "{name}" fails to evaluate: {CANCELLED}')
        finally:
            self.cost += frame.cost
            self.costs[name] = frame.cost

    def _lookup(self, name: str) -> Value:
        return self.inputs.lookup(name, self)


class Inputs:
    """The variables of a set of expressions: the JSON documents (`object`, `request`, ...) as given, read
    in place, and an admission policy's variable definitions (`define`)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = dict(values)
        self.definitions: dict[str, str] = {}

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value

    def define(self, definitions: Iterable[Mapping[str, Any]]) -> None:
        """An admission policy's `variables` (name, expression), evaluated when read."""
        self.definitions = {str(d.get("name")): str(d.get("expression", "")) for d in definitions}

    def lookup(self, name: str, variables: _Variables) -> Value:
        if name == "variables" and (self.definitions or "variables" not in self.values):
            return variables
        if name in self.values:
            return self.values[name]
        raise EvalError(f"no such attribute(s): {name}")


def evaluate(expression: str, variables: Inputs | Mapping[str, Any], budget: Budget | None = None) -> Any:
    """The expression's value as plain Python (bool, str, int, float, list, dict, None; a constructed
    object is a `Typed` dict). With a `budget`, its cost and its variables' are charged to it (CelError
    past either limit)."""
    program = _program(expression)
    inputs = variables if isinstance(variables, Inputs) else Inputs(variables)
    meter = budget or Budget()
    lazy = _Variables(inputs)
    frame = Frame(lambda name: inputs.lookup(name, lazy), meter.per_call)
    value: Any = None
    error: str | None = None
    try:
        value = program.fn(frame)
    except EvalError as e:
        error = str(e)
    except CostExceeded:
        error = CANCELLED
    except RecursionError:
        error = "max recursion depth exceeded"
    # activation.go Evaluate: the variables' cost, then the expression's, against what is left
    for cost in (lazy.cost, frame.cost):
        if cost > meter.remaining:
            meter.remaining = -1
            raise CelError(OUT_OF_BUDGET)
        meter.remaining -= cost
    if error is not None:
        raise CelError(f"expression '{expression}' resulted in error: {error}", error)
    return _plain(value)


def cost_of(expression: str, variables: Inputs | Mapping[str, Any]) -> int:
    """What one evaluation costs (the variables it reads included), whatever its outcome."""
    own, read = split_cost(expression, variables)
    return own + sum(read.values())


def split_cost(expression: str, variables: Inputs | Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """The expression's own cost in one evaluation, whatever its outcome, and the own cost of each variable
    it read: for benchmarks that say where a policy's cost goes."""
    inputs = variables if isinstance(variables, Inputs) else Inputs(variables)
    program = _program(expression)
    lazy = _Variables(inputs)
    frame = Frame(lambda name: inputs.lookup(name, lazy), PER_CALL_LIMIT)
    with contextlib.suppress(EvalError, CostExceeded):
        program.fn(frame)
    return frame.cost, lazy.costs


def _plain(value: Any) -> Any:
    if isinstance(value, celplan.Lazy):
        raise CelError("kubesim: `variables` itself is not a value")
    if type(value) is not int and isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # a uint
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Typed):
        return Typed(value.type_path, {k: _plain(v) for k, v in value.items()})
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value

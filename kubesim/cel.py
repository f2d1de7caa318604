"""kubesim's one CEL evaluator: webhook matchConditions and ValidatingAdmissionPolicy use it alike.

kube-apiserver evaluates these expressions with cel-go; kubesim uses cel-python (`celpy`), a real CEL
implementation with the standard macros (`has`, `exists`, `all`, `exists_one`, `map`, `filter`), `size`,
and the string functions `startsWith`, `endsWith`, `contains`, `matches`. Kubernetes' own CEL libraries
(`lists`, `strings` extensions such as `lowerAscii` or `split`, `quantity`, `url`, `authorizer`) are not
available: an expression using them fails to evaluate here, as it would on a server without them.

Variables are given as JSON documents (`object`, `oldObject`, `request`, `params`, `namespaceObject`,
`variables`); a missing object is CEL `null`. An evaluation error carries the message shape of
k8s.io/apiserver/pkg/admission/plugin/cel/filter.go: `expression '<expr>' resulted in error: <why>`
(the `<why>` is cel-python's wording, not cel-go's).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

_ENV = celpy.Environment()
_LOCK = threading.Lock()


class CelError(Exception):
    """An expression that does not compile or does not evaluate; the message is kube-apiserver's shape."""


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> celpy.Runner:
    try:
        with _LOCK:  # the lark parser is not thread-safe
            return _ENV.program(_ENV.compile(expression))
    except CELParseError as e:
        raise CelError(f"compilation failed: {e}") from None


class Inputs:
    """The variables of a set of expressions: each JSON document is converted to CEL once, and only when
    an expression names it (a Spark executor pod takes milliseconds to convert)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._converted: dict[str, Any] = {}

    def set(self, name: str, value: Any) -> None:
        self._values[name] = value
        self._converted.pop(name, None)

    def activation(self, expression: str) -> dict[str, Any]:
        out = {}
        for name, value in self._values.items():
            if re.search(rf"\b{re.escape(name)}\b", expression):
                if name not in self._converted:
                    self._converted[name] = json_to_cel(value)
                out[name] = self._converted[name]
        return out


def evaluate(expression: str, variables: Inputs | Mapping[str, Any]) -> Any:
    """The expression's value as plain Python (bool, str, int, float, list, dict, None)."""
    program = _program(expression)
    inputs = variables if isinstance(variables, Inputs) else Inputs(variables)
    activation = inputs.activation(expression)
    try:
        result = program.evaluate(activation)
    except CELEvalError as e:
        raise CelError(f"expression '{expression}' resulted in error: {e.args[0]}") from None
    if isinstance(result, CELEvalError):
        raise CelError(f"expression '{expression}' resulted in error: {result.args[0]}")
    return _plain(result)


def _plain(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.MapType):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, celtypes.ListType):
        return [_plain(v) for v in value]
    return value

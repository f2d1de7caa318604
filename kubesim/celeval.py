"""kubesim's CEL programs: an expression compiled once into Python closures over plain JSON values, metered
with cel-go's runtime cost model (kubesim/cel.py is the interface the admission plugins use).

Why its own evaluator: kube-apiserver compiles each expression once (cel-go's planner) and evaluates the
plan in microseconds; cel-python (`celpy`) walks its parse tree again at every evaluation, converting every
value it reaches to its own types: ~100 ms of kubesim's CPU per executor pod through sparkgate's rendered
policy, against ~4 ms through the webhook. Here celpy's parser (lark) gives the tree once per expression
and each node becomes a closure; values stay the JSON documents they are.

Semantics follow cel-go (github.com/google/cel-go, interpreter/ and common/types/): `&&` and `||`
short-circuit and absorb an error of the operand that does not decide; `?:` evaluates one branch;
comprehensions are cel-go's macro expansions (parser/macro.go: `all`, `exists`, `exists_one`, `map`,
`filter`) and stop as cel-go's folder does; equality is heterogeneous (numbers across int, uint and double,
lists and maps element by element, any other mix is false); arithmetic on mixed types is `no such
overload`; error texts are cel-go's (`no such key: K`, `index out of bounds: I`, `no such overload`,
`division by zero`, `integer overflow`).

Cost (interpreter/runtimecost.go `costTrackerFactory.Observe` and `CostTracker.costCall`, with Kubernetes'
estimator k8s.io/apiserver/pkg/cel/library/cost.go `CallCost` and its options in
pkg/cel/environment/base.go: `OptOptimize`, presence tests free):

- an identifier 1 and each field or constant index of it 1; a computed index 1 besides its own cost; a
  select or index on a value that is not an attribute (a call's result, a literal) 1 more (cel-go's
  relative attribute); `has(x.f)` costs what `x` does; constants 0;
- `?:`, `&&`, `||` nothing themselves; a list literal 10, a map literal 30, an object (`JSONPatch{...}`) 40,
  except that a list or map literal of constants is itself a constant (`OptOptimize`), as is a type
  conversion (`dyn`, `string`, `int`, ...) of a constant; `x in [constants]` is a set lookup (no cost);
- a call 1, except: `==`, `!=` and string ordering ceil(0.1 * the smaller size); `+` of strings
  ceil(0.1 * both sizes); `in` a list its size; `startsWith`, `endsWith` ceil(0.1 * the string);
  `contains` ceil(0.1 * string) * ceil(0.1 * substring); `matches` ceil(0.1 * (1 + string)) * ceil(0.25
  * regex); Kubernetes' `join` ceil(0.2 * the result), `replace` and `split` ceil(0.2 * string),
  `lowerAscii`, `upperAscii`, `substring`, `trim`, `jsonpatch.escapeKey` ceil(0.1 * string), `indexOf`,
  `lastIndexOf`, `min`, `max`, `sum`, `isSorted` floor(0.1 * the receiver's characters);
- a comprehension as its expansion costs: per element the loop condition and step (an `exists` step
  is `__result__ || p`, a `map` step `__result__ + [f]`: 12 plus `f`), then its result.

Approximations, not cel-go's exact count: a computed index whose index is itself an attribute costs 1 more
here than cel-go's unwrapped `evalWatchAttrQual`.

Programs are immutable once compiled and shared by threads; each evaluation has its own `Frame`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

Value = Any
Fn = Callable[["Frame"], Value]


class EvalError(Exception):
    """A CEL error value (cel-go's types.Err), carried as an exception until an operator absorbs it."""


class CostExceeded(Exception):
    """The evaluation passed its cost limit (cel-go panics with EvalCancelledError)."""


class Uint(int):
    """A CEL uint (`1u`); int otherwise."""


class Typed(dict[str, Any]):
    """A constructed object: `Object.spec{...}` has type path ("Object", "spec"); JSONPatch{...} ("JSONPatch",)."""

    def __init__(self, type_path: tuple[str, ...], fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self.type_path = type_path


class Frame:
    """One evaluation: the variables, the cost so far and its limit, the comprehension variables in scope.
    `lookup` resolves a name the program does not bind itself (kubesim/cel.py: documents, lazy variables)."""

    __slots__ = ("cost", "limit", "locals", "lookup")

    def __init__(self, lookup: Callable[[str], Value], limit: int) -> None:
        self.lookup = lookup
        self.limit = limit
        self.cost = 0
        self.locals: dict[str, Value] = {}

    def charge(self, units: int) -> None:
        self.cost += units
        if self.cost > self.limit:
            raise CostExceeded


NO_OVERLOAD = "no such overload"
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


def _fail(message: str = NO_OVERLOAD) -> EvalError:
    return EvalError(message)


# --- values ---


def kind(v: Value) -> str:
    """The CEL type name of a value (cel-go's Type().TypeName())."""
    if v is None:
        return "null_type"
    t = type(v)
    if t is bool:
        return "bool"
    if t is Uint:
        return "uint"
    if t is int:
        return "int"
    if t is float:
        return "double"
    if t is str:
        return "string"
    if t is bytes:
        return "bytes"
    if isinstance(v, list):
        return "list"
    if isinstance(v, Typed):
        return ".".join(v.type_path)
    if isinstance(v, dict):
        return "map"
    return t.__name__


def _number(v: Value) -> bool:
    return type(v) in (int, float, Uint)


def equal(a: Value, b: Value) -> bool:
    """cel-go's heterogeneous equality (common/types: Equal of each type)."""
    ta, tb = type(a), type(b)
    if ta is bool or tb is bool:
        return ta is tb and a == b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, list):
        return (
            isinstance(b, list) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b) or isinstance(a, Typed) != isinstance(b, Typed):
            return False
        if isinstance(a, Typed) and isinstance(b, Typed) and a.type_path != b.type_path:
            return False
        return all(k in b and equal(v, b[k]) for k, v in a.items())
    return kind(a) == kind(b) and bool(a == b)


def size_of(v: Value) -> int:
    """cel-go's actualSize: a string's code points, a list's or map's entries, 1 for anything else."""
    if isinstance(v, str | bytes | list | dict):
        return len(v)
    return 1


def traversal(v: Value) -> int:
    """k8s.io/apiserver/pkg/cel/library/cost.go traversalCost."""
    if isinstance(v, str | bytes):
        return int(len(v) * 0.1)
    if isinstance(v, list):
        return sum(traversal(i) for i in v)
    if isinstance(v, dict):
        return sum(traversal(k) + traversal(i) for k, i in v.items())
    return 1


def _ceil(x: float) -> int:
    return math.ceil(x)


def _check_int(v: int) -> int:
    if not _INT_MIN <= v <= _INT_MAX:
        raise _fail("integer overflow")
    return v


def _less(a: Value, b: Value) -> bool:
    if (_number(a) and _number(b)) or (type(a) is type(b) and type(a) in (str, bytes, bool)):
        if (type(a) is float and math.isnan(a)) or (type(b) is float and math.isnan(b)):
            raise _fail("NaN values cannot be ordered")
        return bool(a < b)
    raise _fail()


def add(a: Value, b: Value) -> Value:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return _check_int(a + b)
    if ta is Uint and tb is Uint:
        if a + b >= 1 << 64:
            raise _fail("unsigned integer overflow")
        return Uint(a + b)
    if (ta is float and tb is float) or (ta is str and tb is str) or (ta is bytes and tb is bytes):
        return a + b
    if isinstance(a, list) and isinstance(b, list):
        return [*a, *b]
    raise _fail()


def _arith(op: str, a: Value, b: Value) -> Value:
    ta, tb = type(a), type(b)
    if ta is not tb or ta not in (int, float, Uint):
        raise _fail()
    if op == "-":
        out = a - b
    elif op == "*":
        out = a * b
    elif ta is float:
        if op == "%":
            raise _fail()
        return a / b if b else math.copysign(math.inf, a) * math.copysign(1, b) if a else math.nan
    elif b == 0:
        raise _fail("division by zero" if op == "/" else "modulus by zero")
    else:  # Go's truncated division and remainder
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        out = q if op == "/" else a - b * q
    if ta is Uint:
        if not 0 <= out < 1 << 64:
            raise _fail("unsigned integer overflow")
        return Uint(out)
    return _check_int(out) if ta is int else out


def to_string(v: Value) -> str:
    t = type(v)
    if t is str:
        return str(v)
    if t is bool:
        return "true" if v else "false"
    if t in (int, Uint):
        return str(int(v))
    if t is float:  # Go's strconv.FormatFloat(v, 'g', -1, 64) for the common cases
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else repr(v)
    if t is bytes:
        try:
            return str(v.decode("utf-8"))
        except UnicodeDecodeError:
            raise _fail("invalid UTF-8 in bytes, cannot convert to string") from None
    raise _fail(f"type conversion error from '{kind(v)}' to 'string'")


def to_int(v: Value) -> int:
    t = type(v)
    if t in (int, Uint):
        return _check_int(int(v))
    if t is float:
        if math.isnan(v) or not _INT_MIN <= v <= _INT_MAX:
            raise _fail("integer overflow")
        return int(v)
    if t is str:
        try:
            return _check_int(int(v, 10))
        except ValueError:
            raise _fail("type conversion error from 'string' to 'int'") from None
    raise _fail(f"type conversion error from '{kind(v)}' to 'int'")


def _to_double(v: Value) -> float:
    if type(v) in (int, Uint, float):
        return float(v)
    if type(v) is str:
        try:
            return float(v)
        except ValueError:
            raise _fail("type conversion error from 'string' to 'double'") from None
    raise _fail(f"type conversion error from '{kind(v)}' to 'double'")


def _to_uint(v: Value) -> Uint:
    if type(v) in (int, Uint) or (type(v) is float and not math.isnan(v)):
        if not 0 <= v < 1 << 64:
            raise _fail("unsigned integer overflow")
        return Uint(int(v))
    if type(v) is str and v.isdigit():
        return Uint(int(v))
    raise _fail(f"type conversion error from '{kind(v)}' to 'uint'")


def _to_bool(v: Value) -> bool:
    if type(v) is bool:
        return v
    if type(v) is str and v in ("true", "false", "True", "False", "TRUE", "FALSE", "t", "f", "1", "0"):
        return v in ("true", "True", "TRUE", "t", "1")
    raise _fail(f"type conversion error from '{kind(v)}' to 'bool'")


CONVERSIONS: dict[str, Callable[[Value], Value]] = {
    "string": to_string,
    "int": to_int,
    "uint": _to_uint,
    "double": _to_double,
    "bool": _to_bool,
    "dyn": lambda v: v,
    "bytes": lambda v: (
        v.encode() if type(v) is str else v if type(v) is bytes else (_ for _ in ()).throw(_fail())
    ),
}


# --- functions: (implementation, cost of the call from its receiver and arguments and result) ---


def _str(*values: Value) -> None:
    if any(type(v) is not str for v in values):
        raise _fail()


def _int(*values: Value) -> None:
    if any(type(v) is not int for v in values):
        raise _fail()


_REGEX: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    compiled = _REGEX.get(pattern)
    if compiled is None:
        try:
            compiled = _REGEX[pattern] = re.compile(pattern)
        except re.error as e:
            raise _fail(f"invalid regex: {pattern}: {e}") from None
    return compiled


def _matches(s: Value, p: Value) -> bool:
    _str(s, p)
    return _regex(p).search(s) is not None


def _index_of(s: Value, sub: Value, start: Value = 0) -> int:
    if isinstance(s, list):  # the Kubernetes lists library
        return next((i for i, v in enumerate(s) if equal(v, sub)), -1)
    _str(s, sub)
    _int(start)
    if not 0 <= start <= len(s):
        raise _fail(f"index out of range: {start}")
    return int(s.find(sub, start))


def _last_index_of(s: Value, sub: Value, start: Value = None) -> int:
    if isinstance(s, list):
        return next((i for i in range(len(s) - 1, -1, -1) if equal(s[i], sub)), -1)
    _str(s, sub)
    if start is None:
        return int(s.rfind(sub))
    _int(start)
    if not 0 <= start < max(len(s), 1):
        raise _fail(f"index out of range: {start}")
    return int(s.rfind(sub, 0, start + len(sub)))


def _substring(s: Value, start: Value, end: Value = None) -> str:
    _str(s)
    stop = len(s) if end is None else end
    _int(start, stop)
    if not 0 <= start <= len(s):
        raise _fail(f"index out of range: {start}")
    if not start <= stop <= len(s):
        raise _fail(f"index out of range: {stop}")
    return str(s[start:stop])


def _split(s: Value, sep: Value, limit: Value = -1) -> list[str]:
    _str(s, sep)
    _int(limit)
    if limit == 0:
        return []
    if sep == "":
        chars = list(s)
        return (
            chars if limit < 0 or limit >= len(chars) else [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        )
    return list(s.split(sep) if limit < 0 else s.split(sep, limit - 1))


def _replace(s: Value, old: Value, new: Value, n: Value = -1) -> str:
    _str(s, old, new)
    _int(n)
    return str(s.replace(old, new, n))


def _join(items: Value, sep: Value = "") -> str:
    if not isinstance(items, list) or any(type(i) is not str for i in items):
        raise _fail()
    _str(sep)
    return str(sep.join(items))


def _char_at(s: Value, i: Value) -> str:
    _str(s)
    _int(i)
    if not 0 <= i <= len(s):
        raise _fail(f"index out of range: {i}")
    return str(s[i : i + 1])


def _size(v: Value) -> int:
    if isinstance(v, str | bytes | list | dict):
        return len(v)
    raise _fail()


def _list_of_numbers(v: Value) -> list[Value]:
    if not isinstance(v, list):
        raise _fail()
    return v


def _min_max(pick: Callable[..., Value]) -> Callable[[Value], Value]:
    def run(v: Value) -> Value:
        items = _list_of_numbers(v)
        if not items:
            raise _fail(f"{pick.__name__}(list) called on empty list")
        return pick(items)

    return run


def _escape_key(k: Value) -> str:
    _str(k)
    return str(k.replace("~", "~0").replace("/", "~1"))


def _string_op(op: Callable[[str], str]) -> Callable[[Value], str]:
    def run(s: Value) -> str:
        _str(s)
        return op(s)

    return run


def _pair_str(op: Callable[[str, str], bool]) -> Callable[[Value, Value], bool]:
    def run(s: Value, p: Value) -> bool:
        _str(s, p)
        return op(s, p)

    return run


def _tenth(v: Value) -> int:
    return _ceil(size_of(v) * 0.1)


Cost = Callable[[list[Value], Value], int]
ONE: Cost = lambda args, result: 1  # noqa: E731
FUNCTIONS: dict[str, tuple[Callable[..., Value], Cost]] = {
    "size": (_size, ONE),
    "matches": (_matches, lambda a, r: _ceil((1 + size_of(a[0])) * 0.1) * _ceil(size_of(a[1]) * 0.25)),
    "startsWith": (_pair_str(str.startswith), lambda a, r: _tenth(a[0])),
    "endsWith": (_pair_str(str.endswith), lambda a, r: _tenth(a[0])),
    "contains": (_pair_str(lambda s, p: p in s), lambda a, r: _tenth(a[0]) * _tenth(a[1])),
    # cel-go's ext.Strings (v2), which kube-apiserver installs; costs from Kubernetes' CallCost
    "lowerAscii": (
        _string_op(lambda s: "".join(c.lower() if c.isascii() else c for c in s)),
        lambda a, r: _tenth(a[0]),
    ),
    "upperAscii": (
        _string_op(lambda s: "".join(c.upper() if c.isascii() else c for c in s)),
        lambda a, r: _tenth(a[0]),
    ),
    "trim": (_string_op(str.strip), lambda a, r: _tenth(a[0])),
    "substring": (_substring, lambda a, r: _tenth(a[0])),
    "charAt": (_char_at, ONE),
    "replace": (_replace, lambda a, r: _ceil(size_of(a[0]) * 0.2)),
    "split": (_split, lambda a, r: _ceil(size_of(a[0]) * 0.2)),
    "join": (_join, lambda a, r: _ceil(size_of(r) * 0.2)),
    "indexOf": (_index_of, lambda a, r: traversal(a[0])),
    "lastIndexOf": (_last_index_of, lambda a, r: traversal(a[0])),
    # the Kubernetes lists library (library/lists.go)
    "isSorted": (
        lambda v: all(not _less(y, x) for x, y in itertools.pairwise(v)),
        lambda a, r: traversal(a[0]),
    ),
    "sum": (lambda v: sum(_list_of_numbers(v), type(v[0])() if v else 0), lambda a, r: traversal(a[0])),
    "min": (_min_max(min), lambda a, r: traversal(a[0])),
    "max": (_min_max(max), lambda a, r: traversal(a[0])),
    # library/jsonpatch.go
    "jsonpatch.escapeKey": (_escape_key, lambda a, r: _tenth(a[0])),
}

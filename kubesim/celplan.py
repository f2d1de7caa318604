"""The planner of kubesim's CEL (cel-go's interpreter/planner.go in spirit): celpy's parse tree of an
expression becomes one closure per operation, with the cost each operation adds (kubesim/celeval.py says
what is charged and why). Pure: a plan holds no state of an evaluation; `Frame` does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from celpy.evaluation import celbytes, celstr
from lark import Token, Tree

from .celeval import (
    CONVERSIONS,
    FUNCTIONS,
    NO_OVERLOAD,
    EvalError,
    Fn,
    Frame,
    Typed,
    Uint,
    Value,
    add,
    equal,
    kind,
    size_of,
)
from .celeval import _arith as arith
from .celeval import _ceil as ceil
from .celeval import _less as less

LIST_CREATE, MAP_CREATE, STRUCT_CREATE = 10, 30, 40  # cel-go common/cost.go


class Lazy:
    """A value whose fields are computed when read (the `variables` of an admission policy)."""

    def read(self, name: str) -> Value:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError


class Node(NamedTuple):
    fn: Fn
    # "attr": an identifier or a select or index of one; "cond": a conditional (cel-go plans both as
    # attributes, so a select of them adds no relative attribute); "const": a constant; "": anything else.
    shape: str = ""
    value: Value = None  # a constant's value


_MISSING = object()
_PASS = {
    "expr",
    "conditionalor",
    "conditionaland",
    "relation",
    "addition",
    "multiplication",
    "unary",
    "member",
}
_PASS |= {"primary"}


def _unwrap(tree: Any) -> Any:
    while isinstance(tree, Tree) and tree.data in _PASS and len(tree.children) == 1:
        tree = tree.children[0]
    return tree


def _bool(v: Value) -> bool:
    if v is True or v is False:
        return v
    raise EvalError(NO_OVERLOAD)


def _select(v: Value, name: str) -> Value:
    if isinstance(v, dict):
        found = v.get(name, _MISSING)
        if found is _MISSING:
            raise EvalError(f"no such key: {name}")
        return found
    if isinstance(v, Lazy):
        return v.read(name)
    raise EvalError(f"no such key: {name}")


def _index(v: Value, i: Value) -> Value:
    if isinstance(v, list):
        if type(i) in (int, Uint) or (type(i) is float and i.is_integer()):
            n = int(i)
            if 0 <= n < len(v):
                return v[n]
            raise EvalError(f"index out of bounds: {n}")
        raise EvalError(f"unsupported index type '{kind(i)}' in list")
    if isinstance(v, dict):
        key = int(i) if type(i) is float and i.is_integer() else i
        if type(key) is bool or not isinstance(key, str | int):
            raise EvalError(f"no such key: {to_text(i)}")
        found = v.get(key, _MISSING)
        if found is _MISSING or (type(key) is int and type(next((k for k in v if k == key), 0)) is bool):
            raise EvalError(f"no such key: {to_text(i)}")
        return found
    if isinstance(v, Lazy) and type(i) is str:
        return v.read(i)
    raise EvalError(NO_OVERLOAD)


def to_text(v: Value) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def _const(value: Value) -> Node:
    return Node(lambda fr: value, "const", value)


class Planner:
    """Compiles one expression; `plan(tree)` gives the closure."""

    def __init__(self) -> None:
        self.scope: list[str] = []  # comprehension variables being planned

    def plan(self, tree: Any) -> Node:
        tree = _unwrap(tree)
        if isinstance(tree, Token):
            raise ValueError(f"unexpected token {tree!r}")
        method: Callable[[Tree[Any]], Node] = getattr(self, "_" + tree.data)
        return method(tree)

    # --- operators ---

    def _expr(self, tree: Tree[Any]) -> Node:
        cond, then, otherwise = (self.plan(c) for c in tree.children)
        c, t, f = cond.fn, then.fn, otherwise.fn

        def ternary(fr: Frame) -> Value:
            return t(fr) if _bool(c(fr)) else f(fr)

        return Node(ternary, "cond")

    def _conditionalor(self, tree: Tree[Any]) -> Node:
        return self._logical(tree, True)

    def _conditionaland(self, tree: Tree[Any]) -> Node:
        return self._logical(tree, False)

    def _logical(self, tree: Tree[Any], decisive: bool) -> Node:
        """cel-go evalOr / evalAnd: a deciding operand decides, even beside an error; then the left error,
        then the right one; a non-bool is `no such overload`. Neither costs anything itself."""
        left, right = self.plan(tree.children[0]).fn, self.plan(tree.children[1]).fn

        def logical(fr: Frame) -> Value:
            try:
                a = left(fr)
            except EvalError as e:
                a = e
            if a is decisive:
                return a
            try:
                b = right(fr)
            except EvalError as e:
                b = e
            if b is decisive:
                return b
            if a is (not decisive) and b is (not decisive):
                return b
            if isinstance(a, EvalError):
                raise a
            if isinstance(b, EvalError):
                raise b
            raise EvalError(NO_OVERLOAD)

        return Node(logical)

    def _relation(self, tree: Tree[Any]) -> Node:
        op_tree, right_tree = tree.children
        op = op_tree.data
        left, right = self.plan(op_tree.children[0]).fn, self.plan(right_tree)
        r = right.fn
        if op == "relation_in":
            if right.shape == "const" and isinstance(right.value, list):
                members = right.value  # OptOptimize: set membership, no call cost

                def in_set(fr: Frame) -> Value:
                    x = left(fr)
                    return any(equal(x, m) for m in members)

                return Node(in_set)

            def contained(fr: Frame) -> Value:
                x, container = left(fr), r(fr)
                if isinstance(container, list):
                    fr.charge(len(container))
                    return any(equal(x, m) for m in container)
                if isinstance(container, dict):
                    fr.charge(1)
                    return any(equal(x, k) for k in container) if type(x) is not str else x in container
                if isinstance(container, Lazy) and type(x) is str:
                    fr.charge(1)
                    return container.has(x)
                raise EvalError(NO_OVERLOAD)

            return Node(contained)
        if op in ("relation_eq", "relation_ne"):
            negate = op == "relation_ne"

            def equality(fr: Frame) -> Value:
                a, b = left(fr), r(fr)
                fr.charge(ceil(min(size_of(a), size_of(b)) * 0.1))
                return equal(a, b) is not negate

            return Node(equality)
        compare: Callable[[Value, Value], bool] = {
            "relation_lt": lambda a, b: less(a, b),
            "relation_gt": lambda a, b: less(b, a),
            "relation_le": lambda a, b: not less(b, a),
            "relation_ge": lambda a, b: not less(a, b),
        }[op]

        def ordering(fr: Frame) -> Value:
            a, b = left(fr), r(fr)
            fr.charge(ceil(min(size_of(a), size_of(b)) * 0.1) if type(a) is str else 1)
            return bool(compare(a, b))

        return Node(ordering)

    def _addition(self, tree: Tree[Any]) -> Node:
        op_tree, right_tree = tree.children
        left, right = self.plan(op_tree.children[0]).fn, self.plan(right_tree).fn
        if op_tree.data == "addition_add":

            def plus(fr: Frame) -> Value:
                a, b = left(fr), right(fr)
                fr.charge(ceil((len(a) + len(b)) * 0.1) if type(a) is str and type(b) is str else 1)
                return add(a, b)

            return Node(plus)
        return self._binary(left, right, "-")

    def _multiplication(self, tree: Tree[Any]) -> Node:
        op_tree, right_tree = tree.children
        left, right = self.plan(op_tree.children[0]).fn, self.plan(right_tree).fn
        op = {"multiplication_mul": "*", "multiplication_div": "/", "multiplication_mod": "%"}[op_tree.data]
        return self._binary(left, right, op)

    def _binary(self, left: Fn, right: Fn, op: str) -> Node:
        def binary(fr: Frame) -> Value:
            a, b = left(fr), right(fr)
            fr.charge(1)
            return arith(op, a, b)

        return Node(binary)

    def _unary(self, tree: Tree[Any]) -> Node:
        op, operand = tree.children[0].data, self.plan(tree.children[1])
        x = operand.fn
        if op == "unary_neg":
            if operand.shape == "const" and type(operand.value) in (int, float):
                return _const(arith("-", type(operand.value)(0), operand.value))

            def negate(fr: Frame) -> Value:
                v = x(fr)
                fr.charge(1)
                return arith("-", type(v)(0), v) if type(v) in (int, float) else arith("-", "", v)

            return Node(negate)

        def logical_not(fr: Frame) -> Value:
            v = x(fr)
            fr.charge(1)
            return not _bool(v)

        return Node(logical_not)

    # --- members ---

    def _member_dot(self, tree: Tree[Any]) -> Node:
        operand, name = self.plan(tree.children[0]), str(tree.children[1])
        x, extra = operand.fn, self._relative(operand)

        def select(fr: Frame) -> Value:
            v = x(fr)
            fr.charge(extra)
            return _select(v, name)

        return Node(select, "attr")

    def _relative(self, operand: Node) -> int:
        """1 per qualifier, and 1 more for a relative attribute (cel-go planner.go relativeAttr)."""
        return 1 if operand.shape in ("attr", "cond") else 2

    def _member_index(self, tree: Tree[Any]) -> Node:
        operand, index = self.plan(tree.children[0]), self.plan(tree.children[1])
        x, i, extra = operand.fn, index.fn, self._relative(operand)

        def indexed(fr: Frame) -> Value:
            v = x(fr)
            key = i(fr)
            fr.charge(extra)
            return _index(v, key)

        return Node(indexed, "attr")

    def _member_object(self, tree: Tree[Any]) -> Node:
        path = self._type_name(tree.children[0])
        inits = tree.children[1] if len(tree.children) > 1 else None
        fields = []
        if inits is not None:
            items = inits.children
            fields = [(str(items[k]), self.plan(items[k + 1]).fn) for k in range(0, len(items), 2)]

        def construct(fr: Frame) -> Value:
            values = {name: fn(fr) for name, fn in fields}
            fr.charge(STRUCT_CREATE)
            return Typed(path, values)

        return Node(construct)

    def _type_name(self, tree: Any) -> tuple[str, ...]:
        tree = _unwrap(tree)
        if tree.data == "ident":
            return (str(tree.children[0]),)
        if tree.data == "member_dot":
            return (*self._type_name(tree.children[0]), str(tree.children[1]))
        raise ValueError("a message name must be a qualified identifier")

    def _member_dot_arg(self, tree: Tree[Any]) -> Node:
        receiver, name = tree.children[0], str(tree.children[1])
        args = list(tree.children[2].children) if len(tree.children) > 2 and tree.children[2] else []
        target = _unwrap(receiver)
        if name in ("all", "exists", "exists_one", "map", "filter"):
            return self._comprehension(name, receiver, args)
        if isinstance(target, Tree) and target.data == "ident" and str(target.children[0]) == "jsonpatch":
            return self._call(f"jsonpatch.{name}", [self.plan(a) for a in args])
        return self._call(name, [self.plan(receiver), *(self.plan(a) for a in args)])

    # --- primaries ---

    def _ident(self, tree: Tree[Any]) -> Node:
        name = str(tree.children[0])
        if name in self.scope:

            def local(fr: Frame) -> Value:
                fr.charge(1)
                return fr.locals[name]

            return Node(local, "attr")

        def ident(fr: Frame) -> Value:
            fr.charge(1)
            if name in fr.locals:
                return fr.locals[name]
            return fr.lookup(name)

        return Node(ident, "attr")

    _dot_ident = _ident

    def _ident_arg(self, tree: Tree[Any]) -> Node:
        name = str(tree.children[0])
        args = list(tree.children[1].children) if len(tree.children) > 1 and tree.children[1] else []
        if name == "has":
            return self._has(args)
        planned = [self.plan(a) for a in args]
        if name in CONVERSIONS and len(planned) == 1 and planned[0].shape == "const":
            return _const(CONVERSIONS[name](planned[0].value))  # OptOptimize: a constant
        return self._call(name, planned)

    _dot_ident_arg = _ident_arg

    def _call(self, name: str, args: list[Node]) -> Node:
        fns = [a.fn for a in args]
        if name in CONVERSIONS:
            convert = CONVERSIONS[name]
            if len(fns) != 1:
                raise EvalError(NO_OVERLOAD)
            (arg,) = fns

            def conversion(fr: Frame) -> Value:
                v = arg(fr)
                fr.charge(1)
                return convert(v)

            return Node(conversion)
        entry = FUNCTIONS.get(name)

        def call(fr: Frame) -> Value:
            values = [f(fr) for f in fns]
            if entry is None:
                raise EvalError(f"kubesim does not implement the CEL function '{name}'")
            impl, cost = entry
            try:
                result = impl(*values)
            except TypeError:  # the wrong number of arguments
                raise EvalError(NO_OVERLOAD) from None
            fr.charge(cost(values, result))
            return result

        return Node(call)

    def _has(self, args: list[Any]) -> Node:
        target = _unwrap(args[0]) if len(args) == 1 else None
        if not isinstance(target, Tree) or target.data != "member_dot":
            raise ValueError("invalid argument to has() macro")
        operand, name = self.plan(target.children[0]).fn, str(target.children[1])

        def has(fr: Frame) -> Value:
            v = operand(fr)
            if isinstance(v, dict):
                return name in v
            if isinstance(v, Lazy):
                return v.has(name)
            raise EvalError(NO_OVERLOAD)

        return Node(has)

    def _paren_expr(self, tree: Tree[Any]) -> Node:
        return self.plan(tree.children[0])

    def _list_lit(self, tree: Tree[Any]) -> Node:
        items = (
            [self.plan(c) for c in tree.children[0].children] if tree.children and tree.children[0] else []
        )
        if all(i.shape == "const" for i in items):
            return _const([i.value for i in items])
        fns = [i.fn for i in items]

        def make_list(fr: Frame) -> Value:
            out = [f(fr) for f in fns]
            fr.charge(LIST_CREATE)
            return out

        return Node(make_list)

    def _map_lit(self, tree: Tree[Any]) -> Node:
        inits = tree.children[0].children if tree.children and tree.children[0] else []
        pairs = [(self.plan(inits[k]), self.plan(inits[k + 1])) for k in range(0, len(inits), 2)]
        if all(k.shape == "const" and v.shape == "const" for k, v in pairs):
            return _const(_make_map([(k.value, v.value) for k, v in pairs]))
        fns = [(k.fn, v.fn) for k, v in pairs]

        def make_map(fr: Frame) -> Value:
            out = _make_map([(k(fr), v(fr)) for k, v in fns])
            fr.charge(MAP_CREATE)
            return out

        return Node(make_map)

    def _literal(self, tree: Tree[Any]) -> Node:
        token = tree.children[0]
        assert isinstance(token, Token)
        text = str(token)
        if token.type == "INT_LIT":
            return _const(int(text, 0) if not text.lstrip("-").startswith("0x") else int(text, 16))
        if token.type == "UINT_LIT":
            return _const(Uint(int(text[:-1], 0)))
        if token.type == "FLOAT_LIT":
            return _const(float(text))
        if token.type in ("STRING_LIT", "MLSTRING_LIT"):
            return _const(str(celstr(token)))
        if token.type == "BYTES_LIT":
            return _const(bytes(celbytes(token)))
        if token.type == "BOOL_LIT":
            return _const(text == "true")
        return _const(None)

    # --- comprehensions (cel-go parser/macro.go expansions, interpreter folder) ---

    def _comprehension(self, macro: str, receiver: Any, args: list[Any]) -> Node:
        var_tree = _unwrap(args[0]) if args else None
        if not isinstance(var_tree, Tree) or var_tree.data != "ident":
            raise ValueError(f"{macro}: the first argument must be a simple name")
        var = str(var_tree.children[0])
        rng = self.plan(receiver).fn
        self.scope.append(var)
        try:
            body = [self.plan(a) for a in args[1:]]
        finally:
            self.scope.pop()
        if macro in ("all", "exists"):
            return Node(_quantifier(rng, var, body[0].fn, macro == "exists"))
        if macro == "exists_one":
            return Node(_exists_one(rng, var, body[0].fn))
        if macro == "filter":
            return Node(_mapper(rng, var, body[0].fn, None, 0))
        if len(body) == 1:
            return Node(_mapper(rng, var, None, body[0].fn, 0 if body[0].shape == "const" else LIST_CREATE))
        return Node(_mapper(rng, var, body[0].fn, body[1].fn, 0 if body[1].shape == "const" else LIST_CREATE))


def _make_map(pairs: list[tuple[Value, Value]]) -> dict[Any, Value]:
    out: dict[Any, Value] = {}
    for k, v in pairs:
        if type(k) not in (str, int, Uint, bool):
            raise EvalError(f"unsupported key type: {kind(k)}")
        if k in out:
            raise EvalError(f"insert failed: key {to_text(k)} already exists")
        out[k] = v
    return out


def _range(v: Value) -> list[Value]:
    if isinstance(v, list):
        return v
    if isinstance(v, dict):
        return list(v)
    raise EvalError(f"got '{kind(v)}', expected iterable type")


def _scoped(var: str, run: Callable[[Frame, list[Value]], Value], rng: Fn) -> Fn:
    def comprehension(fr: Frame) -> Value:
        items = _range(rng(fr))
        saved = fr.locals.get(var, _MISSING)
        try:
            return run(fr, items)
        finally:
            if saved is _MISSING:
                fr.locals.pop(var, None)
            else:
                fr.locals[var] = saved

    return comprehension


def _quantifier(rng: Fn, var: str, predicate: Fn, exists: bool) -> Fn:
    """exists: accumulator false, condition `@not_strictly_false(!__result__)` (3), step `__result__ || p`
    (1 + p); all: true, `@not_strictly_false(__result__)` (2), `__result__ && p`; result `__result__` (1)."""
    condition = 3 if exists else 2
    decisive = exists

    def run(fr: Frame, items: list[Value]) -> Value:
        accu: Value = not exists
        for item in items:
            fr.charge(condition)
            if accu is decisive:
                break
            fr.locals[var] = item
            fr.charge(1)
            try:
                value = predicate(fr)
            except EvalError as e:
                value = e
            if value is decisive:
                accu = value
            elif isinstance(accu, EvalError):
                pass
            elif isinstance(value, EvalError):
                accu = value
            elif value is not (not decisive):
                accu = EvalError(NO_OVERLOAD)
        fr.charge(1)
        if isinstance(accu, EvalError):
            raise accu
        return accu

    return _scoped(var, run, rng)


def _exists_one(rng: Fn, var: str, predicate: Fn) -> Fn:
    """Accumulator 0, step `p ? __result__ + 1 : __result__`, result `__result__ == 1` (2)."""

    def run(fr: Frame, items: list[Value]) -> Value:
        count = 0
        for item in items:
            fr.locals[var] = item
            hit = _bool(predicate(fr))
            fr.charge(2 if hit else 1)
            count += hit
        fr.charge(2)
        return count == 1

    return _scoped(var, run, rng)


def _mapper(rng: Fn, var: str, predicate: Fn | None, transform: Fn | None, create: int) -> Fn:
    """map: step `__result__ + [f]` (1 + create + f + 1); map with a filter and filter: `p ? ... :
    __result__`; filter's element is `x` (1 + 10 + 1 + 1). Result `__result__` (1)."""

    def run(fr: Frame, items: list[Value]) -> Value:
        out: list[Value] = []
        for item in items:
            fr.locals[var] = item
            if predicate is not None and not _bool(predicate(fr)):
                fr.charge(1)
                continue
            if transform is None:
                fr.charge(1 + LIST_CREATE + 1 + 1)
                out.append(item)
            else:
                out.append(transform(fr))
                fr.charge(1 + create + 1)
        fr.charge(1)
        return out

    return _scoped(var, run, rng)

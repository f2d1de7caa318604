"""Writing CEL for kube-apiserver: literals, JSON Pointers, globs, and a worst-case cost for each expression.

sparkgate/render.py writes its MutatingAdmissionPolicy in CEL through this module, so that three rules of
the API server's CEL environment (k8s.io/apiserver/pkg/cel/environment/base.go) hold by construction:

- **Homogeneous aggregate literals** (`cel.HomogeneousAggregateLiterals`, checked at policy creation): every
  element of a list literal and every value of a map literal must have the same type, so
  `{"name": "v", "configMap": {"name": "c"}}` is refused (`expected type 'string' but found 'map(string,
  string)'`). `literal` wraps each member of a mixed literal in `dyn(...)`, which makes them all `dyn`.
- **Plain values in JSON Patches**: a JSONPatch value built from typed objects (`Object.spec...{}`) panicked
  a v1.36.2 API server's handler (docs/real-cluster-facts.md); plain maps and lists work, so `literal` never
  writes a typed object.
- **The cost limits** (k8s.io/apiserver/pkg/apis/cel/config.go): `PerCallLimit` 1,000,000 per evaluation of
  one expression, `RuntimeCELCostBudget` 10,000,000 for all the expressions of one policy evaluation. An
  `Expr` carries the CEL text and an upper bound of its runtime cost on an executor pod whose lists stay
  within `BOUNDS`, counted as cel-go counts: one unit per operation, each comprehension's body once per
  element, equality of lists and maps by their size. The bound is this module's estimate, not cel-go's.

Pure functions and immutable values; no state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PER_CALL_LIMIT = 1_000_000  # apis/cel/config.go PerCallLimit: one evaluation of one expression
RUNTIME_BUDGET = 10_000_000  # apis/cel/config.go RuntimeCELCostBudget: one policy evaluation

# The longest lists an executor pod is assumed to have when an expression's cost is bounded (per list field).
BOUNDS: dict[str, int] = {
    "containers": 16,
    "initContainers": 16,
    "env": 256,
    "volumes": 128,
    "volumeMounts": 128,
    "tolerations": 64,
    "schedulingGates": 16,
}
DEFAULT_BOUND = 64  # any other list (ports, args, topologySpreadConstraints, ...)
STRING_BOUND = 253  # a label value, a name: what a string comparison or a regex match scans

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# CEL's reserved words (cel-spec langdef.md): not usable as `a.field`, only as `a["field"]`.
_RESERVED = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)


@dataclass(frozen=True)
class Expr:
    """A CEL expression and an upper bound of its runtime cost."""

    text: str
    cost: int

    def __str__(self) -> str:
        return self.text


def quote(text: str) -> str:
    """A CEL string literal (double-quoted; control characters escaped, the rest verbatim UTF-8)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _static_type(value: object) -> str:
    """The type cel-go's checker gives the literal `literal(value)` writes (`dyn` for a wrapped member)."""
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return f"list({_common([_static_type(v) for v in value])})"
    if isinstance(value, dict):
        return f"map(string, {_common([_static_type(v) for v in value.values()])})"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _common(types: Sequence[str]) -> str:
    """The element type of an aggregate literal: the members' one type, `dyn` when they differ (each member
    is then wrapped in dyn()), `empty` for an empty literal (a free type that matches no other)."""
    if not types:
        return "empty"
    return types[0] if len(set(types)) == 1 else "dyn"


def literal(value: object) -> str:
    """`value` (JSON) as a CEL literal that the API server's checker accepts as a JSONPatch value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = json.dumps(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, list):
        wrap = _common([_static_type(v) for v in value]) == "dyn"
        return "[" + ", ".join(_member(v, wrap) for v in value) + "]"
    if isinstance(value, dict):
        wrap = _common([_static_type(v) for v in value.values()]) == "dyn"
        return "{" + ", ".join(f"{quote(str(k))}: {_member(v, wrap)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _member(value: object, wrap: bool) -> str:
    text = literal(value)
    return f"dyn({text})" if wrap else text


def size(value: object) -> int:
    """How many scalars a JSON value holds: what comparing it costs."""
    if isinstance(value, dict):
        return 1 + sum(size(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(size(v) for v in value)
    return 1


def field(ref: str, key: str) -> str:
    """`ref.key`, or `ref["key"]` where the key is not a CEL identifier."""
    return f"{ref}.{key}" if _IDENT.match(key) and key not in _RESERVED else f"{ref}[{quote(key)}]"


def has(ref: str, key: str) -> str:
    """Presence of `key` in the map `ref` (has() costs nothing in Kubernetes' environment)."""
    return f"has({ref}.{key})" if _IDENT.match(key) and key not in _RESERVED else f"{quote(key)} in {ref}"


def escape_pointer(token: str) -> str:
    """RFC 6901: `~` first, then `/`."""
    return token.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Pointer:
    """A JSON Pointer whose segments are static (escaped here) or CEL int expressions (list indexes)."""

    segments: tuple[str | Expr, ...] = ()

    def key(self, key: str) -> Pointer:
        return Pointer((*self.segments, key))

    def index(self, index: Expr) -> Pointer:
        return Pointer((*self.segments, index))

    def append(self) -> Pointer:
        return self.key("-")

    def cel(self) -> Expr:
        parts: list[str] = []
        static = ""
        cost = 0
        for seg in self.segments:
            if isinstance(seg, Expr):
                parts.extend([quote(static + "/"), f"string({seg.text})"])
                static = ""
                cost += seg.cost + 2
            else:
                static += "/" + escape_pointer(seg)
        if static or not parts:
            parts.append(quote(static))
        return Expr(" + ".join(parts), cost + len(parts))


def patch(op: str, at: Pointer, value: str | None = None, value_cost: int = 0) -> Expr:
    """One `JSONPatch{...}` object (kube-apiserver's JSONPatch type for MutatingAdmissionPolicy)."""
    path = at.cel()
    body = f"op: {quote(op)}, path: {path.text}" + ("" if value is None else f", value: {value}")
    return Expr("JSONPatch{" + body + "}", path.cost + value_cost + 1)


NO_OPS = Expr("[]", 0)


def ops(*patches: Expr) -> Expr:
    """A list literal of patches (each already a `JSONPatch{...}`)."""
    if not patches:
        return NO_OPS
    return Expr("[" + ", ".join(p.text for p in patches) + "]", sum(p.cost for p in patches) + 1)


def concat(chunks: Iterable[Expr]) -> Expr:
    """Lists of patches one after the other (an empty chunk is left out)."""
    parts = [c for c in chunks if c.text != "[]"]
    if not parts:
        return NO_OPS
    if len(parts) == 1:
        return parts[0]
    return Expr(" + ".join(_paren(p) for p in parts), sum(p.cost for p in parts) + len(parts) - 1)


def when(condition: Expr, then: Expr, otherwise: Expr = NO_OPS) -> Expr:
    """`condition ? then : otherwise`; only one branch runs, so the cost is the dearer one."""
    if then.text == otherwise.text:
        return then
    test = condition.text if _IDENT.match(condition.text) else _paren(condition)
    return Expr(
        f"({test} ? {then.text} : {otherwise.text})",
        condition.cost + max(then.cost, otherwise.cost) + 1,
    )


def _paren(e: Expr) -> str:
    return e.text if e.text.startswith(("(", "[")) and _balanced(e.text) else f"({e.text})"


def _balanced(text: str) -> bool:
    """Whether the outer bracket of `text` closes at its last character (so no parentheses are needed)."""
    depth = 0
    in_string = False
    escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if ch == '"' and not escaped:
                in_string = False
            escaped = ch == "\\" and not escaped
            continue
        if ch == '"':
            in_string = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return False
    return True


def glob(subject: str, pattern: str) -> Expr:
    """fnmatch.fnmatchcase(subject, pattern) in CEL: `==`, `startsWith` or an RE2 `matches`."""
    if not any(c in pattern for c in "*?["):
        return Expr(f"{subject} == {quote(pattern)}", 1 + len(pattern) // 10)
    if pattern.endswith("*") and not any(c in pattern[:-1] for c in "*?["):
        return Expr(f"{subject}.startsWith({quote(pattern[:-1])})", 1 + len(pattern) // 10)
    return Expr(f"{subject}.matches({quote(glob_regex(pattern))})", 1 + STRING_BOUND)


def glob_regex(pattern: str) -> str:
    """An fnmatch pattern as an anchored RE2 regular expression: CPython 3.11's fnmatch.translate, with
    its bracket rules (a reversed range dropped, `[!...]` negated), written without lookahead (RE2 has none)."""
    out = ["^"]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch != "[":
            out.append(re.escape(ch))
        else:
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(r"\[")  # no closing bracket: a literal `[`
                continue
            out.append(_bracket(pattern, i, j))
            i = j + 1
    out.append("$")
    return "".join(out)


def _bracket(pattern: str, i: int, j: int) -> str:
    """The class for `pattern[i:j]` (between `[` and `]`), as fnmatch.translate builds it."""
    stuff = pattern[i:j]
    if "-" in stuff:
        chunks = []
        k = i + 2 if pattern[i] == "!" else i + 1
        while True:
            k = pattern.find("-", k, j)
            if k < 0:
                break
            chunks.append(pattern[i:k])
            i = k + 1
            k = k + 3
        chunk = pattern[i:j]
        if chunk:
            chunks.append(chunk)
        else:
            chunks[-1] += "-"
        for k in range(len(chunks) - 1, 0, -1):  # a reversed range matches nothing: drop it
            if chunks[k - 1][-1] > chunks[k][0]:
                chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
                del chunks[k]
        stuff = "-".join(_class_escape(c).replace("-", r"\-") for c in chunks)
    else:
        stuff = _class_escape(stuff)
    if not stuff:
        return r"[^\s\S]"  # an empty class: matches nothing
    if stuff == "!":
        return "."
    if stuff[0] == "!":
        return "[^" + stuff[1:] + "]"
    if stuff[0] == "^":
        return "[\\" + stuff + "]"
    return f"[{stuff}]"


def _class_escape(text: str) -> str:
    return "".join("\\" + c if c in "\\[]&~|" else c for c in text)


def bound(list_field: str) -> int:
    return BOUNDS.get(list_field, DEFAULT_BOUND)

"""Applying RFC 6902 JSON Patch and RFC 7386 merge patch to plain JSON values.

Used where sparkgate must apply a patch itself: `sparkgate mutate` shows the admitted pod, and kubesim
applies the webhook's patches and clients' PATCH requests as kube-apiserver does. The `jsonpatch` library
stays a test oracle only. Inputs are never mutated: the patched document is a `clone`.

`clone`: a deep copy of a JSON document. `copy.deepcopy` walks a document in Python with a memo of every
node: ~600-740 µs for a captured Spark executor pod, and each webhook patch and each PATCH request that
kubesim applied paid it (kubesim's own copies were already orjson's). orjson's encoding and parsing of the same pod takes ~45 µs, and gives the same document: dicts (key
order kept), lists, str, int, float, bool and None are exactly what it round-trips. Most else (a tuple, a
subclass such as a CEL `Typed` object, a dataclass, a datetime from YAML, an integer past 64 bits) is
refused by the encoder and copied by `copy.deepcopy`. What is not a JSON document's may still be changed: a
NaN or an infinity becomes None, a UUID or an Enum member its value; no document here holds one (JSON has
none).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import orjson

_T = TypeVar("_T")
# Types orjson would otherwise write as something else (a subclass as its base, a dataclass as a dict, a
# datetime as a string): refused, so copy.deepcopy copies them as they are.
_REFUSE = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def clone(document: _T) -> _T:
    """A copy of `document` that shares nothing mutable with it."""
    try:
        out: _T = orjson.loads(orjson.dumps(document, option=_REFUSE))
    except TypeError:
        return copy.deepcopy(document)
    return out


class PatchError(ValueError):
    """The patch does not apply; `test_failed` when it was a `test` operation that did not hold."""

    def __init__(self, message: str, *, test_failed: bool = False) -> None:
        super().__init__(message)
        self.test_failed = test_failed


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"{pointer!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(container: list[Any], token: str, pointer: str, *, append: bool) -> int:
    if append and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise PatchError(f"{pointer}: {token!r} is not an array index")
    i = int(token)
    if i > len(container) or (not append and i == len(container)):
        raise PatchError(f"{pointer}: index {i} is out of range")
    return i


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    if not tokens:
        raise PatchError("the whole document cannot be the target here")
    target = doc
    for token in tokens[:-1]:
        target = _child(target, token, pointer)
    return target, tokens[-1]


def _child(value: Any, token: str, pointer: str) -> Any:
    if isinstance(value, dict):
        if token not in value:
            raise PatchError(f"{pointer}: member {token!r} not found")
        return value[token]
    if isinstance(value, list):
        return value[_index(value, token, pointer, append=False)]
    raise PatchError(f"{pointer}: cannot descend into a {type(value).__name__}")


def get(doc: Any, pointer: str) -> Any:
    value = doc
    for token in _tokens(pointer):
        value = _child(value, token, pointer)
    return value


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, pointer, append=True), value)
    else:
        raise PatchError(f"{pointer}: parent is not an object or array")
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"{pointer}: member {token!r} not found")
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_index(parent, token, pointer, append=False))
    raise PatchError(f"{pointer}: parent is not an object or array")


def apply_patch(doc: Any, ops: Any) -> Any:
    """`doc` with the RFC 6902 operations applied; PatchError (nothing applied) when one fails."""
    if not isinstance(ops, list):
        raise PatchError("a JSON Patch is a list of operations")
    doc = clone(doc)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {n} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {n} ({kind} {path}) needs a 'value'")
        if kind == "add":
            doc = _add(doc, path, clone(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            if path == "":
                doc = clone(op["value"])
            else:
                get(doc, path)
                _remove(doc, path)
                doc = _add(doc, path, clone(op["value"]))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(f"operation {n} ({kind} {path}) needs 'from'")
            if kind == "move" and (path + "/").startswith(source + "/") and path != source:
                raise PatchError(f"{path}: cannot move {source} into itself")
            value = _remove(doc, source) if kind == "move" else clone(get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            try:
                actual = get(doc, path)
            except PatchError as e:
                raise PatchError(f"test failed: {e}", test_failed=True) from None
            if not _equal(actual, op["value"]):
                raise PatchError(f"test failed: {path} is {actual!r}, not {op['value']!r}", test_failed=True)
        else:
            raise PatchError(f"operation {n}: unknown op {kind!r}")
    return doc


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out

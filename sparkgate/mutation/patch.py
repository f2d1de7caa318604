"""RFC 6902 operations that turn one JSON document into another that was derived from it.

The mutation builds the pod it wants (sharing every untouched subtree with the original) and this module
writes the difference as JSON Patch. Derived means: maps gain or change members, lists gain elements at
the end or change elements in place; a list that shrank or was reordered is replaced whole. Nothing is
emitted where the values are already equal, which makes re-mutating a mutated pod a no-op.
"""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]
_ABSENT = object()  # a member `before` does not have


def escape(token: str) -> str:
    """RFC 6901 reference-token escape: `~` first, then `/` (the other order double-escapes)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(before: Any, after: Any, pointer: str = "") -> list[Operation]:
    """Operations that turn `before` into `after` (which must differ from it only as described above)."""
    ops: list[Operation] = []
    _diff(before, after, pointer, ops)
    return ops


def _diff(before: Any, after: Any, pointer: str, ops: list[Operation]) -> None:
    if before is after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in after.items():
            old = before.get(key, _ABSENT)
            if old is value:  # shared subtrees (most of the pod) cost no pointer and no call
                continue
            # the escape's call only for the keys that need it (a label's or annotation's `/`)
            path = pointer + "/" + (escape(key) if "/" in key or "~" in key else key)
            if old is _ABSENT:
                ops.append({"op": "add", "path": path, "value": value})
            else:
                _diff(old, value, path, ops)
        if not before.keys() <= after.keys():
            ops.extend(
                {"op": "remove", "path": f"{pointer}/{escape(key)}"} for key in before if key not in after
            )
        return
    if isinstance(before, list) and isinstance(after, list) and len(after) >= len(before):
        for i, old in enumerate(before):
            if old is not after[i]:
                _diff(old, after[i], f"{pointer}/{i}", ops)
        ops.extend({"op": "add", "path": f"{pointer}/-", "value": value} for value in after[len(before) :])
        return
    if before != after or type(before) is not type(after):
        ops.append({"op": "replace", "path": pointer, "value": after})

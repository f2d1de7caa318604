"""The JSON Patch writer: the operations it emits, and their order."""

from __future__ import annotations

from sparkgate.mutation.patch import diff


def test_removed_members_are_removed_in_the_order_of_the_document() -> None:
    """Not in a set's order, which changes with PYTHONHASHSEED from one worker process to the next."""
    before = {f"field-{i}": i for i in range(30)}
    after = {"field-7": 7}
    assert diff(before, after) == [{"op": "remove", "path": f"/field-{i}"} for i in range(30) if i != 7]

"""The mutating phase's reinvocation bookkeeping, shared by MutatingAdmissionPolicy and the mutating webhooks.

k8s.io/apiserver/pkg/admission/reinvocation.go and attributes.go (`ReinvocationContext`): when a mutating
plugin asks for it (`should_reinvoke`), the whole mutating phase runs once more (`is_reinvoke`): every
in-tree plugin again, and, of each of the two plugins, what its own context says: the mutating webhooks'
`webhookReinvokeContext` (plugin/webhook/mutating/reinvocationcontext.go) and the policies'
`policyReinvokeContext` (plugin/policy/mutating/reinvocationcontext.go) hold the same three fields.

One `Reinvocation` per admitted request, owned by the thread that admits it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

Obj = dict[str, Any]


def _snapshot(obj: Obj) -> bytes:
    """What `output_changed` compares: the object's JSON text with its keys sorted, a tenth of a deep copy's
    cost (the copy's decoding is the dear half). Equal texts are equal objects; the converse fails only for
    a number whose type a plugin changed (1 and 1.0), which then counts as a change."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson refuses (an integer past 64 bits) is written by json
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class PluginReinvocation:
    last_output: bytes | None = None
    previously_invoked: set[str] = field(default_factory=set)
    reinvoke: set[str] = field(default_factory=set)

    def require_reinvoking_previously_invoked(self) -> None:
        self.reinvoke |= self.previously_invoked
        self.previously_invoked = set()

    def output_changed(self, obj: Obj) -> bool:
        return _snapshot(obj) != self.last_output

    def set_last_output(self, obj: Obj) -> None:
        self.last_output = _snapshot(obj)


@dataclass
class Reinvocation:
    should_reinvoke: bool = False
    is_reinvoke: bool = False
    plugins: dict[str, PluginReinvocation] = field(default_factory=dict)

    def plugin(self, name: str) -> PluginReinvocation:
        return self.plugins.setdefault(name, PluginReinvocation())

"""Strategic merge patch for the fields sparkgate and Spark's client use.

Like a JSON merge patch, except that lists with a patch merge key merge element by element on that key
(containers, env, volumes and volume mounts, scheduling gates, webhooks, owner references, conditions),
an element `{"$patch": "delete", KEY: ...}` removes it, and `{"$patch": "replace"}` in a map replaces the
map. Lists without a merge key are replaced, as the real server does for them (e.g. tolerations, finalizers
are a set in the real server; kubesim replaces them).
"""

from __future__ import annotations

from typing import Any

from .jsondata import clone

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "schedulingGates": "name",
    "webhooks": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "imagePullSecrets": "name",
    "ports": "containerPort",
}


def strategic_merge(current: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: clone(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        out = clone(current) if isinstance(current, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(out.get(key), value, key)
        return out
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(current, list):
        key = MERGE_KEYS[field]
        out_list = clone(current)
        for element in patch:
            if not isinstance(element, dict) or key not in element:
                continue
            index = next(
                (i for i, e in enumerate(out_list) if isinstance(e, dict) and e.get(key) == element[key]),
                None,
            )
            if element.get("$patch") == "delete":
                if index is not None:
                    out_list.pop(index)
            elif index is None:
                out_list.append({k: clone(v) for k, v in element.items() if not k.startswith("$")})
            else:
                out_list[index] = strategic_merge(out_list[index], element, "")
        return out_list
    return clone(patch)

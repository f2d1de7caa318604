"""Merging an admin's executor pod template into a pod that Spark created.

The rules (docs/policy.md has the table): the template fills what the pod does not set, recursively for
maps; lists merge by their natural key (containers, env, volumes, ports by name, volume mounts by mount
path, devices by device path) and other lists by whole value, appending what the pod lacks; for scalars
and everything else the pod wins, except at the paths the profile lists as overrides, where the template's
value replaces the pod's. In the template, a container named `spark-kubernetes-executor` stands for
Spark's container whatever its name in the pod (sparkgate.contract.spark_container_index says how that container is found).

The merge never mutates its inputs: it returns a new tree that shares every untouched subtree with the
pod, so the patch builder can skip them by identity and the hot path copies almost nothing.
"""

from __future__ import annotations

from typing import Any

from sparkgate import contract

Path = tuple[str, ...]

# The key that identifies an element of a list, by the list's field name.
_LIST_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "ports": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "readinessGates": "conditionType",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "hostAliases": "ip",
}
SPARK_CONTAINER = contract.SPARK_CONTAINER_NAME


def list_key(field: str) -> str | None:
    """The key that identifies an element of the list `field` (None: elements are merged by value)."""
    return _LIST_KEYS.get(field)


def merge(pod: Any, template: Any, overrides: frozenset[Path], path: Path = ()) -> Any:
    """`pod` with `template` merged in; `path` is where both values sit (as in the override paths)."""
    if path in overrides:
        return template
    if isinstance(pod, dict) and isinstance(template, dict):
        return _merge_maps(pod, template, overrides, path)
    if isinstance(pod, list) and isinstance(template, list):
        return _merge_lists(pod, template, overrides, path)
    return pod


def _merge_maps(pod: dict[str, Any], template: dict[str, Any], overrides: frozenset[Path], path: Path) -> Any:
    out: dict[str, Any] | None = None
    for key, value in template.items():
        merged = merge(pod[key], value, overrides, (*path, key)) if key in pod else value
        if key not in pod or merged is not pod[key]:
            if out is None:
                out = dict(pod)
            out[key] = merged
    return pod if out is None else out


def _merge_lists(pod: list[Any], template: list[Any], overrides: frozenset[Path], path: Path) -> list[Any]:
    key = list_key(path[-1]) if path else None
    out: list[Any] | None = None
    if key is None:
        for value in template:
            if value not in pod and (out is None or value not in out):
                out = (out or list(pod)) + [value]
        return pod if out is None else out
    index = _index_by_key(pod, key, spark_container=path[-1] == "containers")
    for value in template:
        name = value.get(key) if isinstance(value, dict) else None
        i = index.get(name) if name is not None else None
        if i is None:
            out = (out if out is not None else list(pod)) + [value]
            continue
        element_path = (*path, f"[{name}]")
        current = out[i] if out is not None else pod[i]
        merged = merge(current, value, overrides, element_path)
        if merged is not current:
            if out is None:
                out = list(pod)
            out[i] = _keep_identity(current, merged, key) if name == SPARK_CONTAINER else merged
    return pod if out is None else out


def _index_by_key(items: list[Any], key: str, *, spark_container: bool) -> dict[Any, int]:
    index = {item.get(key): i for i, item in enumerate(items) if isinstance(item, dict) and key in item}
    if spark_container and items:
        index[SPARK_CONTAINER] = contract.spark_container_index(items)
    return index


def _keep_identity(current: Any, merged: Any, key: str) -> Any:
    """The template's stand-in name never renames Spark's container."""
    if isinstance(current, dict) and isinstance(merged, dict) and merged.get(key) != current.get(key):
        return {**merged, key: current.get(key)}
    return merged

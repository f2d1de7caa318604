"""Merging an admin's executor pod template into a pod that Spark created.

The rules (docs/policy.md has the table): the template fills what the pod does not set, recursively for
maps; lists merge by their natural key (containers, env, volumes, ports by name, volume mounts by mount
path, devices by device path) and other lists by whole value, appending what the pod lacks; for scalars
and everything else the pod wins, except at the paths the profile lists as overrides, where the template's
value replaces the pod's. In the template, a container named `spark-kubernetes-executor` stands for
Spark's container whatever its name in the pod (sparkgate.contract.spark_container_index says how that container is found).

The merge never mutates its inputs: it returns a new tree that shares every untouched subtree with the
pod, so the patch builder can skip them by identity and the hot path copies almost nothing. A profile's
template is compiled once (`Template`, cached per profile by sparkgate/mutation/__init__.py): each node
knows whether its path is an override and how its list is keyed, so a merge builds no paths and looks
nothing up by them.
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
    return Template(template, overrides, path).merge(pod)


class Template:
    """A template value compiled at its path: the merge without paths, overrides or keys looked up."""

    __slots__ = ("containers", "elements", "fields", "key", "kind", "override", "value")

    def __init__(self, value: Any, overrides: frozenset[Path], path: Path) -> None:
        self.value = value
        self.override = path in overrides
        self.fields: tuple[tuple[str, Template], ...] = ()
        self.key: str | None = None
        self.containers = False
        # a keyed list's elements: (name, hashable, compiled); a name of None is always appended
        self.elements: tuple[tuple[Any, bool, Template], ...] = ()
        if isinstance(value, dict):
            self.kind = _MAP
            self.fields = tuple((k, Template(v, overrides, (*path, k))) for k, v in value.items())
        elif isinstance(value, list):
            self.kind = _LIST
            self.key = list_key(path[-1]) if path else None
            self.containers = bool(path) and path[-1] == "containers"  # the stand-in names Spark's
            if self.key is not None:
                self.elements = tuple(_element(v, self.key, overrides, path) for v in value)
        else:
            self.kind = _SCALAR

    def merge(self, pod: Any) -> Any:
        if self.override:
            return self.value
        if self.kind is _MAP and isinstance(pod, dict):
            return self._merge_map(pod)
        if self.kind is _LIST and isinstance(pod, list):
            return self._merge_list(pod)
        return pod

    def _merge_map(self, pod: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] | None = None
        for key, field in self.fields:
            if key in pod:
                current = pod[key]
                merged = field.merge(current)
                if merged is current:
                    continue
            else:
                merged = field.value
            if out is None:
                out = dict(pod)
            out[key] = merged
        return pod if out is None else out

    def _merge_list(self, pod: list[Any]) -> list[Any]:
        out: list[Any] | None = None
        key = self.key
        if key is None:
            for value in self.value:
                if value not in pod and (out is None or value not in out):
                    out = (out or list(pod)) + [value]
            return pod if out is None else out
        for name, hashable, element in self.elements:
            i = _position(pod, key, name, hashable, self.containers) if name is not None else None
            if i is None:
                out = (out if out is not None else list(pod)) + [element.value]
                continue
            current = out[i] if out is not None else pod[i]
            merged = element.merge(current)
            if merged is not current:
                if out is None:
                    out = list(pod)
                out[i] = _keep_identity(current, merged, key) if name == SPARK_CONTAINER else merged
        return pod if out is None else out


_SCALAR, _MAP, _LIST = "scalar", "map", "list"


def _element(value: Any, key: str, overrides: frozenset[Path], path: Path) -> tuple[Any, bool, Template]:
    name = value.get(key) if isinstance(value, dict) else None
    try:
        hash(name)
    except TypeError:
        return name, False, Template(value, overrides, path)
    return name, True, Template(value, overrides, (*path, f"[{name}]"))


def _position(items: list[Any], key: str, name: Any, hashable: bool, containers: bool) -> int | None:
    """Where the element keyed `name` is in the pod's list (the last one of that key), Spark's container for
    the template's stand-in; None when the pod has none."""
    if not hashable:
        hash(name)  # raises TypeError, as a look-up by an unhashable key does
    if containers and name == SPARK_CONTAINER and items:
        return contract.spark_container_index(items)
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if isinstance(item, dict) and key in item and item[key] == name:
            return i
    return None


def _keep_identity(current: Any, merged: Any, key: str) -> Any:
    """The template's stand-in name never renames Spark's container."""
    if isinstance(current, dict) and isinstance(merged, dict) and merged.get(key) != current.get(key):
        return {**merged, key: current.get(key)}
    return merged

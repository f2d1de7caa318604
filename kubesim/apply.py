"""Server-side apply: the merge of an applied configuration into the live object, and its field managers.

Copied from kube-apiserver's apply path (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go,
`applyPatcher`; staging/src/k8s.io/apimachinery/pkg/util/managedfields) and from
sigs.k8s.io/structured-merge-diff (merge/update.go `Updater.Apply`, typed/merge.go, typed/remove.go,
typed/tofieldset.go, fieldpath/serialize.go):

- The applied configuration is merged into the live object: maps (structs and maps alike) are merged key by
  key; a list of `x-kubernetes-list-type: map` element by element on its keys (LIST_KEYS: containers, env and
  volumes by name, container ports by containerPort and protocol, ...), in typed/merge.go's order (the live
  order, the applied elements new to it placed where the configuration puts them); a list of type `set`
  (finalizers) by value; every other list is atomic and replaced whole, as is every scalar.
- The fields a manager applies (`ToFieldSet`: every leaf, every element of an associative list) are recorded
  in `metadata.managedFields` as a `FieldsV1` entry with `operation: Apply`; identity fields
  (apiVersion, kind, metadata.name/namespace/uid/...) are stripped from every set, as managedfields'
  stripMeta does. Fields the manager applied last time and no longer applies are removed from the object
  unless another manager owns them (`Updater.prune`).
- A field another manager owns whose value the apply changes (or adds) is a conflict: 409 with the message of
  managedfields/internal/conflict.go, unless `force`, which takes the field from the other manager. A field
  the apply removes leaves every other manager's set.
- Pods ignore `status` in an applied configuration (the pod strategy's reset fields on the main resource).

- Every create, update and patch records an `operation: Update` entry (`update`), as kube-apiserver's
  handlers do before admission (create.go, update.go, patch.go: `FieldManager.UpdateNoErrors`, the manager
  from `fieldManager`, else the User-Agent up to its first "/": `managerOrUserAgent`): the fields the
  request added or changed become its manager's (one entry per manager, API version and subresource), every
  other manager loses them and every manager loses the fields it removed (merge/update.go `Updater.update`
  with force, managedfields' managedFieldsUpdater: the entry's time moves only when it changed a field).
  So a field a POST created is co-owned by its creator: an applier that stops applying it does not prune it,
  and an apply that changes it without `force` conflicts.

Simplified here (said so rather than guessed): a manager's set holds leaves and elements of associative
lists, as an Apply's does; SMD also records a map or list that the update brought into being (`.` under
`f:labels` of a new labels map; which ones depends on Go's zero value of each type), which kubesim leaves
out. The cap of ten Update entries (CapManagersManager's "ancient-changes") is not copied. The fields a
subresource may not change (the strategy's reset fields) are modelled for pods: their main resource owns no
`status`, their `status` subresource only `status`. Atomic structs (`x-kubernetes-map-type: atomic`, e.g. a
LabelSelector) are merged like maps; an applied `null` removes the field. Field sets are held as sets of
paths (tuples of FieldsV1 keys such as `f:spec`, `k:{"name":"c"}`, `v:"x"`) and written as FieldsV1.

Pure functions of their arguments; no state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request
from .jsondata import clone

Obj = dict[str, Any]
Path = tuple[str, ...]

# Associative lists (`+listType=map`) and their keys, by field name, for the types kubesim serves
# (k8s.io/api core/v1 and admissionregistration/v1 types.go). A key with a default in the schema may be
# left out of an element (SMD fills it from the default: container ports' protocol is TCP).
LIST_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "protocol"),
    "schedulingGates": ("name",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "resourceClaims": ("name",),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
    "webhooks": ("name",),
    "matchConditions": ("name",),
}
KEY_DEFAULTS = {"protocol": "TCP"}
SETS = {"finalizers"}  # `+listType=set`
_IDENTITY_META = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
)


# --- merging ------------------------------------------------------------------------------------------


def merge(live: Any, config: Any, field: str = "") -> Any:
    """typed.Merge: `config` merged into `live` (neither is changed). ValueError on an element of an
    associative list that lacks a key, or two elements with the same key."""
    if isinstance(config, dict):
        out = clone(live) if isinstance(live, dict) else {}
        for key, value in config.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(out.get(key), value, key)
        return out
    if isinstance(config, list) and (field in LIST_KEYS or field in SETS):
        return _merge_list(live if isinstance(live, list) else [], config, field)
    return clone(config)


def _element_key(field: str, element: Any, index: int) -> str:
    """The FieldsV1 key of a list element: `k:{...}` (keys sorted, compact JSON) or `v:VALUE`."""
    if field in SETS:
        return "v:" + _json(element)
    keys = LIST_KEYS[field]
    if not isinstance(element, dict):
        raise ValueError(f".{field}: element {index}: expected map, got {_json(element)}")
    values = {}
    for key in keys:
        if key in element:
            values[key] = element[key]
        elif key in KEY_DEFAULTS:
            values[key] = KEY_DEFAULTS[key]
        else:
            raise ValueError(
                f".{field}: element {index}: associative list with keys has an element that omits key "
                f'field "{key}" (and doesn\'t have default value)'
            )
    return "k:" + _json(dict(sorted(values.items())))


def _index(items: list[Any], field: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, element in enumerate(items):
        key = _element_key(field, element, i)
        if key in out:
            raise ValueError(f".{field}: duplicate entries for key {_describe(key)}")
        out[key] = element
    return out


def _merge_list(live: list[Any], config: list[Any], field: str) -> list[Any]:
    """typed/merge.go `visitListItems`: the live order, with the applied elements merged in place and the
    new ones placed where the configuration puts them relative to the shared ones."""
    lhs, rhs = _index(live, field), _index(config, field)
    lkeys, rkeys = list(lhs), list(rhs)
    shared = [k for k in rkeys if k in lhs]
    out: list[Any] = []
    merged: set[str] = set()
    li = ri = 0

    def item(key: str, with_rhs: bool) -> Any:
        if field in SETS:
            return clone(rhs[key] if with_rhs else lhs[key])
        return merge(lhs.get(key), rhs[key], "") if with_rhs else clone(lhs[key])

    while li < len(lkeys) or ri < len(rkeys):
        if li < len(lkeys) and ri < len(rkeys):
            key = lkeys[li]
            if key == rkeys[ri]:
                merged.add(key)
                out.append(item(key, True))
                li, ri = li + 1, ri + 1
                shared = shared[1:] if shared and shared[0] == key else shared
                continue
            if key in rhs and shared and shared[0] != key:
                li += 1
                continue
        if li < len(lkeys):
            key = lkeys[li]
            if key not in rhs:
                out.append(item(key, False))
                li += 1
                continue
            if key in merged:
                li += 1
                continue
        if ri < len(rkeys):
            key = rkeys[ri]
            merged.add(key)
            out.append(item(key, True))
            ri += 1
            shared = shared[1:] if shared and shared[0] == key else shared
    return out


# --- field sets -----------------------------------------------------------------------------------------


def _leaves(obj: Any, prefix: Path, field: str, out: dict[Path, Any]) -> None:
    """typed/tofieldset.go, with each path's value (None for an associative-list element itself)."""
    if isinstance(obj, dict):  # an empty map is no field (tofieldset.go doMap)
        for key, value in obj.items():
            _leaves(value, (*prefix, f"f:{key}"), key, out)
    elif isinstance(obj, list) and (field in LIST_KEYS or field in SETS):
        for element, key in zip(obj, _index(obj, field), strict=True):
            path = (*prefix, key)
            if field in SETS:
                out[path] = element
                continue
            out[path] = None
            for name, value in element.items():
                _leaves(value, (*path, f"f:{name}"), name, out)
    else:
        out[prefix] = obj


def _stripped(obj: Obj, kind: str) -> Obj:
    """managedfields' stripMeta (and the pod's reset `status`): what no manager owns."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    if kind == "Pod":
        out.pop("status", None)
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _IDENTITY_META}
    if meta:
        out["metadata"] = meta
    else:
        out.pop("metadata", None)
    return out


def field_values(obj: Obj, kind: str) -> dict[Path, Any]:
    out: dict[Path, Any] = {}
    _leaves(_stripped(obj, kind), (), "", out)
    return out


def _remove(obj: Any, paths: set[Path], field: str = "") -> Any:
    """typed/remove.go: the object without `paths`; a map or list left empty goes too (None)."""
    if not paths:
        return obj
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            here = f"f:{key}"
            if (here,) in paths:
                continue
            below = {p[1:] for p in paths if p[0] == here and len(p) > 1}
            kept = _remove(value, below, key) if below else value
            if below and kept is None:
                continue
            out[key] = kept
        return out or None
    if isinstance(obj, list) and (field in LIST_KEYS or field in SETS):
        items = []
        for element, key in zip(obj, _index(obj, field), strict=True):
            if (key,) in paths:
                continue
            below = {p[1:] for p in paths if p[0] == key and len(p) > 1}
            items.append(_remove(element, below, "") if below else element)
        return items or None
    return obj


def to_fields_v1(paths: set[Path]) -> Obj:
    """fieldpath/serialize.go: nested FieldsV1; "." marks a path that is itself a member (first, as there)."""
    root: Obj = {}
    members = []
    for path in sorted(paths):  # a path before its extensions
        node = root
        for key in path:
            node = node.setdefault(key, {})
        if path:
            node["."] = {}
            members.append(node)
    for node in members:
        if len(node) == 1:  # a member with nothing below it is a leaf: no marker
            del node["."]
    return root


def from_fields_v1(fields: Obj, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, child in fields.items():
        if key == ".":
            out.add(prefix)
        elif isinstance(child, dict) and child:
            out |= from_fields_v1(child, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def path_string(path: Path) -> str:
    """fieldpath.Path.String: `.spec.containers[name="c"].image`, `.metadata.finalizers[="x"]`."""
    return "".join(_describe(key) for key in path)


def _describe(key: str) -> str:
    if key.startswith("f:"):
        return "." + key[2:]
    if key.startswith("k:"):
        return "[" + ",".join(f"{k}={_json(v)}" for k, v in json.loads(key[2:]).items()) + "]"
    return f"[={key[2:]}]"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# --- the Update operations -------------------------------------------------------------------------------


def manager_of(field_manager: str, user_agent: str) -> str:
    """handlers/create.go `managerOrUserAgent`: the request's fieldManager, else its User-Agent up to the
    first "/", printable characters only, at most 128 bytes (validation.FieldManagerMaxLength)."""
    if field_manager:
        return field_manager
    printable = "".join(c for c in user_agent.split("/")[0] if c.isprintable())
    return printable.encode()[:128].decode(errors="ignore")


def update(
    live: Obj | None, new: Obj, manager: str, *, kind: str, api_version: str, now: str, subresource: str = ""
) -> Obj:
    """`new` (what a create, update or patch will store; `live` None for a create) with its managedFields
    brought up to date for `manager`'s Update operation (module docstring). The managers are the request's own
    managedFields when it carries some (a client may set them), else the live object's."""
    given = (new.get("metadata") or {}).get("managedFields")
    managers = _managers(new if given and not subresource else live)
    added, removed, modified = _compare(_owned(live or {}, kind, subresource), _owned(new, kind, subresource))
    changed = added | modified
    key = (manager, "Update", api_version, subresource)
    mine = next((m for m in managers if _key(m) == key), None)
    result = []
    for m in managers:
        m.fields -= removed
        if m is not mine:
            m.fields -= changed
        if m is mine:
            m.fields |= changed
            if changed:
                m.entry["time"] = now
        if m.fields:
            result.append(m)
    if mine is None and changed:
        entry: Obj = {"manager": manager, "operation": "Update", "apiVersion": api_version, "time": now}
        if subresource:
            entry["subresource"] = subresource
        entry["fieldsType"] = "FieldsV1"
        result.append(_Manager(entry, changed))
    out = dict(new)
    meta = out["metadata"] = dict(new.get("metadata") or {})
    result.sort(key=lambda m: (str(m.entry.get("operation")), str(m.entry.get("time")), m.name))
    meta["managedFields"] = [{**m.entry, "fieldsV1": to_fields_v1(m.fields)} for m in result]
    if not meta["managedFields"]:
        del meta["managedFields"]
    return out


def _key(m: _Manager) -> tuple[str, str, str, str]:
    e = m.entry
    return (m.name, str(e.get("operation")), str(e.get("apiVersion", "")), str(e.get("subresource", "")))


def _owned(obj: Obj, kind: str, subresource: str) -> Obj:
    """What a manager of this request can own: the status subresource only `status`."""
    if subresource == "status":
        return {"status": obj["status"]} if "status" in obj else {}
    return _stripped(obj, kind)


def _compare(old: Any, new: Any) -> tuple[set[Path], set[Path], set[Path]]:
    """typed/compare.go over the leaves and list elements of two objects: (added, removed, modified). Walks
    only where they differ (a status update of a pod compares its status)."""
    added: set[Path] = set()
    removed: set[Path] = set()
    modified: set[Path] = set()
    _diff(old, new, (), "", added, removed, modified)
    return added, removed, modified


_ABSENT: Any = object()


def _diff(
    old: Any, new: Any, prefix: Path, field: str, added: set[Path], removed: set[Path], modified: set[Path]
) -> None:
    if old is not _ABSENT and new is not _ABSENT and old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            _diff(
                old.get(key, _ABSENT),
                new.get(key, _ABSENT),
                (*prefix, f"f:{key}"),
                key,
                added,
                removed,
                modified,
            )
        return
    listed = field in LIST_KEYS or field in SETS
    if listed and isinstance(old, list) and isinstance(new, list):
        before, after = _index(old, field), _index(new, field)
        for key in before.keys() | after.keys():
            path = (*prefix, key)
            if key not in after:
                removed.update(_paths(before[key], path, field))
            elif key not in before:
                added.update(_paths(after[key], path, field))
            elif field not in SETS:
                _diff(before[key], after[key], path, "", added, removed, modified)
        return
    if old is _ABSENT:
        added.update(_paths(new, prefix, field))
    elif new is _ABSENT:
        removed.update(_paths(old, prefix, field))
    elif (
        isinstance(old, dict)
        or isinstance(new, dict)
        or (listed and (isinstance(old, list) or isinstance(new, list)))
    ):
        removed.update(_paths(old, prefix, field))  # a leaf became a map, or the other way round
        added.update(_paths(new, prefix, field))
    else:
        modified.add(prefix)


def _paths(value: Any, prefix: Path, field: str) -> set[Path]:
    """The leaves and list elements of a whole value at `prefix` (one path for a scalar)."""
    out: dict[Path, Any] = {}
    _leaves(value, prefix, field, out)
    return set(out)


# --- the apply ------------------------------------------------------------------------------------------


@dataclass
class _Manager:
    entry: Obj  # the managedFields entry without fieldsV1
    fields: set[Path]

    @property
    def name(self) -> str:
        return str(self.entry.get("manager", ""))

    @property
    def applies(self) -> bool:
        return self.entry.get("operation") == "Apply"

    def printed(self) -> str:
        """internal/conflict.go printManager."""
        text = json.dumps(self.name)
        if self.entry.get("subresource"):
            text += f" with subresource {json.dumps(self.entry['subresource'])}"
        if self.entry.get("operation") == "Update":
            text += f" using {self.entry.get('apiVersion', '')}"
            if self.entry.get("time"):
                text += f" at {self.entry['time']}"
        return text


def _managers(obj: Obj | None) -> list[_Manager]:
    out = []
    for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
        fields = from_fields_v1(entry.get("fieldsV1") or {})
        out.append(_Manager({k: v for k, v in entry.items() if k != "fieldsV1"}, fields))
    return out


def check_request(config: Any, *, api_version: str, name: str, manager: str) -> Obj:
    """The checks of patch.go and fieldmanager before an apply: 400 (422 for PatchOptions) saying what is
    wrong."""
    if not manager:
        raise ApiError(
            422,
            "Invalid",
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            {
                "group": "meta.k8s.io",
                "kind": "PatchOptions",
                "causes": [
                    {
                        "reason": "FieldValueRequired",
                        "message": "Required value: is required for apply patch",
                        "field": "fieldManager",
                    }
                ],
            },
        )
    if not isinstance(config, dict):
        raise bad_request("error decoding YAML: the applied configuration is not an object")
    if config.get("apiVersion") != api_version:
        raise bad_request(
            "Incorrect version specified in apply patch. Specified patch version: "
            f"{config.get('apiVersion', '')}, expected: {api_version}"
        )
    meta = config.get("metadata") or {}
    if meta.get("managedFields") is not None:
        raise bad_request("metadata.managedFields must be nil")
    if meta.get("name") != name:
        raise bad_request(
            f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
        )
    return config


def apply(live: Obj | None, config: Obj, manager: str, *, force: bool, kind: str, now: str) -> Obj:
    """merge/update.go `Updater.Apply`: the object after `manager` applied `config` to `live` (None: an
    object to create), managedFields included. ApiError 409 on a conflict without `force`, 400 on a
    configuration whose lists cannot be merged."""
    base = live or {}
    try:
        if kind == "Pod":
            config = {k: v for k, v in config.items() if k != "status"}
        merged: Obj = merge(base, config)
        applied = set(field_values(config, kind))
        managers = _managers(live)
        mine = next((m for m in managers if m.applies and m.name == manager), None)
        others = [m for m in managers if m is not mine]
        # prune: what this manager applied last time and no longer applies, unless someone else owns it
        if mine is not None:
            owned = set().union(*(m.fields for m in others)) if others else set()
            gone = mine.fields - applied - owned
            merged = _remove(merged, gone) or {}
        before, after = field_values(base, kind), field_values(merged, kind)
    except ValueError as e:
        raise bad_request(f"failed to create typed patch object ({kind}): {e}") from None
    changed = {p for p, v in after.items() if p not in before or (v is not None and before[p] != v)}
    removed = set(before) - set(after)
    conflicts = [(m, p) for m in others for p in sorted(m.fields & changed)]
    if conflicts and not force:
        raise _conflict(conflicts, kind, (config.get("metadata") or {}).get("name", ""))
    kept = []
    for m in others:
        m.fields -= changed if force else set()
        m.fields -= removed
        if m.fields:
            kept.append(m)
    entry: Obj = {"manager": manager, "operation": "Apply", "apiVersion": config.get("apiVersion", "")}
    entry["time"] = mine.entry.get("time", now) if mine is not None and mine.fields == applied else now
    entry["fieldsType"] = "FieldsV1"
    result = [*kept, _Manager(entry, applied)] if applied else kept
    result.sort(key=lambda m: (str(m.entry.get("operation")), str(m.entry.get("time")), m.name))
    meta = merged.setdefault("metadata", {})
    meta["managedFields"] = [{**m.entry, "fieldsV1": to_fields_v1(m.fields)} for m in result]
    if not meta["managedFields"]:
        del meta["managedFields"]
    return merged


def _conflict(conflicts: list[tuple[_Manager, Path]], kind: str, name: str) -> ApiError:
    """internal/conflict.go NewConflictError: 409 Conflict with one cause per field."""
    causes = [
        {"type": "FieldManagerConflict", "message": f"conflict with {m.printed()}", "field": path_string(p)}
        for m, p in conflicts
    ]
    if len(conflicts) == 1:
        m, p = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {m.printed()}: {path_string(p)}"
    else:
        lines = []
        for printed in sorted({m.printed() for m, _ in conflicts}):
            lines.append(f"conflicts with {printed}:")
            lines += [f"- {path_string(p)}" for m, p in conflicts if m.printed() == printed]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, {"causes": causes})

"""A small Python `kustomize build` for the features sparkgate's manifests use, so the tests need no kubectl.

Supported: resources (files and directories holding a kustomization.yaml), namespace, labels (metadata
only, as `includeSelectors: false`), images (newName/newTag), configMapGenerator (files, with
disableNameSuffixHash: true; behavior create or replace, namespace) and patches (strategic merge from a
file, `$patch: delete` included, or JSON 6902 with a target).
Anything else in a kustomization is an error here, so the manifests cannot drift beyond what is tested.
Two loader rules of kustomize are enforced too: a file must lie within its kustomization's directory, and a
kustomization may not use a directory that contains it ("cycle detected": the base of an overlay cannot
be an ancestor of the overlay).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kubesim.strategic import strategic_merge
from sparkgate.json_patch import apply_patch

Obj = dict[str, Any]

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
    "patches",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition",
    "PriorityClass",
}


class KustomizeError(Exception):
    pass


def load_documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _within(directory: Path, name: str) -> Path:
    path = (directory / name).resolve()
    if not path.is_relative_to(directory.resolve()):
        raise KustomizeError(f"{directory}: {name} is not in or below the kustomization's directory")
    return path


def build(directory: Path, visited: tuple[Path, ...] = ()) -> list[Obj]:
    """The rendered objects of the kustomization in `directory`, in resource order."""
    directory = directory.resolve()
    for root in visited:
        if root.is_relative_to(directory):
            raise KustomizeError(f"cycle detected: candidate root {directory} contains visited root {root}")
    visited = (*visited, directory)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in kustomization.get("resources") or []:
        target = (directory / entry).resolve()
        objects += build(target, visited) if target.is_dir() else load_documents(_within(directory, entry))
    for generator in kustomization.get("configMapGenerator") or []:
        objects = _generate(objects, _config_map(directory, generator), generator.get("behavior", "create"))
    for patch in kustomization.get("patches") or []:
        objects = _patch(directory, objects, patch)
    if "namespace" in kustomization:
        _set_namespace(objects, kustomization["namespace"])
    for label in kustomization.get("labels") or []:
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise KustomizeError("labels: only includeSelectors/includeTemplates false are supported")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in kustomization.get("images") or []:
        _set_image(objects, image)
    return objects


def _config_map(directory: Path, generator: Obj) -> Obj:
    if not (generator.get("options") or {}).get("disableNameSuffixHash"):
        raise KustomizeError("configMapGenerator: only disableNameSuffixHash: true is supported")
    if set(generator) - {"name", "files", "options", "behavior", "namespace"}:
        raise KustomizeError(f"configMapGenerator: unsupported fields in {generator}")
    data = {Path(f).name: _within(directory, f).read_text() for f in generator["files"]}
    metadata = {"name": generator["name"]}
    if "namespace" in generator:
        metadata["namespace"] = generator["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _generate(objects: list[Obj], generated: Obj, behavior: str) -> list[Obj]:
    """kustomize's generator behaviours: `create` adds the object, `replace` swaps the one of the same
    name and namespace that a base made (an error when there is none)."""
    if behavior == "create":
        return [*objects, generated]
    if behavior != "replace":
        raise KustomizeError(f"configMapGenerator: behavior {behavior!r} is not supported")
    meta = generated["metadata"]
    hits = [
        i
        for i, o in enumerate(objects)
        if o["kind"] == "ConfigMap"
        and o["metadata"]["name"] == meta["name"]
        and o["metadata"].get("namespace") == meta.get("namespace")
    ]
    if len(hits) != 1:
        raise KustomizeError(f"configMapGenerator: nothing to replace for {meta}")
    objects = list(objects)
    objects[hits[0]] = {**generated, "metadata": {**objects[hits[0]]["metadata"], **meta}}
    return objects


def _matches(obj: Obj, target: Obj) -> bool:
    return all(
        obj.get("kind") == v if k == "kind" else obj.get("metadata", {}).get("name") == v
        for k, v in target.items()
        if k in ("kind", "name")
    ) and set(target) <= {"kind", "name", "group", "version"}


def _patch(directory: Path, objects: list[Obj], patch: Obj) -> list[Obj]:
    body = yaml.safe_load(_within(directory, patch["path"]).read_text())
    target = patch.get("target")
    if target is None:  # strategic merge, matched by kind and name
        name = body["metadata"]["name"]
        hits = [
            i for i, o in enumerate(objects) if o["kind"] == body["kind"] and o["metadata"]["name"] == name
        ]
        if len(hits) != 1:
            raise KustomizeError(f"patch {patch['path']}: {len(hits)} targets")
        if body.get("$patch") == "delete":
            return [o for i, o in enumerate(objects) if i != hits[0]]
        objects[hits[0]] = strategic_merge(objects[hits[0]], body)
        return objects
    hits = [i for i, o in enumerate(objects) if _matches(o, target)]
    if not hits:
        raise KustomizeError(f"patch {patch['path']}: no target {target}")
    for i in hits:
        objects[i] = apply_patch(objects[i], body)
    return objects


def _set_namespace(objects: list[Obj], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace


def _set_image(objects: list[Obj], image: Obj) -> None:
    for obj in objects:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if container.get("image", "").split(":")[0] == image["name"]:
                container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"


def by_kind(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}

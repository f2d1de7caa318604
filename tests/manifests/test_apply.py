"""Applying the install twice changes nothing the second time: the rendered manifests, the base alone and
with every component, are applied to kubesim with server-side apply as `kubectl apply --server-side` sends
it (a PATCH of each object with `application/apply-patch+yaml`, `fieldManager=kubectl`, `force=true`,
cluster-scoped objects at their cluster path), twice; kube-apiserver writes nothing for an apply that changes
nothing, so every object keeps its resourceVersion (kubesim/apply.py). A changed policy then changes that
ConfigMap alone.

kubesim serves only some of the install's kinds (not apps/v1, policy/v1, rbac or the CRDs of cert-manager
and Prometheus Operator): those are the objects applied here. That kustomize writes no namespace into a
cluster-scoped object, which is what made client-side `kubectl apply -k` report the admission policies
`configured` every time, is checked for every kind and combination in test_components.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubesim.cluster import Cluster
from kubesim.resources import RESOURCES
from sparkgate.kube import Kube

Obj = dict[str, Any]
APPLY = "application/apply-patch+yaml"


def path(obj: Obj) -> str:
    """The object's REST path, as kubectl maps it: cluster-scoped kinds without a namespace."""
    [r] = [r for r in RESOURCES.values() if r.kind == obj["kind"]]
    base = f"/api/{r.version}" if not r.group else f"/apis/{r.group}/{r.version}"
    where = f"/namespaces/{obj['metadata']['namespace']}" if r.namespaced else ""
    return f"{base}{where}/{r.plural}/{obj['metadata']['name']}"


def served(objects: list[Obj]) -> list[Obj]:
    kinds = {r.kind for r in RESOURCES.values()}
    return [o for o in objects if o["kind"] in kinds]


def apply_all(kube: Kube, objects: list[Obj]) -> dict[str, str]:
    """`kubectl apply --server-side --force-conflicts`: path → resourceVersion after the apply."""
    versions = {}
    for obj in objects:
        answer = kube.request(
            "PATCH",
            path(obj),
            query={"fieldManager": "kubectl", "force": "true"},
            body=json.dumps(obj),  # JSON is YAML: what kubectl sends with this content type
            content_type=APPLY,
        )
        versions[path(obj)] = answer["metadata"]["resourceVersion"]
    return versions


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    with Cluster(nodes=1, namespaces=("default", "kube-system"), workdir=tmp_path) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        yield kube
        kube.close()


@pytest.mark.parametrize("components", [(), "all"], ids=["base", "every-component"])
def test_a_second_apply_changes_nothing(
    kube: Kube, kustomize: ModuleType, components: tuple[str, ...] | str
) -> None:
    names = kustomize.COMPONENTS if components == "all" else components
    objects = served(kustomize.install(names))
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ConfigMap", "MutatingWebhookConfiguration"} <= kinds
    assert ("ValidatingAdmissionPolicy" in kinds) == (components == ())  # validating-webhook drops them
    first = apply_all(kube, objects)
    assert len(first) == len(objects)
    second = apply_all(kube, objects)
    assert second == first


def test_a_changed_policy_changes_its_config_map_alone(kube: Kube, kustomize: ModuleType) -> None:
    objects = served(kustomize.install())
    first = apply_all(kube, objects)
    [policy] = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "sparkgate-policy"
    ]
    policy["data"]["policy.yaml"] += "# reviewed\n"
    second = apply_all(kube, objects)
    changed = {p for p in first if first[p] != second[p]}
    assert changed == {path(policy)}

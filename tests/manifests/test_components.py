"""The optional parts of the install are kustomize Components that combine: every combination that
docs/install.md allows (any subset of manifests/components/, in the documented order) renders with the real
kustomize, and in each, every component's own change to the base install is there, whole, and no two
components change the same field or object. So applying one never undoes another (the overlays of old each
included the base, and applying one put the base's policy back over the example policy).

A component's change is what it does to the rendered base alone: the objects it adds or deletes, and each
field of a base object it sets (lists count as one field: a component that rewrote a list another one
changed would show up as two changes of one field). The combined install is checked against them: each
change holds, nothing else differs from the base, and no object comes from nowhere.

docs/install.md's combined install (its kustomization, as an admin writes it beside the repository's
manifests/) renders exactly as the same components combined here.
"""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

Obj = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name
REPO = Path(__file__).resolve().parents[2]
INSTALL_DOC = REPO / "docs" / "install.md"
DELETED = "<deleted>"
# The cluster-scoped kinds of the install (k8s.io/api: their types have no namespace). kustomize knows some
# of them as such, not the admission policies; the rest of the install must name its own namespace, now that
# the base has no kustomize `namespace:` (an object without one would land in kubectl's current namespace).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "PriorityClass",
    "ClusterIssuer",
}


def keyed(objects: list[Obj]) -> dict[Key, Obj]:
    found = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
    assert len(found) == len(objects), "two objects of one kind, namespace and name"
    return found


def leaves(value: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every field of an object by its path; a list is one field."""
    if isinstance(value, dict) and value:
        return {p: v for k, item in value.items() for p, v in leaves(item, (*path, str(k))).items()}
    return {path: value}


def changes(base: dict[Key, Obj], changed: dict[Key, Obj]) -> dict[tuple[Key, tuple[str, ...]], Any]:
    """(object, field) → value for every field `changed` sets differently from `base`; DELETED for an
    object it removed (field ()), and the fields a removed field leaves behind."""
    found: dict[tuple[Key, tuple[str, ...]], Any] = {}
    for key in base.keys() - changed.keys():
        found[(key, ())] = DELETED
    for key, obj in changed.items():
        before = leaves(base[key]) if key in base else {}
        after = leaves(obj)
        for path, value in after.items():
            if before.get(path, DELETED) != value:
                found[(key, path)] = value
        for path in before.keys() - after.keys():
            found[(key, path)] = DELETED
    return found


def combinations(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for n in range(2, len(names) + 1) for c in itertools.combinations(names, n)]


@pytest.fixture(scope="module")
def base(kustomize: ModuleType) -> dict[Key, Obj]:
    return keyed(kustomize.install())


@pytest.fixture(scope="module")
def alone(kustomize: ModuleType, base: dict[Key, Obj]) -> dict[str, dict[tuple[Key, tuple[str, ...]], Any]]:
    """Each component's change to the base, on its own."""
    return {name: changes(base, keyed(kustomize.install([name]))) for name in kustomize.COMPONENTS}


def test_each_component_changes_the_base(alone: dict[str, dict[tuple[Key, tuple[str, ...]], Any]]) -> None:
    for name, change in alone.items():
        assert change, f"{name} changes nothing"
    touched = {name: {key for key, _ in change} for name, change in alone.items()}
    # What each is for, so that an empty or misplaced component cannot pass.
    assert ("ConfigMap", "sparkgate-system", "sparkgate-policy") in touched["example-policy"]
    assert ("Deployment", "sparkgate-system", "sparkgate-scheduler") in touched["scheduler"]
    assert ("ServiceMonitor", "sparkgate-system", "sparkgate") in touched["prometheus-operator"]
    assert ("ValidatingWebhookConfiguration", "", "sparkgate") in touched["validating-webhook"]
    assert ("Certificate", "sparkgate-system", "sparkgate-webhook") in touched["cert-manager"]


def test_every_combination_keeps_each_components_change_and_nothing_replaces_another(
    kustomize: ModuleType,
    base: dict[Key, Obj],
    alone: dict[str, dict[tuple[Key, tuple[str, ...]], Any]],
) -> None:
    checked = 0
    for combination in combinations(kustomize.COMPONENTS):
        combined = keyed(kustomize.install(combination))
        expected: dict[tuple[Key, tuple[str, ...]], Any] = {}
        for name in combination:
            overlap = expected.keys() & alone[name].keys()
            assert not overlap, f"{combination}: {name} changes what another component changes: {overlap}"
            expected.update(alone[name])
        found = changes(base, combined)
        missing = {k: v for k, v in expected.items() if found.get(k, _absent(base, k)) != v}
        assert not missing, f"{combination}: lost {missing}"
        extra = {k: v for k, v in found.items() if k not in expected and not _injected(k, combination)}
        assert not extra, f"{combination}: changes no component makes alone: {extra}"
        checked += 1
    assert checked == 2 ** len(kustomize.COMPONENTS) - len(kustomize.COMPONENTS) - 1


def _absent(base: dict[Key, Obj], change: tuple[Key, tuple[str, ...]]) -> Any:
    key, path = change
    return leaves(base[key]).get(path, DELETED) if key in base else DELETED


def _injected(change: tuple[Key, tuple[str, ...]], combination: tuple[str, ...]) -> bool:
    """The one change made by two components together, by design: cert-manager's caBundle injection into
    the validating webhook configuration that validating-webhook adds (cert-manager comes after it)."""
    key, path = change
    return (
        {"cert-manager", "validating-webhook"} <= set(combination)
        and key == ("ValidatingWebhookConfiguration", "", "sparkgate")
        and path == ("metadata", "annotations", "cert-manager.io/inject-ca-from")
    )


def test_no_cluster_scoped_object_has_a_namespace_and_every_other_names_its_own(
    kustomize: ModuleType,
) -> None:
    """In every combination: a namespace in a cluster-scoped object is dropped by the API server, so that
    `kubectl apply -k` reported the admission policies `configured` at every apply."""
    names = kustomize.COMPONENTS
    for combination in [c for n in range(len(names) + 1) for c in itertools.combinations(names, n)]:
        for obj in kustomize.install(combination):
            namespace = obj["metadata"].get("namespace")
            where = f"{combination}: {obj['kind']} {obj['metadata']['name']}"
            if obj["kind"] in CLUSTER_SCOPED:
                assert namespace is None, where
            else:
                assert namespace in ("sparkgate-system", "kube-system"), where


def test_every_object_of_every_component_carries_the_base_labels(kustomize: ModuleType) -> None:
    """`kubectl get ... -l app.kubernetes.io/part-of=sparkgate` finds what a component added too (the
    validating webhook configuration, the scheduler, the ServiceMonitors, the Certificates): each
    component repeats the base's `labels`."""
    wanted = {"app.kubernetes.io/name": "sparkgate", "app.kubernetes.io/part-of": "sparkgate"}
    for component in kustomize.COMPONENTS:
        for obj in kustomize.install([component]):
            labels = obj["metadata"].get("labels") or {}
            assert wanted.items() <= labels.items(), f"{component}: {obj['kind']} {obj['metadata']['name']}"


def test_every_deployment_survives_a_node_drain(kustomize: ModuleType) -> None:
    """Each Deployment of the install and its components (the allocator and webhook, the scheduler) runs
    more than one replica, spread over the nodes, with a PodDisruptionBudget that keeps one: a drain or an
    upgrade of the nodes never takes every replica at once."""
    objects = keyed(kustomize.install(list(kustomize.COMPONENTS)))
    budgets = [o for (kind, _, _), o in objects.items() if kind == "PodDisruptionBudget"]
    deployments = [o for (kind, _, _), o in objects.items() if kind == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"sparkgate", "sparkgate-scheduler"}
    for deployment in deployments:
        name, spec = deployment["metadata"]["name"], deployment["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["replicas"] > 1, name
        spread = spec["template"]["spec"]["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname"], name
        assert spread[0]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"], name
        selecting = [
            b
            for b in budgets
            if b["metadata"]["namespace"] == deployment["metadata"]["namespace"]
            and b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert [b["spec"]["minAvailable"] for b in selecting] == [1], name
        assert selecting[0]["spec"]["selector"] == spec["selector"], f"{name}: the budget selects other pods"


def documented_kustomization() -> str:
    text = INSTALL_DOC.read_text()
    match = re.search(r"^```yaml\n(# my-sparkgate/kustomization\.yaml\n.*?)^```", text, flags=re.M | re.S)
    assert match, "docs/install.md shows no my-sparkgate/kustomization.yaml"
    return match.group(1)


def test_the_documented_combined_install_renders_as_its_components(
    kustomize: ModuleType, tmp_path: Path
) -> None:
    """Written where the document says (my-sparkgate/ beside manifests/), rendered by kubectl."""
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    (tmp_path / "my-sparkgate").mkdir()
    text = documented_kustomization()
    (tmp_path / "my-sparkgate" / "kustomization.yaml").write_text(text)
    document = yaml.safe_load(text)
    assert document["resources"] == ["../manifests/base"]
    names = [c.removeprefix("../manifests/components/") for c in document["components"]]
    assert len(names) >= 2 and names == [c for c in kustomize.COMPONENTS if c in names]
    assert keyed(kustomize.build(tmp_path / "my-sparkgate")) == keyed(kustomize.install(names))


def test_the_documented_components_are_those_of_the_manifests_in_their_order(kustomize: ModuleType) -> None:
    text = INSTALL_DOC.read_text()
    listed = re.findall(r"^\| `components/([a-z-]+)` \|", text, flags=re.M)
    assert tuple(listed) == kustomize.COMPONENTS

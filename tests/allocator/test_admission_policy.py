"""The admission-policy mode's writer (allocator/admission_policy.py) on kubesim over HTTP: the rendered
MutatingAdmissionPolicy and binding are applied (server-side apply, the allocator's field manager), a second
apply of the same policy writes nothing, a policy edit reaches the next executor pod with no restart, and a
policy that cannot be rendered leaves the objects in force as they were."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from allocator.admission_policy import FIELD_MANAGER, AdmissionPolicySync
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource
from sparkgate.render import POLICY_NAME, RenderError

POLICY = """apiVersion: sparkgate.io/v1alpha1
kind: Policy
profiles:
  - name: batch
    match: {{namespaces: [spark]}}
    labels: {{tier: {tier}}}
"""
MAP = f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/{POLICY_NAME}"
BINDING = f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/{POLICY_NAME}"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Setup:
    cluster: Cluster
    clock: Clock
    path: Path
    kube: Kube
    sync: AdmissionPolicySync


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    """kubesim with a namespace `spark`, a policy file, and the task as the allocator's user."""
    with Cluster(nodes=1) as cluster:
        cluster.add_namespace("spark")
        clock = Clock()
        path = tmp_path / "policy.yaml"
        write(path, "one", clock)
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        source = PolicySource(str(path), contract.INSTALL_NAMESPACE, clock=clock)
        try:
            yield Setup(cluster, clock, path, kube, AdmissionPolicySync(kube, source, monotonic=clock))
        finally:
            kube.close()


def write(path: Path, tier: str, clock: Clock) -> None:
    path.write_text(POLICY.format(tier=tier))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a new mtime even within one tick
    clock.now += 10  # past the source's check interval


def executor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"spark-role": "executor", "spark-app-selector": "spark-1", "spark-exec-id": "1"},
        },
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4.3.0"}]},
    }


def test_the_rendered_policy_follows_the_policy_file_and_shapes_the_next_pod(setup: Setup) -> None:
    kube, sync, clock = setup.kube, setup.sync, setup.clock
    api = config.new_client_from_config(str(setup.cluster.add_user("admin", ["system:masters"])))
    core = client.CoreV1Api(api)
    try:
        assert sync.due()
        applied = sync.run_once()
        assert [o["kind"] for o in applied] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
        assert not sync.due()

        pod = core.create_namespaced_pod("spark", executor("exec-1")).to_dict()
        assert pod["metadata"]["labels"]["tier"] == "one"
        assert pod["metadata"]["annotations"][contract.ANNOTATION_PROFILE] == "batch"
        assert [g["name"] for g in pod["spec"]["scheduling_gates"]] == [contract.GATE]

        clock.now += sync.interval  # the periodic re-apply: the first one takes the fields over by apply,
        sync.run_if_due()
        version = kube.get(MAP)["metadata"]["resourceVersion"]
        clock.now += sync.interval  # and then an apply of the same policy writes nothing
        sync.run_if_due()
        assert kube.get(MAP)["metadata"]["resourceVersion"] == version

        write(setup.path, "two", clock)  # the ConfigMap changed: applied at the next poll, no restart
        sync.run_if_due()
        edited = kube.get(MAP)
        assert edited["metadata"]["resourceVersion"] != version
        assert [(m["manager"], m["operation"]) for m in edited["metadata"]["managedFields"]] == [
            (FIELD_MANAGER, "Apply")
        ]
        pod = core.create_namespaced_pod("spark", executor("exec-2")).to_dict()
        assert pod["metadata"]["labels"]["tier"] == "two"
        assert kube.get(BINDING)["spec"]["policyName"] == POLICY_NAME
    finally:
        api.close()


def test_a_policy_that_cannot_be_rendered_leaves_the_objects_in_force(setup: Setup) -> None:
    setup.sync.run_once()
    before = setup.kube.get(MAP)
    setup.path.write_text(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n  - name: p\n    template:\n"
        "      spec:\n        containers:\n          - {name: spark-kubernetes-executor, image: x}\n"
        "    overrides: [spec.containers]\n"
    )
    setup.clock.now += 10
    with pytest.raises(RenderError, match="replaces Spark's own container"):
        setup.sync.run_if_due()
    assert setup.kube.get(MAP) == before
    assert not setup.sync.due()  # tried again at the interval, not at every poll


def test_created_by_apply_a_field_the_next_version_stops_rendering_is_pruned(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the objects were created by POST, whose `Update` entry (kubesim records it as kube-apiserver
    does: kubesim/apply.py `update`) co-owned every field, so a field a later version of sparkgate stopped
    rendering stayed for good. Created by apply, the allocator's Apply entry is their only manager, and the
    next apply prunes it."""
    import allocator.admission_policy as task

    rendered = task.render

    def older_version(*args: Any) -> Any:  # a rendering with one more label than this version's
        result = rendered(*args)
        result.objects[0]["metadata"]["labels"]["sparkgate.io/retired"] = "yes"
        return result

    monkeypatch.setattr(task, "render", older_version)
    setup.sync.run_once()
    assert setup.kube.get(MAP)["metadata"]["labels"]["sparkgate.io/retired"] == "yes"
    monkeypatch.setattr(task, "render", rendered)
    setup.sync.run_once()
    stored = setup.kube.get(MAP)
    assert "sparkgate.io/retired" not in stored["metadata"]["labels"]
    for obj in (stored, setup.kube.get(BINDING)):
        assert [(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]] == [
            (FIELD_MANAGER, "Apply")
        ]
    assert {e.verb for e in setup.cluster.requests.entries() if e.user == contract.ALLOCATOR_USER} == {
        "patch",
        "get",  # the test's own reads
    }

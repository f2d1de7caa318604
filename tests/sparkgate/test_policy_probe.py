"""`sparkgate policy check --cluster` and the probe behind it, on kubesim's admission chain.

kubesim copies kube-apiserver's built-in pod plugins and their messages (kubesim/podplugins.py,
kubesim/podsecurity.py): the Priority plugin's `no PriorityClass with name NAME was found` and `the integer
value of priority (0) must not be provided in pod spec; ...` (plugin/pkg/admission/priority/admission.go),
PodSecurity's `violates PodSecurity "restricted:latest": ...` (pod-security-admission). A dry run
(`dryRun=All`) runs the whole chain and stores nothing (real-cluster-facts.md, "The admission chain").
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.kube import Kube, KubeError
from sparkgate.mutation import mutate
from sparkgate.policy import load_policy
from sparkgate.probe import Verdict, captured_executor_pod, probe, probe_name, spark_pod, targets

Obj = dict[str, Any]
HARDENED = """
        securityContext:
          runAsNonRoot: true
          runAsUser: 185
          seccompProfile: {type: RuntimeDefault}
        containers:
          - name: spark-kubernetes-executor
            securityContext:
              allowPrivilegeEscalation: false
              capabilities: {drop: [ALL]}"""
POLICY = f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
excludedNamespaces: [legacy]
profiles:
  - name: batch
    match: {{namespaces: [spark-a], labels: {{team: batch}}}}
    template:
      spec:
        priorityClassName: spark-batch
        runtimeClassName: gvisor
        serviceAccountName: spark-exec
    overrides: [spec.serviceAccountName]
  - name: broken
    match: {{namespaces: [spark-b]}}
    template:
      spec:
        priorityClassName: no-such-class
  - name: hardened
    match: {{namespaces: [locked]}}
    template:
      spec:{HARDENED}
  - name: leaky
    match: {{namespaces: [locked]}}
    template:
      spec:{HARDENED}
          - name: log-shipper
            image: fluent-bit:3
"""


def refusal(name: str, why: str) -> str:
    return f'pods "{name}" is forbidden: {why}'


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "legacy")) as c:
        for namespace in ("spark-a", "spark-b"):
            c.add_namespace(namespace)
        c.add_namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
        c.add_priority_class("spark-batch", 1000)
        c.add_runtime_class("gvisor", "runsc", overhead={"cpu": "250m", "memory": "120Mi"})
        c.add_service_account("spark-a", "spark-exec")
        yield c


@pytest.fixture(scope="module")
def kube(cluster: Cluster) -> Iterator[Kube]:
    client = Kube.from_kubeconfig(str(cluster.kubeconfig()))
    yield client
    client.close()


def test_the_shipped_executor_pod_is_the_captured_one(reviews: dict[str, Obj]) -> None:
    assert captured_executor_pod() == reviews["adhoc-query-exec-1"]["request"]["object"]


def test_the_probe_pod_is_sparks_pod_matching_the_profile() -> None:
    policy = load_policy(POLICY)
    pod = spark_pod(policy.profiles[0], "spark-a")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == spec["hostname"] == "sparkgate-probe-batch" and meta["namespace"] == "spark-a"
    assert "managedFields" not in meta and "status" not in pod
    assert meta["labels"]["team"] == "batch" and contract.is_executor(meta["labels"])
    assert policy.profile_for("spark-a", meta["labels"], meta["annotations"]) is policy.profiles[0]
    for derived in ("priority", "preemptionPolicy", "serviceAccount", "tolerations"):
        assert not spec.get(derived), derived
    assert probe_name("x" * 63) == ("sparkgate-probe-" + "x" * 63)[:63]


def test_targets_are_every_matched_namespace_never_an_excluded_one(kube: Kube) -> None:
    policy = load_policy(POLICY + "  - name: everywhere\n")
    pairs = {(p.name, ns) for p, ns in targets(kube, policy)}
    assert {ns for name, ns in pairs if name == "everywhere"} == {"default", "spark-a", "spark-b", "locked"}
    assert ("batch", "spark-a") in pairs and ("batch", "spark-b") not in pairs
    assert {(p.name, ns) for p, ns in targets(kube, policy, ["spark-b", "legacy"])} == {
        ("broken", "spark-b"),
        ("everywhere", "spark-b"),
    }


def test_a_profile_naming_existing_classes_and_account_is_admitted_and_nothing_is_stored(
    cluster: Cluster, kube: Kube
) -> None:
    policy = load_policy(POLICY)
    before = len(cluster.store.list_objects("pods")[0])
    assert probe(kube, policy, policy.profiles[0], "spark-a").verdict is Verdict.ADMITTED
    assert len(cluster.store.list_objects("pods")[0]) == before


def test_check_cluster_names_profile_namespace_and_the_servers_message(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything of sparkgate is installed: the profile is applied as the webhook would."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    code = main(["policy", "check", str(path), "--cluster", "--kubeconfig", str(cluster.kubeconfig())])
    out = capsys.readouterr().out
    lines = [
        line.strip() for line in out.splitlines() if line.strip().startswith("profile ") and " in " in line
    ]
    assert code == 1
    assert lines == [
        "profile batch in namespace spark-a: admitted",
        "profile broken in namespace spark-b: refused: "
        + refusal("sparkgate-probe-broken", "no PriorityClass with name no-such-class was found"),
        "profile hardened in namespace locked: admitted",
        "profile leaky in namespace locked: refused: "
        + refusal(
            "sparkgate-probe-leaky",
            'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container '
            '"log-shipper" must set securityContext.allowPrivilegeEscalation=false), unrestricted '
            'capabilities (container "log-shipper" must set securityContext.capabilities.drop=["ALL"])',
        ),
    ]
    only_batch = tmp_path / "batch.yaml"
    only_batch.write_text(POLICY.split("  - name: broken")[0])
    assert (
        main(["policy", "check", str(only_batch), "--cluster", "--kubeconfig", str(cluster.kubeconfig())])
        == 0
    )


def test_the_webhooks_patch_is_admitted_with_the_class_priority_and_a_kept_priority_is_refused(
    cluster: Cluster, kube: Kube, reviews: dict[str, Obj]
) -> None:
    """Every captured pod, patched by the webhook for a profile naming a class: admitted with the class's
    value. The same patch keeping `priority: 0` is what the real server refused (issue 12)."""
    policy = load_policy(POLICY)
    for name, review in reviews.items():
        pod = copy.deepcopy(review["request"]["object"])
        pod["metadata"] = {
            **pod["metadata"],
            "namespace": "spark-a",
            "labels": {**pod["metadata"]["labels"], "team": "batch"},
        }
        pod["metadata"].pop("ownerReferences", None)
        pod["metadata"].pop("managedFields", None)
        ops = mutate({**review["request"], "namespace": "spark-a", "object": pod}, policy).ops
        patched = jsonpatch.apply_patch(pod, ops)
        created = kube.request(
            "POST", "/api/v1/namespaces/spark-a/pods", query={"dryRun": "All"}, body=patched
        )
        assert created["spec"]["priority"] == 1000, name
        assert created["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
        assert created["spec"]["overhead"] == {"cpu": "250m", "memory": "120Mi"}
        assert created["spec"]["serviceAccountName"] == "spark-exec"
        kept = {**patched, "spec": {**patched["spec"], "priority": 0}}
        with pytest.raises(KubeError) as refused:
            kube.request("POST", "/api/v1/namespaces/spark-a/pods", query={"dryRun": "All"}, body=kept)
        assert refused.value.status == 403
        assert refused.value.message == refusal(
            pod["metadata"]["name"],
            "the integer value of priority (0) must not be provided in pod spec; priority admission "
            "controller computed 1000 from the given PriorityClass name",
        )

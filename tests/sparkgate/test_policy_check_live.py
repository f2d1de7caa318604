"""`sparkgate policy check --cluster` judges the candidate policy, not the live webhook's (issue 20).

The real `sparkgate webhook` runs the old policy on kubesim, registered as manifests/base/webhooks.yaml
registers it (sandbox/localsystem.py), with its matchCondition on `request.dryRun` and the probe's label.
kubesim evaluates matchConditions with CEL as kube-apiserver does (kubesim/admission.py;
k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go), with a `request` whose `dryRun`
is always set (k8s.io/apiserver/pkg/admission/plugin/cel/filter.go, CreateAdmissionRequest). The candidate adds, renames and removes
profiles: the added one is reported admitted before it is applied, and every difference from what the live
webhook does is reported as information, not failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook
from sandbox.localsystem import webhook_configurations
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.kube import Kube
from sparkgate.policy import load_policy
from sparkgate.probe import MATCH_CONDITION, PROBE_LABEL, spark_pod
from sparkgate.render import render

LIVE = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
profiles:
  - name: default
    match: {namespaces: [spark-a, spark-b]}
    template:
      spec:
        priorityClassName: spark-batch
  - name: legacy
    match: {namespaces: [spark-c]}
"""
CANDIDATE = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
profiles:
  - name: analytics
    match: {namespaces: [spark-a], labels: {team: analytics}}
    template:
      spec:
        runtimeClassName: gvisor
  - name: standard
    match: {namespaces: [spark-a, spark-b]}
    template:
      spec:
        priorityClassName: spark-batch
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[str, Any]]]:
    workdir = tmp_path_factory.mktemp("live")
    policy = workdir / "live.yaml"
    policy.write_text(LIVE)
    with (
        Cluster(nodes=1) as cluster,
        LocalWebhook(policy, workdir / "webhook", allocator_users=(contract.ALLOCATOR_USER,)) as webhook,
    ):
        for namespace in ("spark-a", "spark-b", "spark-c"):
            cluster.add_namespace(namespace)
        cluster.add_priority_class("spark-batch", 1000)
        cluster.add_runtime_class("gvisor", "runsc", overhead={"cpu": "250m", "memory": "120Mi"})
        mutating, _ = webhook_configurations(webhook.url, webhook.ca_pem)
        cluster.store.create("mutatingwebhookconfigurations", mutating)
        yield cluster, mutating


def check(cluster: Cluster, path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["policy", "check", str(path), "--cluster", "--kubeconfig", str(cluster.kubeconfig())])
    out = capsys.readouterr().out
    lines = out.split("(nothing is stored):\n", 1)[1].splitlines()
    return code, [line.rstrip() for line in lines]


def test_a_candidate_that_adds_renames_and_removes_profiles_is_judged_before_it_is_applied(
    live: tuple[Cluster, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, _ = live
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(CANDIDATE)
    code, lines = check(cluster, candidate, capsys)
    assert lines == [
        "  profile analytics in namespace spark-a: admitted",
        "    live policy differs: the live webhook applies profile default, with other "
        "spec.priorityClassName, spec.runtimeClassName; admitted",
        "  profile standard in namespace spark-a: admitted",
        "    live policy differs: the live webhook applies profile default; admitted",
        "  profile standard in namespace spark-b: admitted",
        "    live policy differs: the live webhook applies profile default; admitted",
        f"the live webhook's policy differs from {candidate} in 3 of 3 (information)",
    ]
    assert code == 0, "a live policy that differs is information, not failure"
    assert not cluster.store.list_objects("pods")[0], "dry runs store nothing"
    # The live policy itself: nothing differs.
    same = tmp_path / "live.yaml"
    same.write_text(LIVE)
    code, lines = check(cluster, same, capsys)
    assert code == 0 and lines == [
        "  profile default in namespace spark-a: admitted",
        "  profile default in namespace spark-b: admitted",
        "  profile legacy in namespace spark-c: admitted",
    ]


def test_a_live_webhook_without_the_match_condition_is_named_and_judges_nothing(
    live: tuple[Cluster, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An install older than the matchCondition shapes the probe's pod with its own policy: the check says
    so instead of reporting the live policy's verdict as the candidate's."""
    cluster, mutating = live
    [webhook] = mutating["webhooks"]
    old = {**mutating, "webhooks": [{k: v for k, v in webhook.items() if k != "matchConditions"}]}
    cluster.store.replace("mutatingwebhookconfigurations", None, "sparkgate", old)
    try:
        candidate = tmp_path / "candidate.yaml"
        candidate.write_text(CANDIDATE)
        code, lines = check(cluster, candidate, capsys)
    finally:
        current = cluster.store.get("mutatingwebhookconfigurations", None, "sparkgate")
        restored = {**mutating, "metadata": current["metadata"]}
        cluster.store.replace("mutatingwebhookconfigurations", None, "sparkgate", restored)
    assert code == 1
    assert lines[0] == (
        "  profile analytics in namespace spark-a: error: the live sparkgate webhook shaped the probe's pod "
        f"(profile default): its configuration lacks the matchCondition {MATCH_CONDITION['name']} that keeps "
        "it out of the probe's dry runs (install the manifests of this version)"
    )


def test_the_probe_label_lets_no_stored_pod_past_the_webhook(live: tuple[Cluster, dict[str, Any]]) -> None:
    """The matchCondition skips dry runs only: a pod that carries the label and is stored is gated."""
    cluster, _ = live
    pod = spark_pod(load_policy(LIVE).profiles[0], "spark-b")
    assert pod["metadata"]["labels"][PROBE_LABEL] == "true"
    kube = Kube.from_kubeconfig(str(cluster.add_user("someone")))
    try:
        stored = kube.create("/api/v1/namespaces/spark-b/pods", pod)
    finally:
        kube.close()
    gates = [g["name"] for g in stored["spec"].get("schedulingGates") or []]
    assert contract.GATE in gates
    assert stored["metadata"]["annotations"][contract.ANNOTATION_PROFILE] == "default"
    cluster.store.delete("pods", "spark-b", stored["metadata"]["name"], grace_period_seconds=0)


def test_in_the_admission_policy_mode_the_candidate_is_judged_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No webhook: the live policy is the MutatingAdmissionPolicy rendered from LIVE (kubesim runs it as
    kube-apiserver 1.36 does, kubesim/mutating_policy.py). The rendered policy's mutations are guarded by the
    probe's matchCondition too, so the candidate's dry runs are not shaped again by the live policy: the
    added profile is judged admitted before it is applied."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(CANDIDATE)
    rendered = render(load_policy(LIVE))
    guard = f" && {MATCH_CONDITION['expression']}) ? "
    assert all(guard in m["jsonPatch"]["expression"] for m in rendered.objects[0]["spec"]["mutations"])
    with Cluster(nodes=1) as cluster:
        for namespace in ("spark-a", "spark-b", "spark-c"):
            cluster.add_namespace(namespace)
        cluster.add_priority_class("spark-batch", 1000)
        cluster.add_runtime_class("gvisor", "runsc", overhead={"cpu": "250m", "memory": "120Mi"})
        policy, binding = rendered.objects
        cluster.store.create("mutatingadmissionpolicies", policy)
        cluster.store.create("mutatingadmissionpolicybindings", binding)
        code, lines = check(cluster, candidate, capsys)
    judged = [line for line in lines if line.startswith("  profile ")]
    assert judged == [
        "  profile analytics in namespace spark-a: admitted",
        "  profile standard in namespace spark-a: admitted",
        "  profile standard in namespace spark-b: admitted",
    ]
    assert any("live policy differs" in line and "profile default" in line for line in lines), lines
    assert code == 0


def test_the_dry_runs_can_be_made_as_another_user(
    live: tuple[Cluster, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--as`/`--as-group`, as kubectl's: every request of the check (the namespaces listed, each dry-run pod
    created) is made as the user impersonated (a namespace's Spark service account here) with the groups
    given (an admission policy that refuses that account's pods outside the group sees it), and the verdicts
    are the same as the admin's own. Without --cluster the flags are refused (they would do nothing)."""
    cluster, _ = live
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(CANDIDATE)
    config = str(cluster.kubeconfig("admin"))
    spark = "system:serviceaccount:spark-a:spark"
    cluster.store.create(
        "validatingadmissionpolicies",
        {
            "metadata": {"name": "spark-users"},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "spark", "expression": f"request.userInfo.username == '{spark}'"}
                ],
                "validations": [{"expression": "'spark-users' in request.userInfo.groups"}],
            },
        },
    )
    cluster.store.create(
        "validatingadmissionpolicybindings",
        {
            "metadata": {"name": "spark-users"},
            "spec": {"policyName": "spark-users", "validationActions": ["Deny"]},
        },
    )
    runs = []
    try:
        for act_as in ([], ["--as", spark, "--as-group", "spark-users"]):
            before = len(cluster.requests.entries())
            code = main(["policy", "check", str(candidate), "--cluster", "--kubeconfig", config, *act_as])
            requests = [e for e in cluster.requests.entries()[before:] if e.user == "admin"]
            runs.append((code, capsys.readouterr().out, [(e.verb, e.resource) for e in requests]))
            impersonated = {e.impersonated for e in requests}
    finally:
        cluster.store.delete("validatingadmissionpolicybindings", None, "spark-users")
        cluster.store.delete("validatingadmissionpolicies", None, "spark-users")
    (code, out, requests), (code_as, out_as, requests_as) = runs
    assert code == code_as == 0 and out == out_as and requests == requests_as
    assert ("create", "pods") in requests_as and impersonated == {spark}
    assert main(["policy", "check", str(candidate), "--as", spark]) == 2
    assert "add --cluster" in capsys.readouterr().err

"""`sparkgate release`, the admin's break-glass path, against kubesim over HTTP with the install's own gate
protection (manifests/base/gate-policy.yaml, evaluated by kubesim with the requesting user's groups as
kube-apiserver does): a member of `sparkgate:break-glass` releases what they choose, a cluster admin who is
not a member (system:masters) is refused as any user is, and a dry run stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.cli import main

REPO = Path(__file__).resolve().parents[2]
GATE_POLICY = REPO / "manifests" / "base" / "gate-policy.yaml"


def executor(namespace: str, app: str, exec_id: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{app}-exec-{exec_id}",
            "namespace": namespace,
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
            },
        },
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
            "schedulingGates": [{"name": "example.com/other"}, {"name": contract.GATE}],
        },
    }


def install_gate_policy(cluster: Cluster) -> None:
    """The install's ValidatingAdmissionPolicies and bindings, as the manifest has them."""
    documents = [d for d in yaml.safe_load_all(GATE_POLICY.read_text()) if d]
    for kind, resource in (
        ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
    ):
        for document in documents:
            if document["kind"] == kind:
                cluster.store.create(resource, document)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(nodes=1, namespaces=("default", "spark-a", "spark-b"), workdir=tmp_path) as cluster:
        install_gate_policy(cluster)
        for namespace, app, exec_id in (
            ("spark-a", "app-1", 1),
            ("spark-a", "app-1", 2),
            ("spark-a", "app-2", 1),
            ("spark-b", "app-3", 1),
        ):
            cluster.store.create("pods", executor(namespace, app, exec_id), namespace=namespace)
        yield cluster


def gates(cluster: Cluster) -> dict[str, list[str]]:
    pods, _, _ = cluster.store.list_objects("pods")
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": [
            g["name"] for g in p["spec"].get("schedulingGates") or []
        ]
        for p in pods
    }


GATED = ["example.com/other", contract.GATE]
OTHER_ONLY = ["example.com/other"]


def test_a_break_glass_admin_releases_a_held_app_and_a_user_without_the_group_is_refused(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    assert main(["release", "--kubeconfig", str(admin), "-n", "spark-a", "--app", "app-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "released spark-a/app-1-exec-1 (app app-1)",
        "released spark-a/app-1-exec-2 (app app-1)",
        "released 2 executor pod(s)",
    ]
    assert gates(cluster) == {
        "spark-a/app-1-exec-1": OTHER_ONLY,  # only sparkgate's gate went
        "spark-a/app-1-exec-2": OTHER_ONLY,
        "spark-a/app-2-exec-1": GATED,
        "spark-b/app-3-exec-1": GATED,
    }

    # A cluster admin (system:masters) without the group is refused like any user, with the policy's message.
    masters = cluster.kubeconfig("admin")
    assert main(["release", "--kubeconfig", str(masters), "-n", "spark-a", "--app", "app-2"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["released 0 executor pod(s); 1 refused"]
    assert captured.err.startswith(
        'refused spark-a/app-2-exec-1: pods "app-2-exec-1" is forbidden: ValidatingAdmissionPolicy '
        "'sparkgate-gate' with binding 'sparkgate-gate' denied request: sparkgate: only the sparkgate "
        "allocator (system:serviceaccount:sparkgate-system:sparkgate-allocator) and members of the group "
        "sparkgate:break-glass may remove the scheduling gate sparkgate.io/allocator."
    )
    assert gates(cluster)["spark-a/app-2-exec-1"] == GATED


def test_a_dry_run_is_checked_by_the_api_server_and_stores_nothing(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    before = gates(cluster)
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    assert main(["release", "--kubeconfig", str(admin), "-A", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "would release spark-a/app-1-exec-1 (app app-1)",
        "would release spark-a/app-1-exec-2 (app app-1)",
        "would release spark-a/app-2-exec-1 (app app-2)",
        "would release spark-b/app-3-exec-1 (app app-3)",
        "would release 4 executor pod(s) (dry run: the API server admitted each patch and stored nothing)",
    ]
    assert gates(cluster) == before
    user = cluster.add_user("jane@example.com")
    assert main(["release", "--kubeconfig", str(user), "-n", "spark-b", "--dry-run"]) == 1
    assert "denied request: sparkgate: only the sparkgate allocator" in capsys.readouterr().err
    assert gates(cluster) == before


def test_one_pod_by_name_and_a_second_release_finds_nothing_to_do(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    monkeypatch.setenv("KUBECONFIG", str(admin))  # as kubectl: $KUBECONFIG when no --kubeconfig
    assert main(["release", "-n", "spark-b", "--pod", "app-3-exec-1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "released spark-b/app-3-exec-1 (app app-3)",
        "released 1 executor pod(s)",
    ]
    assert main(["release", "-n", "spark-b", "--pod", "app-3-exec-1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "spark-b/app-3-exec-1: not gated, nothing to release",
        "released 0 executor pod(s)",
    ]
    assert main(["release", "-n", "spark-b"]) == 0
    assert capsys.readouterr().out.splitlines() == ["released 0 executor pod(s)"]
    assert gates(cluster)["spark-b/app-3-exec-1"] == OTHER_ONLY
    assert gates(cluster)["spark-a/app-1-exec-1"] == GATED


def test_a_pod_needs_its_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release", "-A", "--pod", "x"]) == 2
    assert capsys.readouterr().err == "sparkgate release: --pod needs -n/--namespace\n"


def test_groups_to_act_as_need_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    """kube-apiserver answers Impersonate-Group without Impersonate-User with a 500 (impersonation.go):
    the command says what is missing instead, before any request (and before reading any credentials)."""
    assert main(["release", "-A", "--as-group", contract.BREAK_GLASS_GROUP]) == 2
    assert "need a user to act as (--as, or its as)" in capsys.readouterr().err


def test_a_named_pod_that_is_gone_is_skipped_and_the_others_are_released(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    argv = ["release", "--kubeconfig", str(admin), "-n", "spark-a"]
    pods = ["--pod", "app-1-exec-1", "--pod", "app-1-exec-9", "--pod", "app-2-exec-1"]
    assert main([*argv, *pods]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "released spark-a/app-1-exec-1 (app app-1)",
        "spark-a/app-1-exec-9: gone, nothing to release",
        "released spark-a/app-2-exec-1 (app app-2)",
        "released 2 executor pod(s)",
    ]
    assert captured.err == ""
    assert gates(cluster) == {
        "spark-a/app-1-exec-1": OTHER_ONLY,
        "spark-a/app-1-exec-2": GATED,
        "spark-a/app-2-exec-1": OTHER_ONLY,
        "spark-b/app-3-exec-1": GATED,
    }


def test_a_break_glass_context_of_the_kubeconfig_releases_and_one_without_a_user_is_refused(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kubeconfig context that impersonates the group (`as`, `as-groups`, as kubectl writes them) works
    without the flags, under the install's gate policy; groups without a user are a clear error, not a
    traceback and not the API server's 500."""
    config = yaml.safe_load(cluster.kubeconfig("admin").read_text())
    user = config["users"][0]["user"]
    user.update({"as": contract.BREAK_GLASS_USER, "as-groups": [contract.BREAK_GLASS_GROUP]})
    path = tmp_path / "break-glass"
    path.write_text(yaml.safe_dump(config))
    assert main(["release", "--kubeconfig", str(path), "-n", "spark-a", "--app", "app-1"]) == 0
    assert gates(cluster)["spark-a/app-1-exec-1"] == OTHER_ONLY
    del user["as"]
    path.write_text(yaml.safe_dump(config))
    assert main(["release", "--kubeconfig", str(path), "-A"]) == 2
    assert "need a user to act as" in capsys.readouterr().err


@pytest.mark.parametrize("answer", [0, 504])
def test_a_release_whose_answer_was_lost_is_counted_and_an_unanswered_one_is_a_failure(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], answer: int
) -> None:
    """Issue 37: kubesim applies the first gate removal and loses its answer. The patch is repeated (its
    test makes that safe), the repeat's 422 is not read as "someone changed the gates", and the pod, read
    again without its gate, is counted released: every pod the command released, no more, no less."""
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    cluster.faults.lose("patch", "pods", answer=answer, count=1)
    assert main(["release", "--kubeconfig", str(admin), "-n", "spark-a", "--app", "app-1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "released spark-a/app-1-exec-1 (app app-1) (the answer was lost; a re-read shows the gate gone)",
        "released spark-a/app-1-exec-2 (app app-1)",
        "released 2 executor pod(s)",
    ]
    applied = [e for e in cluster.requests.entries() if e.verb == "patch" and e.applied_write]
    assert len(applied) == 2 and gates(cluster)["spark-a/app-1-exec-1"] == OTHER_ONLY

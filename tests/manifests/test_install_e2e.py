"""The install end to end on kubesim: the webhook configurations come from the rendered manifests (their
service reference mapped to a real `sparkgate webhook` gunicorn process; their timeout the longest, see
conftest.PATIENT_TIMEOUT_SECONDS), `sparkgate certs sync` creates
the Secret and injects caBundle, kubesim admits executor pods through the webhook over TLS verified against
that caBundle for the Service's DNS name (as kube-apiserver does), a CA rollover during a stream of pod
creations fails no admission, and gate protection refuses users but not the allocator or Spark's driver.
Gate protection is the rendered ValidatingAdmissionPolicy and its binding, evaluated by kubesim with CEL
as kube-apiserver does (k8s.io/apiserver/pkg/admission/plugin/policy/validating): it holds with no
webhook at all; and the allocator, which may create pods for its policy probe, may only dry-run them."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from certs.plan import CA_CRT, TLS_CRT, TLS_KEY, Lifetimes, Step
from certs.sync import Target, sync_once
from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.contract import GATE
from sparkgate.kube import Kube, KubeError

from .test_components import CLUSTER_SCOPED
from .test_runbooks import section, shell_commands

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


class Install:
    def __init__(
        self,
        cluster: Cluster,
        webhook: LocalWebhook,
        allocator: Kube,
        target: Target,
        secret_volume: Callable[[Path, dict[str, bytes]], None],
    ) -> None:
        self.cluster, self.webhook, self.allocator, self.target = cluster, webhook, allocator, target
        self._secret_volume = secret_volume

    def secret(self) -> dict[str, bytes]:
        secret = self.cluster.store.get("secrets", "sparkgate-system", "sparkgate-webhook-tls")
        return {k: base64.b64decode(v) for k, v in secret["data"].items()}

    def mount_secret(self) -> None:
        """What the kubelet does for the webhook's Secret volume: swap in the new files atomically."""
        data = self.secret()
        self._secret_volume(self.webhook.cert_dir, {name: data[name] for name in (TLS_CRT, TLS_KEY)})

    def sync(self, lifetimes: Lifetimes | None = None) -> tuple[Step, ...]:
        target = Target(lifetimes=lifetimes) if lifetimes else self.target
        return sync_once(self.allocator, target, dt.datetime.now(dt.UTC)).steps


@pytest.fixture(scope="module")
def install(
    kustomize: ModuleType,
    tmp_path_factory: pytest.TempPathFactory,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
) -> Iterator[Install]:
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    workdir = tmp_path_factory.mktemp("install")
    with (
        LocalWebhook(REPO / "manifests" / "base" / "policy.yaml", workdir, workers=2) as webhook,
        Cluster(nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs")) as cluster,
    ):
        cluster.register_service("sparkgate-system", "sparkgate-webhook", webhook.url)
        # With the longest timeout: a slow call on a busy machine must not pass for a failed admission.
        cluster.store.create(
            "mutatingwebhookconfigurations",
            patient_webhook(objects[("MutatingWebhookConfiguration", "sparkgate")]),
        )
        install_policies(cluster, objects)
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        result = Install(cluster, webhook, allocator, Target(), secret_volume)
        assert result.sync() == (Step.CREATE,)
        result.mount_secret()
        yield result
        allocator.close()


def install_policies(cluster: Cluster, objects: dict[tuple[str, str], Obj]) -> None:
    """The base's ValidatingAdmissionPolicies and their bindings, as rendered."""
    for (kind, _), obj in sorted(objects.items()):
        if kind == "ValidatingAdmissionPolicy":
            cluster.store.create("validatingadmissionpolicies", obj)
    for (kind, _), obj in sorted(objects.items()):
        if kind == "ValidatingAdmissionPolicyBinding":
            cluster.store.create("validatingadmissionpolicybindings", obj)


def test_executor_pods_are_admitted_over_verified_tls(install: Install, executors: Any) -> None:
    bundle = install.cluster.store.get("mutatingwebhookconfigurations", None, "sparkgate")["webhooks"][0]
    assert base64.b64decode(bundle["clientConfig"]["caBundle"]) == install.secret()[CA_CRT]
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    calls = install.cluster.admission.calls
    created = spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod("first-exec-1"))
    spark.close()
    assert executors.admitted(created) and install.cluster.admission.calls > calls


def test_a_wrong_ca_bundle_means_no_admission_until_certs_sync_repairs_it(
    install: Install, executors: Any
) -> None:
    store = install.cluster.store
    config = copy.deepcopy(store.get("mutatingwebhookconfigurations", None, "sparkgate"))
    stranger = install.webhook.ca_pem  # a CA that did not sign what the webhook serves now
    config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(stranger).decode()
    store.replace("mutatingwebhookconfigurations", None, "sparkgate", config)
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    # failurePolicy Ignore: the pod is created, but without sparkgate, and at once: a certificate the
    # caBundle does not verify fails the TLS handshake, it does not wait out the webhook's timeout.
    timeout = config["webhooks"][0]["timeoutSeconds"]
    started = time.monotonic()
    assert not executors.admitted(
        spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod("bad-ca-1"))
    )
    assert time.monotonic() - started < timeout
    assert install.sync() == ()  # nothing to do to the Secret, only the bundle to repair
    assert executors.admitted(spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod("repaired-1")))
    spark.close()


def test_ca_rollover_during_a_stream_of_pod_creations_fails_no_admission(
    install: Install, executors: Any
) -> None:
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    results: list[bool] = []
    errors: list[BaseException] = []
    progress = threading.Condition()
    stop = threading.Event()

    def stream() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                pod = spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod(f"stream-exec-{i}"))
            except KubeError as e:
                errors.append(e)
                return
            with progress:
                results.append(executors.admitted(pod))
                progress.notify_all()

    def after_more(n: int) -> None:
        with progress:
            target = len(results) + n
            assert progress.wait_for(lambda: len(results) >= target or bool(errors), timeout=60)

    thread = threading.Thread(target=stream, name="pod-stream")
    thread.start()
    try:
        after_more(5)
        # The CA is "due" at once: stage a new CA next to the current one (bundle = old + new).
        assert install.sync(Lifetimes(ca_renew_before=Lifetimes.ca, overlap=dt.timedelta(0))) == (
            Step.STAGE_CA,
        )
        after_more(5)
        # Every webhook trusts the new CA: the serving certificate switches to it. The webhook keeps
        # serving the old one until its Secret volume is updated, which the old CA in the bundle covers.
        fast = Lifetimes(overlap=dt.timedelta(0), keep_previous=dt.timedelta(0))
        assert install.sync(fast) == (Step.SWITCH_CA,)
        after_more(5)
        install.mount_secret()
        after_more(5)
        assert install.sync(fast) == (Step.DROP_PREVIOUS_CA,)
        after_more(10)
    finally:
        stop.set()
        thread.join(timeout=60)
        spark.close()
    assert not errors and len(results) >= 30
    assert all(results), f"{results.count(False)} of {len(results)} pods were not admitted by sparkgate"


def gated_pod(install: Install, executors: Any, name: str) -> Kube:
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    assert executors.admitted(spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod(name)))
    return spark


REMOVE_GATE = [
    {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
    {"op": "remove", "path": "/spec/schedulingGates/0"},
]


def test_gate_removal_by_a_user_is_refused_naming_sparkgate(install: Install, executors: Any) -> None:
    spark = gated_pod(install, executors, "jumper-exec-1")
    with pytest.raises(KubeError) as refused:
        spark.patch(
            "/api/v1/namespaces/spark-jobs/pods/jumper-exec-1", REMOVE_GATE, "application/json-patch+json"
        )
    spark.close()
    assert "sparkgate" in refused.value.message and refused.value.status in (400, 403)
    pod = install.cluster.store.get("pods", "spark-jobs", "jumper-exec-1")
    assert GATE in [g["name"] for g in pod["spec"]["schedulingGates"]]


def test_gate_removal_by_the_allocator_and_driver_label_patches_are_allowed(
    install: Install, executors: Any
) -> None:
    spark = gated_pod(install, executors, "normal-exec-1")
    path = "/api/v1/namespaces/spark-jobs/pods/normal-exec-1"
    labelled = spark.patch(
        path, {"metadata": {"labels": {"spark-exec-inactive": "true"}}}, "application/merge-patch+json"
    )
    spark.close()
    assert labelled["metadata"]["labels"]["spark-exec-inactive"] == "true"
    released = install.allocator.patch(path, REMOVE_GATE, "application/json-patch+json")
    assert GATE not in [g["name"] for g in released["spec"].get("schedulingGates", [])]


def gate_refusal(name: str, policy: Obj) -> str:
    message = policy["spec"]["validations"][0]["message"]
    return (
        f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy 'sparkgate-gate' with binding "
        f"'sparkgate-gate' denied request: {message}"
    )


def test_with_no_webhook_at_all_the_admission_policy_protects_the_gate(
    kustomize: ModuleType, executors: Any, tmp_path: Path
) -> None:
    """A user allowed to patch pods cannot remove the gate (the policy's message, word for word), may still
    label the gated pod, and the allocator may remove the gate: no webhook is registered here."""
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
    ) as cluster:
        install_policies(cluster, objects)
        pod = executors.pod("gated-exec-1")
        pod["spec"]["schedulingGates"] = [{"name": "example.com/other"}, {"name": GATE}]
        cluster.store.create("pods", pod, namespace="spark-jobs")
        path = "/api/v1/namespaces/spark-jobs/pods/gated-exec-1"
        user = Kube.from_kubeconfig(str(cluster.add_user("jane@example.com")))
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        try:
            remove = [
                {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE},
                {"op": "remove", "path": "/spec/schedulingGates/1"},
            ]
            with pytest.raises(KubeError) as refused:
                user.patch(path, remove, "application/json-patch+json")
            assert refused.value.status == 403
            assert refused.value.message == gate_refusal(
                "gated-exec-1", objects[("ValidatingAdmissionPolicy", "sparkgate-gate")]
            )
            labelled = user.patch(
                path,
                {"metadata": {"labels": {"spark-exec-inactive": "true"}}},
                "application/merge-patch+json",
            )
            assert labelled["metadata"]["labels"]["spark-exec-inactive"] == "true"
            other = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
            assert [
                g["name"]
                for g in user.patch(path, other, "application/json-patch+json")["spec"]["schedulingGates"]
            ] == [GATE]
            released = allocator.patch(
                path, [{"op": "remove", "path": "/spec/schedulingGates/0"}], "application/json-patch+json"
            )
            assert "schedulingGates" not in released["spec"] or released["spec"]["schedulingGates"] == []
        finally:
            user.close()
            allocator.close()


def test_the_allocator_may_only_dry_run_pod_creations(
    kustomize: ModuleType, executors: Any, tmp_path: Path
) -> None:
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
    ) as cluster:
        install_policies(cluster, objects)
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        try:
            pods = "/api/v1/namespaces/spark-jobs/pods"
            pod = executors.pod("probe-exec-1")
            assert (
                allocator.request("POST", pods, query={"dryRun": "All"}, body=pod)["metadata"]["name"]
                == "probe-exec-1"
            )
            with pytest.raises(KubeError) as refused:
                allocator.create(pods, pod)
            assert refused.value.status == 403
            assert "the sparkgate allocator creates pods only as dry runs" in refused.value.message
            assert cluster.store.list_objects("pods")[0] == []
        finally:
            allocator.close()


def test_the_allocator_may_not_change_what_a_pod_runs_or_where(
    kustomize: ModuleType, executors: Any, tmp_path: Path
) -> None:
    """Its RBAC lets it patch any pod (to remove the gate): the install's sparkgate-allocator-pod-updates
    refuses it a new container or init container image on a running pod; tolerations, a nodeSelector or an
    affinity on a gated one (all of which kube-apiserver's own validation allows: pkg/apis/core/validation
    ValidatePodUpdate, and the scheduling directives of gated pods); and the removal of another controller's
    gate; with the policy's messages word for word. It still removes its own gate and labels pods; another
    user with the same rights may change the image (the policy is the allocator's alone)."""
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    policy = objects[("ValidatingAdmissionPolicy", "sparkgate-allocator-pod-updates")]
    images, placement, gates = (v["message"] for v in policy["spec"]["validations"][:3])
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
    ) as cluster:
        install_policies(cluster, objects)
        running = executors.pod("running-exec-1")
        running["spec"]["initContainers"] = [{"name": "fetch", "image": "example.com/fetch:1"}]
        cluster.store.create("pods", running, namespace="spark-jobs")
        gated = executors.pod("gated-exec-2")
        gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}, {"name": GATE}]
        cluster.store.create("pods", gated, namespace="spark-jobs")
        pods = "/api/v1/namespaces/spark-jobs/pods"
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        admin = Kube.from_kubeconfig(str(cluster.add_user("jane@example.com")))
        json_patch = "application/json-patch+json"
        image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "example.com/miner:1"}]
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                    ]
                }
            }
        }
        refused = (
            ("running-exec-1", image, images),
            ("running-exec-1", [{**image[0], "path": "/spec/initContainers/0/image"}], images),
            (
                "gated-exec-2",
                [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}],
                placement,
            ),
            (
                "gated-exec-2",
                [{"op": "add", "path": "/spec/nodeSelector", "value": {"pool": "gpu"}}],
                placement,
            ),
            ("gated-exec-2", [{"op": "add", "path": "/spec/affinity", "value": affinity}], placement),
            ("gated-exec-2", [{"op": "remove", "path": "/spec/schedulingGates/0"}], gates),
        )
        try:
            for name, patch, message in refused:
                with pytest.raises(KubeError) as refusal:
                    allocator.patch(f"{pods}/{name}", patch, json_patch)
                assert (refusal.value.status, refusal.value.message) == (
                    403,
                    f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy 'sparkgate-allocator-pod-updates' "
                    f"with binding 'sparkgate-allocator-pod-updates' denied request: {message}",
                ), patch
            labelled = allocator.patch(
                f"{pods}/running-exec-1", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json"
            )
            assert labelled["metadata"]["labels"]["x"] == "y"
            own = [
                {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE},
                {"op": "remove", "path": "/spec/schedulingGates/1"},
            ]
            released = allocator.patch(f"{pods}/gated-exec-2", own, json_patch)
            assert [g["name"] for g in released["spec"]["schedulingGates"]] == ["kueue.x-k8s.io/admission"]
            assert (
                admin.patch(f"{pods}/running-exec-1", image, json_patch)["spec"]["containers"][0]["image"]
                == "example.com/miner:1"
            )
        finally:
            allocator.close()
            admin.close()


def test_in_a_pod_status_the_allocator_may_write_its_demand_mark_and_nothing_else(
    kustomize: ModuleType, executors: Any, tmp_path: Path
) -> None:
    """RBAC grants it `patch` on `pods/status` (to mark the executors it holds for the cluster autoscaler:
    allocator/demand.py): the install's sparkgate-allocator-pod-updates lets its actor's mark through, as its
    own service account, on a gated pod, and refuses it, with the policy's message word for word, any other
    status write: the mark on a pod without the gate, a condition that is not sparkgate's (no mark, or
    another reason), another condition, another field of the status, the PodScheduled condition removed, a
    label. Of cluster-autoscaler's annotations it sets the two that consume a ProvisioningRequest, in its
    gate's removal, and no other. The policy is the allocator's alone: the scheduler's status writes are not
    concerned."""
    from allocator.actor import Actor
    from allocator.cache import pod_record
    from allocator.model import MarkHeld

    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    policy = objects[("ValidatingAdmissionPolicy", "sparkgate-allocator-pod-updates")]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods", "pods/status"]
    status_only = policy["spec"]["validations"][3]["message"]
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
    ) as cluster:
        install_policies(cluster, objects)
        for name in ("held-exec-1", "held-exec-2"):
            gated = executors.pod(name)
            gated["spec"]["schedulingGates"] = [{"name": GATE}]
            gated["metadata"]["annotations"] = {contract.ANNOTATION_PROFILE: "spark"}  # as admitted
            cluster.store.create("pods", gated, namespace="spark-jobs")
        cluster.store.create("pods", executors.pod("free-exec-3"), namespace="spark-jobs")
        pods = "/api/v1/namespaces/spark-jobs/pods"
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        outcomes: list[str] = []
        actor = Actor(allocator, "sparkgate-system", on_mark=lambda _, outcome: outcomes.append(outcome))
        json_patch = "application/json-patch+json"
        now = "2026-11-28T12:00:00Z"
        mark = contract.held_condition("the cluster already has 2 executor pods waiting to be placed", now)
        try:
            record = pod_record(cluster.store.get("pods", "spark-jobs", "held-exec-1"))
            assert record is not None and record.gated_condition is not None
            actor.mark(MarkHeld(record.app, record, "the cluster already has 2 executor pods waiting"))
            marked = cluster.store.get("pods", "spark-jobs", "held-exec-1")
            [condition] = [c for c in marked["status"]["conditions"] if c["type"] == "PodScheduled"]
            assert outcomes == ["written"]
            assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
            assert condition["message"].startswith(contract.HELD_MARK)
            again = pod_record(marked)
            assert again is not None and again.held_mark and not again.unschedulable
            free = cluster.store.get("pods", "spark-jobs", "free-exec-3")
            index = next(i for i, c in enumerate(free["status"]["conditions"]) if c["type"] == "PodScheduled")
            scheduled = f"/status/conditions/{index}"
            refused: list[tuple[str, list[Obj]]] = [
                ("free-exec-3", [{"op": "replace", "path": scheduled, "value": mark}]),
                (
                    "held-exec-2",
                    [{"op": "replace", "path": "/status/conditions/0", "value": {**mark, "message": "x"}}],
                ),
                (
                    "held-exec-2",
                    [{"op": "replace", "path": "/status/conditions/0", "value": {**mark, "reason": "Other"}}],
                ),
                (
                    "held-exec-2",
                    [
                        {"op": "replace", "path": "/status/conditions/0", "value": mark},
                        {"op": "add", "path": "/status/phase", "value": "Failed"},
                    ],
                ),
                ("held-exec-2", [{"op": "add", "path": "/status/message", "value": "held"}]),
                (
                    "held-exec-2",
                    [
                        {
                            "op": "add",
                            "path": "/status/conditions/-",
                            "value": {"type": "Ready", "status": "False"},
                        }
                    ],
                ),
                ("held-exec-2", [{"op": "remove", "path": "/status/conditions/0"}]),
                ("held-exec-2", [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]),
            ]
            for name, patch in refused:
                with pytest.raises(KubeError) as refusal:
                    allocator.patch(f"{pods}/{name}/status", patch, json_patch)
                assert (refusal.value.status, refusal.value.message) == (
                    403,
                    f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy 'sparkgate-allocator-pod-updates' "
                    f"with binding 'sparkgate-allocator-pod-updates' denied request: {status_only}",
                ), patch
            # cluster-autoscaler's annotations: the two that consume a request, with the gate's removal only.
            annotations = policy["spec"]["validations"][4]["message"]
            consume = contract.consuming_release(0, "sg-app-pr1", "check-capacity.autoscaling.x-k8s.io")
            for name, patch in (
                ("held-exec-2", consume[2:]),  # without removing the gate
                (
                    "held-exec-2",
                    [{**consume[2], "path": "/metadata/annotations/autoscaling.x-k8s.io~1other"}],
                ),
            ):
                with pytest.raises(KubeError) as refusal:
                    allocator.patch(f"{pods}/{name}", patch, json_patch)
                assert refusal.value.status == 403 and refusal.value.message.endswith(annotations), patch
            released = allocator.patch(f"{pods}/held-exec-2", consume, json_patch)
            assert released["metadata"]["annotations"][contract.ANNOTATION_CONSUME_REQUEST] == "sg-app-pr1"
            # ... and removes none (another controller's request, consumed by a pod it did not release).
            unconsume = [{"op": "remove", "path": consume[2]["path"]}]
            with pytest.raises(KubeError) as refusal:
                allocator.patch(f"{pods}/held-exec-2", unconsume, json_patch)
            assert refusal.value.status == 403 and refusal.value.message.endswith(annotations)
            # Another writer's status (kube-scheduler's verdict, as the scheduler's own user) is not concerned.
            scheduler = Kube.from_kubeconfig(str(cluster.add_user("system:kube-scheduler")))
            verdict = {**mark, "message": "0/1 nodes are available: 1 Insufficient cpu."}
            written = scheduler.patch(
                f"{pods}/free-exec-3/status",
                {"status": {"conditions": [verdict]}},
                "application/strategic-merge-patch+json",
            )
            scheduler.close()
            assert verdict in written["status"]["conditions"]
            assert pod_record(written) is not None and pod_record(written).unschedulable  # type: ignore[union-attr]
        finally:
            actor.close()
            allocator.close()


def test_outside_its_namespace_the_allocator_writes_only_its_own_config_map_copies(
    kustomize: ModuleType, tmp_path: Path
) -> None:
    """RBAC grants it create and delete of ConfigMaps everywhere (the per-app copies): the install's
    sparkgate-allocator-config-maps refuses it, outside sparkgate-system, a ConfigMap without sparkgate's
    label and the deletion of one that is not its own (what a pod mounts is not the allocator's to
    replace), with the policy's message word for word; its copies and its histories are written as before,
    and other users are not concerned."""
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    [message] = [
        v["message"]
        for v in objects[("ValidatingAdmissionPolicy", "sparkgate-allocator-config-maps")]["spec"][
            "validations"
        ]
    ]
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
    ) as cluster:
        install_policies(cluster, objects)
        cluster.store.create(
            "configmaps", {"metadata": {"name": "app-config"}, "data": {"a": "1"}}, namespace="spark-jobs"
        )
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        admin = Kube.from_kubeconfig(str(cluster.add_user("jane@example.com")))
        ours = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
        jobs, system = (
            "/api/v1/namespaces/spark-jobs/configmaps",
            "/api/v1/namespaces/sparkgate-system/configmaps",
        )

        def config_map(name: str, labels: dict[str, str] | None = None) -> Obj:
            return {"metadata": {"name": name, "labels": labels or {}}, "data": {"a": "2"}}

        def refusal(name: str) -> str:
            return (
                f"configmaps \"{name}\" is forbidden: ValidatingAdmissionPolicy 'sparkgate-allocator-config-maps' "
                f"with binding 'sparkgate-allocator-config-maps' denied request: {message}"
            )

        try:
            for name, write in (
                ("settings", lambda: allocator.create(jobs, config_map("settings"))),
                ("app-config", lambda: allocator.delete(f"{jobs}/app-config")),
            ):
                with pytest.raises(KubeError) as refused:
                    write()
                assert (refused.value.status, refused.value.message) == (403, refusal(name))
            allocator.create(jobs, config_map("sparkgate-spark-log4j-app", ours))
            allocator.delete(f"{jobs}/sparkgate-spark-log4j-app")
            allocator.create(system, config_map("sparkgate-history-x"))
            allocator.delete(f"{system}/sparkgate-history-x")
            admin.create(jobs, config_map("settings"))
            admin.delete(f"{jobs}/app-config")
            names = sorted(c["metadata"]["name"] for c in cluster.store.list_objects("configmaps")[0])
            assert "settings" in names and "app-config" not in names
        finally:
            allocator.close()
            admin.close()


def test_on_old_clusters_the_validate_webhook_lets_only_the_break_glass_group_release(
    kustomize: ModuleType,
    executors: Any,
    tmp_path: Path,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With components/validating-webhook (no admission policy API): the rendered ValidatingWebhookConfiguration
    sends the gate removal to the real `sparkgate webhook` over verified TLS; a cluster admin outside the
    group is refused with the webhook's message, a member of sparkgate:break-glass releases with
    `sparkgate release`."""
    objects = kustomize.by_kind(kustomize.install(["validating-webhook"]))
    assert not [k for k in objects if k[0].startswith("ValidatingAdmissionPolicy")]
    with (
        LocalWebhook(REPO / "manifests" / "base" / "policy.yaml", tmp_path / "webhook", workers=1) as webhook,
        Cluster(
            nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
        ) as cluster,
    ):
        cluster.register_service("sparkgate-system", "sparkgate-webhook", webhook.url)
        config = patient_webhook(objects[("ValidatingWebhookConfiguration", "sparkgate")])
        cluster.store.create("validatingwebhookconfigurations", config)
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        install = Install(cluster, webhook, allocator, Target(), secret_volume)
        try:
            assert install.sync() == (Step.CREATE,)
            install.mount_secret()
            pod = executors.pod("held-exec-1")
            pod["spec"]["schedulingGates"] = [{"name": GATE}]
            cluster.store.create("pods", pod, namespace="spark-jobs")
            calls = cluster.admission.calls
            admin = str(cluster.kubeconfig("admin"))
            assert main(["release", "--kubeconfig", admin, "-n", "spark-jobs"]) == 1
            assert (
                "may not. The allocator releases executor pods within the cluster's limits."
                in capsys.readouterr().err
            )
            assert cluster.admission.calls > calls  # the webhook answered, not a TLS failure
            member = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
            assert main(["release", "--kubeconfig", str(member), "-n", "spark-jobs"]) == 0
            assert capsys.readouterr().out.splitlines()[-1] == "released 1 executor pod(s)"
            held = cluster.store.get("pods", "spark-jobs", "held-exec-1")
            assert not held["spec"].get("schedulingGates")
        finally:
            allocator.close()


def test_the_verify_section_dry_run_shows_the_gate_and_the_profile_as_documented(install: Install) -> None:
    """docs/install.md "4. Verify": its commands taken from the text and sent as the API calls kubectl makes
    for them (kubesim serves plain HTTP, where kubectl sends no bearer token: tests/manifests/test_runbooks.py),
    as a cluster admin; the dry run must show what the section says it shows, and create nothing."""
    commands = [
        c for c in shell_commands(section(REPO / "docs" / "install.md", "4. Verify")) if "kubectl" in c
    ]
    bundle = next(c for c in commands if "get mutatingwebhookconfiguration" in c)
    run = next(c for c in commands if " run " in c)
    created, deleted = (
        next(c for c in commands if c.startswith(f"kubectl {v} namespace")) for v in ("create", "delete")
    )
    admin = Kube.from_kubeconfig(str(install.cluster.kubeconfig("admin")))
    try:
        # kubectl get mutatingwebhookconfiguration sparkgate -o jsonpath='{.webhooks[0].clientConfig.caBundle}'
        name = shlex.split(bundle)[3]
        configuration = admin.get(
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
        )
        assert configuration["webhooks"][0]["clientConfig"]["caBundle"]
        namespace = shlex.split(created)[3]
        admin.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        # kubectl -n NS run NAME --image=IMAGE --labels=K=V,... --dry-run=server: the Pod kubectl run builds
        # (k8s.io/kubectl/pkg/generate/versioned/run.go: one container named after the pod, --labels
        # replacing the default run=NAME), POSTed with dryRun=All.
        words = shlex.split(run)
        flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
        pod_name = words[words.index("run") + 1]
        assert words[words.index("-n") + 1] == namespace and flags["dry-run"] == "server"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": dict(kv.split("=", 1) for kv in flags["labels"].split(",")),
            },
            "spec": {
                "containers": [{"name": pod_name, "image": flags["image"], "resources": {}}],
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
            },
        }
        answer = admin.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            query={"dryRun": "All", "fieldManager": "kubectl-run"},
            body=pod,
        )
        # What the section says the dry run prints: the gate, and a sparkgate.io/profile annotation.
        assert answer["spec"]["schedulingGates"] == [{"name": GATE}]
        assert contract.ANNOTATION_PROFILE in answer["metadata"]["annotations"]
        assert '[{"name":"sparkgate.io/allocator"}]' in section(REPO / "docs" / "install.md", "4. Verify")
        assert not install.cluster.store.list_objects("pods", namespace)[0]  # a dry run creates nothing
        assert shlex.split(deleted)[3] == namespace
        admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
    finally:
        admin.close()


def test_installing_into_another_namespace_as_documented(
    kustomize: ModuleType,
    executors: Any,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
    tmp_path: Path,
) -> None:
    """docs/install.md "Installing into another namespace": its render line run by the shell as typed, in a
    directory holding the admin's kustomization `my-sparkgate/`, for the base with every component of each
    admission mode: nothing names sparkgate-system any more, every namespaced object is in the new namespace
    and no cluster-scoped one carries one. The base's result installed on kubesim: `certs sync` for the new
    namespace, an executor pod admitted through the webhook over TLS verified for the new Service's name, and
    the gate policy lets the new namespace's allocator remove the gate and refuses a user."""
    text = section(REPO / "docs" / "install.md", "Installing into another namespace")
    render = next(c for c in shell_commands(text) if c.startswith("kubectl kustomize"))
    match = re.search(r"sed 's/sparkgate-system/([a-z0-9-]+)/g' > (\S+)$", render)
    assert match, render
    namespace, output = match.groups()
    assert any(c == f"kubectl apply -f {output}" for c in shell_commands(text))
    assert f"sparkgate certs sync --namespace {namespace}" in " ".join(text.split())

    def rendered(components: tuple[str, ...]) -> list[Obj]:
        own = tmp_path / "my-sparkgate"
        own.mkdir(exist_ok=True)
        (own / "kustomization.yaml").write_text(yaml.safe_dump(kustomize.kustomization(own, components)))
        subprocess.run(kustomize.shell(render), cwd=tmp_path, check=True, timeout=120)
        result = (tmp_path / output).read_text()
        assert "sparkgate-system" not in result
        return [o for o in yaml.safe_load_all(result) if o]

    modes = (kustomize.COMPONENTS, (kustomize.ADMISSION_POLICY, *kustomize.COMPONENTS[:3]), ())
    for components in modes:
        objects = rendered(components)
        for obj in objects:
            meta = obj["metadata"]
            if obj["kind"] in CLUSTER_SCOPED:
                assert "namespace" not in meta, (obj["kind"], meta["name"])
            else:
                # kube-system: the second scheduler's reading of extension-apiserver-authentication
                assert meta.get("namespace") in (namespace, "kube-system"), (obj["kind"], meta["name"])
        assert ("Namespace", namespace) in {(o["kind"], o["metadata"]["name"]) for o in objects}
    base = {(o["kind"], o["metadata"]["name"]): o for o in objects}  # the last: the base alone

    workdir = tmp_path / "install"
    allocator_user = f"system:serviceaccount:{namespace}:{contract.ALLOCATOR_SERVICE_ACCOUNT}"
    with (
        LocalWebhook(REPO / "manifests" / "base" / "policy.yaml", workdir, workers=1) as webhook,
        Cluster(
            nodes=1, namespaces=("default", "kube-system", namespace, "spark-jobs"), workdir=tmp_path
        ) as cluster,
    ):
        cluster.register_service(namespace, contract.WEBHOOK_SERVICE, webhook.url)
        cluster.store.create(
            "mutatingwebhookconfigurations",
            patient_webhook(base[("MutatingWebhookConfiguration", contract.WEBHOOK_CONFIGURATION)]),
        )
        install_policies(cluster, base)
        allocator = Kube.from_kubeconfig(str(cluster.add_user(allocator_user)))
        spark = Kube.from_kubeconfig(str(cluster.add_user("system:serviceaccount:spark-jobs:spark")))
        try:
            target = Target(namespace=namespace)
            assert sync_once(allocator, target, dt.datetime.now(dt.UTC)).steps == (Step.CREATE,)
            secret = cluster.store.get("secrets", namespace, contract.CERT_SECRET)["data"]
            secret_volume(webhook.cert_dir, {n: base64.b64decode(secret[n]) for n in (TLS_CRT, TLS_KEY)})
            pod = spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod("moved-exec-1"))
            assert executors.admitted(pod)
            path = "/api/v1/namespaces/spark-jobs/pods/moved-exec-1"
            with pytest.raises(KubeError) as refused:
                spark.patch(path, REMOVE_GATE, "application/json-patch+json")
            assert refused.value.status == 403 and allocator_user in refused.value.message
            released = allocator.patch(path, REMOVE_GATE, "application/json-patch+json")
            assert GATE not in [g["name"] for g in released["spec"].get("schedulingGates", [])]
        finally:
            allocator.close()
            spark.close()

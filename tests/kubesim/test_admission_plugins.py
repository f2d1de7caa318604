"""kube-apiserver's built-in admission plugins in kubesim, over HTTP with the official client.

Each test names the Kubernetes source it copies; the refusals with the Priority, ServiceAccount and
RuntimeClass plugins after a webhook's patch were measured on a real 1.36 cluster
(docs: docs/real-cluster-facts.md, "The admission chain").
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kubesim.cluster import Cluster

from .conftest import pod
from .test_cluster import TinyWebhook, executor_pod

Patch = list[dict[str, Any]]


def patching(ops: Patch) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        patch = base64.b64encode(json.dumps(ops).encode()).decode()
        return {"allowed": True, "patchType": "JSONPatch", "patch": patch}

    return answer


@pytest.fixture
def mutating(cluster: Cluster) -> Iterator[Callable[[Patch], TinyWebhook]]:
    """Installs a mutating webhook on executor pods that answers every review with the given JSON Patch."""
    hooks: list[TinyWebhook] = []

    def install(ops: Patch) -> TinyWebhook:
        hook = TinyWebhook(patching(ops))
        hooks.append(hook)
        cluster.store.create("mutatingwebhookconfigurations", hook.config(f"m{len(hooks)}.example.com"))
        return hook

    yield install
    for hook in hooks:
        hook.close()


def refusal(e: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, str]:
    return e.value.status, json.loads(e.value.body)["message"]


# --- Priority ---------------------------------------------------------------------------------------------


def test_a_webhook_adding_a_priority_class_to_a_pod_already_given_priority_0_is_refused(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """plugin/pkg/admission/priority/admission.go admitPod, rerun after the webhook's change
    (staging/src/k8s.io/apiserver/pkg/admission/reinvocation.go); measured on 1.36: the webhook sees
    `priority: 0` and `preemptionPolicy: PreemptLowerPriority` from the first pass, and the pod is refused."""
    cluster.add_priority_class("spark-batch", 1000)
    hook = mutating([{"op": "add", "path": "/spec/priorityClassName", "value": "spark-batch"}])
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e) == (
        403,
        'pods "e1" is forbidden: the integer value of priority (0) must not be provided in pod spec; '
        "priority admission controller computed 1000 from the given PriorityClass name",
    )
    seen = hook.requests[0]["object"]["spec"]
    assert seen["priority"] == 0 and seen["preemptionPolicy"] == "PreemptLowerPriority"
    assert cluster.store.list_objects("pods", "spark")[0] == []


def test_the_class_with_priority_removed_is_admitted_with_the_class_value(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """priority/admission.go: a pod without `priority` gets the class's value and preemptionPolicy
    (PreemptLowerPriority, the PriorityClass API default). Measured on 1.36."""
    cluster.add_priority_class("spark-batch", 1000)
    mutating(
        [
            {"op": "add", "path": "/spec/priorityClassName", "value": "spark-batch"},
            {"op": "remove", "path": "/spec/priority"},
        ]
    )
    created = core.create_namespaced_pod("spark", executor_pod("e1"))
    assert (created.spec.priority, created.spec.preemption_policy) == (1000, "PreemptLowerPriority")
    assert created.spec.priority_class_name == "spark-batch"


def test_preemption_policy_must_be_removed_too_for_a_class_that_never_preempts(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """priority/admission.go: a `preemptionPolicy` differing from the class's is refused. Measured on 1.36
    with a class `nopreempt` (value 500, preemptionPolicy Never)."""
    cluster.add_priority_class("nopreempt", 500, preemption_policy="Never")
    add = {"op": "add", "path": "/spec/priorityClassName", "value": "nopreempt"}
    mutating([add, {"op": "remove", "path": "/spec/priority"}])
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e) == (
        403,
        'pods "e1" is forbidden: the string value of PreemptionPolicy (PreemptLowerPriority) must not be '
        "provided in pod spec; priority admission controller computed Never from the given PriorityClass name",
    )
    cluster.store.delete("mutatingwebhookconfigurations", None, "m1.example.com")
    mutating(
        [
            add,
            {"op": "remove", "path": "/spec/priority"},
            {"op": "remove", "path": "/spec/preemptionPolicy"},
        ]
    )
    created = core.create_namespaced_pod("spark", executor_pod("e2"))
    assert (created.spec.priority, created.spec.preemption_policy) == (500, "Never")


def test_a_missing_priority_class_is_refused(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """priority/admission.go: `no PriorityClass with name X was found` (403). Measured on 1.36."""
    mutating(
        [
            {"op": "add", "path": "/spec/priorityClassName", "value": "no-such-class"},
            {"op": "remove", "path": "/spec/priority"},
            {"op": "remove", "path": "/spec/preemptionPolicy"},
        ]
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e) == (403, 'pods "e1" is forbidden: no PriorityClass with name no-such-class was found')


def test_global_default_and_system_priority_classes(cluster: Cluster, core: client.CoreV1Api) -> None:
    """priority/admission.go: without a class a pod gets the globalDefault class (name, value, policy);
    system-cluster-critical exists from the start (scheduling SystemPriorityClasses); a second default is
    refused by validatePriorityClass; pkg/apis/scheduling/validation reserves the `system-` prefix; the
    v1 API defaults preemptionPolicy."""
    scheduling = client.SchedulingV1Api(core.api_client)
    names = {pc.metadata.name: pc.value for pc in scheduling.list_priority_class().items}
    assert names == {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
    cluster.add_priority_class("low", 10, global_default=True, preemption_policy="Never")
    created = core.create_namespaced_pod("spark", pod("p"))
    assert (created.spec.priority_class_name, created.spec.priority, created.spec.preemption_policy) == (
        "low",
        10,
        "Never",
    )
    with pytest.raises(client.ApiException) as e:
        scheduling.create_priority_class({"metadata": {"name": "other"}, "value": 20, "globalDefault": True})
    assert refusal(e) == (
        403,
        'priorityclasses.scheduling.k8s.io "other" is forbidden: PriorityClass low is already marked as '
        "default. Only one default can exist",
    )
    with pytest.raises(client.ApiException) as e:
        scheduling.create_priority_class({"metadata": {"name": "system-mine"}, "value": 20})
    assert refusal(e) == (
        422,
        'PriorityClass "system-mine" is invalid: metadata.name: Forbidden: priority class names with '
        "'system-' prefix are reserved for system use only. error: system-mine is not a known system "
        "priority class",
    )
    created_class = scheduling.create_priority_class({"metadata": {"name": "batch"}, "value": 5})
    assert created_class.preemption_policy == "PreemptLowerPriority"


# --- ServiceAccount, DefaultTolerationSeconds --------------------------------------------------------------


def test_service_account_token_volume_and_default_tolerations(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """serviceaccount/admission.go: `default` account, a projected `kube-api-access-xxxxx` volume mounted
    read-only at /var/run/secrets/kubernetes.io/serviceaccount in every container;
    defaulttolerationseconds/admission.go: not-ready and unreachable NoExecute for 300 s. The same shape
    as the captured Spark 4.3 executor pods."""
    created = core.create_namespaced_pod("spark", pod("p"))
    spec = created.spec
    assert spec.service_account_name == "default" and spec.service_account == "default"
    (volume,) = spec.volumes
    assert volume.name.startswith("kube-api-access-") and len(volume.name) == len("kube-api-access-") + 5
    sources = volume.projected.sources
    assert sources[0].service_account_token.expiration_seconds == 3607
    assert sources[1].config_map.name == "kube-root-ca.crt"
    assert sources[2].downward_api.items[0].field_ref.field_path == "metadata.namespace"
    (mount,) = spec.containers[0].volume_mounts
    assert (mount.name, mount.mount_path, mount.read_only) == (
        volume.name,
        "/var/run/secrets/kubernetes.io/serviceaccount",
        True,
    )
    assert [(t.key, t.effect, t.toleration_seconds) for t in spec.tolerations] == [
        ("node.kubernetes.io/not-ready", "NoExecute", 300),
        ("node.kubernetes.io/unreachable", "NoExecute", 300),
    ]


def test_a_missing_service_account_is_refused(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """serviceaccount/admission.go: `error looking up service account NS/NAME: serviceaccount "NAME" not
    found` (403), also when a webhook sets the name. Measured on 1.36."""
    mutating([{"op": "replace", "path": "/spec/serviceAccountName", "value": "nope-sa"}])
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e) == (
        403,
        'pods "e1" is forbidden: error looking up service account spark/nope-sa: serviceaccount "nope-sa" '
        "not found",
    )
    cluster.add_service_account("spark", "nope-sa")
    created = core.create_namespaced_pod("spark", executor_pod("e2"))
    assert created.spec.service_account_name == created.spec.service_account == "nope-sa"


def test_every_namespace_gets_a_default_service_account(cluster: Cluster, core: client.CoreV1Api) -> None:
    """The service-account controller (pkg/controller/serviceaccount) creates `default` in every namespace."""
    cluster.add_namespace("fresh")
    assert [sa.metadata.name for sa in core.list_namespaced_service_account("fresh").items] == ["default"]
    assert core.create_namespaced_pod("fresh", pod("p")).spec.service_account_name == "default"


def test_a_captured_spark_executor_pod_is_admitted_unchanged_in_its_token_volume(
    cluster: Cluster, core: client.CoreV1Api, reviews: dict[str, dict[str, Any]]
) -> None:
    """A pod that already mounts the token path (the captured Spark 4.3 executors went through the real
    plugin) gets no second volume (serviceaccount/admission.go mountServiceAccountToken)."""
    sent = copy.deepcopy(reviews["etl-nightly-exec-1"]["request"]["object"])
    sent["metadata"].pop("ownerReferences")
    sent["metadata"]["namespace"] = "spark"
    created = core.create_namespaced_pod("spark", sent)
    assert [v.name for v in created.spec.volumes] == [v["name"] for v in sent["spec"]["volumes"]]
    assert len(created.spec.tolerations) == 3


# --- RuntimeClass -------------------------------------------------------------------------------------


def test_runtime_class_overhead_and_scheduling(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """runtimeclass/admission.go: `spec.overhead` from `overhead.podFixed` (measured on 1.36 with a webhook
    adding runtimeClassName), scheduling.nodeSelector merged; a missing class is
    `pod rejected: RuntimeClass "x" not found`; an overhead the class does not define is refused."""
    cluster.add_runtime_class(
        "gvisor", "runsc", overhead={"cpu": "250m", "memory": "120Mi"}, node_selector={"sandbox": "gvisor"}
    )
    mutating([{"op": "add", "path": "/spec/runtimeClassName", "value": "gvisor"}])
    created = core.create_namespaced_pod("spark", executor_pod("e1"))
    assert created.spec.overhead == {"cpu": "250m", "memory": "120Mi"}
    assert created.spec.node_selector == {"sandbox": "gvisor"}
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("p", runtimeClassName="kata"))
    assert refusal(e) == (403, 'pods "p" is forbidden: pod rejected: RuntimeClass "kata" not found')
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("q", overhead={"cpu": "1"}))
    assert refusal(e) == (
        403,
        'pods "q" is forbidden: pod rejected: Pod Overhead set without corresponding RuntimeClass defined '
        "Overhead",
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("r", runtimeClassName="gvisor", overhead={"cpu": "1"}))
    assert refusal(e) == (
        403,
        "pods \"r\" is forbidden: pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
    )


# --- LimitRanger --------------------------------------------------------------------------------------


def test_limit_range_container_defaults(cluster: Cluster, core: client.CoreV1Api) -> None:
    """limitranger/admission.go: a Container item's `default` fills missing limits and `defaultRequest`
    missing requests (defaultRequest defaults to `default`, SetDefaults_LimitRangeItem); the pod is
    annotated `kubernetes.io/limit-ranger`."""
    core.create_namespaced_limit_range(
        "spark",
        {
            "metadata": {"name": "defaults"},
            "spec": {
                "limits": [
                    {
                        "type": "Container",
                        "default": {"cpu": "500m", "memory": "512Mi"},
                        "defaultRequest": {"cpu": "250m"},
                    }
                ]
            },
        },
    )
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = core.create_namespaced_pod("spark", bare)
    resources = created.spec.containers[0].resources
    assert resources.requests == {"cpu": "250m", "memory": "512Mi"}
    assert resources.limits == {"cpu": "500m", "memory": "512Mi"}
    assert created.metadata.annotations["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c"
    )
    kept = core.create_namespaced_pod("spark", pod("sized"))  # requests cpu 1, memory 1Gi, no limits
    assert kept.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert kept.spec.containers[0].resources.limits == {"cpu": "500m", "memory": "512Mi"}


# --- PodSecurity --------------------------------------------------------------------------------------


def test_pod_security_restricted_refusal_wording(cluster: Cluster, core: client.CoreV1Api) -> None:
    """k8s.io/pod-security-admission: admission.go `violates PodSecurity "restricted:latest": ...`, the
    reasons in check-ID order with the details of policy/check_allowPrivilegeEscalation.go,
    check_capabilities_restricted.go, check_runAsNonRoot.go, check_seccompProfile_restricted.go."""
    cluster.add_namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("locked", pod("p"))
    assert refusal(e) == (
        403,
        'pods "p" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "c" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "c" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
        'container "c" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "c" must '
        'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")',
    )
    compliant = pod(
        "ok",
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    )
    compliant["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert core.create_namespaced_pod("locked", compliant).metadata.name == "ok"


def test_pod_security_baseline(cluster: Cluster, core: client.CoreV1Api) -> None:
    """policy/check_privileged.go, check_hostNamespaces.go, check_hostPathVolumes.go under `baseline`."""
    cluster.add_namespace("base", {"pod-security.kubernetes.io/enforce": "baseline"})
    bad = pod("p", hostNetwork=True, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("base", bad)
    assert refusal(e) == (
        403,
        'pods "p" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
        'hostPath volumes (volume "root"), privileged (container "c" must not set '
        "securityContext.privileged=true)",
    )
    assert core.create_namespaced_pod("base", pod("fine")).metadata.name == "fine"


# --- ResourceQuota ------------------------------------------------------------------------------------


def test_quota_counts_gated_pods_and_refuses_with_the_real_message(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """resourcequota/controller.go: `exceeded quota: NAME, requested: ..., used: ..., limited: ...` (403);
    pkg/quota/v1/evaluator/core/pods.go charges a pod from its creation (a gated pod counts) until it is
    gone; status.used follows."""
    core.create_namespaced_resource_quota(
        "spark", {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "2", "requests.cpu": "10"}}}
    )
    gate = [{"name": "sparkgate.io/allocator"}]
    core.create_namespaced_pod("spark", pod("g1", schedulingGates=gate))
    core.create_namespaced_pod("spark", pod("g2", schedulingGates=gate))
    quota = core.read_namespaced_resource_quota("q", "spark")
    assert quota.status.used == {"pods": "2", "requests.cpu": "2"} and quota.status.hard["pods"] == "2"
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("g3", schedulingGates=gate))
    assert refusal(e) == (
        403,
        'pods "g3" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2',
    )
    core.delete_namespaced_pod("g1", "spark")
    assert core.read_namespaced_resource_quota("q", "spark").status.used["pods"] == "1"
    core.create_namespaced_pod("spark", pod("g3", schedulingGates=gate))


def test_quota_on_cpu_requests(cluster: Cluster, core: client.CoreV1Api) -> None:
    """resourcequota/controller.go and evaluator/core/pods.go: the exceeded resource alone is shown; a
    container without the tracked request fails with `must specify`."""
    core.create_namespaced_resource_quota(
        "spark", {"metadata": {"name": "cpu"}, "spec": {"hard": {"requests.cpu": "1500m"}}}
    )
    core.create_namespaced_pod("spark", pod("a"))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("b"))
    assert refusal(e) == (
        403,
        'pods "b" is forbidden: exceeded quota: cpu, requested: requests.cpu=1, used: requests.cpu=1, '
        "limited: requests.cpu=1500m",
    )
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", bare)
    assert refusal(e) == (
        403,
        'pods "bare" is forbidden: failed quota: cpu: must specify requests.cpu for: c',
    )


def test_a_scoped_quota_charges_only_the_pods_its_scopes_match(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """pkg/quota/v1/evaluator/core/pods.go `podMatchesScopeFunc`: a quota scoped to a PriorityClass (the one
    GKE asks of namespaces running system-cluster-critical pods, manifests/base/priority-quota.yaml) charges
    and refuses only pods of that class; `scopes: [BestEffort]` only pods without requests or limits."""
    critical = {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}
    core.create_namespaced_resource_quota(
        "spark",
        {
            "metadata": {"name": "critical"},
            "spec": {"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [critical]}},
        },
    )
    core.create_namespaced_resource_quota(
        "spark",
        {"metadata": {"name": "besteffort"}, "spec": {"hard": {"pods": "5"}, "scopes": ["BestEffort"]}},
    )
    core.create_namespaced_pod("spark", pod("plain-1"))  # requests cpu: neither quota's
    core.create_namespaced_pod("spark", pod("c1", priorityClassName="system-cluster-critical"))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("c2", priorityClassName="system-cluster-critical"))
    assert refusal(e) == (
        403,
        'pods "c2" is forbidden: exceeded quota: critical, requested: pods=1, used: pods=1, limited: pods=1',
    )
    core.create_namespaced_pod("spark", pod("plain-2"))
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    core.create_namespaced_pod("spark", bare)
    assert core.read_namespaced_resource_quota("critical", "spark").status.used == {"pods": "1"}
    assert core.read_namespaced_resource_quota("besteffort", "spark").status.used == {"pods": "1"}


# --- PodTopologyLabels --------------------------------------------------------------------------------


def test_zone_and_region_labels_are_copied_onto_a_pod_at_binding(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """plugin/pkg/admission/podtopologylabels/admission.go (on by default from 1.35): the node's
    topology.kubernetes.io/zone and region labels land on the pod when it is bound."""
    zone = {"topology.kubernetes.io/zone": "eu-1a", "topology.kubernetes.io/region": "eu-1", "other": "x"}
    cluster.add_node("zoned", cpu="4", memory="16Gi", labels=zone)
    core.create_namespaced_pod("spark", pod("p", nodeSelector={"kubernetes.io/hostname": "zoned"}))
    cluster.wait_for(
        lambda: cluster.store.get("pods", "spark", "p")["spec"].get("nodeName") == "zoned", what="p bound"
    )
    labels = core.read_namespaced_pod("p", "spark").metadata.labels
    assert labels == {"topology.kubernetes.io/zone": "eu-1a", "topology.kubernetes.io/region": "eu-1"}


# --- reinvocation -----------------------------------------------------------------------------------------


def test_webhooks_with_reinvocation_if_needed_see_later_changes(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go: a webhook with
    `reinvocationPolicy: IfNeeded` is called again when a later webhook changed the object (after the
    in-tree plugins ran again); one with `Never` (the default) is called once."""
    label = [{"op": "add", "path": "/metadata/labels/first", "value": "1"}]
    first, never = TinyWebhook(patching(label)), TinyWebhook(patching(label))
    second = TinyWebhook(patching([{"op": "add", "path": "/metadata/labels/second", "value": "2"}]))
    try:
        cluster.store.create(
            "mutatingwebhookconfigurations", first.config("a.example.com", reinvocationPolicy="IfNeeded")
        )
        cluster.store.create("mutatingwebhookconfigurations", never.config("b.example.com"))
        cluster.store.create("mutatingwebhookconfigurations", second.config("c.example.com"))
        created = core.create_namespaced_pod("spark", executor_pod("e1"))
        assert created.metadata.labels["second"] == "2"
        assert [len(first.requests), len(never.requests), len(second.requests)] == [2, 1, 1]
        assert first.requests[1]["object"]["metadata"]["labels"]["second"] == "2"
    finally:
        for hook in (first, never, second):
            hook.close()


def test_namespace_lifecycle_comes_before_every_other_plugin(
    cluster: Cluster, core: client.CoreV1Api, mutating: Callable[[Patch], TinyWebhook]
) -> None:
    """NamespaceLifecycle is first in AllOrderedPlugins (staging/src/k8s.io/apiserver/pkg/admission/plugin/
    namespace/lifecycle/admission.go): a pod for a missing namespace is 404 NotFound, not a ServiceAccount
    refusal, and no webhook is called."""
    hook = mutating([])
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("nowhere", executor_pod("e1"))
    assert refusal(e) == (404, 'namespaces "nowhere" not found')
    assert hook.requests == []


def test_pod_security_on_update_checks_only_significant_changes(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """pod-security-admission admission.go isSignificantPodUpdate: a pod update is evaluated only when a
    container image changes; metadata changes of a pod made before the namespace enforced a level pass."""
    cluster.add_namespace("later")
    privileged = pod("p", schedulingGates=[{"name": "x/y"}])
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    core.create_namespaced_pod("later", privileged)
    core.patch_namespace(
        "later", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    )
    core.patch_namespaced_pod("p", "later", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(client.ApiException) as e:
        core.patch_namespaced_pod("p", "later", {"spec": {"containers": [{"name": "c", "image": "y"}]}})
    assert refusal(e) == (
        403,
        'pods "p" is forbidden: violates PodSecurity "baseline:latest": privileged (container "c" must not set '
        "securityContext.privileged=true)",
    )

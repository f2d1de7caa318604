"""kubesim's API server alone (no scheduler, kubelets or admission), through the official client and plain
HTTP: discovery, selectors, patches, pod rules, deletion, watches and faults, as kube-apiserver behaves."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from kubernetes import client, watch

from kubesim.errors import UserInfo
from kubesim.store import Store

from .conftest import Served, pod

Api = client.ApiException


def status_of(e: Api) -> dict[str, Any]:
    return json.loads(e.body)


@pytest.fixture
def core(apiserver: Served) -> client.CoreV1Api:
    return client.CoreV1Api(apiserver.client)


def raw(apiserver: Served, method: str, path: str, **kwargs: Any) -> requests.Response:
    headers = {"Authorization": "Bearer admin-token", **kwargs.pop("headers", {})}
    return requests.request(method, apiserver.server.url + path, headers=headers, timeout=30, **kwargs)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Re-checks `predicate` every 10 ms until it holds, failing after a generous `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s"
        threading.Event().wait(0.01)


def bound_pod(store: Store, name: str, **spec: Any) -> None:
    store.create("pods", pod(name, **spec), namespace="spark")
    store.bind("spark", name, "node-1")


def test_discovery_documents_the_client_reads(apiserver: Served) -> None:
    assert raw(apiserver, "GET", "/api").json()["versions"] == ["v1"]
    groups = {
        g["name"]: g["preferredVersion"]["version"] for g in raw(apiserver, "GET", "/apis").json()["groups"]
    }
    assert groups["coordination.k8s.io"] == "v1" and groups["admissionregistration.k8s.io"] == "v1"
    core_resources = {
        r["name"]: r["namespaced"] for r in raw(apiserver, "GET", "/api/v1").json()["resources"]
    }
    assert core_resources["pods"] and not core_resources["nodes"]
    leases = raw(apiserver, "GET", "/apis/coordination.k8s.io/v1").json()
    assert [r["kind"] for r in leases["resources"]] == ["Lease"]
    group = raw(apiserver, "GET", "/apis/coordination.k8s.io").json()
    assert (
        group["kind"] == "APIGroup" and group["preferredVersion"]["groupVersion"] == "coordination.k8s.io/v1"
    )
    missing = raw(apiserver, "GET", "/api/v1/namespaces/spark/widgets")
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


def test_an_unknown_token_is_401_with_a_status(apiserver: Served) -> None:
    answer = raw(apiserver, "GET", "/api/v1/pods", headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_a_namespaced_create_needs_the_namespace(core: client.CoreV1Api) -> None:
    """kube-apiserver's NamespaceLifecycle admission: creating in a missing namespace is 404 on it."""
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("nowhere", {"metadata": {"name": "c"}})
    assert e.value.status == 404 and status_of(e.value)["message"] == 'namespaces "nowhere" not found'


def test_set_based_label_selectors_and_field_selectors(core: client.CoreV1Api, apiserver: Served) -> None:
    """Label selectors (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/):
    =, ==, !=, in, notin, exists, !exists; field selectors on metadata.name, spec.nodeName, status.phase."""
    store = apiserver.store
    for name, labels in (("a", {"tier": "x", "app": "1"}), ("b", {"tier": "y"}), ("c", {"app": "2"})):
        store.create("pods", pod(name, labels), namespace="spark")
    store.bind("spark", "a", "node-1")

    def selected(**query: str) -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod("spark", **query).items)

    assert selected(label_selector="tier in (x,y)") == ["a", "b"]
    assert selected(label_selector="tier notin (x)") == ["b", "c"], "notin matches a missing label"
    assert selected(label_selector="app") == ["a", "c"]
    assert selected(label_selector="!app") == ["b"]
    assert selected(label_selector="tier!=x,app") == ["c"]
    assert selected(label_selector="tier==x") == ["a"]
    assert selected(field_selector="spec.nodeName=node-1") == ["a"]
    assert selected(field_selector="spec.nodeName=") == ["b", "c"], "unbound pods, as the scheduler lists"
    assert selected(field_selector="metadata.name!=a,status.phase=Pending") == ["b", "c"]
    with pytest.raises(Api) as e:
        core.list_namespaced_pod("spark", field_selector="spec.hostname=x")
    assert e.value.status == 400


def test_merge_and_strategic_merge_patches(core: client.CoreV1Api, apiserver: Served) -> None:
    """JSON merge patch (RFC 7386): null deletes a key, lists are replaced. Strategic merge patch: lists with
    a patch merge key merge by it (containers and schedulingGates by name), `$patch: delete` removes one."""
    apiserver.store.create(
        "pods",
        pod("p", {"keep": "1", "drop": "1"}, schedulingGates=[{"name": "a/x"}, {"name": "b/y"}]),
        namespace="spark",
    )
    core.api_client.set_default_header("Content-Type", "application/merge-patch+json")
    patched = core.patch_namespaced_pod("p", "spark", {"metadata": {"labels": {"drop": None, "new": "2"}}})
    assert patched.metadata.labels == {"keep": "1", "new": "2"}
    core.api_client.default_headers.pop("Content-Type")
    strategic = core.patch_namespaced_pod(
        "p",
        "spark",
        {
            "spec": {
                "schedulingGates": [{"$patch": "delete", "name": "a/x"}],
                "containers": [{"name": "c", "image": "y"}],
            }
        },
    )
    assert [g.name for g in strategic.spec.scheduling_gates] == ["b/y"]
    assert (
        strategic.spec.containers[0].image == "y"
        and strategic.spec.containers[0].resources.requests["cpu"] == "1"
    )


def test_a_failed_json_patch_test_is_422_and_changes_nothing(
    core: client.CoreV1Api, apiserver: Served
) -> None:
    """RFC 6902 section 5: if a `test` fails the whole patch is not applied; kube-apiserver answers 422."""
    apiserver.store.create("configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}}, namespace="spark")
    before = apiserver.store.get("configmaps", "spark", "c")
    with pytest.raises(Api) as e:
        core.patch_namespaced_config_map(
            "c",
            "spark",
            [
                {"op": "replace", "path": "/data/a", "value": "2"},
                {"op": "test", "path": "/data/a", "value": "1"},
            ],
        )
    status = status_of(e.value)
    assert e.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"] == "the server rejected our request due to an error in our request"
    assert apiserver.store.get("configmaps", "spark", "c") == before


def test_pod_spec_is_immutable_except_the_fields_the_server_allows(
    core: client.CoreV1Api, apiserver: Served
) -> None:
    """Pod update rules (https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement):
    image, activeDeadlineSeconds and toleration additions may change; other spec fields may not. Pod
    Scheduling Readiness: while gated, nodeSelector may gain entries; gates may only be removed."""
    apiserver.store.create("pods", pod("p", schedulingGates=[{"name": "a/x"}]), namespace="spark")
    ok = [
        {"op": "replace", "path": "/spec/containers/0/image", "value": "other"},
        {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 60},
        {"op": "add", "path": "/spec/tolerations", "value": [{"key": "k", "operator": "Exists"}]},
        {"op": "add", "path": "/spec/nodeSelector", "value": {"zone": "a"}},
    ]
    assert core.patch_namespaced_pod("p", "spark", ok).spec.node_selector == {"zone": "a"}
    for refused in (
        [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "2"}],
        [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "b/y"}}],
        [{"op": "replace", "path": "/spec/nodeSelector/zone", "value": "b"}],
        [{"op": "remove", "path": "/spec/tolerations/0"}],
    ):
        with pytest.raises(Api) as e:
            core.patch_namespaced_pod("p", "spark", refused)
        assert e.value.status == 422 and status_of(e.value)["reason"] == "Invalid", refused
    core.patch_namespaced_pod("p", "spark", [{"op": "remove", "path": "/spec/schedulingGates"}])
    with pytest.raises(Api) as e:
        core.patch_namespaced_pod(
            "p", "spark", [{"op": "add", "path": "/spec/nodeSelector/disk", "value": "ssd"}]
        )
    assert e.value.status == 422, "nodeSelector additions are for gated pods only"


def test_status_goes_through_its_subresource_only(core: client.CoreV1Api, apiserver: Served) -> None:
    """The status subresource changes only .status; an update of the main resource ignores .status."""
    apiserver.store.create("pods", pod("p"), namespace="spark")
    ignored = core.patch_namespaced_pod(
        "p", "spark", {"metadata": {"labels": {"a": "1"}}, "status": {"phase": "Running"}}
    )
    assert ignored.status.phase == "Pending" and ignored.metadata.labels == {"a": "1"}
    current = core.read_namespaced_pod("p", "spark")
    current.status.phase = "Running"
    current.spec.containers[0].image = "changed-through-status"
    updated = core.replace_namespaced_pod_status("p", "spark", current)
    assert updated.status.phase == "Running" and updated.spec.containers[0].image == "x"


def test_deletion_preconditions_grace_and_collections(core: client.CoreV1Api, apiserver: Served) -> None:
    """Graceful deletion (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination):
    a pod bound to a node gets a deletionTimestamp and stays until its kubelet removes it; gracePeriodSeconds=0
    or an unbound pod goes at once. Preconditions on uid and resourceVersion are 409 when they do not hold."""
    store = apiserver.store
    bound_pod(store, "running")
    store.create("pods", pod("pending"), namespace="spark")
    stale = store.get("pods", "spark", "running")["metadata"]["resourceVersion"]
    store.patch(
        "pods", "spark", "running", {"metadata": {"labels": {"x": "1"}}}, "application/merge-patch+json"
    )
    with pytest.raises(Api) as e:
        core.delete_namespaced_pod("running", "spark", body={"preconditions": {"resourceVersion": stale}})
    current = store.get("pods", "spark", "running")["metadata"]["resourceVersion"]
    assert e.value.status == 409 and status_of(e.value)["message"] == (
        f'Operation cannot be fulfilled on Pod "running": the ResourceVersion in the precondition ({stale}) '
        f"does not match the ResourceVersion in record ({current}). The object might have been modified"
    )  # registry/rest/delete.go BeforeDelete
    with pytest.raises(Api) as e:
        core.delete_namespaced_pod("running", "spark", body={"preconditions": {"uid": "u-0"}})
    uid = store.get("pods", "spark", "running")["metadata"]["uid"]
    assert status_of(e.value)["message"] == (
        f'Operation cannot be fulfilled on Pod "running": the UID in the precondition (u-0) does not match the '
        f"UID in record ({uid}). The object might have been deleted and then recreated"
    )
    assert status_of(e.value)["details"] == {"name": "running", "kind": "Pod"}
    core.delete_namespaced_pod("running", "spark", grace_period_seconds=30)
    marked = core.read_namespaced_pod("running", "spark").metadata
    assert marked.deletion_timestamp and marked.deletion_grace_period_seconds == 30
    core.delete_namespaced_pod("running", "spark", grace_period_seconds=0)
    core.delete_namespaced_pod("pending", "spark")
    assert core.list_namespaced_pod("spark").items == []
    for i in range(3):
        store.create(
            "configmaps", {"metadata": {"name": f"c{i}", "labels": {"n": str(i)}}}, namespace="spark"
        )
    core.delete_collection_namespaced_config_map("spark", label_selector="n in (0,2)")
    assert [c.metadata.name for c in core.list_namespaced_config_map("spark").items] == ["c1"]


def test_watch_over_http_with_selector_transitions_and_the_initial_state(
    core: client.CoreV1Api, apiserver: Served
) -> None:
    """A watch without a resourceVersion starts with ADDED for what exists; an object that stops matching
    the selector is DELETED for this watcher, as the watch cache does."""
    store = apiserver.store
    store.create("configmaps", {"metadata": {"name": "a", "labels": {"w": "1"}}}, namespace="spark")
    seen: list[tuple[str, str]] = []
    started = threading.Event()

    def consume() -> None:
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_config_map, "spark", label_selector="w=1", timeout_seconds=20
        ):
            seen.append((event["type"], event["object"].metadata.name))
            started.set()
            if len(seen) == 3:
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(20)
    store.create("configmaps", {"metadata": {"name": "b", "labels": {"w": "1"}}}, namespace="spark")
    store.patch(
        "configmaps", "spark", "a", {"metadata": {"labels": {"w": "0"}}}, "application/merge-patch+json"
    )
    t.join(30)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]


def test_faults_per_verb_resource_and_namespace_and_dropped_watches(
    core: client.CoreV1Api, apiserver: Served
) -> None:
    faults, log = apiserver.server.faults, apiserver.server.log
    faults.fail("list", "pods", 500, count=2, namespace="spark")
    for _ in range(2):
        with pytest.raises(Api) as e:
            core.list_namespaced_pod("spark")
        assert e.value.status == 500 and status_of(e.value)["reason"] == "InternalError"
    core.list_namespaced_pod("default")
    core.list_namespaced_pod("spark")
    faults.fail("create", "pods/binding", 409)
    apiserver.store.create("pods", pod("p"), namespace="spark")
    body = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}
    with pytest.raises(Api) as e:
        core.create_namespaced_pod_binding("p", "spark", body, _preload_content=False)
    assert e.value.status == 409
    core.create_namespaced_pod_binding("p", "spark", body, _preload_content=False)
    binding = [e for e in log.entries() if e.resource == "pods/binding"]
    assert [(e.verb, e.subresource, e.name, e.code) for e in binding] == [
        ("create", "binding", "p", 409),
        ("create", "binding", "p", 201),
    ]
    assert [e.code for e in log.entries() if e.verb == "list"] == [500, 500, 200, 200]

    opened = threading.Event()
    ended = threading.Event()

    def hold() -> None:
        response = raw(
            apiserver, "GET", "/api/v1/namespaces/spark/pods?watch=true&resourceVersion=0", stream=True
        )
        opened.set()
        for _ in response.iter_lines():
            pass
        ended.set()

    threading.Thread(target=hold, daemon=True).start()
    assert opened.wait(20)
    apiserver.server.faults.drop_watches("configmaps")
    assert not ended.is_set()
    assert apiserver.server.faults.drop_watches("pods") == 1
    assert ended.wait(20), "the dropped stream ends for the client"


def test_users_are_told_apart_in_the_request_log(apiserver: Served) -> None:
    apiserver.server.add_user("driver-token", UserInfo("system:serviceaccount:spark:driver"))
    answer = raw(
        apiserver,
        "GET",
        "/api/v1/namespaces/spark/configmaps?limit=1",
        headers={"Authorization": "Bearer driver-token"},
    )
    assert answer.status_code == 200 and answer.json()["kind"] == "ConfigMapList"
    last = apiserver.server.log.entries()[-1]
    assert (last.user, last.verb, last.resource, last.namespace, last.query) == (
        "system:serviceaccount:spark:driver",
        "list",
        "configmaps",
        "spark",
        "limit=1",
    )
    assert apiserver.server.log.count(user="system:serviceaccount:spark:driver") == 1


def test_names_and_labels_are_validated_as_the_real_server_does(core: client.CoreV1Api) -> None:
    """Object names are DNS-1123 subdomains (namespaces: labels); label keys are qualified names with an
    optional DNS subdomain prefix, values at most 63 characters
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/ and .../labels/#syntax-and-character-set)."""
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("spark", {"metadata": {"name": "Spark_App"}})
    assert e.value.status == 422
    assert status_of(e.value)["message"].startswith(
        'ConfigMap "Spark_App" is invalid: metadata.name: Invalid value: "Spark_App": a lowercase RFC 1123 subdomain'
    )
    with pytest.raises(Api) as e:
        core.create_namespace({"metadata": {"name": "a.b"}})
    assert e.value.status == 422 and "RFC 1123 label" in status_of(e.value)["message"]
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("spark", {"metadata": {"name": "c", "labels": {"app": "x" * 64}}})
    assert e.value.status == 422 and "must be no more than 63 characters" in status_of(e.value)["message"]
    core.create_namespaced_config_map(
        "spark",
        {"metadata": {"name": "spark-0123.conf", "labels": {"sparkgate.io/profile": "Big_1", "e": ""}}},
    )
    with pytest.raises(Api) as e:
        core.patch_namespaced_config_map(
            "spark-0123.conf", "spark", {"metadata": {"labels": {"bad key": "v"}}}
        )
    assert e.value.status == 422, "updates are validated too"


def test_deleting_a_namespace_deletes_its_contents_first(core: client.CoreV1Api, apiserver: Served) -> None:
    """Namespace deletion (https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/):
    the namespace turns Terminating, refuses new content (403), its objects are deleted (running pods
    gracefully), and it disappears once empty. default and kube-system cannot be deleted."""
    store = apiserver.store
    core.create_namespace({"metadata": {"name": "gone"}})
    store.create("configmaps", {"metadata": {"name": "c"}}, namespace="gone")
    store.create("pods", pod("running"), namespace="gone")
    store.bind("gone", "running", "node-1")
    terminating = core.delete_namespace("gone", _preload_content=False)
    assert json.loads(terminating.data)["status"]["phase"] == "Terminating"
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("gone", {"metadata": {"name": "late"}})
    assert e.value.status == 403 and "because it is being terminated" in status_of(e.value)["message"]
    # NamespaceLifecycle's answer word for word, a dry run's too (k8s.io/apiserver
    # plugin/namespace/lifecycle/admission.go `Admit`: admission.NewForbidden plus the cause
    # NamespaceTerminating, serialized as StatusCause's `reason`).
    with pytest.raises(Api) as e:
        core.create_namespaced_pod("gone", pod("probe"), dry_run="All")
    status = status_of(e.value)
    assert (e.value.status, status["reason"], status["message"]) == (
        403,
        "Forbidden",
        'pods "probe" is forbidden: unable to create new content in namespace gone because it is being terminated',
    )
    assert status["details"] == {
        "name": "probe",
        "kind": "pods",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace gone is being terminated",
                "field": "metadata.namespace",
            }
        ],
    }
    assert [p.metadata.name for p in core.list_namespaced_pod("gone").items] == ["running"]
    assert core.list_namespaced_config_map("gone").items == []
    assert core.read_namespace("gone").status.phase == "Terminating"
    store.delete("pods", "gone", "running", grace_period_seconds=0)  # what the kubelet does after the grace
    with pytest.raises(Api) as e:
        core.read_namespace("gone")
    assert e.value.status == 404
    with pytest.raises(Api) as e:
        core.delete_namespace("default")
    assert e.value.status == 403


def test_a_hang_answers_nothing_applies_nothing_and_ends_on_resume(apiserver: Served) -> None:
    """faults.hang: matching requests wait without an answer (not refused), are dropped unanswered when the
    hang ends, and change nothing; other requests, and later ones, are served."""
    faults = apiserver.server.faults
    faults.hang("create", "configmaps")
    outcome: list[BaseException | int] = []

    def create() -> None:
        try:
            outcome.append(
                raw(
                    apiserver,
                    "POST",
                    "/api/v1/namespaces/spark/configmaps",
                    json={"metadata": {"name": "hung"}},
                ).status_code
            )
        except requests.RequestException as e:
            outcome.append(e)

    writer = threading.Thread(target=create, daemon=True)
    writer.start()
    wait_until(lambda: faults.holding() == 1)
    assert raw(apiserver, "GET", "/api/v1/namespaces/spark/configmaps").status_code == 200  # reads go on
    assert writer.is_alive() and outcome == [], "no answer while the hang lasts"
    faults.resume()
    writer.join(timeout=20)
    assert len(outcome) == 1 and isinstance(outcome[0], requests.ConnectionError), outcome
    assert apiserver.store.list_objects("configmaps", "spark")[0] == [], "the hung write was not applied"
    hung = [e for e in apiserver.server.log.entries() if e.verb == "create"]
    assert [(e.code, e.applied_write, e.resource_version) for e in hung] == [(0, False, 0)]
    created = raw(
        apiserver, "POST", "/api/v1/namespaces/spark/configmaps", json={"metadata": {"name": "after"}}
    )
    assert created.status_code == 201


def test_the_request_log_names_the_pod_of_a_bound_token_and_orders_writes_as_committed(
    apiserver: Served,
) -> None:
    """Two replicas of one service account, told apart by the pod their tokens are bound to (the user's
    extra `authentication.kubernetes.io/pod-name`); each write carries the resourceVersion it was
    committed at."""
    sa = "system:serviceaccount:sparkgate-system:sparkgate-allocator"
    for pod_name in ("alloc-a", "alloc-b"):
        apiserver.server.add_user(f"{pod_name}-token", UserInfo(sa, pod_name, (), pod_name))
    for pod_name in ("alloc-a", "alloc-b", "alloc-a"):
        answer = raw(
            apiserver,
            "POST",
            "/api/v1/namespaces/spark/configmaps",
            json={"metadata": {"generateName": "w-"}},
            headers={"Authorization": f"Bearer {pod_name}-token"},
        )
        assert answer.status_code == 201
    writes = [e for e in apiserver.server.log.entries() if e.applied_write]
    assert [(e.user, e.identity) for e in writes] == [(sa, "alloc-a"), (sa, "alloc-b"), (sa, "alloc-a")]
    stored = sorted(
        int(o["metadata"]["resourceVersion"]) for o in apiserver.store.list_objects("configmaps", "spark")[0]
    )
    assert [e.resource_version for e in writes] == stored
    assert UserInfo(sa, "u", (), "alloc-a").review()["extra"] == {
        "authentication.kubernetes.io/pod-name": ["alloc-a"]
    }

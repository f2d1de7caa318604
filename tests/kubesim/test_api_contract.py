"""kubesim's API server, driven only through the official client and plain HTTP, as kube-apiserver behaves."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import requests
from kubernetes import client, watch

from kubesim.cluster import Cluster

from .conftest import pod

Api = client.ApiException


def status_of(e: Api) -> dict[str, Any]:
    return json.loads(e.body)


def test_crud_uid_resource_version_and_generate_name(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod(
        "spark", {"metadata": {"generateName": "exec-"}, "spec": {"containers": [{"name": "c"}]}}
    )
    assert created.metadata.name.startswith("exec-") and len(created.metadata.name) > 5
    assert created.metadata.uid and created.metadata.creation_timestamp and created.status.phase == "Pending"
    other = core.create_namespaced_config_map("spark", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    assert int(other.metadata.resource_version) > int(created.metadata.resource_version), "one global counter"
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("spark", {"metadata": {"name": "cm"}})
    assert e.value.status == 409 and status_of(e.value)["reason"] == "AlreadyExists"
    with pytest.raises(Api) as e:
        core.read_namespaced_pod("nope", "spark")
    assert e.value.status == 404 and status_of(e.value)["message"] == 'pods "nope" not found'
    with pytest.raises(Api) as e:
        core.create_namespaced_config_map("no-such-ns", {"metadata": {"name": "cm"}})
    assert e.value.status == 404


def test_stale_update_is_a_conflict(core: client.CoreV1Api) -> None:
    """Optimistic concurrency: an update with an old resourceVersion gets 409 Conflict."""
    cm = core.create_namespaced_config_map("spark", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    core.replace_namespaced_config_map(
        "cm",
        "spark",
        {"metadata": {"name": "cm", "resourceVersion": cm.metadata.resource_version}, "data": {"a": "2"}},
    )
    with pytest.raises(Api) as e:
        core.replace_namespaced_config_map(
            "cm",
            "spark",
            {"metadata": {"name": "cm", "resourceVersion": cm.metadata.resource_version}, "data": {"a": "3"}},
        )
    assert e.value.status == 409 and "the object has been modified" in status_of(e.value)["message"]


def test_label_and_field_selectors_and_paging(core: client.CoreV1Api, cluster: Cluster) -> None:
    for i in range(7):
        role = "executor" if i % 2 else "driver"
        core.create_namespaced_pod("spark", pod(f"p{i}", {"spark-role": role, "i": str(i)}))
    assert len(core.list_namespaced_pod("spark", label_selector="spark-role=executor").items) == 3
    assert len(core.list_namespaced_pod("spark", label_selector="spark-role!=executor").items) == 4
    assert len(core.list_namespaced_pod("spark", label_selector="i in (1,2,9),spark-role").items) == 2
    assert len(core.list_namespaced_pod("spark", label_selector="i notin (1,2),!missing").items) == 5
    assert [
        p.metadata.name for p in core.list_namespaced_pod("spark", field_selector="metadata.name=p3").items
    ] == ["p3"]
    cluster.wait_for(
        lambda: len(cluster.store.list_objects("pods", field_selector="status.phase=Running")[0]) == 7
    )
    assert (
        len(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1").items)
        + len(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-2").items)
        == 7
    )
    names, token = [], None
    while True:
        page = core.list_namespaced_pod("spark", limit=3, _continue=token)
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [f"p{i}" for i in range(7)]
    with pytest.raises(Api) as e:
        core.list_namespaced_pod("spark", field_selector="spec.unknown=x")
    assert e.value.status == 400


def test_watch_resumes_from_a_resource_version_with_bookmarks(core: client.CoreV1Api) -> None:
    """A watch from resourceVersion R delivers every change after R, in order; bookmarks carry the latest."""
    gate = [{"name": "x/y"}]  # gated, so the scheduler does not change them meanwhile
    core.create_namespaced_pod("spark", pod("a", schedulingGates=gate))
    rv = core.list_namespaced_pod("spark").metadata.resource_version
    core.create_namespaced_pod("spark", pod("b", schedulingGates=gate))
    core.patch_namespaced_pod("a", "spark", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("b", "spark")
    seen: list[tuple[str, str | None]] = []
    # A long server timeout, stopped once the four changes and a bookmark arrived: a pause of the busy
    # test process cannot end the watch before they are sent.
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod, "spark", resource_version=rv, timeout_seconds=30, allow_watch_bookmarks=True
    ):
        seen.append((event["type"], event["object"].metadata.name if event["type"] != "BOOKMARK" else None))
        if ("BOOKMARK", None) in seen and len([s for s in seen if s[0] != "BOOKMARK"]) >= 4:
            w.stop()
    changes = [s for s in seen if s[0] != "BOOKMARK"]
    # A pod's deletion is two writes, grace 0 included (registry/rest/delete.go BeforeDelete: "The deletion
    # operation happens in two phases"): its deletionTimestamp (MODIFIED), then its removal (DELETED).
    assert changes == [("ADDED", "b"), ("MODIFIED", "a"), ("MODIFIED", "b"), ("DELETED", "b")]
    assert ("BOOKMARK", None) in seen


def test_a_compacted_resource_version_is_an_error_event_and_compaction_ends_open_watches(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """As the watch cache answers (cacher.go `Watch`: a version too old is "a watch event of type ERROR,
    rather than a directly returned error"): 200, then one ERROR event carrying 410 Expired; the official
    client raises it as an ApiException. An open watch whose history is compacted away just ends (no event),
    and the version it resumes from gets that ERROR."""
    rv = core.list_namespaced_pod("spark").metadata.resource_version
    core.create_namespaced_pod("spark", pod("a"))
    cluster.store.compact()
    with pytest.raises(Api) as e:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, "spark", resource_version=rv, timeout_seconds=1
        ):
            pass
    assert e.value.status == 410
    token = cluster.kubeconfig().read_text().split("token: ")[1].split()[0]

    def watch_from(version: str) -> requests.Response:
        return requests.get(
            f"{cluster.url}/api/v1/namespaces/spark/pods",
            params={"watch": "true", "resourceVersion": version, "timeoutSeconds": "30"},
            headers={"Authorization": f"Bearer {token}"},
            stream=True,
            timeout=60,
        )

    gone = watch_from(rv)
    assert gone.status_code == 200
    (line,) = [json.loads(line) for line in gone.iter_lines() if line]
    assert line["type"] == "ERROR" and line["object"]["code"] == 410 and line["object"]["reason"] == "Expired"
    assert line["object"]["message"].startswith("too old resource version: ")
    current = core.list_namespaced_pod("spark").metadata.resource_version
    response = watch_from(current)
    # The response has started, so the watch is open at `current`: compacting now ends it, with no event.
    assert response.status_code == 200
    cluster.store.compact()
    assert [line for line in response.iter_lines() if line] == []
    (line,) = [json.loads(line) for line in watch_from(current).iter_lines() if line]
    assert line["type"] == "ERROR" and line["object"]["code"] == 410


def test_json_patch_test_failure_is_422_and_gates_only_shrink(core: client.CoreV1Api) -> None:
    """Pod Scheduling Readiness: schedulingGates can only be removed after creation."""
    core.create_namespaced_pod("spark", pod("g", schedulingGates=[{"name": "a/one"}, {"name": "b/two"}]))
    with pytest.raises(Api) as e:
        core.patch_namespaced_pod(
            "g",
            "spark",
            [
                {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "b/two"},
                {"op": "remove", "path": "/spec/schedulingGates/0"},
            ],
        )
    assert e.value.status == 422
    core.patch_namespaced_pod(
        "g",
        "spark",
        [
            {"op": "test", "path": "/spec/schedulingGates/1/name", "value": "b/two"},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ],
    )
    assert [g.name for g in core.read_namespaced_pod("g", "spark").spec.scheduling_gates] == ["a/one"]
    with pytest.raises(Api) as e:
        core.patch_namespaced_pod(
            "g", "spark", [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "c"}}]
        )
    assert e.value.status == 422 and "only deletion is allowed" in status_of(e.value)["message"]
    with pytest.raises(Api) as e:
        core.patch_namespaced_pod(
            "g", "spark", {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]}}
        )
    assert e.value.status == 422, "pod resources are immutable"


def test_binding_rules(core: client.CoreV1Api, cluster: Cluster) -> None:
    """A gated pod cannot be bound; a bound pod cannot be bound again."""
    core.create_namespaced_pod("spark", pod("g", schedulingGates=[{"name": "x/y"}]))
    body = {"metadata": {"name": "g"}, "target": {"name": "node-1"}}
    with pytest.raises(Api) as e:
        core.create_namespaced_pod_binding("g", "spark", body, _preload_content=False)
    assert e.value.status == 409 and "schedulingGates" in status_of(e.value)["message"]
    core.patch_namespaced_pod("g", "spark", [{"op": "remove", "path": "/spec/schedulingGates"}])
    cluster.wait_for(lambda: bool(cluster.store.get("pods", "spark", "g")["spec"].get("nodeName")))
    with pytest.raises(Api) as e:
        core.create_namespaced_pod_binding("g", "spark", body, _preload_content=False)
    assert e.value.status == 409 and "already assigned" in status_of(e.value)["message"]


def test_graceful_deletion_preconditions_finalizers_and_gc(core: client.CoreV1Api, cluster: Cluster) -> None:
    owner = core.create_namespaced_pod("spark", pod("driver"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": owner.metadata.uid}
    core.create_namespaced_pod(
        "spark", {**pod("exec-1"), "metadata": {"name": "exec-1", "ownerReferences": [ref]}}
    )
    core.create_namespaced_config_map("spark", {"metadata": {"name": "cm", "ownerReferences": [ref]}})
    core.create_namespaced_config_map("spark", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
    with pytest.raises(Api) as e:
        core.delete_namespaced_pod("driver", "spark", body={"preconditions": {"uid": "wrong"}})
    assert e.value.status == 409
    cluster.wait_for(lambda: cluster.store.get("pods", "spark", "driver")["status"]["phase"] == "Running")
    deleting = core.delete_namespaced_pod("driver", "spark", _preload_content=False)
    assert json.loads(deleting.data)["metadata"]["deletionTimestamp"], "a running pod is deleted gracefully"
    cluster.wait_for(
        lambda: not cluster.store.list_objects("pods", "spark")[0], what="driver and its executor gone"
    )
    assert [c["metadata"]["name"] for c in cluster.store.list_objects("configmaps", "spark")[0]] == ["held"]
    core.delete_namespaced_config_map("held", "spark")
    assert core.read_namespaced_config_map("held", "spark").metadata.deletion_timestamp
    core.patch_namespaced_config_map("held", "spark", {"metadata": {"finalizers": None}})
    with pytest.raises(Api):
        core.read_namespaced_config_map("held", "spark")


def test_faults_requests_log_and_users(core: client.CoreV1Api, cluster: Cluster) -> None:
    cluster.faults.fail("create", "pods", 429, retry_after=1)
    with pytest.raises(Api) as e:
        core.create_namespaced_pod("spark", pod("a"))
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "1"
    core.create_namespaced_pod("spark", pod("a"))  # the fault was for one request only
    assert cluster.requests.count(verb="create", resource="pods", user="admin") == 2
    assert [e.code for e in cluster.requests.entries() if e.verb == "create"] == [429, 201]
    other = client.CoreV1Api(client.ApiClient(client.Configuration(host=cluster.url)))
    with pytest.raises(Api) as e:
        other.list_namespaced_pod("spark")
    assert e.value.status == 401


def test_leases_and_webhook_configurations(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = leases.create_namespaced_lease(
        "sparkgate-system",
        {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}},
    )
    with pytest.raises(Api) as e:
        leases.replace_namespaced_lease(
            "l",
            "sparkgate-system",
            {
                "metadata": {"name": "l", "resourceVersion": str(int(lease.metadata.resource_version) - 1)},
                "spec": {"holderIdentity": "b"},
            },
        )
    assert e.value.status == 409
    admission = client.AdmissionregistrationV1Api(api)
    admission.create_mutating_webhook_configuration(
        {
            "metadata": {"name": "m"},
            "webhooks": [
                {
                    "name": "a.x.io",
                    "clientConfig": {"url": "https://127.0.0.1:1/"},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                },
                {
                    "name": "b.x.io",
                    "clientConfig": {"url": "https://127.0.0.1:1/"},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                },
            ],
        }
    )
    admission.patch_mutating_webhook_configuration(
        "m", {"webhooks": [{"name": "b.x.io", "clientConfig": {"caBundle": "Y2E="}}]}
    )
    hooks = admission.read_mutating_webhook_configuration("m").webhooks
    assert [h.name for h in hooks] == ["a.x.io", "b.x.io"], "strategic merge keyed by name keeps the list"
    assert hooks[1].client_config.ca_bundle == "Y2E=" and hooks[1].client_config.url


def test_ten_thousand_pods_list_and_several_watchers(cluster: Cluster, core: client.CoreV1Api) -> None:
    for i in range(10_000):
        cluster.store.create(
            "pods",
            {
                "metadata": {"name": f"p{i}", "namespace": "spark", "labels": {"spark-role": "executor"}},
                "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": "x/y"}]},
            },
        )
    response = core.list_namespaced_pod("spark", _preload_content=False)
    document = json.loads(response.data)
    assert len(document["items"]) == 10_000
    rv = document["metadata"]["resourceVersion"]
    results: list[list[str]] = [[] for _ in range(3)]

    def consume(out: list[str]) -> None:
        # A long server timeout, stopped after the 50 changes: the busy machine cannot end it before.
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_pod, "spark", resource_version=rv, timeout_seconds=60):
            out.append(event["object"].metadata.name)
            if len(out) == 50:
                w.stop()

    threads = [threading.Thread(target=consume, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for i in range(50):
        cluster.store.patch(
            "pods", "spark", f"p{i}", {"metadata": {"labels": {"seen": "1"}}}, "application/merge-patch+json"
        )
    for t in threads:
        t.join()
    for out in results:
        assert out == [f"p{i}" for i in range(50)], "every watcher, every event, in order"

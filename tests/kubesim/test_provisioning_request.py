"""ProvisioningRequests in kubesim: the CRD served (only with the autoscaler), its validation, and CA's two
classes with their conditions (kubernetes-sigs/cluster-autoscaler pkg/provisioningrequest/, pkg/processors/
provreq/; apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml). Over HTTP with the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kubesim import provreq
from kubesim.cluster import Cluster
from kubesim.nodegroups import NodeGroup

from .test_autoscaler import autoscaled, core, executor, nodes

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"


def custom(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig())))


def get(cluster: Cluster, path: str) -> requests.Response:
    """A GET as the admin (discovery, as a client reads it before it uses a group)."""
    token = yaml.safe_load(cluster.kubeconfig().read_text())["users"][0]["user"]["token"]
    return requests.get(cluster.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def message(error: ApiException) -> str:
    return str(json.loads(error.body)["message"])


def template(api: client.CoreV1Api, name: str = "executor", cpu: str = "2") -> None:
    pod = executor("ignored", cpu=cpu, gated=False)
    api.create_namespaced_pod_template(
        "spark", {"metadata": {"name": name}, "template": {"spec": pod["spec"]}}
    )


def request(
    name: str, cls: str, count: int, template_name: str = "executor", **parameters: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provisioningClassName": cls,
        "podSets": [{"podTemplateRef": {"name": template_name}, "count": count}],
    }
    if parameters:
        spec["parameters"] = parameters
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(cluster: Cluster, body: dict[str, Any]) -> None:
    custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "spark", PLURAL, body)


def conditions(cluster: Cluster, name: str) -> dict[str, tuple[str, str, str]]:
    pr = cluster.store.get(PLURAL, "spark", name)
    return {
        c["type"]: (c["status"], c["reason"], c["message"])
        for c in (pr.get("status") or {}).get("conditions") or []
    }


def has(cluster: Cluster, name: str, kind: str, status: str, reason: str) -> bool:
    found = conditions(cluster, name).get(kind)
    return found is not None and found[:2] == (status, reason)


# --- the API --------------------------------------------------------------------------------------------


def test_the_crd_is_served_only_with_the_autoscaler() -> None:
    """Discovery tells a client whether the CRD is served: the group in /apis, its APIResourceList (with the
    status subresource); a cluster without cluster-autoscaler's CRD answers 404."""
    with Cluster(nodes=1, namespaces=("default", "spark")) as plain:
        assert get(plain, f"/apis/{GROUP}/{VERSION}").status_code == 404
        assert GROUP not in [g["name"] for g in get(plain, "/apis").json()["groups"]]
        assert get(plain, f"/apis/{GROUP}/{VERSION}/namespaces/spark/{PLURAL}").status_code == 404
        assert "podtemplates" in [r["name"] for r in get(plain, "/api/v1").json()["resources"]]
    with autoscaled() as cluster:
        listed = get(cluster, f"/apis/{GROUP}/{VERSION}").json()
        assert listed["kind"] == "APIResourceList"
        assert {r["name"]: r["namespaced"] for r in listed["resources"]} == {
            PLURAL: True,
            f"{PLURAL}/status": True,
        }
        assert GROUP in [g["name"] for g in get(cluster, "/apis").json()["groups"]]


def test_the_crd_validates_and_keeps_its_spec() -> None:
    """The CRD's schema (count minimum 1, podSets 1..32, class a DNS subdomain) and its transition rules
    `self == oldSelf` ("Value is immutable"); the status subresource: status dropped at creation, kept by an
    update of the main resource, the only thing an update of /status changes."""
    with autoscaled(provisioning_delay=3600.0) as cluster:
        api = custom(cluster)
        with pytest.raises(ApiException) as bad:
            create(cluster, request("bad", provreq.CHECK_CAPACITY, 0))
        assert bad.value.status == 422
        assert (
            "spec.podSets[0].count: Invalid value: 0: spec.podSets[0].count in body should be greater than or equal to 1"
            in message(bad.value)
        )
        with pytest.raises(ApiException) as empty:
            create(
                cluster,
                {
                    **request("empty", "Not_A_Class", 1),
                    "spec": {"provisioningClassName": "Not_A_Class", "podSets": []},
                },
            )
        assert "spec.podSets: Invalid value: 0: spec.podSets in body should have at least 1 items" in message(
            empty.value
        )
        assert 'spec.provisioningClassName: Invalid value: "Not_A_Class"' in message(empty.value)
        body = {**request("pr", "example.com", 1), "status": {"conditions": [{"type": "Provisioned"}]}}
        created = api.create_namespaced_custom_object(GROUP, VERSION, "spark", PLURAL, body)
        assert "status" not in created
        changed = {
            **created,
            "spec": {**created["spec"], "podSets": [{"podTemplateRef": {"name": "other"}, "count": 1}]},
        }
        with pytest.raises(ApiException) as immutable:
            api.replace_namespaced_custom_object(GROUP, VERSION, "spark", PLURAL, "pr", changed)
        assert (
            'ProvisioningRequest.autoscaling.x-k8s.io "pr" is invalid: spec.podSets: Invalid value: "array": Value is immutable'
            in message(immutable.value)
        )
        status = {
            **created,
            "status": {"conditions": [{"type": "Failed", "status": "True"}]},
            "metadata": {**created["metadata"], "labels": {"a": "b"}},
        }
        written = api.replace_namespaced_custom_object_status(GROUP, VERSION, "spark", PLURAL, "pr", status)
        assert written["status"]["conditions"][0]["type"] == "Failed" and "labels" not in written["metadata"]
        relabelled = api.patch_namespaced_custom_object(
            GROUP, VERSION, "spark", PLURAL, "pr", {"metadata": {"labels": {"a": "b"}}, "status": None}
        )
        assert relabelled["metadata"]["labels"] == {"a": "b"} and relabelled["status"] == written["status"]


# --- the classes ----------------------------------------------------------------------------------------


def test_check_capacity_only_checks() -> None:
    """checkcapacity/provisioningclass.go: Accepted, then Provisioned=True CapacityIsFound when the pods fit
    the nodes, Provisioned=False CapacityIsNotFound when not (Failed=True with noRetry); never a scale-up."""
    with autoscaled(nodes=1) as cluster:
        template(core(cluster))
        create(cluster, request("fits", provreq.CHECK_CAPACITY, 3))
        cluster.wait_for(lambda: has(cluster, "fits", "Provisioned", "True", "CapacityIsFound"))
        assert conditions(cluster, "fits")["Accepted"] == ("True", "Accepted", provreq.ACCEPTED_MSG)
        assert conditions(cluster, "fits")["Provisioned"][2] == "Capacity is found in the cluster"
        create(cluster, request("too-big", provreq.CHECK_CAPACITY, 9))
        cluster.wait_for(lambda: has(cluster, "too-big", "Provisioned", "False", "CapacityIsNotFound"))
        assert (
            conditions(cluster, "too-big")["Provisioned"][2]
            == "Capacity is not found, CA will try to find it later."
        )
        create(cluster, request("no-retry", provreq.CHECK_CAPACITY, 9, noRetry="true"))
        cluster.wait_for(lambda: has(cluster, "no-retry", "Failed", "True", "CapacityIsNotFound"))
        assert conditions(cluster, "no-retry")["Failed"][2] == "CA could not find requested capacity"
        assert (
            cluster.autoscaler is not None and cluster.autoscaler.rounds == 0 and nodes(cluster) == ["node-1"]
        )


def test_best_effort_atomic_scales_up_and_the_consumers_land_on_the_booking() -> None:
    """besteffortatomic/provisioning_class.go: all of the request's pods or nothing (Provisioned=True
    CapacityIsProvisioned, one plan 0->4); the pods annotated to consume it, released later, are scheduled on
    the new nodes, and once they are all bound the booking is consumed (processor.go `bookCapacity`:
    BookingExpired=True CapacityBookingConsumed). Marked Unschedulable while they wait, they trigger no
    scale-up of their own (pods_filter.go)."""
    with autoscaled() as cluster:
        api = core(cluster)
        template(api)
        annotations = {
            provreq.CONSUME_ANNOTATION: "app",
            provreq.CLASS_ANNOTATION: provreq.BEST_EFFORT_ATOMIC,
        }
        names = [f"exec-{i}" for i in range(4)]
        for name in names:
            api.create_namespaced_pod("spark", executor(name, **annotations))
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "held",
            }
            api.patch_namespaced_pod_status(
                name,
                "spark",
                {"status": {"conditions": [condition]}},
                _content_type="application/strategic-merge-patch+json",
            )
        create(cluster, request("app", provreq.BEST_EFFORT_ATOMIC, 4))
        cluster.wait_for(lambda: has(cluster, "app", "Provisioned", "True", "CapacityIsProvisioned"))
        assert cluster.autoscaler is not None and cluster.autoscaler.plans == [{"ng-small": (0, 4)}]
        assert conditions(cluster, "app")["Accepted"][:2] == ("True", "Accepted")
        cluster.wait_for(lambda: len(nodes(cluster)) == 4)
        for name in names:
            api.patch_namespaced_pod(
                name,
                "spark",
                {"spec": {"schedulingGates": None}},
                _content_type="application/merge-patch+json",
            )
        cluster.wait_for(lambda: has(cluster, "app", "BookingExpired", "True", "CapacityBookingConsumed"))
        placed = {cluster.store.get("pods", "spark", n)["spec"]["nodeName"] for n in names}
        assert placed == {f"ng-small-{i}" for i in range(1, 5)} and cluster.autoscaler.rounds == 1


def test_best_effort_atomic_asks_for_all_or_nothing() -> None:
    """Six pods, a group of at most four nodes: no scale-up at all, Provisioned=False CapacityIsNotFound."""
    with autoscaled(NodeGroup("ng-small", max_size=4, cpu="2", memory="8Gi")) as cluster:
        template(core(cluster))
        create(cluster, request("app", provreq.BEST_EFFORT_ATOMIC, 6))
        cluster.wait_for(lambda: has(cluster, "app", "Provisioned", "False", "CapacityIsNotFound"))
        assert cluster.autoscaler is not None and cluster.autoscaler.rounds == 0


def test_the_booking_expires() -> None:
    """processor.go `refresh`: a request Provisioned longer than the reservation time (10 minutes in CA) gets
    BookingExpired=True CapacityReservationTimeExpired."""
    with autoscaled(nodes=1, booking_time=0.5) as cluster:
        template(core(cluster))
        create(cluster, request("app", provreq.CHECK_CAPACITY, 1))
        cluster.wait_for(lambda: has(cluster, "app", "Provisioned", "True", "CapacityIsFound"))
        cluster.wait_for(
            lambda: has(cluster, "app", "BookingExpired", "True", "CapacityReservationTimeExpired"),
            timeout=30,
        )
        assert conditions(cluster, "app")["BookingExpired"][2] == "Capacity reservation time is expired"


def test_a_missing_template_fails_the_request() -> None:
    """injector.go: pods that cannot be made from the request fail it (FailedToCreatePods)."""
    with autoscaled() as cluster:
        create(cluster, request("app", provreq.BEST_EFFORT_ATOMIC, 2, template_name="nowhere"))
        cluster.wait_for(lambda: has(cluster, "app", "Failed", "True", "FailedToCreatePods"))
        assert conditions(cluster, "app")["Failed"][2] == (
            "missing pod templates, 1 pod templates were referenced, 1 templates were missing: nowhere"
        )

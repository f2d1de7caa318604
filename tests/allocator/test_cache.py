"""The cache's snapshots (allocator/cache.py): each is immutable whatever the reflectors do after it, and it is
made per app that changed: the views of the apps that did not change are shared with the snapshot before,
not copied (a persistent map), and an app the cluster no longer holds anything of leaves the next one."""

from __future__ import annotations

import copy
import gc
from collections.abc import Iterator
from typing import Any

import jsonpatch
import msgspec
import orjson

from allocator.cache import Cache, ExecutorPod, pod_record
from sparkgate import kube
from sparkgate.contract import AppKey
from sparkgate.kube import _event, decode
from sparkgate.mutation import mutate
from sparkgate.policy import Policy

from .test_dispatch import executor

A, B = AppKey("spark", "app-a"), AppKey("spark", "app-b")


def synced(pods: list[dict[str, Any]]) -> Cache:
    cache = Cache(lambda apps: None, lambda record, removed: None)
    cache.pods_replace(pods)
    cache.drivers_replace([])
    cache.config_maps_replace([], source=True)
    cache.config_maps_replace([], source=False)
    return cache


def released(app: str, exec_id: int) -> dict[str, Any]:
    pod = executor(app, exec_id)
    del pod["spec"]["schedulingGates"]
    return pod


def test_a_snapshot_stays_as_taken_while_the_cache_changes() -> None:
    cache = synced([executor(app, i) for app in ("app-a", "app-b") for i in (1, 2)])
    before = cache.snapshot()
    cache.pod_event("MODIFIED", released("app-a", 1))
    cache.pod_event("DELETED", executor("app-b", 1))
    cache.pod_event("DELETED", executor("app-b", 2))
    after = cache.snapshot()
    assert before.apps[A].counts.gated == 2 and before.in_flight_by_namespace() == {}
    assert set(before.apps) == {A, B}
    assert after.apps[A].counts.gated == 1 and after.apps[A].counts.in_flight == 1
    assert set(after.apps) == {A}  # nothing of app-b is left
    assert after.in_flight_by_namespace() == {"spark": 1}


def test_a_snapshot_shares_the_views_of_the_apps_that_did_not_change() -> None:
    cache = synced([executor(f"app-{n}", i) for n in range(500) for i in (1, 2)])
    first = cache.snapshot()
    assert cache.snapshot().apps is first.apps  # nothing changed: the same map, nothing rebuilt or copied
    cache.pod_event("MODIFIED", released("app-7", 1))
    second = cache.snapshot()
    changed = {k for k in second.apps if second.apps[k] is not first.apps[k]}
    assert changed == {AppKey("spark", "app-7")}


def test_a_relist_without_an_app_drops_its_view_and_its_share_of_the_budget() -> None:
    cache = synced([released("app-a", 1), released("app-b", 1)])
    assert cache.snapshot().in_flight_by_namespace() == {"spark": 2}
    cache.pods_replace([released("app-b", 1)])  # the watch was gone too long: app-a went meanwhile
    after = cache.snapshot()
    assert set(after.apps) == {B} and after.in_flight_by_namespace() == {"spark": 1}


def test_the_cache_s_records_are_left_out_of_the_cyclic_gc() -> None:
    """A record holds only strings, numbers, None and a tuple of strings: the cache hands the GC none of its
    per-pod records to walk at each full collection (model.py `PodRecord`, gc=False), nor the copies the
    expected views make of them. At 100,000 pods they were half of what a collection walked."""
    cache = synced([executor("app-a", 1), executor("app-a", 2)])
    cache.pod_event("MODIFIED", released("app-a", 1))
    held = cache.snapshot().apps[A].pods
    assert len(held) == 2 and not any(gc.is_tracked(record) for record in held)
    assert not gc.is_tracked(msgspec.structs.replace(held[0], gated=False))


def states(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The captured pod through the states whose fields the allocator reads: gated, bound, unschedulable,
    running, terminated (its Spark container OOMKilled beside a sidecar that exited), evicted, deleting."""
    pod = copy.deepcopy(pod)
    pod["metadata"].update(uid="uid-1", resourceVersion="7", creationTimestamp="2026-11-23T10:00:00Z")
    yield pod
    unschedulable = copy.deepcopy(pod)
    unschedulable["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
    ]}  # fmt: skip
    yield unschedulable
    bound = copy.deepcopy(pod)
    del bound["spec"]["schedulingGates"]
    bound["spec"]["nodeName"] = "node-1"
    bound["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": "spark-kubernetes-executor", "state": {"running": {}}}]}  # fmt: skip
    yield bound
    ended = copy.deepcopy(bound)
    ended["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"reason": "Error", "exitCode": 1}}},
        {"name": "spark-kubernetes-executor", "state": {"terminated": {
            "reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-23T10:05:00Z"}}},
    ]}  # fmt: skip
    yield ended
    evicted = copy.deepcopy(bound)
    evicted["status"] = {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}
    yield evicted
    deleting = copy.deepcopy(bound)
    deleting["metadata"].update(deletionTimestamp="2026-11-23T10:06:00Z", deletionGracePeriodSeconds=30)
    yield deleting


def test_the_fields_the_reflector_decodes_are_every_field_a_record_reads(
    reviews: dict[str, dict[str, Any]], example_policy: Policy
) -> None:
    """The executors' reflector decodes only `ExecutorPod`'s fields of each pod (sparkgate/kube.py `decode`):
    every captured Spark 4.3 executor, as the webhook admits it, in every state, makes the same record from
    them as from the whole pod, through a watch event and a list page alike."""
    compared = 0
    for name, review in reviews.items():
        admitted = jsonpatch.apply_patch(
            review["request"]["object"], mutate(review["request"], example_policy).ops
        )
        for pod in states(admitted):
            line = orjson.dumps({"type": "MODIFIED", "object": pod})
            whole, shaped = _event(line)[1], _event(line, ExecutorPod)[1]
            assert pod_record(shaped) == pod_record(whole) is not None, name
            assert "containers" not in shaped["spec"] and "managedFields" not in shaped["metadata"]
            page = orjson.dumps({"metadata": {"resourceVersion": "9"}, "items": [pod]})
            (listed,) = decode(page, kube._list_shape(ExecutorPod))["items"]
            assert listed == shaped
            compared += 1
    assert compared == 9 * 6


def test_an_event_that_changes_nothing_a_record_holds_leaves_the_view_and_decides_nothing() -> None:
    """A kubelet's status updates while a pod starts (kubelet status_manager: conditions, hostIP, a container
    waiting in ContainerCreating) and a label added by the driver leave the record as it was: the app keeps
    its view and is not queued. What the record holds (the phase here) changes both; so does a deletion."""
    touched: list[set[AppKey]] = []
    seen: list[tuple[Any, Any]] = []
    cache = Cache(touched.append, lambda record, removed: None)
    cache.pod_observers.append(lambda old, new: seen.append((old, new)))
    pod = released("app-a", 1)
    cache.pod_event("ADDED", pod)
    view = cache.snapshot().apps[A]
    touched.clear(), seen.clear()
    starting = copy.deepcopy(pod)
    starting["metadata"]["labels"]["added-by-the-driver"] = "yes"
    starting["status"] = {
        "phase": "Pending",
        "hostIP": "10.0.0.7",
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {"name": "spark-kubernetes-executor", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    }
    cache.pod_event("MODIFIED", starting)
    assert touched == [] and seen == [] and cache.snapshot().apps[A] is view
    running = copy.deepcopy(starting)
    running["status"]["phase"] = "Running"
    cache.pod_event("MODIFIED", running)
    assert touched == [{A}] and len(seen) == 1 and cache.snapshot().apps[A].counts.running == 1
    cache.pod_event("DELETED", running)
    assert touched == [{A}, {A}] and seen[-1][1] is None and A not in cache.snapshot().apps

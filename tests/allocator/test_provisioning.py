"""ProvisioningRequests, the pure rule (allocator/provisioning.py, through `decide`) and the cache's reading of
a request's conditions (cache.py `request_record`), as cluster-autoscaler writes them (kubesim/provreq.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from msgspec.structs import replace

from allocator.cache import request_record
from allocator.decision import decide
from allocator.model import (
    AppMemory,
    AppView,
    CreateRequest,
    DeletePod,
    DeleteRequest,
    DeletionReason,
    MarkHeld,
    PodRecord,
    Release,
    RequestRecord,
    Snapshot,
)
from allocator.provisioning import BACKOFF, SENT_EXPIRY, UNANSWERED_SECONDS
from sparkgate import contract
from sparkgate.policy import load_policy

from .test_demand import APP, record

ATOMIC = contract.PROVISIONING_CLASSES["best-effort-atomic-scale-up"]
CHECK = contract.PROVISIONING_CLASSES["check-capacity"]


def policy(klass: str = "best-effort-atomic-scale-up") -> Any:
    return load_policy(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"
        f"allocation: {{batchSize: 4, maxPendingPerApp: 4, maxPendingCluster: 100, provisioning: {klass}}}\n"
        "profiles: [{name: spark}]"
    )


def request(sequence: int, state: str, count: int = 6, klass: str = ATOMIC) -> RequestRecord:
    name = contract.provisioning_name("app-a", sequence)
    return RequestRecord("spark", name, "app-a", klass, count, state, sequence)


def view(pods: list[PodRecord], *requests: RequestRecord) -> Snapshot:
    templates = frozenset(r.name for r in requests)
    return Snapshot(
        {APP: AppView(APP, tuple(pods), None, False, frozenset(), requests, templates)}, frozenset()
    )


def refused_and_held(held: int = 6) -> list[PodRecord]:
    verdict = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    return [record(i, gated=False, condition=verdict) for i in range(1, 5)] + [
        record(i) for i in range(5, 5 + held)
    ]


def kinds(d: Any) -> list[str]:
    return [type(a).__name__ for a in d.actions if type(a).__name__ != "Event"]


def test_a_request_for_every_held_pod_when_the_app_is_held_and_none_while_it_is_being_made() -> None:
    pods = refused_and_held()
    memory = {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}
    d = decide(view(pods), policy(), 0.0, memory, provisioning_served=True)
    [made] = [a for a in d.actions if isinstance(a, CreateRequest)]
    assert (made.name, made.class_name, made.count, made.pod.name) == (
        "sg-app-a-pr1",
        ATOMIC,
        6,
        "app-a-exec-5",
    )
    assert not [a for a in d.actions if isinstance(a, MarkHeld)]  # the request stands for them
    again = decide(view(pods), policy(), 1.0, d.memory, provisioning_served=True)
    assert kinds(again) == []  # held by its refused pods, its request being made
    # Not shown by the watch within SENT_EXPIRY: not made; a new one is.
    late = decide(view(pods), policy(), SENT_EXPIRY + 1, again.memory, provisioning_served=True)
    assert [a.name for a in late.actions if isinstance(a, CreateRequest)] == ["sg-app-a-pr1"]


def test_not_served_or_none_no_request_the_condition_instead() -> None:
    pods = refused_and_held()
    memory = {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}
    for d in (
        decide(view(pods), policy(), 0.0, memory, provisioning_served=False),
        decide(view(pods), policy("none"), 0.0, memory, provisioning_served=True),
    ):
        assert "CreateRequest" not in kinds(d) and len([a for a in d.actions if isinstance(a, MarkHeld)]) == 6


@pytest.mark.parametrize("state", ["pending", "not-provisioned"])
def test_the_held_pods_wait_while_the_request_is_not_provisioned(state: str) -> None:
    held = [record(i) for i in range(1, 7)]
    d = decide(view(held, request(1, state)), policy(), 5.0, {}, provisioning_served=True)
    assert kinds(d) == [] and d.settings[APP].waiting_on == "provisioning"
    assert "ProvisioningRequest sg-app-a-pr1 (6 executors) not provisioned yet" in (
        d.settings[APP].waiting_for or ""
    )


def test_a_request_without_a_verdict_for_the_unanswered_time_no_longer_holds_the_app() -> None:
    """A cluster-autoscaler without --enable-provisioning-requests never writes a condition: the API server
    serving the CRD does not say it runs with it. After UNANSWERED_SECONDS the app is paced as without a
    request and its held pods are marked for the ordinary scale-up; a new request's clock starts anew."""
    held = [record(i) for i in range(1, 7)]
    memory = {APP: AppMemory(waiting_since=0.0)}
    d = decide(view(held, request(1, "pending")), policy(), 5.0, memory, provisioning_served=True)
    assert kinds(d) == [] and d.settings[APP].waiting_on == "provisioning"
    d = decide(view(held, request(1, "pending")), policy(), 5.0 + UNANSWERED_SECONDS - 1, d.memory,
               provisioning_served=True)  # fmt: skip
    assert kinds(d) == []
    d = decide(view(held, request(1, "pending")), policy(), 5.0 + UNANSWERED_SECONDS, d.memory,
               provisioning_served=True)  # fmt: skip
    released = {a.pod.uid for a in d.actions if isinstance(a, Release) and a.consume is None}
    assert kinds(d) == ["Release"] * 4 and len(released) == 4
    after = [replace(p, gated=False, gate_index=None) if p.uid in released else p for p in held]
    d = decide(view(after, request(1, "pending")), policy(), 5.0 + UNANSWERED_SECONDS + 3, d.memory,
               provisioning_served=True)  # fmt: skip
    assert kinds(d) == ["MarkHeld"] * 2  # held by the app's limit, shown to the ordinary scale-up
    d = decide(view(after, request(2, "pending")), policy(), 5.0 + UNANSWERED_SECONDS + 4, d.memory,
               provisioning_served=True)  # fmt: skip
    assert d.memory[APP].request_pending == ("sg-app-a-pr2", 5.0 + UNANSWERED_SECONDS + 4)


def test_check_capacity_that_found_none_holds_nothing_and_its_held_pods_are_marked() -> None:
    pods = [record(i) for i in range(1, 11)]
    d = decide(
        view(pods, request(1, "not-provisioned", 10, CHECK)), policy("check-capacity"), 5.0,
        {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}, provisioning_served=True,
    )  # fmt: skip
    assert kinds(d).count("Release") == 4 and "CreateRequest" not in kinds(d)
    released = {a.pod.uid for a in d.actions if isinstance(a, Release)}
    waiting = [replace(p, gated=False, gate_index=None) if p.uid in released else p for p in pods]
    later = decide(view(waiting, request(1, "not-provisioned", 10, CHECK)), policy("check-capacity"), 8.0,
                   d.memory, provisioning_served=True)  # fmt: skip
    assert kinds(later).count("MarkHeld") == 6  # 2 s without a release: shown to the ordinary scale-up


def test_a_provisioned_request_releases_the_pods_it_covers_annotated_then_a_new_one_for_more() -> None:
    pods = [record(i) for i in range(1, 11)]
    d = decide(view(pods, request(1, "provisioned", 6)), policy(), 5.0, {}, provisioning_served=True)
    released = [a for a in d.actions if isinstance(a, Release)]
    assert len(released) == 4 and {a.consume for a in released} == {
        ("sg-app-a-pr1", ATOMIC)
    }  # maxPendingPerApp
    consumed = [
        replace(p, gated=False, gate_index=None, node="n", phase="Running", consumes="sg-app-a-pr1")
        for p in pods[:6]
    ]
    rest = [*consumed, *pods[6:]]
    d = decide(view(rest, request(1, "provisioned", 6)), policy(), 10.0, {APP: AppMemory(waiting_since=0.0)},
               provisioning_served=True)  # fmt: skip
    # Consumed: the 4 it holds are paced as without a request, and a new request follows when they wait.
    assert [a.consume for a in d.actions if isinstance(a, Release)] == [None] * 4
    in_flight = [replace(p, gated=False, gate_index=None) for p in pods[6:10]]
    held = [*consumed, *in_flight, *[record(i) for i in range(11, 14)]]
    d = decide(view(held, request(1, "provisioned", 6)), policy(), 20.0,
               {APP: AppMemory(last_release_at=10.0, waiting_since=10.0)}, provisioning_served=True)  # fmt: skip
    assert [
        (type(a).__name__, a.name) for a in d.actions if isinstance(a, (CreateRequest, DeleteRequest))
    ] == [
        ("DeleteRequest", "sg-app-a-pr1"),
        ("CreateRequest", "sg-app-a-pr2"),
    ]


def test_the_pods_released_to_consume_a_request_are_placed_before_the_app_releases_any_other() -> None:
    """kube-scheduler knows nothing of the booking: a pod released without the annotation could take a booked
    node, and the consumer displaced would wait for good (cluster-autoscaler ignores every pod annotated to
    consume a request: processors/provreq/pods_filter.go). Seen on kubesim: 39 of 40 executors ran, one
    consumer stayed Pending, "No unschedulable pods"."""
    pods = [record(i) for i in range(1, 11)]
    released = [replace(p, gated=False, gate_index=None, consumes="sg-app-a-pr1") for p in pods[:6]]
    placed = [replace(p, node="n", phase="Running") for p in released[:5]]
    memory = {APP: AppMemory(waiting_since=0.0)}
    d = decide(view([*placed, released[5], *pods[6:]], request(1, "provisioned", 6)), policy(), 10.0, memory,
               provisioning_served=True)  # fmt: skip
    assert kinds(d) == [] and d.settings[APP].waiting_on == "provisioning"
    assert "consume ProvisioningRequest sg-app-a-pr1 not placed yet" in (d.settings[APP].waiting_for or "")
    all_placed = [*placed, replace(released[5], node="n", phase="Running"), *pods[6:]]
    d = decide(
        view(all_placed, request(1, "provisioned", 6)), policy(), 10.0, memory, provisioning_served=True
    )
    assert [a.consume for a in d.actions if isinstance(a, Release)] == [None] * 4


@pytest.mark.parametrize("state", ["expired", "revoked", "failed", None])
def test_a_consumer_refused_once_its_request_books_nothing_is_deleted_for_spark_to_replace(
    state: str | None,
) -> None:
    """Another pod took the node booked for it: refused by kube-scheduler, and never scaled up for by
    cluster-autoscaler (pods_filter.go drops every pod annotated to consume a request). While the request
    still books capacity it waits (the node may still be coming); after, it is deleted. A consumer that is
    placed, or not refused, is left alone."""
    verdict = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/6 nodes"}
    refused = replace(record(1, gated=False, condition=verdict), consumes="sg-app-a-pr1")
    placed = replace(record(2, gated=False), consumes="sg-app-a-pr1", node="n", phase="Running")
    waiting = replace(record(3, gated=False), consumes="sg-app-a-pr1")
    pods = [refused, placed, waiting]
    booked = decide(view(pods, request(1, "provisioned", 3)), policy(), 5.0, {}, provisioning_served=True)
    assert not [a for a in booked.actions if isinstance(a, DeletePod)]
    requests = [request(1, state, 3)] if state else []
    d = decide(view(pods, *requests), policy(), 5.0, {}, provisioning_served=True)
    deleted = [(a.pod.name, a.reason) for a in d.actions if isinstance(a, DeletePod)]
    assert deleted == [("app-a-exec-1", DeletionReason.STRANDED)]


@pytest.mark.parametrize("state", ["expired", "revoked"])
def test_an_expired_or_revoked_request_is_followed_by_a_new_one_for_the_pods_still_held(state: str) -> None:
    memory = {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}
    d = decide(view(refused_and_held(), request(3, state)), policy(), 5.0, memory, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, CreateRequest)] == ["sg-app-a-pr4"]


def test_after_a_failed_request_the_next_waits_its_backoff_doubling_per_failure() -> None:
    memory = {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}
    failed = view(refused_and_held(), request(1, "failed"))
    d = decide(failed, policy(), 5.0, memory, provisioning_served=True)
    assert "CreateRequest" not in kinds(d) and d.due[APP] == 5.0 + BACKOFF
    d = decide(failed, policy(), 5.0 + BACKOFF, d.memory, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, CreateRequest)] == ["sg-app-a-pr2"]
    second = view(refused_and_held(), request(2, "failed"))
    memory = {APP: replace_memory(d.memory[APP], request_sent=None)}
    d = decide(second, policy(), 100.0, memory, provisioning_served=True)
    assert d.due[APP] == 100.0 + 2 * BACKOFF


def replace_memory(memory: AppMemory, **changes: Any) -> AppMemory:
    return dataclasses.replace(memory, **changes)


def test_an_app_that_is_over_loses_its_requests_and_templates() -> None:
    snapshot = view([record(1)], request(1, "provisioned"), request(2, "pending"))
    d = decide(snapshot, policy(), 5.0, {}, ended={APP}, provisioning_served=True)
    assert sorted(a.name for a in d.actions if isinstance(a, DeleteRequest)) == [
        "sg-app-a-pr1",
        "sg-app-a-pr2",
    ]


@pytest.mark.parametrize(
    ("conditions", "state"),
    [
        ([], "pending"),
        ([("Accepted", "True")], "pending"),
        ([("Accepted", "True"), ("Provisioned", "False")], "not-provisioned"),
        ([("Accepted", "True"), ("Provisioned", "True")], "provisioned"),
        ([("Provisioned", "True"), ("BookingExpired", "True")], "expired"),
        ([("Provisioned", "False"), ("Failed", "True")], "failed"),
        ([("Provisioned", "True"), ("CapacityRevoked", "True")], "revoked"),
    ],
)
def test_a_requests_state_from_its_conditions(conditions: list[tuple[str, str]], state: str) -> None:
    obj = {
        "metadata": {
            "name": "sg-app-a-pr7",
            "namespace": "spark",
            "labels": {contract.LABEL_APP_ID: "app-a"},
        },
        "spec": {
            "provisioningClassName": ATOMIC,
            "podSets": [{"podTemplateRef": {"name": "x"}, "count": 12}],
        },
        "status": {"conditions": [{"type": t, "status": s, "message": f"{t} said"} for t, s in conditions]},
    }
    made = request_record(obj)
    assert made is not None and (made.state, made.count, made.sequence) == (state, 12, 7)


def test_an_older_request_that_comes_back_is_deleted_and_the_newest_stands() -> None:
    """A create whose answer was lost is repeated; the first attempt can land after the delete that followed
    (kube-apiserver goes on with a request whose client gave up): the old name is back, pending again."""
    pods = [record(i) for i in range(1, 7)]
    back = view(pods, request(1, "pending"), request(2, "pending"))
    d = decide(back, policy(), 5.0, {}, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["sg-app-a-pr1"]
    assert not [a for a in d.actions if isinstance(a, CreateRequest)]
    # Handed to the actor once: the next decisions, before the watch shows it gone, do not send it again,
    # unless it is still there SENT_EXPIRY later.
    d = decide(back, policy(), 6.0, d.memory, provisioning_served=True)
    assert not [a for a in d.actions if isinstance(a, DeleteRequest)]
    d = decide(back, policy(), 5.0 + SENT_EXPIRY, d.memory, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["sg-app-a-pr1"]
    # A template made before its request (the actor makes the template first): the older request goes, the
    # template stays.
    ahead = view(pods, request(2, "pending"))
    app = ahead.apps[APP]
    ahead = Snapshot({APP: dataclasses.replace(app, templates=app.templates | {"sg-app-a-pr3"})}, frozenset())
    d = decide(ahead, policy(), 5.0, {}, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["sg-app-a-pr2"]
    # A template left of an older request goes too; the newest request and its template stay.
    snapshot = view(pods, request(2, "provisioned"))
    app = snapshot.apps[APP]
    stale = Snapshot({APP: dataclasses.replace(app, templates=app.templates | {"sg-app-a-pr1"})}, frozenset())
    d = decide(stale, policy(), 5.0, {}, provisioning_served=True)
    assert [a.name for a in d.actions if isinstance(a, DeleteRequest)] == ["sg-app-a-pr1"]
    d = decide(snapshot, policy(), 5.0, {}, provisioning_served=True)
    assert not [a for a in d.actions if isinstance(a, DeleteRequest)]


def test_a_new_request_deletes_the_older_ones_once() -> None:
    """The request made for more held pods deletes the consumed one with its template, in the same actions,
    and the decisions after it do not send that deletion again while the watch has not shown it."""
    consumed = [
        replace(record(i), gated=False, gate_index=None, node="n", phase="Running", consumes="sg-app-a-pr1")
        for i in range(1, 7)
    ]
    in_flight = [replace(record(i), gated=False, gate_index=None) for i in range(7, 11)]
    snapshot = view(
        [*consumed, *in_flight, *[record(i) for i in range(11, 14)]], request(1, "provisioned", 6)
    )
    memory = {APP: AppMemory(last_release_at=10.0, waiting_since=10.0)}
    d = decide(snapshot, policy(), 20.0, memory, provisioning_served=True)
    assert [
        (type(a).__name__, a.name) for a in d.actions if isinstance(a, (CreateRequest, DeleteRequest))
    ] == [
        ("DeleteRequest", "sg-app-a-pr1"),
        ("CreateRequest", "sg-app-a-pr2"),
    ]
    app = snapshot.apps[APP]
    made = Snapshot(
        {APP: dataclasses.replace(app, requests=(*app.requests, request(2, "pending", 4)),
                                  templates=app.templates | {"sg-app-a-pr2"})},
        frozenset(),
    )  # fmt: skip
    d = decide(made, policy(), 21.0, d.memory, provisioning_served=True)
    assert not [a for a in d.actions if isinstance(a, (CreateRequest, DeleteRequest))]

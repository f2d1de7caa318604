"""The actor against kubesim over HTTP: each app's actions in order, apps side by side, a stale write
stopping only its own app's releases, and nothing sent once leadership has lapsed."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from msgspec.structs import replace

from allocator.actor import Actor
from allocator.cache import pod_record
from allocator.decision import decide
from allocator.expectations import BindTimes
from allocator.model import (
    Action,
    AppView,
    DeletePod,
    DeletionReason,
    DriverRecord,
    Event,
    PodRecord,
    Release,
    Snapshot,
)
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy import load_policy

ALLOCATOR = "system:serviceaccount:sparkgate-system:sparkgate-allocator"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1) as c:
        c.add_namespace("spark")
        yield c


class Leadership:
    """What the actor asks before every write: leading for the first `writes` questions, then not."""

    def __init__(self, writes: int = 1_000_000) -> None:
        self.writes = writes
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked <= self.writes


@pytest.fixture
def leadership() -> Leadership:
    return Leadership()


@pytest.fixture
def actor(cluster: Cluster, leadership: Leadership) -> Iterator[Actor]:
    kube = Kube.from_kubeconfig(str(cluster.add_user(ALLOCATOR)))
    actor = Actor(kube.gated(leadership, timeout=30), "sparkgate-system", parallel_apps=4)
    yield actor
    actor.close()
    kube.close()


def gated_pod(cluster: Cluster, app: str, exec_id: int) -> PodRecord:
    obj: dict[str, Any] = {
        "metadata": {
            "name": f"{app}-exec-{exec_id}",
            "namespace": "spark",
            "labels": {
                contract.LABEL_ROLE: "executor",
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
            },
            "annotations": {contract.ANNOTATION_PROFILE: "spark"},
        },
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
            "schedulingGates": [{"name": "other.io/gate"}, {"name": contract.GATE}],
        },
    }
    record = pod_record(cluster.store.create("pods", json.loads(json.dumps(obj))))
    assert record is not None and record.gate_index == 1
    return record


def gates(cluster: Cluster, name: str) -> list[str]:
    pod = cluster.store.get("pods", "spark", name)
    return [g["name"] for g in pod["spec"].get("schedulingGates", [])]


def test_a_stale_release_stops_its_app_only_and_other_gates_stay(cluster: Cluster, actor: Actor) -> None:
    """A run of releases goes out side by side once its first went through, so a stale one does not hold
    back its siblings already sent; the app's writes after the run are dropped (it is re-decided), its
    Events still go. When the first of a run fails, the rest is not sent."""
    a1, a2, a3, a4 = (gated_pod(cluster, "app-a", i) for i in (1, 2, 3, 4))
    b1, b2 = (gated_pod(cluster, "app-b", i) for i in (1, 2))
    c1, c2 = (gated_pod(cluster, "app-c", i) for i in (1, 2))
    stale = replace(a2, gate_index=0)  # the `test` of the patch fails: 422
    actions: list[Action] = [Release(a1.app, a1), Release(a2.app, stale), Release(a3.app, a3)]
    noted = Event(a1.app, a1.name, a1.uid, "Normal", "Released", "released", "a/released")
    actions += [noted, DeletePod(a4.app, a4, DeletionReason.ID_REUSE), Release(a4.app, a4)]
    actions += [Release(b1.app, b1), Release(b2.app, b2)]
    actions += [Release(c1.app, replace(c1, gate_index=0)), Release(c2.app, c2)]
    done = actor.submit(actions)
    results = {app: future.result() for app, future in done.items()}
    assert {app: r.ok for app, r in results.items()} == {a1.app: False, b1.app: True, c1.app: False}
    assert results[c1.app].released == [] and gates(cluster, c2.name) == ["other.io/gate", contract.GATE]
    assert results[a1.app].released == [a1.uid, a3.uid] and results[b1.app].released == [b1.uid, b2.uid]
    assert gates(cluster, a1.name) == gates(cluster, a3.name) == ["other.io/gate"]
    assert gates(cluster, a2.name) == ["other.io/gate", contract.GATE]  # the failed test changed nothing
    assert gates(cluster, a4.name) == ["other.io/gate", contract.GATE]  # dropped: the app is re-decided
    assert cluster.store.get("pods", "spark", a4.name)["metadata"].get("deletionTimestamp") is None
    events, _, _ = cluster.store.list("events", "spark")
    assert [e["reason"] for e in events] == ["Released"]
    assert gates(cluster, b1.name) == gates(cluster, b2.name) == ["other.io/gate"]


def test_an_apps_releases_are_pipelined_on_the_writers(cluster: Cluster) -> None:
    """Seven releases of one app: the first alone, then the other six all in flight at once: each of their
    PATCHes waits at a barrier of six before it is sent (the budget's hook), which only six concurrent
    writers can pass; sent one after the other, the first would wait there for good and the barrier would
    break (counting, not timing)."""
    kube = Kube.from_kubeconfig(str(cluster.add_user(ALLOCATOR)))
    barrier = threading.Barrier(6, timeout=60)
    calls = itertools.count()

    def budget() -> None:
        if next(calls) > 0:
            barrier.wait()

    writes = kube.gated(lambda: True, timeout=30).limited(budget)
    actor = Actor(writes, "sparkgate-system", parallel_apps=1, writers=6)
    try:
        pods = [gated_pod(cluster, "app-a", i) for i in range(1, 8)]
        (done,) = actor.submit([Release(p.app, p) for p in pods]).values()
        assert done.result().released == [p.uid for p in pods]
        assert all(gates(cluster, p.name) == ["other.io/gate"] for p in pods)
        assert not barrier.broken
    finally:
        actor.close()
        kube.close()


def test_gate_removal_latency_runs_from_the_gated_pod_first_seen_to_the_patch_accepted(
    cluster: Cluster,
) -> None:
    """The actor observes the cache's pod records (an injected monotonic clock): a gated pod is seen at
    10 s, seen again at 11 s (the first sighting counts), released at 12.5 s: 2.5 s. A pod whose gate went
    without sparkgate's PATCH (seen ungated) or that was replaced (a new uid) has nothing to measure."""
    now = [10.0]
    removed: list[float] = []
    kube = Kube.from_kubeconfig(str(cluster.add_user(ALLOCATOR)))
    actor = Actor(
        kube.gated(lambda: True, timeout=30),
        "sparkgate-system",
        monotonic=lambda: now[0],
        on_gate_removed=removed.append,
    )
    try:
        a1, a2, a3 = (gated_pod(cluster, "app-a", i) for i in (1, 2, 3))
        for pod in (a1, a2, a3):
            actor.observe(None, pod)
        now[0] = 11.0
        actor.observe(a1, replace(a1, phase="Pending"))
        actor.observe(a2, replace(a2, gated=False, gate_index=None))
        actor.observe(a3, replace(a3, uid="replaced"))
        now[0] = 12.5
        actor.release(Release(a1.app, a1))
        actor.release(Release(a3.app, a3))
        assert removed == [2.5]
        assert actor.submit([Release(a2.app, a2)])[a2.app].result().ok
        assert removed == [2.5], "a2 was seen ungated: no start to measure from"
    finally:
        actor.close()
        kube.close()


def test_what_the_work_queue_is_told_failed_written_or_only_events(cluster: Cluster, actor: Actor) -> None:
    """An app whose actions are only Events wrote nothing: the work queue must keep its backoff (None), not
    reset it (True) as after writes that went through."""
    a1 = gated_pod(cluster, "app-a", 1)
    b1 = gated_pod(cluster, "app-b", 1)
    c1 = gated_pod(cluster, "app-c", 1)
    waiting = Event(b1.app, b1.name, b1.uid, "Normal", "Waiting", "waiting: the cluster's limit", "b/waiting")
    stale = replace(c1, gate_index=0)
    done = actor.submit([Release(a1.app, a1), waiting, Release(c1.app, stale)])
    outcomes = {app: future.result().outcome for app, future in done.items()}
    assert outcomes == {a1.app: True, b1.app: None, c1.app: False}
    events, _, _ = cluster.store.list("events", "spark")
    assert [e["reason"] for e in events] == ["Waiting"]  # the Event was sent all the same


def test_an_app_with_500_bypassed_pods_is_one_event_on_its_driver_counting_them(
    cluster: Cluster, actor: Actor
) -> None:
    """Issue 18: one BypassedWebhook Event per app, not one per pod per minute, however often it is decided."""
    driver = cluster.store.create(
        "pods",
        {
            "metadata": {
                "name": "big-driver",
                "namespace": "spark",
                "labels": {contract.LABEL_ROLE: "driver", contract.LABEL_APP_ID: "big"},
            },
            "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark"}]},
        },
    )
    driver_record = DriverRecord("spark", "big-driver", driver["metadata"]["uid"], "big", "Running", False)

    def bypassed(exec_id: int) -> PodRecord:
        obj = {
            "metadata": {
                "name": f"big-exec-{exec_id}",
                "namespace": "spark",
                "uid": f"uid-{exec_id}",
                "labels": {
                    contract.LABEL_ROLE: "executor",
                    contract.LABEL_APP_ID: "big",
                    contract.LABEL_EXEC_ID: str(exec_id),
                },
            },
            "spec": {
                "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
                "nodeName": "n",
            },
            "status": {"phase": "Running"},
        }
        record = pod_record(obj)
        assert record is not None and record.bypassed
        return record

    pods = tuple(bypassed(i) for i in range(1, 501))
    key = AppKey("spark", "big")
    policy = load_policy("apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n")
    since = len(cluster.requests.entries())
    for pods_now in (pods, pods, (*pods, bypassed(501))):
        app = AppView(key, pods_now, driver_record, True, frozenset())
        decision = decide(Snapshot({key: app}, frozenset()), policy, 100.0, {})
        for future in actor.submit(decision.actions).values():
            assert future.result().ok
    [event] = cluster.store.list_objects("events", "spark")[0]
    assert event["reason"] == "BypassedWebhook" and event["count"] == 501
    assert event["involvedObject"]["name"] == "big-driver"
    assert event["message"].startswith("501 executor pod(s) of app spark/big were admitted without sparkgate")
    writes = [e.verb for e in cluster.requests.entries()[since:] if e.resource == "events"]
    assert writes == ["create", "patch"], "the second decision had nothing new to say"


def test_leadership_is_checked_before_every_write_and_a_lapse_drops_the_rest(
    cluster: Cluster, actor: Actor, leadership: Leadership
) -> None:
    """Leadership lapses after the second write of an app: its third release and Event are not sent, and
    neither is anything queued after (the next leader decides them again); nothing counts as failed."""
    a1, a2, a3 = (gated_pod(cluster, "app-a", i) for i in (1, 2, 3))
    waiting = Event(a1.app, a3.name, a3.uid, "Normal", "Waiting", "waiting", "a/waiting")
    leadership.writes = 2
    before = cluster.requests.count(user=ALLOCATOR)
    (result,) = (
        f.result() for f in actor.submit([Release(a1.app, p) for p in (a1, a2, a3)] + [waiting]).values()
    )
    assert (result.ok, result.dropped, result.outcome) == (True, True, True)
    # a1 goes alone; a2 and a3 go out side by side on the writers, so either may be the one refused.
    assert result.released[0] == a1.uid and len(result.released) == 2
    assert leadership.asked == 3  # two writes, then the question that stopped the third
    (held,) = {a2, a3} - {p for p in (a2, a3) if p.uid in result.released}
    assert gates(cluster, held.name) == ["other.io/gate", contract.GATE]
    b1 = gated_pod(cluster, "app-b", 1)
    (later,) = (f.result() for f in actor.submit([Release(b1.app, b1)]).values())
    assert (later.dropped, later.released, later.outcome) == (True, [], None)
    assert cluster.requests.count(user=ALLOCATOR) - before == 2, "only the two writes made while leading"
    assert cluster.store.list("events", "spark")[0] == []


def test_a_write_budget_that_cannot_hand_out_tokens_is_refused_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sparkgate allocator --kube-api-qps 0` stops at once with what is wrong (before any API call)."""
    assert main(["allocator", "--kube-api-qps", "0", "--kubeconfig", "/nonexistent"]) == 2
    assert capsys.readouterr().err == (
        "sparkgate allocator: --kube-api-qps, --kube-api-burst: a token bucket needs qps > 0 and burst >= 1, "
        "got qps 0.0, burst 200\n"
    )


def test_a_release_time_is_taken_before_its_patch_so_a_pod_watched_gone_meanwhile_leaves_none(
    cluster: Cluster, leadership: Leadership
) -> None:
    """The release-to-bind times (expectations.BindTimes) take each release's time out when the watch shows
    the pod bound or gone. Taken after the PATCH returned, a pod whose bind and deletion were watched while
    the PATCH was in flight (Spark scaling down at once) left its entry for good."""
    bound: list[tuple[str, float]] = []
    now = [100.0]
    times = BindTimes(lambda ns, seconds: bound.append((ns, seconds)), clock=lambda: now[0])
    kube = Kube.from_kubeconfig(str(cluster.add_user(ALLOCATOR)))
    actor = Actor(
        kube.gated(leadership, timeout=30),
        "sparkgate-system",
        clock=lambda: 100.0,
        on_sending=lambda action: times.released(action.pod.uid),
    )
    pod = gated_pod(cluster, "app-a", 1)
    patch = actor.kube.patch

    def watched_during_the_patch(*args: Any, **kwargs: Any) -> Any:
        answer = patch(*args, **kwargs)
        now[0] = 105.0
        on_node = replace(pod, gated=False, gate_index=None, node="node-1")
        times.observe(pod, on_node)  # the bind, watched before the PATCH returns ...
        times.observe(on_node, None)  # ... and the pod's deletion
        return answer

    actor.kube.patch = watched_during_the_patch  # type: ignore[method-assign]
    try:
        assert actor.submit([Release(pod.app, pod)])[pod.app].result().released == [pod.uid]
        assert bound == [("spark", 5.0)] and times._released == {}
    finally:
        actor.close()
        kube.close()


@pytest.mark.parametrize("answer", [0, 504])
def test_a_gate_removal_whose_answer_is_lost_is_unclear_and_each_release_of_a_run_has_its_own(
    cluster: Cluster, actor: Actor, answer: int
) -> None:
    """Issue 37: kubesim applies every third gate removal and loses its answer (the connection dropped, or
    kube-apiserver's 504). kube.py repeats the guarded PATCH, whose `test` then fails (422): not a refusal
    but "maybe released", reported `unclear`, not failed, and the app does not back off. A defect while one
    release of a pipelined run is being sent makes that release unclear, not the whole run failed."""
    pods = [gated_pod(cluster, "app-a", i) for i in range(1, 8)]
    cluster.faults.lose("patch", "pods", answer=answer, one_in=3)
    patch = actor.kube.patch

    def broken_for_the_fifth(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.endswith(pods[4].name):
            raise RuntimeError("a defect of ours")
        return patch(path, *args, **kwargs)

    actor.kube.patch = broken_for_the_fifth  # type: ignore[method-assign]
    (result,) = (f.result() for f in actor.submit([Release(p.app, p) for p in pods]).values())
    lost = [e.name for e in cluster.requests.entries() if e.lost_as == answer]
    assert len(lost) == 2 and all(e.code == 200 for e in cluster.requests.entries() if e.lost_as is not None)
    assert (result.ok, result.outcome) == (True, True)
    by_name = {p.uid: p.name for p in pods}
    assert sorted(by_name[u] for u in result.unclear) == sorted([*lost, pods[4].name])
    assert sorted(result.released + result.unclear) == sorted(p.uid for p in pods)
    assert all(gates(cluster, p.name) == ["other.io/gate"] for p in pods if p is not pods[4])
    assert gates(cluster, pods[4].name) == ["other.io/gate", contract.GATE]  # never sent: the watch will say


def test_a_deletion_whose_answer_is_lost_is_repeated_and_its_404_is_the_deletion_done(
    cluster: Cluster, actor: Actor
) -> None:
    """A DELETE with a uid precondition is safe to repeat: after a lost answer, the repeat's 404 is this
    deletion done (recorded), not a stale cache."""
    deleted: list[str] = []
    actor.on_delete = lambda action: deleted.append(action.pod.name)
    a1 = gated_pod(cluster, "app-a", 1)
    cluster.faults.lose("delete", "pods", count=1)
    (result,) = (f.result() for f in actor.submit([DeletePod(a1.app, a1, DeletionReason.ID_REUSE)]).values())
    assert (result.ok, deleted) == (True, [a1.name])
    codes = [(e.code, e.lost_as) for e in cluster.requests.entries() if e.verb == "delete"]
    assert codes == [(200, 0), (404, None)]

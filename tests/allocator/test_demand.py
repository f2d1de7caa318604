"""Demand as a condition (allocator/demand.py): which held pods are marked and when (the pure rule, through
`decide`), how the cache reads sparkgate's mark against the scheduler's verdict, and the actor's mark against
kubesim over HTTP: written once, a pod released meanwhile left alone, a refusal said once per app and never
a backoff, a lost answer not sent again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from msgspec.structs import replace

from allocator import demand, pacing
from allocator.actor import Actor
from allocator.cache import pod_record
from allocator.decision import decide
from allocator.model import AppMemory, AppView, MarkHeld, PodRecord, Release, Snapshot
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy import load_policy

from .test_actor import gated_pod

APP = AppKey("spark", "app-a")
POLICY = """apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: 4, batchDelaySeconds: 5, maxPendingPerApp: 4, maxPendingCluster: 100, pacing: fixed{extra}}}
profiles: [{{name: spark{profile}}}]
"""


def policy(extra: str = "", profile: str = "") -> Any:
    return load_policy(POLICY.format(extra=extra, profile=profile))


def record(
    exec_id: int, *, gated: bool = True, condition: dict[str, Any] | None = None, **fields: Any
) -> PodRecord:
    conditions = [condition or {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    pod = {
        "metadata": {
            "name": f"app-a-exec-{exec_id}",
            "namespace": "spark",
            "uid": f"uid-{exec_id}",
            "labels": {
                contract.LABEL_ROLE: "executor",
                contract.LABEL_APP_ID: "app-a",
                contract.LABEL_EXEC_ID: str(exec_id),
            },
            "annotations": {contract.ANNOTATION_PROFILE: "spark"},
            "creationTimestamp": "2026-11-28T12:00:00Z",
        },
        "spec": {
            "containers": [{"name": "c"}],
            **({"schedulingGates": [{"name": contract.GATE}]} if gated else {}),
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Initialized", "status": "True"}, *conditions],
        },
    }
    made = pod_record(pod)
    assert made is not None
    return replace(made, **fields) if fields else made


def snapshot(*pods: PodRecord) -> Snapshot:
    return Snapshot({APP: AppView(APP, pods, None, False, frozenset())}, frozenset())


def marks(d: Any) -> list[str]:
    return [a.pod.name for a in d.actions if isinstance(a, MarkHeld)]


def test_the_cache_tells_sparkgates_mark_from_the_schedulers_verdict_and_the_api_servers_gate() -> None:
    gated = record(1)
    assert (gated.gated_condition, gated.held_mark, gated.unschedulable) == (1, False, False)
    mark = contract.held_condition("the cluster already has 8 executor pods waiting", "2026-11-28T12:00:05Z")
    held = record(2, condition=mark)
    assert (held.gated_condition, held.held_mark, held.unschedulable) == (None, True, False)
    # Released, still carrying sparkgate's mark until kube-scheduler has tried it: waiting for its answer, not
    # refused (adaptive pacing does not fall back; the refused-pod bound does not count it; it is no
    # overdue refusal for the registry).
    released = record(3, gated=False, condition=mark)
    assert pacing.unanswered(released) and not pacing.refused(released)
    verdict = {**mark, "message": "0/3 nodes are available: 3 Insufficient cpu."}
    refused = record(4, gated=False, condition=verdict)
    assert refused.unschedulable and not refused.held_mark and pacing.refused(refused)
    view = AppView(APP, (released, refused), None, False, frozenset())
    assert (view.counts.in_flight, view.counts.refused) == (2, 1)


def test_held_pods_are_marked_once_after_the_app_had_no_release_for_the_delay() -> None:
    """Fixed pacing, batches of 4 with a 5 s delay, 10 pods: 4 released at t=0; the 6 left wait for the
    delay, marked at t=2 (DEMAND_AFTER_SECONDS after the release) and never again; the app is decided at
    t=2 for it. Nothing of a pod's condition is required but the API server's SchedulingGated."""
    pods = tuple(record(i) for i in range(1, 11))
    p = policy()
    first = decide(snapshot(*pods), p, 0.0, {})
    assert len([a for a in first.actions if isinstance(a, Release)]) == 4 and marks(first) == []
    released = {a.pod.uid for a in first.actions if isinstance(a, Release)}
    after = tuple(
        replace(q, gated=False, gate_index=None, node="n1") if q.uid in released else q for q in pods
    )
    early = decide(snapshot(*after), p, 1.0, first.memory)
    assert marks(early) == [] and early.settings[APP].waiting_on == "delay"
    assert early.due[APP] == demand.DEMAND_AFTER_SECONDS  # decided again then, not at the delay's end
    due = decide(snapshot(*after), p, 2.0, early.memory)
    assert marks(due) == [f"app-a-exec-{i}" for i in range(5, 11)]
    [why] = {a.why for a in due.actions if isinstance(a, MarkHeld)}
    assert why.startswith("the executors of application app-a are released a batch at a time")
    again = decide(snapshot(*after), p, 3.0, due.memory)
    assert marks(again) == []  # handed out: not again, even before the watch shows the marks
    shown = tuple(replace(q, held_mark=True, gated_condition=None) if q.gated else q for q in after)
    assert marks(decide(snapshot(*shown), p, 4.0, {})) == []  # a new leader: the marks are on the pods


def test_a_mark_that_never_shows_is_handed_out_again_after_the_retry_time_once() -> None:
    """Refused (RBAC fixed later), skipped while the app's marks were held back, or lost before it landed: the
    watch never shows the mark, and REFUSED_RETRY_SECONDS later the pod is marked again (a repeat is safe: the
    write tests the pod is still gated and unmarked). A pod whose mark showed is not. The app is held by its
    previous batch (4 released pods that never bind) the whole time; between, it is decided again at the retry time."""
    pods = tuple(record(i) for i in range(1, 11))
    p = policy()
    first = decide(snapshot(*pods), p, 0.0, {})
    released = {a.pod.uid for a in first.actions if isinstance(a, Release)}
    after = tuple(replace(q, gated=False, gate_index=None) if q.uid in released else q for q in pods)
    handed = decide(snapshot(*after), p, 2.0, first.memory)
    assert marks(handed) == [f"app-a-exec-{i}" for i in range(5, 11)]
    # The watch shows the marks of 5 and 6 only.
    shown = tuple(
        replace(q, held_mark=True, gated_condition=None) if q.exec_id in (5, 6) else q for q in after
    )
    waiting = decide(snapshot(*shown), p, 100.0, handed.memory)
    assert marks(waiting) == [] and waiting.settings[APP].waiting_on == "previous-batch"
    assert waiting.due[APP] <= 2.0 + demand.REFUSED_RETRY_SECONDS
    retried = decide(snapshot(*shown), p, 2.0 + demand.REFUSED_RETRY_SECONDS, waiting.memory)
    assert marks(retried) == [f"app-a-exec-{i}" for i in range(7, 11)]
    assert marks(decide(snapshot(*shown), p, 700.0, retried.memory)) == []


def test_an_app_held_by_its_refused_pods_has_its_held_pods_marked_at_once() -> None:
    """The scheduler refused its released pods: no room, so what it holds would not fit either: marked in the
    same decision, all of them (one scale-up for all, not one per landing mark)."""
    verdict = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    refused = [record(i, gated=False, condition=verdict) for i in range(1, 5)]
    held = [record(i) for i in range(5, 9)]
    d = decide(
        snapshot(*refused, *held), policy(), 0.0, {APP: AppMemory(last_release_at=0.0, waiting_since=0.0)}
    )
    assert d.settings[APP].waiting_on == "unschedulable"
    assert marks(d) == [p.name for p in held]


@pytest.mark.parametrize(
    ("extra", "profile"),
    [(", autoscalerDemand: released", ""), ("", ", allocation: {autoscalerDemand: released}")],
)
def test_released_marks_nothing(extra: str, profile: str) -> None:
    pods = tuple(record(i) for i in range(1, 11))
    d = decide(snapshot(*pods), policy(extra, profile), 0.0, {})
    late = decide(snapshot(*pods), policy(extra, profile), 60.0, d.memory)
    assert marks(d) == marks(late) == []


def test_a_pod_held_for_a_missing_source_or_without_the_api_servers_condition_is_not_marked() -> None:
    p = load_policy(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"
        "profiles: [{name: spark, configMaps: [{source: gone, mountPath: /etc/x}]}]"
    )
    copy = contract.app_configmap_name("app-a", "gone")
    pods = tuple(replace(record(i), copies=(copy,)) for i in range(1, 4))
    d = decide(snapshot(*pods), p, 0.0, {APP: AppMemory(waiting_since=-60.0)})
    assert d.settings[APP].waiting_on == "source" and marks(d) == []
    bare = tuple(replace(record(i), gated_condition=None) for i in range(1, 11))
    d = decide(snapshot(*bare), policy(), 60.0, {APP: AppMemory(last_release_at=59.0, waiting_since=0.0)})
    assert marks(d) == [] and APP not in d.due


def test_why_a_pod_waits_in_a_spark_users_words() -> None:
    p = policy()
    allocation = p.allocation
    assert demand.why("cluster", APP, allocation, p).startswith(
        "the cluster already has 100 executor pods waiting to be placed, its limit (maxPendingCluster)"
    )
    assert "namespace spark already has" in demand.why("namespace", APP, allocation, p)
    assert "application app-a already has 4 executor pods" in demand.why("app", APP, allocation, p)
    assert "could not be scheduled yet" in demand.why("unschedulable", APP, allocation, p)


# --- the actor's write, against kubesim ------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1) as c:
        c.add_namespace("spark")
        yield c


@pytest.fixture
def outcomes() -> list[str]:
    return []


@pytest.fixture
def actor(cluster: Cluster, outcomes: list[str]) -> Iterator[Actor]:
    kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
    actor = Actor(kube, "sparkgate-system", on_mark=lambda _, outcome: outcomes.append(outcome))
    yield actor
    actor.close()
    kube.close()


def created(cluster: Cluster, app: str, exec_id: int) -> PodRecord:
    made = gated_pod(cluster, app, exec_id)
    assert made.gated_condition is not None
    return made


def condition(cluster: Cluster, name: str) -> dict[str, Any]:
    pod = cluster.store.get("pods", "spark", name)
    found: dict[str, Any] = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    return found


def test_the_mark_is_written_and_a_pod_released_meanwhile_is_left_alone(
    cluster: Cluster, actor: Actor, outcomes: list[str]
) -> None:
    one, two = created(cluster, "app-a", 1), created(cluster, "app-a", 2)
    cluster.store.patch("pods", "spark", two.name, contract.gate_removal(1), "application/json-patch+json")
    (result,) = (
        f.result()
        for f in actor.submit([MarkHeld(one.app, one, "why"), MarkHeld(two.app, two, "why")]).values()
    )
    assert (result.ok, result.outcome) == (True, None)  # never the app's outcome: no backoff, none reset
    assert outcomes == ["written", "stale"]
    assert condition(cluster, one.name)["message"] == f"{contract.HELD_MARK} why"
    assert condition(cluster, one.name)["reason"] == "Unschedulable"
    assert not contract.is_held_mark(condition(cluster, two.name).get("message"))  # released: not marked


def test_a_refused_mark_is_said_once_per_app_and_holds_its_marks_not_its_releases(
    cluster: Cluster, actor: Actor, outcomes: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """403 (RBAC without pods/status, an admission policy older than the mark): the first mark of the app
    alone is sent, a warning and one Event say it, the rest of its marks are skipped, now and at its next
    decisions, while its gate removals go on and the app is not put in backoff. Another app is not held."""
    pods = [created(cluster, "app-a", i) for i in range(1, 5)]
    other = created(cluster, "app-b", 1)
    cluster.faults.fail("patch", "pods/status", 403, count=1)
    with caplog.at_level(logging.WARNING, logger="allocator.actor"):
        results = actor.submit([MarkHeld(p.app, p, "why") for p in pods[:3]])
        (result,) = (f.result() for f in results.values())
        later = actor.submit([Release(pods[3].app, pods[3]), MarkHeld(pods[0].app, pods[0], "why")])
        (second,) = (f.result() for f in later.values())
        (third,) = (f.result() for f in actor.submit([MarkHeld(other.app, other, "why")]).values())
    assert (result.ok, second.ok, second.released, third.ok) == (True, True, [pods[3].uid], True)
    assert outcomes == ["refused", "skipped", "skipped", "skipped", "written"]
    sent = [e for e in cluster.requests.entries() if e.resource == "pods/status"]
    assert [(e.name, e.code) for e in sent] == [(pods[0].name, 403), (other.name, 200)]
    assert len([r for r in caplog.records if "demand mark" in r.getMessage()]) == 1
    events, _, _ = cluster.store.list("events", "spark")
    assert [(e["reason"], e["count"]) for e in events] == [("DemandMarkRefused", 1)]


def test_a_mark_whose_answer_is_lost_is_repeated_and_its_422_is_unclear_never_a_second_write(
    cluster: Cluster, actor: Actor, outcomes: list[str]
) -> None:
    """The mark tests the SchedulingGated reason it replaces: kube.py repeats it after a lost answer
    (`repeat_is_safe`), and the repeat's failed test says "maybe written", which the watch will show."""
    pod = created(cluster, "app-a", 1)
    cluster.faults.lose("patch", "pods/status")
    (result,) = (f.result() for f in actor.submit([MarkHeld(pod.app, pod, "why")]).values())
    assert result.ok and outcomes == ["unclear"]
    sent = [e.code for e in cluster.requests.entries() if e.resource == "pods/status"]
    assert sent == [200, 422]
    assert contract.is_held_mark(condition(cluster, pod.name)["message"])

"""The allocator's rule as a pure function: table-driven cases with a fake clock, and invariants."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.decision import WAITING_EVENT_SECONDS, decide, rebuilt_memory
from allocator.model import (
    AppMemory,
    AppView,
    CreateConfigMap,
    DeleteConfigMap,
    DeletePod,
    DeletionReason,
    DriverRecord,
    Event,
    Now,
    PodRecord,
    Release,
    Snapshot,
)
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.policy import Policy, load_policy


def policy(
    batch: int = 10,
    per_app: int = 20,
    per_ns: int = 200,
    cluster: int = 500,
    delay: float = 1,
    extra: str = "",
) -> Policy:
    return load_policy(
        f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: {delay}, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns}, maxPendingCluster: {cluster}}}
caps: {{batchSize: 50, maxPendingPerApp: 100}}
profiles:
  - name: p
{extra}
"""
    )


def pod(
    app: str,
    i: int,
    *,
    ns: str = "spark",
    gated: bool = True,
    node: str | None = None,
    phase: str = "Pending",
    deleting: bool = False,
    profile: str | None = "p",
    **kw: Any,
) -> PodRecord:
    return PodRecord(
        ns,
        f"{app}-exec-{i}",
        f"uid-{ns}-{app}-{i}",
        app,
        i,
        "0",
        gated,
        profile,
        node,
        phase,
        deleting,
        1000.0 + i,
        gate_index=0 if gated else None,
        **kw,
    )


def view(
    app: str,
    pods: list[PodRecord],
    *,
    ns: str = "spark",
    driver: DriverRecord | None = None,
    seen: bool = False,
    config_maps: frozenset[str] = frozenset(),
) -> AppView:
    return AppView(AppKey(ns, app), tuple(pods), driver, seen or driver is not None, config_maps)


def snap(*views: AppView, sources: frozenset[str] = frozenset()) -> Snapshot:
    return Snapshot({v.key: v for v in views}, sources)


def released(decision: Any) -> list[str]:
    return [a.pod.name for a in decision.actions if isinstance(a, Release)]


def test_batch_size_and_executor_id_order() -> None:
    pods = [pod("a", i) for i in (12, 3, 7, 1, 2, 4, 5, 6, 8, 9, 10, 11)]
    d = decide(snap(view("a", pods)), policy(batch=5), 100.0, {})
    assert released(d) == [f"a-exec-{i}" for i in (1, 2, 3, 4, 5)]


def test_in_flight_limit_counts_released_pending_pods_only() -> None:
    pods = [pod("a", i, gated=False) for i in range(1, 19)]  # 18 in flight
    pods += [pod("a", i, gated=False, node="n", phase="Running") for i in range(19, 30)]
    pods += [pod("a", i, gated=False, deleting=True) for i in range(30, 35)]  # deleting: no longer counts
    pods += [pod("a", i) for i in range(35, 60)]
    d = decide(snap(view("a", pods)), policy(batch=10, per_app=20), 100.0, {})
    assert released(d) == ["a-exec-35", "a-exec-36"]


def test_previous_batch_must_be_bound_and_batch_delay_passed() -> None:
    pods = [pod("a", 1, gated=False), pod("a", 2, gated=False, node="n"), pod("a", 3), pod("a", 4)]
    memory = {
        AppKey("spark", "a"): AppMemory(last_release_at=100.0, last_batch=frozenset({"a-exec-1", "a-exec-2"}))
    }
    d = decide(snap(view("a", pods)), policy(batch=2, delay=1), 105.0, memory)
    assert (
        released(d) == [] and "previous batch not yet bound" in d.settings[AppKey("spark", "a")].waiting_for
    )
    assert d.due == {}  # held by its unbound batch: nothing to wake for
    pods[0] = msgspec.structs.replace(pods[0], node="n")
    held = decide(snap(view("a", pods)), policy(batch=2, delay=1), 100.5, memory)
    assert released(held) == [] and held.due == {AppKey("spark", "a"): 101.0}  # the loop wakes for it then
    assert released(decide(snap(view("a", pods)), policy(batch=2, delay=1), 101.0, memory)) == [
        "a-exec-3",
        "a-exec-4",
    ]
    gone = [pods[1], pods[2], pods[3]]  # a pod of the previous batch that is gone no longer blocks
    assert released(decide(snap(view("a", gone)), policy(batch=2, delay=1), 101.0, memory)) == [
        "a-exec-3",
        "a-exec-4",
    ]


def test_a_batch_cut_short_is_topped_up_within_its_window() -> None:
    # Spark had created one pod when the app's first batch (of 3) went; the two it created next join that
    # batch at once, bound or not (the app still has at most a batch unbound), without waiting a whole delay;
    # then the window is full, and the next batch waits for the delay and for this one to be bound.
    first = [pod("a", 1)]
    p = policy(batch=3, delay=1)
    d = decide(snap(view("a", first)), p, 100.0, {})
    assert released(d) == ["a-exec-1"]
    more = [pod("a", 1, gated=False), pod("a", 2), pod("a", 3), pod("a", 4)]
    topped = decide(snap(view("a", more)), p, 100.2, d.memory)
    assert released(topped) == ["a-exec-2", "a-exec-3"]
    mem = topped.memory[AppKey("spark", "a")]
    # The delay counts from the top-up: no span shorter than the delay sees more than one batch.
    assert mem.last_release_at == 100.2 and mem.last_batch == {"a-exec-1", "a-exec-2", "a-exec-3"}
    released_3 = [more[0]] + [msgspec.structs.replace(q, gated=False) for q in more[1:3]] + [more[3]]
    assert released(decide(snap(view("a", released_3)), p, 100.3, topped.memory)) == []  # the window is full
    unbound = decide(snap(view("a", released_3)), p, 101.2, topped.memory)
    assert released(unbound) == [] and unbound.settings[AppKey("spark", "a")].waiting_on == "previous-batch"
    bound = [msgspec.structs.replace(q, node="n") for q in released_3[:3]] + [more[3]]
    full = decide(snap(view("a", bound)), p, 101.0, topped.memory)
    assert released(full) == [] and full.due == {AppKey("spark", "a"): 101.2}
    assert released(decide(snap(view("a", bound)), p, 101.2, topped.memory)) == ["a-exec-4"]


def test_namespace_and_cluster_budgets_bind_and_apps_take_turns_oldest_first() -> None:
    apps = [view(name, [pod(name, i) for i in range(1, 11)]) for name in ("a", "b", "c")]
    memory = {
        AppKey("spark", "c"): AppMemory(waiting_since=10.0),
        AppKey("spark", "a"): AppMemory(waiting_since=20.0),
    }
    d = decide(snap(*apps), policy(batch=5, cluster=12), 100.0, memory)
    assert released(d) == [f"c-exec-{i}" for i in range(1, 6)] + [f"a-exec-{i}" for i in range(1, 6)] + [
        "b-exec-1",
        "b-exec-2",
    ]
    assert d.limit_hits == {"cluster": 1}  # b was cut to 2 by the cluster budget
    # Two limits leaving the same room both bind, and both are counted; the narrowest is the reason.
    tie = decide(snap(apps[0]), policy(batch=5, per_app=3, per_ns=3), 100.0, {})
    assert len(released(tie)) == 3 and tie.limit_hits == {"app": 1, "namespace": 1}
    # The next turn: c and a just had a batch, so b (still waiting) goes first.
    assert d.memory[AppKey("spark", "b")].waiting_since == 100.0
    assert d.memory[AppKey("spark", "c")].waiting_since == 100.0


def test_a_batch_a_shared_budget_cut_short_is_topped_up_before_it_binds() -> None:
    # The CI failure of 2026-11-25 (tests/allocator/test_integration.py, three apps under a cluster budget of
    # three batches): the app cut to 2 had to wait for those 2 to bind, and the others, whose batches bound
    # sooner, took every slot that freed meanwhile: turns of 5, 5 and 2, the same app short each time.
    p = policy(batch=5, cluster=12)
    memory = {
        AppKey("spark", n): AppMemory(waiting_since=t) for n, t in (("a", 10.0), ("b", 20.0), ("c", 30.0))
    }
    first = decide(snap(*(view(n, [pod(n, i) for i in range(1, 11)]) for n in "abc")), p, 100.0, memory)
    assert Counter(name[0] for name in released(first)) == {"a": 5, "b": 5, "c": 2}
    # a's batch binds and starts: 5 slots free. c's 2 are not bound yet: it tops its batch up with 3 (at most
    # a batch unbound), while a waits for its delay and b for its batch to bind.
    a = view("a", [pod("a", i, gated=False, node="n", phase="Running") for i in range(1, 6)])
    a = replace(a, pods=a.pods + tuple(pod("a", i) for i in range(6, 11)))
    b = view("b", [pod("b", i, gated=i > 5) for i in range(1, 11)])
    c = view("c", [pod("c", i, gated=i > 2) for i in range(1, 11)])
    second = decide(snap(a, b, c), p, 100.1, first.memory)
    assert released(second) == ["c-exec-3", "c-exec-4", "c-exec-5"]
    waiting_on = {k.app_id: s.waiting_on for k, s in second.settings.items()}
    assert waiting_on == {"a": "delay", "b": "previous-batch", "c": None}
    # Its batch is full now: the rest waits for the delay and for the batch to bind.
    third = decide(snap(a, b, c), p, 100.1, second.memory)
    assert released(third) == [] and third.settings[AppKey("spark", "c")].waiting_on == "previous-batch"


def test_budget_never_negative_with_bypassed_pods_and_bypass_is_reported() -> None:
    bypassed = [pod("x", i, gated=False, profile=None) for i in range(1, 9)]
    waiting = [pod("a", i) for i in range(1, 5)]
    d = decide(snap(view("x", bypassed), view("a", waiting)), policy(per_ns=5), 100.0, {})
    assert released(d) == []
    assert "namespace spark has 8/5" in d.settings[AppKey("spark", "a")].waiting_for
    [warning] = [a for a in d.actions if isinstance(a, Event) and a.reason == "BypassedWebhook"]
    assert warning.count == 8 and warning.pod == "x-exec-1" and warning.app == AppKey("spark", "x")
    assert warning.message.startswith("8 executor pod(s) of app spark/x were admitted without sparkgate")


def test_an_excluded_namespaces_executors_count_in_the_budget_but_are_not_reported_bypassed() -> None:
    """docs/policy.md: excludedNamespaces are admitted unchanged on purpose (no BypassedWebhook Event);
    their pods in flight still load the scheduler, so they count toward maxPendingCluster."""
    p = load_policy(
        """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {batchSize: 10, maxPendingPerApp: 20, maxPendingCluster: 10}
caps: {batchSize: 50, maxPendingPerApp: 100}
excludedNamespaces: [batch-*]
profiles:
  - name: p
"""
    )
    unshaped = [pod("x", i, ns="batch-etl", gated=False, profile=None) for i in range(1, 9)]
    waiting = [pod("a", i) for i in range(1, 5)]
    d = decide(snap(view("x", unshaped, ns="batch-etl"), view("a", waiting)), p, 100.0, {})
    assert released(d) == ["a-exec-1", "a-exec-2"]  # 8 of the cluster's 10 are taken
    assert [a for a in d.actions if isinstance(a, Event) and a.reason == "BypassedWebhook"] == []


def test_same_app_id_in_two_namespaces_are_two_apps() -> None:
    a1 = view("a", [pod("a", i, ns="ns1") for i in range(1, 4)], ns="ns1")
    a2 = view("a", [pod("a", i, ns="ns2", gated=False) for i in range(1, 4)], ns="ns2")
    d = decide(snap(a1, a2), policy(per_app=3), 100.0, {})
    assert len(released(d)) == 3 and all(
        a.app.namespace == "ns1" for a in d.actions if isinstance(a, Release)
    )


def test_annotations_lower_limits_clamped_and_malformed_ones_warned() -> None:
    pods = [pod("a", i, batch_size="2") for i in range(1, 10)]
    assert len(released(decide(snap(view("a", pods)), policy(batch=10), 100.0, {}))) == 2
    pods = [pod("a", i, max_pending="1000", batch_size="abc") for i in range(1, 200)]
    d = decide(
        snap(view("a", pods)),
        policy(batch=50, per_app=20, extra="    allocation: {batchSize: 50}"),
        100.0,
        {},
    )
    assert len(released(d)) == 50, "max-pending 1000 clamped to the cap (100); batch from the profile"
    assert any(
        isinstance(a, Event) and a.reason == "InvalidAnnotation" and "abc" in a.message for a in d.actions
    )
    # Two bad annotations are two Event series (sparkgate/events.py), not one whose message flips.
    pods = [pod("a", i, max_pending="many", batch_size="abc") for i in range(1, 3)]
    d = decide(snap(view("a", pods)), policy(), 100.0, {})
    invalid = [a for a in d.actions if isinstance(a, Event) and a.reason == "InvalidAnnotation"]
    assert len(invalid) == 2 and len({a.key for a in invalid}) == 2


def test_deleted_executor_ids_are_never_released_again() -> None:
    pods = [pod("a", 1), pod("a", 2)]
    d = decide(snap(view("a", pods)), policy(), 100.0, {}, deleted_exec_ids={AppKey("spark", "a"): {1}})
    assert released(d) == ["a-exec-2"]
    assert [(a.pod.name, a.reason) for a in d.actions if isinstance(a, DeletePod)] == [
        ("a-exec-1", DeletionReason.ID_REUSE)
    ]


def test_finished_driver_deletes_gated_pods_and_config_maps() -> None:
    driver = DriverRecord("spark", "a-driver", "d1", "a", "Succeeded", False)
    pods = [pod("a", 1), pod("a", 2, gated=False, node="n", phase="Running")]
    d = decide(snap(view("a", pods, driver=driver, config_maps=frozenset({"sg-a-x"}))), policy(), 100.0, {})
    assert [a.pod.name for a in d.actions if isinstance(a, DeletePod)] == ["a-exec-1"]
    assert [a.name for a in d.actions if isinstance(a, DeleteConfigMap)] == ["sg-a-x"]
    assert d.memory[AppKey("spark", "a")].finished
    gone = decide(snap(view("a", [pod("a", 1)], seen=True)), policy(), 100.0, {})
    assert [a.reason for a in gone.actions if isinstance(a, DeletePod)] == [DeletionReason.APP_FINISHED]


def test_config_maps_are_created_before_the_first_release_and_a_missing_source_holds_the_app() -> None:
    pol = policy(extra="    configMaps: [{source: log4j, mountPath: /etc/log4j}]")
    driver = DriverRecord("spark", "a-driver", "d1", "a", "Running", False)
    copy = contract.app_configmap_name("a", "log4j")
    app = view("a", [pod("a", 1, copies=(copy,)), pod("a", 2, copies=(copy,))], driver=driver)
    held = decide(snap(app), pol, 100.0, {})
    assert released(held) == []
    assert any(isinstance(a, Event) and a.reason == "SourceConfigMapMissing" for a in held.actions)
    assert held.settings[AppKey("spark", "a")].missing_source == "log4j"
    d = decide(snap(app, sources=frozenset({"log4j"})), pol, 100.0, {})
    first = d.actions[0]
    assert isinstance(first, CreateConfigMap) and first.name == copy and first.owner == driver
    assert released(d) == ["a-exec-1", "a-exec-2"]
    existing = view("a", [pod("a", 3, copies=(copy,))], driver=driver, config_maps=frozenset({copy}))
    assert not any(
        isinstance(a, CreateConfigMap)
        for a in decide(snap(existing, sources=frozenset({"log4j"})), pol, 100.0, {}).actions
    )


def test_the_copies_made_are_the_ones_the_pods_mount_whatever_the_policy_says_now() -> None:
    """A policy edit in the middle of an app (its profile now names another source, or none): the pods
    admitted before mount the copy chosen at admission, and that one is made, from its own source."""
    old = contract.app_configmap_name("a", "log4j")
    pods = [pod("a", 1, copies=(old,)), pod("a", 2, copies=(old,))]
    renamed = policy(extra="    configMaps: [{source: log4j-v2, mountPath: /etc/log4j}]")
    for pol in (renamed, policy()):
        d = decide(snap(view("a", pods), sources=frozenset({"log4j", "log4j-v2"})), pol, 100.0, {})
        assert [(a.name, a.source) for a in d.actions if isinstance(a, CreateConfigMap)] == [(old, "log4j")]
        assert released(d) == ["a-exec-1", "a-exec-2"]
    # The source of the copy the pods mount is gone: the app waits, named by the copy it cannot make.
    held = decide(snap(view("a", pods), sources=frozenset({"log4j-v2"})), renamed, 100.0, {})
    assert released(held) == [] and held.settings[AppKey("spark", "a")].missing_source == old
    # Pods mounting no copy need none, whatever the profile names.
    bare = decide(snap(view("a", [pod("a", 1)]), sources=frozenset({"log4j-v2"})), renamed, 100.0, {})
    assert not any(isinstance(a, CreateConfigMap) for a in bare.actions) and released(bare) == ["a-exec-1"]


def test_an_app_without_memory_waits_for_its_released_unbound_pods_as_its_last_batch() -> None:
    """After a fail-over the new leader has no memory: the rule rebuilds the last batch from the cluster."""
    pods = [pod("a", 1, gated=False), pod("a", 2, gated=False, node="n"), pod("a", 3)]
    pods += [pod("a", 4, gated=False, profile=None)]  # bypassed: not released by sparkgate
    app = view("a", pods)
    rebuilt = rebuilt_memory(app, Now(100.0, 2000.0))
    assert rebuilt.last_batch == {"a-exec-1"}
    held = decide(snap(app), policy(), 100.0, {AppKey("spark", "a"): rebuilt})
    assert released(held) == [] and "previous batch" in (
        held.settings[AppKey("spark", "a")].waiting_for or ""
    )
    bound = view("a", [msgspec.structs.replace(pods[0], node="n"), *pods[1:]])
    assert released(decide(snap(bound), policy(), 100.0, {AppKey("spark", "a"): rebuilt})) == ["a-exec-3"]


def test_an_app_that_is_over_has_its_gated_pods_and_copies_deleted_and_nothing_released() -> None:
    app = view(
        "a", [pod("a", 1), pod("a", 2, gated=False, phase="Failed")], config_maps=frozenset({"sg-a-x"})
    )
    d = decide(snap(app), policy(), 100.0, {}, ended={AppKey("spark", "a")})
    assert [(type(a).__name__, getattr(a, "reason", None)) for a in d.actions] == [
        ("DeletePod", DeletionReason.APP_FINISHED),
        ("DeleteConfigMap", None),
    ]
    assert released(decide(snap(app), policy(), 100.0, {})) == ["a-exec-1"]


def test_deciding_for_some_apps_still_counts_every_apps_pods_in_the_budget() -> None:
    busy = view("busy", [pod("busy", i, gated=False) for i in range(1, 11)])
    waiting = view("w", [pod("w", i) for i in range(1, 11)])
    d = decide(snap(busy, waiting), policy(per_ns=12), 100.0, {}, apps=[AppKey("spark", "w")])
    assert released(d) == ["w-exec-1", "w-exec-2"] and set(d.memory) == {AppKey("spark", "w")}


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, dict[AppKey, AppMemory]]:
    views, memory = [], {}
    for a in range(draw(st.integers(1, 5))):
        ns = draw(st.sampled_from(["n1", "n2"]))
        pods = []
        for i in range(1, draw(st.integers(0, 30)) + 1):
            state = draw(st.sampled_from(["gated", "inflight", "running", "deleting", "bypassed"]))
            pods.append(
                pod(
                    f"a{a}",
                    i,
                    ns=ns,
                    gated=state == "gated",
                    node="n" if state == "running" else None,
                    phase="Running" if state == "running" else "Pending",
                    deleting=state == "deleting",
                    profile=None if state == "bypassed" else "p",
                    batch_size=draw(st.sampled_from([None, "1", "3", "999", "x"])),
                )
            )
        views.append(view(f"a{a}", pods, ns=ns))
        memory[AppKey(ns, f"a{a}")] = AppMemory(waiting_since=draw(st.sampled_from([None, 1.0, 50.0])))
    return snap(*views), memory


@settings(max_examples=120, deadline=None)
@given(snapshots(), st.integers(1, 15), st.integers(1, 25), st.integers(1, 40), st.integers(1, 60))
def test_releases_never_exceed_any_limit(
    state: tuple[Snapshot, dict[AppKey, AppMemory]], batch: int, per_app: int, per_ns: int, cluster: int
) -> None:
    snapshot, memory = state
    pol = policy(batch=batch, per_app=per_app, per_ns=per_ns, cluster=cluster)
    d = decide(snapshot, pol, 100.0, memory)
    per_namespace_before = Counter(
        key.namespace for key, v in snapshot.apps.items() for p in v.pods if p.in_flight
    )  # counted from the pods, not from the sums the decision reads
    total_before = sum(per_namespace_before.values())
    assert per_namespace_before == {ns: n for ns, n in snapshot.in_flight_by_namespace().items() if n}
    by_app: dict[AppKey, int] = {}
    by_ns: dict[str, int] = {}
    for action in d.actions:
        if isinstance(action, Release):
            assert action.pod.gated and not action.pod.deleting
            by_app[action.app] = by_app.get(action.app, 0) + 1
            by_ns[action.app.namespace] = by_ns.get(action.app.namespace, 0) + 1
    for key, n in by_app.items():
        in_flight = sum(1 for p in snapshot.apps[key].pods if p.in_flight)
        allocation = d.settings[key].allocation  # the policy's, moved by annotations within the caps
        assert n <= allocation.batch_size <= 50
        assert in_flight + n <= max(allocation.max_pending_per_app, in_flight)
    for ns, n in by_ns.items():
        assert per_namespace_before[ns] + n <= max(per_ns, per_namespace_before[ns])
    assert total_before + sum(by_ns.values()) <= max(cluster, total_before)


def test_an_app_is_told_why_it_waits_once_it_had_no_release_for_five_seconds() -> None:
    """Most pods wait milliseconds for their release: a Waiting Event for each would be one Event write per
    pod. The app is told once it has had no release for WAITING_EVENT_SECONDS."""
    full = snap(view("a", [pod("a", i, gated=False) for i in range(1, 3)]), view("b", [pod("b", 1)]))
    p = policy(cluster=2)
    first = decide(full, p, 100.0, {})
    waits = [a for a in first.actions if isinstance(a, Event)]
    assert released(first) == [] and waits == []
    assert first.settings[AppKey("spark", "b")].waiting_on == "cluster"
    later = decide(full, p, 100.0 + WAITING_EVENT_SECONDS, first.memory)
    assert [(e.pod, e.reason, e.message) for e in later.actions if isinstance(e, Event)] == [
        ("b-exec-1", "Waiting", "waiting: the cluster has 2/2 pods in flight")
    ]


def test_a_waiting_app_is_told_again_at_most_once_a_minute() -> None:
    """The tick decides every waiting app each second: a Waiting Event at each decision was 1.3 M Event
    writes for 100,000 releases at 100,000 pods (bench/scale.py), the per-pod spam filter no bound since the
    first gated pod changes with every release. Once said, it is said again after
    WAITING_EVENT_REPEAT_SECONDS, while the app keeps waiting, even after a release in between."""
    full = snap(view("a", [pod("a", i, gated=False) for i in range(1, 3)]), view("b", [pod("b", 1)]))
    p = policy(cluster=2)
    memory = decide(full, p, 100.0, {}).memory
    said = []
    for second in range(1, 130):  # a decision every second, as the tick makes them
        decision = decide(full, p, 100.0 + second, memory)
        memory = decision.memory
        said += [second for a in decision.actions if isinstance(a, Event) and a.reason == "Waiting"]
    assert said == [5, 5 + 60, 5 + 120]


def test_a_rebuilt_memory_places_each_app_by_its_pods_age_on_the_monotonic_clock() -> None:
    """Issue 37: an app whose memory is rebuilt (every app at a new leader, a new app, one that ends and comes
    back) went to the back of the line. Its place is rebuilt from its pods: when its oldest gated pod was
    created, or its newest released one if later (a lower bound of its last release, after which it went to
    the back of the line), converted to the monotonic clock by its age."""
    now = Now(500.0, 2000.0)  # pods are created at 1000 + their executor id on the wall clock
    waited = view("a", [pod("a", 3), pod("a", 4)])
    served = view("b", [pod("b", 1), pod("b", 600, gated=False, node="n", phase="Running")])
    fresh = {k: rebuilt_memory(v, now) for k, v in ((waited.key, waited), (served.key, served))}
    assert fresh[waited.key].waiting_since == 500.0 - (2000.0 - 1003.0)
    assert fresh[served.key].waiting_since == 500.0 - (2000.0 - 1600.0)
    # Under a namespace budget of one batch, the app that waited longest goes first.
    d = decide(snap(waited, served), policy(batch=2, per_ns=2), 500.0, fresh)
    assert released(d) == ["a-exec-3", "a-exec-4"]
    # A place kept for an app that ended and came back wins; an app with nothing gated waits for nothing.
    assert rebuilt_memory(waited, now, place=7.0).waiting_since == 7.0
    assert rebuilt_memory(view("c", [pod("c", 1, gated=False)]), now).waiting_since is None


def test_a_new_apps_rebuilt_place_moves_with_no_wall_clock_step() -> None:
    """The one comparison of wall time with the API's timestamps is bounded: an app this replica saw appear
    (monotonic) is placed no earlier than that, whatever the wall clock says its pods' age is, so a step of
    this host's wall clock (or its skew with the API server) an hour either way moves it by no more than a
    second."""
    new = view("a", [pod("a", 1)])  # created at 1001 by the API server's clock
    places = {}
    for step in (0.0, 3600.0, -3600.0):
        now = Now(500.0, 1001.5 + step)  # this host's wall clock, stepped
        places[step] = rebuilt_memory(new, now, seen=499.6).waiting_since
    assert places[0.0] == 499.6
    assert all(place is not None and abs(place - places[0.0]) <= 1.0 for place in places.values())

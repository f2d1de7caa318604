"""Adaptive pacing (allocator/pacing.py) and its hook in the decision: the scheduler's answers as the signal.

A fake clock and a scripted scheduler: each test says which released pods the scheduler bound, which it called
unschedulable and which it has not answered yet, and checks what the next decision releases and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import pacing
from allocator.cache import pod_record
from allocator.decision import Decision, decide, rebuilt_memory
from allocator.metrics import AllocatorMetrics
from allocator.model import AppMemory, Now, PodRecord, Release, Snapshot
from allocator.pacing import Reason, Window
from allocator.status import AppsCollector, Status, app_summary, pacing_summary
from allocator.status_output import _window
from sparkgate.contract import AppKey
from sparkgate.policy import Policy, load_policy

from .test_decision import pod, released, snap, view

A = AppKey("spark", "a")


def adaptive(
    batch: int = 10,
    per_app: int = 1000,
    per_ns: int = 5000,
    cluster: int = 5000,
    ceiling: int = 100,
    slow_bind: float = 2,
    pacing_: str = "adaptive",
    unschedulable: float = 60,
    delay: float = 1,
) -> Policy:
    return load_policy(
        f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{pacing: {pacing_}, batchSize: {batch}, batchDelaySeconds: {delay}, maxBatchSize: {ceiling},
  slowBindSeconds: {slow_bind}, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns},
  maxPendingCluster: {cluster}, unschedulableSeconds: {unschedulable}}}
caps: {{batchSize: 50, maxPendingPerApp: 1000}}
profiles:
  - name: p
"""
    )


class Cluster:
    """The app's pods as the cache would show them, changed by the test as the scheduler answers."""

    def __init__(self, *apps: tuple[str, int]) -> None:
        self.pods = {name: {i: pod(name, i) for i in range(1, n + 1)} for name, n in apps}
        self.memory: dict[AppKey, AppMemory] = {}

    def snapshot(self) -> Snapshot:
        return snap(*(view(name, list(pods.values())) for name, pods in self.pods.items()))

    def decide(self, policy: Policy, now: float, *, fail: bool = False) -> Decision:
        """One decision; its releases are applied unless `fail` (the API server refused every write: the
        pods stay gated, as after a 409/422 or a failed config-map creation)."""
        d = decide(self.snapshot(), policy, now, self.memory)
        self.memory = {**self.memory, **d.memory}
        for action in [] if fail else d.actions:
            if isinstance(action, Release):
                p = action.pod
                self.pods[p.app_id][p.exec_id or 0] = msgspec.structs.replace(p, gated=False, gate_index=None)
        return d

    def answer(self, app: str, *, run: int = 0, refuse: int = 0) -> None:
        """The scheduler binds (and the kubelet starts) the first `run` released unbound pods of the app, and
        calls the next `refuse` unschedulable."""
        waiting = [
            p for p in self.pods[app].values() if not p.gated and p.node is None and p.phase == "Pending"
        ]
        for p in waiting[:run]:
            self.pods[app][p.exec_id or 0] = msgspec.structs.replace(
                p, node="n", phase="Running", unschedulable=False
            )
        for p in waiting[run : run + refuse]:
            self.pods[app][p.exec_id or 0] = msgspec.structs.replace(p, unschedulable=True)

    def unanswered(self, app: str) -> list[str]:
        return [p.name for p in self.pods[app].values() if pacing.unanswered(p)]

    def window(self, app: str = "a") -> Window:
        window = self.memory[AppKey("spark", app)].pacing
        assert window is not None
        return window


def held(d: Decision, unbound: int) -> bool:
    """App a released nothing, held by the fixed rule's previous batch of `unbound` pods."""
    why = f"app spark/a: previous batch not yet bound ({unbound} pods)"
    return released(d) == [] and d.settings[A].waiting_for == why


def test_slow_start_doubles_per_bound_round_up_to_the_ceiling_with_no_batch_delay() -> None:
    cluster, policy = Cluster(("a", 400)), adaptive(batch=10, ceiling=100)
    sizes, reasons = [], []
    for _ in range(6):
        d = cluster.decide(policy, 100.0)  # the same instant: no batch delay while every pod is bound at once
        sizes.append(len(released(d)))
        cluster.answer("a", run=1000)
        reasons.append(cluster.window().reason)
    assert sizes == [10, 20, 40, 80, 100, 100]
    assert reasons[:3] == [Reason.SLOW_START] * 3
    cluster.decide(policy, 100.0)
    assert cluster.window().reason is Reason.CEILING and cluster.window().size == 100


def test_the_window_holds_released_pods_not_yet_answered_and_grows_by_each_pod_bound() -> None:
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10)
    assert len(released(cluster.decide(policy, 100.0))) == 10
    held = cluster.decide(policy, 100.1)
    assert released(held) == [] and held.settings[A].waiting_for == (
        "app spark/a: 10 released pods not yet bound (window 10)"
    )
    cluster.answer("a", run=4)
    topped = cluster.decide(policy, 100.2)  # 4 bound: the window is 14, 6 still wait: 8 more at once
    assert released(topped) == [f"a-exec-{i}" for i in range(11, 19)]
    window = cluster.window()
    assert (window.size, window.waiting) == (14, 14) and set(window.round) == {
        f"a-exec-{i}" for i in range(5, 19)
    }  # the bound pods left the round
    cluster.answer("a", run=10)
    d = cluster.decide(policy, 100.3)
    assert cluster.window().size == 24  # grew by the 10 bound since, the round not yet all bound
    assert len(released(d)) == 20 and cluster.window().waiting == 24


def test_an_unschedulable_pod_falls_back_to_the_fixed_rule_but_does_not_hold_the_app() -> None:
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10)
    cluster.decide(policy, 100.0)
    cluster.answer("a", run=10)
    cluster.decide(policy, 100.0)  # window 20
    cluster.answer("a", run=19, refuse=1)
    d = cluster.decide(policy, 100.5)
    assert cluster.window() == Window(10, Reason.UNSCHEDULABLE)
    # The fixed rule now: the batch delay since the last release (100.0), then batchSize.
    assert released(d) == [] and d.settings[A].waiting_for == "app spark/a: batch delay of 1s"
    assert d.due == {A: 101.0}
    # The unschedulable pod has had its answer: it does not hold the next batch, which is batchSize less the
    # refused pods in flight (at most one batch of the app's pods unplaced: the refused-pod bound).
    d = cluster.decide(policy, 101.0)
    assert len(released(d)) == 9 and cluster.window().reason is Reason.UNSCHEDULABLE
    assert d.settings[A].unschedulable == 1 and d.settings[A].overdue == 0
    assert d.due == {A: 160.5}  # when the refusal (seen at 100.5) will be unschedulableSeconds (60) old
    assert released(cluster.decide(policy, 101.5)) == []  # previous batch unbound


def test_a_pod_left_unanswered_past_the_bound_falls_back_and_holds_as_the_fixed_rule_does() -> None:
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10, slow_bind=2)
    first = cluster.decide(policy, 100.0)
    assert first.due == {A: 102.0}  # decided again when the first pod will have waited the bound
    cluster.answer("a", run=9)
    d = cluster.decide(policy, 102.0)
    assert cluster.window().reason is Reason.SLOW_BIND and cluster.window().size == 10
    assert released(d) == [] and "previous batch not yet bound (1 pods)" in (d.settings[A].waiting_for or "")
    assert d.due == {}  # fallen back: nothing more to wake for


def test_a_round_bound_in_time_after_a_fall_back_starts_slow_start_again() -> None:
    cluster, policy = Cluster(("a", 200)), adaptive(batch=10, slow_bind=2)
    cluster.decide(policy, 100.0)
    cluster.answer("a", refuse=10)
    cluster.decide(policy, 101.0)  # unschedulable: the fixed rule releases a batch after the delay
    assert cluster.window().reason is Reason.UNSCHEDULABLE
    cluster.answer("a", run=20)  # room came: every pod bound, the refused ones too
    d = cluster.decide(policy, 101.5)
    assert (cluster.window().size, cluster.window().reason) == (10, Reason.SLOW_START) and len(
        released(d)
    ) == 10
    cluster.answer("a", run=10)
    cluster.decide(policy, 101.5)
    assert cluster.window().size == 20 and cluster.window().reason is Reason.SLOW_START


def test_fixed_pacing_keeps_todays_rule_an_unschedulable_pod_holds_its_app() -> None:
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10, pacing_="fixed")
    assert len(released(cluster.decide(policy, 100.0))) == 10
    cluster.answer("a", run=9, refuse=1)
    d = cluster.decide(policy, 200.0)
    assert released(d) == [] and "previous batch not yet bound (1 pods)" in (d.settings[A].waiting_for or "")
    assert cluster.window() == Window(10, Reason.FIXED) and d.due == {A: 260.0}  # the refusal overdue then
    d = cluster.decide(policy, 260.0)
    assert released(d) == [] and d.settings[A].waiting_on == "unschedulable"
    assert d.settings[A].waiting_for == (
        "app spark/a: 1 released pods unschedulable, the first for unschedulableSeconds (60s) or more: "
        "held back until they are bound or gone"
    )


def test_once_the_refused_pods_are_bound_slow_start_begins_again_without_a_fixed_round() -> None:
    # `large` (docs/performance.md): when an app ended, the freed slots beyond the released pods waited for
    # the others' fixed-rule batches, batchSize per delay, before a round bound in time let them grow again.
    cluster, policy = Cluster(("a", 200)), adaptive(batch=10)
    cluster.decide(policy, 100.0)
    cluster.answer("a", refuse=10)  # the cluster is full: every pod released is refused
    d = cluster.decide(policy, 100.2)
    assert cluster.window().reason is Reason.UNSCHEDULABLE and released(d) == []  # the batch delay
    cluster.answer("a", run=10)  # room came: the scheduler placed every pod it had refused
    d = cluster.decide(policy, 100.4)  # within the delay: no fixed round needed first
    assert cluster.window() == Window(10, Reason.SLOW_START, dict.fromkeys(released(d), 100.4), 10, 100.4)
    assert len(released(d)) == 10


def test_a_full_cluster_apps_take_turns_instead_of_one_being_held_by_its_unschedulable_pod() -> None:
    # The real cluster's second app ran nothing for the whole run, held by "previous batch not yet bound
    # (1 pods)" (docs/real-cluster-facts.md). Adaptive: a refused pod is answered, its app takes its turns.
    def run(mode: str) -> list[dict[str, int]]:
        policy = adaptive(batch=10, cluster=12, pacing_=mode)
        cluster = Cluster(("a", 50), ("b", 50))
        cluster.memory = {
            AppKey("spark", "b"): AppMemory(waiting_since=1.0)
        }  # b waits longest: it goes first
        cluster.decide(policy, 100.0)  # b: 10, a: 2 (the cluster budget binds)
        cluster.answer("a", refuse=2)
        cluster.answer("b", refuse=10)
        seen = []
        for now, frees in ((101.0, "b"), (102.0, "a"), (103.0, "b")):
            cluster.answer(frees, run=1)  # one executor gets room: a slot frees
            cluster.decide(policy, now)
            cluster.answer("a", refuse=50)  # the cluster is full: the scheduler refuses what was released
            cluster.answer("b", refuse=50)
            seen.append({n: sum(p.in_flight for p in cluster.pods[n].values()) for n in "ab"})
        return seen

    # Each freed slot goes to the app that waited longest: a (tie at 100, by name), then b (a just had one),
    # then a again; the cluster cap holds all along.
    assert run("adaptive") == [{"a": 3, "b": 9}, {"a": 2, "b": 10}, {"a": 3, "b": 9}]
    assert run("fixed") == [{"a": 2, "b": 9}, {"a": 1, "b": 9}, {"a": 1, "b": 8}]  # both held for good


def test_the_ceiling_never_passes_max_pending_per_app_and_a_larger_batch_annotation_still_applies() -> None:
    assert pacing.ceiling(adaptive(batch=10, per_app=30, ceiling=100).allocation) == 30
    assert pacing.ceiling(replace(adaptive(batch=10, ceiling=20).allocation, batch_size=40)) == 40


@st.composite
def answers(draw: st.DrawFn) -> list[tuple[str, int, int, float]]:
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from("abc"),
                st.integers(0, 30),
                st.integers(0, 10),
                st.floats(0, 3, allow_nan=False),
            ),
            min_size=1,
            max_size=25,
        )
    )


@settings(max_examples=80, deadline=None)
@given(answers(), st.integers(1, 12), st.integers(1, 60), st.integers(1, 80), st.integers(1, 100))
def test_adaptive_releases_never_exceed_any_limit(
    steps: list[tuple[str, int, int, float]], batch: int, per_app: int, per_ns: int, cap: int
) -> None:
    policy = adaptive(
        batch=batch, per_app=max(per_app, 1), per_ns=per_ns, cluster=cap, ceiling=max(batch, 50)
    )
    cluster = Cluster(("a", 120), ("b", 60), ("c", 30))
    now = 100.0
    for app, run, refuse, dt in steps:
        before = cluster.snapshot()
        d = cluster.decide(policy, now)
        per_ns_before = Counter(k.namespace for k, v in before.apps.items() for p in v.pods if p.in_flight)
        total_before = sum(per_ns_before.values())
        new = sum(1 for a in d.actions if isinstance(a, Release))
        assert total_before + new <= max(cap, total_before)
        assert per_ns_before["spark"] + new <= max(per_ns, per_ns_before["spark"])
        for key, v in cluster.snapshot().apps.items():
            was = sum(p.in_flight for p in before.apps[key].pods)
            assert sum(p.in_flight for p in v.pods) <= max(per_app, was)
            window = cluster.memory[key].pacing
            assert window is not None
            if window.growing:
                assert min(batch, per_app) <= window.size <= pacing.ceiling(policy.allocation)
            else:
                assert window.size == batch
            # The scheduler never has more of the app's pods unanswered than its window (or than it had).
            unanswered = sum(map(pacing.unanswered, v.pods))
            assert unanswered <= max(window.size, sum(map(pacing.unanswered, before.apps[key].pods)))
            assert window.reason is Reason.UNSCHEDULABLE or not any(map(pacing.refused, v.pods))
        cluster.answer(app, run=run, refuse=refuse)
        now += dt
    # Once the scheduler places everything, every pod is released in the end: no app is stuck.
    for _ in range(400):
        if not any(p.gated for pods in cluster.pods.values() for p in pods.values()):
            break
        for name in "abc":
            cluster.answer(name, run=1000)
        cluster.decide(policy, now)
        now += 10.0
    assert not any(p.gated for pods in cluster.pods.values() for p in pods.values())


def test_observe_is_pure_and_keeps_in_the_round_only_the_pods_not_bound() -> None:
    allocation = adaptive(batch=2).allocation
    pods = [pod("a", 1, gated=False, node="n"), pod("a", 2, gated=False), pod("a", 3)]
    start = pacing.released(pacing.observe(None, allocation, [], 0.0), ["a-exec-1", "a-exec-2"], 0.0)
    assert start == Window(2, Reason.SLOW_START, {"a-exec-1": 0.0, "a-exec-2": 0.0}, 2, 0.0)
    growing = pacing.observe(start, allocation, pods, 1.0)
    assert growing == Window(3, Reason.SLOW_START, {"a-exec-2": 0.0}, 1, 0.0)  # a-exec-1 bound: grown by it
    pods[2] = pod("a", 3, gated=False)
    refused: list[PodRecord] = [pods[0], msgspec.structs.replace(pods[1], unschedulable=True), pods[2]]
    fallen = pacing.observe(pacing.released(growing, ["a-exec-3"], 1.0), allocation, refused, 1.5)
    assert fallen == Window(2, Reason.UNSCHEDULABLE, {"a-exec-3": 1.0}, 1)  # only the pods still waiting
    assert pacing.released(Window(2, Reason.FIXED), ["a-exec-3"], 1.0) == Window(2, Reason.FIXED)


def test_the_cache_reads_the_schedulers_verdict_from_the_pod_scheduled_condition() -> None:
    def record(*conditions: dict[str, str]) -> PodRecord:
        obj = {
            "metadata": {"name": "x", "namespace": "spark", "labels": {"spark-app-selector": "a"}},
            "status": {"phase": "Pending", "conditions": list(conditions)},
        }
        found = pod_record(obj)
        assert found is not None
        return found

    refused = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
    assert record(refused).unschedulable
    assert not record({**refused, "reason": "SchedulingGated"}).unschedulable
    assert not record({**refused, "reason": "SchedulerError"}).unschedulable  # an extender failed: no verdict
    assert not record({"type": "PodScheduled", "status": "True"}).unschedulable
    assert not record().unschedulable


def test_apps_status_and_metrics_show_each_apps_window_and_why() -> None:
    cluster, policy = Cluster(("a", 100), ("b", 5)), adaptive(batch=10)
    cluster.decide(policy, 100.0)
    cluster.answer("b", refuse=1)
    cluster.decide(policy, 100.1)
    assert pacing_summary(cluster.memory[A]) == {"window": 10, "reason": "slow-start", "unanswered": 10}
    assert (
        _window({"pacing": pacing_summary(cluster.memory[AppKey("spark", "b")])})
        == "10 (unschedulable, 4 unanswered)"
    )
    metrics = AllocatorMetrics()
    shown = [cluster.snapshot()]

    def status() -> Status:
        return Status(shown[0], {}, dict(cluster.memory), {}, {}, 0, 0)

    metrics.tracked = AppsCollector(status).exposition

    def sample(name: str, **labels: str) -> float | None:
        return metrics.sample(name, {"namespace": "spark", **labels})

    assert sample("sparkgate_allocator_pacing_window", app="a") == 10
    assert sample("sparkgate_allocator_pacing_state", app="b", reason="unschedulable") == 1
    # one series an app: its reason's
    assert sample("sparkgate_allocator_pacing_state", app="b", reason="slow-start") is None
    shown[0] = Snapshot({A: shown[0].apps[A]}, frozenset())  # b is over: its series go with it
    assert sample("sparkgate_allocator_pacing_window", app="b") is None
    assert sample("sparkgate_allocator_pacing_state", app="b", reason="unschedulable") is None


def test_pods_released_before_a_restart_count_against_the_window_and_fall_it_back_if_never_answered() -> None:
    """A new leader (or a restart, or a switch from fixed) has no window: the pods sparkgate released that
    still wait for the scheduler join its round as first seen, so they count against it and make the app
    fall back if they are never answered, as the old leader's window would have."""
    cluster, policy = Cluster(("a", 200)), adaptive(batch=10, slow_bind=2)
    for i in range(1, 101):
        cluster.pods["a"][i] = pod("a", i, gated=False)  # released by the previous leader, not answered
    cluster.memory = {A: rebuilt_memory(cluster.snapshot().apps[A], Now(100.0, 2000.0))}
    d = cluster.decide(policy, 1000.0)
    assert released(d) == [] and (cluster.window().size, cluster.window().waiting) == (10, 100)
    assert d.due == {A: 1002.0}
    assert held(cluster.decide(policy, 1002.0), 100) and cluster.window().reason is Reason.SLOW_BIND
    cluster.answer("a", run=100)  # answered at last: slow start again, from batchSize
    assert len(released(cluster.decide(policy, 1003.0))) == 10


def test_switching_from_fixed_to_adaptive_counts_the_fixed_batch_not_yet_bound() -> None:
    cluster = Cluster(("a", 100))
    cluster.decide(adaptive(batch=10, pacing_="fixed"), 100.0)
    d = cluster.decide(adaptive(batch=10), 100.5)  # the fixed batch unanswered: the window is full
    assert released(d) == [] and cluster.window().waiting == 10


def test_switching_from_adaptive_to_fixed_waits_for_every_pod_the_window_left_unbound() -> None:
    cluster, policy = Cluster(("a", 400)), adaptive(batch=10, slow_bind=50)
    cluster.decide(policy, 100.0)
    cluster.answer("a", run=10)
    cluster.decide(policy, 100.1)
    cluster.answer("a", run=20)
    cluster.decide(policy, 100.2)  # 40 released
    cluster.answer("a", run=38)
    cluster.decide(policy, 100.3)  # 76 more: two of the earlier round still unbound
    left = cluster.unanswered("a")[:2]
    cluster.answer("a", run=78)
    for name in left:  # ... which the scheduler has not bound
        i = int(name.rsplit("-", 1)[1])
        cluster.pods["a"][i] = msgspec.structs.replace(cluster.pods["a"][i], node=None, phase="Pending")
    assert held(cluster.decide(adaptive(batch=10, slow_bind=50, pacing_="fixed"), 105.0), 2)


def test_after_a_fall_back_every_unanswered_pod_of_the_rounds_holds_the_app() -> None:
    # A slow pod of the first round: the later rounds bind, it does not; when it has waited slowBindSeconds,
    # it holds the app as the fixed rule's previous batch, though it was not in the last release.
    cluster, policy = Cluster(("a", 400)), adaptive(batch=10, slow_bind=2)
    cluster.decide(policy, 100.0)
    stuck = cluster.unanswered("a")[0]
    for now in (100.5, 101.0, 101.5):
        cluster.answer("a", run=1000)
        cluster.pods["a"][1] = pod("a", 1, gated=False)  # never bound
        cluster.decide(policy, now)
    cluster.answer("a", run=1000)
    cluster.pods["a"][1] = pod("a", 1, gated=False)
    for now in (102.0, 103.1, 104.2):
        d = cluster.decide(policy, now)
        assert cluster.window().reason is Reason.SLOW_BIND and released(d) == [], now
        assert cluster.unanswered("a") == [stuck]
    # A refusal while 21 pods wait: the fall back tops up nothing, and a batch delay later nothing either.
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10, slow_bind=5)
    cluster.decide(policy, 100.0)
    cluster.answer("a", run=10)
    cluster.decide(policy, 100.1)  # window 20
    cluster.answer("a", run=1)
    assert len(released(cluster.decide(policy, 100.2))) == 2  # window 21, 19 waiting
    cluster.answer("a", refuse=1)
    assert released(cluster.decide(policy, 100.3)) == [] and cluster.window().reason is Reason.UNSCHEDULABLE
    assert held(cluster.decide(policy, 101.3), 20)


def test_a_release_that_failed_and_was_retried_waits_from_its_retry() -> None:
    cluster, policy = Cluster(("a", 100)), adaptive(batch=10, slow_bind=5)
    cluster.decide(policy, 100.0)
    cluster.answer("a", run=10)
    assert len(released(cluster.decide(policy, 100.1, fail=True))) == 20  # every write refused
    retried = cluster.decide(policy, 110.0)  # after the app's backoff
    assert len(released(retried)) == 20 and set(cluster.window().round.values()) == {110.0}
    d = cluster.decide(policy, 110.05)
    assert cluster.window().reason is Reason.SLOW_START and cluster.window().waiting == 20
    assert d.due == {A: 115.0}


def test_the_app_woken_when_a_pod_will_have_waited_the_bound_falls_back_then() -> None:
    """One definition of "waited slowBindSeconds" (pacing.slow_bind_at) for the fall back and the wake-up,
    so an app decided exactly at its due time falls back (0.1 s is not exact in binary)."""
    cluster, policy = Cluster(("a", 5)), adaptive(batch=10, slow_bind=0.1)
    due = cluster.decide(policy, 1709385959.0).due[A]
    d = cluster.decide(policy, due)
    assert cluster.window().reason is Reason.SLOW_BIND and d.due == {}


def test_the_window_never_shows_more_than_the_app_may_have_in_flight() -> None:
    allocation = replace(adaptive(batch=10, per_app=30).allocation, batch_size=40)  # an annotation's batch
    window = pacing.observe(None, allocation, [], 0.0)
    assert (window.size, window.reason) == (30, Reason.CEILING)


def test_a_window_idle_for_the_bound_starts_slow_again_at_the_apps_next_burst() -> None:
    """Grown on a cluster with room, then nothing to release for slowBindSeconds: the room it measured may be
    gone, so the next burst starts from batchSize, as TCP restarts after an idle period. A burst within the
    bound keeps the window."""

    def burst_after(idle: float) -> tuple[int, Window]:
        cluster, policy = Cluster(("a", 150)), adaptive(batch=10, ceiling=100, slow_bind=5)
        now = 100.0
        while any(p.gated for p in cluster.pods["a"].values()):
            cluster.decide(policy, now)
            cluster.answer("a", run=1000)
            now += 0.1
        cluster.decide(policy, now)  # the last binds observed: the window at its ceiling, nothing outstanding
        assert cluster.window().reason is Reason.CEILING and not cluster.window().round
        for i in range(151, 351):  # Spark asks for more executors
            cluster.pods["a"][i] = pod("a", i)
        return len(released(cluster.decide(policy, now + idle))), cluster.window()

    assert burst_after(4.0)[0] == 100
    count, window = burst_after(6.0)
    assert count == 10 and (window.size, window.reason) == (10, Reason.SLOW_START)


def names(app: str, ids: range) -> list[str]:
    return [f"{app}-exec-{i}" for i in ids]


def refused_in_flight(cluster: Cluster, app: str) -> int:
    return sum(map(pacing.refused, cluster.pods[app].values()))


def running_count(cluster: Cluster, app: str) -> int:
    return sum(p.phase == "Running" for p in cluster.pods[app].values())


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
def test_an_app_that_can_never_be_scheduled_holds_one_batch_and_is_held_back_past_the_bound(
    mode: str,
) -> None:
    """Issue 37, finding 2: after the fall back, refused pods no longer held the app's next batch, so an app
    whose executors can never be scheduled released until maxPendingPerApp sat Pending (namespace cap 60,
    per app 50: `fixed` held 10, `adaptive` 50). Now at most one batch of its refused pods stays in flight,
    in both modes, and once its oldest refusal is unschedulableSeconds old it releases nothing, said so."""
    cluster = Cluster(("a", 100))
    policy = adaptive(batch=10, per_app=50, per_ns=60, cluster=500, pacing_=mode, unschedulable=60)
    now, most = 100.0, 0
    while now < 200.0:
        d = cluster.decide(policy, now)
        cluster.answer("a", refuse=1000)  # the scheduler cannot place any of them
        most = max(most, refused_in_flight(cluster, "a"))
        now += 1.5
    assert most == 10
    d = cluster.decide(policy, now)
    assert released(d) == [] and d.settings[A].waiting_on == "unschedulable"
    assert d.settings[A].waiting_for == (
        "app spark/a: 10 released pods unschedulable, the first for unschedulableSeconds (60s) or more: "
        "held back until they are bound or gone"
    )
    assert (d.settings[A].unschedulable, d.settings[A].overdue) == (10, 10)
    cluster.answer("a", run=1)  # room came for one: it goes to a refused pod, the others still hold
    now += 1.5
    assert released(cluster.decide(policy, now)) == []
    cluster.answer("a", run=1000)  # room came for all of them: the hold ends, the app goes on
    now += 1.5
    assert len(released(cluster.decide(policy, now))) == 10


def test_an_app_with_fewer_refused_pods_than_a_batch_goes_on_until_its_oldest_refusal_is_overdue() -> None:
    cluster = Cluster(("a", 100))
    policy = adaptive(batch=10, pacing_="adaptive", unschedulable=30)
    cluster.decide(policy, 100.0)
    cluster.answer("a", run=7, refuse=3)
    d = cluster.decide(policy, 101.0)  # fallen back: 7 = batchSize less the 3 refused in flight
    assert released(d) == names("a", range(11, 18)) and d.due == {A: 131.0}  # when they are 30 s old
    for i in range(11, 18):  # the new batch is bound, the refused pods are not
        cluster.pods["a"][i] = msgspec.structs.replace(cluster.pods["a"][i], node="n", phase="Running")
    d = cluster.decide(policy, 102.0)
    assert len(released(d)) == 7  # a batch delay later, the next: still 3 refused in flight
    for i in range(18, 25):
        cluster.pods["a"][i] = msgspec.structs.replace(cluster.pods["a"][i], node="n", phase="Running")
    d = cluster.decide(policy, 131.0)
    assert released(d) == [] and d.settings[A].waiting_on == "unschedulable"


BASE_POLICY = Path(__file__).parents[2] / "manifests" / "base" / "policy.yaml"


def test_under_the_shipped_policy_three_never_schedulable_apps_leave_two_schedulable_ones_their_turns() -> (
    None
):
    """Issue 37's acceptance, on the pure decision: three apps whose executors can never be scheduled and two
    whose executors can, in one namespace, under manifests/base/policy.yaml (60 a namespace, 20 an app, batches
    of 10, adaptive). The never-schedulable ones came first and held all 60 slots for good (20 each)."""
    policy = load_policy(BASE_POLICY.read_text())
    cluster = Cluster(("n1", 100), ("n2", 100), ("n3", 100))
    now = 100.0
    for _ in range(20):
        cluster.decide(policy, now)
        for app in ("n1", "n2", "n3"):
            cluster.answer(app, refuse=1000)
        now += 1.5
    cluster.pods.update(
        {"s1": {i: pod("s1", i) for i in range(1, 61)}, "s2": {i: pod("s2", i) for i in range(1, 61)}}
    )
    for _ in range(60):
        cluster.decide(policy, now)
        for app in ("n1", "n2", "n3"):
            cluster.answer(app, refuse=1000)
            assert refused_in_flight(cluster, app) <= 10
        for app in ("s1", "s2"):
            cluster.answer(app, run=1000)
        now += 1.5
    assert running_count(cluster, "s1") == running_count(cluster, "s2") == 60


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),  # batchSize
    st.integers(0, 4),  # apps whose executors can never be scheduled
    st.integers(1, 3),  # apps whose executors can
    st.integers(1, 40),  # maxPendingPerApp
    st.integers(1, 30),  # namespace room beyond what the never-schedulable ones may hold
    st.sampled_from(["adaptive", "fixed"]),
    st.sampled_from([0.0, 0.5, 2.0]),  # batchDelaySeconds
    st.sampled_from([0.0, 10.0, 60.0]),  # unschedulableSeconds
    st.lists(st.floats(0.1, 3.0), min_size=1, max_size=5),  # time between decisions, cycled
)
def test_schedulable_apps_are_never_starved_by_apps_that_cannot_be_scheduled(
    batch: int,
    never: int,
    schedulable: int,
    per_app: int,
    room: int,
    mode: str,
    delay: float,
    bound: float,
    steps: list[float],
) -> None:
    """Fairness as a property, over the pure decision and a simple scheduler that places every released pod
    of the schedulable apps and refuses every one of the others: whatever the mix, the schedulable apps get
    all their executors running. Each never-schedulable app holds at most one batch of the namespace's slots
    (min(batchSize, maxPendingPerApp)); so the schedulable ones are not starved whenever those batches leave
    room in the namespace (with more such apps than that, their refused pods fill it until they go: no rule
    that keeps the caps and deletes nobody's pods can do better). The caps hold at every decision."""
    held = never * min(batch, per_app)
    per_ns = held + room
    policy = adaptive(
        batch=batch,
        per_app=per_app,
        per_ns=per_ns,
        cluster=per_ns,
        ceiling=max(batch, 50),
        pacing_=mode,
        delay=delay,
        unschedulable=bound,
    )
    nevers = [f"n{i}" for i in range(never)]
    oks = [f"s{i}" for i in range(schedulable)]
    cluster = Cluster(*((app, 30) for app in nevers + oks))
    now = 100.0
    for i in range(3000):
        if all(running_count(cluster, app) == 30 for app in oks):
            break
        before = cluster.snapshot()
        d = cluster.decide(policy, now)
        in_namespace = sum(v.counts.in_flight for v in before.apps.values())
        assert in_namespace + len(released(d)) <= max(per_ns, in_namespace)
        for app in nevers:
            cluster.answer(app, refuse=1000)
            assert refused_in_flight(cluster, app) <= min(batch, per_app)
        for app in oks:
            cluster.answer(app, run=1000)
        now += steps[i % len(steps)]
    assert {app: running_count(cluster, app) for app in oks} == dict.fromkeys(oks, 30)


def test_apps_shows_the_refused_pod_bound_and_its_times_in_wall_time() -> None:
    """/apps (and so `sparkgate status`) shows the bound in force, the app's refused pods and how many are
    overdue, and its times as unix seconds though the memory keeps them on the monotonic clock."""
    cluster, policy = Cluster(("a", 30)), adaptive(batch=10, unschedulable=60)
    cluster.decide(policy, 100.0)
    cluster.answer("a", refuse=1000)
    cluster.decide(policy, 110.0)  # the refusals seen: the bound runs from here
    d = cluster.decide(policy, 170.0)
    summary = app_summary(
        cluster.snapshot().apps[A], d.settings[A], cluster.memory[A], None, now=Now(170.0, 1_800_000_000.0)
    )
    assert summary["limits"]["unschedulableSeconds"] == 60.0
    assert summary["unschedulable"] == {"inFlight": 10, "overdue": 10}
    assert summary["waitingFor"].endswith("held back until they are bound or gone")
    assert summary["lastReleaseAt"] == 1_800_000_000.0 - 70.0

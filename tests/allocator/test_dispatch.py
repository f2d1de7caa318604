"""The loop hands each decision's actions to the actor and goes on deciding (allocator/loop.py, `_dispatch`):
while an app's actions are being carried out, its releases count as in flight for the other apps' budgets,
the app itself is not decided again (a change is deferred to their end), and a failed write (or an exception
in its actions, counted) makes it re-decided after its backoff with what was not released no longer
counted. The parts are assembled as the command does; the actor is replaced by one whose work the test
finishes by hand; the Lease is taken on kubesim over HTTP."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from allocator.actor import AppResult
from allocator.commands import assemble
from allocator.decision import HELD_RECHECK_SECONDS, WAITING_EVENT_SECONDS
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from allocator.model import Action, Release
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy

A, B = AppKey("spark", "app-a"), AppKey("spark", "app-b")


class HeldActor:
    """Records what it is given; each app's work ends when the test says so."""

    def __init__(self) -> None:
        self.given: list[Action] = []
        self.pending: dict[AppKey, tuple[Future[AppResult], list[str]]] = {}

    def submit(self, actions: Iterable[Action]) -> dict[AppKey, Future[AppResult]]:
        futures: dict[AppKey, Future[AppResult]] = {}
        for action in actions:
            assert action.app not in self.pending, f"{action.app} was given actions while busy"
            self.given.append(action)
            futures.setdefault(action.app, Future())
        for app, future in futures.items():
            uids = [a.pod.uid for a in self.given if isinstance(a, Release) and a.app == app]
            self.pending[app] = (future, uids)
        return futures

    def finish(self, app: AppKey, ok: bool) -> None:
        """The app's actions are over: every write went through (ok), or the first failed (nothing released).
        An app given only Events wrote nothing, as the real actor reports (AppResult.wrote)."""
        future, uids = self.pending.pop(app)
        future.set_result(AppResult(ok, uids if ok else [], wrote=ok and bool(uids)))

    def releases(self) -> list[str]:
        given, self.given = self.given, []
        return [a.pod.name for a in given if isinstance(a, Release)]

    def close(self) -> None:
        pass


def executor(app: str, exec_id: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{app}-exec-{exec_id}",
            "namespace": "spark",
            "uid": f"uid-{app}-{exec_id}",
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
            },
            "annotations": {contract.ANNOTATION_PROFILE: "spark"},
            # Created now: an app the allocator finds at its start is placed in line by its pods' age.
            "creationTimestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
            "schedulingGates": [{"name": contract.GATE}],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Controller, HeldActor]]:
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        policy = write_policy(tmp_path / "policy.yaml", batch=4, delay=0, per_app=10, per_ns=10, cluster=4)
        source = PolicySource(str(policy), "sparkgate-system")
        # No batch period: the tests take the cache's news from the queue at once (test_workqueue has it).
        options = Options(backoff_base=0.0, batch_period=0.0)
        c = assemble(kube, source, options, AllocatorMetrics()).controller
        c.actor.close()
        actor = HeldActor()
        c.actor = actor  # type: ignore[assignment]
        c.cache.pods_replace([executor(app, i) for app in ("app-a", "app-b") for i in range(1, 5)])
        c.cache.drivers_replace([])
        c.cache.config_maps_replace([], source=True)
        c.cache.config_maps_replace([], source=False)
        assert c.cache.is_synced and c.histories.load() and c.elector.try_acquire_or_renew()
        yield c, actor
        kube.close()


def take(c: Controller) -> set[AppKey]:
    return c.queue.get(0)


def test_dispatched_releases_count_and_a_busy_app_waits_for_its_actions(
    controller: tuple[Controller, HeldActor],
) -> None:
    c, actor = controller
    assert take(c) == {A, B}  # the cache's news of both apps
    c.step({A, B})
    # The cluster budget (4) goes to app-a; its releases are still being sent.
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]
    assert B not in actor.pending  # it only waits: nothing to write (a Waiting Event comes after 5 s)
    assert take(c) == set()  # nothing changed for it
    # app-b is decided while app-a's PATCHes are in flight: they count, so it gets nothing.
    c.queue.add({B})
    c.step(take(c))
    assert actor.releases() == []
    # app-a changes while busy: not taken now, but once its actions are done.
    c.queue.add({A})
    assert take(c) == set()
    c.queue.add({A, B})  # a tick adds every app: only the idle ones are taken
    assert take(c) == {B}
    c.step({B})
    assert actor.releases() == []
    # A write of app-a failed: what it did not release is no longer in flight, and it is decided again.
    actor.finish(A, False)
    assert take(c) == {A}
    c.step({A})
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]


def test_an_exception_in_one_apps_actions_is_counted_and_that_app_backs_off(
    controller: tuple[Controller, HeldActor],
) -> None:
    """Which of its releases went out is not known: they stay in flight until the watch says (issue 37: they
    were dropped at once, and the budgets were short by each that had gone out). Those the watch shows are
    releases, counted; those it does not show within the expectations' expiry are not, and go again."""
    c, actor = controller
    c.step(take(c))
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]
    future, _ = actor.pending.pop(A)
    future.set_exception(RuntimeError("a bug in an action"))  # app-a's thread of the actor raised
    assert c.metrics.registry.get_sample_value("sparkgate_allocator_decision_errors_total") == 1
    assert c.queue.failures() == {A: (1, 0.0)}  # backing off (0 s here)
    assert take(c) == {A}
    c.step({A})
    assert actor.releases() == []  # the cluster budget (4) is still full of its unconfirmed releases
    for i in (1, 2):  # the watch shows two of them released (and bound)
        released = executor("app-a", i)
        released["spec"] = {**released["spec"], "schedulingGates": [], "nodeName": "node-1"}
        c.cache.pod_event("MODIFIED", released)
    assert (
        c.metrics.registry.get_sample_value("sparkgate_allocator_releases_total", {"namespace": "spark"}) == 2
    )
    later = time.monotonic() + 61  # the other two, unseen for a minute: not released
    c.expectations.monotonic = lambda: later
    c.queue.add({A})
    c.step(take(c))
    assert actor.releases() == ["app-a-exec-3", "app-a-exec-4"]


def test_an_app_backing_off_keeps_its_backoff_through_a_decision_that_only_says_it_waits(
    controller: tuple[Controller, HeldActor],
) -> None:
    """A persistent refusal must cost one write per backoff period whatever the app is decided meanwhile: a
    decision that only sends it a Waiting event (no room) does not reset its backoff; writes that went through
    do."""
    c, actor = controller
    now = [1000.0]
    c.clock = c.monotonic = lambda: now[0]
    c.step(take(c))
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]  # the cluster budget (4) to app-a
    actor.finish(A, False)  # app-a's first release refused
    assert c.queue.failures() == {A: (1, 0.0)}
    c.queue.add({B})
    c.step(take(c) - {A})  # app-b takes the budget app-a's failure freed; its PATCHes are in flight
    assert actor.releases() == [f"app-b-exec-{i}" for i in range(1, 5)]
    c.step({A})  # no room: app-a waits, nothing written
    assert actor.releases() == [] and A not in actor.pending
    now[0] += 5  # no release for 5 s: the decision tells app-a why it waits, in a Waiting Event
    c.step({A})
    assert [getattr(a, "reason", None) for a in actor.given] == ["Waiting"] and A in actor.pending
    assert actor.releases() == []
    actor.finish(A, True)
    assert c.queue.failures() == {A: (1, 0.0)}  # still one failure: the next refusal backs off for longer
    actor.finish(B, True)  # app-b's releases went through
    assert B not in c.queue.failures()


def test_an_app_held_by_the_cluster_budget_is_decided_when_another_apps_pod_leaves_flight(
    controller: tuple[Controller, HeldActor],
) -> None:
    """The budget app-a frees is app-b's at the next step, not at the next tick: the loop wakes the apps a
    shared budget holds when pods leave flight."""
    c, actor = controller
    c.step(take(c))
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]  # the cluster budget (4) to app-a
    actor.finish(A, True)
    assert c.settings[B].waiting_on == "cluster"
    for i in range(1, 5):  # the watch shows app-a's releases
        released = executor("app-a", i)
        del released["spec"]["schedulingGates"]
        c.cache.pod_event("MODIFIED", released)
    c.step(take(c))
    assert take(c) == set()  # nothing left flight: app-b is not woken
    running = executor("app-a", 1)
    del running["spec"]["schedulingGates"]
    running["spec"]["nodeName"] = "node-1"
    running["status"] = {"phase": "Running"}
    c.cache.pod_event("MODIFIED", running)  # one of app-a's pods is bound and runs: one slot frees
    assert take(c) == {A}
    c.step({A})
    assert take(c) == {B}  # woken by the freed slot, no tick in between
    c.step({B})
    assert actor.releases() == ["app-b-exec-1"]
    actor.finish(B, True)
    # A slot freed right after that release (no step in between) wakes app-b again.
    running = executor("app-a", 2)
    del running["spec"]["schedulingGates"]
    running["spec"]["nodeName"] = "node-1"
    running["status"] = {"phase": "Running"}
    c.cache.pod_event("MODIFIED", running)
    assert take(c) == {A}
    c.step({A})
    assert take(c) == {B}
    c.step({B})  # decided at once: now its own previous batch (app-b-exec-1, not bound) holds it
    assert actor.releases() == [] and c.settings[B].waiting_on == "previous-batch"


def bound(app: str, exec_id: int) -> dict[str, Any]:
    """The executor released, bound and running: it has left flight."""
    pod = executor(app, exec_id)
    del pod["spec"]["schedulingGates"]
    pod["spec"]["nodeName"] = "node-1"
    pod["status"] = {"phase": "Running"}
    return pod


def test_a_freed_place_wakes_as_many_held_apps_as_can_fill_it_not_one_per_place(
    controller: tuple[Controller, HeldActor],
) -> None:
    """Two places free at once in the cluster's budget: app-b alone has 4 gated pods to fill them, so it
    alone is woken; app-c, behind it in the line, would only find them taken."""
    c, actor = controller
    C = AppKey("spark", "app-c")
    c.cache.pods_replace([executor(app, i) for app in ("app-a", "app-b", "app-c") for i in range(1, 5)])
    c.step(take(c))
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]  # the cluster budget (4) to app-a
    actor.finish(A, True)
    assert c.settings[B].waiting_on == c.settings[C].waiting_on == "cluster"
    for i in (1, 2):
        c.cache.pod_event("MODIFIED", bound("app-a", i))
    assert take(c) == {A}
    c.step({A})
    assert take(c) == {B}
    c.step({B})
    assert actor.releases() == ["app-b-exec-1", "app-b-exec-2"]


def test_the_tick_leaves_apps_held_by_a_shared_budget_to_their_wakes_their_event_and_a_recheck(
    controller: tuple[Controller, HeldActor], tmp_path: Path
) -> None:
    """An app in the line of the cluster's budget is not decided at every tick (at 100,000 pods that was
    most of the loop's work, bench/scale.py): it is decided when its Waiting Event is due (5 s without a
    release), then at the latest every HELD_RECHECK_SECONDS, and at the first tick after the policy changed."""
    c, actor = controller
    now = [1000.0]
    c.clock = c.monotonic = c.queue.monotonic = lambda: now[0]
    c.tick()  # the first, as the loop's run begins: both apps queued
    c.step(take(c))
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]
    actor.finish(A, True)
    for i in range(1, 5):  # the watch shows app-a's releases
        released = executor("app-a", i)
        del released["spec"]["schedulingGates"]
        c.cache.pod_event("MODIFIED", released)
    c.step(take(c))
    assert c.settings[B].waiting_on == "cluster"
    c.tick()
    assert take(c) == set()  # app-a has nothing gated; app-b waits in the cluster's line
    now[0] += WAITING_EVENT_SECONDS
    assert take(c) == {B}
    c.step({B})
    assert [getattr(a, "reason", None) for a in actor.given] == ["Waiting"]
    actor.finish(B, True)
    actor.given.clear()
    c.tick()
    now[0] += HELD_RECHECK_SECONDS - 0.001
    assert take(c) == set()
    now[0] += 0.001
    assert take(c) == {B}  # the recheck (its next Waiting Event is 60 s after the last)
    c.step({B})
    assert actor.given == []  # still no room, nothing to say yet
    write_policy(tmp_path / "raised.yaml", batch=4, delay=0, per_app=10, per_ns=10, cluster=8)
    c.policy = PolicySource(str(tmp_path / "raised.yaml"), "sparkgate-system")
    c.tick()
    assert take(c) == {B}  # the limits may have changed: decided at once
    c.step({B})
    assert actor.releases() == [f"app-b-exec-{i}" for i in range(1, 5)]


def test_a_follower_s_tick_leaves_held_apps_to_their_recheck_too(
    controller: tuple[Controller, HeldActor],
) -> None:
    """A follower decides only for the settings /apps shows, and keeps the same lines as the leader: an app
    the cluster's budget holds is settled again at its recheck, not at every tick (a follower of a
    100,000-pod cluster decided every held app each second, bench/scale.py)."""
    c, actor = controller
    now = [1000.0]
    c.clock = c.monotonic = c.queue.monotonic = lambda: now[0]
    c.elector.release()
    assert not c.elector.leading
    for i in range(1, 5):  # the leader released app-a's four: the cluster's budget (4) is used
        released = executor("app-a", i)
        del released["spec"]["schedulingGates"]
        c.cache.pod_event("MODIFIED", released)
    c.tick()
    c.step(take(c))
    assert actor.given == [] and c.settings[B].waiting_on == "cluster"
    c.tick()
    assert take(c) == set()  # app-b is held; app-a has nothing gated
    now[0] += HELD_RECHECK_SECONDS
    assert take(c) == {B}
    c.step({B})
    assert actor.given == [] and c.settings[B].waiting_on == "cluster"


def test_a_watch_events_decision_waits_for_its_batch_period_and_a_ticks_does_not(tmp_path: Path) -> None:
    """The command's wiring: the cache's news of an app (a list, watch events) reaches the queue with the
    batch period (`--batch-period`), so that a burst is one decision; what the loop adds itself (a tick, a
    wake) is ready at once. A period of a minute keeps the test independent of the machine's speed."""
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        policy = write_policy(tmp_path / "policy.yaml", batch=4, delay=0, per_app=10, per_ns=10, cluster=4)
        source = PolicySource(str(policy), "sparkgate-system")
        c = assemble(kube, source, Options(batch_period=60.0), AllocatorMetrics()).controller
        try:
            c.cache.pods_replace([executor("app-a", 1)])
            for i in (2, 3):
                c.cache.pod_event("ADDED", executor("app-a", i))
            assert c.queue.get(0) == set()  # app-a's burst waits for its batch period
            c.queue.add({A})  # a tick's add
            assert c.queue.get(0) == {A}
        finally:
            c.actor.close()
            kube.close()


def test_a_history_begun_for_an_app_the_registry_never_followed_is_finished_by_the_tick(
    controller: tuple[Controller, HeldActor],
) -> None:
    """A pod of an app that came and went between two looks (a short client-mode session) starts a deletion
    history of an app the registry never followed: nothing would ever finish it, and it would never expire.
    The tick finishes it, as a new leader finishes those of apps the cluster holds nothing of."""
    c, _ = controller
    c.step(take(c))  # the leader's first decision: the histories its predecessor saved are read
    z = AppKey("spark", "app-z")
    pod = executor("app-z", 1)
    c.cache.pod_event("ADDED", pod)
    c.cache.pod_event("DELETED", pod)
    c.step(set())  # the step's snapshot records the gone pod; nothing is decided
    assert (history := c.histories.view(z)) is not None and history.finished_at is None
    c.step(take(c))  # the apps that changed: app-z has no view, the registry does not follow it
    assert (history := c.histories.view(z)) is not None and history.finished_at is None
    c._observe(c.cache.snapshot(), None)  # the tick's look at every app
    assert (history := c.histories.view(z)) is not None and history.finished_at is not None
    assert c.histories.view(A) is None  # a live app has no history to finish


def test_shutdown_saves_the_histories_then_the_leader_thread_gives_the_lease_up(
    controller: tuple[Controller, HeldActor],
) -> None:
    """Issue 37: shutdown gave the Lease up from its own thread while the leader thread could be renewing:
    the release read the Lease, the renew landed, the release got 409, and the follower waited a whole
    lease. Now the leader thread gives it up, after its turn in progress and after shutdown's last writes."""
    c, _ = controller
    renewing, go = threading.Event(), threading.Event()
    request = c.elector.kube.request
    puts: list[str] = []

    def held(method: str, path: str, **kwargs: Any) -> Any:
        if method == "PUT":
            puts.append(threading.current_thread().name)
            if len(puts) == 1:
                renewing.set()
                assert go.wait(60)
        return request(method, path, **kwargs)

    c.elector.kube.request = held  # type: ignore[method-assign]
    leader = threading.Thread(target=c.lead, name="leader-election")
    leader.start()
    assert renewing.wait(60)  # the leader thread's renew is in flight
    stopping = threading.Thread(target=c.shutdown, name="shutdown")
    stopping.start()
    assert c.resign.wait(60)  # shutdown has saved what it had to and asks for the Lease to be given up
    go.set()
    stopping.join(timeout=60)
    leader.join(timeout=60)
    assert not stopping.is_alive() and not leader.is_alive()
    lease = c.elector.kube.get(c.elector.path + "/" + c.elector.name)
    assert lease["spec"]["holderIdentity"] == ""
    assert puts == ["leader-election", "leader-election"]  # the renew, then the release


def test_the_leader_gauge_is_the_leadership_rule_at_each_scrape(
    controller: tuple[Controller, HeldActor],
) -> None:
    """sparkgate_allocator_leader reads `LeaderElector.leading` when scraped: 0 the moment leadership lapses
    (the renew deadline after the last renew), whether or not the leader thread has turned since (docs/metrics.md;
    it was set after each turn, up to a turn's two timed-out requests late)."""
    c, _ = controller
    now = [100.0]
    c.elector.monotonic = lambda: now[0]
    c.elector._renewed_at = 100.0
    assert c.metrics.registry.get_sample_value("sparkgate_allocator_leader") == 1
    now[0] += c.options.renew_deadline
    assert c.metrics.registry.get_sample_value("sparkgate_allocator_leader") == 0

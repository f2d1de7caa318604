"""Issue 37, finding 4: a gate removal whose answer is lost. kubesim applies the write, then loses its answer
(kubesim/faults.py `Faults.lose`: the connection dropped, or kube-apiserver's 504). sparkgate/kube.py repeats
the guarded PATCH, whose `test` then fails (422): "maybe released". Such a release stays in flight, unconfirmed,
until the watch shows it (allocator/expectations.py): the budgets never come up short, the app does not back
off, and the release metric counts exactly the pods released, when the watch shows them.

The first test takes the loop's dispatch apart, with no watch running, so the answers always come before the
watch (the order a loaded API server's lagging watch gives): it measures the budgets. The second runs the
whole system, the allocator process behind the real webhook, with one answer in ten lost: the caps hold at
every change the store commits (sandbox/caps.py, the one definition) and the metric equals the gate removals
the API server applied (its request log) and the store saw (the observer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from allocator.actor import Actor
from allocator.commands import assemble
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy
from .test_dispatch import executor

APP = AppKey("spark", "app-a")
RELEASES = "sparkgate_allocator_releases_total"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Cluster, Controller]]:
    """kubesim with ten gated executors of one app, and the allocator assembled as the command assembles it,
    leading, its cache filled from the store by hand: no watch runs unless the test feeds it."""
    with Cluster(nodes=1) as cluster:
        cluster.add_namespace("spark")
        for i in range(1, 11):
            cluster.store.create("pods", executor("app-a", i), namespace="spark")
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        policy = write_policy(tmp_path / "policy.yaml", batch=10, delay=0, per_app=10, per_ns=10, cluster=10)
        options = Options(backoff_base=0.0, batch_period=0.0)
        c = assemble(
            kube, PolicySource(str(policy), "sparkgate-system"), options, AllocatorMetrics()
        ).controller
        c.cache.pods_replace(cluster.store.list_objects("pods", "spark")[0])
        c.cache.drivers_replace([])
        c.cache.config_maps_replace([], source=True)
        c.cache.config_maps_replace([], source=False)
        assert c.cache.is_synced and c.histories.load() and c.elector.try_acquire_or_renew()
        try:
            yield cluster, c
        finally:
            c.actor.close()
            kube.close()


def released_in_store(cluster: Cluster) -> int:
    return sum(1 for p in cluster.store.list_objects("pods", "spark")[0] if contract.gate_index(p) is None)


@pytest.mark.parametrize("answer", [0, 504])
def test_a_release_whose_answer_is_lost_keeps_its_slot_and_is_counted_once_the_watch_shows_it(
    world: tuple[Cluster, Controller], answer: int
) -> None:
    cluster, c = world
    cluster.faults.lose("patch", "pods", answer=answer, one_in=3)
    c.step(c.queue.get(0))  # the ten releases, dispatched to the actor
    c.actor.close()  # every write answered (or not), every answer reported
    lost = [e for e in cluster.requests.entries() if e.lost_as is not None]
    assert len(lost) == 3 and released_in_store(cluster) == 10
    expected = c.expectations.apply(c.cache.snapshot(), c.expectations.pending())
    # The budgets: all ten in flight (they were 7: short by one per lost answer, and three more pods of
    # other apps could have been released past the namespace's and the cluster's caps).
    assert expected.in_flight_by_namespace() == {"spark": 10}
    assert c.queue.failures() == {}, "its writes went through: no backoff"
    registry = c.metrics.registry
    assert registry.get_sample_value("sparkgate_allocator_write_failures_total", {"namespace": "spark"}) in (
        0,
        None,
    )
    assert registry.get_sample_value(RELEASES, {"namespace": "spark"}) == 7  # the answered ones
    # Another app of the namespace comes, decided before the watch shows app-a's releases: no room for it.
    c.actor = Actor(c.actor.kube, "sparkgate-system")  # the first one's threads are shut down
    for i in range(1, 6):
        c.cache.pod_event("ADDED", cluster.store.create("pods", executor("app-b", i), namespace="spark"))
    c.step(c.queue.get(0))
    c.actor.close()
    assert released_in_store(cluster) == 10, "app-b released nothing past the caps"
    for obj in cluster.store.list_objects("pods", "spark")[0]:  # the watch catches up
        c.cache.pod_event("MODIFIED", obj)
    assert registry.get_sample_value(RELEASES, {"namespace": "spark"}) == 10  # = the pods released


def releases_metric(body: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == RELEASES
    )


def test_with_one_answer_in_ten_lost_the_caps_hold_at_every_change_and_the_metric_counts_every_release(
    system: Any,
) -> None:
    cluster, _, (allocator,), observer = system(batch=5, per_app=10, per_ns=15, cluster=25, nodes=4)
    cluster.faults.lose("patch", "pods", one_in=10)  # gate removals: the allocator's alone
    drivers = [
        cluster.spark_driver(ns, f"app-{ns}-{i}", executors=30, batch_size=10, batch_delay=0.2, cpu="100m")
        for ns in ("spark", "spark-b")
        for i in range(2)
    ]
    cluster.wait_for(
        lambda: all(d.running() == 30 for d in drivers), timeout=240, what="every executor running"
    )
    applied = [
        e
        for e in cluster.requests.entries()
        if e.verb == "patch"
        and e.resource == "pods"
        and e.user == contract.ALLOCATOR_USER
        and e.applied_write
    ]
    assert len(applied) == 120 and sum(observer.releases.values()) == 120
    assert len([e for e in applied if e.lost_as is not None]) == 12
    assert observer.violations == [] and not observer.bypassed, allocator.log.read_text()[-3000:]

    def counted() -> float:
        code, body = allocator.get("/metrics")
        return releases_metric(body) if code == 200 else -1

    cluster.wait_for(
        lambda: counted() == 120, timeout=30, what=f"the release metric at 120 (it says {counted()})"
    )
